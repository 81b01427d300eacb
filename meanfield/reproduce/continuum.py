r"""Reproduce the mean-field limit (docs/math/continuum.md): the dispersion relation of the uniform law,
measured from the density solver and from particles, the metastable cluster count it predicts,
and the particles' convergence to the density (``meanfield reproduce continuum``).

Checks (``summary.json``, the common schema):

* ``dispersion_relation``: growth rates of the modes 1..6 measured from the density solver
  (``mf.continuum.solve``, float64, a mode perturbation $\varepsilon = 10^{-5}$ of the uniform law) against
  ``mf.continuum.growth_rates``; $d = 2$ and 3, $\beta \in \{1, 4, 9\}$; max relative error.
* ``particle_dispersion``: the same rates from particle simulations (``mf.simulate`` with
  ``mf.kernels.make("usa", ..., rescaled=True)``; ``n >= 2000`` on a quasi-uniform lattice displaced
  by a mode perturbation $\varepsilon = 3 \cdot 10^{-2}$; the amplitude of the mode fitted log-linearly in time).
* ``cluster_count``: from i.i.d. uniform starts on the circle (``n = 1000``, several seeds), the
  number of clusters at the first plateau against ``mf.continuum.most_unstable_mode``, per $\beta$.
  The collapse gap $G_x$ is $\approx 1$ for $k \ge 2$ evenly spread clusters on the circle, so the
  plateau is detected on the cluster count itself: the first time after the fragmentation peak
  from which the count stays constant over ``plateau_saves`` consecutive save times (a factor
  $\approx 1.5$ in time); clusters are arcs separated by gaps ``> cluster_gap_rad``.
* ``particle_to_density``: $W_1$ on the circle (``mf.continuum.w1_circle``) between the particles
  (i.i.d. from the initial density) and the density solution at a fixed time before resolution
  loss, for $n$ over a decade and a half; the fitted exponent against $-1/2$.
* ``mass_and_positivity``: mass drift and minimum density over the nonlinear runs ($d = 2$ and 3,
  until resolution loss).

Figures: ``growth_rates.png`` (rate against mode, theory line, solver and particle points, one
panel per d), ``circle_density.png`` (the circle density over time as a heatmap, the particle
histogram beside it), ``cluster_count.png`` (cluster count against $\beta$ with the predicted curve).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Float, Int, Key, PRNGKeyArray

from .. import continuum, kernels, sphere
from ..integrate import simulate
from ..models import Model
from ._common import Experiment, Option, check, write_summary

__all__ = ["EXPERIMENT", "run", "settings_for"]

_NAME = "continuum"


#: The experiment's options (quick: the sizes that run in a few minutes on 2 CPU cores) and steps.
EXPERIMENT = Experiment(
    _NAME,
    {
        "betas": Option(
            [1.0, 4.0, 9.0], doc="inverse temperatures beta of the dispersion relation"
        ),
        "modes": Option([1, 2, 3, 4, 5, 6], doc="modes l whose growth rates are measured"),
        "solver_resolution": Option(
            {"2": 16, "3": 12},
            doc="density-solver resolution L per dimension d ('2': circle, '3': S^2)",
        ),
        "solver_eps": Option(
            1e-5, doc="size of the mode perturbation of the uniform density (solver rates)"
        ),
        "particle_n": Option(
            {"2": 5040, "3": 8000},
            quick={"2": 2520, "3": 2000},
            doc="particles per dimension d of the particle rates",
        ),
        "particle_eps": Option(3e-2, doc="size of the mode perturbation of the particle lattice"),
        "particle_saves": Option(
            11, doc="save times of each particle run (over the horizon 2/lambda_max)"
        ),
        "particle_steps": Option(80, doc="RK4 steps of each particle run"),
        "cluster_betas": Option(
            [4.0, 9.0, 16.0, 25.0, 36.0],
            quick=[4.0, 9.0, 16.0, 25.0],
            doc="inverse temperatures beta of the cluster-count runs",
        ),
        "cluster_n": Option(
            2000, quick=1000, doc="particles on the circle of each cluster-count run"
        ),
        "cluster_seeds": Option(
            12, quick=6, doc="random initial states per beta of the cluster count"
        ),
        "cluster_s1": Option(300.0, doc="end time (rescaled) of the cluster-count runs"),
        "cluster_saves": Option(
            48, doc="save times of the cluster-count runs (0, then log-spaced from 1)"
        ),
        "cluster_dt": Option(0.25, doc="time step of the cluster-count runs"),
        "cluster_gap_rad": Option(0.1, doc="angular gap (radians) that separates two clusters"),
        "cluster_min_fraction": Option(
            0.01, doc="fraction of the particles a cluster must hold (at least 3)"
        ),
        "plateau_saves": Option(
            4, doc="consecutive saves of constant cluster count that make a plateau"
        ),
        "w1_beta": Option(4.0, doc="inverse temperature beta of the particles-to-density check"),
        "w1_mode": Option(2, doc="mode l of the initial density perturbation"),
        "w1_eps": Option(0.3, doc="size of the initial density perturbation"),
        "w1_time": Option(
            0.15, doc="time at which particles and density are compared (before resolution loss)"
        ),
        "w1_resolution": Option(
            64, doc="density-solver resolution of the particles-to-density check"
        ),
        "w1_n": Option(
            [100, 316, 1000, 3162, 10000],
            quick=[100, 316, 1000, 3162],
            doc="particle counts n of the W_1 convergence fit",
        ),
        "w1_seeds": Option(32, quick=12, doc="independent particle systems per n"),
        "w1_dt": Option(5e-3, doc="time step of the particle runs of the W_1 check"),
        "heatmap_t1": Option(0.3, doc="end time of the circle-density heatmap run"),
        "sphere_resolution": Option(
            16, doc="density-solver resolution of the S^2 run (mass and positivity)"
        ),
        "seed": Option(0, doc="seed of the experiment's random keys"),
        "tolerances": Option(
            {
                "dispersion_relation": 1e-3,
                "particle_dispersion": 5e-2,
                "cluster_count": 1.0,
                "particle_to_density": 0.1,
                "mass_drift": 1e-5,
            },
            doc="pass tolerances of the checks, by check name",
        ),
    },
    steps=(
        "dispersion_relation",
        "particle_dispersion",
        "cluster_count",
        "particle_to_density",
        "mass_and_positivity",
        "figures",
    ),
    timings_suffix="_s",
    figures=(
        "growth_rates.png",
        "circle_density.png",
        "cluster_count.png",
    ),
)


def settings_for(quick: bool) -> dict[str, Any]:
    """Settings of the reproduction (quick: the sizes that run in a few minutes on 2 CPU cores):
    ``EXPERIMENT``'s."""
    return EXPERIMENT.settings("quick" if quick else "default")


# --------------------------------------------------------------------------- measurements


def _solver_rates(S: Mapping[str, Any]) -> dict[tuple[int, float], Float[np.ndarray, " m"]]:
    """Linear-regime rates from the density solver (float64), per (d, beta): arrays over modes.

    Per d four compiled programs serve the 18 (beta, mode) runs: ``solve`` (``beta`` and ``t1``
    are traced arguments of its program), the initial density and the log-ratio of the mode
    amplitudes (the mode a traced argument of both), and the theory rates that set the windows."""
    out: dict[tuple[int, float], Float[np.ndarray, " m"]] = {}
    modes = np.asarray(S["modes"])
    with jax.enable_x64(True):
        for d in (2, 3):
            g = continuum.grid(d, S["solver_resolution"][str(d)], dtype=jnp.float64)
            # the theory rates that set the windows, (beta, mode): one program (and host callback) per d
            lam_all = np.asarray(
                jax.jit(lambda b, d=d: continuum.growth_rates(b[:, None], d, modes))(
                    np.asarray(S["betas"], np.float64)
                )
            )
            start = jax.jit(lambda ell, g=g: continuum.mode_perturbation(g, ell, S["solver_eps"]))
            log_growth = jax.jit(
                lambda dens, ell, d=d: jnp.log(
                    continuum.mode_amplitude(dens[1], d, ell)
                    / continuum.mode_amplitude(dens[0], d, ell)
                )
            )
            for beta, lam in zip(S["betas"], lam_all):
                rates = []
                for ell, rate in zip(S["modes"], lam):
                    # a window where the mode grows measurably and no other mode (seeded by
                    # rounding) reaches it: at most 1/lambda_l and 2/lambda_max
                    t1 = min(1.0 / rate, 2.0 / lam.max())
                    # tight tolerances: the perturbation is 1e-5 of the state's norm
                    sol = continuum.solve(
                        np.float64(beta), start(np.int32(ell)), d=d, t1=t1, rtol=1e-11, atol=1e-16
                    )
                    rates.append(float(log_growth(sol.densities, np.int32(ell))) / t1)
                out[(d, beta)] = np.array(rates)
    return out


def _mode_amplitudes(x: Float[Array, "n d"], d: int, modes: Sequence[int]) -> Float[Array, " m"]:
    """Amplitude of each mode of an ``(n, d)`` configuration: ``2 |mean e^{i l theta}|`` on the
    circle, ``(2 l + 1) |mean P_l(x_3)|`` on S^2 (both ``|eps|`` for ``sample_perturbation``)."""
    if d == 2:
        th = jnp.arctan2(x[:, 1], x[:, 0])
        return jnp.stack([2 * jnp.abs(jnp.mean(jnp.exp(1j * l * th))) for l in modes])
    return jnp.stack(
        [(2 * l + 1) * jnp.abs(jnp.mean(continuum._legendre(l, x[:, 2]))) for l in modes]
    )


def _particle_rates(
    S: Mapping[str, Any], theory: Mapping[tuple[int, float], np.ndarray]
) -> dict[tuple[int, float], Float[np.ndarray, " m"]]:
    """Linear-regime rates from particle simulations: per d one compilation, the modes a vmapped
    axis of systems, the horizon ``2 / lambda_max`` (the fastest mode grows by ``e^2``; a slow
    mode by less). ``eps = 3e-2`` balances the float32 rounding of the amplitude, whose effect on
    a slow mode's rate goes as ``1 / eps``, against the nonlinear terms, ``~ eps``.

    ``simulate`` is vmapped outside ``jit``: its compiled program takes the model (``beta``), the
    save times and ``t1`` as arguments, so the three betas of a d share it (an outer ``jit`` would
    fold them in as constants and compile once per beta); the observable is one function per d."""
    out: dict[tuple[int, float], Float[np.ndarray, " m"]] = {}
    modes = S["modes"]
    for d in (2, 3):
        n = S["particle_n"][str(d)]
        starts = jax.jit(
            lambda eps, n=n, d=d: jnp.stack(
                [continuum.sample_perturbation(None, n, d, l, eps, lattice=True) for l in modes]
            )
        )
        x0 = starts(S["particle_eps"])
        amplitudes = functools.partial(_mode_amplitudes, d=d, modes=tuple(modes))
        for beta in S["betas"]:
            t1 = 2.0 / float(theory[(d, beta)].max())
            ts = np.linspace(0.0, t1, S["particle_saves"])
            model = kernels.make("usa", d=d, beta=beta)

            def one(
                x: Float[Array, "n d"],
                model: Model = model,
                t1: float = t1,
                ts: np.ndarray = ts,
                amplitudes: Callable[[Array], Array] = amplitudes,
            ) -> Float[Array, "t m"]:
                tr = simulate(
                    model,
                    x,
                    t1=t1,
                    dt=t1 / S["particle_steps"],
                    solver="rk4",
                    ts=ts,
                    save_states=False,
                    observables={"a": amplitudes},
                )
                return tr.observables["a"]

            amps = np.asarray(jax.vmap(one)(x0))  # (mode of the start, time, mode measured)
            out[(d, beta)] = np.array(
                [np.polyfit(ts, np.log(amps[j, :, j]), 1)[0] for j in range(len(modes))]
            )
    return out


def _count_clusters_circle(x: Float[np.ndarray, "n 2"], gap: float, min_fraction: float) -> int:
    """Arcs of particles separated by angular gaps larger than ``gap`` that hold at least
    ``max(3, min_fraction n)`` particles (stragglers between clusters are not clusters)."""
    th = np.sort(np.mod(np.arctan2(x[:, 1], x[:, 0]), 2 * np.pi))
    gaps = np.diff(np.concatenate([th, th[:1] + 2 * np.pi]))
    cut = np.nonzero(gaps > gap)[0]
    if len(cut) == 0:
        return 1
    sizes = np.diff(np.concatenate([cut, [cut[0] + len(th)]]))
    return max(1, int(np.sum(sizes >= max(3, min_fraction * len(th)))))


def _first_plateau(counts: Int[np.ndarray, " t"], width: int) -> tuple[int, int]:
    """Index and value of the first plateau after the fragmentation peak: the first index from
    which the count is constant over ``width`` consecutive saves (the last value otherwise)."""
    peak = int(np.argmax(counts))
    for i in range(peak, len(counts) - width + 1):
        if np.all(counts[i : i + width] == counts[i]):
            return i, int(counts[i])
    return len(counts) - 1, int(counts[-1])


def _cluster_counts(S: Mapping[str, Any], key: PRNGKeyArray) -> dict[float, dict[str, Any]]:
    n, seeds = S["cluster_n"], S["cluster_seeds"]
    ts = np.concatenate([[0.0], np.geomspace(1.0, S["cluster_s1"], S["cluster_saves"] - 1)])

    @jax.jit
    def run(beta: Float[Array, ""], keys: Key[Array, " seeds"]) -> Float[Array, "seeds t n 2"]:
        def one(k: PRNGKeyArray) -> Float[Array, "t n 2"]:
            x0 = sphere.uniform(k, n, 2)
            model = kernels.make("usa", d=2, beta=beta, rescaled=True)
            xs = simulate(model, x0, t1=S["cluster_s1"], dt=S["cluster_dt"], solver="rk2", ts=ts).xs
            assert xs is not None  # states saved (the default)
            return xs

        return jax.vmap(one)(keys)

    out: dict[float, dict[str, Any]] = {}
    for beta in S["cluster_betas"]:
        xs = np.asarray(
            run(
                jnp.float32(beta), jax.random.split(jax.random.fold_in(key, int(beta * 100)), seeds)
            )
        )
        counts = np.array(
            [
                [
                    _count_clusters_circle(
                        xs[s, i], S["cluster_gap_rad"], S["cluster_min_fraction"]
                    )
                    for i in range(len(ts))
                ]
                for s in range(seeds)
            ]
        )
        plateau = [_first_plateau(c, S["plateau_saves"]) for c in counts]
        out[beta] = {
            "counts": counts,
            "plateau_time": [float(ts[i]) for i, _ in plateau],
            "plateau_count": [v for _, v in plateau],
            "predicted": int(continuum.most_unstable_mode(beta, 2)),
            "x_plateau": xs[0, plateau[0][0]],
        }
    return out


def _particles_vs_density(S: Mapping[str, Any], key: PRNGKeyArray) -> dict[str, Any]:
    """The circle density (float64: the float32 rounding floor of the spectral tail would stop a
    long run early) against i.i.d. particles (float32) drawn from the same initial density."""
    d, beta, ell, eps = 2, S["w1_beta"], S["w1_mode"], S["w1_eps"]
    with jax.enable_x64(True):
        g = continuum.grid(d, S["w1_resolution"], dtype=jnp.float64)
        rho0 = continuum.mode_perturbation(g, ell, eps)
        ts = np.linspace(0.0, S["heatmap_t1"], 61)
        sol = continuum.solve(np.float64(beta), rho0, d=d, t1=S["heatmap_t1"], ts=ts)
        # as many save times as sol: the same compiled program (the last one is t1 itself)
        ref = continuum.solve(
            np.float64(beta), rho0, d=d, t1=S["w1_time"], ts=np.linspace(0.0, S["w1_time"], len(ts))
        )
        if int(ref.status) != continuum.OK:
            raise RuntimeError(
                f"the density solution lost resolution before t = {S['w1_time']}: {ref.status_name()}"
            )
        run_info = {
            k: np.asarray(getattr(sol, k))
            for k in ("ts", "densities", "mass", "min_density", "tail", "status", "t_stop")
        }
        theta = np.asarray(g.theta)
        dens_np = np.asarray(ref.densities[-1])
    dens_t = jnp.asarray(dens_np, jnp.float32)
    model = kernels.make("usa", d=d, beta=beta)
    w1: dict[int, np.ndarray] = {}
    x_last = None
    for n in S["w1_n"]:
        keys = jax.random.split(jax.random.fold_in(key, n), S["w1_seeds"])

        @jax.jit
        def run(
            keys: Key[Array, " seeds"], n: int = n
        ) -> tuple[Float[Array, " seeds"], Float[Array, "seeds n 2"]]:
            def one(k: PRNGKeyArray) -> tuple[Float[Array, ""], Float[Array, "n 2"]]:
                x0 = continuum.sample_perturbation(k, n, d, ell, eps)
                xs = simulate(model, x0, t1=S["w1_time"], dt=S["w1_dt"], solver="rk4").xs
                assert xs is not None  # states saved (the default)
                x1 = xs[-1]
                return continuum.w1_circle(x1, dens_t), x1

            return jax.vmap(one)(keys)

        dist, xs = run(keys)
        w1[n] = np.asarray(dist)
        x_last = np.asarray(xs[0])
    ns = np.array(S["w1_n"], float)
    means = np.array([w1[n].mean() for n in S["w1_n"]])
    slope = float(np.polyfit(np.log(ns), np.log(means), 1)[0])
    return {
        "solution": run_info,
        "density_t": dens_np,
        "theta": theta,
        "w1": w1,
        "means": means,
        "slope": slope,
        "x_last": x_last,
    }


def _sphere_run(S: Mapping[str, Any]) -> continuum.Solution:
    g = continuum.grid(3, S["sphere_resolution"])
    ts = np.linspace(0.0, 2.0, 41)
    # the initial density in one program (eps a traced argument) instead of one per operation
    rho0 = jax.jit(lambda eps: continuum.mode_perturbation(g, 2, eps))(0.2)
    return continuum.solve(4.0, rho0, d=3, t1=2.0, ts=ts)


# --------------------------------------------------------------------------- run


def run(
    out_dir: str | os.PathLike[str],
    *,
    quick: bool = False,
    full: bool = False,
    quiet: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the mean-field-limit reproduction; write figures, data and ``summary.json``; return the summary.

    ``options`` override entries of ``EXPERIMENT.options`` (an unknown name raises ``ValueError``);
    ``full`` runs the default sizes."""
    S = EXPERIMENT.settings(EXPERIMENT.mode(quick=quick, full=full), **options)
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    tol = S["tolerances"]
    steps = EXPERIMENT.start(quiet=quiet)
    timings = steps.timings
    checks: list[dict[str, Any]] = []
    key = jax.random.key(S["seed"])
    k_cluster, k_w1 = jax.random.split(key)

    # ----------------------------------------------------- dispersion relation (solver)
    with steps("dispersion_relation"):
        solver = _solver_rates(S)
    theory = {
        (d, b): np.asarray(continuum.growth_rates(b, d, np.asarray(S["modes"])))
        for d in (2, 3)
        for b in S["betas"]
    }
    errs = {k: np.abs(solver[k] / theory[k] - 1) for k in solver}
    worst = max(errs, key=lambda k: errs[k].max())
    checks.append(
        check(
            "dispersion_relation",
            max(e.max() for e in errs.values()),
            0.0,
            tol["dispersion_relation"],
            f"max relative error of the solver's linear-regime rates (modes {S['modes'][0]}..{S['modes'][-1]}, d = 2, 3, "
            f"beta in {S['betas']}, float64, eps = {S['solver_eps']:g}) against growth_rates; worst at d = {worst[0]}, "
            f"beta = {worst[1]:g}, mode {S['modes'][int(np.argmax(errs[worst]))]} (its rate is "
            f"{theory[worst][int(np.argmax(errs[worst]))] / theory[worst].max():.2g} of the fastest mode's); median "
            f"{np.median(np.concatenate(list(errs.values()))):.2g}",
        )
    )

    # ----------------------------------------------------- dispersion relation (particles)
    with steps("particle_dispersion"):
        particles = _particle_rates(S, theory)  # the horizons from theory's rates
    perrs = {k: np.abs(particles[k] / theory[k] - 1) for k in particles}
    pworst = max(perrs, key=lambda k: perrs[k].max())
    checks.append(
        check(
            "particle_dispersion",
            max(e.max() for e in perrs.values()),
            0.0,
            tol["particle_dispersion"],
            f"max relative error of particle rates (n = {S['particle_n']['2']} on the circle, {S['particle_n']['3']} on S^2, "
            f"lattice start + mode perturbation eps = {S['particle_eps']:g}, RK4, float32) against growth_rates; worst at "
            f"d = {pworst[0]}, beta = {pworst[1]:g}, mode {S['modes'][int(np.argmax(perrs[pworst]))]} "
            f"({perrs[pworst].max():.3g}; horizon 2 / lambda_max per beta: the slowest modes grow least); median "
            f"{np.median(np.concatenate(list(perrs.values()))):.2g}",
        )
    )

    # ----------------------------------------------------- cluster count
    with steps("cluster_count"):
        clusters = _cluster_counts(S, k_cluster)
    dev = {b: abs(float(np.mean(v["plateau_count"])) - v["predicted"]) for b, v in clusters.items()}
    checks.append(
        check(
            "cluster_count",
            max(dev.values()),
            0.0,
            tol["cluster_count"],
            "max over beta of |mean clusters at the first plateau - most_unstable_mode| (d = 2, n = "
            f"{S['cluster_n']}, {S['cluster_seeds']} seeds); per beta (measured / predicted): "
            + ", ".join(
                f"{b:g}: {np.mean(v['plateau_count']):.2f} / {v['predicted']}"
                for b, v in clusters.items()
            ),
        )
    )

    # ----------------------------------------------------- particles against the density
    with steps("particle_to_density"):
        pd = _particles_vs_density(S, k_w1)
    checks.append(
        check(
            "particle_to_density",
            pd["slope"],
            -0.5,
            tol["particle_to_density"],
            f"fitted exponent of mean W1(particles, density) against n in {S['w1_n']} ({S['w1_seeds']} seeds each; "
            f"circle, beta = {S['w1_beta']:g}, mode {S['w1_mode']} eps = {S['w1_eps']:g}, t = {S['w1_time']:g}); "
            "mean W1: " + ", ".join(f"{m:.3g}" for m in pd["means"]),
        )
    )

    # ----------------------------------------------------- mass and positivity
    with steps("mass_and_positivity"):
        sph = _sphere_run(S)
    drift, mins, notes = [], [], []
    sph_info = {k: np.asarray(getattr(sph, k)) for k in ("mass", "min_density", "status", "t_stop")}
    for name, sol in (("circle, float64", pd["solution"]), ("sphere, float32", sph_info)):
        m = np.asarray(sol["mass"])
        ok = np.isfinite(m)
        drift.append(float(np.max(np.abs(m[ok] - m[0]))))
        mins.append(float(np.nanmin(np.asarray(sol["min_density"]))))
        notes.append(
            f"{name}: {continuum.STATUS[int(sol['status'])]} at t = {float(sol['t_stop']):.3g}, "
            f"drift {drift[-1]:.2g}, min density {mins[-1]:.3g}"
        )
    checks.append(
        check(
            "mass_and_positivity",
            max(drift),
            0.0,
            tol["mass_drift"],
            "max |mass(t) - mass(0)| over the nonlinear runs until resolution loss (pass also needs "
            "min density > 0): " + "; ".join(notes),
            passed=max(drift) <= tol["mass_drift"] and min(mins) > 0,
        )
    )

    # ----------------------------------------------------- figures + data
    with steps("figures"):
        figures = _figures(out, S, theory, solver, particles, clusters, pd)
    arrays: dict[str, Any] = {
        "modes": np.asarray(S["modes"]),
        **{f"theory_d{d}_beta{b:g}": theory[(d, b)] for d, b in theory},
        **{f"solver_d{d}_beta{b:g}": solver[(d, b)] for d, b in solver},
        **{f"particles_d{d}_beta{b:g}": particles[(d, b)] for d, b in particles},
        **{f"cluster_counts_beta{b:g}": v["counts"] for b, v in clusters.items()},
        "heatmap": pd["solution"]["densities"],
        "heatmap_ts": pd["solution"]["ts"],
        "w1_n": np.asarray(S["w1_n"]),
        "w1_means": pd["means"],
    }
    np.savez_compressed(out / "continuum_data.npz", **arrays)
    S["cluster_plateaus"] = {
        f"{b:g}": {
            "count": v["plateau_count"],
            "time_s": v["plateau_time"],
            "predicted": v["predicted"],
        }
        for b, v in clusters.items()
    }
    S["relative_errors"] = {
        "solver": {f"d={d}/beta={b:g}": errs[(d, b)].tolist() for d, b in errs},
        "particles": {f"d={d}/beta={b:g}": perrs[(d, b)].tolist() for d, b in perrs},
    }
    steps.close()
    return write_summary(
        out, _NAME, quick=quick, settings=S, checks=checks, timings=timings, figures=figures
    )


def _figures(
    out: Path,
    S: Mapping[str, Any],
    theory: Mapping[tuple[int, float], np.ndarray],
    solver: Mapping[tuple[int, float], np.ndarray],
    particles: Mapping[tuple[int, float], np.ndarray],
    clusters: Mapping[float, Mapping[str, Any]],
    pd: Mapping[str, Any],
) -> list[str]:
    import matplotlib.pyplot as plt

    from .. import plotting

    files = []
    modes = np.asarray(S["modes"])
    fine = np.arange(1, modes[-1] + 1)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, d in zip(axes, (2, 3)):
        for i, b in enumerate(S["betas"]):
            c = f"C{i}"
            ax.plot(
                fine,
                np.asarray(continuum.growth_rates(b, d, fine)),
                "-",
                color=c,
                label=f"theory, beta={b:g}",
            )
            ax.plot(
                modes,
                solver[(d, b)],
                "o",
                mfc="none",
                color=c,
                ms=8,
                label="density solver" if i == 0 else None,
            )
            ax.plot(
                modes, particles[(d, b)], "x", color=c, ms=7, label="particles" if i == 0 else None
            )
        ax.set_yscale("log")
        ax.set_xlabel("mode l")
        ax.set_ylabel(r"growth rate $\lambda_l$")
        ax.set_title(
            f"d = {d} ({'circle' if d == 2 else 'S^2'}): "
            + (
                r"$\lambda_k = k^2 I_k(\beta)/\beta$"
                if d == 2
                else r"$\lambda_l = l(l+1) i_l(\beta)/\beta$"
            )
        )
        ax.legend(fontsize=7)
    fig.suptitle(
        "Dispersion relation of the uniform law (USA): theory, density solver (float64), particles "
        f"(n = {S['particle_n']['2']} / {S['particle_n']['3']})",
        fontsize=10,
    )
    files.append(plotting.savefig(fig, out / "growth_rates.png"))

    sol = pd["solution"]
    dens, ts, th = sol["densities"], sol["ts"], pd["theta"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    valid = np.isfinite(dens).all(axis=1)
    im = ax.pcolormesh(ts[valid], th, dens[valid].T, shading="nearest", cmap="magma")
    fig.colorbar(im, ax=ax, label="density")
    if int(sol["status"]) != continuum.OK:
        ax.axvline(
            float(sol["t_stop"]),
            color="c",
            ls="--",
            label=f"{continuum.STATUS[int(sol['status'])]} (t = {float(sol['t_stop']):.3g})",
        )
        ax.legend(fontsize=8, loc="upper right")
    ax.axvline(S["w1_time"], color="w", ls=":")
    ax.set_xlim(0, S["heatmap_t1"])
    ax.set_xlabel("t")
    ax.set_ylabel(r"$\theta$")
    ax.set_title(
        f"circle density, beta = {S['w1_beta']:g}, start: mode {S['w1_mode']} eps = {S['w1_eps']:g} "
        f"(L = {S['w1_resolution']})",
        fontsize=9,
    )
    x = pd["x_last"]
    ang = np.mod(np.arctan2(x[:, 1], x[:, 0]), 2 * np.pi)
    ax2.hist(ang, bins=60, density=True, alpha=0.5, label=f"particles (n = {len(x)})")
    ax2.plot(th, pd["density_t"], "k-", label="density solver")
    ax2.set_xlabel(r"$\theta$")
    ax2.set_title(f"t = {S['w1_time']:g}: W1 ~ n^{pd['slope']:.2f}", fontsize=9)
    ax2.legend(fontsize=8)
    files.append(plotting.savefig(fig, out / "circle_density.png"))

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    bs = np.array(sorted(clusters))
    for b in bs:
        v = clusters[b]["plateau_count"]
        ax.plot([b] * len(v), v, "o", color="C0", alpha=0.5)
    ax.plot(
        bs,
        [np.mean(clusters[b]["plateau_count"]) for b in bs],
        "s",
        color="C0",
        label="particles: mean over seeds",
    )
    bb = np.linspace(2, max(bs) * 1.1, 200)
    ax.step(
        bb,
        [int(continuum.most_unstable_mode(b, 2)) for b in bb],
        where="mid",
        color="r",
        label="most unstable mode k*",
    )
    ax.plot(bb, np.sqrt(2 * bb), "r:", label=r"$\sqrt{2\beta}$")
    ax.set_xlabel(r"$\beta$")
    ax.set_ylabel("clusters at the first plateau")
    ax.set_title(
        f"Metastable clusters on the circle (n = {S['cluster_n']}, i.i.d. uniform starts)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    files.append(plotting.savefig(fig, out / "cluster_count.png"))
    return [str(Path(f).name) for f in files]
