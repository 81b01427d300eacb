r"""Inverse design: gauges and phase fields whose maximisers realise a target law (USA-AV Thms. 2 and 4).

For a gauge kernel $h = e^{\beta \langle \Psi(\xi) x, \Psi(\zeta) y\rangle} / \beta$ every configuration
$x(\xi) = \Psi(\xi)^\top u$ attains the maximal energy $e^\beta / (2 \beta)$
(docs/math/kernels.md, Maximal energy). Choosing $\Psi$ so that $\Psi(\xi)^\top u$ is a prescribed
point per label realises any target law.

Beyond the constructions of the paper this module offers:

* ``quantile_phase``: the positional counterpart (Thm. 2 ii). A phase field whose maximiser
  $x(s) = R_{-\varphi(s)} u$ has, for uniform positions $s$, a prescribed law on the orbit of
  $u$: $\varphi(s) = -Q(s)$ with $Q$ the quantile function of the target angle law.
* ``Anchored``: a frozen anchor token attending at ``u`` in the gauge frame. The dynamics of a
  gauge kernel pick the collapse point $u'$ of the gauge frame from the initial state, so they
  realise $\Psi(\xi)^\top u'$ rather than the design $\Psi(\xi)^\top u$; the anchor makes the design
  the unique global maximiser, and random initial states land on it.
* ``curve_points`` / ``curve_gauges`` / ``fit_curve``: a learned design. A smooth map
  $p_\theta: (0, 1] \to S^{d-1}$ (truncated Fourier series, normalised) defines the gauge
  $\Psi(s) = \operatorname{rotation\_to}(p_\theta(s), u)$; $\theta$ is fitted with optax so that the maximiser's
  marginal $(p_\theta)_\# ds$ matches a target law given only by samples (squared MMD).
* ``vmf_mixture`` / ``seam_curve``: target laws (a mixture of von Mises--Fisher laws on ``S^2``,
  a closed curve on $S^2$) to design for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from . import sphere
from ._checks import RealScalarLike, check_int, check_nonnegative, check_plane, check_positive
from ._precision import dot, einsum, matmul
from .kernels import USA, GaugeKernel, Kernel, masked_pairwise_field

__all__ = [
    "rotation_to",
    "prompt_gauges",
    "quantile_phase",
    "quantile_from_density",
    "orbit_angles",
    "Anchored",
    "designed_configuration",
    "vmf_mixture",
    "seam_curve",
    "curve_points",
    "curve_gauges",
    "curve_gauge",
    "init_curve",
    "fit_curve",
]

#: Arrays, numbers or (nested) lists of numbers.
_ArrayLike: TypeAlias = ArrayLike | Sequence[Any]


def rotation_to(t: Float[ArrayLike, " d"], u: Float[ArrayLike, " d"]) -> Float[Array, "d d"]:
    r"""The rotation $R$ ($\det R = 1$) in the plane $\operatorname{span}(t, u)$ with $R t = u$.

    With $c = \langle t, u\rangle$, $v = u - c t$, $s = \|v\|$, $e = v / s$:

    $$R = I + (c - 1)(t t^\top + e e^\top) + s (e t^\top - t e^\top),$$

    the identity on $\operatorname{span}(t, u)^\perp$. $t = u$ gives $I$; $t = -u$ a half-turn in a
    plane containing $t$.

    Args:
        t: ``(d,)`` unit vector.
        u: ``(d,)`` unit vector.

    Returns:
        ``(d, d)`` rotation matrix.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> t, u = jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 0.6, 0.8])
        >>> R = mf.design.rotation_to(t, u)
        >>> bool(jnp.allclose(R @ t, u, atol=1e-6)), round(float(jnp.linalg.det(R)), 4)
        (True, 1.0)
    """
    t = jnp.asarray(t)
    u = jnp.asarray(u, t.dtype)
    d = t.shape[-1]
    c = dot(t, u)
    v = u - c * t
    s = jnp.linalg.norm(v)
    # a unit vector orthogonal to t, for the antipodal case
    k = jnp.argmin(jnp.abs(t))
    ek = jnp.zeros_like(t).at[k].set(1.0)
    w = ek - dot(ek, t) * t
    w = w / jnp.linalg.norm(w)
    tiny = jnp.sqrt(jnp.finfo(t.dtype).eps)
    e = jnp.where(s > tiny, v / jnp.where(s > tiny, s, 1.0), w)
    s_eff = jnp.where(s > tiny, s, 0.0)
    c_eff = jnp.where(s > tiny, c, jnp.sign(c))
    I = jnp.eye(d, dtype=t.dtype)
    R = (
        I
        + (c_eff - 1.0) * (jnp.outer(t, t) + jnp.outer(e, e))
        + s_eff * (jnp.outer(e, t) - jnp.outer(t, e))
    )
    return R


def prompt_gauges(targets: ArrayLike, u: ArrayLike) -> Float[Array, "K d d"]:
    r"""Gauges $\Psi_k$ (orthogonal, $\det = 1$) with $\Psi_k\, \text{targets}_k = u$.

    For ``mf.kernels.Prompt(beta, prompt_gauges(targets, u))`` the configuration
    $x(z) = \Psi_z^\top u = \text{targets}_z$ is a global maximiser (energy $e^\beta / (2 \beta)$):
    the prompt-conditional laws are Diracs at the targets, so the marginal is the target
    law $\sum_k w_k \delta_{\text{targets}_k}$ ($w_k$ the label frequencies).

    Args:
        targets: ``(K, d)`` unit vectors.
        u: ``(d,)`` unit vector (the common point of the gauge frame).

    Returns:
        ``(K, d, d)`` rotations ``Psi_k``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> T = jnp.eye(3)
        >>> P = mf.design.prompt_gauges(T, jnp.array([0.0, 0.0, 1.0]))
        >>> bool(jnp.allclose(jnp.einsum("kij,kj->ki", P, T), jnp.array([0.0, 0.0, 1.0]), atol=1e-6))
        True
    """
    T = jnp.asarray(targets)
    if T.ndim != 2:
        raise ValueError(f"targets must have shape (K, d), got {T.shape}")
    uu = jnp.asarray(u, T.dtype if jnp.issubdtype(T.dtype, jnp.floating) else jnp.float32)
    if uu.shape != (T.shape[1],):
        raise ValueError(
            f"u must have shape ({T.shape[1]},) to match targets (K, d) = {T.shape}, got {uu.shape}"
        )
    for name, a in (("targets", T), ("u", uu)):
        if not isinstance(a, jax.core.Tracer):
            norms = np.linalg.norm(np.asarray(a, np.float64), axis=-1)
            if not np.all(np.isfinite(norms)) or np.max(np.abs(norms - 1.0)) > 1e-3:
                raise ValueError(
                    f"{name} must be unit vectors (norm 1 within 1e-3), got norms {norms}"
                )
    return jax.vmap(rotation_to, in_axes=(0, None))(T.astype(uu.dtype), uu)


# ----------------------------------------------------------------------------
# positional counterpart: the quantile phase field (Thm. 2 ii)
# ----------------------------------------------------------------------------


def orbit_angles(
    x: Float[ArrayLike, "n d"], u: Float[ArrayLike, " d"], plane: Sequence[int] = (0, 1)
) -> Float[Array, " n"]:
    r"""Angle $\alpha_i \in [0, 2 \pi)$ of each point relative to $u$ in ``plane = (a, b)``.

    $\alpha_i = \operatorname{atan2}(x_{ib}, x_{ia}) - \operatorname{atan2}(u_b, u_a) \bmod 2 \pi$: for a point $R_\alpha u$
    of the orbit of $u$ this is $\alpha$ ($R_\alpha$ rotates $e_a$ towards $e_b$).

    Args:
        x: ``(n, d)`` points.
        u: ``(d,)`` reference point.
        plane: the rotation plane ``(a, b)``.

    Returns:
        ``(n,)`` angles in ``[0, 2 pi)``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> a = mf.design.orbit_angles(jnp.array([[0.0, 1.0, 0.0]]), jnp.array([1.0, 0.0, 0.0]))
        >>> round(float(a[0]), 4)   # pi / 2
        1.5708
    """
    x = jnp.asarray(x)
    a, b = check_plane(plane, x.shape[-1])
    u = jnp.asarray(u, x.dtype)
    ang = jnp.arctan2(x[..., b], x[..., a]) - jnp.arctan2(u[b], u[a])
    return jnp.mod(ang, 2 * jnp.pi)


def quantile_from_density(
    density: Callable[[Array], ArrayLike], num: int = 4096
) -> Callable[[ArrayLike], Array]:
    r"""Quantile function $Q: (0, 1] \to [0, 2 \pi)$ of the angle law with (unnormalised) ``density`` $\rho$.

    $F(\alpha) = \int_0^\alpha \rho \,/ \int_0^{2 \pi} \rho$ tabulated by the midpoint rule on ``num``
    cells, $Q = F^{-1}$ by linear interpolation (error $O(1/\text{num}^2)$ for smooth $\rho$).

    Args:
        density: callable ``alpha -> rho(alpha) >= 0`` (jax-traceable), not identically 0.
        num: number of cells, ``>= 8``.

    Returns:
        a callable ``s -> Q(s)``, elementwise on arrays.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> Q = mf.design.quantile_from_density(lambda a: jnp.ones_like(a))   # uniform angle
        >>> round(float(Q(0.25)), 4)   # pi / 2
        1.5708
    """
    num = check_int("num", num, minimum=8)
    if not callable(density):
        raise TypeError(f"density must be a callable angle -> density, got {density!r}")
    edges = np.linspace(0.0, 2 * np.pi, num + 1)
    mids = 0.5 * (edges[1:] + edges[:-1])
    rho = np.asarray(jax.vmap(density)(jnp.asarray(mids)), np.float64)
    if not np.all(np.isfinite(rho)) or np.any(rho < 0) or rho.sum() <= 0:
        raise ValueError("density must be finite, >= 0 and not identically 0 on [0, 2 pi)")
    cdf = np.concatenate([[0.0], np.cumsum(rho)]) / rho.sum()
    # strictly increasing table for inversion (cells of zero mass collapse)
    levels, idx = np.unique(cdf, return_index=True)
    angles = edges[idx]
    lv, an = jnp.asarray(levels), jnp.asarray(angles)

    def quantile(s: ArrayLike) -> Array:
        return jnp.interp(
            s, lv.astype(jnp.result_type(s, float)), an.astype(jnp.result_type(s, float))
        )

    return quantile


def quantile_phase(
    quantile: Callable[[ArrayLike], Any] | _ArrayLike,
) -> Callable[[ArrayLike], ArrayLike]:
    r"""Phase field $\varphi(s) = -Q(s)$ realising a target law on the orbit of $u$ (Thm. 2 ii).

    For ``mf.kernels.PhaseField(beta, phi, plane)`` the maximiser is $x(s) = R_{-\varphi(s)} u =
    R_{Q(s)} u$; with $s \sim U(0, 1]$ its angle $Q(s)$ has the law whose quantile function is
    $Q$ (inverse-CDF sampling), so the marginal $x_\# ds$ is the target law on the orbit
    $\{R_\alpha u\}$ (the paper's $\psi(s) = 2 \pi F^{-1}(s)$ with $F$ on $[0, 1)$).

    Args:
        quantile: the target as a quantile function ``Q: (0, 1] -> angle`` (jax-traceable), or a
            1-d array of angle samples (then ``Q`` is their empirical quantile function,
            linearly interpolated between the levels ``(k + 1/2) / m``), see also
            ``quantile_from_density``.

    Returns:
        A callable ``s -> phi(s)`` for ``PhaseField``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> phi = mf.design.quantile_phase(lambda s: 2 * jnp.pi * s**2)
        >>> round(float(phi(0.5)), 4)
        -1.5708
    """
    if callable(quantile):
        Q = quantile
    else:
        a = np.sort(np.asarray(quantile, np.float64).ravel())
        if a.size < 2 or not np.all(np.isfinite(a)):
            raise ValueError(
                f"angle samples must be a finite 1-d array with >= 2 entries, got {np.shape(quantile)}"
            )
        levels = jnp.asarray((np.arange(a.size) + 0.5) / a.size)
        vals = jnp.asarray(a)

        def Q(s: ArrayLike) -> Array:
            dt = jnp.result_type(s, float)
            return jnp.interp(s, levels.astype(dt), vals.astype(dt))

    def phase(s: ArrayLike) -> ArrayLike:
        return -Q(s)

    return phase


# ----------------------------------------------------------------------------
# landing on the design: a frozen anchor token
# ----------------------------------------------------------------------------


class Anchored(Kernel):
    r"""A USA or exp-gauge kernel plus a frozen anchor token attending at $u$ in the gauge frame.

    With $y_i = \Psi(\xi_i) x_i$ ($\Psi = I$ for USA) and anchor mass $w \ge 0$:

    $$h_w(z, z') = h(z, z') + w\, (a(z) + a(z')), \qquad a(x, \xi) = e^{\beta \langle \Psi(\xi) x, u\rangle} / \beta,$$

    $$F_i = F_i^h + w\, e^{\beta \langle y_i, u\rangle} \Psi(\xi_i)^\top u, \qquad E_w = E^h + \frac{w}{n} \sum_i a(x_i, \xi_i),$$

    a symmetric pair kernel, so the flow is still the ascent flow of $E_w$ (the velocity is
    $n P \nabla E_w$). $E_w \le e^\beta (1/2 + w) / \beta$ with equality iff $y_i = u$ for all
    $i$: the designed configuration $x_i = \Psi(\xi_i)^\top u$ is the unique global maximiser.
    The anchor is one extra frozen token of mass $w$ (an ordinary token has $1/n$); in the
    gauge frame it is USA with a fixed point at $u$, so a cluster at $y$ drifts to $u$ at
    rate $\sim w\, e^{\beta \langle y, u\rangle}$. ``rescaled`` kernels keep their $e^{-\beta}$ factor.

    Args:
        base: a ``USA`` or exp-gauge kernel.
        u: ``(d,)`` unit vector, the anchor point in the gauge frame.
        mass: anchor mass ``w >= 0`` (traced).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> k = mf.design.Anchored(mf.kernels.USA(1.0), jnp.array([0.0, 0.0, 1.0]), mass=1.0)
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 16, 3)
        >>> xf = mf.simulate(k, x0, t1=20.0, dt=0.05).xs[-1]
        >>> bool(jnp.all(xf[:, 2] > 0.999))
        True
    """

    base: USA | GaugeKernel
    u: Float[Array, " d"]
    mass: ArrayLike

    def __init__(self, base: Kernel, u: _ArrayLike, mass: ArrayLike = 1.0) -> None:
        if not isinstance(base, (USA, GaugeKernel)):
            raise TypeError(
                f"Anchored needs a USA or exp-gauge kernel (RoPE, PhaseField, Gauge, Prompt), got {type(base).__name__}"
            )
        uu = jnp.asarray(u, jnp.result_type(float))
        if uu.ndim != 1:
            raise ValueError(f"u must be a (d,) unit vector, got shape {uu.shape}")
        if not isinstance(uu, jax.core.Tracer):
            nrm = float(np.linalg.norm(np.asarray(uu, np.float64)))
            if abs(nrm - 1.0) > 1e-3:
                raise ValueError(f"u must be a unit vector, got norm {nrm:.6g}")
        check_nonnegative("mass", mass)
        self.base, self.u, self.mass = base, uu, mass

    @property
    def beta(self) -> RealScalarLike:
        return self.base.beta

    @property
    def integer_labels(self) -> bool:  # type: ignore[override]
        return self.base.integer_labels

    def default_aux(self, n: int) -> Array:
        return self.base.default_aux(n)

    def _gauge(self, xi: ArrayLike, d: int, dtype: DTypeLike) -> Float[Array, "d d"]:
        if isinstance(self.base, GaugeKernel):
            return self.base.gauge_matrix(xi, d).astype(dtype)
        return jnp.eye(d, dtype=dtype)

    def anchor_term(self, x: Float[Array | np.ndarray, " d"], xi: ArrayLike) -> Float[Array, ""]:
        r"""$a(x, \xi) = e^{\beta \langle \Psi(\xi) x, u\rangle} / \beta$ (times $e^{-\beta}$ when rescaled); scalar.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> u = jnp.array([0.0, 0.0, 1.0])
            >>> round(float(mf.design.Anchored(mf.kernels.USA(1.0), u).anchor_term(u, 0.0)), 4)   # e
            2.7183
        """
        P = self._gauge(xi, x.shape[-1], x.dtype)
        return self.base._exp(dot(matmul(P, x), self.u.astype(x.dtype))) / self.base.beta

    def __call__(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, ""]:
        return self.base(x, xi, y, zeta) + self.mass * (
            self.anchor_term(x, xi) + self.anchor_term(y, zeta)
        )

    def grad_x(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, " d"]:
        P = self._gauge(xi, x.shape[-1], x.dtype)
        u = self.u.astype(x.dtype)
        return self.base.grad_x(x, xi, y, zeta) + self.mass * self.base._exp(
            dot(matmul(P, x), u)
        ) * (matmul(P.T, u))

    def _frame(
        self, x: Float[Array, "n d"], aux: ArrayLike | None
    ) -> tuple[Float[Array, "n d d"], Float[Array, "n d"]]:
        d = x.shape[-1]
        if isinstance(self.base, GaugeKernel):
            aux = self.base.default_aux(x.shape[0]) if aux is None else aux  # as Kernel.field
            P = self.base.gauge_matrices(aux, d).astype(x.dtype)
        else:
            P = jnp.broadcast_to(jnp.eye(d, dtype=x.dtype), (x.shape[0], d, d))
        return P, einsum("nij,nj->ni", P, x)

    def field(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, "n d"]:
        if self.mask is not None:
            return masked_pairwise_field(self, x, aux)
        P, y = self._frame(x, aux)
        u = self.u.astype(x.dtype)
        w = self.base._exp(matmul(y, u))  # (n,)
        anchor = einsum("nji,j->ni", P, u) * w[:, None]
        return self.base.field(x, aux, block_size=block_size) + self.mass * anchor

    def energy(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, ""]:
        self.refuse_masked_energy()
        _, y = self._frame(x, aux)
        a = self.base._exp(matmul(y, self.u.astype(x.dtype))) / self.base.beta
        return self.base.energy(x, aux, block_size=block_size) + self.mass * jnp.mean(a)

    def check_config(self, x: ArrayLike, aux: ArrayLike | None) -> None:
        self.base.check_config(x, aux)
        if self.u.shape[0] != np.shape(x)[-1]:
            raise ValueError(
                f"anchor u has dimension {self.u.shape[0]}, states have d = {np.shape(x)[-1]}"
            )

    def check_traced(self, x: Float[Array, "n d"], aux: ArrayLike | None) -> Float[Array, "n d"]:
        return self.base.check_traced(x, aux)

    def max_energy(self) -> Array:
        r"""$E_w$ at the designed configuration: $(1/2 + w)\, e^\beta / \beta$ ($e^{-\beta}$ times if rescaled).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> k = mf.design.Anchored(mf.kernels.USA(1.0), jnp.array([0.0, 0.0, 1.0]), mass=0.5)
            >>> round(float(k.max_energy()), 4)   # e
            2.7183
        """
        beta = jnp.asarray(self.base.beta)
        scale = 1.0 if self.base.rescaled else jnp.exp(beta)
        return jnp.asarray((0.5 + self.mass) * scale / beta)


def designed_configuration(kernel: Kernel, u: _ArrayLike, aux: _ArrayLike) -> Float[Array, "n d"]:
    r"""The designed maximiser $x_i = \Psi(\xi_i)^\top u$ of a USA/gauge kernel (or an ``Anchored`` one).

    Args:
        kernel: ``USA``, an exp-gauge kernel, or ``Anchored`` around one.
        u: ``(d,)`` unit vector (the common point of the gauge frame).
        aux: ``(n,)`` labels.

    Returns:
        ``(n, d)`` unit rows, of energy ``e^beta / (2 beta)``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k, s = mf.kernels.RoPE(1.0, 2 * jnp.pi), mf.positions(8)
        >>> x = mf.design.designed_configuration(k, jnp.array([0.6, 0.0, 0.8]), s)
        >>> x.shape, round(float(mf.energy(k, x, s)), 4)   # e / 2
        ((8, 3), 1.3591)
    """
    base = kernel.base if isinstance(kernel, Anchored) else kernel
    aux = jnp.asarray(aux)
    u = jnp.asarray(u)
    y = jnp.broadcast_to(u, (aux.shape[0], u.shape[0]))
    if isinstance(base, GaugeKernel):
        return base.from_gauge_frame(y, aux)
    if isinstance(base, USA):
        return y
    raise TypeError(
        f"designed_configuration needs a USA or exp-gauge kernel, got {type(base).__name__}"
    )


# ----------------------------------------------------------------------------
# target laws
# ----------------------------------------------------------------------------


def vmf_mixture(
    key: PRNGKeyArray,
    n: int,
    means: _ArrayLike,
    kappas: _ArrayLike,
    weights: _ArrayLike | None = None,
    dtype: DTypeLike = jnp.float32,
) -> Float[Array, "n 3"]:
    r"""$n$ i.i.d. samples of $\sum_k w_k \operatorname{vMF}(\mu_k, \kappa_k)$ on $S^2$ (exact sampler).

    The component is drawn with probabilities $w$; the cosine $t = \langle x, \mu\rangle$ of a vMF on
    $S^2$ has density $\propto e^{\kappa t}$ on $[-1, 1]$, sampled by inversion:
    $t = 1 + \log(U + (1 - U) e^{-2 \kappa}) / \kappa$; the tangent direction is uniform.

    Args:
        key: a ``jax.random`` key.
        n: number of samples.
        means: ``(K, 3)`` mean directions (normalised here).
        kappas: ``(K,)`` (or scalar) concentrations, ``> 0``.
        weights: ``(K,)`` nonnegative weights (default uniform).
        dtype: floating dtype.

    Returns:
        ``(n, 3)`` unit rows.

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.design.vmf_mixture(jax.random.key(0), 100, [[0.0, 0.0, 1.0]], 50.0)
        >>> x.shape, bool(x[:, 2].mean() > 0.9)
        ((100, 3), True)
    """
    n = check_int("n", n, minimum=1)
    mu = sphere.normalize(jnp.asarray(means, dtype))
    if mu.ndim != 2 or mu.shape[1] != 3:
        raise ValueError(f"means must have shape (K, 3), got {mu.shape}")
    K = mu.shape[0]
    kap = jnp.broadcast_to(jnp.asarray(kappas, dtype), (K,))
    check_positive("kappas", kap)
    w = jnp.full((K,), 1.0 / K, dtype) if weights is None else jnp.asarray(weights, dtype)
    check_nonnegative("weights", w)
    if w.shape != (K,):
        raise ValueError(f"weights must have shape ({K},), got {w.shape}")
    kc, ku, kv = jax.random.split(key, 3)
    comp = jax.random.choice(kc, K, (n,), p=w / jnp.sum(w))
    m, k = mu[comp], kap[comp]
    U = jax.random.uniform(ku, (n,), dtype)
    t = 1.0 + jnp.log(U + (1.0 - U) * jnp.exp(-2.0 * k)) / k
    t = jnp.clip(t, -1.0, 1.0)
    v = jax.random.normal(kv, (n, 3), dtype)
    v = sphere.normalize(v - jnp.sum(v * m, -1, keepdims=True) * m)
    return t[:, None] * m + jnp.sqrt(1.0 - t * t)[:, None] * v


def seam_curve(t: _ArrayLike, b: float = 0.3) -> Float[Array, "... 3"]:
    r"""The tennis-ball seam on $S^2$: $(a \cos t + b \cos 3t,\ a \sin t - b \sin 3t,\ 2 \sqrt{ab} \sin 2t)$, $a = 1 - b$.

    $|x|^2 = a^2 + b^2 + 2ab \cos 4t + 2ab (1 - \cos 4t) = (a + b)^2 = 1$. $t$ in radians.

    Args:
        t: angle(s), any shape.
        b: seam parameter in ``(0, 1)``.

    Returns:
        ``t.shape + (3,)`` unit vectors.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = mf.design.seam_curve(jnp.linspace(0.0, 2 * jnp.pi, 5))
        >>> x.shape, bool(jnp.allclose(jnp.linalg.norm(x, axis=-1), 1.0, atol=1e-6))
        ((5, 3), True)
    """
    t = jnp.asarray(t)
    a = 1.0 - b
    return jnp.stack(
        [
            a * jnp.cos(t) + b * jnp.cos(3 * t),
            a * jnp.sin(t) - b * jnp.sin(3 * t),
            2 * np.sqrt(a * b) * jnp.sin(2 * t),
        ],
        axis=-1,
    )


# ----------------------------------------------------------------------------
# learned design: a Fourier curve p_theta and its gauge
# ----------------------------------------------------------------------------


def curve_points(theta: Float[ArrayLike, "m d"], s: Float[ArrayLike, " n"]) -> Float[Array, "n d"]:
    r"""$p_\theta(s) = \operatorname{normalize}\big(c_0 + \sum_{k=1}^M a_k \cos(2 \pi k s) + b_k \sin(2 \pi k s)\big)$.

    Args:
        theta: ``(2M + 1, d)`` stacking ``[c_0; a_1..a_M; b_1..b_M]``.
        s: ``(n,)`` positions.

    Returns:
        ``(n, d)`` unit rows.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> theta = mf.design.init_curve(jax.random.key(0), 2, scale=0.0)   # great circle
        >>> p = mf.design.curve_points(theta, jnp.array([0.25]))
        >>> p.shape, round(float(p[0, 1]), 4)
        ((1, 3), 1.0)
    """
    theta = jnp.asarray(theta)
    M = (theta.shape[0] - 1) // 2
    s = jnp.asarray(s, theta.dtype)
    k = jnp.arange(1, M + 1, dtype=theta.dtype)
    ang = 2 * jnp.pi * s[:, None] * k[None, :]  # (n, M)
    raw = (
        theta[0][None, :]
        + matmul(jnp.cos(ang), theta[1 : M + 1])
        + matmul(jnp.sin(ang), theta[M + 1 :])
    )
    return sphere.normalize(raw)


def curve_gauges(
    theta: Float[ArrayLike, "m d"], s: Float[ArrayLike, " n"], u: Float[ArrayLike, " d"]
) -> Float[Array, "n d d"]:
    r"""Gauges $\Psi(s_i) = \operatorname{rotation\_to}(p_\theta(s_i), u)$ (so $\Psi(s_i)^\top u = p_\theta(s_i)$).

    Differentiable in $\theta$. Use with ``mf.kernels.Prompt(beta, gauges)`` and labels
    ``arange(n)`` (one gauge per token), or ``curve_gauge`` with ``mf.kernels.Gauge``.

    Args:
        theta: ``(2M + 1, d)`` Fourier coefficients (see ``curve_points``).
        s: ``(n,)`` positions.
        u: ``(d,)`` unit vector.

    Returns:
        ``(n, d, d)`` rotations.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> theta, s, u = mf.design.init_curve(jax.random.key(0), 2), mf.positions(4), jnp.array([0.0, 0.0, 1.0])
        >>> G = mf.design.curve_gauges(theta, s, u)
        >>> G.shape, bool(jnp.allclose(G.transpose(0, 2, 1) @ u, mf.design.curve_points(theta, s), atol=1e-5))
        ((4, 3, 3), True)
    """
    P = curve_points(theta, s)
    return jax.vmap(rotation_to, in_axes=(0, None))(P, jnp.asarray(u, P.dtype))


def curve_gauge(
    theta: Float[ArrayLike, "m d"], u: Float[ArrayLike, " d"]
) -> Callable[[ArrayLike], Float[Array, "d d"]]:
    r"""The gauge $\Psi(s) = \operatorname{rotation\_to}(p_\theta(s), u)$ as a callable for ``mf.kernels.Gauge``.

    Args:
        theta: ``(2M + 1, d)`` Fourier coefficients (see ``curve_points``).
        u: ``(d,)`` unit vector.

    Returns:
        a callable ``s -> (d, d)`` rotation.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> psi = mf.design.curve_gauge(mf.design.init_curve(jax.random.key(0), 2), jnp.array([0.0, 0.0, 1.0]))
        >>> psi(0.3).shape
        (3, 3)
    """
    theta = jnp.asarray(theta)
    u = jnp.asarray(u, theta.dtype)

    def psi(s: ArrayLike) -> Float[Array, "d d"]:
        return rotation_to(curve_points(theta, jnp.reshape(s, (1,)))[0], u)

    return psi


def init_curve(
    key: PRNGKeyArray,
    num_modes: int,
    d: int = 3,
    scale: float = 0.1,
    dtype: DTypeLike = jnp.float32,
) -> Float[Array, "m d"]:
    r"""Initial $\theta$: the great circle $\cos(2 \pi s) e_1 + \sin(2 \pi s) e_2$ plus $N(0, \text{scale}^2)$ noise.

    Args:
        key: a ``jax.random`` key.
        num_modes: ``M >= 1`` Fourier modes.
        d: dimension.
        scale: noise standard deviation.
        dtype: floating dtype.

    Returns:
        ``(2M + 1, d)`` coefficients (see ``curve_points``).

    Example:
        >>> import jax, meanfield as mf
        >>> mf.design.init_curve(jax.random.key(0), 2).shape
        (5, 3)
    """
    M = check_int("num_modes", num_modes, minimum=1)
    theta = scale * jax.random.normal(key, (2 * M + 1, d), dtype)
    return theta.at[1, 0].add(1.0).at[M + 1, 1].add(1.0)


def fit_curve(
    key: PRNGKeyArray,
    target: Float[ArrayLike, "m d"],
    *,
    num_modes: int = 6,
    n: int = 256,
    steps: int = 400,
    learning_rate: RealScalarLike = 0.03,
    bandwidth: RealScalarLike = 0.3,
    theta0: Float[ArrayLike, "k d"] | None = None,
) -> tuple[Float[Array, "k d"], Float[Array, " steps"]]:
    r"""Fit $\theta$ so that the maximiser's marginal $(p_\theta)_\# ds$ matches ``target`` samples.

    Loss: $\mathrm{MMD}^2(p_\theta(s), \text{target})$ (``mf.metrics.mmd``, Gaussian kernel of ``bandwidth``)
    over stratified positions $s_i = (i + U_i) / n$ redrawn every step, minimised by
    ``optax.adam``. This differentiates through the maximiser characterisation: for the gauge
    $\Psi(s) = \operatorname{rotation\_to}(p_\theta(s), u)$ the maximiser is $x(s) = p_\theta(s)$ for every $u$.

    Args:
        key: a ``jax.random`` key.
        target: ``(m, d)`` target samples (unit rows).
        num_modes: ``M`` Fourier modes of the curve.
        n: positions per step.
        steps: optimiser steps.
        learning_rate: Adam step size.
        bandwidth: MMD kernel width.
        theta0: initial ``(2M + 1, d)`` coefficients (default ``init_curve``).

    Returns:
        ``(theta, losses)``: ``(2M + 1, d)`` fitted coefficients and the ``(steps,)`` training MMD^2.

    Example:
        >>> import jax, meanfield as mf
        >>> target = mf.design.vmf_mixture(jax.random.key(0), 32, [[0.0, 0.0, 1.0]], 5.0)
        >>> theta, losses = mf.design.fit_curve(jax.random.key(1), target, num_modes=1, n=16, steps=5)
        >>> theta.shape, losses.shape
        ((3, 3), (5,))
    """
    target = jnp.asarray(target)
    steps = check_int("steps", steps, minimum=1)
    n = check_int("n", n, minimum=2)
    check_positive("learning_rate", learning_rate)
    check_positive("bandwidth", bandwidth)
    k0, key = jax.random.split(key)
    theta = (
        init_curve(k0, num_modes, target.shape[1], dtype=target.dtype)
        if theta0 is None
        else jnp.asarray(theta0)
    )
    lr = jnp.asarray(learning_rate, target.dtype)
    bw = jnp.asarray(bandwidth, target.dtype)
    return _fit_curve(theta, key, target, lr, bw, n=n, steps=steps)


@functools.partial(jax.jit, static_argnames=("n", "steps"))
def _fit_curve(
    theta: Float[Array, "k d"],
    key: PRNGKeyArray,
    target: Float[Array, "m d"],
    lr: Array,
    bw: Array,
    *,
    n: int,
    steps: int,
) -> tuple[Float[Array, "k d"], Float[Array, " steps"]]:
    import optax

    from .metrics import mmd

    opt = optax.adam(lr)

    def loss_fn(th: Float[Array, "k d"], s: Float[Array, " n"]) -> Array:
        return mmd(curve_points(th, s), target, bw) ** 2

    def step(carry: tuple[Array, Any], k: PRNGKeyArray) -> tuple[tuple[Array, Any], Array]:
        th, st = carry
        s = (jnp.arange(n, dtype=th.dtype) + jax.random.uniform(k, (n,), th.dtype)) / n
        loss, g = jax.value_and_grad(loss_fn)(th, s)
        upd, st = opt.update(g, st)
        return (optax.apply_updates(th, upd), st), loss

    (th, _), losses = jax.lax.scan(step, (theta, opt.init(theta)), jax.random.split(key, steps))
    return th, losses
