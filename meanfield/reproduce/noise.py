r"""Noise and natural frequencies (``meanfield reproduce noise``): the closed forms of docs/math/noise.md.

Every check compares particles (``mf.simulate`` with ``noise=`` or ``frequencies=``, float64) with a
closed form or an independent solver, its tolerance derived from the run itself: Monte Carlo
standard errors (over independent tokens or independent keys; jackknife over keys for fitted
quantities), the step's own bias where it is known (a quadrature of one step), a finite-$n$ term
extrapolated from a second size. Checks (``summary.json``, the common schema):

* ``brownian_decay_d2``, ``brownian_decay_d3``: free tokens (``SelfAttention`` with $V = 0$ on $S^2$;
  on the circle the Kuramoto model at $K = 10^{-9}$, ``FREE_COUPLING``, so that every noisy run on the
  circle is one compiled program) under ``Independent(sigma)`` are Brownian motions on $S^{d-1}$:
  $E\langle x(t), x(0)\rangle =
  e^{-(d - 1)\sigma^2 t/2}$ at several $t$, the Richardson value $2 m(h) - m(2h)$ of two steps of one
  path; tolerance 4 standard errors plus the extrapolation's residual $O(h^2)$ bias, computed from
  the step's law (``heun_step_mean``).
* ``heun_step_law``: the mean at the coarsest step against the exact law of the discrete chain.
  The projected Heun step is rotation-equivariant and its increment isotropic, so the states form
  an isotropic random walk on the sphere and $E\langle x_N, x_0\rangle = c_h^N$, $c_h$ the mean
  cosine of one step, a two-dimensional Gauss quadrature (``heun_step_mean``): no bias at all.
* ``weak_order``: the order of the bias of $E\langle x(t), x(0)\rangle$ in the step, fitted to the
  differences $m(h) - m(h/2)$ over dyadic steps of one path (paired: small variance), against the
  exact chain's slope at the same steps (the weak order is 1; at these steps the $O(h^2)$ term of
  $\log c_h$ still bends the slope, to 0.77 at $h = 1/8, 1/16, 1/32$).
* ``strong_order_independent``, ``strong_order_common``: the root-mean-square distance to a run at
  the finest step of the same path, fitted against $h - h_\mathrm{ref}$; theory $1/2$ (the noise
  fields do not commute on the sphere and the step has no Lévy areas).
* ``kuramoto_threshold``: the root in $K$ of ``mf.continuum.growth_rates(K, d, 1, model="kuramoto",
  noise=Independent(sigma))`` against ``mf.theory.kuramoto_threshold`` ($d \sigma^2/2$), $d = 2, 3, 5$.
* ``kuramoto_rate_below``, ``kuramoto_rate_above``: the growth rate of the mean token from a
  near-uniform lattice start below and above the threshold against the Fokker-Planck equation on
  the circle, solved independently here in Fourier modes (``fokker_planck_circle``; its linear rate is
  $K/2 - \sigma^2/2$), each run paired with the run from $-x_0$ (an antithetic pair);
  ``kuramoto_threshold_particles``: the zero crossing of the measured rates (less their nonlinear
  part, from the same solution) against $K_c = \sigma^2$.
* ``kuramoto_stationary_r``: the time-averaged order parameter at two couplings above the threshold
  (Richardson from two steps) against $r = A_2(2 K r/\sigma^2)$ (``mf.theory.kuramoto_order_parameter``).
* ``frequencies_lorentzian``, ``frequencies_gaussian``: Kuramoto without noise, the laws' midpoint
  quantiles as natural frequencies, against Ott-Antonsen's $r = \sqrt{1 - 2\gamma/K}$ and Kuramoto's
  self-consistency (``Distribution.order_parameter``) over several $K$, from $r = 1$ (RK4).
* ``common_noise_contraction``: free tokens under ``Common(sigma)``: the linear Stratonovich flow
  $dX = \sigma\, dB \circ X$ has Lyapunov exponents $\frac{\sigma^2}{2}(d + 1 - 2i)$, and
  $E \log|\sin\angle(x_i(t), x_j(t))| = \log|\sin\angle(x_i(0), x_j(0))| - \sigma^2 t$ exactly
  (docs/math/noise.md, Common noise); ``common_noise_sign_law``: the lines merge and a pair ends
  at $+1$ with probability $1 - \theta_0/\pi$: $E(1 - \theta(t)/\pi) = 1 - \theta_0/\pi$ at every
  $t$ (the angle is a martingale; antipodal pairs attract).

* ``fokker_planck_w1_rate``: noisy Kuramoto tokens started i.i.d. from a smooth density on the
  circle against the density equation from the same density (``mf.continuum.solve`` with
  ``noise=``): the exponent of the mean $W_1$ distance at $t_1$ (``mf.continuum.w1_circle``) in $n$,
  against $-1/2$ (propagation of chaos); the tolerance adds the shift of the fitted slope by the
  step's bias, bounded from Fourier modes (``w1_fourier_bound``).
* ``homogenized_rate``, ``homogenized_prefactor``: ``SelfAttention`` with $Q = K = I$ and Gaussian
  $V$ redrawn every $p$ (``regen_period``): the averaged drift is 0, and the root-mean-square
  distance to the start at time $t$ falls like $\sqrt p$, the mean squared distance over $p\, t$
  tending to $\kappa = \frac{d - 1}{d}$ times the tokens' mean $|m_i|^2$ (``homogenized_prefactor``:
  the drift's variance over the weights; the common-noise limit with matrix noise).

Figures: ``noise.png`` (the Brownian decay, the step's orders, the common-noise contraction, the
noisy Kuramoto rates, particles against the density equation in $W_1$, the homogenized limit),
``kuramoto.png`` (the order parameter against $K$ with frequencies and with
noise). In ``PAPERS``: part of ``meanfield reproduce`` without a name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from .. import continuum, frequencies, kernels, models, sphere, theory
from ..integrate import simulate
from ..noise import Common, Independent
from ._common import Experiment, Option, check, write_summary

__all__ = [
    "EXPERIMENT",
    "FREE_COUPLING",
    "chain_mean",
    "fokker_planck_circle",
    "heun_step_mean",
    "homogenized_prefactor",
    "jackknife",
    "run",
    "w1_fourier_bound",
]

_NAME = "noise"

#: The experiment's options and steps.
#: The default sizes of each part (the modes change a few entries of them).
_BROWNIAN = {"n": 256, "keys": 64, "t1": 1.0, "saves": [0.25, 0.5, 1.0], "levels": 4, "seed": 0}
_COMMON = {"n": 8, "keys": 384, "t1": 4.0, "saves": 33, "strong_time": 0.25, "levels": 4, "seed": 1}
_CIRCLE = {
    "n": 500,
    "keys": 16,
    "couplings": [0.25, 2.0],
    "stationary_couplings": [2.0, 3.0],
    "m0": 0.2,
    "t1": 2.0,
    "saves": 33,
    "dt": 0.0625,
    "stationary_scale": 4.0,
    "stationary_dt": 0.125,
    "burn_in": 4.0,
    "seed": 2,
}

_FP = {
    "n": [64, 256, 1024, 4096],
    "keys": 32,
    "coupling": 2.0,
    "mode": 1,
    "eps": 0.5,
    "t1": 1.0,
    "dt": 0.015625,
    "resolution": 32,
    "modes": 8,
    "seed": 3,
}
_HOMOGENIZED = {
    "n": 32,
    "d": 3,
    "beta": 1.0,
    "t1": 1.0,
    "periods": [0.125, 0.0625, 0.03125, 0.015625, 0.0078125],
    "seeds": 128,
    "seed": 4,
}

EXPERIMENT = Experiment(
    _NAME,
    {
        "sigma": Option(1.0, doc="noise amplitude sigma of every noisy run"),
        "brownian": Option(
            _BROWNIAN,
            quick={**_BROWNIAN, "n": 64, "keys": 32},
            full={**_BROWNIAN, "keys": 128},
            doc="free tokens on S^2 under independent noise: tokens per key, keys, end time, save times "
            "(also those of the circle's free tokens, up to its t1), steps t1/8 / 2^j for j < levels, seed",
        ),
        "common": Option(
            _COMMON,
            quick={**_COMMON, "keys": 128},
            full={**_COMMON, "keys": 1536},
            doc="free tokens under common noise (d = 3): tokens per key, keys, end time, saves, the save "
            "time of the strong order, steps t1/64 / 2^j for j < levels, seed",
        ),
        "circle": Option(
            _CIRCLE,
            quick={**_CIRCLE, "n": 256, "keys": 8},
            full={
                **_CIRCLE,
                "n": 1000,
                "keys": 32,
                "stationary_scale": 8.0,
                "stationary_dt": 0.0625,
            },
            doc="the circle program (Kuramoto under independent noise, one compilation: free tokens at "
            "K = 1e-9, the rates, the stationary order parameter): tokens, keys per row (two rows a call), "
            "couplings of the rates, below and above the threshold, and of the stationary runs (units of "
            "K_c), initial mean token m0 of the rate runs, "
            "end time, saves, step (and half of it), the stationary runs' time scale a (the runs of (a K, "
            "sqrt(a) sigma, dt/a) on [0, t1]: time a t1), their step and burn-in (original time), seed",
        ),
        "frequencies": Option(
            {
                "n": 2000,
                "spread": 0.5,
                "couplings": [1.25, 1.5, 2.0, 3.0, 4.0],
                "t1": 60.0,
                "window": 20.0,
                "dt": 0.05,
            },
            quick={
                "n": 1000,
                "spread": 0.5,
                "couplings": [1.25, 2.0, 4.0],
                "t1": 30.0,
                "window": 15.0,
                "dt": 0.1,
            },
            doc="Kuramoto with the midpoint quantiles of Lorentzian and Gaussian frequencies: tokens, the "
            "laws' spread (half-width, standard deviation), couplings (units of each law's K_c), RK4 end "
            "time, averaging window (the last time units), step",
        ),
        "fokker_planck": Option(
            _FP,
            quick={**_FP, "n": [64, 1024], "keys": 16, "dt": 0.03125},
            full={**_FP, "n": [64, 256, 1024, 4096, 16384], "keys": 64, "dt": 0.0078125},
            doc="noisy Kuramoto particles against mf.continuum.solve on the circle in W1: the sizes n (one "
            "compilation each), keys per size (i.i.d. starts and paths), coupling K, the start "
            "(1 + eps cos(mode theta)) / (2 pi), end time, Heun step (and half of it, at the largest n: the "
            "step's bias), the solver's band-limit, Fourier modes of the bias bound, seed",
        ),
        "homogenized": Option(
            _HOMOGENIZED,
            quick={**_HOMOGENIZED, "periods": [0.125, 0.0078125], "seeds": 64},
            full={**_HOMOGENIZED, "seeds": 512},
            doc="SelfAttention with Q = K = I and Gaussian V redrawn every period p (one Euler step of "
            "length p per draw): tokens, dimension, beta, end time, the periods (one compilation each), "
            "weight seeds per period, seed of the start",
        ),
        "se_multiple": Option(4.0, doc="standard errors in a Monte Carlo tolerance"),
    },
    steps=(
        "brownian",
        "common",
        "circle",
        "threshold",
        "frequencies",
        "fokker_planck",
        "homogenized",
        "figures",
    ),
    timings_suffix="_s",
    figures=("noise.png", "kuramoto.png"),
)


# --------------------------------------------------------------------------- closed forms


def heun_step_mean(h: float, sigma: float, d: int, nodes: int = 64) -> float:
    r"""$E\langle x_1, x_0\rangle$ of one projected Stratonovich Heun step of a free token under
    ``Independent(sigma)`` on $S^{d-1}$ (docs/math/noise.md, The step).

    With $x_0 = e_1$ and the increment $a = \sigma\, \Delta W$ (split as $a_1$ along $x_0$ and
    $a_\perp$), the predictor is $\tilde x = x_0 + P_{x_0} a = (1, a_\perp)$, the noise is evaluated
    at its direction $u$, and the step is $\hat x = x_0 + \frac12 (P_{x_0} a + P_u a)$,
    $x_1 = \hat x / |\hat x|$: with $q = (a_1 + |a_\perp|^2)/(1 + |a_\perp|^2)$,

    $$\langle x_1, x_0\rangle = \frac{1 + (a_1 - q)/2}{\sqrt{(1 + (a_1 - q)/2)^2 + |a_\perp|^2 (1 - q/2)^2}},$$

    a function of $a_1 \sim N(0, \sigma^2 h)$ and $|a_\perp|^2 \sim \sigma^2 h\, \chi^2_{d-1}$:
    Gauss-Hermite times generalised Gauss-Laguerre quadrature (``nodes`` each; converged to
    rounding at 40 for $\sigma^2 h \le 1/8$). The step is rotation-equivariant and the increments
    isotropic and independent, so the chain's $E\langle x_N, x_0\rangle = c_h^N$ exactly.

    >>> round(heun_step_mean(0.125, 1.0, 2), 6), round(math.exp(-0.125 / 2), 6)
    (0.94835, 0.939413)
    """
    import scipy.special

    s = float(sigma) * math.sqrt(float(h))
    z, wz = np.polynomial.hermite_e.hermegauss(nodes)
    y, wy = scipy.special.roots_genlaguerre(nodes, (d - 1) / 2 - 1)
    a1 = s * z[:, None]
    r2 = 2 * s * s * y[None, :]  # s^2 chi^2_{d-1} = 2 s^2 Gamma((d-1)/2, 1)
    q = (a1 + r2) / (1 + r2)
    u1 = 1 + (a1 - q) / 2
    c = u1 / np.sqrt(u1**2 + r2 * (1 - q / 2) ** 2)
    return float(np.einsum("i,j,ij", wz / wz.sum(), wy / wy.sum(), c))


def chain_mean(t: float, h: float, sigma: float, d: int) -> float:
    """``heun_step_mean(h)^(t/h)``: the exact mean of the discrete chain at time ``t`` (a multiple of ``h``)."""
    return heun_step_mean(h, sigma, d) ** round(t / h)


def fokker_planck_circle(
    coupling: float,
    sigma: float,
    c0: ArrayLike | Sequence[float] | Sequence[complex],
    ts: ArrayLike | Sequence[float],
) -> np.ndarray:
    r"""The mean token $m(t) = E e^{i\theta}$ of the noisy Kuramoto density on the circle, solved in
    Fourier modes $c_k = E e^{i k \theta}$ (independent of ``mf.continuum``):

    $$\dot c_k = \frac{K k}{2}\,(c_1 c_{k-1} - \bar c_1 c_{k+1}) - \frac{\sigma^2}{2} k^2 c_k, \qquad c_0 = 1,$$

    from $\partial_t \rho = -\partial_\theta(\rho\, K\, \mathrm{Im}(m e^{-i\theta})) + \frac{\sigma^2}{2}
    \partial_\theta^2 \rho$, truncated at ``len(c0)`` modes ($c_k$, $k = 1, \dots$; the noise damps
    mode $k$ at $\sigma^2 k^2/2$); ``scipy.integrate.solve_ivp`` (DOP853, rtol 1e-10). Linearised at
    the uniform law, $\dot c_1 = (K/2 - \sigma^2/2) c_1$: the threshold $K_c = \sigma^2$. Returns
    the complex $c_1$ at ``ts``.

    >>> m = fokker_planck_circle(1.0, 1.0, [0.01] + [0.0] * 15, [0.0, 1.0])
    >>> round(float(abs(m[1] / m[0])), 4)   # at the threshold the linear rate is 0
    1.0
    """
    import scipy.integrate

    c0 = np.asarray(c0, dtype=np.complex128)
    ts = np.asarray(ts, dtype=np.float64)
    L = c0.size
    k = np.arange(1, L + 1)
    K, D = float(coupling), float(sigma) ** 2 / 2

    def rhs(_t: float, c: np.ndarray) -> np.ndarray:
        padded = np.concatenate([[1.0], c, [0.0]])
        return (K * k / 2) * (c[0] * padded[:-2] - np.conj(c[0]) * padded[2:]) - D * k**2 * c

    sol = scipy.integrate.solve_ivp(
        rhs, (0.0, float(ts[-1])), c0, t_eval=ts, method="DOP853", rtol=1e-10, atol=1e-13
    )
    return np.asarray(sol.y[0])


def jackknife(statistic: Callable[..., float], *per_key: np.ndarray) -> tuple[float, float]:
    """``(value, standard error)`` of ``statistic`` of the means over keys (axis 0) of ``per_key``:
    the value on all keys and the delete-one-key jackknife error (keys are independent samples).

    >>> v, se = jackknife(lambda m: float(m), np.array([1.0, 2.0, 3.0, 4.0]))
    >>> v, round(se, 6), round(float(np.std([1, 2, 3, 4], ddof=1)) / 2, 6)
    (2.5, 0.645497, 0.645497)
    """
    K = per_key[0].shape[0]
    totals = [a.sum(axis=0) for a in per_key]
    value = float(statistic(*[t / K for t in totals]))
    loo = np.array(
        [statistic(*[(t - a[k]) / (K - 1) for t, a in zip(totals, per_key)]) for k in range(K)]
    )
    se = math.sqrt((K - 1) / K * float(np.sum((loo - loo.mean()) ** 2)))
    return value, se


def _slope(x: ArrayLike, y: ArrayLike) -> float:
    return float(np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)[0])


def _keys(seed: int, count: int) -> jax.Array:
    return jax.random.split(jax.random.key(seed), count)


# --------------------------------------------------------------------------- free tokens


def _free_runs(
    noise: Any,
    d: int,
    n: int,
    keys: int,
    t1: float,
    ts: np.ndarray,
    dts: Sequence[float],
    seed: int,
) -> tuple[np.ndarray, dict[float, np.ndarray]]:
    """Free tokens (no field) under ``noise``: ``x0`` and the states ``(keys, saves, n, d)`` at each
    step of ``dts`` (one program: the step is traced; the same keys, so one path per key)."""
    with jax.enable_x64(True):
        x0 = sphere.uniform(jax.random.key(1000 + seed), n, d, jnp.float64)
        model = models.SelfAttention(1.0, V=jnp.zeros((d, d), jnp.float64))
        max_steps = int(round(t1 / min(dts))) + len(ts) + 1

        def one(key: jax.Array, dt: jax.Array) -> Any:
            return simulate(
                model, x0, t1=t1, dt=dt, ts=ts, noise=noise, key=key, max_steps=max_steps
            ).xs

        f = jax.jit(jax.vmap(one, (0, None)))
        ks = _keys(seed, keys)
        xs = {float(h): np.asarray(f(ks, jnp.float64(h))) for h in dts}
    return np.asarray(x0), xs


def _decay(
    cos: Mapping[float, np.ndarray], saves: Sequence[float], d: int, sigma: float
) -> dict[str, Any]:
    """``E<x(t), x(0)>`` from the cosines ``cos[h]`` (keys, saves, tokens; every token an independent
    sample) at the finest two steps: the Richardson value, its standard error, the closed form and
    the extrapolation's residual bias from the exact chain (``chain_mean``)."""
    use = sorted(cos, reverse=True)
    h2, h1 = use[-2], use[-1]
    rich = 2 * cos[h1] - cos[h2]
    N = rich.shape[0] * rich.shape[2]
    exact = np.exp(-(d - 1) * sigma**2 * np.asarray(saves) / 2)
    resid = np.array([2 * chain_mean(t, h1, sigma, d) - chain_mean(t, h2, sigma, d) for t in saves])
    return {
        "saves": list(saves),
        "dt": h1,
        "mean": rich.mean(axis=(0, 2)),
        "se": rich.std(axis=(0, 2), ddof=1) / math.sqrt(N),
        "exact": exact,
        "residual": resid - exact,
        "samples": N,
        "keys": rich.shape[0],
        "mean_by_dt": {h: c.mean(axis=(0, 2)) for h, c in cos.items()},
        "se_by_dt": {h: c.std(axis=(0, 2), ddof=1) / math.sqrt(N) for h, c in cos.items()},
        "chain_by_dt": {h: np.array([chain_mean(t, h, sigma, d) for t in saves]) for h in use},
    }


def _brownian(S: Mapping[str, Any], sigma: float) -> dict[str, Any]:
    """Free tokens on S^2 under independent noise at the dyadic steps ``t1 / 8 / 2^j``: the decay
    of ``E<x(t), x(0)>``, the weak order and the strong order (one path per key)."""
    B = S["brownian"]
    t1, saves = float(B["t1"]), [float(t) for t in B["saves"]]
    ts = np.array([0.0, *saves])
    dts = [t1 / 8 / 2**j for j in range(int(B["levels"]))]
    d = 3
    x0, xs = _free_runs(Independent(sigma), d, B["n"], B["keys"], t1, ts, dts, B["seed"])
    cos = {h: np.einsum("ktnd,nd->ktn", x, x0)[:, 1:] for h, x in xs.items()}  # keys, saves, n
    row = _decay(cos, saves, d, sigma)
    # weak order: paired differences m(h_j) - m(h_{j+1}) at t1, jackknife over keys
    per_key = [cos[h][:, -1].mean(axis=1) for h in dts]  # (keys,) each

    def weak(*m: ArrayLike) -> float:
        D = np.abs(np.diff(np.asarray(m, float)))
        return _slope(np.log(dts[:-1]), np.log(D))

    p, p_se = jackknife(weak, *per_key)
    chain = [chain_mean(t1, h, sigma, d) for h in dts]
    finer = [[chain_mean(t1, h / 2**q, sigma, d) for h in dts] for q in (3, 6)]
    row["dts"] = dts
    row["weak"] = {
        "order": p,
        "se": p_se,
        "chain_order": _slope(np.log(dts[:-1]), np.log(np.abs(np.diff(chain)))),
        "chain_order_finer": [_slope(np.log(dts[:-1]), np.log(np.abs(np.diff(c)))) for c in finer],
        "differences": np.abs(np.diff([m.mean() for m in per_key])).tolist(),
        "chain_differences": np.abs(np.diff(chain)).tolist(),
    }
    row["strong"] = _strong(xs, dts, -1)
    return row


def _strong(xs: Mapping[float, np.ndarray], dts: Sequence[float], save: int) -> dict[str, Any]:
    """Strong order: RMS distance at save ``save`` of the runs at ``dts[:-1]`` to the run at
    ``dts[-1]`` (one path per key), fitted against ``h - h_ref``; jackknife over keys."""
    ref, href = xs[dts[-1]][:, save], dts[-1]
    H = np.asarray(dts[:-1])
    per_key = [np.sum((xs[h][:, save] - ref) ** 2, axis=-1).mean(axis=-1) for h in H]

    def order(*mse: ArrayLike) -> float:
        return _slope(np.log(H - href), 0.5 * np.log(np.asarray(mse, float)))

    p, se = jackknife(order, *per_key)
    rms = [float(np.sqrt(m.mean())) for m in per_key]
    return {
        "order": p,
        "se": se,
        "dts": H.tolist(),
        "ref": href,
        "rms": rms,
        "order_vs_h": _slope(np.log(H), np.log(rms)),
    }


def _log_sin(xs: np.ndarray) -> np.ndarray:
    """``log |sin angle(x_i, x_j)|`` over the pairs i < j (last axis), stably: ``|x - y| |x + y| / 2``."""
    n = xs.shape[-2]
    i, j = np.triu_indices(n, 1)
    a, b = xs[..., i, :], xs[..., j, :]
    return np.log(np.linalg.norm(a - b, axis=-1) * np.linalg.norm(a + b, axis=-1) / 2)


def _common(S: Mapping[str, Any], sigma: float) -> dict[str, Any]:
    C = S["common"]
    t1 = float(C["t1"])
    ts = np.linspace(0.0, t1, int(C["saves"]))
    dts = [t1 / 64 / 2**j for j in range(int(C["levels"]))]
    x0, xs = _free_runs(Common(sigma), 3, C["n"], C["keys"], t1, ts, dts, C["seed"])
    h2, h1 = dts[-2], dts[-1]
    ell = {h: _log_sin(xs[h]) for h in (h2, h1)}  # keys, saves, pairs
    drift = {h: (e - e[:, :1]).mean(axis=-1) for h, e in ell.items()}  # keys, saves
    rich = 2 * drift[h1] - drift[h2]
    K = rich.shape[0]
    rate = -rich[:, -1] / t1  # per key: the end point estimator of the contraction rate
    strong_save = int(np.argmin(np.abs(ts - float(C["strong_time"]))))
    # the sign law: a pair ends at +1 with probability 1 - theta_0 / pi; by the Markov property and
    # the isotropy of the future flow, P(end at +1 | state at t) = 1 - theta_t / pi, so the angle is
    # a martingale: E (1 - theta_t / pi) = 1 - theta_0 / pi at every t (Richardson, per key)
    i, j = np.triu_indices(C["n"], 1)
    c0 = np.clip(np.sum(x0[i] * x0[j], axis=-1), -1, 1)
    pred = float(np.mean(1 - np.arccos(c0) / np.pi))

    def plus_law(x: np.ndarray) -> np.ndarray:
        c = np.clip(np.sum(x[:, -1, i] * x[:, -1, j], axis=-1), -1, 1)  # keys, pairs
        return (1 - np.arccos(c) / np.pi).mean(axis=1)

    law = 2 * plus_law(xs[h1]) - plus_law(xs[h2])
    cT = np.sum(xs[h1][:, -1, i] * xs[h1][:, -1, j], axis=-1)
    return {
        "ts": ts,
        "dts": dts,
        "mean": rich.mean(axis=0),
        "se": rich.std(axis=0, ddof=1) / math.sqrt(K),
        "rate": float(rate.mean()),
        "rate_se": float(rate.std(ddof=1) / math.sqrt(K)),
        "rate_by_dt": {h: float(-d[:, -1].mean() / t1) for h, d in drift.items()},
        "strong": _strong(xs, dts, strong_save),
        "strong_time": float(ts[strong_save]),
        "sign_law": float(law.mean()),
        "sign_law_se": float(law.std(ddof=1) / math.sqrt(K)),
        "sign_theory": pred,
        "sign_plus": float((cT > 0).mean()),
        "merged": float((np.exp(ell[h1][:, -1]) < 0.1).mean()),
        "start_negative": float(np.mean(c0 < 0)),
        "end_aligned": float(np.mean(1 - np.abs(cT) < 1e-2)),
        "pairs": int(i.size),
    }


# --------------------------------------------------------------------------- Kuramoto


#: The coupling of the "free" runs of the circle program: the Kuramoto field is at most K, so a
#: token moves by less than K t1 = 2e-9 through it, far below every tolerance here.
FREE_COUPLING = 1e-9


def _circle(S: Mapping[str, Any], sigma: float) -> dict[str, Any]:
    """The circle program (Kuramoto under independent noise, d = 2; one compilation): free tokens
    (``FREE_COUPLING``), the growth rates from a near-uniform start below and above K_c (antithetic
    pairs, Richardson), and the stationary order parameter above K_c."""
    Q = S["circle"]
    n, keys, T = int(Q["n"]), int(Q["keys"]), float(Q["t1"])
    Kc = theory.kuramoto_threshold(sigma, 2)
    K_lo, K_hi = (float(c) * Kc for c in Q["couplings"])
    ts = np.linspace(0.0, T, int(Q["saves"]))
    a = float(Q["stationary_scale"])
    dt, dts = float(Q["dt"]), float(Q["stationary_dt"])
    max_steps = int(round(2 * T * max(1 / dt, a / dts))) + ts.size + 1
    with jax.enable_x64(True):
        x_pert = continuum.sample_perturbation(
            None, n, 2, 1, 2 * float(Q["m0"]), lattice=True, dtype=jnp.float64
        )
        x_sync = jnp.tile(jnp.array([[1.0, 0.0]], jnp.float64), (n, 1))

        def one(key: jax.Array, K: jax.Array, s: jax.Array, x0: jax.Array, h: jax.Array) -> Any:
            traj = simulate(
                kernels.Kuramoto(K),
                x0,
                t1=T,
                dt=h,
                ts=ts,
                noise=Independent(s),
                key=key,
                max_steps=max_steps,
                save_states=False,
                observables={
                    "m": lambda x: jnp.mean(x, axis=0),
                    "cos": lambda x: jnp.sum(x * x0, axis=-1),
                },
            )
            return traj.observables["m"], traj.observables["cos"]

        f = jax.jit(jax.vmap(one, (0, 0, 0, 0, None)))
        ks = _keys(Q["seed"], 5 * keys)

        def batch(K: float, s: float, x0s: Sequence[Any], h: float, kk: Any) -> Any:
            """Two rows of ``keys`` runs (one program): the starts ``x0s`` and keys ``kk`` by row."""
            xv = jnp.concatenate([jnp.broadcast_to(x, (keys, n, 2)) for x in x0s])
            Kv = jnp.full(2 * keys, K, jnp.float64)
            sv = jnp.full(2 * keys, s, jnp.float64)
            m, c = f(kk, Kv, sv, xv, jnp.float64(h))
            return np.asarray(m).reshape(2, keys, ts.size, 2), np.asarray(c)

        # free tokens: Brownian motion on the circle (every token an independent sample)
        cos = {
            h: batch(FREE_COUPLING, sigma, [x_sync] * 2, h, ks[3 * keys :])[1] for h in (dt, dt / 2)
        }
        # rates: each coupling from the perturbed lattice and from its mirror image -x0 with the
        # same keys: the run from -x0 with the path W is minus the run from x0 with -W (the drift is
        # odd, the noise even in x), so the two form an antithetic pair; the same keys for both
        # couplings (common random numbers)
        kk = jnp.concatenate([ks[:keys]] * 2)
        m_rate = {
            h: np.stack([batch(K, sigma, [x_pert, -x_pert], h, kk)[0] for K in (K_lo, K_hi)])
            for h in (dt, dt / 2)
        }  # (couplings, 2, keys, saves, 2)
        # stationary: K_hi from r = 1, time scaled by a ((a K, sqrt(a) sigma, h / a) on [0, T] is
        # (K, sigma, h) on [0, a T]), other keys
        sa = math.sqrt(a) * sigma
        K_st = [float(c) * Kc for c in Q["stationary_couplings"]]
        kk = ks[keys : 3 * keys]
        m_stat = {
            h: np.stack([batch(a * K, sa, [x_sync] * 2, h / a, kk)[0] for K in K_st])
            for h in (dts, dts / 2)
        }  # (couplings, 2, keys, saves, 2)
    saves = [float(t) for t in S["brownian"]["saves"] if t <= T]
    if T not in saves:
        saves.append(T)
    idx = [int(np.argmin(np.abs(ts - t))) for t in saves]
    brown = _decay({h: c[:, idx, :] for h, c in cos.items()}, saves, 2, sigma)
    rich = 2 * m_rate[dt / 2][..., 0] - m_rate[dt][..., 0]  # (couplings, 2, keys, saves): m_x
    anti = 0.5 * (rich[:, 0] - rich[:, 1])  # (couplings, keys, saves): antithetic means of m_x
    m0 = float(np.asarray(x_pert).mean(axis=0)[0])
    th = np.arctan2(np.asarray(x_pert)[:, 1], np.asarray(x_pert)[:, 0])
    c0 = np.array([np.mean(np.exp(1j * k * th)) for k in range(1, 33)])

    def rate_of(m: ArrayLike) -> float:
        """The end point estimator log(m(T) / m(0)) / T."""
        m = np.asarray(m)
        return float(np.log(max(m[-1], 1e-300) / m[0]) / T)

    rates, fp = [], []
    for row, K in enumerate((K_lo, K_hi)):
        value, se = jackknife(rate_of, anti[row])
        fpm = fokker_planck_circle(K, sigma, c0, ts).real
        rates.append(
            {
                "K": K,
                "rate": value,
                "se": se,
                "linear": K / 2 - sigma**2 / 2,
                "fp_rate": rate_of(fpm),
            }
        )
        fp.append(fpm)
    # the linear rates cross zero at K_c exactly: the particles' rates less the nonlinear part of
    # the rate at this amplitude (the Fokker-Planck rate minus the linear one), interpolated
    shift = [r["fp_rate"] - r["linear"] for r in rates]

    def crossing(lo: ArrayLike, hi: ArrayLike) -> float:
        r_lo, r_hi = rate_of(lo) - shift[0], rate_of(hi) - shift[1]
        return K_lo + (K_hi - K_lo) * (-r_lo) / (r_hi - r_lo)

    Kx, Kx_se = jackknife(crossing, anti[0], anti[1])
    raw = K_lo + (K_hi - K_lo) * (-rates[0]["rate"]) / (rates[1]["rate"] - rates[0]["rate"])
    # stationary order parameter: |m| averaged over [burn_in, a T] (original time), Richardson
    late = a * ts >= float(Q["burn_in"])
    r = {
        h: np.linalg.norm(m, axis=-1)[..., late].mean(axis=-1).reshape(len(K_st), -1)
        for h, m in m_stat.items()
    }
    r_rich = 2 * r[dts / 2] - r[dts]  # (couplings, runs): independent keys
    import scipy.special

    stationary = []
    for K, rr, r1, r2 in zip(K_st, r_rich, r[dts], r[dts / 2]):
        r_th = theory.kuramoto_order_parameter(K, sigma, 2)
        kappa = 2 * K * r_th / sigma**2
        sin2 = (1 - scipy.special.ive(2, kappa) / scipy.special.ive(0, kappa)) / 2
        stationary.append(
            {
                "K": K,
                "r": float(rr.mean()),
                "se": float(rr.std(ddof=1) / math.sqrt(rr.size)),
                "runs": int(rr.size),
                "r_by_dt": [float(r1.mean()), float(r2.mean())],
                "theory": r_th,
                "finite_n": float(sin2 / (r_th * n)),
            }
        )
    return {
        "brownian": brown,
        "K_c": Kc,
        "ts": ts,
        "m0": m0,
        "mean": anti.mean(axis=1),
        "se": anti.std(axis=1, ddof=1) / math.sqrt(keys),
        "fp": np.asarray(fp),
        "rates": rates,
        "crossing": Kx,
        "crossing_se": Kx_se,
        "crossing_raw": raw,
        "stationary": stationary,
        "stationary_window": [float(Q["burn_in"]), a * T],
    }


def _frequency_runs(S: Mapping[str, Any]) -> dict[str, Any]:
    F = S["frequencies"]
    n, t1, dt = int(F["n"]), float(F["t1"]), float(F["dt"])
    ts = np.linspace(0.0, t1, int(round(t1 / 0.25)) + 1)
    late = ts >= t1 - float(F["window"])
    laws = {
        "lorentzian": frequencies.Lorentzian(F["spread"]),
        "gaussian": frequencies.Gaussian(F["spread"]),
    }
    with jax.enable_x64(True):
        x0 = jnp.tile(jnp.array([[1.0, 0.0]], jnp.float64), (n, 1))  # from r = 1

        def one(K: jax.Array, w: jax.Array) -> jax.Array:
            traj = simulate(
                kernels.Kuramoto(K),
                x0,
                t1=t1,
                dt=dt,
                solver="rk4",
                ts=ts,
                frequencies=w,
                save_states=False,
                observables={"r": lambda x: jnp.linalg.norm(jnp.mean(x, axis=0))},
            )
            return traj.observables["r"]

        f = jax.jit(jax.vmap(one))
        Ks, ws, tags = [], [], []
        for name, law in laws.items():
            Kc = float(law.critical_coupling())
            w = law.sample(n, dtype=jnp.float64)
            # n/2 tokens as n: each token twice, the same frequency and start (the same mean field)
            w_half = jnp.repeat(law.sample(n // 2, dtype=jnp.float64), 2)
            for c in F["couplings"]:
                for size, ww in (("n", w), ("n/2", w_half)):
                    Ks.append(float(c) * Kc)
                    ws.append(ww)
                    tags.append((name, float(c), size))
        r = np.asarray(f(jnp.asarray(Ks, jnp.float64), jnp.stack(ws)))
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in laws}
    for idx in range(0, len(tags), 2):
        name, c, _ = tags[idx]
        law = laws[name]
        K = Ks[idx]
        blocks = r[idx, late][: (late.sum() // 8) * 8].reshape(8, -1).mean(axis=1)
        rows[name].append(
            {
                "K": K,
                "K_over_Kc": c,
                "r": float(r[idx, late].mean()),
                "r_half": float(r[idx + 1, late].mean()),
                "se_time": float(blocks.std(ddof=1) / math.sqrt(8)),
                "theory": float(law.order_parameter(K)),
                "K_c": float(law.critical_coupling()),
            }
        )
    return {"rows": rows, "ts": ts, "n": n}


# --------------------------------------------------------------------------- propagation of chaos


def w1_fourier_bound(dc: ArrayLike) -> float:
    r"""An upper bound of $W_1$ on the circle between two laws from the differences $\Delta c_k$ of
    their Fourier coefficients $c_k = E e^{i k \theta}$, $k = 1, 2, \dots$ (docs/math/noise.md,
    Particles against the density equation): $F - G$ has the coefficients $\Delta c_k / (-i k)$, so by Cauchy-Schwarz and
    Parseval $W_1 \le \int |F - G - \overline{F - G}| \le \sqrt{2\pi}\, \|F - G - \overline{F - G}\|_2
    = \sqrt{2 \sum_{k \ge 1} |\Delta c_k|^2 / k^2}$.

    >>> round(w1_fourier_bound(np.array([0.01])), 6), round(math.sqrt(2) * 0.01, 6)
    (0.014142, 0.014142)
    """
    dc = np.asarray(dc, dtype=np.complex128)
    k = np.arange(1, dc.size + 1)
    return float(np.sqrt(2 * np.sum(np.abs(dc) ** 2 / k**2)))


def _fp_particles(S: Mapping[str, Any], sigma: float) -> dict[str, Any]:
    """Noisy Kuramoto particles from i.i.d. starts against ``mf.continuum.solve`` on the circle: the
    mean W1 distance at ``t1`` for each n (one program each), the step's bias of the one-particle law
    at the largest n (the run at half the step with the same keys), and the solver's first mode
    against ``fokker_planck_circle``."""
    P = S["fokker_planck"]
    ns = [int(v) for v in P["n"]]
    keys, T, dt = int(P["keys"]), float(P["t1"]), float(P["dt"])
    K, ell, eps, M = float(P["coupling"]), int(P["mode"]), float(P["eps"]), int(P["modes"])
    ts = np.array([0.0, T])
    with jax.enable_x64(True):
        g = continuum.grid(2, int(P["resolution"]), dtype=jnp.float64)
        rho0 = continuum.mode_perturbation(g, ell, eps)
        sol = continuum.solve(
            K, rho0, d=2, t1=T, model="kuramoto", noise=Independent(jnp.float64(sigma))
        )
        if sol.status_name() != "ok":  # pragma: no cover - a failed solve is no reference
            raise RuntimeError(f"continuum.solve: {sol.status_name()}")
        rho1 = sol.densities[-1]
        th = np.asarray(g.theta)
        wts = np.asarray(g.weights)
        kk = np.arange(1, M + 1)
        c_solve = np.array([np.sum(wts * np.asarray(rho1) * np.exp(1j * k * th)) for k in kk])
        c0 = np.zeros(32, np.complex128)
        c0[ell - 1] = eps / 2
        c_fp = fokker_planck_circle(K, sigma, c0, ts) if ell == 1 else None
        kj = jnp.asarray(kk, jnp.float64)
        W: dict[int, np.ndarray] = {}
        coeffs: dict[float, np.ndarray] = {}
        for n in ns:

            def one(key: jax.Array, h: jax.Array, n: int = n) -> Any:
                k1, k2 = jax.random.split(key)
                x0 = continuum.sample_perturbation(k1, n, 2, ell, eps, dtype=jnp.float64)
                xs = simulate(
                    kernels.Kuramoto(K),
                    x0,
                    t1=T,
                    dt=h,
                    ts=ts,
                    noise=Independent(sigma),
                    key=k2,
                    max_steps=int(round(2 * T / dt)) + 4,
                ).xs
                assert xs is not None
                x = xs[-1]
                ang = jnp.arctan2(x[:, 1], x[:, 0])
                c = jnp.mean(jnp.exp(1j * kj[:, None] * ang[None, :]), axis=1)
                return continuum.w1_circle(x, rho1), c

            f = jax.jit(jax.vmap(one, (0, None)))
            ks = _keys(int(P["seed"]) * 7919 + n, keys)
            w, c = f(ks, jnp.float64(dt))
            W[n] = np.asarray(w)
            if n == ns[-1]:  # the step's bias: the same keys (starts, paths) at half the step
                coeffs[dt] = np.asarray(c)
                coeffs[dt / 2] = np.asarray(f(ks, jnp.float64(dt / 2))[1])
    x = np.log(ns)

    def rate(*means: ArrayLike) -> float:
        return _slope(x, np.log(np.asarray(means, float)))

    slope, slope_se = jackknife(rate, *[W[n] for n in ns])
    means = np.array([W[n].mean() for n in ns])
    # weak order 1: the law at dt is off by about 2 (c(dt) - c(dt/2)) in each mode
    dc = 2 * (coeffs[dt].mean(axis=0) - coeffs[dt / 2].mean(axis=0))
    bias = w1_fourier_bound(dc)
    # a shift of each mean distance by at most b moves log W_j by at most b / (W_j - b): the
    # least-squares slope (weights (x_j - mean) / sum (x - mean)^2) by at most this
    wls = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
    slope_bias = float(np.sum(np.abs(wls) * bias / np.maximum(means - bias, 1e-300)))
    return {
        "n": ns,
        "mean": means,
        "se": np.array([W[n].std(ddof=1) / math.sqrt(keys) for n in ns]),
        "per_key": W,
        "slope": slope,
        "slope_se": slope_se,
        "prefactor": float(np.exp(np.mean(np.log(means) + 0.5 * x))),
        "step_bias": bias,
        "slope_bias": slope_bias,
        "c1_solve": complex(c_solve[0]),
        "c1_fourier": None if c_fp is None else complex(c_fp[-1]),
        "c1_particles": complex(coeffs[dt].mean(axis=0)[0]),
        "tail": float(sol.tail[-1]),
        "solver_steps": int(sol.num_steps),
    }


# --------------------------------------------------------------------------- homogenized limit


def homogenized_prefactor(x: ArrayLike, beta: float) -> float:
    r"""$\kappa = \frac{d - 1}{d} \frac1n \sum_i |m_i(x)|^2$, $m_i = \sum_j \operatorname{softmax}_j(\beta
    \langle x_i, x_j\rangle)\, x_j$: the mean over the tokens of $E_V |P_{x_i} V m_i|^2$ for $V$ with
    i.i.d. $N(0, 1/d)$ entries (``value="gaussian"``, $Q = K = I$), the drift's variance over the
    weights; a run redrawn every $p$ is at mean squared distance $p\, t\, \kappa + O(p^2)$ from its
    start at time $t$ (docs/math/noise.md, The homogenized limit).

    >>> x = np.array([[1.0, 0.0, 0.0]] * 4)   # equal tokens: m_i = x_i
    >>> round(homogenized_prefactor(x, 1.0), 6)
    0.666667
    """
    x = np.asarray(x, np.float64)
    z = beta * x @ x.T
    A = np.exp(z - z.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    m = A @ x
    d = x.shape[1]
    return float((d - 1) / d * np.mean(np.sum(m**2, axis=1)))


def _homogenized(S: Mapping[str, Any]) -> dict[str, Any]:
    """``SelfAttention(beta, weights="identity", value="gaussian", regen_period=p)`` from one start,
    Euler with one step per draw, ``seeds`` weight seeds per period: the mean squared distance to the
    averaged flow (the start: the averaged drift is 0) at ``t1``; its exponent in p and the limit of
    ``msd / (p t1)`` as p -> 0 (jackknife over seeds)."""
    H = S["homogenized"]
    n, d, beta, T = int(H["n"]), int(H["d"]), float(H["beta"]), float(H["t1"])
    periods = [float(p) for p in H["periods"]]
    seeds = int(H["seeds"])
    with jax.enable_x64(True):
        x0 = sphere.uniform(jax.random.key(2000 + int(H["seed"])), n, d, jnp.float64)
        msd: dict[float, np.ndarray] = {}
        for p in periods:

            def one(seed: jax.Array, p: float = p) -> Any:
                model = models.SelfAttention(
                    beta, weights="identity", value="gaussian", weight_seed=seed, regen_period=p
                )
                xs = simulate(
                    model,
                    x0,
                    t1=T,
                    dt=p,
                    solver="euler",
                    ts=np.array([0.0, T]),
                    max_steps=int(round(T / p)) + 4,
                ).xs
                assert xs is not None
                x = xs[-1]
                return jnp.mean(jnp.sum((x - x0) ** 2, axis=-1))

            # the seeds of every period: 0, 1, ... (the k-th draw of a seed is the same matrix at
            # every period: fold_in(key(seed), k)), so the periods' runs are paired
            base = int(H["seed"]) * 100_003
            msd[p] = np.asarray(jax.jit(jax.vmap(one))(base + jnp.arange(seeds)))
    kappa = homogenized_prefactor(np.asarray(x0), beta)
    P = np.asarray(periods)

    def exponent(*m: ArrayLike) -> float:
        return _slope(np.log(P), 0.5 * np.log(np.asarray(m, float)))

    def intercept(*m: ArrayLike) -> float:
        return float(np.polyfit(P, np.asarray(m, float) / (P * T), 1)[1])

    order, order_se = jackknife(exponent, *[msd[p] for p in periods])
    c0, c0_se = jackknife(intercept, *[msd[p] for p in periods])
    ratio = np.array([msd[p].mean() / (p * T) for p in periods])
    c1 = float(np.polyfit(P, ratio, 1)[0])
    # the O(p) term of msd / (p t) = c0 (1 + a p) bends the log-log slope by the slope of
    # log(1 + a p) / 2 over the same periods
    a = c1 / c0
    bend = _slope(np.log(P), 0.5 * np.log(np.clip(1 + a * P, 1e-12, None)))
    return {
        "periods": periods,
        "distance": np.sqrt([msd[p].mean() for p in periods]),
        # the standard error of the RMS distance from that of the mean square (delta method)
        "distance_se": np.array(
            [msd[p].std(ddof=1) / (2 * math.sqrt(seeds * msd[p].mean())) for p in periods]
        ),
        "ratio": ratio,
        "order": order,
        "order_se": order_se,
        "bend": bend,
        "c0": c0,
        "c0_se": c0_se,
        "c1": c1,
        "kappa": kappa,
        "kappa_common": (d - 1) / d,
    }


# --------------------------------------------------------------------------- run


def run(
    out_dir: str | os.PathLike[str],
    *,
    quick: bool = False,
    full: bool = False,
    quiet: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the noise reproduction; write the figures, data and ``summary.json``; return the summary.

    ``options`` override entries of ``EXPERIMENT.options`` (an unknown name raises ``ValueError``)."""
    S = EXPERIMENT.settings(EXPERIMENT.mode(quick=quick, full=full), **options)
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    sigma, k = float(S["sigma"]), float(S["se_multiple"])
    steps = EXPERIMENT.start(quiet=quiet)
    checks: list[dict[str, Any]] = []

    # ----------------------------------------------------- the runs: S^2, common noise, the circle
    with steps("brownian"):
        b3 = _brownian(S, sigma)
    with steps("common"):
        cm = _common(S, sigma)
    with steps("circle"):
        kq = _circle(S, sigma)
    bm = {2: kq["brownian"], 3: b3}
    dts = b3["dts"]

    # ----------------------------------------------------- Brownian motion on the sphere
    for d in (2, 3):
        b = bm[d]
        tol = k * b["se"] + np.abs(b["residual"])
        worst = int(np.argmax(np.abs(b["mean"] - b["exact"]) / tol))
        how = (
            "SelfAttention with V = 0"
            if d == 3
            else f"Kuramoto at K = {FREE_COUPLING:g}: its field is at most K, a displacement below "
            f"{FREE_COUPLING * S['circle']['t1']:g}"
        )
        checks.append(
            check(
                f"brownian_decay_d{d}",
                b["mean"][worst],
                b["exact"][worst],
                tol[worst],
                f"E<x(t), x(0)> of free tokens ({how}) under Independent(sigma = {sigma:g}) on S^{d - 1} "
                "against exp(-(d - 1) sigma^2 t / 2) (Brownian motion on the sphere), the worst of t = "
                f"{b['saves']}: measured 2 m(h) - m(2h) (Richardson, h = {b['dt']:g}, one path per key) over "
                f"{b['samples']} tokens ({b['keys']} keys); "
                + "; ".join(
                    f"t = {t:g}: {m:.4f} +- {s:.4f} vs {e:.4f}"
                    for t, m, s, e in zip(b["saves"], b["mean"], b["se"], b["exact"])
                )
                + f". Tolerance: {k:g} standard errors (the tokens' sample standard deviation / sqrt of "
                "their number) plus the extrapolation's residual bias 2 c_h^(t/h) - c_2h^(t/2h) - exact "
                "from the step's one-step law (heun_step_mean): "
                + ", ".join(f"{v:.1e}" for v in b["residual"]),
                rule=f"|measured - theory| <= {k:g} SE + |Richardson residual| = {tol[worst]:.3g}",
            )
        )
    h0 = dts[0]
    m_h0, se_h0 = b3["mean_by_dt"][h0][-1], b3["se_by_dt"][h0][-1]
    chain_h0 = b3["chain_by_dt"][h0][-1]
    checks.append(
        check(
            "heun_step_law",
            m_h0,
            chain_h0,
            k * se_h0,
            f"E<x(t1), x(0)> of the free tokens on S^2 at the coarsest step h = {h0:g} (t1 = "
            f"{S['brownian']['t1']:g}, {b3['samples']} tokens) against the exact mean c_h^(t1/h) of the "
            "discrete chain, c_h the mean cosine of one projected Heun step by quadrature (heun_step_mean: "
            "the step is rotation-equivariant, its increments isotropic, so the chain is an isotropic random "
            f"walk); the continuous-time value is {b3['exact'][-1]:.4f}, so the step's weak bias here is "
            f"{chain_h0 - b3['exact'][-1]:.4f}. Tolerance: {k:g} standard errors",
            rule=f"|measured - theory| <= {k:g} SE = {k * se_h0:.3g}",
        )
    )
    w = b3["weak"]
    tol = k * w["se"]
    checks.append(
        check(
            "weak_order",
            w["order"],
            w["chain_order"],
            tol,
            "weak order of the projected Stratonovich Heun step: the slope of log |m(h) - m(h/2)| "
            f"against log h, m = E<x(t1), x(0)> of the free tokens on S^2, h = {dts[:-1]} (paired: the "
            f"runs of one key read one path); differences {', '.join(f'{v:.4f}' for v in w['differences'])}; "
            "against the same slope of the exact chain (c_h^(t1/h), heun_step_mean), differences "
            f"{', '.join(f'{v:.4f}' for v in w['chain_differences'])}: the weak order is 1 (log c_h = "
            "-(d - 1) sigma^2 h / 2 + O(h^2)), but at these steps the O(h^2) term still bends the slope; the "
            "chain's slope over the same ladder of steps 8 and 64 times finer is "
            + " and ".join(f"{v:.3f}" for v in w["chain_order_finer"])
            + f". Tolerance: {k:g} jackknife standard errors over keys",
            rule=f"|measured - exact chain's slope| <= {k:g} SE = {tol:.3g}",
        )
    )

    for name, st, what in (
        ("strong_order_independent", b3["strong"], f"Independent, t = {S['brownian']['t1']:g}"),
        ("strong_order_common", cm["strong"], f"Common, t = {cm['strong_time']:g}"),
    ):
        checks.append(
            check(
                name,
                st["order"],
                0.5,
                k * st["se"],
                f"strong order of the projected Stratonovich Heun step ({what}; free tokens on S^2): the "
                "slope of the log root-mean-square distance to the run at the finest step h_ref = "
                f"{st['ref']:g} of the same path (the tree is dyadic) against log(h - h_ref), h = "
                f"{st['dts']}; RMS {', '.join(f'{v:.4f}' for v in st['rms'])}. The noise fields do not "
                "commute on the sphere and the step has no Levy areas: order 1/2. Fitting against "
                "h - h_ref: the local error is the missing Levy area, and the area of a step of 2h is its "
                "halves' areas plus an independent term, so E|x_h - x_ref|^2 = C (h - h_ref) (against h "
                f"itself the slope is {st['order_vs_h']:.3f}). Tolerance: {k:g} jackknife standard errors "
                "over keys",
                rule=f"|measured - 0.5| <= {k:g} SE = {k * st['se']:.3g}",
            )
        )
    tol = k * cm["rate_se"]
    checks.append(
        check(
            "common_noise_contraction",
            cm["rate"],
            sigma**2,
            tol,
            "rate at which E log|sin angle(x_i, x_j)| decreases for free tokens on S^2 under Common(sigma = "
            f"{sigma:g}): -(E log|sin theta(t1)| - log|sin theta(0)|) / t1 at t1 = {S['common']['t1']:g} over "
            f"{cm['pairs']} pairs and {S['common']['keys']} keys, Richardson from h = {cm['dts'][-2]:g} and "
            f"{cm['dts'][-1]:g} (rates {', '.join(f'{v:.3f}' for v in cm['rate_by_dt'].values())}); theory "
            "lambda_1 - lambda_2 = sigma^2 of the linear Stratonovich flow dX = sigma dB o X, whose exponents "
            "are (sigma^2 / 2)(d + 1 - 2i), exact at every t (docs/math/noise.md). Tolerance: "
            f"{k:g} standard errors over keys (the pairs of one key share its path)",
            rule=f"|measured - sigma^2| <= {k:g} SE = {tol:.3g}",
        )
    )
    tol = k * cm["sign_law_se"]
    checks.append(
        check(
            "common_noise_sign_law",
            cm["sign_law"],
            cm["sign_theory"],
            tol,
            f"mean over pairs of 1 - theta(t1) / pi at t1 = {S['common']['t1']:g} under common noise (theta the "
            "angle between x_i and x_j; Richardson from the two finest steps) against the mean of 1 - "
            "theta_0 / pi. The lines merge (X(t) tends to rank one, u v^T with v uniform), so a pair ends at "
            "sign(<v, x_i> <v, x_j>): at +1 with probability 1 - theta / pi given its angle now (the future "
            "flow is independent and isotropic), hence theta(t) is a martingale and antipodal pairs "
            f"attract: {cm['start_negative']:.2f} of the pairs start with <x_i, x_j> < 0, at t1 "
            f"{cm['sign_plus']:.3f} have <x_i, x_j> > 0 and {cm['merged']:.3f} are merged (|sin| < 0.1; "
            f"{cm['end_aligned']:.3f} with 1 - |<x_i, x_j>| < 0.01). Tolerance: {k:g} standard errors over keys",
            rule=f"|measured - theory| <= {k:g} SE = {tol:.3g}",
        )
    )

    # ----------------------------------------------------- noisy Kuramoto
    with steps("threshold"):
        with jax.enable_x64(True):
            roots = {}
            import scipy.optimize

            for d in (2, 3, 5):

                def rate(K: float, d: int = d) -> float:
                    return float(
                        continuum.growth_rates(
                            K, d, 1, model="kuramoto", noise=Independent(jnp.float64(sigma))
                        )
                    )

                roots[d] = scipy.optimize.brentq(rate, 1e-3, 10 * d * sigma**2, xtol=1e-13)
    dev = max(abs(roots[d] - theory.kuramoto_threshold(sigma, d)) for d in roots)
    dev_closed = max(abs(theory.kuramoto_threshold(sigma, d) - d * sigma**2 / 2) for d in roots)
    checks.append(
        check(
            "kuramoto_threshold",
            max(dev, dev_closed),
            0.0,
            1e-9,
            "max over d = 2, 3, 5 of |root in K of mf.continuum.growth_rates(K, d, 1, model='kuramoto', "
            f"noise=Independent({sigma:g})) - mf.theory.kuramoto_threshold(sigma, d)| and of |kuramoto_threshold "
            "- d sigma^2 / 2|: roots "
            + ", ".join(f"d = {d}: {v:.12f}" for d, v in roots.items())
            + ". Tolerance 1e-9: brentq's xtol 1e-13 and float64 rounding of rates linear in K",
        )
    )
    names = ("kuramoto_rate_below", "kuramoto_rate_above")
    for name, rr in zip(names, kq["rates"]):
        checks.append(
            check(
                name,
                rr["rate"],
                rr["fp_rate"],
                k * rr["se"],
                f"growth rate of E m_x(t), log(m(t1) / m(0)) / t1 at t1 = {S['circle']['t1']:g}, of "
                f"{S['circle']['n']} Kuramoto tokens on the circle, K = {rr['K']:g} (K_c = sigma^2 = "
                f"{kq['K_c']:g}), Independent(sigma = {sigma:g}), from the lattice of the density "
                f"(1 + 2 m0 cos theta) / (2 pi), m0 = {kq['m0']:.4f}, and its mirror image (an antithetic pair: the "
                "run from -x0 with the path W is minus the run from x0 with -W); "
                f"{S['circle']['keys']} keys, Richardson "
                f"from dt = {S['circle']['dt']:g} and half of it; against the same fit of the Fokker-Planck "
                "solution in Fourier modes from the lattice's own coefficients (fokker_planck_circle, "
                "independent of mf.continuum; the same estimator), whose linear rate is K/2 - sigma^2/2 = "
                f"{rr['linear']:g} (the "
                f"nonlinear terms bring it to {rr['fp_rate']:.4f} at this amplitude). Tolerance: {k:g} "
                "jackknife standard errors over keys",
                rule=f"|measured - theory| <= {k:g} SE = {k * rr['se']:.3g}",
            )
        )
    tol = k * kq["crossing_se"]
    checks.append(
        check(
            "kuramoto_threshold_particles",
            kq["crossing"],
            kq["K_c"],
            tol,
            "the coupling where the particles' linear growth rate changes sign: the measured rates at K = "
            f"{kq['rates'][0]['K']:g} ({kq['rates'][0]['rate']:.3f}) and {kq['rates'][1]['K']:g} "
            f"({kq['rates'][1]['rate']:.3f}) less the nonlinear part of the rate at this amplitude (the "
            "Fokker-Planck rate minus K/2 - sigma^2/2: "
            + ", ".join(f"{r['fp_rate'] - r['linear']:+.4f}" for r in kq["rates"])
            + f"), interpolated linearly to zero (the linear rate is linear in K), against K_c = d sigma^2 / 2 "
            f"= {kq['K_c']:g}; without the correction the crossing is {kq['crossing_raw']:.3f}. Tolerance: "
            f"{k:g} jackknife standard errors over keys",
            rule=f"|measured - K_c| <= {k:g} SE = {tol:.3g}",
        )
    )
    st = kq["stationary"]
    tols = [k * r["se"] + r["finite_n"] for r in st]
    worst = int(np.argmax([abs(r["r"] - r["theory"]) / t for r, t in zip(st, tols)]))
    checks.append(
        check(
            "kuramoto_stationary_r",
            st[worst]["r"],
            st[worst]["theory"],
            tols[worst],
            f"time-averaged |m| over t in [{kq['stationary_window'][0]:g}, {kq['stationary_window'][1]:g}] of "
            f"{S['circle']['n']} tokens from r = 1 under Independent(sigma = {sigma:g}), Richardson from dt = "
            f"{S['circle']['stationary_dt']:g} and half of it, {st[0]['runs']} runs (independent keys) per "
            "coupling, against the root of r = A_2(2 K r / sigma^2) (the von Mises stationary law), the worst "
            "of K = "
            + "; ".join(
                f"{r['K']:g}: {r['r']:.4f} +- {r['se']:.4f} vs {r['theory']:.4f} (at dt and dt/2: "
                f"{r['r_by_dt'][0]:.4f}, {r['r_by_dt'][1]:.4f})"
                for r in st
            )
            + f". Tolerance: {k:g} standard errors over the runs plus twice the finite-n bias of |m| for n "
            "independent von Mises tokens, E sin^2 / (2 r n)",
            rule=f"|measured - theory| <= {k:g} SE + finite-n bias = {tols[worst]:.3g}",
        )
    )

    # ----------------------------------------------------- natural frequencies
    with steps("frequencies"):
        fq = _frequency_runs(S)
    for name, rows in fq["rows"].items():
        tols = [k * r["se_time"] + abs(r["r"] - r["r_half"]) / (math.sqrt(2) - 1) for r in rows]
        worst = int(np.argmax([abs(r["r"] - r["theory"]) / t for r, t in zip(rows, tols)]))
        formula = "sqrt(1 - 2 gamma / K)" if name == "lorentzian" else "Kuramoto's self-consistency"
        checks.append(
            check(
                f"frequencies_{name}",
                rows[worst]["r"],
                rows[worst]["theory"],
                tols[worst],
                f"Kuramoto without noise, {fq['n']} tokens from r = 1 with the {name} law's midpoint quantiles "
                f"(spread {S['frequencies']['spread']:g}, K_c = {rows[0]['K_c']:.4f}) as frequencies: the "
                f"order parameter averaged over the last {S['frequencies']['window']:g} of t1 = "
                f"{S['frequencies']['t1']:g} (RK4, dt = {S['frequencies']['dt']:g}) against {formula}, the "
                "worst of K / K_c = "
                + ", ".join(f"{r['K_over_Kc']:g}: {r['r']:.4f} vs {r['theory']:.4f}" for r in rows)
                + f". Tolerance: {k:g} standard errors of the time average (8 block means) plus the "
                "finite-n error extrapolated from n/2 tokens (each twice: the same mean field), "
                "|r_n - r_n/2| / (sqrt 2 - 1), as if it fell only like n^-1/2",
                rule=f"|measured - theory| <= {k:g} SE + |r_n - r_n/2| / (sqrt 2 - 1) = {tols[worst]:.3g}",
            )
        )

    # ----------------------------------------------------- particles against the density equation
    with steps("fokker_planck"):
        fp = _fp_particles(S, sigma)
    P = S["fokker_planck"]
    tol = k * fp["slope_se"] + fp["slope_bias"]
    c1 = fp["c1_fourier"]
    cross = (
        ""
        if c1 is None
        else f" (its first mode at t1, {fp['c1_solve'].real:.6f}, against fokker_planck_circle's "
        f"{c1.real:.6f}: the two solvers agree to {abs(fp['c1_solve'] - c1):.1e})"
    )
    checks.append(
        check(
            "fokker_planck_w1_rate",
            fp["slope"],
            -0.5,
            tol,
            f"the exponent of the mean W1 distance (mf.continuum.w1_circle) at t1 = {P['t1']:g} between the "
            f"empirical law of n noisy Kuramoto tokens (K = {P['coupling']:g}, twice K_c = sigma^2; "
            f"Independent(sigma = {sigma:g}), Heun, dt = {P['dt']:g}) started i.i.d. from (1 + "
            f"{P['eps']:g} cos({P['mode']} theta)) / (2 pi) (mf.continuum.sample_perturbation) and the "
            "solution of the density equation from the same density (mf.continuum.solve(K, rho0, d=2, "
            f"model='kuramoto', noise=Independent(sigma)), band-limit {P['resolution']}, spectral tail "
            f"{fp['tail']:.1e}){cross}, fitted over n = {fp['n']} ({P['keys']} keys each; mean distances "
            + ", ".join(f"{m:.4f}" for m in fp["mean"])
            + f"; W1 sqrt(n) = {fp['prefactor']:.3f} on average), against -1/2: the propagation of chaos "
            "(the empirical law of n nearly independent tokens is at W1 distance ~ c n^-1/2 from their "
            "law, and the interaction adds O(n^-1/2)). The step's bias of the one-particle law, bounded "
            "from its Fourier modes (2 |c_k(dt) - c_k(dt/2)| at the largest n, the same keys; W1 <= "
            f"sqrt(2 sum |dc_k|^2 / k^2), k <= {P['modes']}), is {fp['step_bias']:.1e}, against the "
            f"smallest distance {fp['mean'][-1]:.4f}. Tolerance: {k:g} jackknife standard errors over "
            f"keys ({fp['slope_se']:.3f}) plus the largest shift of the fitted slope by that bias "
            f"({fp['slope_bias']:.1e})",
            rule=f"|measured + 0.5| <= {k:g} SE + step bias's slope shift = {tol:.3g}",
        )
    )

    # ----------------------------------------------------- the homogenized limit
    with steps("homogenized"):
        hz = _homogenized(S)
    Hs = S["homogenized"]
    what = (
        f"SelfAttention(beta = {Hs['beta']:g}, weights='identity', value='gaussian', regen_period = p) on "
        f"S^{int(Hs['d']) - 1}, {Hs['n']} tokens from one uniform start, one Euler step of length p per draw "
        f"of V (entries N(0, 1/d)), {Hs['seeds']} weight seeds per p, p = {hz['periods']}"
    )
    tol = k * hz["order_se"] + abs(hz["bend"])
    checks.append(
        check(
            "homogenized_rate",
            hz["order"],
            0.5,
            tol,
            f"the exponent in p of the root-mean-square distance at t = {Hs['t1']:g} between the run of "
            f"{what} and the flow of the averaged drift E_V F_V = 0 (V is independent of the attention "
            "weights and of mean zero: the averaged flow stays at the start); distances "
            + ", ".join(f"{v:.4f}" for v in hz["distance"])
            + ". Theory 1/2: over t the redraws are t / p independent mean-zero kicks of size p, a "
            "diffusion with coefficient p times the drift's covariance over the weights (docs/math/noise.md). "
            f"Tolerance: {k:g} jackknife standard errors over seeds ({hz['order_se']:.3f}) plus the bend "
            f"of the log-log slope by the fitted O(p) correction of msd / (p t) ({hz['bend']:+.4f})",
            rule=f"|measured - 0.5| <= {k:g} SE + |O(p) bend| = {tol:.3g}",
        )
    )
    tol = k * hz["c0_se"]
    checks.append(
        check(
            "homogenized_prefactor",
            hz["c0"],
            hz["kappa"],
            tol,
            f"the limit p -> 0 of the mean squared distance over p t (t = {Hs['t1']:g}) for the run of "
            f"{what}: msd / (p t) = "
            + ", ".join(f"{v:.4f}" for v in hz["ratio"])
            + f", extrapolated linearly in p (slope {hz['c1']:+.3f}), against the closed form kappa = "
            "(d - 1) / d times the mean over tokens of |m_i(x0)|^2, m_i = sum_j softmax_j(beta <x_i, x_j>) "
            "x_j: E_V |P_x V m|^2 = (d - 1) |m|^2 / d, the trace of the drift's covariance over the weights "
            "(the common-noise limit dx_i = sqrt(p / d) P_{x_i} dB m_i(x), a matrix Brownian motion B: "
            f"Common(sqrt(p / d)) where the tokens coincide, kappa = {hz['kappa_common']:.4f} there). "
            f"Tolerance: {k:g} jackknife standard errors over seeds",
            rule=f"|measured - kappa| <= {k:g} SE = {tol:.3g}",
        )
    )

    with steps("figures"):
        figures = _figures(out, S, sigma, bm, cm, kq, fq, fp, hz)
    np.savez_compressed(
        out / "noise_data.npz",
        brownian_saves_d2=np.asarray(bm[2]["saves"]),
        brownian_d2=bm[2]["mean"],
        brownian_saves_d3=np.asarray(bm[3]["saves"]),
        brownian_d3=bm[3]["mean"],
        common_ts=cm["ts"],
        common_mean=cm["mean"],
        kuramoto_ts=kq["ts"],
        kuramoto_mean=kq["mean"],
        kuramoto_fp=kq["fp"],
        fokker_planck_n=np.asarray(fp["n"]),
        fokker_planck_w1=np.stack([fp["per_key"][n] for n in fp["n"]]),
        homogenized_periods=np.asarray(hz["periods"]),
        homogenized_distance=hz["distance"],
    )
    S["results"] = {
        "strong_independent": b3["strong"],
        "strong_common": cm["strong"],
        "weak": w,
        "kuramoto_rates": kq["rates"],
        "frequencies": fq["rows"],
        "fokker_planck": {
            key: np.asarray(v).tolist()
            for key, v in fp.items()
            if key != "per_key" and not isinstance(v, complex)
        },
        "homogenized": {key: np.asarray(v).tolist() for key, v in hz.items()},
    }
    steps.close()
    return write_summary(
        out, _NAME, quick=quick, settings=S, checks=checks, timings=steps.timings, figures=figures
    )


def _theory_curve(
    name: str, spread: float, Kc: float, K_max: float
) -> tuple[np.ndarray, np.ndarray]:
    """The curve r(K) of Kuramoto's self-consistency, 0 below K_c: Ott-Antonsen's closed form for
    the Lorentzian; for the Gaussian parametrically in u = K r (1/K = int cos^2 g(u sin), r = u / K:
    one quadrature per point, the curve without root finding)."""
    if name == "lorentzian":
        K = np.linspace(0.5 * Kc, K_max, 200)
        return K, np.sqrt(np.clip(1 - 2 * spread / K, 0, None))
    th, wt = np.polynomial.legendre.leggauss(64)
    th, wt = th * np.pi / 2, wt * np.pi / 2
    u = np.linspace(1e-6, K_max * 1.2, 300)[:, None]
    g = np.exp(-((u * np.sin(th)) ** 2) / (2 * spread**2)) / (spread * math.sqrt(2 * np.pi))
    K = 1 / np.sum(wt * np.cos(th) ** 2 * g, axis=1)
    r = u[:, 0] / K
    keep = K <= K_max
    return np.r_[0.5 * Kc, Kc, K[keep]], np.r_[0.0, 0.0, r[keep]]


def _figures(
    out: Path,
    S: Mapping[str, Any],
    sigma: float,
    bm: Mapping[int, Any],
    cm: Mapping[str, Any],
    kq: Mapping[str, Any],
    fq: Mapping[str, Any],
    fp: Mapping[str, Any],
    hz: Mapping[str, Any],
) -> list[str]:
    import matplotlib.pyplot as plt

    from .. import plotting

    fig, ax = plt.subplots(3, 2, figsize=(10, 12))
    a = ax[0, 0]
    tt = np.linspace(0, max(bm[2]["saves"][-1], bm[3]["saves"][-1]), 100)
    for d, color in ((2, "C0"), (3, "C1")):
        b = bm[d]
        a.plot(
            tt,
            np.exp(-(d - 1) * sigma**2 * tt / 2),
            color=color,
            lw=1,
            label=f"exp(-(d-1)σ²t/2), d = {d}",
        )
        a.errorbar(b["saves"], b["mean"], yerr=2 * b["se"], fmt="o", color=color, ms=4, capsize=3,
                   label=f"particles, d = {d} (±2 SE)")  # fmt: skip
    a.set_xlabel("t")
    a.set_ylabel("E <x(t), x(0)>")
    a.set_title("free tokens, independent noise: Brownian motion on the sphere", fontsize=9)
    a.legend(fontsize=7)

    a = ax[0, 1]
    for st, label, color in (
        (bm[3]["strong"], "strong, independent", "C0"),
        (cm["strong"], "strong, common", "C2"),
    ):
        H = np.asarray(st["dts"])
        a.loglog(H, st["rms"], "o", color=color, label=f"{label}: order {st['order']:.2f}")
        a.loglog(
            H,
            st["rms"][0] * np.sqrt((H - st["ref"]) / (H[0] - st["ref"])),
            "-",
            color=color,
            lw=0.8,
        )
    w = bm[3]["weak"]
    H = np.asarray(bm[3]["dts"][:-1])
    a.loglog(
        H, w["differences"], "s", color="C3", label=f"weak |m(h) - m(h/2)|: order {w['order']:.2f}"
    )
    a.loglog(
        H, w["chain_differences"], "-", color="C3", lw=0.8, label="weak, exact chain (quadrature)"
    )
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    Hs = np.unique(np.r_[H, bm[3]["strong"]["dts"], cm["strong"]["dts"]])
    a.set_xlim(Hs.min() / 1.6, Hs.max() * 1.6)
    a.xaxis.set_major_locator(FixedLocator(Hs.tolist()))
    a.xaxis.set_minor_locator(NullLocator())
    a.xaxis.set_minor_formatter(NullFormatter())
    a.set_xticklabels([f"1/{round(1 / h):d}" for h in Hs])
    lo = min(min(w["differences"]), min(w["chain_differences"]))
    hi = max(max(bm[3]["strong"]["rms"]), max(cm["strong"]["rms"]))
    a.set_ylim(lo / 2, hi * 2)
    a.set_xlabel("step h")
    a.set_ylabel("error")
    a.set_title("projected Heun step: strong order 1/2, weak order 1 (lines: theory)", fontsize=9)
    a.legend(fontsize=7)

    a = ax[1, 0]
    ts = cm["ts"]
    a.plot(ts, -(sigma**2) * ts, "k-", lw=1, label="-σ² t (λ₁ - λ₂ = σ²)")
    a.errorbar(ts, cm["mean"], yerr=2 * cm["se"], fmt="o", ms=3, capsize=2, color="C2",
               label="particles, common noise (±2 SE)")  # fmt: skip
    a.set_xlabel("t")
    a.set_ylabel("E log|sin θ(t)| - log|sin θ(0)|")
    a.set_title("common noise: the lines of two tokens merge", fontsize=9)
    a.legend(fontsize=7)

    a = ax[1, 1]
    for row, color in ((0, "C0"), (1, "C3")):
        K = kq["rates"][row]["K"]
        a.plot(kq["ts"], kq["fp"][row], "-", color=color, lw=1, label=f"Fokker-Planck, K = {K:g}")
        a.errorbar(kq["ts"][::2], kq["mean"][row][::2], yerr=2 * kq["se"][row][::2], fmt="o", ms=3,
                   capsize=2, color=color, label=f"particles, K = {K:g} (±2 SE)")  # fmt: skip
    a.set_yscale("log")
    lo = float(min(np.min(kq["fp"]), np.min(kq["mean"] - 2 * kq["se"])))
    hi = float(max(np.max(kq["fp"]), np.max(kq["mean"] + 2 * kq["se"])))
    lo = max(lo, 1e-3)
    a.set_ylim(min(lo / 1.5, hi / 12), hi * 1.5)
    a.set_xlabel("t")
    a.set_ylabel("E m_x(t)")
    a.set_title(
        f"noisy Kuramoto, σ = {sigma:g}: decay below, growth above K_c = {kq['K_c']:g}", fontsize=9
    )
    a.legend(fontsize=7)

    a = ax[2, 0]
    n = np.asarray(fp["n"], float)
    a.errorbar(n, fp["mean"], yerr=2 * fp["se"], fmt="o", color="C0", ms=4, capsize=3,
               label=f"particles (±2 SE): exponent {fp['slope']:.3f} ± {fp['slope_se']:.3f}")  # fmt: skip
    nn = np.geomspace(n.min() / 1.3, n.max() * 1.3, 50)
    a.loglog(nn, fp["prefactor"] / np.sqrt(nn), "k-", lw=1, label=f"{fp['prefactor']:.2f} n^-1/2")
    a.axhline(fp["step_bias"], color="C3", ls=":", lw=1, label="bound of the step's bias (dt)")
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("tokens n")
    a.set_ylabel("E W1(particles, density) at t1")
    a.set_title("noisy Kuramoto: particles against the Fokker-Planck solution", fontsize=9)
    a.legend(fontsize=7)

    a = ax[2, 1]
    P = np.asarray(hz["periods"])
    a.errorbar(P, hz["distance"], yerr=2 * hz["distance_se"], fmt="o", color="C2", ms=4, capsize=3,
               label=f"redrawn V (±2 SE): exponent {hz['order']:.3f}")  # fmt: skip
    pp = np.geomspace(P.min() / 1.3, P.max() * 1.3, 50)
    t = float(S["homogenized"]["t1"])
    a.loglog(pp, np.sqrt(hz["kappa"] * pp * t), "k-", lw=1, label="sqrt(κ p t), κ from E_V|P V m|²")
    a.set_xscale("log")
    a.set_yscale("log")
    lo = float(np.min(hz["distance"])) / 2
    a.set_ylim(lo, max(11 * lo, 2 * float(np.max(hz["distance"]))))
    a.set_xlabel("redraw period p")
    a.set_ylabel("RMS distance to the averaged flow")
    a.set_title("random weights redrawn every p: the homogenized limit", fontsize=9)
    a.legend(fontsize=7)
    paths = [plotting.savefig(fig, out / "noise.png")]

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    a = ax[0]
    gamma = float(S["frequencies"]["spread"])
    for (name, rows), color in zip(fq["rows"].items(), ("C0", "C1")):
        Kc = rows[0]["K_c"]
        Kg, rg = _theory_curve(name, gamma, Kc, 1.1 * max(r["K"] for r in rows))
        a.plot(Kg, rg, "-", color=color, lw=1, label=f"{name}: theory")
        a.plot([r["K"] for r in rows], [r["r"] for r in rows], "o", color=color, ms=5,
               label=f"{name}: {fq['n']} tokens")  # fmt: skip
        a.axvline(Kc, color=color, ls=":", lw=1)
    a.set_xlabel("coupling K (dotted: K_c)")
    a.set_ylabel("order parameter r")
    a.set_ylim(-0.02, 1.02)
    a.set_title(f"natural frequencies (spread {gamma:g}), no noise", fontsize=9)
    a.legend(fontsize=7)

    a = ax[1]
    Kc = kq["K_c"]
    Kg = np.linspace(0.2 * Kc, 3.2 * Kc, 120)
    a.plot(Kg, [theory.kuramoto_order_parameter(float(K), sigma, 2) for K in Kg], "k-", lw=1,
           label="r = A₂(2Kr/σ²)")  # fmt: skip
    st = kq["stationary"]
    a.errorbar([r["K"] for r in st], [r["r"] for r in st], yerr=[2 * r["se"] for r in st], fmt="o",
               color="C3", capsize=3, label=f"particles, n = {S['circle']['n']} (±2 SE)")  # fmt: skip
    a.errorbar([kq["crossing"]], [0.0], xerr=[2 * kq["crossing_se"]], fmt="s", color="C0", capsize=3,
               label="K_c from the particles' growth rates (±2 SE)")  # fmt: skip
    a.axvline(Kc, color="k", ls=":", lw=1)
    a.set_xlabel("coupling K (dotted: K_c = σ²)")
    a.set_ylabel("stationary order parameter r")
    a.set_ylim(-0.02, 1.02)
    a.set_title(f"noisy Kuramoto on the circle, σ = {sigma:g}", fontsize=9)
    a.legend(fontsize=7, loc="center right")
    paths.append(plotting.savefig(fig, out / "kuramoto.png"))
    return [Path(p).name for p in paths]
