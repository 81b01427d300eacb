"""Geometry of the unit sphere $S^{d-1}$: sampling, tangent projections, rotations.

Everything acts on single arrays; batch with ``jax.vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, DTypeLike, Float, Int, PRNGKeyArray

from ._checks import check_finite, check_int, check_plane

__all__ = [
    "DRAW_DTYPE",
    "uniform",
    "rotation",
    "normalize",
    "project",
    "tangent_basis",
    "check_on_sphere",
    "sample_density",
]


#: Precision in which the samplers draw, whatever the requested dtype (see ``uniform``).
DRAW_DTYPE = jnp.float32


def _in_dtype(x: Float[Array, "n d"], dtype: DTypeLike) -> Float[Array, "n d"]:
    """Unit rows ``x`` drawn in ``DRAW_DTYPE``, cast to ``dtype`` and renormalised there."""
    dtype = _float_dtype(dtype)
    if dtype == jnp.dtype(DRAW_DTYPE):
        return x
    return normalize(x.astype(dtype))


def _check_key(key: object) -> None:
    if isinstance(key, (int, float, np.integer, np.floating, str)) or key is None:
        raise TypeError(f"key must be a JAX PRNG key such as jax.random.key(0), got {key!r}")


def _float_dtype(dtype: Any) -> np.dtype:
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"dtype must be a floating dtype (float32, float64, ...), got {dtype!r}"
        ) from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"dtype must be a floating dtype (float32, float64, ...), got {dt}")
    return dt


def uniform(key: Any, n: Any, d: Any, dtype: Any = jnp.float32) -> Float[Array, "n d"]:
    r"""``n`` i.i.d. points uniform on $S^{d-1}$.

    $x_i = g_i / \|g_i\|$ with $g_i \sim N(0, I_d)$ (rotation invariance of the
    Gaussian).

    Reproducible across precisions: the Gaussians are drawn in float32 (``DRAW_DTYPE``, the
    default precision, available without ``jax_enable_x64``) whatever ``dtype`` is, then cast
    to ``dtype`` and normalised there. The same key gives the same particles in float32 and
    float64: the float64 rows differ from the float32 ones by the float32 rounding of the
    normalisation only ($|\text{difference}| \le 2^{-22} \approx 2.4 \cdot 10^{-7}$ per coordinate; at most 1.6e-7
    measured over 3e5 rows in ``d = 3``) and are unit to float64 rounding.

    Args:
        key: a ``jax.random`` key.
        n: number of points, ``n >= 1``.
        d: ambient dimension, ``d >= 2``.
        dtype: floating dtype of the result.

    Returns:
        ``(n, d)`` array with unit rows.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 4, 3)
        >>> x.shape
        (4, 3)
        >>> y = mf.sphere.uniform(jax.random.key(0), 4, 3, jnp.bfloat16)   # the same points, rounded
        >>> bool(jnp.allclose(y.astype(jnp.float32), x, atol=1e-2))
        True
    """
    check_int("n", n, minimum=1)
    check_int("d", d, minimum=2)
    _check_key(key)
    dtype = _float_dtype(dtype)
    g = jax.random.normal(key, (n, d), dtype=DRAW_DTYPE)
    # normalised once, in the requested precision: the same Gaussians, and no float32 rounding
    # step whose fusion could differ between jit and eager execution
    return normalize(g.astype(_float_dtype(dtype)))


def normalize(x: Float[Array | np.ndarray, "... d"]) -> Float[Array, "... d"]:
    r"""Radial projection $x / \|x\|$ of each row onto the sphere.

    Args:
        x: ``(..., d)`` array of nonzero vectors.

    Returns:
        ``(..., d)`` array with unit rows (the last axis normalised).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> [round(float(v), 4) for v in mf.sphere.normalize(jnp.array([3.0, 4.0]))]
        [0.6, 0.8]
    """
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def project(x: Float[Array, "... d"], v: Float[Array, "... d"]) -> Float[Array, "... d"]:
    r"""Tangent projection $P_x v = v - \langle x, v\rangle x$ (``x`` a unit vector).

    Works row-wise on ``(n, d)`` arrays as well.

    Args:
        x: ``(d,)`` (or ``(n, d)``) unit vector(s), the base point(s).
        v: ``(d,)`` (or ``(n, d)``) vector(s) to project.

    Returns:
        $P_x v$, same shape as ``v``; orthogonal to ``x``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> mf.sphere.project(jnp.array([0.0, 0.0, 1.0]), jnp.array([1.0, 2.0, 3.0])).tolist()
        [1.0, 2.0, 0.0]
    """
    return v - jnp.sum(x * v, axis=-1, keepdims=True) * x


def rotation(theta: ArrayLike, d: Any, plane: Any = (0, 1)) -> Float[Array, "d d"]:
    r"""Rotation $R_\theta$ by angle ``theta`` in $\operatorname{span}(e_a, e_b)$, identity elsewhere.

    $R e_a = \cos\theta\, e_a + \sin\theta\, e_b$, $R e_b = -\sin\theta\, e_a + \cos\theta\, e_b$.
    ``theta`` may be traced (the result is differentiable in it); ``d`` and
    ``plane`` are static.

    Args:
        theta: scalar angle (radians).
        d: dimension, ``d >= 2``.
        plane: the pair ``(a, b)`` of distinct coordinate indices in ``[0, d)``.

    Returns:
        ``(d, d)`` orthogonal matrix with $\det R = 1$.

    Example:
        >>> import meanfield as mf
        >>> R = mf.sphere.rotation(0.5, 3)
        >>> bool(abs(R[0, 0] - 0.8775826) < 1e-6)
        True
    """
    check_int("d", d, minimum=2)
    a, b = check_plane(plane, d)
    theta = jnp.asarray(theta)
    dtype = theta.dtype if jnp.issubdtype(theta.dtype, jnp.floating) else jnp.result_type(float)
    c, s = jnp.cos(theta).astype(dtype), jnp.sin(theta).astype(dtype)
    R = jnp.eye(d, dtype=dtype)
    R = R.at[a, a].set(c).at[b, b].set(c)
    R = R.at[b, a].set(s).at[a, b].set(-s)
    return R


def tangent_basis(x: Float[Array | np.ndarray, " d"]) -> Float[Array, "d d-1"]:
    r"""An orthonormal basis $B$ of the tangent space $x^\perp$ (columns): $B^\top B = I_{d-1}$, $B^\top x = 0$.

    Built from a Householder reflection mapping $e_k$ to $x$ ($k$ the
    coordinate where $|x_k|$ is largest, for stability); the remaining
    columns span $x^\perp$.

    Args:
        x: ``(d,)`` unit vector.

    Returns:
        ``(d, d - 1)`` matrix with orthonormal columns orthogonal to ``x``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.array([0.6, 0.0, 0.8])
        >>> B = mf.sphere.tangent_basis(x)
        >>> B.shape, bool(jnp.allclose(x @ B, 0.0, atol=1e-6))
        ((3, 2), True)
    """
    d = x.shape[-1]
    k = jnp.argmax(jnp.abs(x))
    e = jnp.zeros_like(x).at[k].set(1.0)
    sgn = jnp.where(x[k] >= 0, 1.0, -1.0).astype(x.dtype)
    # w = x + sgn e_k has |w_k| = 1 + |x_k| >= 1: no cancellation (x - sgn e_k would cancel).
    w = x + sgn * e
    w = w / jnp.linalg.norm(w)
    H = jnp.eye(d, dtype=x.dtype) - 2.0 * jnp.outer(w, w)
    # H maps e_k to -sgn * x; the other columns are orthonormal and orthogonal to x.
    idx = jnp.arange(d - 1)
    idx = idx + (idx >= k)
    return H[:, idx]


def check_on_sphere(x: Any, name: str = "x0", atol: float = 1e-3) -> None:
    r"""Raise ``ValueError`` unless ``x`` is a finite ``(n, d)`` array of unit rows: $\max_i \bigl| \|x_i\| - 1 \bigr| \le$ ``atol``.

    Only concrete arrays are checked (traced values pass through).

    Args:
        x: the array to check.
        name: its name in the error message.
        atol: tolerance on the row norms.

    Returns:
        ``None``; raises ``ValueError`` on a bad shape, a non-finite entry or a non-unit row.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> mf.sphere.check_on_sphere(jnp.eye(3))
        >>> mf.sphere.check_on_sphere(2 * jnp.eye(3))
        Traceback (most recent call last):
            ...
        ValueError: rows of x0 must have unit norm within 0.001, got a row of norm 2; ...
    """
    if isinstance(x, jax.core.Tracer):
        return
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf; every entry must be finite")
    norms = np.linalg.norm(arr.astype(np.float64), axis=-1)
    worst = float(np.max(np.abs(norms - 1.0)))
    if worst > atol:
        raise ValueError(
            f"rows of {name} must have unit norm within {atol}, got a row of norm "
            f"{norms[np.argmax(np.abs(norms - 1.0))]:.6g}; normalise with "
            f"mf.sphere.normalize({name}) (x / ||x|| row-wise)"
        )


def sample_density(
    key: Any,
    n: Any,
    d: Any,
    log_density: Any,
    *,
    log_bound: Any,
    batch: Any = None,
    max_rounds: Any = 10_000,
    dtype: Any = jnp.float32,
) -> Float[Array, "n d"]:
    r"""``n`` i.i.d. points from $\rho \propto \exp(\text{log\_density})$ on $S^{d-1}$ (rejection sampling).

    Proposals $x \sim \operatorname{uniform}(S^{d-1})$ are accepted with probability
    ``exp(log_density(x) - log_bound)``; accepted points have density
    $\propto \exp(\text{log\_density})$ w.r.t. surface measure provided
    ``log_density <= log_bound`` everywhere. Rounds of ``batch`` proposals run
    in a ``lax.while_loop`` that writes accepted points into a fixed ``(n, d)``
    buffer, so the function is jit/vmap friendly and the output shape is static.
    The expected number of rounds is ``n / (batch * acceptance)``, acceptance
    ``= E_uniform[exp(log_density - log_bound)]``.

    Like ``uniform``, the sampler runs in float32 (``DRAW_DTYPE``: proposals, uniforms and
    ``log_density`` evaluations) whatever ``dtype`` is; the accepted points are then cast to
    ``dtype`` and renormalised, so the same key gives the same points in every precision.

    Args:
        key: a ``jax.random`` key.
        n: number of points, ``n >= 1``.
        d: ambient dimension, ``d >= 2``.
        log_density: $x \mapsto \log \rho(x)$ (``x`` of shape ``(d,)``) up to an additive constant (scalar).
        log_bound: an upper bound of ``log_density`` on the sphere (finite).
        batch: proposals per round (default ``max(n, 256)``).
        max_rounds: the loop stops after this many rounds; if fewer than ``n``
            points were accepted by then an error is raised (``equinox.error_if``).
        dtype: floating dtype of the result.

    Returns:
        ``(n, d)`` array of unit rows.

    Raises:
        ValueError/TypeError: bad ``n``, ``d``, ``log_bound``, ``log_density``;
            at run time (``equinox.error_if``) if a proposal exceeds ``log_bound``
            (the bound is wrong, so the law would be biased) or the rounds ran out.

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.sphere.sample_density(jax.random.key(0), 100, 3, lambda x: 4 * x[2], log_bound=4.0)
        >>> x.shape, bool(x[:, 2].mean() > 0.5)
        ((100, 3), True)
    """
    n = check_int("n", n, minimum=1)
    d = check_int("d", d, minimum=2)
    max_rounds = check_int("max_rounds", max_rounds, minimum=1)
    _check_key(key)
    batch = max(n, 256) if batch is None else check_int("batch", batch, minimum=1)
    if not callable(log_density):
        raise TypeError(f"log_density must be a callable x (d,) -> log rho(x), got {log_density!r}")
    if isinstance(log_bound, bool) or np.ndim(log_bound) != 0:
        raise TypeError(f"log_bound must be a real scalar, got {log_bound!r}")
    check_finite("log_bound", log_bound)
    dtype = _float_dtype(dtype)
    out = _sample_density(
        key,
        jnp.asarray(log_bound, DRAW_DTYPE),
        n,
        d,
        log_density,
        batch,
        max_rounds,
        jnp.dtype(DRAW_DTYPE),
    )
    return _in_dtype(out, dtype)


# the state of the rejection loop: accepted points, how many, the round, the largest excess
_State: TypeAlias = tuple[Float[Array, "n d"], Int[Array, ""], Int[Array, ""], Float[Array, ""]]


@eqx.filter_jit
def _sample_density(
    key: PRNGKeyArray,
    log_bound: Float[Array, ""],
    n: int,
    d: int,
    log_density: Callable[[Float[Array, " d"]], Float[Array, ""]],
    batch: int,
    max_rounds: int,
    dtype: np.dtype,
) -> Float[Array, "n d"]:
    # compiled once per (n, d, log_density, batch, max_rounds, dtype); log_bound is traced
    slack = 1e-4 * (1.0 + jnp.abs(log_bound))  # rounding when log_density attains its bound

    def cond(state: _State) -> Bool[Array, ""]:
        _, filled, rnd, _ = state
        return (filled < n) & (rnd < max_rounds)

    def body(state: _State) -> _State:
        out, filled, rnd, excess = state
        k_prop, k_acc = jax.random.split(jax.random.fold_in(key, rnd))
        x = uniform(k_prop, batch, d, dtype)
        logp = jax.vmap(log_density)(x).astype(dtype)
        excess = jnp.maximum(excess, jnp.max(logp - log_bound))
        u = jax.random.uniform(k_acc, (batch,), dtype=dtype)
        accept = jnp.log(u) < logp - log_bound
        slot = filled + jnp.cumsum(accept) - 1
        slot = jnp.where(accept, slot, n)  # index n is out of range: dropped
        out = out.at[slot].set(x, mode="drop")
        filled = jnp.minimum(filled + jnp.sum(accept), n)
        return out, filled, rnd + 1, excess

    init = (jnp.zeros((n, d), dtype), jnp.asarray(0), jnp.asarray(0), jnp.asarray(-jnp.inf, dtype))
    out, filled, _, excess = jax.lax.while_loop(cond, body, init)
    out = eqx.error_if(
        out,
        excess > slack,
        "sample_density: log_density exceeded log_bound at a proposal; pass a valid upper bound",
    )
    out = eqx.error_if(
        out,
        filled < n,
        "sample_density: max_rounds reached before n points were accepted; raise max_rounds or batch",
    )
    return out
