r"""The mean-field limit: dispersion relation around the uniform law, density solver on
$S^1$ and $S^2$, particles against the limit (docs/math/continuum.md).

As $n \to \infty$ the empirical law of the particles (docs/math/particles.md) has a density
$\rho(t, x)$ with respect to the surface measure $\sigma$ of $S^{d-1}$ that solves the
continuity equation

$$\partial_t \rho + \operatorname{div}_S(\rho\, X[\rho]) = 0,$$

with, for ``"usa"`` (the USA kernel, ``mf.kernels.USA``),

$$X[\rho](x) = \nabla_S (K * \rho)(x), \qquad (K * \rho)(x) = \int h(\langle x, y\rangle)\, \rho(y)\, d\sigma(y), \qquad h(t) = e^{\beta t} / \beta,$$

and for ``"sa"`` (normalised self-attention, ``mf.models.SelfAttention``: the softmax over the
tokens becomes the ratio of the two integrals)

$$X[\rho](x) = \frac{\int e^{\beta \langle x, y\rangle} P_x y\, \rho(y)\, d\sigma(y)}{\int e^{\beta \langle x, y\rangle} \rho(y)\, d\sigma(y)} = \frac{\nabla_S \log Z[\rho](x)}{\beta}, \qquad Z[\rho](x) = \int e^{\beta \langle x, y\rangle} \rho(y)\, d\sigma(y).$$

Dispersion relation (``growth_rates``). A zonal kernel $k(\langle x, y\rangle)$ acts on the
degree-$l$ spherical harmonics of $S^{d-1}$ by its Funk-Hecke eigenvalue

$$\mu_l[k] = |S^{d-2}| \int_{-1}^{1} k(t)\, P_l^{(d)}(t)\, (1 - t^2)^{(d-3)/2}\, dt, \qquad P_l^{(d)} = C_l^{(d-2)/2} / C_l^{(d-2)/2}(1)$$

(Gegenbauer; Chebyshev $T_l$ for $d = 2$), and $-\Delta_S Y_l = l (l + d - 2) Y_l$. For
$k(t) = e^{\beta t}$ the generating function of the Gegenbauer polynomials,
$e^{\beta t} = \Gamma(a) (\beta/2)^{-a} \sum_l (l + a) I_{l+a}(\beta) C_l^a(t)$ with
$a = d/2 - 1$, and the orthogonality
$\int (C_l^a)^2 (1-t^2)^{a-1/2} = \pi 2^{1-2a} \Gamma(l+2a) / (l! (l+a) \Gamma(a)^2)$ give

$$\mu_l[e^{\beta t}] = (2 \pi)^{d/2} \beta^{1 - d/2} I_{l + d/2 - 1}(\beta) \qquad (I_\nu \text{: modified Bessel}).$$

Linearise at the uniform law $\rho_0 = 1/|S^{d-1}| = \Gamma(d/2) / (2 \pi^{d/2})$:
$\rho = \rho_0 + \varepsilon Y_l$.

For ``"usa"``, $X = \nabla_S (K * \rho) = \varepsilon \mu_l[h] \nabla_S Y_l$ and
$\partial_t (\varepsilon Y_l) = -\rho_0 \operatorname{div}_S X = \rho_0\, l (l + d - 2)\, \mu_l[h]\, \varepsilon Y_l$,
so

$$\lambda_l = \rho_0\, l (l + d - 2)\, \mu_l[h] = l (l + d - 2)\, \Gamma(d/2)\, 2^{d/2 - 1} \beta^{-d/2} I_{l + d/2 - 1}(\beta).$$

$d = 2$: $\lambda_k = k^2 I_k(\beta) / \beta$; $d = 3$: $\lambda_l = l (l+1)\, i_l(\beta) / \beta$ with
$i_l(b) = \sqrt{\pi / (2 b)}\, I_{l+1/2}(b)$ (docs/math/continuum.md, Growth rates).

For ``"sa"``, $Z = Z_0 + \varepsilon \mu_l[e^{\beta t}] Y_l$ with the uniform law's normaliser
$Z_0 = \rho_0 \mu_0[e^{\beta t}] = \Gamma(d/2) (2/\beta)^{d/2 - 1} I_{d/2 - 1}(\beta)$, so
$X = \varepsilon \mu_l[e^{\beta t}] \nabla_S Y_l / (\beta Z_0)$ and

$$\lambda_l^\text{sa} = \frac{l (l + d - 2)\, \mu_l[e^{\beta t}]}{\beta\, \mu_0[e^{\beta t}]} = \frac{l (l + d - 2)\, I_{l + d/2 - 1}(\beta)}{\beta\, I_{d/2 - 1}(\beta)} = \lambda_l^\text{usa} / Z_0.$$

$d = 2$: $k^2 I_k(\beta) / (\beta I_0(\beta))$; $d = 3$: $l (l+1)\, i_l(\beta) / (\beta\, i_0(\beta))$.
The normalised field is invariant under a rescaling of the kernel, so its rates need no
change of time at large $\beta$.

With noise (``noise=mf.noise.Independent(sigma)``: every token its own Brownian motion, of generator
$\frac{\sigma^2}{2} \Delta_S$; docs/math/noise.md) the density equation is the Fokker-Planck equation

$$\partial_t \rho + \operatorname{div}_S(\rho\, X[\rho]) = D\, \Delta_S \rho, \qquad D = \sigma^2 / 2 \quad (\text{``Noise.diffusion``}),$$

a forward heat flow. The diffusion term is linear, so it adds to the linearisation
$D \Delta_S (\varepsilon Y_l) = -D\, l (l + d - 2)\, \varepsilon Y_l$:

$$\lambda_l^\sigma = \lambda_l - \frac{\sigma^2}{2}\, l (l + d - 2),$$

for every model (the field's part $\lambda_l$ is unchanged). The uniform law is linearly stable
when every $\lambda_l^\sigma \le 0$ (``most_unstable_mode`` with ``noise``: the largest one).
``Common(sigma)`` is refused: one Brownian motion moves all tokens, and the density conditional on
it solves a stochastic PDE, not this deterministic equation.

Large $\beta$ (``growth_rates``, ``solve``): $h$ overflows float32 past $\beta \approx 88$. With
``rescaled=True`` (``"usa"`` only) the kernel is $e^{-\beta} h = e^{\beta (t - 1)} / \beta$, as for
``mf.kernels.USA(beta, rescaled=True)``: the rescaled flow at time $s$ is the original flow at time
$t = e^{-\beta} s$ (``mf.kernels.original_time``); the rates returned are $e^{-\beta} \lambda_l$
(per unit of $s$) and the solver's times are $s$. With noise, $\sigma$ stays in the original time
$t$: per unit of $s$ the diffusion is $D e^{-\beta}$, and the rates are $e^{-\beta} \lambda_l^\sigma$.

Density solver (``solve``): a pseudo-spectral method of lines.

* $d = 2$ (the circle): $\rho$ on $N = 3 L$ equispaced angles; Fourier modes $|k| < L$ are
  evolved; $K * \rho$ is the multiplier $\mu_k = \int h(\cos \varphi) e^{-i k \varphi}\, d\varphi$
  (computed by an FFT of $h$ on $8 L$ points: the aliasing error $\sim e^{-(7 L)^2 / (2 \beta)}$
  is below rounding while $\beta < L^2 / 2$) and the flux $\rho X$ is formed on the grid,
  dealiased by the 2/3 rule ($L - 1 \le (N - 1)/3$).
* $d = 3$ (the sphere): $\rho$ on the Gauss-Legendre x equiangular grid of band-limit $L$
  ($L \times (2 L - 1)$ nodes, degrees $l < L$ evolved), transformed with ``s2fft``'s
  precomputed-kernel spherical harmonic transform (``s2fft.precompute_transforms``, imported
  lazily on first use). The divergence is formed with the identity
  $\operatorname{div}(\rho \nabla U) = (\Delta(\rho U) + \rho \Delta U - U \Delta \rho) / 2$, every
  Laplacian spectral, products on the grid of band-limit $\lceil 3 L / 2 \rceil$ (exact
  Gauss-Legendre quadrature of the quadratic terms: no aliasing into the evolved degrees).
  $\mu_l = 2 \pi \int h(t) P_l(t)\, dt$ by Gauss-Legendre quadrature on $\max(4 L, 128)$ nodes.
* Time stepping: ``diffrax.Tsit5`` (explicit, 5th order) with a PID step-size controller
  (``rtol``/``atol``) or a fixed step ``dt``. Without noise the semi-discrete system is not stiff:
  its linearisation has the real growth rates $\lambda_l$ (moderate, computed above) and transport
  eigenvalues $i k X$ on the imaginary axis, which Tsit5's stability region covers (Euler and Heun
  do not); the adaptive step follows the velocity $\max |X|$, which grows as clusters sharpen, and
  an exponential integrator would gain nothing (no stiff linear part to integrate exactly).
* Diffusion (``noise``): $D \Delta_S \rho$ is applied spectrally, the coefficient of degree $l$
  multiplied by $-D\, l (l + d - 2)$ ($-D k^2$ on the circle, $-D\, l (l + 1)$ on $S^2$; $D e^{-\beta}$
  with ``rescaled``). It adds real eigenvalues down to $-D (L - 1)^2$: the system is stiffer, and the
  adaptive Tsit5 step (stability interval about $[-3.5, 0]$ on the negative real axis) follows
  them, $\Delta t \lesssim 3.5 / (D (L - 1)^2)$, the cost of an explicit step for a heat flow;
  degree 0 has the eigenvalue 0, so the mass stays conserved to rounding.
* The mass $\int \rho$ is conserved to rounding: the mode $k = 0$ (degree 0) of the right-hand
  side is zero exactly.
* Resolution loss: as clusters sharpen the density leaves every fixed band-limit and the
  truncated solution starts to oscillate. The solver measures after every step the spectral
  tail $\|\text{top third of the evolved modes}\| / |\text{mode } 0|$ ($L^2$ norms of the
  coefficients) and stops, with ``status = RESOLUTION_LOST`` and ``t_stop`` the time it was
  detected, when it exceeds ``tail_tol``; saved values after ``t_stop``, or whose own tail exceeds
  ``tail_tol`` (save times inside the last step), are NaN.

Other models: ``model=`` names any registered model (``mf.kernels.register``) whose kernel depends
on $\langle x, y\rangle$ alone, through its profile (``Model.zonal_profile``, a ``mf.kernels.Profile``:
$h$, whether the field is normalised, whether a rescaled form exists, the overflow bound). The exp
profiles (``"usa"``, ``"sa"``) have the closed-form rates above; the rates of the others are their
Funk-Hecke eigenvalues by Gauss-Jacobi quadrature (concrete degrees), and ``solve`` uses the same
numerical multipliers for every profile.

Particles against the limit: ``sample_perturbation`` draws particles (i.i.d. or on a lattice)
from the density of a mode perturbation, ``mode_perturbation`` evaluates that density on the grid,
``project_particles`` is the band-limited $L^2$ projection of an empirical law onto the grid,
``w1_circle`` is the exact $W_1$ distance on the circle (through CDFs) and ``mmd_sphere`` the
maximum mean discrepancy with the USA kernel.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from jaxtyping import Array, ArrayLike, Complex, Float, Int

from ._checks import (
    RealScalarLike,
    _error_if,
    check_int,
    check_positive,
    is_concrete,
    traced_positive,
)
from ._precision import matmul, third_party
from ._resources import Cost
from .models import ExpProfile, Profile
from .noise import Noise

__all__ = [
    "MODELS",
    "zonal_models",
    "model_profile",
    "STATUS",
    "OK",
    "RESOLUTION_LOST",
    "FAILED",
    "Grid",
    "Solution",
    "grid",
    "growth_rates",
    "most_unstable_mode",
    "uniform_density",
    "mode_perturbation",
    "mode_amplitude",
    "solve",
    "solve_cost",
    "MAX_DIMENSION",
    "MAX_DEGREE",
    "MAX_MODE",
    "SHT_KERNEL_FLOP",
    "sample_perturbation",
    "project_particles",
    "w1_circle",
    "mmd_sphere",
]

#: The built-in mean-field models: ``"usa"`` (unnormalised, ``h = e^{beta t}/beta``) and ``"sa"``
#: (softmax-normalised). ``model=`` accepts every registered model with a zonal profile (``zonal_models``).
MODELS = ("usa", "sa")
#: ``Solution.status`` codes: the run reached ``t1`` / lost resolution / failed (non-finite or
#: ``max_steps`` exhausted); ``STATUS[code]`` is the name.
OK, RESOLUTION_LOST, FAILED = 0, 1, 2
STATUS = ("ok", "resolution_lost", "failed")


# --------------------------------------------------------------------------- checks


#: Largest ambient dimension ``d`` of the dispersion relation (``growth_rates``, ``most_unstable_mode``).
MAX_DIMENSION = 10**6
#: Largest degree ``ell`` (degrees are int32 in the compiled programs).
MAX_DEGREE = 2**31 - 1
#: Most degrees ``most_unstable_mode`` evaluates on a grid (``max_mode``); a larger automatic search
#: (``beta`` past about ``10^12``) runs as a search of the unimodal float64 log-rates on the host.
MAX_MODE = 2**22


def _check_d(d: object) -> int:
    d = check_int("d", d, minimum=2)
    if d > MAX_DIMENSION:
        raise ValueError(f"d must be <= {MAX_DIMENSION} (MAX_DIMENSION), got {d}")
    return d


def _check_solver_d(d: object) -> int:
    d = _check_d(d)
    if d not in (2, 3):
        raise ValueError(
            f"the density solver supports d = 2 (the circle) and d = 3 (S^2), got d = {d}"
        )
    return d


def zonal_models() -> tuple[str, ...]:
    """The names of the registered models (``mf.kernels.MODELS``) whose kernel depends on
    ``<x, y>`` alone (``Model.zonal_profile`` is not None): what ``model=`` accepts here.

    Example:
        >>> import meanfield as mf
        >>> mf.continuum.zonal_models()
        ('usa', 'sa', 'kuramoto')
    """
    from .kernels import MODELS as registry

    return tuple(
        name
        for name, entry in registry.items()
        if entry.cls is not None and entry.cls.zonal_profile() is not None
    )


def model_profile(model: str, rescaled: bool = False) -> Profile:
    """The zonal profile (``mf.kernels.Profile``) of the registered model named ``model``:
    ``mf.kernels.MODELS[model].cls.zonal_profile(rescaled)``, what every function here uses.

    Raises:
        ValueError: ``model`` is not registered or has no zonal profile (the message lists
            ``zonal_models()``), or ``rescaled=True`` for a model without a rescaled form.
        TypeError: ``rescaled`` is not a bool.

    Example:
        >>> import meanfield as mf
        >>> mf.continuum.model_profile("sa").normalized, mf.continuum.model_profile("usa", True).rescaled
        (True, True)
    """
    from .kernels import MODELS as registry

    entry = registry.get(model) if isinstance(model, str) else None
    cls = entry.cls if entry is not None else None
    if cls is None or cls.zonal_profile() is None:
        accepted = ", ".join(map(repr, zonal_models()))
        if cls is None:
            raise ValueError(f"unknown model {model!r}; accepted: {accepted}")
        raise ValueError(
            f"model {model!r} has no zonal profile (its kernel does not depend on <x, y> alone); "
            f"accepted: {accepted}"
        )
    if not isinstance(rescaled, (bool, np.bool_)):
        raise TypeError(f"rescaled must be True or False, got {rescaled!r}")
    profile = cls.zonal_profile(rescaled=bool(rescaled))
    if profile is None:
        raise TypeError(f"{cls.__name__}.zonal_profile(rescaled={bool(rescaled)}) returned None")
    if rescaled and not profile.rescalable:
        with_form = [n for n in zonal_models() if model_profile(n).rescalable]
        why = (
            f"the normalised {model!r} field is invariant under a rescaling of the kernel (its time "
            "is never rescaled)"
            if profile.normalized
            else f"{model!r} has no rescaled form"
        )
        raise ValueError(
            f"rescaled=True applies to {', '.join(f'model={n!r}' for n in with_form)} only: {why}"
        )
    return profile


def _check_beta(beta: Any, *, profile: Profile, dtype: Any, scalar: bool = True) -> None:
    if not is_concrete(beta):
        return
    if isinstance(beta, (str, bytes, bool, np.bool_)) or (scalar and np.ndim(beta) != 0):
        raise TypeError(
            f"beta must be a real {'scalar' if scalar else 'number or array'}, got {beta!r}"
        )
    check_positive("beta", beta)
    tiny = float(np.finfo(dtype).tiny)
    if float(np.min(beta)) < tiny:
        raise ValueError(
            f"beta = {float(np.min(beta)):g} rounds to 0 in {np.dtype(dtype).name} (smallest normal value "
            f"{tiny:.4g}); use a larger beta or float64"
        )
    limit = profile.overflow_limit(dtype)
    if limit is not None:
        if float(np.max(beta)) >= limit:
            raise ValueError(
                f"beta = {float(np.max(beta)):g} overflows e^beta in {np.dtype(dtype).name} (limit about "
                f"{limit:.0f}); pass rescaled=True (kernel e^(beta (t - 1)) / beta, time s = e^beta t)"
            )


def _float_dtype(x: object = None) -> np.dtype:
    if x is not None and jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
        return jnp.asarray(x).dtype
    return jnp.result_type(float)


# --------------------------------------------------------------------------- Bessel functions


#: Debye coefficients u_k(p) of the uniform expansion I_nu(nu z) ~ e^{nu eta} / sqrt(2 pi nu) (1 + z^2)^{-1/4}
#: sum_k u_k(p) / nu^k, p = (1 + z^2)^{-1/2} (DLMF 10.41.3, 10.41.10): polynomial coefficients in p, low to high.
_DEBYE = (
    (0, 3 / 24, 0, -5 / 24),
    (0, 0, 81 / 1152, 0, -462 / 1152, 0, 385 / 1152),
    (0, 0, 0, 30375 / 414720, 0, -369603 / 414720, 0, 765765 / 414720, 0, -425425 / 414720),
    (
        0,
        0,
        0,
        0,
        4465125 / 39813120,
        0,
        -94121676 / 39813120,
        0,
        349922430 / 39813120,
        0,
        -446185740 / 39813120,
        0,
        185910725 / 39813120,
    ),
)


def _log_ive_host(nu: ArrayLike, x: ArrayLike) -> np.ndarray:
    r"""$\log(I_\nu(x) e^{-x})$ in float64 for $\nu \ge -1$, $x > 0$, finite where ``scipy.special.ive``
    underflows (large $\nu$: ``growth_rates(2.0, 400, 1)``) or returns NaN (large $x$: ``ive(3, 1e10)``).

    Regimes: the power series $\sum_k (x^2/4)^k / (k!\, \Gamma(\nu + k + 1))$ in log form where
    $x^2 / 4 \le \nu + 1$ (40 terms, each ratio below $1/(k + 1)$: exact to rounding); the Debye
    expansion (DLMF 10.41.3, four terms, error below $10^{-11}$ in the log) for $\nu \ge 50$ otherwise;
    Hankel's large-argument expansion (DLMF 10.40.1, four terms) for $\nu < 50$, $x \ge 10^8$; ``scipy``'s
    ``ive`` in between (moderate order and argument, where it is accurate). Orders $-1$ and $-1/2$ (the
    Bessel recurrence of the JVP at degree 0) by $I_{-1} = I_1$ and $I_{-1/2}(x) = \sqrt{2 / (\pi x)} \cosh x$.
    """
    nu, x = np.broadcast_arrays(np.asarray(nu, np.float64), np.asarray(x, np.float64))
    nu = np.where(nu == -1.0, 1.0, nu)  # I_{-1} = I_1
    out = np.full(nu.shape, np.nan)
    with np.errstate(all="ignore"):
        half = nu == -0.5
        out[half] = (
            0.5 * np.log(2 / (np.pi * x[half])) + np.log1p(np.exp(-2 * x[half])) - np.log(2.0)
        )
        y = x * x / 4
        series = ~half & (y <= nu + 1) & (nu >= 0)
        if np.any(series):
            v, xs, ys = nu[series], x[series], y[series]
            term, tot = np.ones_like(v), np.ones_like(v)
            for k in range(40):
                term = term * ys / ((k + 1) * (v + k + 1))
                tot = tot + term
            out[series] = v * np.log(xs / 2) - scipy.special.gammaln(v + 1) + np.log(tot) - xs
        debye = ~half & ~series & (nu >= 50)
        if np.any(debye):
            v, xs = nu[debye], x[debye]
            z = xs / v
            r = np.sqrt(1 + z * z)
            p = 1 / r
            # nu (eta - z) = nu (sqrt(1 + z^2) - z - asinh(1 / z)), without the cancellation at large z
            expo = v * (1 / (r + z) - np.arcsinh(1 / z))
            tot = np.ones_like(v)
            for k, coef in enumerate(_DEBYE, start=1):
                tot = tot + np.polynomial.polynomial.polyval(p, coef) / v**k
            out[debye] = expo - 0.5 * np.log(2 * np.pi * v) - 0.25 * np.log1p(z * z) + np.log(tot)
        hankel = ~half & ~series & ~debye & (x >= 1e8)
        if np.any(hankel):
            mu, xs = 4 * nu[hankel] ** 2, x[hankel]
            term, tot = np.ones_like(xs), np.ones_like(xs)
            for k in range(1, 5):
                term = -term * (mu - (2 * k - 1) ** 2) / (k * 8 * xs)
                tot = tot + term
            out[hankel] = -0.5 * np.log(2 * np.pi * xs) + np.log(tot)
        rest = ~half & ~series & ~debye & ~hankel
        if np.any(rest):
            out[rest] = np.log(scipy.special.ive(nu[rest], x[rest]))
    return out


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _log_ive(
    shift: float, power: float, const: float, ell: ArrayLike, beta: ArrayLike
) -> Float[Array, "..."]:
    """``const - power log(beta) + log(I_{ell + shift}(beta) e^{-beta})``, all in float64 on the host
    (``_log_ive_host`` through ``jax.pure_callback``: the sum of large logs, e.g. ``lgamma(200)`` at
    ``d = 400``, is not rounded to the dtype before it cancels); differentiable in ``beta`` by
    ``d/db I_nu = (I_{nu-1} + I_{nu+1}) / 2``."""
    shape = jnp.broadcast_shapes(jnp.shape(ell), jnp.shape(beta))
    dtype = jnp.result_type(beta, float)
    out = jax.ShapeDtypeStruct(shape, dtype)

    def host(e: ArrayLike, b: ArrayLike) -> np.ndarray | np.floating:
        b = np.asarray(b, np.float64)
        val = _log_ive_host(np.asarray(e, np.float64) + shift, b)
        if power or const:
            with np.errstate(
                invalid="ignore", divide="ignore"
            ):  # beta <= 0: NaN, stopped by the traced check
                val = const - power * np.log(b) + val
        return val.astype(dtype)

    return jax.pure_callback(
        host,
        out,
        jnp.broadcast_to(ell, shape),
        jnp.broadcast_to(beta, shape).astype(dtype),
        vmap_method="broadcast_all",
    )


@_log_ive.defjvp
def _log_ive_jvp(
    shift: float, power: float, const: float, primals: tuple[Any, Any], tangents: tuple[Any, Any]
) -> tuple[Array, Array]:
    ell, beta = primals
    _, dbeta = tangents
    y = _log_ive(shift, power, const, ell, beta)
    y0 = _log_ive(shift, 0.0, 0.0, ell, beta)
    # shift -+ 1, not ell -+ 1: ell may be the largest int32
    down, up = _log_ive(shift - 1, 0.0, 0.0, ell, beta), _log_ive(shift + 1, 0.0, 0.0, ell, beta)
    dy = 0.5 * (jnp.exp(down - y0) + jnp.exp(up - y0)) - 1 - power / beta
    return y, dy * dbeta


# --------------------------------------------------------------------------- diffusion


def _noise_diffusion(noise: Any) -> Any:
    r"""The diffusion coefficient $D$ of ``noise`` (``Noise.diffusion``: $\sigma^2 / 2$ for
    ``Independent``, concrete or traced), or None without noise.

    Raises:
        ValueError: ``Common`` (its density solves a stochastic PDE, not a deterministic equation) or
            another noise without a density equation (``Noise.diffusion``).
        TypeError: ``noise`` is neither None nor a ``meanfield.noise.Noise``.
    """
    if noise is None:
        return None
    if not isinstance(noise, Noise):
        raise TypeError(
            f"noise must be None or meanfield.noise.Independent(sigma) (the density equation with "
            f"diffusion), got {noise!r}"
        )
    return noise.diffusion()


def _time_diffusion(D: Any, b: Float[Array, "*b"], rescaled: bool) -> Float[Array, "*b"]:
    r"""$D$ per unit of the equation's time, in ``b``'s dtype: $D$, or $D e^{-\beta}$ in the rescaled
    time $s = e^\beta t$ (the noise's $\sigma$ is in $t$). The factor is applied as two halves
    $e^{-\beta/2}$, so that it stays a normal float (not flushed to 0) while $D e^{-\beta}$ is."""
    D = jnp.asarray(D, b.dtype)
    if not rescaled:
        return jnp.broadcast_to(D, b.shape)
    half = jnp.exp(-b / 2)
    return D * half * half


# --------------------------------------------------------------------------- dispersion relation


def growth_rates(
    beta: RealScalarLike,
    d: int,
    ell: ArrayLike | Sequence[Any],
    *,
    model: str = "usa",
    rescaled: bool = False,
    noise: Any = None,
) -> Float[Array, "..."]:
    r"""Growth rate $\lambda_l$ of the degree-``ell`` harmonic perturbation of the uniform law on
    $S^{d-1}$ (docs/math/continuum.md, Growth rates; derivation in the module docstring):

    $$\lambda_l^\text{usa} = l (l + d - 2)\, \Gamma(d/2)\, 2^{d/2 - 1} \beta^{-d/2} I_{l + d/2 - 1}(\beta), \qquad \lambda_l^\text{sa} = \frac{l (l + d - 2)\, I_{l + d/2 - 1}(\beta)}{\beta\, I_{d/2 - 1}(\beta)}.$$

    $d = 2$: $k^2 I_k(\beta) / \beta$ (usa); $d = 3$: $l (l + 1)\, i_l(\beta) / \beta$ (usa). ``ell = 0``
    (the mass) has rate 0. ``rescaled=True`` (usa only) returns $e^{-\beta} \lambda_l$, the rate
    per unit of the rescaled time $s = e^\beta t$, finite for every $\beta$.

    With ``noise=mf.noise.Independent(sigma)`` the density equation gains the forward heat flow
    $+\frac{\sigma^2}{2} \Delta_S \rho$ and every rate loses the Laplacian's eigenvalue
    (docs/math/continuum.md, With noise):

    $$\lambda_l - \frac{\sigma^2}{2}\, l (l + d - 2) \qquad (\text{times } e^{-\beta} \text{ with } \texttt{rescaled}: \sigma \text{ is in the original time } t),$$

    negative for the degrees the noise stabilises; for every model.

    Args:
        beta: inverse temperature ``> 0`` (traced or concrete; broadcasts against ``ell``).
        d: ambient dimension ``>= 2`` (static).
        ell: degrees ``>= 0`` (int array, traced or concrete).
        model: ``"usa"``, ``"sa"``, or any registered model with a zonal profile (``zonal_models``,
            ``Model.zonal_profile``; rates by quadrature where the profile has no closed form).
        rescaled: rates per unit of $s = e^\beta t$ (usa only).
        noise: None, or ``mf.noise.Independent(sigma)`` (``sigma`` concrete or traced: ``vmap`` and
            ``grad`` over it apply, $\partial \lambda_l / \partial \sigma = -\sigma\, l (l + d - 2)$).

    Returns:
        rates, broadcast shape of ``beta`` and ``ell``, in ``beta``'s float dtype (default float).

    Evaluated in log space: $\log(I_\nu(\beta) e^{-\beta})$ in float64 on the host (series, Debye and
    Hankel expansions where ``scipy.special.ive`` under- or overflows: any $\beta$, $d$, $l$) through
    ``jax.pure_callback`` (jit, vmap), differentiable in ``beta`` (a custom JVP from the Bessel
    recurrence); the constant $\Gamma(d/2) 2^{d/2 - 1}$ as ``lgamma``.

    Raises:
        ValueError: concrete ``beta <= 0``, ``ell < 0`` or ``ell > MAX_DEGREE``, ``d`` outside
            ``[2, MAX_DIMENSION]``, or a usa ``beta`` whose ``e^beta`` overflows the dtype without
            ``rescaled``. Traced values out of range (``beta`` under ``jit``, a negative traced
            ``ell``, the same overflow) stop the program with an error (``equinox.error_if``).
            ``noise=mf.noise.Common(sigma)``: the density conditional on the common Brownian motion
            solves a stochastic PDE, with no deterministic rates (a negative or non-finite concrete
            ``sigma`` is refused by the noise itself).
        TypeError: ``noise`` neither None nor a ``mf.noise.Noise``.

    Example:
        >>> import meanfield as mf
        >>> [round(float(r), 4) for r in mf.continuum.growth_rates(4.0, 2, [1, 2, 3, 4])]
        [2.4399, 6.4222, 7.5089, 5.6651]
        >>> [round(float(r), 4) for r in mf.continuum.growth_rates(4.0, 2, [1, 2, 3, 4],
        ...                                                       noise=mf.noise.Independent(1.0))]
        [1.9399, 4.4222, 3.0089, -2.3349]
    """
    d = _check_d(d)
    profile = model_profile(model, rescaled)
    D = _noise_diffusion(noise)
    dtype = _float_dtype(beta)
    _check_beta(beta, profile=profile, dtype=dtype, scalar=False)
    ell_np = None
    if is_concrete(ell):
        try:
            ell_np = np.asarray(ell)
        except OverflowError:
            raise ValueError(f"ell must be <= {MAX_DEGREE} (MAX_DEGREE), got {ell!r}") from None
        if ell_np.dtype == object and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in ell_np.ravel()
        ):  # Python ints past int64 (10**400)
            big = [int(v) for v in ell_np.ravel() if not -1 < int(v) <= MAX_DEGREE]
            if big:
                raise ValueError(f"ell must be in [0, {MAX_DEGREE}] (MAX_DEGREE), got {big[0]}")
        if ell_np.dtype.kind not in "iu" and not (
            ell_np.dtype.kind == "f"
            and np.all(np.isfinite(ell_np))
            and np.all(ell_np == np.round(ell_np))
        ):
            raise TypeError(f"ell must be integer degrees, got {ell!r}")
        if np.any(ell_np < 0):
            raise ValueError(f"ell must be >= 0, got {ell!r}")
        if np.any(ell_np > MAX_DEGREE):
            raise ValueError(f"ell must be <= {MAX_DEGREE} (MAX_DEGREE), got {ell!r}")
        ell_np = ell_np.astype(np.int64)
        ell_a = jnp.asarray(ell_np.astype(np.int32))
    else:
        ell_a = jnp.asarray(ell).astype(jnp.int32)
    b = jnp.asarray(beta, dtype)
    a = d / 2 - 1
    ellf = ell_a.astype(dtype)
    lap = ellf * (ellf + (d - 2))  # in floats: ell (ell + d - 2) overflows int32 past ell ~ 46341
    if type(profile) is not ExpProfile:  # no closed form: Funk-Hecke eigenvalues by quadrature
        if ell_np is None:
            raise ValueError(
                f"growth_rates: model {model!r} has no closed-form rates (they are computed by "
                "quadrature): pass concrete degrees ell"
            )
        rate = _quadrature_rates(profile, b, d, ell_np)
    elif profile.normalized:
        log_ive = _log_ive(a, 0.0, 0.0, ell_a, b)
        rate = lap * jnp.exp(log_ive - _log_ive(a, 0.0, 0.0, jnp.zeros_like(ell_a), b)) / b
    else:
        log_const = math.lgamma(d / 2) + (d / 2 - 1) * math.log(
            2.0
        )  # Gamma(d/2) 2^(d/2-1), no overflow
        # degree 0 (lap = 0) has rate 0 exactly, also where its factor beta^-1 I_{d/2-1} overflows
        rate = jnp.where(lap > 0, lap * jnp.exp(_log_ive(a, d / 2, log_const, ell_a, b)), 0)
        if not profile.rescaled:
            rate = rate * jnp.exp(b)  # kept apart: e^beta of an exact beta keeps full precision
    if D is not None:  # the heat flow: -D l (l + d - 2), per unit of the rates' time
        rate = rate - _time_diffusion(D, b, profile.rescaled) * lap
    return _traced_rate_checks(rate, b, ell_a, profile)


#: Largest degree of the growth rates computed by quadrature (profiles without a closed form).
_QUADRATURE_MAX_DEGREE = 4096


def _quadrature_rates(
    profile: Profile, b: Float[Array, "*b"], d: int, ell: np.ndarray
) -> Float[Array, "..."]:
    r"""Growth rates of a profile without closed form: $\lambda_l = \rho_0\, l (l + d - 2)\, \mu_l[h]$
    (unnormalised) or $l (l + d - 2)\, \mu_l[h] / (\beta\, \mu_0[h])$ (normalised), the Funk-Hecke
    eigenvalues $\mu_l[h] = |S^{d-2}| \int h(t) P_l^{(d)}(t) (1 - t^2)^{(d-3)/2} dt$ by Gauss-Jacobi
    quadrature on $\max(2 l_{\max} + 64, 256)$ nodes (exact for polynomial profiles of degree below
    128), $P_l^{(d)}$ the Jacobi polynomial $P_l^{(a, a)}$, $a = (d - 3)/2$, normalised to 1 at 1."""
    top = int(np.max(ell)) if ell.size else 0
    if top > _QUADRATURE_MAX_DEGREE:
        raise ValueError(
            f"ell must be <= {_QUADRATURE_MAX_DEGREE} for a profile without closed-form rates "
            f"(quadrature), got {top}"
        )
    dtype = b.dtype
    shape = jnp.broadcast_shapes(jnp.shape(b), ell.shape)
    ells, inverse = np.unique(np.broadcast_to(ell, shape).ravel(), return_inverse=True)
    t, w, P = _jacobi_table(d, tuple(int(v) for v in ells), max(2 * top + 64, 256))
    area = 2 * math.pi ** ((d - 1) / 2) / math.gamma((d - 1) / 2)  # |S^{d-2}|
    table = jnp.asarray((area * w * P)[inverse], dtype)  # (K, M)
    bk = jnp.broadcast_to(b, shape).reshape(-1)
    hv = profile.values(jnp.asarray(t, dtype)[None, :], bk[:, None])  # (K, M)
    mu = jnp.sum(hv * table, axis=-1)
    ellf = jnp.asarray(ells[inverse], dtype)
    lap = ellf * (ellf + (d - 2))
    if profile.normalized:
        mu0 = area * jnp.sum(hv * jnp.asarray(w, dtype), axis=-1)
        rate = lap * mu / (bk * mu0)
    else:
        rate = uniform_density(d) * lap * mu
    return rate.reshape(shape)


@functools.lru_cache(maxsize=32)
def _jacobi_table(
    d: int, ells: tuple[int, ...], M: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gauss-Jacobi nodes ``t``, weights ``w`` (weight $(1 - t^2)^{(d-3)/2}$) on ``M`` nodes and the
    normalised polynomials $P_l^{(d)}(t)$, ``(len(ells), M)``: Chebyshev ($d = 2$, nodes in closed
    form), Legendre ($d = 3$), Jacobi $P_l^{(a, a)} / P_l^{(a, a)}(1)$ otherwise."""
    if d == 2:
        t = np.cos((2 * np.arange(M) + 1) * np.pi / (2 * M))
        w = np.full(M, np.pi / M)
        return t, w, np.stack([scipy.special.eval_chebyt(l, t) for l in ells])
    if d == 3:
        t, w = np.polynomial.legendre.leggauss(M)
        return t, w, np.stack([scipy.special.eval_legendre(l, t) for l in ells])
    alpha = (d - 3) / 2
    t, w = scipy.special.roots_jacobi(M, alpha, alpha)
    with np.errstate(all="ignore"):
        P = np.stack([scipy.special.eval_jacobi(l, alpha, alpha, t) for l in ells])
        P = P / np.stack([scipy.special.eval_jacobi(l, alpha, alpha, 1.0) for l in ells])[:, None]
    return t, w, P


def _traced_rate_checks(
    rate: Float[Array, "..."], b: Float[Array, "..."], ell: Array, profile: Profile
) -> Float[Array, "..."]:
    """``rate`` with the range checks of a traced ``beta`` / ``ell`` attached (``equinox.error_if``)."""
    rate = traced_positive(rate, "beta", b)
    if not is_concrete(ell):
        rate = _error_if(rate, jnp.any(ell < 0), "ell must be >= 0; a traced ell was negative")
    limit = profile.overflow_limit(b.dtype)
    if limit is not None and not is_concrete(b):
        rate = _error_if(
            rate,
            jnp.any(b >= limit),
            f"beta overflows e^beta in {np.dtype(b.dtype).name} (limit about {limit:.0f}); a traced beta was "
            "past it: pass rescaled=True",
        )
    return rate


def most_unstable_mode(
    beta: RealScalarLike,
    d: int,
    *,
    model: str = "usa",
    max_mode: int | None = None,
    noise: Any = None,
) -> Int[Array, ""]:
    r"""The degree $l^* = \operatorname{argmax}_{1 \le l \le \text{max\_mode}} \lambda_l$ of the fastest-growing harmonic.

    On the circle the $k^*$-th mode has $k^*$ maxima: the number of clusters that form first
    from a near-uniform start. Large $\beta$: $I_k(\beta) \sim e^\beta e^{-k^2/(2 \beta)} / \sqrt{2 \pi \beta}$
    so $l^* \sim \sqrt{2 \beta}$ (docs/math/continuum.md, Fastest mode).

    With ``noise=mf.noise.Independent(sigma)`` the argmax is that of the rates with diffusion,
    $\lambda_l - \frac{\sigma^2}{2} l (l + d - 2)$ (``growth_rates(..., noise=)``): the penalty grows with
    $l$, so $l^*$ moves to lower degrees as $\sigma$ grows. The rates may then all be negative: the
    uniform law is linearly stable when the returned mode's rate ``growth_rates(beta, d, l_star,
    noise=noise)`` is ``<= 0`` (every degree decays; $l^*$ is then the slowest to decay).

    Args:
        beta: inverse temperature ``> 0`` (scalar).
        d: ambient dimension ``>= 2``.
        model: ``"usa"``, ``"sa"``, or any registered model with a zonal profile (``zonal_models``,
            ``Model.zonal_profile``; rates by quadrature where the profile has no closed form).
        max_mode: largest degree searched (static, at most ``MAX_MODE``), on a grid of degrees with the
            rates of ``growth_rates`` (``jit``/``vmap``); ``None``: $4 \lceil \sqrt{2 \beta} \rceil + 8$
            from a concrete ``beta`` (required when ``beta`` is traced), searched on the host in float64
            log space (all degrees up to ``MAX_MODE``; past it, a ternary search of the log-rates, which
            are concave in $l$: $\log l (l + d - 2)$ and $\log I_{l + a}(\beta)$ are). With ``noise``
            (rates that may be negative have no log) and ``max_mode=None``: the rates with diffusion on
            the grid of degrees ``1..l0``, ``l0`` the host argmax without noise (the argmax with noise
            is at most ``l0``); ``l0 > MAX_MODE`` ($\beta$ past about $8 \cdot 10^{12}$) is refused.
        noise: None, or ``mf.noise.Independent(sigma)`` (``sigma`` concrete or traced).

    Returns:
        int32 scalar $l^*$.

    Raises:
        ValueError: ``noise=mf.noise.Common(sigma)`` (no deterministic density equation).
        TypeError: ``noise`` neither None nor a ``mf.noise.Noise``.

    Example:
        >>> import meanfield as mf
        >>> [int(mf.continuum.most_unstable_mode(b, 2)) for b in (1.0, 4.0, 9.0, 40.0)]
        [1, 3, 4, 9]
        >>> [int(mf.continuum.most_unstable_mode(4.0, 2, noise=mf.noise.Independent(s)))
        ...  for s in (0.0, 1.0, 2.0, 3.0)]
        [3, 2, 1, 1]
        >>> float(mf.continuum.growth_rates(4.0, 2, 1, noise=mf.noise.Independent(3.0))) < 0  # stable
        True
    """
    d = _check_d(d)
    _noise_diffusion(noise)  # refused here, before any work (Common, not a noise)
    if max_mode is None:
        if not is_concrete(beta):
            raise ValueError("most_unstable_mode: pass max_mode when beta is traced (jit/vmap)")
        profile = model_profile(model, False)
        if type(profile) is not ExpProfile:
            raise ValueError(
                f"most_unstable_mode: model {model!r} has no closed-form rates: pass max_mode (a grid "
                "of degrees)"
            )
        if isinstance(beta, (str, bytes, bool, np.bool_)) or np.ndim(beta) != 0:
            raise TypeError(f"beta must be a real scalar, got {beta!r}")
        check_positive("beta", beta)
        b = float(beta)
        top = 4 * math.ceil(math.sqrt(2 * b)) + 8
        if top > MAX_DEGREE:
            raise ValueError(
                f"beta = {b:g}: the most unstable degree (about sqrt(2 beta) = {math.sqrt(2 * b):.3g}) is past "
                f"the int32 degrees (MAX_DEGREE = {MAX_DEGREE})"
            )
        l0 = _host_most_unstable(b, d, top)
        if noise is None:
            return jnp.asarray(l0, jnp.int32)
        if l0 > MAX_MODE:
            raise ValueError(
                f"most_unstable_mode with noise: beta = {b:g} puts the most unstable degree without "
                f"noise at {l0}, past MAX_MODE = {MAX_MODE} (the grid of rates with diffusion)"
            )
        # the diffusion term grows with l: the argmax with noise is among the degrees 1..l0
        max_mode = l0
    max_mode = check_int("max_mode", max_mode, minimum=1)
    if max_mode > MAX_MODE:
        raise ValueError(
            f"max_mode must be <= {MAX_MODE} (MAX_MODE: a grid of rates), got {max_mode}; "
            "pass a concrete beta and max_mode=None for a search"
        )
    ells = jnp.arange(1, max_mode + 1)
    # the rescaled form where the model has one: the argmax is the same, with no overflow of e^beta
    rescaled = model_profile(model, False).rescalable
    rates = growth_rates(beta, d, ells, model=model, rescaled=rescaled, noise=noise)
    return (jnp.argmax(rates) + 1).astype(jnp.int32)


def _host_most_unstable(beta: float, d: int, top: int) -> int:
    """``argmax_{1 <= l <= top}`` of the float64 log-rate ``log l (l + d - 2) + log I_{l + d/2 - 1}(beta)``
    (the factors common to all degrees dropped; the same for usa and sa)."""

    def f(ls: ArrayLike | Sequence[int]) -> np.ndarray:
        ls = np.asarray(ls, np.float64)
        return np.log(ls) + np.log(ls + (d - 2)) + _log_ive_host(ls + (d / 2 - 1), beta)

    if top <= MAX_MODE:
        return int(np.argmax(f(np.arange(1, top + 1)))) + 1
    lo, hi = 1, top  # concave sequence: ternary search on integers
    while hi - lo > 2:
        m1 = lo + (hi - lo) // 3
        m2 = hi - (hi - lo) // 3
        v1, v2 = f([m1, m2])
        if v1 < v2:
            lo = m1 + 1
        else:
            hi = m2
    ls = np.arange(lo, hi + 1)
    return int(ls[int(np.argmax(f(ls)))])


# --------------------------------------------------------------------------- grids


class Grid(eqx.Module):
    r"""The solver's grid on $S^{d-1}$ at band-limit $L$ (``resolution``).

    $d = 2$: $N = 3 L$ angles $\theta_j = 2 \pi j / N$, ``shape = (N,)``, weights $2 \pi / N$.
    $d = 3$: the Gauss-Legendre x equiangular grid of ``s2fft`` (``sampling="gl"``): colatitudes
    $\theta_t = \arccos(x_t)$ (Gauss-Legendre nodes $x_t$, decreasing), longitudes
    $\varphi_p = 2 \pi p / (2 L - 1)$, ``shape = (L, 2 L - 1)``, weights $w_t\, 2 \pi / (2 L - 1)$.
    ``sum(weights * f)`` $= \int f\, d\sigma$ exactly for $f$ of degree $< 2 L$ ($d = 3$) or of
    modes $|k| < N$ ($d = 2$).

    Attributes:
        d, resolution: dimension and band-limit $L$ (static).
        points: unit vectors at the nodes, ``shape + (d,)``.
        weights: quadrature weights, ``shape``.
        theta: angles (d = 2) or colatitudes (d = 3) of the nodes along the first axis.
        phi: longitudes (d = 3; ``None`` for d = 2).

    Example:
        >>> import meanfield as mf
        >>> g = mf.continuum.grid(2, 8)
        >>> g.shape, round(float(g.weights.sum()), 4)
        ((24,), 6.2832)
    """

    d: int = eqx.field(static=True)
    resolution: int = eqx.field(static=True)
    points: Float[Array, "..."]
    weights: Float[Array, "..."]
    theta: Float[Array, " a"]
    phi: Float[Array, " b"] | None

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of a density on the grid: ``(3 L,)`` or ``(L, 2 L - 1)``."""
        return _grid_shape(self.d, self.resolution)


def _grid_shape(d: int, L: int) -> tuple[int, ...]:
    return (3 * L,) if d == 2 else (L, 2 * L - 1)


def _check_resolution(resolution: object) -> int:
    return check_int("resolution", resolution, minimum=4)


def _grid_bytes(d: int, L: int, itemsize: int) -> int:
    """Peak bytes of ``grid(d, L)``: the float64 host arrays and their temporaries (about 12 numbers a
    node, and the ``L x L`` Gauss-Legendre companion matrix on S^2) and the device copies in the dtype."""
    nodes = 3 * L if d == 2 else L * (2 * L - 1)
    return 12 * 8 * nodes + 5 * itemsize * nodes + (0 if d == 2 else 3 * 8 * L * L)


def _check_grid_memory(d: int, L: int, itemsize: int) -> None:
    from ._resources import ResourceLimitError, format_bytes, machine_memory

    need, avail = _grid_bytes(d, L, itemsize), machine_memory()
    if need > avail:
        raise ResourceLimitError(
            f"grid(d = {d}, resolution = {L}) needs ~{format_bytes(need)} of memory, more than the "
            f"{format_bytes(avail)} available; use a smaller resolution"
        )


#: Flop-equivalent cost of building ``s2fft``'s precomputed transform kernels at band-limit ``L``
#: (``SHT_KERNEL_FLOP * L^3.5``): measured 16.5 s at ``L = 96`` on the 2-core reference machine,
#: about ``L^3.5`` from ``L = 48`` to 96 (1e11 flop/s, the rate ``_resources.WORK_LIMIT`` assumes).
SHT_KERNEL_FLOP = 2e5


def _sht_kernel_work(d: int, L: int) -> float:
    """Flop-equivalent of building the S^2 transform kernels at ``L`` and ``ceil(3 L / 2)`` (0 on the circle)."""
    L2 = -(-3 * L // 2)
    return 0.0 if d == 2 else SHT_KERNEL_FLOP * (float(L) ** 3.5 + float(L2) ** 3.5)


def _sht_kernel_bytes(d: int, L: int, itemsize: int) -> int:
    """Bytes of the S^2 transform kernels (float64 on the host, a copy in the dtype on the device)."""
    L2 = -(-3 * L // 2)
    return 0 if d == 2 else (2 * 8 + 2 * itemsize) * (L**3 + L2**3)


def solve_cost(
    d: int,
    resolution: int,
    *,
    t1: RealScalarLike | None = None,
    dt: RealScalarLike | None = None,
    max_steps: int = 20_000,
    saves: int = 2,
    itemsize: int = 4,
    batch: int = 1,
) -> Cost:
    r"""Estimated cost of ``solve`` (a ``_resources.Cost``), before anything is built.

    * steps: ``max_steps`` (the adaptive bound), or ``min(max_steps, ceil(t1 / dt))`` with a fixed ``dt``;
    * work: ``7`` Tsit5 stages a step of a right-hand side of ``50 G log2 G`` flop (circle, FFTs on
      ``G = 3 L`` points) or ``24 L_2^3`` (S^2: six ``s2fft`` transforms at the product band-limit
      ``L_2 = ceil(3 L / 2)``, ``4 L_2^3`` each), times ``batch``; on S^2 plus building the transform
      kernels at ``L`` and ``L_2`` (``SHT_KERNEL_FLOP * (L^3.5 + L_2^3.5)``, once);
    * bytes: on S^2 the float64 kernels (``2 x 8 (L^3 + L_2^3)``) and their device copies in the
      dtype; the Tsit5 stages of the ``2 x`` coefficient state, the transform work arrays and the
      saved densities, times ``batch``.

    Example:
        >>> import meanfield as mf
        >>> c = mf.continuum.solve_cost(3, 512)
        >>> c.work > 1e15   # past _resources.WORK_LIMIT: solve refuses it
        True
    """
    L = int(resolution)
    G = 3 * L if d == 2 else L * (2 * L - 1)
    L2 = -(-3 * L // 2)
    G2 = 3 * L if d == 2 else L2 * (2 * L2 - 1)
    steps = int(max_steps)
    if dt is not None and t1 is not None and is_concrete(dt) and is_concrete(t1):
        ratio = float(t1) / float(dt)
        steps = min(steps, int(math.ceil(ratio)) if math.isfinite(ratio) else steps)
    rhs = 50.0 * G2 * math.log2(G2) if d == 2 else 24.0 * float(L2) ** 3 + 50.0 * G2
    work = float(batch) * steps * 7.0 * rhs
    point = itemsize * (2 * 16 * G + 2 * 8 * G2 + saves * (G + 8)) + 4096
    total = batch * point + 2**20
    work += _sht_kernel_work(d, L)
    total += _sht_kernel_bytes(d, L, itemsize)
    return Cost(steps=steps, saves=int(saves), bytes=int(total), work=work, batch=int(batch))


def grid(d: int, resolution: int, *, dtype: Any = None) -> Grid:
    """The solver's grid on ``S^{d-1}`` (d = 2 or 3) at band-limit ``resolution`` (see ``Grid``).

    Args:
        d: 2 or 3.
        resolution: band-limit ``L >= 4``: Fourier modes ``|k| < L`` (d = 2) or degrees ``l < L`` (d = 3).
        dtype: float dtype (default: JAX's default float).

    Returns:
        ``Grid``.

    Raises:
        ResourceLimitError: (a ``ValueError``) the grid's estimated memory exceeds what is available
            (``grid(2, 10**8)`` would need about 30 GiB).

    Example:
        >>> import meanfield as mf
        >>> mf.continuum.grid(3, 8).points.shape
        (8, 15, 3)
    """
    d = _check_solver_d(d)
    L = _check_resolution(resolution)
    dtype = jnp.result_type(float) if dtype is None else dtype
    _check_grid_memory(d, L, np.dtype(dtype).itemsize)
    if d == 2:
        N = 3 * L
        th = 2 * np.pi * np.arange(N) / N
        pts = np.stack([np.cos(th), np.sin(th)], -1)
        w = np.full(N, 2 * np.pi / N)
        return Grid(
            2, L, jnp.asarray(pts, dtype), jnp.asarray(w, dtype), jnp.asarray(th, dtype), None
        )
    th, ph, wt = _sphere_nodes(L)
    T, P = np.meshgrid(th, ph, indexing="ij")
    pts = np.stack([np.sin(T) * np.cos(P), np.sin(T) * np.sin(P), np.cos(T)], -1)
    w = np.broadcast_to(wt[:, None] * 2 * np.pi / (2 * L - 1), T.shape)
    return Grid(
        3,
        L,
        jnp.asarray(pts, dtype),
        jnp.asarray(w, dtype),
        jnp.asarray(th, dtype),
        jnp.asarray(ph, dtype),
    )


@functools.cache
def _sphere_nodes(L: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(L)
    x, w = x[::-1], w[::-1]  # s2fft's colatitudes increase: cos(theta) decreases
    th = np.arccos(x)
    ph = 2 * np.pi * np.arange(2 * L - 1) / (2 * L - 1)
    return th, ph, w


def uniform_density(d: int) -> float:
    r"""$\rho_0 = 1 / |S^{d-1}| = \Gamma(d/2) / (2 \pi^{d/2})$.

    Example:
        >>> import meanfield as mf
        >>> round(mf.continuum.uniform_density(3) * 4 * 3.14159265, 6)
        1.0
    """
    d = _check_d(d)
    return math.gamma(d / 2) / (2 * math.pi ** (d / 2))


# --------------------------------------------------------------------------- s2fft transforms


@functools.cache
def _s2fft() -> tuple[ModuleType, ModuleType]:
    """``s2fft``'s precomputed-kernel transform module, imported on first use (about 1 s); its
    import-time warning about float32 is silenced for the import only (we use float64 kernels)."""
    logger = logging.getLogger("s2fft")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from s2fft.precompute_transforms import construct, spherical
    finally:
        logger.setLevel(level)
    return construct, spherical


@functools.cache
def _sht_kernels(L: int) -> tuple[np.ndarray, np.ndarray]:
    construct, _ = _s2fft()
    kf = construct.spin_spherical_kernel(L, 0, reality=True, sampling="gl", forward=True)
    ki = construct.spin_spherical_kernel(L, 0, reality=True, sampling="gl", forward=False)
    return np.asarray(kf), np.asarray(ki)


def _cdtype(dtype: Any) -> Any:
    return jnp.complex128 if jnp.dtype(dtype) == jnp.float64 else jnp.complex64


def _sht(f: Float[Array, "a b"], L: int) -> Complex[Array, "a b"]:
    """Forward transform of a real grid function ``(L, 2L - 1)`` -> ``f_lm`` ``(L, 2L - 1)`` (m = -L+1..L-1)."""
    _, spherical = _s2fft()
    kf, _ = _sht_kernels(L)
    with third_party():  # s2fft's products state no precision: HIGHEST, as the engine's
        return spherical.forward_transform_jax(f, jnp.asarray(kf, f.dtype), L, "gl", True, 0, 0)


def _isht(flm: Complex[Array, "a b"], L: int, dtype: Any) -> Float[Array, "a b"]:
    _, spherical = _s2fft()
    _, ki = _sht_kernels(L)
    with third_party():
        out = spherical.inverse_transform_jax(flm, jnp.asarray(ki, dtype), L, "gl", True, 0, 0)
    return out.astype(dtype)


def _pad_lm(flm: Complex[Array, "a b"], L2: int) -> Complex[Array, "c e"]:
    L = flm.shape[0]
    out = jnp.zeros((L2, 2 * L2 - 1), flm.dtype)
    return out.at[:L, L2 - L : L2 + L - 1].set(flm)


def _trunc_lm(flm: Complex[Array, "a b"], L: int) -> Complex[Array, "c e"]:
    L2 = flm.shape[0]
    return flm[:L, L2 - L : L2 + L - 1]


# --------------------------------------------------------------------------- kernel multipliers


def _multipliers(
    beta: Float[Array, ""], d: int, L: int, model: str | Profile, rescaled: bool, dtype: Any
) -> Float[Array, " L"]:
    """Funk-Hecke eigenvalues ``mu_l`` (``l < L``) of the profile's kernel ``h`` (``model``: a
    ``Profile``, or a model's name with ``rescaled``), computed numerically (differentiable in
    ``beta``): an FFT on ``8 L`` angles (d = 2) or Gauss-Legendre quadrature on ``max(4 L, 128)``
    nodes (d = 3)."""
    profile = model if isinstance(model, Profile) else model_profile(model, rescaled)
    if d == 2:
        M = 8 * L
        phi = jnp.asarray(2 * np.pi * np.arange(M) / M, dtype)
        hv = profile.values(jnp.cos(phi), beta)
        return (2 * np.pi / M) * jnp.real(jnp.fft.rfft(hv))[:L]
    t, w, P = _legendre_table(L, max(4 * L, 128))
    hv = profile.values(jnp.asarray(t, dtype), beta)
    return matmul(2 * np.pi * jnp.asarray(P, dtype), jnp.asarray(w, dtype) * hv)


@functools.cache
def _legendre_table(L: int, M: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t, w = np.polynomial.legendre.leggauss(M)
    P = np.stack([scipy.special.eval_legendre(l, t) for l in range(L)])
    return t, w, P


# --------------------------------------------------------------------------- right-hand sides


class _Circle(eqx.Module):
    """Fourier discretisation on the circle. State: ``(2, L)`` real and imaginary parts of the
    density's coefficients ``c_k``, ``rho(theta) = sum_{|k| < L} c_k e^{i k theta}``, ``c_{-k} = conj(c_k)``."""

    L: int = eqx.field(static=True)
    normalized: bool = eqx.field(static=True)

    @property
    def N(self) -> int:
        return 3 * self.L

    def to_grid(self, c: Complex[Array, " L"]) -> Float[Array, " N"]:
        full = jnp.zeros(self.N // 2 + 1, c.dtype).at[: self.L].set(c * self.N)
        return jnp.fft.irfft(full, n=self.N)

    def from_grid(self, f: Float[Array, " N"]) -> Complex[Array, " L"]:
        return jnp.fft.rfft(f)[: self.L] / self.N

    def rhs(
        self, c: Complex[Array, " L"], beta: Float[Array, ""], mu: Float[Array, " L"]
    ) -> Complex[Array, " L"]:
        k = jnp.arange(self.L)
        rho = self.to_grid(c)
        if not self.normalized:
            v = self.to_grid(1j * k * mu * c)
        else:  # X = d/dtheta Z / (beta Z), Z = e^{beta(t-1)} * rho
            v = self.to_grid(1j * k * mu * c) / (beta * self.to_grid(mu * c))
        return -1j * k * self.from_grid(rho * v)  # the mode k = 0 (the mass) is zero exactly

    def laplacian(self, dtype: Any) -> Float[Array, " L"]:
        """The Laplacian's eigenvalues on the evolved modes: ``-k^2``."""
        k = jnp.arange(self.L, dtype=dtype)
        return -k * k

    def tail(self, c: Complex[Array, " L"]) -> Float[Array, ""]:
        band = jnp.arange(self.L) >= self.L - self.L // 3
        return jnp.sqrt(2 * jnp.sum(jnp.where(band, jnp.abs(c) ** 2, 0))) / jnp.abs(c[0])

    def amplitude(self, c: Complex[Array, " L"], ell: ArrayLike) -> Float[Array, ""]:
        """``2 |c_ell| / |c_0|``: ``|eps|`` for ``rho_0 (1 + eps cos(ell (theta - phase)))``."""
        return 2 * jnp.abs(c[ell]) / jnp.abs(c[0])


class _Sphere(eqx.Module):
    """Spherical harmonics on S^2 (``s2fft``, Gauss-Legendre sampling). State: ``(2, L, 2 L - 1)``
    real and imaginary parts of ``f_lm`` (``m = -L+1..L-1`` along the last axis)."""

    L: int = eqx.field(static=True)
    normalized: bool = eqx.field(static=True)

    @property
    def L2(self) -> int:
        return -(-3 * self.L // 2)

    def to_grid(self, flm: Complex[Array, "L M"]) -> Float[Array, "L M"]:
        return _isht(flm, self.L, jnp.real(flm).dtype)

    def from_grid(self, f: Float[Array, "L M"]) -> Complex[Array, "L M"]:
        return _sht(f, self.L)

    def rhs(
        self, flm: Complex[Array, "L M"], beta: Float[Array, ""], mu: Float[Array, " L"]
    ) -> Complex[Array, "L M"]:
        L, L2, dtype = self.L, self.L2, jnp.real(flm).dtype
        lap = -jnp.arange(L) * (jnp.arange(L) + 1.0)
        lap2 = -jnp.arange(L2) * (jnp.arange(L2) + 1.0)
        up = lambda a: _isht(_pad_lm(a, L2), L2, dtype)  # noqa: E731
        rho, Lrho = up(flm), up(lap[:, None] * flm)
        if not self.normalized:
            Ulm = mu[:, None] * flm
            U, LU = up(Ulm), up(lap[:, None] * Ulm)
        else:  # U = log Z / beta, Z = e^{beta(t-1)} * rho: formed on the fine grid
            U = jnp.log(up(mu[:, None] * flm)) / beta
            LU = _isht(lap2[:, None] * _sht(U, L2), L2, dtype)
        # div(rho grad U) = (Delta(rho U) + rho Delta U - U Delta rho) / 2
        p1 = _trunc_lm(_sht(rho * U, L2), L)
        p2 = _trunc_lm(_sht(rho * LU - U * Lrho, L2), L)
        out = -0.5 * (lap[:, None] * p1 + p2)
        return out.at[0].set(0.0)  # the mass: d/dt int rho = 0 exactly

    def laplacian(self, dtype: Any) -> Float[Array, "L 1"]:
        """The Laplacian's eigenvalues on the evolved degrees: ``-l (l + 1)``, broadcast over ``m``."""
        ell = jnp.arange(self.L, dtype=dtype)
        return (-ell * (ell + 1))[:, None]

    def tail(self, flm: Complex[Array, "L M"]) -> Float[Array, ""]:
        band = (jnp.arange(self.L) >= self.L - self.L // 3)[:, None]
        return jnp.sqrt(jnp.sum(jnp.where(band, jnp.abs(flm) ** 2, 0))) / jnp.abs(
            flm[0, self.L - 1]
        )

    def amplitude(self, flm: Complex[Array, "L M"], ell: ArrayLike) -> Float[Array, ""]:
        """``|f_{ell,0}| / |f_{0,0}|``: ``sqrt(2 ell + 1) |eps|`` for ``rho_0 (1 + eps P_ell(x_3))``."""
        return jnp.abs(flm[ell, self.L - 1]) / jnp.abs(flm[0, self.L - 1])


def _real(z: Complex[Array, " *s"]) -> Float[Array, " 2 *s"]:
    return jnp.stack([jnp.real(z), jnp.imag(z)])


def _complex(y: Float[Array, " 2 *s"]) -> Complex[Array, " *s"]:
    return jax.lax.complex(y[0], y[1])


def _discretisation(d: int, L: int, normalized: bool) -> _Circle | _Sphere:
    return _Circle(L, normalized) if d == 2 else _Sphere(L, normalized)


# --------------------------------------------------------------------------- solution


class Solution(eqx.Module):
    r"""Result of ``solve``.

    Attributes:
        ts: save times ``(T,)`` (rescaled time $s = e^\beta t$ when ``rescaled=True``).
        densities: $\rho$ on the grid at the save times, ``(T,) + grid.shape``; NaN after ``t_stop``
            and where the saved density's own tail exceeds ``tail_tol``.
        grid: the ``Grid``.
        mass: $\int \rho\, d\sigma$ at the save times (conserved to rounding).
        min_density: $\min \rho$ over the grid at the save times.
        tail: spectral tail $\|\text{top third of the evolved modes}\| / |\text{mode } 0|$ at the save times.
        status: ``OK`` (0, reached ``t1``), ``RESOLUTION_LOST`` (1: ``tail > tail_tol`` after a step),
            ``FAILED`` (2: non-finite state or ``max_steps`` exhausted); ``STATUS[status]`` names it.
        t_stop: time the run ended (``t1`` when ``status == OK``; the detection time otherwise).
        num_steps: accepted steps.
    """

    ts: Float[Array, "*batch T"]
    densities: Float[Array, "*batch T ..."]
    grid: Grid
    mass: Float[Array, "*batch T"]
    min_density: Float[Array, "*batch T"]
    tail: Float[Array, "*batch T"]
    status: Int[Array, "*batch"]
    t_stop: Float[Array, "*batch"]
    num_steps: Int[Array, "*batch"]

    status_names: ClassVar[tuple[str, ...]] = STATUS

    def status_name(self) -> str:
        """``"ok"``, ``"resolution_lost"`` or ``"failed"`` (an unbatched solution only).

        Example:
            >>> import meanfield as mf
            >>> g = mf.continuum.grid(2, 8)
            >>> rho0 = mf.continuum.mode_perturbation(g, 2, 0.1)
            >>> mf.continuum.solve(1.0, rho0, d=2, t1=0.1).status_name()
            'ok'
        """
        return STATUS[int(self.status)]


def solve(
    beta: RealScalarLike,
    rho0: ArrayLike,
    *,
    d: int,
    t1: RealScalarLike,
    ts: ArrayLike | Sequence[float] | None = None,
    model: str = "usa",
    resolution: int | None = None,
    rescaled: bool = False,
    rtol: RealScalarLike = 1e-6,
    atol: RealScalarLike = 1e-8,
    dt: RealScalarLike | None = None,
    tail_tol: RealScalarLike = 1e-4,
    max_steps: int = 20_000,
    force: bool = False,
    noise: Any = None,
) -> Solution:
    r"""Solve the continuity equation of the mean-field limit on $S^{d-1}$ ($d = 2$ or 3) from ``rho0``:

    $$\partial_t \rho + \operatorname{div}_S(\rho\, X[\rho]) = 0 \qquad \Big(= \frac{\sigma^2}{2} \Delta_S \rho \text{ with } \texttt{noise=mf.noise.Independent(sigma)}\Big),$$

    $$\text{usa: } X = \nabla_S \int h(\langle x, y\rangle)\, \rho(y)\, d\sigma(y), \quad h(t) = e^{\beta t} / \beta; \qquad \text{sa: } X = \frac{1}{\beta} \nabla_S \log \int e^{\beta \langle x, y\rangle} \rho(y)\, d\sigma(y).$$

    Fourier pseudo-spectral on the circle, ``s2fft`` spherical harmonics on $S^2$, ``diffrax.Tsit5``
    in time; mass conserved to rounding; stops with ``status = RESOLUTION_LOST`` when the
    spectral tail exceeds ``tail_tol`` (module docstring). A pure function of ``beta``, ``rho0``,
    ``t1`` and ``ts``: ``jit``, ``vmap`` (e.g. over ``beta`` and initial perturbations) and
    ``grad`` (diffrax's checkpointed adjoint) apply.

    With ``noise`` the heat flow $D \Delta_S \rho$, $D = \sigma^2 / 2$ ($D e^{-\beta}$ in the rescaled
    time), is applied spectrally: the coefficient of degree $l$ gains $-D\, l (l + d - 2)\, \hat\rho_l$
    ($-D k^2$ on the circle, $-D\, l (l + 1)$ on $S^2$). It makes the semi-discrete system stiffer: its
    top degree $L - 1$ has the eigenvalue about $-D (L - 1)^2$, which the adaptive Tsit5 step follows
    (Tsit5's stability interval on the negative real axis is about $[-3.5, 0]$, so the step is at
    most about $3.5 / (D (L - 1)^2)$); a fixed ``dt`` must satisfy that bound itself (otherwise the
    top modes blow up and the run stops with ``RESOLUTION_LOST`` or ``FAILED``). The mass stays
    conserved to rounding (degree 0 has the eigenvalue 0).

    Args:
        beta: inverse temperature ``> 0`` (traced or concrete).
        rho0: initial density w.r.t. $\sigma$ on ``grid(d, L)``, shape ``grid.shape``
            (``(3 L,)`` for d = 2, ``(L, 2 L - 1)`` for d = 3); mass 1 for a probability law.
            Its float dtype is the solver's (float32 default; float64 under ``jax.enable_x64``).
            Projected on the evolved modes first.
        d: 2 or 3 (static).
        t1: final time ``> 0`` (rescaled time $s$ when ``rescaled``).
        ts: save times in ``[0, t1]``, increasing (default ``[0, t1]``).
        model: ``"usa"``, ``"sa"``, or any registered model with a zonal profile (``zonal_models``,
            ``Model.zonal_profile``; rates by quadrature where the profile has no closed form).
        resolution: band-limit $L$ (static); ``None``: read from ``rho0``'s shape.
        rescaled: kernel $e^{\beta (t - 1)} / \beta$ (usa only): times are $s = e^\beta t$.
        rtol, atol: tolerances of the adaptive step (unused with ``dt``).
        dt: fixed step (``None``: adaptive).
        tail_tol: spectral-tail threshold of the resolution-loss stop. In float32 the tail has a
            rounding floor (about $10^{-7} L$, slowly growing with the number of steps), so long
            float32 runs at a large $L$ can stop early: use float64 for those.
        max_steps: cap on the number of steps (static).
        force: run even when the estimate (``solve_cost``) exceeds the work limit or the memory
            available now (memory beyond the machine's total is refused regardless).
        noise: None, or ``mf.noise.Independent(sigma)`` (``sigma`` in the original time $t$, concrete
            or traced: ``jit``, ``vmap`` and ``grad`` over it apply).

    Returns:
        ``Solution``. A traced ``beta`` or ``t1`` that is not ``> 0`` and finite (or, for ``"usa"``
        without ``rescaled``, a traced ``beta`` whose ``e^beta`` overflows the dtype), or a traced
        non-finite ``sigma``, gives ``status = FAILED`` and NaN densities, masses and tails (a sweep
        records the point as failed).

    Raises:
        TypeError: ``rho0`` not a real array (complex, string, ...); ``noise`` neither None nor a
            ``mf.noise.Noise``.
        ValueError: concrete arguments out of range; ``ResourceLimitError`` (a ``ValueError``) when
            ``solve_cost`` exceeds ``_resources.WORK_LIMIT`` or the available memory (``d = 3`` at
            ``L = 512``: about 3e16 flop, the transform kernels alone hours to build), naming the estimate;
            ``noise=mf.noise.Common(sigma)`` (its density solves a stochastic PDE).

    Example:
        >>> import meanfield as mf
        >>> g = mf.continuum.grid(2, 16)
        >>> sol = mf.continuum.solve(4.0, mf.continuum.mode_perturbation(g, 3, 1e-3), d=2, t1=0.2)
        >>> sol.status_name(), sol.densities.shape, abs(float(sol.mass[-1] - sol.mass[0])) < 1e-6
        ('ok', (2, 48), True)
    """
    d = _check_solver_d(d)
    profile = model_profile(model, rescaled)
    D = _noise_diffusion(noise)
    if isinstance(rho0, (str, bytes)) or rho0 is None:
        raise TypeError(f"rho0 must be an array, got {rho0!r}")
    own = getattr(rho0, "dtype", None)
    own = np.dtype(own) if own is not None else np.asarray(rho0).dtype
    if own.kind not in "iuf" and own != jnp.bfloat16:
        raise TypeError(f"rho0 must be a real density (a float array), got dtype {own}")
    dtype = _float_dtype(rho0)
    rho0 = jnp.asarray(rho0, dtype)
    if resolution is None:
        if d == 2:
            if rho0.ndim != 1 or rho0.shape[0] % 3:
                raise ValueError(f"rho0 for d = 2 must have shape (3 L,), got {rho0.shape}")
            resolution = rho0.shape[0] // 3
        else:
            if rho0.ndim != 2 or rho0.shape[1] != 2 * rho0.shape[0] - 1:
                raise ValueError(f"rho0 for d = 3 must have shape (L, 2 L - 1), got {rho0.shape}")
            resolution = rho0.shape[0]
    L = _check_resolution(resolution)
    if rho0.shape != _grid_shape(d, L):
        raise ValueError(
            f"rho0 must have shape {_grid_shape(d, L)} (d = {d}, resolution = {L}), got {rho0.shape}"
        )
    _check_beta(beta, profile=profile, dtype=dtype)
    if is_concrete(t1):
        check_positive("t1", t1)
    if is_concrete(rho0):
        r = np.asarray(rho0)
        if not np.all(np.isfinite(r)):
            raise ValueError("rho0 must be finite, got NaN or inf")
        if float(np.mean(r)) <= 0:
            raise ValueError(f"rho0 must have positive mass, got mean {float(np.mean(r)):g}")
    if ts is None:
        ts = jnp.stack([jnp.zeros((), dtype), jnp.asarray(t1, dtype)])
    elif is_concrete(ts):
        ts_np = np.asarray(ts, np.float64)
        if ts_np.ndim != 1 or ts_np.size < 1 or not np.all(np.isfinite(ts_np)):
            raise ValueError(f"ts must be a non-empty 1-d array of finite times, got {ts!r}")
        if (
            np.any(np.diff(ts_np) < 0)
            or ts_np[0] < 0
            or (is_concrete(t1) and ts_np[-1] > float(t1) * (1 + 1e-6))
        ):
            raise ValueError(f"ts must be increasing in [0, t1 = {t1}], got {ts_np}")
    if dt is not None and is_concrete(dt):
        check_positive("dt", dt)
    for name, v in (("rtol", rtol), ("atol", atol), ("tail_tol", tail_tol)):
        if not is_concrete(v):
            raise TypeError(
                f"{name} must be a concrete number (it selects the compiled program), got a traced value"
            )
        check_positive(name, v)
    max_steps = check_int("max_steps", max_steps, minimum=1)
    if not isinstance(force, (bool, np.bool_)):
        raise TypeError(f"force must be True or False, got {force!r}")
    from ._resources import check_cost

    saves = int(np.shape(ts)[0]) if np.ndim(ts) == 1 else 2
    est = solve_cost(
        d, L, t1=t1, dt=dt, max_steps=max_steps, saves=saves, itemsize=np.dtype(dtype).itemsize
    )
    check_cost(
        est,
        force=bool(force),
        what=f"continuum.solve (d = {d}, resolution = {L})",
        force_hint="force=True",
    )
    return _solve(
        jnp.asarray(beta, dtype),
        rho0,
        jnp.asarray(t1, dtype),
        jnp.asarray(ts, dtype),
        None if dt is None else jnp.asarray(dt, dtype),
        float(rtol),
        float(atol),
        float(tail_tol),
        None if D is None else jnp.asarray(D, dtype),
        d=d,
        L=L,
        profile=profile,
        max_steps=max_steps,
    )


@functools.partial(
    jax.jit,
    static_argnames=("d", "L", "profile", "max_steps", "rtol", "atol", "tail_tol"),
)
def _solve(
    beta: Float[Array, ""],
    rho0: Float[Array, "..."],
    t1: Float[Array, ""],
    ts: Float[Array, " T"],
    dt: Float[Array, ""] | None,
    rtol: float,
    atol: float,
    tail_tol: float,
    diffusion: Float[Array, ""] | None,
    *,
    d: int,
    L: int,
    profile: Profile,
    max_steps: int,
) -> Solution:
    disc = _discretisation(d, L, profile.normalized)
    dtype = rho0.dtype
    # traced beta / t1 out of range (concrete ones were refused by solve): a recorded failure, the run
    # itself made harmless (beta = 1, a run to t1 = 1e-3 saved at 0) so that diffrax sees valid input
    bad_input = ~(jnp.isfinite(beta) & (beta > 0) & jnp.isfinite(t1) & (t1 > 0))
    limit = profile.overflow_limit(dtype)
    if limit is not None:
        bad_input = bad_input | (beta >= limit)
    if diffusion is not None:  # a traced non-finite sigma
        bad_input = bad_input | ~jnp.isfinite(diffusion)
        diffusion = jnp.where(bad_input, jnp.zeros_like(diffusion), diffusion)
    beta = jnp.where(bad_input, jnp.ones_like(beta), beta)
    t1 = jnp.where(bad_input, jnp.asarray(1e-3, t1.dtype), t1)
    ts = jnp.where(bad_input, jnp.zeros_like(ts), ts)
    dt = None if dt is None else jnp.where(bad_input, jnp.asarray(1e-3, dt.dtype), dt)
    mu = _multipliers(beta, d, L, profile, profile.rescaled, dtype)
    y0 = _real(disc.from_grid(rho0))
    # the heat flow D Laplacian(rho), spectral: D per unit of the solver's time times -l (l + d - 2)
    heat = (
        None
        if diffusion is None
        else _time_diffusion(diffusion, beta, profile.rescaled) * disc.laplacian(dtype)
    )

    def vf(t: ArrayLike, y: Array, args: None) -> Array:
        c = _complex(y)
        dc = disc.rhs(c, beta, mu)
        return _real(dc if heat is None else dc + heat * c)  # degree 0: + 0 * c_0, the mass kept

    def cond(t: ArrayLike, y: Array, args: None, **kw: Any) -> Array:
        return ~(disc.tail(_complex(y)) <= tail_tol)  # true on a NaN tail as well

    if dt is None:
        controller: Any = diffrax.PIDController(rtol=rtol, atol=atol)
        dt0 = None
    else:
        controller, dt0 = diffrax.ConstantStepSize(), dt
    saveat = diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)])
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf),
        diffrax.Tsit5(),
        t0=jnp.zeros((), dtype),
        t1=t1,
        dt0=dt0,
        y0=y0,
        saveat=saveat,
        stepsize_controller=controller,
        event=diffrax.Event(cond),
        max_steps=max_steps,
        throw=False,
    )
    ys, y_end = sol.ys[0], sol.ys[1][0]
    t_stop = jnp.where(bad_input, jnp.nan, sol.ts[1][0]).astype(sol.ts[1].dtype)
    event = sol.result == diffrax.RESULTS.event_occurred
    ok = sol.result == diffrax.RESULTS.successful
    finite_end = jnp.all(jnp.isfinite(y_end)) & ~bad_input
    status = jnp.where(
        ok & finite_end, OK, jnp.where(event & finite_end, RESOLUTION_LOST, FAILED)
    ).astype(jnp.int32)
    valid = jnp.all(jnp.isfinite(ys), axis=tuple(range(1, ys.ndim))) & ~bad_input
    valid = valid & (ts <= t_stop)
    valid = valid & ((status == OK) | (ts < t_stop))
    coeffs = jax.vmap(_complex)(jnp.where(valid.reshape((-1,) + (1,) * (ys.ndim - 1)), ys, 0))
    dens = jax.vmap(disc.to_grid)(coeffs).astype(dtype)
    shape = (-1,) + (1,) * (dens.ndim - 1)
    g = grid(d, L, dtype=dtype)
    axes = tuple(range(1, dens.ndim))
    nan = jnp.asarray(jnp.nan, dtype)
    mass = jnp.where(valid, jnp.sum(dens * g.weights, axis=axes), nan)
    mins = jnp.where(valid, jnp.min(dens, axis=axes), nan)
    tails = jax.vmap(disc.tail)(coeffs)
    # a save time inside the last step (after the last check) may already exceed the threshold
    valid = valid & (tails <= tail_tol)
    mass, mins = jnp.where(valid, mass, nan), jnp.where(valid, mins, nan)
    tails = jnp.where(valid, tails, nan)
    dens = jnp.where(valid.reshape(shape), dens, nan)
    return Solution(
        ts, dens, g, mass, mins, tails, status, t_stop, jnp.asarray(sol.stats["num_accepted_steps"])
    )


# --------------------------------------------------------------------------- perturbations


def _mode_function(g: Grid, ell: Array, phase: Array) -> Float[Array, "..."]:
    if g.d == 2:
        return jnp.cos(ell * (g.theta - phase))
    # zonal Legendre polynomial P_ell(cos theta) about e_3 (|P_ell| <= 1), tabulated for ell < L
    th, _, _ = _sphere_nodes(g.resolution)
    table = np.stack([scipy.special.eval_legendre(l, np.cos(th)) for l in range(g.resolution)])
    dtype = g.weights.dtype
    return jnp.broadcast_to(jnp.asarray(table, dtype)[ell][:, None], g.shape)


def mode_perturbation(
    g: Grid, ell: ArrayLike, eps: RealScalarLike, *, phase: RealScalarLike = 0.0
) -> Float[Array, "..."]:
    r"""Density $\rho_0 (1 + \varepsilon Y_\ell)$ of a mode perturbation of the uniform law, on the grid ``g``.

    $Y_\ell = \cos(\ell (\theta - \text{phase}))$ on the circle; the zonal Legendre polynomial
    $P_\ell(x_3)$ on $S^2$ (``phase`` unused). $|Y_\ell| \le 1$, so the density is positive for
    $|\varepsilon| < 1$, and its mass is 1 for $\ell \ge 1$.

    Args:
        g: the grid (``grid(d, L)``).
        ell: degree ``0 <= ell < L`` (int; may be traced).
        eps: amplitude (may be traced).
        phase: angle of the circle mode.

    Returns:
        density, ``g.shape``.

    Example:
        >>> import meanfield as mf
        >>> g = mf.continuum.grid(2, 8)
        >>> round(float((g.weights * mf.continuum.mode_perturbation(g, 3, 0.5)).sum()), 6)
        1.0
    """
    if is_concrete(ell):
        e = check_int("ell", ell if not isinstance(ell, np.ndarray) else np.asarray(ell), minimum=0)
        if e >= g.resolution:
            raise ValueError(f"ell must be < resolution = {g.resolution}, got {e}")
    if is_concrete(eps) and not np.isfinite(float(eps)):
        raise ValueError(f"eps must be finite, got {eps!r}")
    dtype = g.weights.dtype
    rho0 = uniform_density(g.d)
    Y = _mode_function(g, jnp.asarray(ell), jnp.asarray(phase, dtype))
    return (rho0 * (1 + jnp.asarray(eps, dtype) * Y)).astype(dtype)


def mode_amplitude(density: ArrayLike, d: int, ell: ArrayLike) -> Float[Array, ""]:
    r"""Relative amplitude of the degree-``ell`` mode of a grid density: $|\hat\rho_\ell| / \hat\rho_0$
    times 2 on the circle (so ``mode_perturbation(g, ell, eps)`` gives $|\varepsilon|$), and the zonal
    coefficient ratio $|\rho_{\ell,0}| / \rho_{0,0}$ on $S^2$ ($\sqrt{2 \ell + 1}\, |\varepsilon|$ for
    ``mode_perturbation``; the ratio is what the growth rate multiplies). ``ell`` may be traced
    (a vmapped mode): $\log(a(t_1) / a(0)) / t_1$ is then a growth-rate map in one program.

    Example:
        >>> import meanfield as mf
        >>> g = mf.continuum.grid(2, 8)
        >>> round(float(mf.continuum.mode_amplitude(mf.continuum.mode_perturbation(g, 2, 0.1), 2, 2)), 6)
        0.1
    """
    d = _check_solver_d(d)
    y = jnp.asarray(density)
    L = y.shape[0] // 3 if d == 2 else y.shape[0]
    if is_concrete(ell):
        ell = check_int(
            "ell", ell if not isinstance(ell, np.ndarray) else np.asarray(ell), minimum=0
        )
        if ell >= L:
            raise ValueError(f"ell must be < the density's band-limit {L}, got {ell}")
    disc = _discretisation(d, L, False)
    return disc.amplitude(disc.from_grid(y), ell)


def _inverse_cdf(
    F: Callable[[Array], Array], u: Array, lo: float, hi: float, iters: int = 60
) -> Array:
    """Solve ``F(x) = u`` for increasing ``F`` on ``[lo, hi]`` by bisection (vectorised, jittable)."""

    def body(_: Array | int, bounds: tuple[Array, Array]) -> tuple[Array, Array]:
        a, b = bounds
        m = 0.5 * (a + b)
        left = F(m) < u
        return jnp.where(left, m, a), jnp.where(left, b, m)

    a, b = jax.lax.fori_loop(0, iters, body, (jnp.full_like(u, lo), jnp.full_like(u, hi)))
    return 0.5 * (a + b)


def sample_perturbation(
    key: Array | None,
    n: int,
    d: int,
    ell: int,
    eps: RealScalarLike,
    *,
    lattice: bool = False,
    dtype: Any = None,
) -> Float[Array, "n d"]:
    r"""``n`` points on $S^{d-1}$ ($d = 2, 3$) distributed as $\rho_0 (1 + \varepsilon Y_\ell)$ (``mode_perturbation``).

    Exact inverse-CDF sampling: on the circle $F(\theta) = (\theta + (\varepsilon/\ell) \sin(\ell \theta)) / (2 \pi)$;
    on $S^2$ the height $z = x_3$ has $F(z) = (z + 1)/2 + \varepsilon (P_{\ell+1}(z) - P_{\ell-1}(z)) / (2 (2 \ell + 1))$
    and the longitude is uniform. ``lattice=False``: i.i.d. uniforms from ``key``; ``lattice=True``:
    the quasi-uniform lattice $u_i = (i + 1/2)/n$ (and golden-angle longitudes on $S^2$, a Fibonacci
    lattice), whose empirical law approximates the density with error $O(1/n)$ instead of $n^{-1/2}$.

    Args:
        key: PRNG key (``None`` only with ``lattice=True``).
        n: number of points.
        d: 2 or 3.
        ell: degree ``>= 1`` (static int).
        eps: amplitude, ``|eps| < 1`` (may be traced).
        lattice: deterministic quasi-uniform points.
        dtype: float dtype (default: JAX's default float).

    Returns:
        ``(n, d)`` unit vectors.

    Example:
        >>> import meanfield as mf
        >>> x = mf.continuum.sample_perturbation(None, 1000, 2, 3, 0.2, lattice=True)
        >>> round(float((x[:, 0] ** 3 - 3 * x[:, 0] * x[:, 1] ** 2).mean()), 3)   # mean of cos(3 theta) = eps / 2
        0.1
    """
    n = check_int("n", n, minimum=1)
    d = _check_solver_d(d)
    ell = check_int("ell", ell, minimum=1)
    if not isinstance(lattice, (bool, np.bool_)):
        raise TypeError(f"lattice must be True or False, got {lattice!r}")
    if is_concrete(eps) and not abs(float(eps)) < 1:
        raise ValueError(f"eps must satisfy |eps| < 1 (a positive density), got {eps!r}")
    dtype = jnp.result_type(float) if dtype is None else dtype
    eps = jnp.asarray(eps, dtype)
    if lattice:
        u = (jnp.arange(n, dtype=dtype) + 0.5) / n
        v = jnp.mod(jnp.arange(n, dtype=dtype) * ((math.sqrt(5) - 1) / 2), 1.0)
    else:
        if key is None:
            raise ValueError("sample_perturbation: pass a PRNG key (or lattice=True)")
        ku, kv = jax.random.split(key)
        u = jax.random.uniform(ku, (n,), dtype)
        v = jax.random.uniform(kv, (n,), dtype)
    if d == 2:
        F = lambda th: (th + eps / ell * jnp.sin(ell * th)) / (2 * np.pi)  # noqa: E731
        th = _inverse_cdf(F, u, 0.0, 2 * np.pi)
        return jnp.stack([jnp.cos(th), jnp.sin(th)], -1)

    def F3(z: Array) -> Array:
        p_up, p_down = _legendre(ell + 1, z), _legendre(ell - 1, z)
        return (z + 1) / 2 + eps * (p_up - p_down) / (2 * (2 * ell + 1))

    z = _inverse_cdf(F3, u, -1.0, 1.0)
    phi = 2 * np.pi * v
    r = jnp.sqrt(jnp.clip(1 - z * z, 0.0, None))
    return jnp.stack([r * jnp.cos(phi), r * jnp.sin(phi), z], -1)


def _legendre(ell: int, z: Array) -> Array:
    """``P_ell(z)`` by the three-term recurrence (static ``ell``)."""
    p0, p1 = jnp.ones_like(z), z
    if ell == 0:
        return p0
    for k in range(1, ell):
        p0, p1 = p1, ((2 * k + 1) * z * p1 - k * p0) / (k + 1)
    return p1


# --------------------------------------------------------------------------- particles on the grid


def project_particles(x: Float[Array | np.ndarray, "n d"], g: Grid) -> Float[Array, "..."]:
    r"""The band-limited $L^2$ projection of the empirical law $\frac1n \sum_i \delta_{x_i}$ onto the
    grid's evolved modes, evaluated on the grid:

    $$\text{circle: } \rho(\theta) = \sum_{|k| < L} c_k e^{i k \theta}, \quad c_k = \frac{1}{2 \pi n} \sum_i e^{-i k \theta_i}; \qquad S^2\text{: } \rho = \sum_{l < L} \sum_m f_{lm} Y_{lm}, \quad f_{lm} = \frac1n \sum_i \overline{Y_{lm}(x_i)}$$

    ($Y_{lm}$ as in ``s2fft`` and ``jax.scipy.special.sph_harm_y``). Its mass is 1; it may be
    negative (Gibbs oscillations of the truncated Dirac masses). Compare it to a solution with a
    distance on the particles themselves (``w1_circle``, ``mmd_sphere``), or through the modes it
    shares with the density.

    Example:
        >>> import jax, meanfield as mf
        >>> g = mf.continuum.grid(2, 8)
        >>> x = mf.sphere.uniform(jax.random.key(0), 50, 2)
        >>> round(float((g.weights * mf.continuum.project_particles(x, g)).sum()), 5)
        1.0
    """
    x = jnp.asarray(x)
    if x.ndim != 2 or x.shape[1] != g.d:
        raise ValueError(f"x must have shape (n, {g.d}) for the grid's d = {g.d}, got {x.shape}")
    L, dtype = g.resolution, g.weights.dtype
    x = x.astype(dtype)
    if g.d == 2:
        th = jnp.arctan2(x[:, 1], x[:, 0])
        k = jnp.arange(L)
        c = jnp.mean(jnp.exp(-1j * k[:, None] * th[None, :]), axis=1) / (2 * np.pi)
        N = 3 * L
        full = jnp.zeros(N // 2 + 1, c.dtype).at[:L].set(c * N)
        return jnp.fft.irfft(full, n=N).astype(dtype)
    return _isht(_particle_coeffs(x, L), L, dtype)


def _particle_coeffs(x: Float[Array, "n 3"], L: int) -> Complex[Array, "a b"]:
    """``f_lm = (1/n) sum_i conj(Y_lm(x_i))``, ``(L, 2 L - 1)`` (zero for ``|m| > l``)."""
    dtype = x.dtype
    th = jnp.arccos(jnp.clip(x[:, 2], -1.0, 1.0))
    ph = jnp.mod(jnp.arctan2(x[:, 1], x[:, 0]), 2 * np.pi)
    ls, ms = np.meshgrid(np.arange(L), np.arange(-L + 1, L), indexing="ij")
    keep = np.abs(ms) <= ls
    lv, mv = ls[keep], ms[keep]
    with third_party():  # JAX's Legendre recurrences state no precision: HIGHEST
        Y = jax.scipy.special.sph_harm_y(
            jnp.asarray(lv)[:, None].repeat(x.shape[0], 1).ravel(),
            jnp.asarray(mv)[:, None].repeat(x.shape[0], 1).ravel(),
            jnp.tile(th, lv.size),
            jnp.tile(ph, lv.size),
            n_max=L,
        ).reshape(lv.size, x.shape[0])
    coeffs = jnp.mean(jnp.conj(Y), axis=1).astype(_cdtype(dtype))
    return jnp.zeros((L, 2 * L - 1), _cdtype(dtype)).at[lv, mv + L - 1].set(coeffs)


def w1_circle(
    x: Float[Array | np.ndarray, "n 2"], density: ArrayLike, *, points: int = 4096
) -> Float[Array, ""]:
    r"""Wasserstein-1 distance on the circle (arc length) between the empirical law of ``x`` and a
    grid density (``grid(2, L)``, normalised to mass 1), through their CDFs:

    $$W_1 = \min_c \int_0^{2 \pi} |F(\theta) - G(\theta) - c|\, d\theta \qquad (c\text{: the median of } F - G)$$

    $F$ is the empirical CDF, $G$ the exact integral of the density's trigonometric
    interpolant; the outer integral is the midpoint rule on ``points`` angles (error
    $O(1/\text{points})$, far below the $n^{-1/2}$ of a sample).

    Example:
        >>> import meanfield as mf
        >>> g = mf.continuum.grid(2, 8)
        >>> x = mf.continuum.sample_perturbation(None, 4000, 2, 1, 0.0, lattice=True)
        >>> float(mf.continuum.w1_circle(x, mf.continuum.mode_perturbation(g, 1, 0.0))) < 1e-3
        True
    """
    x = jnp.asarray(x)
    rho = jnp.asarray(density)
    if x.ndim != 2 or x.shape[1] != 2:
        raise ValueError(f"x must have shape (n, 2), got {x.shape}")
    if rho.ndim != 1:
        raise ValueError(f"density must be a grid density of shape (N,), got {rho.shape}")
    points = check_int("points", points, minimum=16)
    dtype = _float_dtype(rho)
    th = (jnp.arange(points, dtype=dtype) + 0.5) * (2 * np.pi / points)
    G = _circle_cdf(rho, th)
    ang = jnp.sort(jnp.mod(jnp.arctan2(x[:, 1], x[:, 0]), 2 * np.pi).astype(dtype))
    F = jnp.searchsorted(ang, th, side="right").astype(dtype) / x.shape[0]
    D = F - G
    return jnp.mean(jnp.abs(D - jnp.median(D))) * 2 * np.pi


def _circle_cdf(rho: Float[Array, " N"], th: Float[Array, " P"]) -> Float[Array, " P"]:
    """CDF ``G(theta) = int_0^theta rho / int rho`` of a grid density's trigonometric interpolant."""
    N = rho.shape[0]
    c = jnp.fft.rfft(rho) / N  # rho(theta) = sum_k c_k e^{i k theta} (k >= 0 and conjugates)
    mass = 2 * np.pi * jnp.real(c[0])
    k = jnp.arange(1, c.shape[0])
    # G(theta) = c_0 theta + 2 Re sum_{k>0} c_k (e^{i k theta} - 1) / (i k)
    osc = 2 * jnp.real(
        jnp.sum(
            c[1:, None] * (jnp.exp(1j * k[:, None] * th[None, :]) - 1) / (1j * k[:, None]), axis=0
        )
    )
    if N % 2 == 0:  # the Nyquist term is real and counted once
        osc = osc - jnp.real(c[-1] * (jnp.exp(1j * (N // 2) * th) - 1) / (1j * (N // 2)))
    return (jnp.real(c[0]) * th + osc) / mass


def mmd_sphere(
    x: Float[Array | np.ndarray, "n 3"], density: ArrayLike, g: Grid, *, beta: RealScalarLike = 1.0
) -> Float[Array, ""]:
    r"""Maximum mean discrepancy between the empirical law of ``x`` and a grid density on $S^2$ (mass
    normalised to 1), with the USA kernel $k(x, y) = e^{\beta (\langle x, y\rangle - 1)} / \beta$
    (``mf.kernels.USA(beta, rescaled=True)``), in its spectral form (Funk-Hecke):

    $$\text{MMD}^2 = \frac{1}{n^2} \sum_{i,j} k(x_i, x_j) - \frac2n \sum_i \int k(x_i, y) \rho(y) + \iint k(y, y') \rho(y) \rho(y') = \sum_l \mu_l \sum_m |a_{lm} - \rho_{lm}|^2, \qquad \mu_l = 4 \pi e^{-\beta} i_l(\beta) / \beta > 0,$$

    $a_{lm} = \frac1n \sum_i \overline{Y_{lm}(x_i)}$, $\rho_{lm}$ the density's coefficients; summed over the
    grid's degrees $l < L$ (the rest weighs $\mu_L / \mu_0$, below $10^{-12}$ for $\beta = 1$,
    $L \ge 12$). A sum of positive terms: no float32 cancellation between the three integrals.

    Example:
        >>> import jax, meanfield as mf
        >>> g = mf.continuum.grid(3, 8)
        >>> x = mf.continuum.sample_perturbation(None, 2000, 3, 1, 0.0, lattice=True)
        >>> float(mf.continuum.mmd_sphere(x, mf.continuum.mode_perturbation(g, 1, 0.0), g)) < 1e-2
        True
    """
    x = jnp.asarray(x)
    if x.ndim != 2 or x.shape[1] != 3 or g.d != 3:
        raise ValueError(
            f"x must have shape (n, 3) and g be a grid(3, L), got {x.shape} and d = {g.d}"
        )
    rho = jnp.asarray(density)
    if rho.shape != g.shape:
        raise ValueError(f"density must have the grid's shape {g.shape}, got {rho.shape}")
    check_positive("beta", beta)
    L, dtype = g.resolution, g.weights.dtype
    rho = rho.astype(dtype)
    rho = rho / jnp.sum(g.weights * rho)
    diff = _particle_coeffs(x.astype(dtype), L) - _sht(rho, L)
    mu = _multipliers(jnp.asarray(beta, dtype), 3, L, ExpProfile(rescaled=True), True, dtype)
    return jnp.sqrt(jnp.sum(mu[:, None] * jnp.abs(diff) ** 2))
