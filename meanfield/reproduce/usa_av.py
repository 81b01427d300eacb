r"""Reproduce the USA-AV paper (Sections 3-6, App. B): collapse over time, six kernels
on the sphere, theory beside every number.

Figures (in ``DIR/usa-av/``):

* ``fig2_collapse_gap.png``: $G_x(\tau)$ to $\tau = 20$ for the USA baseline, RoPE and
  the prompt model, several ``n``, mean over seeds with a one-standard-error band.
* ``fig3_configurations.png``: final configurations of six models ($n = 256$, $d = 3$)
  on a common sphere view with the theory's orbit or points overlaid.
* ``energy.png``: energy against time for each model with the theory's maximal energy.

The paper's Fig. 2 settings (its App. B.2) were lost in extraction; the choices
made here are recorded in ``summary.json["settings"]`` and in the captions:
$d = 3$, $\beta = 1$, RoPE $\omega = 2 \pi$ in the plane $(e_1, e_2)$, $K = 3$
prompts with Haar-random gauges (contiguous prefix blocks of labels), initial states
i.i.d. uniform, projected RK2 with ``dt = 1e-2`` and the paper's early-stop rule
(relative energy increment over a window of length 1 below $10^{-8}$).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .. import kernels, metrics, sphere, theory
from ..integrate import simulate
from ._common import Timer, check, write_summary

__all__ = ["run", "settings_for"]

_NAME = "usa-av"


def settings_for(quick: bool) -> dict:
    """Settings of the reproduction (quick: 2 values of n, 8 seeds)."""
    return {
        "d": 3,
        "beta": 1.0,
        "omega": float(2 * np.pi),
        "plane": [0, 1],
        "num_prompts": 3,
        "gauge_seed": 0,
        "lam": 1.0,
        "toeplitz_m": 1,
        "wavy_gauge": {"amplitude": 0.6, "k": 3},
        "fig2_n": [64, 128] if quick else [64, 128, 256, 512],
        "fig2_seeds": 8 if quick else 100,
        "fig2_t1": 20.0,
        "fig2_saves": 41,
        "fig3_n": 256,
        "fig3_t1": 40.0,
        "dt": 1e-2,
        "solver": "rk2",
        "early_stop": 1e-8,
        "cluster_threshold_rad": 0.05,
        "seed": 0,
        "dtype": "float32",
    }


def _model(name: str, S: dict):
    """The registry's model ``name`` (``mf.kernels.make``) with the settings' parameters: the
    same model as ``meanfield simulate --kernel NAME`` and a sweep of ``kind = NAME``."""
    params = {
        "usa": {"beta": S["beta"]},
        "distance-bias": {"beta": S["beta"], "lam": S["lam"]},
        "toeplitz": {"m": S["toeplitz_m"]},
        "rope": {"beta": S["beta"], "omega": S["omega"], "plane": tuple(S["plane"])},
        "gauge": {"beta": S["beta"], **S["wavy_gauge"]},
        "prompt": {"beta": S["beta"], "prompts": S["num_prompts"], "gauge_seed": S["gauge_seed"]},
    }[name]
    return kernels.make(name, d=S["d"], **params)


def _fig2_models(S):
    return {name: (lambda name=name: _model(name, S)) for name in ("usa", "rope", "prompt")}


def _run_seeds(model, n, d, keys, *, S, t1, saves):
    """One compilation per (model, n): seeds are a vmapped axis of keys."""
    ts = np.linspace(0.0, t1, saves)

    @jax.jit
    def run(keys):
        def one(k):
            x0 = sphere.uniform(k, n, d)
            return simulate(model, x0, t1=t1, dt=S["dt"], solver=S["solver"], ts=ts, early_stop=S["early_stop"])

        return jax.vmap(one)(keys)

    return run(keys)


def _gauge_limit_point(kernel, x, aux):
    """The gauge frame's limit point ``u``: normalised mean of ``y_i = Psi_i x_i``."""
    y = kernel.to_gauge_frame(x, aux)
    return np.asarray(sphere.normalize(jnp.mean(y, axis=0)))


def run(out_dir, *, quick: bool = False, quiet: bool = False, **options) -> dict:
    """Run the USA-AV reproduction; write figures, data and ``summary.json``; return the summary."""
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    S = settings_for(quick)
    S.update({k: v for k, v in options.items() if k in S})
    timings: dict = {}
    checks: list = []
    key = jax.random.key(S["seed"])
    _, k_fig2, k_fig3, k_eq = jax.random.split(key, 4)  # the first key drew the prompt gauges before the registry
    d, beta = S["d"], S["beta"]
    e_max = float(theory.max_energy(beta))

    # ---------------------------------------------------------------- Fig. 2
    models = _fig2_models(S)
    fig2: dict[tuple[str, int], dict[str, Any]] = {}
    jobs = [(m, n) for n in S["fig2_n"] for m in models]
    bar = tqdm(jobs, desc="usa-av fig2", disable=quiet)
    with Timer(timings, "fig2_s"):
        for m, n in bar:
            bar.set_postfix(model=m, n=n)
            keys = jax.random.split(jax.random.fold_in(k_fig2, n), S["fig2_seeds"])
            t0 = time.perf_counter()
            tr = _run_seeds(models[m](), n, d, keys, S=S, t1=S["fig2_t1"], saves=S["fig2_saves"])
            jax.block_until_ready(tr.collapse_gap)
            fig2[(m, n)] = {
                "ts": np.asarray(tr.ts[0]),
                "gap": np.asarray(tr.collapse_gap),
                "energy": np.asarray(tr.energy),
                "x_final": np.asarray(tr.xs[:, -1]),
                "stop_time": np.asarray(tr.stop_time),
                "failed": np.asarray(tr.failed),
                "wall_s": time.perf_counter() - t0,
            }
    n_max = max(S["fig2_n"])
    gaps_final = {k: v["gap"][:, -1] for k, v in fig2.items()}

    checks.append(check(
        "usa_collapse", gaps_final[("usa", n_max)].mean(), 0.0, 1e-2,
        f"mean over {S['fig2_seeds']} seeds of G_x at tau={S['fig2_t1']:g}, USA, n={n_max}, beta={beta:g}",
    ))
    rope_gap = gaps_final[("rope", n_max)]
    checks.append(check(
        "rope_noncollapse", rope_gap.mean(), None, 0.0,
        "mean G_x at the final time, RoPE omega=2pi, original frame; paper predicts no collapse (pass: > 0.05)",
        passed=lambda v: v > 0.05,
    ))
    checks.append(check(
        "prompt_noncollapse", gaps_final[("prompt", n_max)].mean(), None, 0.0,
        "mean G_x at the final time, prompt model K=3; paper predicts no collapse (pass: > 0.05)",
        passed=lambda v: v > 0.05,
    ))
    rope_E = fig2[("rope", n_max)]["energy"][:, -1]
    checks.append(check(
        "rope_max_energy", rope_E.mean(), e_max, 1e-3,
        f"mean final energy of the RoPE runs (n={n_max}); theory e^beta/(2 beta); worst seed {rope_E.min():.6g}",
        relative=True,
    ))
    # Latitude circle: x(s) = R_{-omega s} u. With s_i = i/n and omega = 2 pi the planar parts
    # cancel, so sum_ij <x_i, x_j> = n^2 h^2 with h = ||P_{E^perp} u||, i.e.
    # G_x = 1 - (n^2 h^2 - n)/(n(n-1)).
    rope_k = models["rope"]()
    aux = kernels.positions(n_max)
    lat_errs: list[Any] = []
    gap_theory: list[float] = []
    for x in fig2[("rope", n_max)]["x_final"]:
        u = _gauge_limit_point(rope_k, x, aux)
        h = float(theory.latitude_height(u, tuple(S["plane"])))
        gap_theory.append(1 - (n_max**2 * h**2 - n_max) / (n_max * (n_max - 1)))
        lat_errs.append(np.max(np.abs(x[:, 2] - u[2])))
    lat_err = np.asarray(lat_errs)
    checks.append(check(
        "rope_latitude", float(np.median(lat_err)), 0.0, 1e-3,
        "median over seeds of max_i |x_i,3 - u_3|: the RoPE configuration lies on the latitude circle at "
        f"the height of the gauge frame's limit point u; worst seed {lat_err.max():.3g} (seeds still "
        "converging at the final time, stop time = t1, are included)",
    ))
    checks.append(check(
        "rope_latitude_gap", rope_gap.mean(), float(np.mean(gap_theory)), 1e-3,
        "mean G_x of the RoPE runs against 1 - (n^2 h^2 - n)/(n(n-1)), h = height of u, per seed",
    ))

    # ------------------------------------------------------ gauge equivalence
    with Timer(timings, "gauge_equivalence_s"):
        n_eq = S["fig2_n"][0]
        x0 = sphere.uniform(k_eq, n_eq, d)
        aux_eq = kernels.positions(n_eq)
        ts_eq = np.linspace(0.0, S["fig2_t1"], 11)
        tr_rope = simulate(rope_k, x0, t1=S["fig2_t1"], dt=S["dt"], solver=S["solver"], ts=ts_eq)
        tr_usa = simulate(kernels.USA(beta), rope_k.to_gauge_frame(x0, aux_eq), t1=S["fig2_t1"],
                          dt=S["dt"], solver=S["solver"], ts=ts_eq)
        back = jax.vmap(lambda y: rope_k.from_gauge_frame(y, aux_eq))(tr_usa.xs)
        eq_err = float(jnp.max(jnp.abs(back - tr_rope.xs)))
    checks.append(check(
        "gauge_equivalence", eq_err, 0.0, 1e-4,
        f"max |x_RoPE(t) - Psi^T y_USA(t)| over {len(ts_eq)} save times to tau={S['fig2_t1']:g}, n={n_eq}, float32",
    ))

    # ---------------------------------------------------------------- Fig. 3
    n3 = S["fig3_n"]
    fig3_models = {
        "USA": _model("usa", S),
        "distance bias": _model("distance-bias", S),
        "Toeplitz (m=1)": _model("toeplitz", S),
        "RoPE": rope_k,
        "generalised RoPE (wavy gauge)": _model("gauge", S),
        "prompts (K=3)": models["prompt"](),
    }
    x0 = sphere.uniform(k_fig3, n3, d)
    ts3 = np.linspace(0.0, S["fig3_t1"], 81)
    fig3: dict[str, dict[str, Any]] = {}
    bar = tqdm(fig3_models.items(), desc="usa-av fig3", disable=quiet)
    with Timer(timings, "fig3_s"):
        for name, k in bar:
            bar.set_postfix(model=name)
            tr = simulate(k, x0, t1=S["fig3_t1"], dt=S["dt"], solver=S["solver"], ts=ts3,
                          early_stop=S["early_stop"], save_states=False,
                          observables={"x": lambda x: x})
            fig3[name] = {
                "ts": np.asarray(tr.ts), "energy": np.asarray(tr.energy), "gap": np.asarray(tr.collapse_gap),
                "x": np.asarray(tr.observables["x"][-1]), "stop_time": float(tr.stop_time),
                "aux": np.asarray(k.default_aux(n3)),
            }
    db = fig3["distance bias"]
    checks.append(check(
        "distance_bias_dirac", db["gap"][-1], 0.0, 1e-2,
        f"G_x at the end of the distance-bias run (lam={S['lam']:g}, n={n3}); Prop. 11: Dirac",
    ))
    s = kernels.positions(n3)
    db_dirac_E = float(jnp.exp(beta) / beta * jnp.mean(jnp.exp(-S["lam"] * jnp.abs(s[:, None] - s[None, :]))) / 2)
    checks.append(check(
        "distance_bias_dirac_energy", db["energy"][-1], db_dirac_E, 1e-3,
        "final energy of the distance-bias run against its value at a Dirac, e^beta/(2 beta) mean_ij e^{-lam|s_i-s_j|}",
        relative=True,
    ))
    tp = fig3["Toeplitz (m=1)"]
    checks.append(check(
        "toeplitz_great_circle", tp["energy"][-1], float(theory.great_circle_energy(1)), 1e-3,
        "final energy of the Toeplitz run; maximiser: uniform great circle, E = 1/4", relative=True,
    ))
    checks.append(check(
        "toeplitz_gap", tp["gap"][-1], theory.great_circle_gap(n3), 1e-3,
        "G_x of the Toeplitz configuration; a uniform great circle has 1 + 1/(n-1)",
    ))
    checks.append(check(
        "toeplitz_rank", float(metrics.gram_rank(jnp.asarray(tp["x"]), 1e-3)), 2.0, 0.0,
        "numerical rank (singular values above 1e-3 of the largest) of the Toeplitz configuration",
    ))
    pr = fig3["prompts (K=3)"]
    checks.append(check(
        "prompt_clusters", float(metrics.num_clusters(jnp.asarray(pr["x"]), S["cluster_threshold_rad"])),
        float(S["num_prompts"]), 0.0,
        f"clusters (angular threshold {S['cluster_threshold_rad']} rad) at the end of the prompt run, K=3",
    ))
    for name, key_ in (("RoPE", "rope_fig3_max_energy"), ("generalised RoPE (wavy gauge)", "wavy_gauge_max_energy"),
                       ("prompts (K=3)", "prompt_max_energy"), ("USA", "usa_max_energy")):
        checks.append(check(
            key_, fig3[name]["energy"][-1], e_max, 1e-3,
            f"final energy of the {name} run (n={n3}) against e^beta/(2 beta)", relative=True,
        ))

    # ---------------------------------------------------------------- figures + data
    with Timer(timings, "figures_s"):
        figures = _figures(out, S, fig2, fig3, fig3_models, e_max, db_dirac_E)
    np.savez_compressed(
        out / "fig2_data.npz",
        **{f"{m}_n{n}_gap": v["gap"] for (m, n), v in fig2.items()},
        **{f"{m}_n{n}_stop_time": v["stop_time"] for (m, n), v in fig2.items()},
        ts=fig2[("usa", n_max)]["ts"],
    )
    np.savez_compressed(
        out / "fig3_data.npz",
        **{f"{i}_x": v["x"] for i, v in enumerate(fig3.values())},
        **{f"{i}_energy": v["energy"] for i, v in enumerate(fig3.values())},
        ts=ts3, names=np.array(list(fig3)),
    )
    S["stop_times"] = {
        **{f"fig2/{m}/n={n}": {"mean": float(v["stop_time"].mean()), "min": float(v["stop_time"].min()),
                               "max": float(v["stop_time"].max()), "failed": int(v["failed"].sum())}
           for (m, n), v in fig2.items()},
        **{f"fig3/{name}": v["stop_time"] for name, v in fig3.items()},
    }
    S["fig2_wall_s"] = {f"{m}/n={n}": round(v["wall_s"], 2) for (m, n), v in fig2.items()}
    return write_summary(out, _NAME, quick=quick, settings=S, checks=checks, timings=timings, figures=figures)


def _figures(out, S, fig2, fig3, fig3_models, e_max, db_dirac_E):
    import matplotlib.pyplot as plt

    from .. import plotting

    files = []
    # Fig. 2 -----------------------------------------------------------------
    labels = {"usa": "USA baseline", "rope": "RoPE ($\\omega = 2\\pi$)", "prompt": "prompts ($K=3$)"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    floor = 1e-7
    for ax, m in zip(axes, labels):
        for n in S["fig2_n"]:
            v = fig2[(m, n)]
            g = np.maximum(v["gap"], floor)
            mean = g.mean(0)
            se = g.std(0, ddof=1) / np.sqrt(g.shape[0])
            plotting.plot_curves(ax, v["ts"], mean, label=f"n={n}",
                                 band=(np.maximum(mean - se, floor), mean + se), logy=True)
        ax.set_title(labels[m])
        ax.set_xlabel(r"$\tau$")
        ax.legend(fontsize=8)
    axes[0].set_ylabel(r"collapse gap $G_x(\tau)$")
    fig.suptitle(
        f"Fig. 2: d={S['d']}, beta={S['beta']:g}, {S['fig2_seeds']} seeds (mean $\\pm$ 1 s.e.), projected RK2 "
        f"dt={S['dt']:g}, early stop {S['early_stop']:g}; values floored at {floor:g} (float32)",
        fontsize=9,
    )
    files.append(plotting.savefig(fig, out / "fig2_collapse_gap.png"))

    # Fig. 3 -----------------------------------------------------------------
    fig = plt.figure(figsize=(13, 8.5))
    for i, (name, v) in enumerate(fig3.items()):
        ax = fig.add_subplot(2, 3, i + 1, projection="3d")
        k = fig3_models[name]
        overlay = _theory_overlay(name, k, v)
        plotting.plot_configuration(ax, v["x"], color=v["aux"].astype(float), overlay=overlay,
                                    title=f"{name}\nE={v['energy'][-1]:.4g}, $G_x$={v['gap'][-1]:.3g}, "
                                          f"stop t={v['stop_time']:.3g}")
    fig.suptitle(f"Fig. 3: final configurations, n={S['fig3_n']}, d=3, beta={S['beta']:g}, same initial state; "
                 "red dashed: theory orbit / points (gauge frame limit point u)", fontsize=10)
    files.append(plotting.savefig(fig, out / "fig3_configurations.png"))

    # Energy -----------------------------------------------------------------
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (name, v) in zip(axes.ravel(), fig3.items()):
        ax.plot(v["ts"], v["energy"], label="E(t)")
        if name == "Toeplitz (m=1)":
            ax.axhline(0.25, color="r", ls="--", label="theory max 1/4")
        elif name == "distance bias":
            ax.axhline(db_dirac_E, color="r", ls="--", label="energy at a Dirac")
        else:
            ax.axhline(e_max, color="r", ls="--", label=r"theory max $e^\beta/(2\beta)$")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("t")
        ax.legend(fontsize=7)
    fig.suptitle(f"Energy against time (n={S['fig3_n']})", fontsize=10)
    files.append(plotting.savefig(fig, out / "energy.png"))
    return [str(Path(f).name) for f in files]


def _theory_overlay(name, k, v):
    x, aux = v["x"], v["aux"]
    s = np.linspace(0, 1, 200)
    if name in ("USA", "distance bias"):
        m = x.mean(0)
        return np.stack([m / np.linalg.norm(m)] * 2)
    if name.startswith("Toeplitz"):
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        th = 2 * np.pi * s
        return np.cos(th)[:, None] * vt[0] + np.sin(th)[:, None] * vt[1]
    u = _gauge_limit_point(k, jnp.asarray(x), jnp.asarray(aux))
    if name.startswith("prompts"):
        return np.asarray(jnp.einsum("kji,j->ki", k.gauges, u))
    P = jax.vmap(lambda a: k.gauge_matrix(a, 3))(jnp.asarray(s))
    return np.asarray(jnp.einsum("nji,j->ni", P, u))
