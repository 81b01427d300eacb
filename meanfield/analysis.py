"""Stability of critical points: the Riemannian Hessian of the energy on $(S^{d-1})^n$."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, DTypeLike, Float

from . import sphere
from ._checks import RealScalarLike, check_int, check_positive, check_scalar, is_concrete
from ._machine import check_memory as _check_memory
from ._precision import matmul
from .energy import energy as _energy
from .energy import resolve_aux
from .kernels import Kernel

__all__ = [
    "tangent_hessian",
    "tangent_frame",
    "classify",
    "growth_rates",
    "collapsed_spectrum",
    "antipodal_spectrum",
    "cluster_state",
    "classify_state",
    "escape_time",
]


def _is_real_dtype(dtype: Any) -> bool:
    """Integers and floats (bfloat16 and float8 included); not bools, complex or objects."""
    try:
        return bool(jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating))
    except TypeError:
        return False


def _states(name: str, x: Any) -> Array:
    """``(n, d)`` real states, ``n >= 1``, ``d >= 2``, finite where concrete."""
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name} must be an (n, d) array of unit rows, got {x!r:.80}")
    try:
        arr = jnp.asarray(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an (n, d) array of unit rows, got {x!r:.80}") from None
    if not _is_real_dtype(arr.dtype):
        raise TypeError(f"{name} must be an (n, d) array of real numbers, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 2:
        raise ValueError(
            f"{name} must be an (n, d) array with n >= 1, d >= 2, got shape {arr.shape}"
        )
    if is_concrete(arr) and not bool(jnp.all(jnp.isfinite(arr))):
        raise ValueError(f"{name} must be finite (a failed run's state has no Hessian)")
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        arr = arr.astype(jnp.float32)
    return arr


def _check_hessian_memory(x: Array) -> None:
    """The ``(n d, n d)`` Euclidean Hessian, the block-diagonal frame ``(n d, n (d - 1))`` and
    their products: about six ``(n d)^2`` arrays."""
    n, d = x.shape
    m = float(n) * float(d)
    _check_memory(
        f"the tangent Hessian of n = {n}, d = {d} (x of shape {tuple(x.shape)})",
        6.0 * m * m * np.dtype(x.dtype).itemsize,
        "use fewer particles",
    )


def tangent_frame(x: ArrayLike) -> Float[Array, "n d d-1"]:
    r"""Orthonormal tangent bases $B_i$ (columns span $x_i^\perp$), one per particle.

    Args:
        x: ``(n, d)`` unit rows.

    Returns:
        ``(n, d, d - 1)`` array, ``B_i^T x_i = 0`` and ``B_i^T B_i = I``.

    Example:
        >>> import jax, meanfield as mf
        >>> mf.analysis.tangent_frame(mf.sphere.uniform(jax.random.key(0), 4, 3)).shape
        (4, 3, 2)
    """
    x = _states("x", x)
    n, d = x.shape
    _check_memory(
        f"tangent_frame of n = {n}, d = {d}",
        4.0 * n * d * d * x.dtype.itemsize,
        "use fewer particles",
    )
    return jax.vmap(sphere.tangent_basis)(x)


def tangent_hessian(kernel: object, x: ArrayLike, aux: Any = None) -> Float[Array, "m m"]:
    r"""Riemannian Hessian of $E$ (``mf.energy(kernel, x, aux)``) on $(S^{d-1})^n$ at $x$.

    In the orthonormal tangent basis $B = \operatorname{diag}(B_1, \dots, B_n)$ ($m = n (d - 1)$):

    $$H = B^\top (\nabla^2 E) B - \operatorname{diag}_i\big(\langle x_i, \nabla_{x_i} E\rangle I_{d-1}\big),$$

    the Euclidean Hessian projected on the tangent space plus the curvature (Weingarten)
    term of the sphere constraint. Symmetric. At a collapsed USA state the prediction is
    $d - 1$ zero modes (the global rotations moving the collapse point) and the eigenvalue
    $-e^\beta / n$ with multiplicity $(n - 1)(d - 1)$: from
    $\langle x_i, x_j\rangle = 1 - \|\xi_i - \xi_j\|^2 / 2 + O(\|\xi\|^3)$ the quadratic form is
    $-\frac{e^\beta}{2n} \sum_i \|\xi_i - \bar\xi\|^2$.

    Args:
        kernel: a ``Kernel`` with an energy.
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels (default ``kernel.default_aux(n)``).

    Returns:
        ``(m, m)`` symmetric matrix, ``m = n (d - 1)``. Memory about six ``(n d)^2`` arrays: past
        what is available, ``ResourceLimitError`` (a ``ValueError``) before anything is built
        (also from ``growth_rates`` and ``classify_state``).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.tile(jnp.array([[0.0, 0.0, 1.0]]), (4, 1))
        >>> H = mf.analysis.tangent_hessian(mf.kernels.USA(1.0), x)
        >>> H.shape
        (8, 8)
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(
            f"tangent_hessian needs a kernel with an energy (mf.kernels), got {type(kernel).__name__}"
        )
    x = _states("x", x)
    _check_hessian_memory(x)
    aux = resolve_aux(kernel, x, aux)
    n, d = x.shape
    f = lambda y: _energy(kernel, y, aux)  # noqa: E731
    g = jax.grad(f)(x)
    Hess = jax.hessian(f)(x).reshape(n * d, n * d)
    B = jax.vmap(sphere.tangent_basis)(x)  # (n, d, d-1)
    Bfull = jax.scipy.linalg.block_diag(*[B[i] for i in range(n)])  # (n d, n (d-1))
    H = matmul(matmul(Bfull.T, Hess), Bfull)
    radial = jnp.sum(x * g, axis=-1)  # <x_i, grad_i E>
    H = H - jnp.diag(jnp.repeat(radial, d - 1))
    return 0.5 * (H + H.T)


_tangent_hessian_jit = eqx.filter_jit(tangent_hessian)


def classify(H: ArrayLike, *, num_zero_modes: object, rtol: RealScalarLike = 1e-6) -> dict:
    r"""Classify a critical point from its tangent Hessian.

    With $\lambda = \operatorname{eigvalsh}(H)$, eigenvalues with $|\lambda| \le \text{rtol} \cdot \max|\lambda|$ are zero
    modes. A local maximiser has no positive eigenvalue and exactly the ``num_zero_modes``
    symmetry zero modes; a saddle has positive ones.

    Args:
        H: ``(m, m)`` symmetric tangent Hessian.
        num_zero_modes: expected number of symmetry zero modes (``d - 1`` for rotations).
        rtol: relative threshold of a zero eigenvalue.

    Returns:
        dict with ``kind`` (``"maximiser"``, ``"saddle"`` or ``"degenerate"``), the counts
        ``positive``, ``zero``, ``negative`` and the extreme eigenvalues ``largest``, ``smallest``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> out = mf.analysis.classify(jnp.diag(jnp.array([-2.0, -1.0, 0.0])), num_zero_modes=1)
        >>> out["kind"], out["negative"], out["zero"]
        ('maximiser', 2, 1)
    """
    num_zero_modes = check_int("num_zero_modes", num_zero_modes, minimum=0)
    check_scalar("rtol", rtol)
    check_positive("rtol", rtol)
    if isinstance(H, (str, bytes)) or H is None:
        raise TypeError(f"H must be a square symmetric matrix, got {H!r:.80}")
    H = jnp.asarray(H)
    if not _is_real_dtype(H.dtype):
        raise TypeError(f"H must be a real matrix, got dtype {H.dtype}")
    if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape[0] == 0:
        raise ValueError(f"H must be a non-empty square (m, m) matrix, got shape {H.shape}")
    if not bool(jnp.all(jnp.isfinite(H))):
        raise ValueError("H must be finite")
    lam = jnp.linalg.eigvalsh(H)
    scale = jnp.max(jnp.abs(lam))
    zero = jnp.abs(lam) <= rtol * scale
    pos = int(jnp.sum((lam > 0) & ~zero))
    nz = int(jnp.sum(zero))
    kind = "saddle" if pos > 0 else ("maximiser" if nz == num_zero_modes else "degenerate")
    return {
        "kind": kind,
        "positive": pos,
        "zero": nz,
        "negative": int(lam.size - pos - nz),
        "largest": float(lam[-1]),
        "smallest": float(lam[0]),
    }


def growth_rates(kernel: Any, x: Array | np.ndarray, aux: Any = None) -> Float[Array, " m"]:
    r"""Rates of the linearised flow at $x$: $n \cdot \operatorname{eigvalsh}(H)$ (ascending).

    The velocity is $n P \nabla E$, so near a critical point the tangent perturbation obeys
    $d\xi / dt = n H \xi$: a positive eigenvalue $\lambda$ of $H$ grows like $e^{n \lambda t}$.

    Args:
        kernel: a ``Kernel`` with an energy.
        x: ``(n, d)`` unit rows (a critical point).
        aux: ``(n,)`` labels (default ``kernel.default_aux(n)``).

    Returns:
        ``(n (d - 1),)`` rates, ascending.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = mf.analysis.cluster_state(4, 1)   # collapsed: rates -e^beta and 0
        >>> r = mf.analysis.growth_rates(mf.kernels.USA(1.0), x)
        >>> r.shape, round(float(r[0]), 3)
        ((8,), -2.718)
    """
    x = _states("x", x)
    _check_hessian_memory(x)
    H = _tangent_hessian_jit(kernel, x, aux)
    return x.shape[0] * jnp.linalg.eigvalsh(H)


def collapsed_spectrum(beta: RealScalarLike, n: object, d: object) -> dict:
    r"""Predicted tangent-Hessian spectrum of USA at a collapsed state.

    $d - 1$ zero modes (global rotations) and $-e^\beta / n$ with multiplicity $(n - 1)(d - 1)$.

    Args:
        beta: inverse temperature.
        n: number of tokens.
        d: dimension.

    Returns:
        dict ``{"zero": d - 1, "eigenvalue": -e^beta / n, "multiplicity": (n - 1)(d - 1)}``.

    Example:
        >>> import meanfield as mf
        >>> s = mf.analysis.collapsed_spectrum(1.0, 4, 3)
        >>> s["zero"], s["multiplicity"], round(s["eigenvalue"], 4)
        (2, 6, -0.6796)
    """
    beta, n, d = _spectrum_args(beta, n, d)
    return {
        "zero": d - 1,
        "eigenvalue": -float(np.exp(beta)) / n,
        "multiplicity": (n - 1) * (d - 1),
    }


def _spectrum_args(beta: Any, n: Any, d: Any) -> tuple[float, int, int]:
    check_scalar("beta", beta)
    check_positive("beta", beta)
    return float(beta), check_int("n", n, minimum=2), check_int("d", d, minimum=2)


def antipodal_spectrum(beta: RealScalarLike, n: object, d: object) -> dict:
    r"""Predicted spectrum of USA at two antipodal clusters of $n / 2$ tokens (a saddle).

    Linearising $dx_i/dt = P F_i$ with clusters of mass $1/2$ at $\pm e$: a rigid
    displacement $\xi$ of one cluster and $\eta$ of the other obey
    $\xi' = \eta' = e^{-\beta} (\xi + \eta) / 2$, so the relative mode $\xi = \eta$ grows at rate
    $e^{-\beta}$ (multiplicity $d - 1$) and the common rotation $\xi = -\eta$ is a zero mode
    ($d - 1$); a token's deviation from its cluster decays at rate $(e^\beta - e^{-\beta}) / 2$
    (multiplicity $(n - 2)(d - 1)$). Eigenvalues of $H$ are these rates divided by $n$.

    Args:
        beta: inverse temperature.
        n: number of tokens (even).
        d: dimension.

    Returns:
        dict with ``positive`` (``e^{-beta} / n``), ``num_positive``, ``zero``, ``negative``
        (``-(e^beta - e^{-beta}) / (2n)``) and ``num_negative``.

    Example:
        >>> import meanfield as mf
        >>> s = mf.analysis.antipodal_spectrum(1.0, 4, 3)
        >>> s["num_positive"], s["num_negative"], round(float(s["positive"]), 4)
        (2, 4, 0.092)
    """
    b, n, d = _spectrum_args(beta, n, d)
    if n % 2:
        raise ValueError(f"antipodal_spectrum needs an even n (two clusters of n / 2), got n = {n}")
    return {
        "positive": np.exp(-b) / n,
        "num_positive": d - 1,
        "zero": d - 1,
        "negative": -(np.exp(b) - np.exp(-b)) / (2 * n),
        "num_negative": (n - 2) * (d - 1),
    }


def cluster_state(
    n: object, k: object, d: object = 3, dtype: DTypeLike = jnp.float32
) -> Float[Array, "n d"]:
    r"""$k$ clusters of $n / k$ tokens at the vertices of a regular $k$-gon on the great
    circle of $(e_1, e_2)$: $x_i = \cos(a_i) e_1 + \sin(a_i) e_2$, $a_i = 2 \pi \lfloor i k / n \rfloor / k$.

    A critical point of every rotation-invariant energy (by symmetry). ``k = 2`` is the
    antipodal pair, ``k = 1`` the collapsed state.

    Args:
        n: number of tokens (an int; past the memory available, ``ResourceLimitError``).
        k: number of clusters, ``k >= 1`` dividing ``n``.
        d: dimension, ``>= 2``.
        dtype: floating dtype.

    Returns:
        ``(n, d)`` unit rows.

    Example:
        >>> import meanfield as mf
        >>> x = mf.analysis.cluster_state(6, 2)
        >>> x.shape, int(mf.metrics.num_clusters(x))
        ((6, 3), 2)
    """
    n = check_int("n", n, minimum=1)
    k = check_int("k", k, minimum=1)
    d = check_int("d", d, minimum=2)
    if n % k:
        raise ValueError(f"cluster_state needs k >= 1 dividing n, got n = {n}, k = {k}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a floating dtype, got {dtype!r}") from None
    if dt.kind != "f":
        raise TypeError(f"dtype must be a floating dtype, got {dt}")
    _check_memory(
        f"cluster_state with n = {n}, d = {d}",
        4.0 * float(n) * float(d) * dt.itemsize,
        "use fewer particles",
    )
    ang = 2 * jnp.pi * (jnp.arange(n) // (n // k)) / k
    x = jnp.zeros((n, d), dtype)
    return x.at[:, 0].set(jnp.cos(ang)).at[:, 1].set(jnp.sin(ang))


def classify_state(
    kernel: Any,
    x: ArrayLike,
    aux: Any = None,
    *,
    rtol: float = 1e-6,
    critical_tol: float = 1e-4,
    threshold: RealScalarLike = 0.1,
) -> dict:
    r"""What a run reached: ``classify`` of the tangent Hessian plus speed and cluster count.

    With $\text{speed} = \max_i \|P_{x_i} F_i\| / \max_i \|F_i\|$ (relative tangent speed) and
    ``clusters = mf.metrics.num_clusters(x, threshold)``, ``kind`` is

    * ``"maximiser"``: no positive eigenvalue and exactly ``d - 1`` zero modes (within ``rtol``);
    * ``"saddle"``: critical (``speed <= critical_tol``) with a positive eigenvalue;
    * ``"metastable"``: several clusters still moving slowly (``speed > critical_tol``), the
      multi-cluster states of large ``beta``; ``rate`` is then the escape rate of the linearisation;
    * ``"degenerate"`` / ``"transient"`` otherwise.

    $\text{rate} = n \lambda_{\max}$ (growth rate of the linearised flow, see ``growth_rates``).

    Args:
        kernel: a ``Kernel`` with an energy.
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels (default ``kernel.default_aux(n)``).
        rtol: relative threshold of a zero eigenvalue.
        critical_tol: largest ``speed`` of a critical point.
        threshold: cluster radius (radians) for ``num_clusters``.

    Returns:
        the ``classify`` dict plus ``speed``, ``clusters`` and ``rate``.

    Example:
        >>> import meanfield as mf
        >>> out = mf.analysis.classify_state(mf.kernels.USA(1.0), mf.analysis.cluster_state(4, 2))
        >>> out["kind"], out["clusters"]
        ('saddle', 2)
    """
    from . import metrics
    from .energy import field as _field

    x = _states("x", x)
    check_scalar("critical_tol", critical_tol)
    check_positive("critical_tol", critical_tol)
    n, d = x.shape
    _check_hessian_memory(x)
    H = _tangent_hessian_jit(kernel, x, aux)
    out = classify(H, num_zero_modes=d - 1, rtol=rtol)
    F = _field(kernel, x, aux)
    v = sphere.project(x, F)
    out["speed"] = float(
        jnp.max(jnp.linalg.norm(v, axis=-1)) / jnp.max(jnp.linalg.norm(F, axis=-1))
    )
    out["clusters"] = int(metrics.num_clusters(x, threshold))
    out["rate"] = n * out["largest"]
    critical = out["speed"] <= critical_tol
    if out["positive"] == 0 and out["zero"] == d - 1:
        out["kind"] = "maximiser"
    elif out["positive"] > 0 and critical:
        out["kind"] = "saddle"
    elif out["clusters"] > 1 and not critical:
        out["kind"] = "metastable"
    elif critical:
        out["kind"] = "degenerate"
    else:
        out["kind"] = "transient"
    return out


def escape_time(
    kernel: Any,
    x0: ArrayLike,
    aux: Any = None,
    *,
    dt: RealScalarLike,
    t_max: RealScalarLike,
    fraction: RealScalarLike = 0.5,
) -> Float[Array, ""]:
    r"""First time $t$ with $G_x(t) \le \text{fraction} \cdot G_x(0)$ (``mf.simulate``'s Heun step,
    ``solver="rk2"``, step ``dt``).

    A ``lax.while_loop`` without saves, for the long runs near saddles. Each step is the engine's
    (``mf.integrate.FixedStep``): the model's own field, normalisation scheme, attention kind, mask
    and weights' draws, so the states are those of ``mf.simulate(kernel, x0, solver="rk2", dt=dt)``
    on its grid; the gap is that of the token directions (schemes with a radius: ``x / |x|``).
    Tokens in R^d (``geometry="euclidean"``) have no collapse gap and are refused; a run whose step
    fails (a non-finite state, a token through the origin) returns NaN.

    Args:
        kernel: a model (``mf.kernels``, ``mf.models``) on the sphere.
        x0: ``(n, d)`` initial states (unit rows; schemes with a radius: ``r theta``).
        aux: ``(n,)`` labels (default ``kernel.default_aux(n)``).
        dt: step, ``> 0``.
        t_max: time limit, ``> 0``.
        fraction: the gap reduction that counts as escape, in ``(0, 1)``.

    Returns:
        scalar time; ``inf`` when the run has not escaped by ``t_max``; NaN when it failed.

    Example:
        >>> import jax, meanfield as mf
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> t = mf.analysis.escape_time(mf.kernels.USA(1.0), x0, dt=0.05, t_max=20.0)
        >>> bool(0.0 < t < 20.0)
        True
    """
    from .energy import resolve_aux
    from .geometry import geometry_of
    from .integrate import FixedStep

    aux = resolve_aux(kernel, x0, aux)
    x0 = jnp.asarray(x0)
    kernel.check_config(x0, aux)
    check_positive("dt", dt)
    check_positive("t_max", t_max)
    check_scalar("fraction", fraction)
    if is_concrete(fraction) and not 0.0 < float(fraction) < 1.0:
        raise ValueError(
            f"fraction must be in (0, 1) (the gap reduction of an escape), got {fraction!r}"
        )
    geometry = geometry_of(kernel)
    if not geometry.on_sphere:
        raise ValueError(
            f"escape_time measures the collapse gap of unit tokens; geometry={geometry.name!r} "
            "has none: use mf.simulate and an observable of its states"
        )
    stepper = FixedStep.of(kernel, x0, aux, solver="rk2", h=jnp.asarray(dt, x0.dtype))
    return _escape(stepper, x0, jnp.asarray(t_max, x0.dtype), fraction)


#: escape_time's bound on its steps (an int32 count: t = k dt exact in the count, never stuck)
_ESCAPE_MAX_STEPS = 2**31 - 2


@jax.jit
def _escape(
    stepper: Any,
    x0: Float[Array, "n d"],
    t_max: Float[Array, ""],
    fraction: RealScalarLike,
) -> Float[Array, ""]:
    from . import metrics

    g0 = metrics.collapse_gap(stepper.directions(stepper.init(x0)))

    dtype = x0.dtype

    def cond(state: tuple[Any, Array]) -> Bool[Array, ""]:
        y, k = state
        t = k.astype(dtype) * stepper.h
        going = (metrics.collapse_gap(stepper.directions(y)) > fraction * g0) & (t < t_max)
        return going & ~stepper.failed(y) & (k < _ESCAPE_MAX_STEPS)

    def body(state: tuple[Any, Array]) -> tuple[Any, Array]:
        y, k = state
        return stepper.grid(k.astype(dtype), y), k + 1

    y, k = jax.lax.while_loop(cond, body, (stepper.init(x0), jnp.zeros((), jnp.int32)))
    t = k.astype(dtype) * stepper.h
    return jnp.where(stepper.failed(y), jnp.nan, jnp.where(t < t_max, t, jnp.inf))
