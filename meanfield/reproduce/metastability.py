r"""Metastability (``meanfield reproduce metastability``): merges, plateaus and the staircase.

Geshkovski, Koubbi, Polyanskiy, Rigollet, "Dynamic metastability in the self-attention model"
(arXiv 2410.06833; code github.com/HugoKoubbi/2024-transformers-dotm). Checks, each with theory,
measured value, tolerance and a note (``mf.metastability`` has the formulas):

* ``staircase_levels``: the plateaus of $\tilde E = 2\beta E$ (rescaled USA kernel) of a run from six
  particles on the circle at $\beta = 60$ (``simulate_long``, float64) against the nearest level
  $\sum_k w_k^2$ of ``staircase``;
* ``first_merge_time``: two point clusters (3 and 5 particles) at angle $\theta$: first merge
  (``merge_events``) against the quadrature ``two_cluster_merge_time``, over a grid of
  $(\beta, \theta)$;
* ``plateau_growth_rate``: the slope of $\log(\beta T)$ against $\beta$ from those runs at fixed
  $\theta$ against $1 - \cos\theta$ (the Laplace asymptotics of the reduced two-cluster ODE:
  plateau lengths $\propto e^{\beta (1 - \cos\theta)}$);
* ``dotm_staircase``: dotm's ``staircase.py`` predictor (``algo_traj_1/2``, rewritten here in NumPy
  from its published logic) against ``staircase`` on dotm's own example ($n = 5$,
  $\beta = 500..4000$);
* ``dotm_simulated_levels`` and ``dotm_merge_times``: that example simulated (``simulate_long`` in
  log time, to $t \approx e^{180}$ at $\beta = 4000$): the plateau levels against dotm's levels
  (the first one with its cross terms $e^{-\beta (1 - \cos\theta_{kl})}$, not negligible there),
  and the log time of each of the four merges against the log of the cumulative two-cluster
  quadratures ``two_cluster_merge_time`` along the staircase's merge order;
* the number of clusters of the first plateau against ``mf.continuum.most_unstable_mode`` is the
  ``cluster_count`` check of ``meanfield reproduce continuum``: reused, not duplicated (its row is
  copied here when that experiment's summary sits in the same output directory).

Not in ``PAPERS`` (not part of ``meanfield reproduce`` without a name): it runs on its own.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float

from .. import kernels, metastability
from ._common import Experiment, Option, check, write_summary

__all__ = ["EXPERIMENT", "run", "settings_for", "dotm_staircase"]

_NAME = "metastability"


#: The experiment's options (quick and default differ only in the save grids) and steps.
EXPERIMENT = Experiment(
    _NAME,
    {
        "threshold": Option(
            0.1,
            doc="angular distance (radians) below which tokens are one cluster (merge detection)",
        ),
        "staircase_beta": Option(
            60.0, doc="inverse temperature beta of the staircase run (rescaled USA)"
        ),
        "staircase_angles": Option(
            [0.0, 0.3, 0.85, 1.3, 2.1, 2.45],
            doc="initial angles (radians) of the staircase run's tokens on the circle",
        ),
        "staircase_log_t1": Option(34.0, doc="log of the staircase run's end time (rescaled time)"),
        "staircase_saves": Option(
            600, quick=200, doc="save times of the staircase run (log-spaced)"
        ),
        "merge_grid": Option(
            [
                [20.0, 0.8],
                [30.0, 0.8],
                [40.0, 0.8],
                [50.0, 0.8],
                [60.0, 0.7],
                [40.0, 1.0],
            ],
            doc="(beta, angle in radians) pairs of the two-cluster merge runs",
        ),
        "merge_sizes": Option([3, 5], doc="token counts (n1, n2) of the two clusters"),
        "merge_saves": Option(800, quick=200, doc="save times around each predicted merge time"),
        "growth_theta": Option(
            0.8, doc="the merge_grid angle (radians) whose runs give the plateau growth rate"
        ),
        "dotm_betas": Option(
            [500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0],
            doc="inverse temperatures beta of dotm's simulated example",
        ),
        "dotm_saves": Option(
            1000, quick=300, doc="save times of dotm's simulated runs (log-spaced)"
        ),
        "rtol": Option(1e-7, doc="relative tolerance of the adaptive long-time integrator"),
        "atol": Option(1e-10, doc="absolute tolerance of the adaptive long-time integrator"),
        "tolerances": Option(
            {
                "staircase_levels": 0.01,
                "plateau_growth_rate": 0.01,
                "dotm_staircase": 1e-12,
                "dotm_simulated_levels": 1e-3,
            },
            doc="pass tolerances of the checks, by check name",
        ),
    },
    steps=("staircase", "merge_times", "dotm", "dotm_simulated", "figures"),
    timings_suffix="_s",
    figures=("metastability.png",),
)


def settings_for(quick: bool) -> dict[str, Any]:
    """Settings of the experiment (``quick`` and full differ only in the save grids): ``EXPERIMENT``'s."""
    return EXPERIMENT.settings("quick" if quick else "default")


def dotm_staircase(theta0: ArrayLike) -> tuple[Float[np.ndarray, " m"], Float[np.ndarray, " m"]]:
    """dotm's ``algo_traj_1``/``algo_traj_2`` (staircase.py), in NumPy from its published logic:
    repeatedly merge the pair at the smallest counter-clockwise gap into its weighted mean angle;
    each merge adds ``1 - cos(gap)`` to the rescaled time and ``2 w_i w_j / M^2`` to the energy,
    which starts at ``1 / M``. Returns ``(levels, rescaled_times)``."""
    theta = np.array(theta0, dtype=np.float64)
    M = theta.size
    w = np.ones_like(theta)
    jumps, times = [], []
    while theta.size >= 2:
        best = (np.inf, 0, 0)
        for i in range(theta.size):
            for j in range(theta.size):
                if i != j:
                    g = abs((theta[i] - theta[j]) % (2 * np.pi))
                    if g < best[0]:
                        best = (g, i, j)
        g, i, j = best
        times.append(1 - np.cos(g))
        jumps.append(2 * w[i] * w[j] / M**2)
        theta[j] = ((theta[j] * w[j] + theta[i] * w[i]) / (w[i] + w[j])) % (2 * np.pi)
        w[j] += w[i]
        theta, w = np.delete(theta, i), np.delete(w, i)
    levels = np.array([1 / M + sum(jumps[:k]) for k in range(len(jumps) + 1)])
    return levels, np.array([sum(times[:k]) for k in range(len(times) + 1)])


def _circle(th: ArrayLike) -> Float[np.ndarray, "n 2"]:
    th = np.asarray(th, dtype=np.float64)
    return np.stack([np.cos(th), np.sin(th)], axis=1)


def _staircase_run(
    S: Mapping[str, Any],
) -> tuple[
    Float[np.ndarray, " t"],
    Float[np.ndarray, " t"],
    list[metastability.MergeEvent],
    bool,
    metastability.Staircase,
]:
    beta, th = S["staircase_beta"], np.asarray(S["staircase_angles"])
    with jax.enable_x64(True):
        traj = metastability.simulate_long(
            kernels.USA(beta, rescaled=True),
            jnp.asarray(_circle(th)),
            t1=float(np.exp(S["staircase_log_t1"])),
            rtol=S["rtol"],
            atol=S["atol"],
            num_saves=S["staircase_saves"],
            t_min=1e-2,
        )
        ts = np.asarray(traj.ts)
        assert traj.energy is not None  # USA has an energy
        En = np.asarray(metastability.normalized_energy(traj.energy, beta))
        events = metastability.merge_events(traj, S["threshold"])
        failed = bool(traj.failed)
    return ts, En, events, failed, metastability.staircase(np.ones(th.size), th)


def _merge_runs(S: Mapping[str, Any]) -> list[dict[str, Any]]:
    n1, n2 = S["merge_sizes"]
    n = n1 + n2
    rows = []
    for beta, theta in S["merge_grid"]:
        T = metastability.two_cluster_merge_time(
            n1 / n, n2 / n, theta, beta, threshold=S["threshold"]
        )
        # a grid not centred on T: the bracket of the merge does not straddle T symmetrically
        ts = np.r_[0.0, np.geomspace(T / 2.7, 3.1 * T, S["merge_saves"])]
        th = np.r_[np.zeros(n1), np.full(n2, theta)]
        with jax.enable_x64(True):
            x0 = jnp.asarray(np.c_[_circle(th), np.zeros(n)])
            traj = metastability.simulate_long(
                kernels.USA(beta, rescaled=True),
                x0,
                t1=3.1 * T,
                ts=ts,
                rtol=S["rtol"],
                atol=S["atol"],
            )
            ev = metastability.merge_events(traj, S["threshold"])
        measured = math.sqrt(ev[0].time * ev[0].time_before) if ev else math.nan
        rows.append(
            {
                "beta": beta,
                "theta": theta,
                "quadrature": T,
                "measured": measured,
                "bracket": [ev[0].time_before, ev[0].time] if ev else None,
                "save_ratio": float(ts[2] / ts[1]),
                "failed": bool(traj.failed),
            }
        )
    return rows


def _dotm_runs(S: Mapping[str, Any]) -> list[dict[str, Any]]:
    """dotm's example simulated at each beta: plateau levels and merge log times against the
    predictions (``dotm_simulated_levels``, ``dotm_merge_times``)."""
    rows = []
    for beta in S["dotm_betas"]:
        th = 0.5 * np.array([0, 0.5, 2, 4, 7]) * np.log(beta) / np.sqrt(beta)
        levels, _ = dotm_staircase(th)
        # the first plateau keeps its cross terms (exponents beta (1 - cos) of only 1-2 there)
        first = float(np.mean(np.exp(-beta * (1 - np.cos(th[:, None] - th[None, :])))))
        pred = metastability.staircase(np.ones(th.size), th)
        threshold = 0.2 * th[1]  # below the smallest gap
        w = np.full(th.size, 1.0 / th.size)
        log_T = []
        for (a, b), gap in zip(pred.pairs, pred.gaps):
            log_T.append(
                metastability.two_cluster_merge_time(
                    w[a], w[b], gap, beta, threshold=threshold, log=True
                )
            )
            w[a] += w[b]
        log_cum = np.logaddexp.accumulate(np.asarray(log_T))
        with jax.enable_x64(True):
            traj = metastability.simulate_long(
                kernels.USA(beta, rescaled=True),
                jnp.asarray(_circle(th)),
                log_t1=float(log_cum[-1]) + 3.0,
                num_saves=S["dotm_saves"],
                t_min=1e-3,
                rtol=S["rtol"],
                atol=S["atol"],
            )
            log_t = np.asarray(traj.observables["log_t"])
            assert traj.energy is not None  # USA has an energy
            En = np.asarray(metastability.normalized_energy(traj.energy, beta))
            ev = metastability.merge_events((log_t, traj.xs), threshold)
            failed = bool(traj.failed)
        plat = metastability.plateaus(log_t, En)
        theory = np.r_[first, levels[1:]]
        rows.append(
            {
                "beta": beta,
                "failed": failed,
                "levels_theory": theory.tolist(),
                "levels_measured": plat.level.tolist(),
                "log_merge_theory": log_cum.tolist(),
                "log_merge_bracket": [[e.time_before, e.time] for e in ev],
                "log_spacing": float(log_t[2] - log_t[1]),
            }
        )
    return rows


def _continuum_row(out_root: Path) -> dict[str, Any] | None:
    """The ``cluster_count`` row of ``meanfield reproduce continuum`` when its summary is there."""
    path = out_root / "continuum" / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for row in summary.get("checks", []):
        if row.get("name") == "cluster_count":
            row = dict(row)
            row["name"] = "first_plateau_clusters"
            row["note"] = "copied from meanfield reproduce continuum (check cluster_count): " + str(
                row.get("note", "")
            )
            return row
    return None


def run(
    out_dir: str | os.PathLike[str],
    *,
    quick: bool = False,
    full: bool = False,
    quiet: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the metastability reproduction; write a figure, data and ``summary.json``; return the summary.

    ``options`` override entries of ``EXPERIMENT.options`` (an unknown name raises ``ValueError``);
    ``full`` runs the default sizes."""
    S = EXPERIMENT.settings(EXPERIMENT.mode(quick=quick, full=full), **options)
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    tol = S["tolerances"]
    steps = EXPERIMENT.start(quiet=quiet)
    timings = steps.timings
    checks: list[dict[str, Any]] = []

    # ----------------------------------------------------- staircase of one run
    with steps("staircase"):
        ts, En, events, failed, pred = _staircase_run(S)
    plat = metastability.plateaus(ts, En)
    dev = [float(np.min(np.abs(pred.levels - lv))) for lv in plat.level]
    checks.append(
        check(
            "staircase_levels",
            max(dev) if dev and not failed else math.nan,
            0.0,
            tol["staircase_levels"],
            f"max over the {len(plat)} detected plateaus (rule of mf.metastability.plateaus) of |level - nearest "
            f"staircase level sum_k w_k^2|; run: n = 6 on the circle at {S['staircase_angles']}, beta = "
            f"{S['staircase_beta']:g}, rescaled USA, to t = e^{S['staircase_log_t1']:g}; measured levels "
            + ", ".join(f"{lv:.4f}" for lv in plat.level)
            + "; predicted "
            + ", ".join(f"{lv:.4f}" for lv in pred.levels)
            + f"; {len(events)} merges at log t = "
            + ", ".join(f"{math.log(e.time):.2f}" for e in events)
            + " (staircase exponents beta (1 - cos gap) = "
            + ", ".join(f"{S['staircase_beta'] * e:.2f}" for e in pred.exponents)
            + ")",
        )
    )

    # ----------------------------------------------------- two-cluster merge times
    with steps("merge_times"):
        rows = _merge_runs(S)
    rel = [abs(r["measured"] / r["quadrature"] - 1) for r in rows]
    ratio = max(r["save_ratio"] for r in rows)
    checks.append(
        check(
            "first_merge_time",
            max(rel),
            0.0,
            ratio - 1,
            "max over (beta, theta) of |T_measured / T_quadrature - 1|, T_measured the geometric mean of the "
            "save bracket of the first merge_events merge (tolerance: the log grid's ratio - 1); two point clusters "
            f"of {S['merge_sizes'][0]} and {S['merge_sizes'][1]} particles on S^2, rescaled USA: "
            + ", ".join(
                f"beta {r['beta']:g}, theta {r['theta']:g}: {r['measured']:.4g} / {r['quadrature']:.4g}"
                for r in rows
            ),
        )
    )

    # ----------------------------------------------------- growth rate of the plateau length
    th0 = S["growth_theta"]
    sel = [r for r in rows if r["theta"] == th0]
    b = np.array([r["beta"] for r in sel])
    slope = float(np.polyfit(b, np.log(b * np.array([r["measured"] for r in sel])), 1)[0])
    qslope = float(np.polyfit(b, np.log(b * np.array([r["quadrature"] for r in sel])), 1)[0])
    checks.append(
        check(
            "plateau_growth_rate",
            slope,
            1 - math.cos(th0),
            tol["plateau_growth_rate"],
            f"slope of log(beta T_merge) against beta in {b.tolist()} at theta = {th0:g} (simulated merges) against "
            f"1 - cos(theta), the Laplace rate of T ~ e^(beta (1 - cos theta)) / (W beta u (2 - u)); the quadrature's "
            f"own slope is {qslope:.4f}",
        )
    )

    # ----------------------------------------------------- dotm's predictor
    with steps("dotm"):
        diffs = []
        for beta in S["dotm_betas"]:
            th = 0.5 * np.array([0, 0.5, 2, 4, 7]) * np.log(beta) / np.sqrt(beta)
            lv, rt = dotm_staircase(th)
            s = metastability.staircase(np.ones(5), th)
            diffs.append(max(np.max(np.abs(lv - s.levels)), np.max(np.abs(rt - s.rescaled_times))))
    checks.append(
        check(
            "dotm_staircase",
            max(diffs),
            0.0,
            tol["dotm_staircase"],
            "max |levels and rescaled times of dotm staircase.py's algo_traj_1/2 (NumPy port) - mf.metastability."
            f"staircase| on dotm's example n = 5, theta_0 = 0.5 (0, 0.5, 2, 4, 7) log(beta) / sqrt(beta), beta in "
            f"{S['dotm_betas']}",
        )
    )
    with steps("dotm_simulated"):
        drows = _dotm_runs(S)
    lev_dev, time_dev = [], []
    for r in drows:
        ok = not r["failed"] and len(r["levels_measured"]) == len(r["levels_theory"])
        lev_dev.append(
            float(np.max(np.abs(np.subtract(r["levels_measured"], r["levels_theory"]))))
            if ok
            else math.nan
        )
        ok = ok and len(r["log_merge_bracket"]) == len(r["log_merge_theory"])
        time_dev.append(
            max(
                abs(0.5 * (lo + hi) - q)
                for (lo, hi), q in zip(r["log_merge_bracket"], r["log_merge_theory"])
            )
            if ok
            else math.nan
        )
    spacing = max(r["log_spacing"] for r in drows)
    checks.append(
        check(
            "dotm_simulated_levels",
            max(lev_dev),
            0.0,
            tol["dotm_simulated_levels"],
            "max over beta in "
            f"{S['dotm_betas']} and the plateaus of |plateau level - dotm level| of simulate_long runs "
            "(rescaled USA, float64, log time) from dotm's example n = 5, theta_0 = 0.5 (0, 0.5, 2, 4, 7) "
            "log(beta) / sqrt(beta); the first level with its cross terms (1/n^2) sum_kl e^(-beta (1 - cos)); "
            "measured levels at beta = 4000: "
            + ", ".join(f"{v:.4f}" for v in drows[-1]["levels_measured"]),
        )
    )
    checks.append(
        check(
            "dotm_merge_times",
            max(time_dev),
            0.0,
            spacing,
            "max over beta and the 4 merges of |log t_merge - log sum_k T_k|, log t_merge the middle of the "
            "save bracket (in log t) of the merge, T_k the two-cluster quadratures of the staircase's merges "
            "(tolerance: one save spacing in log t, i.e. the bracket's half-width and as much again for "
            "the integrator and the other clusters' pull, which the quadrature ignores); at beta = 4000 "
            "predicted log t = "
            + ", ".join(f"{v:.2f}" for v in drows[-1]["log_merge_theory"])
            + ", brackets "
            + ", ".join(f"({lo:.2f}, {hi:.2f}]" for lo, hi in drows[-1]["log_merge_bracket"]),
        )
    )
    row = _continuum_row(Path(out_dir))
    if row is not None:
        checks.append(row)

    with steps("figures"):
        figures = _figures(out, ts, En, pred, plat, rows)
    np.savez_compressed(
        out / "metastability_data.npz",
        ts=ts,
        energy=En,
        levels=pred.levels,
        plateau_levels=plat.level,
        plateau_start=plat.start,
        plateau_end=plat.end,
    )
    S["merge_runs"] = rows
    S["dotm_runs"] = drows
    S["staircase_merges"] = [dict(e.__dict__) for e in events]
    S["first_plateau_clusters"] = (
        "reused from meanfield reproduce continuum"
        if row is not None
        else "see meanfield reproduce continuum (check cluster_count); run it into the same --out to copy the row here"
    )
    steps.close()
    return write_summary(
        out, _NAME, quick=quick, settings=S, checks=checks, timings=timings, figures=figures
    )


def _figures(
    out: Path,
    ts: np.ndarray,
    En: np.ndarray,
    pred: metastability.Staircase,
    plat: metastability.Plateaus,
    rows: list[dict[str, Any]],
) -> list[str]:
    import matplotlib.pyplot as plt

    from .. import plotting

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    t = np.maximum(ts, ts[ts > 0].min())
    a.plot(t, En, lw=1.2, label="simulation")
    for lv in pred.levels:
        a.axhline(lv, color="r", ls="--", lw=0.7)
    a.hlines(
        plat.level,
        np.maximum(plat.start, t[0]),
        plat.end,
        color="k",
        lw=3,
        alpha=0.4,
        label="plateaus",
    )
    a.set_xscale("log")
    a.set_xlabel("t (rescaled kernel)")
    a.set_ylabel(r"$\tilde E = 2 \beta E$")
    a.set_title("staircase: run vs sum w_k^2 (dashed)", fontsize=9)
    a.legend(fontsize=8)
    q = np.array([r["quadrature"] for r in rows])
    m = np.array([r["measured"] for r in rows])
    b.loglog(q, m, "o")
    lim = [q.min() / 2, q.max() * 2]
    b.plot(lim, lim, "r--", lw=0.8)
    b.set_xlabel("two-cluster quadrature")
    b.set_ylabel("simulated first merge")
    b.set_title("first merge times", fontsize=9)
    return [plotting.savefig(fig, out / "metastability.png")]
