r"""Beyond the papers: inverse design, stability of critical points, the mean-field limit and large n.

``meanfield reproduce design [--quick] --out DIR`` writes ``DIR/design/``:

* ``design_anchor.png``: the designed law (Thm. 4 iii: a vMF mixture realised by one prompt
  gauge per token) reached from random initial states with a frozen anchor, against the same
  design without the anchor and the undesigned USA baseline; MMD per seed.
* ``design_quantile.png``: the quantile phase field (Thm. 2 ii): angle histogram of the
  maximiser on the orbit against the target density.
* ``design_learned.png``: learned gauges (optax, through the maximiser characterisation) for
  a curve on $S^2$ and a vMF mixture: target samples, fitted maximiser, simulated final state.
* ``hessian.png``: tangent-Hessian spectra at a collapsed state and at the antipodal saddle with
  the closed forms; the classification of long runs at small and large $\beta$.
* ``escape.png``: escape time from the antipodal saddle against the predicted $1 / (n \lambda_{\max})$.
* ``random_batch.png``: random-batch field error against ``p``; $G_x(t)$ exact vs random batch;
  an $n = 10^6$ run.
* ``meanfield.png``: $\text{MMD}(\mu_n(t), \mu_{2n}(t))$ against $n$ at fixed times with the fitted rates.

Distances between laws are ``mf.metrics.mmd`` (Gaussian kernel on $\mathbb R^3$, bandwidth
``settings["mmd_bandwidth"]``), the square root of the V-statistic.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import ArrayLike, Float, PRNGKeyArray
from tqdm.auto import tqdm

from .. import analysis, design, kernels, metrics, sphere
from .. import random_batch as rb
from ..energy import energy, velocity
from ..integrate import simulate
from ..kernels import Kernel
from ._common import Experiment, Option, check, write_summary

__all__ = ["EXPERIMENT", "run", "settings_for"]

_NAME = "design"


#: All sizes, seeds and choices of the experiment (quick: smaller sweeps), and its steps.
EXPERIMENT = Experiment(
    _NAME,
    {
        "d": Option(3, doc="ambient dimension d (tokens on S^(d-1))"),
        "beta": Option(1.0, doc="inverse temperature beta of the USA and prompt kernels"),
        "dt": Option(0.05, doc="time step of the design runs (anchored and learned)"),
        "solver": Option(
            "rk2",
            doc="integrator of the simulations (recorded; the runs use mf.simulate's default)",
        ),
        "mmd_bandwidth": Option(0.5, doc="bandwidth of the Gaussian MMD kernel between laws"),
        "seed": Option(0, doc="seed of the experiment's random keys and of the bootstrap"),
        "dtype": Option(
            "float32 (Hessians in float64)", doc="floating dtype of the runs (recorded only)"
        ),
        # 1. inverse design
        "anchor_n": Option(64, doc="tokens of the anchored inverse design"),
        "anchor_seeds": Option(20, doc="random initial states of the anchored design runs"),
        "anchor_t1": Option(20.0, doc="end time of the anchored design runs"),
        "anchor_mass": Option(
            1.0, doc="mass of the frozen anchor token (also of the learned design)"
        ),
        "anchor_u": Option(
            [0.0, 0.0, 1.0], doc="the gauge frame's limit point u of the designs (a vector of R^3)"
        ),
        "target_means": Option(
            [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -1.0]],
            doc="mean directions of the target vMF mixture",
        ),
        "target_kappa": Option(10.0, doc="concentration kappa of each vMF component of the target"),
        "quantile_n": Option(256, doc="tokens of the quantile phase-field design"),
        "quantile_u": Option(
            [1.0, 0.0, 0.5], doc="limit point u of the quantile design (normalised)"
        ),
        "quantile_density": Option(
            "exp(2 cos(a - 1)) + 0.5 exp(4 cos(a - 4)) on the orbit angle a",
            doc="the quantile design's target density on the orbit (recorded only)",
        ),
        "learned_n": Option(256, doc="tokens of the learned curve designs"),
        "learned_target_samples": Option(1024, doc="samples of each learned design's target law"),
        "learned_modes": Option(6, doc="Fourier modes of the learned curve"),
        "learned_steps": Option(1000, quick=300, doc="optimiser steps of the curve fit"),
        "learned_lr": Option(0.03, doc="learning rate of the curve fit"),
        "learned_bandwidth": Option(0.3, doc="MMD bandwidth of the curve fit's loss"),
        "learned_seeds": Option(
            20, quick=4, doc="random initial states simulated per learned design"
        ),
        "learned_t1": Option(20.0, doc="end time of the learned design runs"),
        "seam_b": Option(0.3, doc="seam-curve parameter b of the first learned target"),
        # 2. stability
        "hessian_n": Option(
            16, doc="tokens of the Hessian spectra (collapsed and antipodal states)"
        ),
        "classify_n": Option(32, doc="tokens of the long runs that are classified"),
        "classify_seeds": Option(16, quick=4, doc="random initial states of the classified runs"),
        "classify_t1_small_beta": Option(60.0, doc="end time of the classified runs at beta"),
        "classify_beta_large": Option(
            8.0, doc="the large beta of the classified runs (rescaled time)"
        ),
        "classify_t1_large_beta_rescaled": Option(
            30.0, doc="end time (rescaled) of the classified runs at the large beta"
        ),
        "classify_rtol": Option(
            1e-3, doc="relative tolerance of the critical-point classification"
        ),
        "escape_n": Option(6, doc="tokens of the escape from the antipodal saddle"),
        "escape_betas": Option(
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            quick=[1.0, 2.0, 3.0, 4.0],
            doc="inverse temperatures beta of the escape runs",
        ),
        "escape_delta0": Option(1e-3, doc="size of the random perturbation of the saddle"),
        "escape_seeds": Option(4, doc="random perturbations per beta"),
        "escape_dt_factor": Option(0.5, doc="time step as this fraction of min(0.1, e^-beta)"),
        "escape_fraction": Option(
            0.99, doc="escaped at the first t with G_x(t) <= escape_fraction G_x(0)"
        ),
        # 3. random batch, mean field
        "rb_n": Option(1024, doc="tokens of the random-batch field errors and G_x runs"),
        "rb_ps": Option(
            [2, 4, 8, 16, 32, 64, 128, 256], doc="batch sizes p of the random-batch field error"
        ),
        "rb_draws": Option(4, doc="random batches drawn per p for the field error"),
        "rb_init_kappa": Option(
            2.0, doc="concentration of the vMF initial state of the field errors"
        ),
        "rb_gap_ps": Option([4, 16, 64], doc="batch sizes p of the random-batch G_x(t) runs"),
        "rb_gap_kappa": Option(
            1.0, doc="concentration of the vMF initial state of the G_x(t) and large-n runs"
        ),
        "rb_gap_t1": Option(4.0, doc="end time of the G_x(t) runs"),
        "rb_gap_dt": Option(0.05, doc="time step of the G_x(t) runs"),
        "large_n": Option(10**6, doc="tokens of the large random-batch run"),
        "large_p": Option(8, doc="batch size p of the large run"),
        "large_t1": Option(3.0, quick=0.4, doc="end time of the large run"),
        "large_dt": Option(0.1, doc="time step of the large run and of its reference"),
        "large_reference_n": Option(
            4096, doc="tokens of the exact reference runs (mean-field proxy)"
        ),
        "large_reference_runs": Option(4, doc="exact reference runs averaged"),
        "mf_ns": Option(
            [32, 64, 128, 256, 512, 1024],
            quick=[32, 64, 128, 256],
            doc="token counts n of the mean-field distances MMD(mu_n, mu_2n)",
        ),
        "mf_times": Option(
            [0.0, 1.0, 2.0, 4.0], doc="times at which the mean-field distances are measured"
        ),
        "mf_repeats": Option(128, quick=64, doc="independent pairs of runs per n"),
        "mf_init_kappa": Option(
            4.0, doc="concentration of the vMF initial law of the mean-field runs"
        ),
        "mf_dt": Option(0.1, doc="time step of the mean-field runs"),
    },
    steps=(
        "anchor",
        "quantile",
        "learned",
        "hessian",
        "classify",
        "escape",
        "random_batch",
        "meanfield",
        "figures",
    ),
    figures=(
        "design_anchor.png",
        "design_quantile.png",
        "design_learned.png",
        "hessian.png",
        "escape.png",
        "random_batch.png",
        "meanfield.png",
    ),
)


def settings_for(quick: bool) -> dict[str, Any]:
    """All sizes, seeds and choices of the experiment (quick: smaller sweeps): ``EXPERIMENT``'s."""
    return EXPERIMENT.settings("quick" if quick else "default")


def _identity(x: Float[Array, "n d"]) -> Float[Array, "n d"]:
    return x


def _vmf_init(
    kappa: float, mean: tuple[float, float, float] = (0.0, 0.0, 1.0)
) -> Callable[[PRNGKeyArray, int], Float[Array, "m 3"]]:
    @functools.partial(jax.jit, static_argnums=1)  # one program per size (eager, one per operation)
    def sample(key: PRNGKeyArray, m: int) -> Float[Array, "m 3"]:
        return design.vmf_mixture(key, m, jnp.asarray([mean]), kappa)

    return sample


# ----------------------------------------------------------------------------
# 1. inverse design
# ----------------------------------------------------------------------------


def _anchor_experiment(S: Mapping[str, Any], key: PRNGKeyArray) -> dict[str, Any]:
    n, beta = S["anchor_n"], S["beta"]
    bw = S["mmd_bandwidth"]
    u = jnp.asarray(S["anchor_u"])
    kt, ks = jax.random.split(key)
    target = design.vmf_mixture(kt, n, jnp.asarray(S["target_means"]), S["target_kappa"])
    gauges = design.prompt_gauges(target, u)
    prompt = kernels.Prompt(beta, gauges)
    aux = jnp.arange(n)
    x_design = design.designed_configuration(prompt, u, aux)
    out = {
        "target": np.asarray(target),
        "design_energy": float(energy(prompt, x_design, aux)),
        "design_speed": float(jnp.max(jnp.linalg.norm(velocity(prompt, x_design, aux), axis=-1))),
        "design_target_error": float(jnp.max(jnp.abs(x_design - target))),
    }
    x0s = jax.jit(jax.vmap(lambda k: sphere.uniform(k, n, S["d"])))(
        jax.random.split(ks, S["anchor_seeds"])
    )
    models = {
        "anchored design": design.Anchored(prompt, u, mass=S["anchor_mass"]),
        "design, no anchor": prompt,
        "USA baseline": kernels.USA(beta),
    }
    for name, model in models.items():
        lab = None if name == "USA baseline" else aux

        def final(
            x0: Float[Array, "n d"], model: Kernel = model, lab: Array | None = lab
        ) -> Float[Array, "n d"]:
            tr = simulate(
                model,
                x0,
                lab,
                t1=S["anchor_t1"],
                dt=S["dt"],
                save_states=False,
                observables={"x": _identity},
            )
            return tr.observables["x"][-1]

        xf = jax.jit(jax.vmap(final))(x0s)
        out[name] = {
            "final": np.asarray(xf),
            "mmd": np.asarray(jax.jit(jax.vmap(lambda x: metrics.mmd(x, target, bw)))(xf)),
        }
    return out


def _quantile_experiment(S: Mapping[str, Any]) -> dict[str, Any]:
    beta = S["beta"]
    a1, a2 = 1.0, 4.0

    def density(a: ArrayLike) -> Array:
        return jnp.exp(2 * jnp.cos(a - a1)) + 0.5 * jnp.exp(4 * jnp.cos(a - a2))

    Q = design.quantile_from_density(density)
    phi = design.quantile_phase(Q)
    kernel = kernels.PhaseField(beta, phi)
    n = S["quantile_n"]
    s = kernels.positions(n)
    u = sphere.normalize(jnp.asarray(S["quantile_u"]))
    x = design.designed_configuration(kernel, u, s)
    ang = np.sort(np.asarray(design.orbit_angles(x, u)))
    grid = np.linspace(0, 2 * np.pi, 4097)
    mids = 0.5 * (grid[1:] + grid[:-1])
    rho = np.asarray(density(jnp.asarray(mids)), np.float64)
    cdf = np.concatenate([[0.0], np.cumsum(rho)]) / rho.sum()
    F = np.interp(ang, grid, cdf)
    emp_hi = np.arange(1, n + 1) / n
    ks = float(max(np.max(emp_hi - F), np.max(F - (emp_hi - 1.0 / n))))
    return {
        "angles": ang,
        "grid": mids,
        "density": rho / (rho.sum() * (grid[1] - grid[0])),
        "ks": ks,
        "energy": float(energy(kernel, x, s)),
        "speed": float(jnp.max(jnp.linalg.norm(velocity(kernel, x, s), axis=-1))),
        "on_orbit": float(jnp.max(jnp.abs(x[:, 2] - u[2]))),
    }


def _learned_experiment(
    S: Mapping[str, Any], key: PRNGKeyArray, quiet: bool
) -> dict[str, dict[str, Any]]:
    n, m = S["learned_n"], S["learned_target_samples"]
    bw = S["mmd_bandwidth"]
    u = jnp.asarray(S["anchor_u"])
    kc, kv, kf, ks = jax.random.split(key, 4)
    targets = {
        "seam curve": design.seam_curve(jax.random.uniform(kc, (m,)) * 2 * np.pi, S["seam_b"]),
        "vMF mixture": design.vmf_mixture(kv, m, jnp.asarray(S["target_means"]), S["target_kappa"]),
    }
    s = kernels.positions(n)
    aux = jnp.arange(n)
    x0s = jax.jit(jax.vmap(lambda k: sphere.uniform(k, n, S["d"])))(
        jax.random.split(ks, S["learned_seeds"])
    )
    out = {}
    for name, target in tqdm(targets.items(), desc="learned design", disable=quiet, leave=False):
        theta, losses = design.fit_curve(
            kf,
            target,
            num_modes=S["learned_modes"],
            n=n,
            steps=S["learned_steps"],
            learning_rate=S["learned_lr"],
            bandwidth=S["learned_bandwidth"],
        )
        fitted = design.curve_points(theta, s)
        model = design.Anchored(
            kernels.Prompt(S["beta"], design.curve_gauges(theta, s, u)), u, mass=S["anchor_mass"]
        )

        def final(x0: Float[Array, "n d"], model: Kernel = model) -> Float[Array, "n d"]:
            tr = simulate(
                model,
                x0,
                aux,
                t1=S["learned_t1"],
                dt=S["dt"],
                save_states=False,
                observables={"x": _identity},
            )
            return tr.observables["x"][-1]

        xf = jax.jit(jax.vmap(final))(x0s)
        sim = np.asarray(jax.jit(jax.vmap(lambda x, target=target: metrics.mmd(x, target, bw)))(xf))
        # floor: an independent n-sample of the target against the m target samples
        floor = float(metrics.mmd(target[jax.random.permutation(kf, m)[:n]], target, bw))
        init = float(
            metrics.mmd(
                design.curve_points(design.init_curve(kf, S["learned_modes"]), s), target, bw
            )
        )
        out[name] = {
            "target": np.asarray(target),
            "fitted": np.asarray(fitted),
            "final": np.asarray(xf[0]),
            "losses": np.asarray(losses),
            "fitted_mmd": float(metrics.mmd(fitted, target, bw)),
            "simulated_mmd": sim,
            "sample_floor_mmd": floor,
            "init_mmd": init,
        }
    return out


# ----------------------------------------------------------------------------
# 2. stability
# ----------------------------------------------------------------------------


def _hessian_experiment(S: Mapping[str, Any]) -> dict[str, Any]:
    n, d, beta = S["hessian_n"], S["d"], S["beta"]
    with jax.enable_x64(True):
        usa = kernels.USA(beta)
        xc = analysis.cluster_state(n, 1, d, jnp.float64)
        lam_c = np.asarray(analysis.growth_rates(usa, xc)) / n
        xa = analysis.cluster_state(n, 2, d, jnp.float64)
        lam_a = np.asarray(analysis.growth_rates(usa, xa)) / n
        cls_c = analysis.classify_state(usa, xc)
        cls_a = analysis.classify_state(usa, xa)
    scale = np.max(np.abs(lam_c))
    zero_c = int(np.sum(np.abs(lam_c) <= 1e-6 * scale))
    nonzero = lam_c[np.abs(lam_c) > 1e-6 * scale]
    return {
        "collapsed": lam_c,
        "antipodal": lam_a,
        "zero_modes": zero_c,
        "eigenvalue": float(np.mean(nonzero)),
        "eigenvalue_spread": float(np.ptp(nonzero)),
        "classify_collapsed": cls_c,
        "classify_antipodal": cls_a,
        "antipodal_theory": analysis.antipodal_spectrum(beta, n, d),
        "saddle_eigenvalue": float(lam_a[-1]),
    }


def _classify_experiment(S: Mapping[str, Any], key: PRNGKeyArray) -> dict[str, list[Any]]:
    n, d = S["classify_n"], S["d"]
    x0s = jax.jit(jax.vmap(lambda k: sphere.uniform(k, n, d)))(
        jax.random.split(key, S["classify_seeds"])
    )
    runs = {
        f"USA beta={S['beta']:g}, t={S['classify_t1_small_beta']:g}": (
            kernels.USA(S["beta"]),
            S["classify_t1_small_beta"],
        ),
        f"USA beta={S['classify_beta_large']:g} (rescaled), s={S['classify_t1_large_beta_rescaled']:g}": (
            kernels.USA(S["classify_beta_large"], rescaled=True),
            S["classify_t1_large_beta_rescaled"],
        ),
    }
    out = {}
    for name, (kern, t1) in runs.items():
        xf = jax.jit(
            jax.vmap(
                lambda x0, kern=kern, t1=t1: simulate(
                    kern, x0, t1=t1, dt=0.1, save_states=False, observables={"x": _identity}
                ).observables["x"][-1]
            )
        )(x0s)
        rows = []
        with jax.enable_x64(True):
            kern64 = type(kern)(kern.beta, rescaled=kern.rescaled)
            for x in np.asarray(xf, np.float64):
                xx = sphere.normalize(jnp.asarray(x))
                r = analysis.classify_state(kern64, xx, rtol=S["classify_rtol"])
                r["spectrum"] = np.asarray(analysis.growth_rates(kern64, xx))
                rows.append(r)
        out[name] = rows
    return out


def _escape_experiment(S: Mapping[str, Any], key: PRNGKeyArray) -> dict[str, Any]:
    n, d = S["escape_n"], S["d"]
    rows = []
    for beta in S["escape_betas"]:
        usa = kernels.USA(beta)
        xa = analysis.cluster_state(n, 2, d)
        with jax.enable_x64(True):
            rate = float(
                analysis.growth_rates(
                    kernels.USA(beta), analysis.cluster_state(n, 2, d, jnp.float64)
                )[-1]
            )
        dt = S["escape_dt_factor"] * min(0.1, float(np.exp(-beta)))
        # common random numbers: the same perturbations at every beta, so the slope sees only beta
        keys = jax.random.split(key, S["escape_seeds"])
        x0s = jax.jit(
            jax.vmap(
                lambda k, xa=xa: sphere.normalize(
                    xa + S["escape_delta0"] * jax.random.normal(k, xa.shape)
                )
            )
        )(keys)
        t_max = 50.0 / rate
        ts = np.asarray(
            jax.jit(
                jax.vmap(
                    lambda x0, usa=usa, dt=dt, t_max=t_max: analysis.escape_time(
                        usa, x0, dt=dt, t_max=t_max, fraction=S["escape_fraction"]
                    )
                )
            )(x0s)
        )
        rows.append(
            {"beta": beta, "rate": rate, "rate_theory": float(np.exp(-beta)), "times": ts, "dt": dt}
        )
    inv = np.array([1.0 / r["rate"] for r in rows])
    tm = np.array([np.mean(r["times"]) for r in rows])
    slope = float(np.polyfit(np.log(inv), np.log(tm), 1)[0])
    prod = tm / inv
    return {"rows": rows, "slope": slope, "products": prod}


# ----------------------------------------------------------------------------
# 3. random batch and the mean-field limit
# ----------------------------------------------------------------------------


def _random_batch_experiment(
    S: Mapping[str, Any], key: PRNGKeyArray, quiet: bool
) -> dict[str, Any]:
    usa = kernels.USA(S["beta"])
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    n = S["rb_n"]
    x = _vmf_init(S["rb_init_kappa"])(k1, n)
    ps = S["rb_ps"]
    errs = rb.field_errors(usa, x, key=k2, ps=ps, num_draws=S["rb_draws"])
    e = errs.mean(1)
    pp = np.asarray(ps, np.float64)
    corrected = e / np.sqrt((n - pp) / (n - 2.0))
    slope, slope_se = rb.fit_rate(pp - 1.0, corrected)
    # G_x(t): exact vs random batch
    x0 = _vmf_init(S["rb_gap_kappa"])(k3, n)
    T = S["rb_gap_t1"]
    saves = 21
    ts = np.linspace(0, T, saves)
    exact = np.asarray(
        simulate(usa, x0, t1=T, dt=S["rb_gap_dt"], ts=ts, save_states=False).collapse_gap
    )
    gaps = {}
    for p in tqdm(S["rb_gap_ps"], desc="random batch G_x", disable=quiet, leave=False):
        run = rb.simulate_random_batch(
            usa, x0, key=jax.random.fold_in(k4, p), p=p, t1=T, dt=S["rb_gap_dt"], num_saves=saves
        )
        gaps[p] = np.asarray(run.collapse_gap)
    # n = 10^6 on the CPU against an exact run at the reference n (mean-field proxy)
    N, T2 = S["large_n"], S["large_t1"]
    steps = int(round(T2 / S["large_dt"]))
    xl = _vmf_init(S["rb_gap_kappa"])(k5, N)
    t0 = time.perf_counter()
    big = rb.simulate_random_batch(
        usa, xl, key=k5, p=S["large_p"], t1=T2, dt=S["large_dt"], num_saves=steps + 1
    )
    big_gap = np.asarray(jax.block_until_ready(big.collapse_gap))
    big_wall = time.perf_counter() - t0
    ref_ts = np.linspace(0, T2, steps + 1)
    xr = jax.jit(jax.vmap(lambda k: _vmf_init(S["rb_gap_kappa"])(k, S["large_reference_n"])))(
        jax.random.split(jax.random.fold_in(k5, 1), S["large_reference_runs"])
    )
    ref_all = np.asarray(
        jax.jit(
            jax.vmap(
                lambda x: (
                    simulate(
                        usa, x, t1=T2, dt=S["large_dt"], ts=ref_ts, save_states=False
                    ).collapse_gap
                )
            )
        )(xr)
    )
    ref = ref_all.mean(0)
    kap = S["rb_gap_kappa"]
    g0_theory = 1.0 - (1.0 / np.tanh(kap) - 1.0 / kap) ** 2
    return {
        "ps": ps,
        "errors": errs,
        "slope": slope,
        "slope_se": slope_se,
        "ts": ts,
        "exact": exact,
        "gaps": gaps,
        "big_ts": np.asarray(big.ts),
        "big_gap": big_gap,
        "big_wall": big_wall,
        "ref_gap": ref,
        "ref_all": ref_all,
        "g0_theory": g0_theory,
    }


def _meanfield_experiment(S: Mapping[str, Any], key: PRNGKeyArray) -> dict[str, Any]:
    usa = kernels.USA(S["beta"])
    ns = S["mf_ns"]
    D = rb.meanfield_distances(
        usa,
        _vmf_init(S["mf_init_kappa"]),
        ns,
        key=key,
        ts=S["mf_times"],
        repeats=S["mf_repeats"],
        dt=S["mf_dt"],
        bandwidth=S["mmd_bandwidth"],
    )
    rms = np.sqrt(np.mean(D**2, axis=2))  # (len(ns), len(ts))
    fits = [rb.fit_rate(ns, rms[:, j]) for j in range(rms.shape[1])]
    # bootstrap over repeats for the standard error of the fitted exponent
    rng = np.random.default_rng(S["seed"])
    R = D.shape[2]
    boot = []
    for _ in range(200):
        idx = rng.integers(0, R, R)
        r = np.sqrt(np.mean(D[:, :, idx] ** 2, axis=2))
        boot.append([rb.fit_rate(ns, r[:, j])[0] for j in range(r.shape[1])])
    return {
        "ns": ns,
        "times": S["mf_times"],
        "dist": D,
        "rms": rms,
        "rates": [f[0] for f in fits],
        "rate_se": np.std(np.asarray(boot), axis=0).tolist(),
    }


# ----------------------------------------------------------------------------
# figures
# ----------------------------------------------------------------------------


def _sphere_axes(fig: Any, pos: tuple[int, int, int], title: str) -> Any:
    ax = fig.add_subplot(*pos, projection="3d")
    ax.set_title(title, fontsize=8)
    uu, vv = np.mgrid[0 : 2 * np.pi : 30j, 0 : np.pi : 15j]
    ax.plot_wireframe(
        np.cos(uu) * np.sin(vv), np.sin(uu) * np.sin(vv), np.cos(vv), color="0.85", lw=0.3
    )
    ax.set_box_aspect((1, 1, 1))
    ax.set_axis_off()
    return ax


def _figures(out: Path, R: Mapping[str, Any], S: Mapping[str, Any]) -> list[str]:
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from .. import plotting

    files = []
    A = R["anchor"]
    fig = plt.figure(figsize=(13, 3.6))
    names = ["anchored design", "design, no anchor", "USA baseline"]
    for i, name in enumerate(names):
        ax = _sphere_axes(fig, (1, 4, i + 1), f"{name} (seed 0)")
        ax.scatter(*A["target"].T, s=14, c="C3", alpha=0.5, label="target")
        ax.scatter(*A[name]["final"][0].T, s=5, c="k", label="final")
        if i == 0:
            ax.legend(fontsize=7, loc="upper left")
    ax = fig.add_subplot(1, 4, 4)
    ax.boxplot([A[nm]["mmd"] for nm in names])
    ax.set_xticks([1, 2, 3], ["anchored", "no anchor", "USA"], fontsize=8)
    ax.set_ylabel(f"MMD to target (bandwidth {S['mmd_bandwidth']})")
    ax.set_title(f"{S['anchor_seeds']} seeds, n={S['anchor_n']}, t={S['anchor_t1']:g}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "design_anchor.png", dpi=110)
    plt.close(fig)
    files.append("design_anchor.png")

    Q = R["quantile"]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.hist(
        Q["angles"],
        bins=40,
        range=(0, 2 * np.pi),
        density=True,
        alpha=0.5,
        label=f"maximiser angles (n={S['quantile_n']})",
    )
    ax.plot(Q["grid"], Q["density"], "k", label="target density")
    ax.set_xlabel("orbit angle relative to u")
    ax.set_title(f"quantile phase field: KS = {Q['ks']:.2e}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "design_quantile.png", dpi=110)
    plt.close(fig)
    files.append("design_quantile.png")

    L = R["learned"]
    fig = plt.figure(figsize=(12, 6.5))
    for r, (name, v) in enumerate(L.items()):
        ax = _sphere_axes(fig, (2, 4, 4 * r + 1), f"{name}: target samples")
        ax.scatter(*v["target"].T, s=2, c="C3")
        ax = _sphere_axes(
            fig, (2, 4, 4 * r + 2), f"fitted maximiser p(s) (MMD {v['fitted_mmd']:.3f})"
        )
        ax.plot(*v["fitted"].T, c="C0", lw=1)
        ax = _sphere_axes(
            fig, (2, 4, 4 * r + 3), f"anchored run, seed 0 (MMD {v['simulated_mmd'][0]:.3f})"
        )
        ax.scatter(*v["final"].T, s=3, c="k")
        ax = fig.add_subplot(2, 4, 4 * r + 4)
        ax.semilogy(v["losses"])
        ax.set_xlabel("adam step")
        ax.set_ylabel(f"MMD^2 (bandwidth {S['learned_bandwidth']})")
    fig.tight_layout()
    fig.savefig(out / "design_learned.png", dpi=110)
    plt.close(fig)
    files.append("design_learned.png")

    H = R["hessian"]
    C = R["classify"]
    fig, axs = plt.subplots(1, 3, figsize=(13, 3.6))
    n = S["hessian_n"]
    axs[0].plot(n * H["collapsed"], "o", ms=3, label="collapsed")
    axs[0].plot(n * H["antipodal"], "s", ms=3, label="antipodal two-cluster")
    axs[0].axhline(-np.exp(S["beta"]), color="C0", ls=":", label="-e^beta")
    axs[0].axhline(np.exp(-S["beta"]), color="C1", ls=":", label="e^-beta")
    axs[0].set_title(f"n * eig(tangent Hessian), USA beta={S['beta']:g}, n={n}", fontsize=9)
    axs[0].legend(fontsize=7)
    for j, (name, rows) in enumerate(C.items()):
        ax = axs[1 + j]
        for r in rows:
            ax.plot(r["spectrum"], ".", ms=3)
        kinds = [r["kind"] for r in rows]
        ax.set_title(
            f"{name}\n" + ", ".join(f"{k}: {kinds.count(k)}" for k in sorted(set(kinds))),
            fontsize=8,
        )
        ax.set_ylabel("growth rates n * eig(H)")
        ax.axhline(0, color="k", lw=0.5)
    fig.tight_layout()
    fig.savefig(out / "hessian.png", dpi=110)
    plt.close(fig)
    files.append("hessian.png")

    E = R["escape"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    inv = np.array([1 / r["rate"] for r in E["rows"]])
    for r in E["rows"]:
        ax.loglog([1 / r["rate"]] * len(r["times"]), r["times"], "k.", ms=4)
    c = np.mean(E["products"])
    ax.loglog(inv, c * inv, "C0--", label=f"t = {c:.2f} / (n lambda_max)")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("1 / (n lambda_max)  (predicted e^beta)")
    ax.set_ylabel("escape time")
    ax.set_title(
        f"antipodal saddle, n={S['escape_n']}, delta0={S['escape_delta0']:g}: slope {E['slope']:.3f}",
        fontsize=8,
    )
    ax.legend(fontsize=7)
    plotting.decade_limits(ax)
    fig.tight_layout()
    fig.savefig(out / "escape.png", dpi=110)
    plt.close(fig)
    files.append("escape.png")

    B = R["random_batch"]
    fig, axs = plt.subplots(1, 3, figsize=(13, 3.6))
    ps = np.asarray(B["ps"])
    axs[0].loglog(ps, B["errors"].mean(1), "o-", label="measured")
    axs[0].loglog(
        ps,
        B["errors"].mean(1)[0] * np.sqrt((S["rb_n"] - ps) / (S["rb_n"] - 2.0) / (ps - 1.0)),
        "k:",
        label="sqrt((n-p)/((n-2)(p-1)))",
    )
    axs[0].set_xlabel("batch size p")
    axs[0].set_ylabel("||F^ - F|| / ||F||")
    axs[0].legend(fontsize=7)
    axs[0].set_title(f"field error, n={S['rb_n']}, fitted exponent {B['slope']:.3f}", fontsize=8)
    plotting.decade_limits(axs[0])
    axs[1].plot(B["ts"], B["exact"], "k", lw=2, label="exact")
    for p, g in B["gaps"].items():
        axs[1].plot(B["ts"], g, label=f"random batch p={p}")
    axs[1].set_xlabel("t")
    axs[1].set_ylabel("G_x(t)")
    axs[1].legend(fontsize=7)
    axs[2].plot(
        B["big_ts"], B["big_gap"], "o-", label=f"n=10^6, p={S['large_p']} ({B['big_wall']:.0f} s)"
    )
    axs[2].plot(
        B["big_ts"],
        B["ref_gap"],
        "k--",
        label=f"exact, n={S['large_reference_n']} (mean of {S['large_reference_runs']})",
    )
    axs[2].axhline(B["g0_theory"], color="0.6", ls=":", label="G_x(0) of the initial law")
    axs[2].set_xlabel("t")
    axs[2].set_ylabel("G_x(t)")
    axs[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "random_batch.png", dpi=110)
    plt.close(fig)
    files.append("random_batch.png")

    M = R["meanfield"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ns = np.asarray(M["ns"])
    for j, t in enumerate(M["times"]):
        ax.loglog(ns, M["rms"][:, j], "o-", label=f"t={t:g}: rate {M['rates'][j]:.3f}")
    ax.loglog(ns, M["rms"][0, 0] * (ns / ns[0]) ** -0.5, "k:", label="n^-1/2")
    ax.set_xlabel("n")
    ax.set_ylabel("rms MMD(mu_n(t), mu_2n(t))")
    ax.legend(fontsize=7)
    plotting.decade_limits(ax)
    fig.tight_layout()
    fig.savefig(out / "meanfield.png", dpi=110)
    plt.close(fig)
    files.append("meanfield.png")
    return files


# ----------------------------------------------------------------------------
# run
# ----------------------------------------------------------------------------


def run(
    out_dir: str | os.PathLike[str],
    *,
    quick: bool = False,
    full: bool = False,
    quiet: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the design/stability/large-n experiment; write ``out_dir/design/``; return the summary.

    ``options`` override entries of ``EXPERIMENT.options`` (unknown names raise ``ValueError``);
    ``full`` runs the default sizes.
    """
    S = EXPERIMENT.settings(EXPERIMENT.mode(quick=quick, full=full), **options)
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    key = jax.random.key(S["seed"])
    keys = dict(
        zip(
            ["anchor", "learned", "classify", "escape", "rb", "mf"],
            jax.random.split(key, 6),
            strict=True,
        )
    )
    steps = EXPERIMENT.start(quiet=quiet)
    timings = steps.timings
    R: dict = {}
    t_all = time.perf_counter()
    parts = {
        "anchor": lambda: _anchor_experiment(S, keys["anchor"]),
        "quantile": lambda: _quantile_experiment(S),
        "learned": lambda: _learned_experiment(S, keys["learned"], quiet),
        "hessian": lambda: _hessian_experiment(S),
        "classify": lambda: _classify_experiment(S, keys["classify"]),
        "escape": lambda: _escape_experiment(S, keys["escape"]),
        "random_batch": lambda: _random_batch_experiment(S, keys["rb"], quiet),
        "meanfield": lambda: _meanfield_experiment(S, keys["mf"]),
    }
    for name, fn in parts.items():
        with steps(name):
            R[name] = fn()

    beta, n_h, d = S["beta"], S["hessian_n"], S["d"]
    A, Q, L, H, C, E, B, M = (
        R[k]
        for k in [
            "anchor",
            "quantile",
            "learned",
            "hessian",
            "classify",
            "escape",
            "random_batch",
            "meanfield",
        ]
    )
    emax = float(np.exp(beta) / (2 * beta))
    small = list(C.values())[0]
    large = list(C.values())[1]
    checks = [
        check(
            "designed_law_distance",
            float(np.mean(A["anchored design"]["mmd"])),
            0.0,
            1e-2,
            f"MMD (bandwidth {S['mmd_bandwidth']}) of the final marginal to the target, mean over "
            f"{S['anchor_seeds']} random initial states: Prompt gauges from prompt_gauges (one per token, "
            f"targets = {S['anchor_n']} samples of a vMF mixture, Thm. 4 iii) plus a frozen anchor of mass "
            f"{S['anchor_mass']} at u in the gauge frame (design.Anchored), t = {S['anchor_t1']:g}",
        ),
        check(
            "baseline_law_distance",
            float(np.mean(A["USA baseline"]["mmd"])),
            None,
            note="undesigned USA from the same initial states (collapses to one random point); "
            "pass: larger than the designed distance",
            passed=lambda m: m > 10 * np.mean(A["anchored design"]["mmd"]) + 1e-3,
        ),
        check(
            "unanchored_law_distance",
            float(np.mean(A["design, no anchor"]["mmd"])),
            None,
            note="the same design without anchor: the gauge frame collapses to a random u', realising "
            "Psi^T u' != target; pass: the anchor is needed (distance > 0.05)",
            passed=lambda m: m > 0.05,
        ),
        check(
            "designed_max_energy",
            A["design_energy"],
            emax,
            1e-5,
            "energy of x = Psi^T u for the designed Prompt kernel vs e^beta / (2 beta)",
            relative=True,
        ),
        check(
            "designed_velocity",
            A["design_speed"],
            0.0,
            1e-5,
            "max tangent speed at the designed configuration (a critical point)",
        ),
        check(
            "quantile_ks",
            Q["ks"],
            0.0,
            1.0 / S["quantile_n"] + 1e-3,
            f"Kolmogorov distance between the orbit angles of the quantile phase field's maximiser at "
            f"s_i = i/n and the target law ({S['quantile_density']}); inverse-CDF at a grid: <= 1/n",
        ),
        check(
            "quantile_max_energy",
            Q["energy"],
            emax,
            1e-5,
            "energy of the quantile design's maximiser",
            relative=True,
        ),
    ]
    for name, v in L.items():
        tag = name.split()[0].lower()
        checks.append(
            check(
                f"learned_{tag}_fit_distance",
                v["fitted_mmd"],
                None,
                note=f"MMD (bandwidth {S['mmd_bandwidth']}) of the fitted maximiser p_theta(s_i) "
                f"to {S['learned_target_samples']} target samples ({name}); init "
                f"{v['init_mmd']:.3f}, sampling floor of an n-sample {v['sample_floor_mmd']:.3f}; "
                f"pass: < init / 3",
                passed=cast("Callable[[float], bool]", lambda m, v=v: m < v["init_mmd"] / 3),
            )
        )
        checks.append(
            check(
                f"learned_{tag}_simulated_distance",
                float(np.mean(v["simulated_mmd"])),
                v["fitted_mmd"],
                1e-2,
                f"mean over {S['learned_seeds']} random starts of the anchored run's final MMD; theory: "
                f"the fitted maximiser's distance (the dynamics land on it)",
            )
        )
    ath = H["antipodal_theory"]
    checks += [
        check(
            "hessian_zero_modes",
            H["zero_modes"],
            d - 1,
            0,
            f"near-zero (|lambda| <= 1e-6 max|lambda|) eigenvalues of the tangent Hessian at a collapsed USA "
            f"state, n = {n_h}, d = {d}, float64; theory d - 1 (rotations moving the point)",
        ),
        check(
            "hessian_eigenvalue",
            H["eigenvalue"],
            -np.exp(beta) / n_h,
            1e-6,
            f"mean non-zero eigenvalue at the collapsed state (spread {H['eigenvalue_spread']:.1e}); "
            f"theory -e^beta / n with multiplicity (n-1)(d-1)",
            relative=True,
        ),
        check(
            "saddle_eigenvalue",
            H["saddle_eigenvalue"],
            ath["positive"],
            1e-6,
            "largest eigenvalue at two antipodal clusters of n/2 tokens (a saddle); theory e^-beta / n "
            "(analysis.antipodal_spectrum)",
            relative=True,
        ),
        check(
            "classified_maximisers",
            float(np.mean([r["kind"] == "maximiser" for r in small])),
            1.0,
            0.0,
            f"fraction of USA runs from random states ({list(C)[0]}) classified maximiser (no positive "
            f"eigenvalue, d-1 zero modes at rtol {S['classify_rtol']})",
        ),
        check(
            "classified_metastable",
            float(np.mean([r["kind"] == "metastable" for r in large])),
            None,
            note=f"fraction of runs at large beta ({list(C)[1]}) that are slowly moving multi-cluster "
            f"states (metastable); mean clusters {np.mean([r['clusters'] for r in large]):.1f}; pass: > 0.5",
            passed=lambda m: m > 0.5,
        ),
        check(
            "escape_time_exponent",
            E["slope"],
            1.0,
            0.1,
            f"slope of log(escape time) vs log(1 / (n lambda_max)) from the antipodal saddle, beta in "
            f"{S['escape_betas']}, perturbation {S['escape_delta0']:g} per coordinate, escape = first time G_x < "
            f"{S['escape_fraction']} G_x(0) (relative cluster angle ~0.2 rad, end of the linear phase); theory 1 "
            f"(t_esc = log(C/delta0) / (n lambda_max))",
        ),
        check(
            "escape_rate_product",
            float(np.mean(E["products"])),
            float(np.log(1.0 / S["escape_delta0"])),
            2.0,
            "mean of t_esc * n lambda_max; theory log(C / delta0) with C = O(1) (shown: log(1/delta0), tolerance 2)",
        ),
        check(
            "random_batch_error",
            float(B["errors"][-1].mean()),
            None,
            note=f"relative field error ||F^ - F|| / ||F|| at the largest p = {B['ps'][-1]} (n = {S['rb_n']}, "
            f"vMF(kappa={S['rb_init_kappa']}) state, mean of {S['rb_draws']} draws); pass: below the "
            f"error at the smallest p",
            passed=lambda m: m < float(B["errors"][0].mean()),
        ),
        check(
            "random_batch_exponent",
            B["slope"],
            -0.5,
            0.1,
            "fitted exponent of the error (divided by the finite-population factor sqrt((n-p)/(n-2))) "
            "against p - 1; theory -1/2",
        ),
        check(
            "random_batch_gap_error",
            float(np.max(np.abs(B["gaps"][max(B["gaps"])] - B["exact"]))),
            None,
            note=f"max_t |G_x^RB(t) - G_x(t)| at p = {max(B['gaps'])} (n = {S['rb_n']}); pass: smaller than at "
            f"p = {min(B['gaps'])} ({np.max(np.abs(B['gaps'][min(B['gaps'])] - B['exact'])):.2e})",
            passed=lambda m: m <= np.max(np.abs(B["gaps"][min(B["gaps"])] - B["exact"])),
        ),
        check(
            "large_n_initial_gap",
            float(B["big_gap"][0]),
            B["g0_theory"],
            5e-3,
            f"G_x(0) of the n = 10^6 sample of vMF(kappa={S['rb_gap_kappa']}): theory 1 - (coth k - 1/k)^2 "
            f"(SE about {0.34 / np.sqrt(S['large_n']):.0e})",
        ),
        check(
            "large_n_gap_change",
            float(B["big_gap"][-1] - B["big_gap"][0]),
            float(B["ref_gap"][-1] - B["ref_gap"][0]),
            0.01,
            f"G_x(t1) - G_x(0), t1 = {S['large_t1']:g}, of the n = 10^6 random-batch run (p = {S['large_p']}, "
            f"{B['big_wall']:.1f} s on the CPU, O(n p) per step) vs the mean of {S['large_reference_runs']} exact runs "
            f"with n = {S['large_reference_n']} (mean-field proxy; their spread "
            f"{np.std(B['ref_all'][:, -1] - B['ref_all'][:, 0]):.1e})",
        ),
        check(
            "meanfield_rate",
            M["rates"][-1],
            -0.5,
            0.15,
            f"fitted exponent of rms MMD(mu_n(t), mu_2n(t)) vs n at t = {M['times'][-1]:g} (n in {M['ns']}, "
            f"{S['mf_repeats']} repeats, vMF(kappa={S['mf_init_kappa']}) initial law, USA beta={beta:g}); "
            f"bootstrap SE {M['rate_se'][-1]:.3f}; all times: {np.round(M['rates'], 3).tolist()}; theory -1/2 "
            f"(Dobrushin, App. D.4)",
        ),
    ]
    timings["total"] = round(time.perf_counter() - t_all, 3)
    with steps("figures"):
        figures = _figures(out, R, S)
    steps.close()
    np.savez(
        out / "data.npz",
        anchor_mmd=np.stack(
            [A[k]["mmd"] for k in ["anchored design", "design, no anchor", "USA baseline"]]
        ),
        quantile_angles=Q["angles"],
        hessian_collapsed=H["collapsed"],
        hessian_antipodal=H["antipodal"],
        escape_rates=np.array([r["rate"] for r in E["rows"]]),
        escape_times=np.stack([r["times"] for r in E["rows"]]),
        rb_ps=np.asarray(B["ps"]),
        rb_errors=B["errors"],
        rb_ts=B["ts"],
        rb_exact=B["exact"],
        rb_gaps=np.stack([B["gaps"][p] for p in S["rb_gap_ps"]]),
        big_ts=B["big_ts"],
        big_gap=B["big_gap"],
        mf_ns=np.asarray(M["ns"]),
        mf_times=np.asarray(M["times"]),
        mf_dist=M["dist"],
        **{f"learned_{k.split()[0].lower()}_fitted": v["fitted"] for k, v in L.items()},
    )
    S_out = dict(S)
    S_out["classification"] = {
        k: [{kk: vv for kk, vv in r.items() if kk != "spectrum"} for r in rows]
        for k, rows in C.items()
    }
    return write_summary(
        out, _NAME, quick=quick, settings=S_out, checks=checks, timings=timings, figures=figures
    )
