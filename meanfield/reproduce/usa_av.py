r"""Reproduce the USA-AV paper (Sections 3-6, App. B): collapse over time, six kernels
on the sphere, theory beside every number.

Figures (in ``DIR/usa-av/``):

* ``fig2_collapse_gap.png``: $G_x(\tau)$ to $\tau = 20$ for the USA baseline, RoPE and
  the prompt model, several ``n``, mean over seeds with a one-standard-error band.
* ``fig3_configurations.png``: final configurations of six models ($n = 256$, $d = 3$)
  on a common sphere view with the theory's orbit or points overlaid.
* ``energy.png``: energy against time for each model with the theory's maximal energy.
* ``toeplitz_fourier.png``: Prop. 10, Toeplitz kernels with Fourier coefficients $\hat c(m)$ whose
  dominant mode is $m = 0, 1, 2, 3$ and a sign-changing profile: final paths (winding numbers) and
  energies against $\frac12 \max_k \hat c(k)$.
* ``dobrushin.png``: Prop. 4, $W_1$ between two nearby particle systems against $e^{L t} W_1(0)$.
* ``nonatomic_prompt.png``: Thm. 4 (iii), one prompt $z \sim \mathrm{Leb}[0, 1)$ per token realises a
  von Mises-Fisher law on $S^2$; $\mathrm{MMD}^2$ to the target against $(1 - \bar k)/n$.

The paper's Fig. 2 settings (its App. B.2) were lost in extraction; the choices
made here are recorded in ``summary.json["settings"]`` and in the captions:
$d = 3$, $\beta = 1$, RoPE $\omega = 2 \pi$ in the plane $(e_1, e_2)$, $K = 3$
prompts with Haar-random gauges (contiguous prefix blocks of labels), initial states
i.i.d. uniform, projected RK2 with ``dt = 1e-2`` and the paper's early-stop rule
(relative energy increment over a window of length 1 below $10^{-8}$).
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import ArrayLike, Float, PRNGKeyArray

from .. import kernels, metrics, sphere, theory
from .._checks import RealScalarLike
from .._precision import einsum
from ..energy import velocity
from ..integrate import Trajectory, simulate
from ..models import Model
from ._common import Experiment, Option, Steps, check, write_summary

__all__ = [
    "EXPERIMENT",
    "run",
    "settings_for",
    "winding_number",
    "dobrushin_rate",
    "w1_empirical",
    "vmf_prompt_map",
    "householder_gauges",
    "vmf_mmd_constant",
    "mmd2_to_vmf",
]

_NAME = "usa-av"


_TOEPLITZ_FOURIER = {
    "n": 256,
    "t1": 40.0,
    "saves": 81,
    # c_hat(0..3); dominant modes 0, 1, 2, 3 and a sign-changing profile (repulsive mean)
    "kernels": {
        "m0": [0.5, 0.2, 0.1, 0.05],
        "m1": [0.0, 0.5, 0.2, 0.1],
        "m2": [0.1, 0.2, 0.5, 0.1],
        "m3": [0.0, 0.1, 0.2, 0.45],
        "sign": [-0.4, -0.2, 0.35, -0.3],
    },
}
_DOBRUSHIN = {"n": 256, "eps": 0.05, "t1": 4.0, "saves": 81}
_NONATOMIC = {
    "kappa": 2.0,
    "mmd_gamma": 4.0,
    "n": [64, 256, 1024, 2048],
    "replicates": 64,
    "flow_n": 1024,
    "flow_t1": 10.0,
    "cap": 0.5,
    "seed": 0,
}

#: The experiment's options (quick: 2 values of n, 8 seeds) and steps.
EXPERIMENT = Experiment(
    _NAME,
    {
        "d": Option(3, doc="ambient dimension d (tokens on the sphere S^(d-1))"),
        "beta": Option(1.0, doc="inverse temperature beta of the exponential kernels"),
        "omega": Option(
            float(2 * np.pi), doc="RoPE frequency omega (radians per unit of position)"
        ),
        "plane": Option([0, 1], doc="the two coordinate axes of the RoPE rotation plane"),
        "num_prompts": Option(3, doc="number K of prompts of the prompt model"),
        "gauge_seed": Option(0, doc="seed of the prompt model's random gauges"),
        "lam": Option(1.0, doc="distance-bias rate lambda (Fig. 3)"),
        "toeplitz_m": Option(1, doc="frequency m of the Toeplitz kernel (Fig. 3)"),
        "wavy_gauge": Option(
            {"amplitude": 0.6, "k": 3},
            doc="parameters of the wavy gauge (amplitude in radians, k waves per turn; Fig. 3)",
        ),
        "fig2_n": Option([64, 128, 256, 512], quick=[64, 128], doc="token counts n of Fig. 2"),
        "fig2_seeds": Option(
            100, quick=8, doc="random initial states (seeds) per model and n in Fig. 2"
        ),
        "fig2_t1": Option(20.0, doc="end time tau of the Fig. 2 runs"),
        "fig2_saves": Option(
            41, doc="save times of the Fig. 2 runs, evenly spaced on [0, fig2_t1]"
        ),
        "fig3_n": Option(256, doc="token count n of the Fig. 3 runs"),
        "fig3_t1": Option(40.0, doc="end time of the Fig. 3 runs"),
        "dt": Option(1e-2, doc="time step of the integrator"),
        "solver": Option("rk2", doc="integrator (mf.simulate's solver, e.g. 'rk2')"),
        "early_stop": Option(
            1e-8, doc="early stop: relative energy increment over a window of length 1 below this"
        ),
        "cluster_threshold_rad": Option(
            0.05, doc="angular distance (radians) below which tokens are one cluster"
        ),
        "seed": Option(0, doc="seed of the experiment's random keys"),
        "dtype": Option(
            "float32", doc="floating dtype of the runs (recorded only: JAX's default float32)"
        ),
        "toeplitz_fourier": Option(
            _TOEPLITZ_FOURIER,
            quick={**_TOEPLITZ_FOURIER, "n": 128},
            doc="Prop. 10 runs: n, end time t1, save count, Fourier coefficients c_hat(0..3) per kernel",
        ),
        "dobrushin": Option(
            _DOBRUSHIN,
            quick={**_DOBRUSHIN, "n": 128},
            doc="Prop. 4 runs: n, perturbation size eps, end time t1, save count",
        ),
        "nonatomic": Option(
            _NONATOMIC,
            quick={**_NONATOMIC, "n": [64, 256, 1024], "replicates": 16, "flow_n": 256},
            doc="Thm. 4 (iii): vMF kappa, MMD kernel gamma, sample sizes n, draws per n, flow n and end time, start cap, seed",
        ),
    },
    steps=(
        "fig2",
        "gauge_equivalence",
        "fig3",
        "toeplitz_fourier",
        "dobrushin",
        "nonatomic",
        "figures",
    ),
    timings_suffix="_s",
    figures=(
        "fig2_collapse_gap.png",
        "fig3_configurations.png",
        "energy.png",
        "toeplitz_fourier.png",
        "dobrushin.png",
        "nonatomic_prompt.png",
    ),
)


def settings_for(quick: bool) -> dict[str, Any]:
    """Settings of the reproduction (quick: 2 values of n, 8 seeds): ``EXPERIMENT``'s."""
    return EXPERIMENT.settings("quick" if quick else "default")


def _model(name: str, S: Mapping[str, Any]) -> Model:
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


def _fig2_models(S: Mapping[str, Any]) -> dict[str, Model]:
    """Fig. 2's models, each built once: the prompt model draws its gauges in one compiled
    program (``kernels.make`` run eagerly is six small programs)."""
    return {
        "usa": _model("usa", S),
        "rope": _model("rope", S),
        "prompt": eqx.filter_jit(lambda: _model("prompt", S))(),
    }


def _per_particle(model: Model, n: int, d: int) -> kernels.Prompt:
    """``model`` as a Prompt kernel with one gauge per token (labels ``0..n-1``): USA with identity
    gauges, a gauge kernel with its gauges at its default labels. The same field and energy
    (``_fig2_form_error``): the gauge frame of the exp kernels with ``Psi_i`` given per token."""
    if isinstance(model, kernels.GaugeKernel):
        aux = model.default_aux(n)
        G = model.gauge_matrices(aux, d)
    elif isinstance(model, kernels.USA):
        G = jnp.broadcast_to(jnp.eye(d), (n, d, d))
    else:  # pragma: no cover (Fig. 2's models are USA and gauge kernels)
        raise TypeError(f"no per-particle gauge form of {type(model).__name__}")
    return kernels.Prompt(model.beta, G.astype(jnp.float32), rescaled=model.rescaled)


@eqx.filter_jit
def _fig2_form_error(models: dict[str, Model], key: PRNGKeyArray, n: int, d: int) -> Array:
    """max over Fig. 2's models of |velocity of the registry model - velocity of its per-particle
    Prompt form| at a uniform start (one program per n)."""
    x = sphere.uniform(key, n, d)
    labels = jnp.arange(n)
    return jnp.max(
        jnp.stack(
            [
                jnp.max(jnp.abs(velocity(m, x) - velocity(_per_particle(m, n, d), x, labels)))
                for m in models.values()
            ]
        )
    )


@eqx.filter_jit
def _run_seeds(
    models: dict[str, Model],
    key: PRNGKeyArray,
    n: int,
    d: int,
    *,
    seeds: int,
    t1: RealScalarLike,
    saves: int,
    dt: RealScalarLike,
    solver: str,
    early_stop: RealScalarLike,
) -> dict[str, Trajectory]:
    """Every model of ``models`` at one n in ONE compiled program (one per n): each model as its
    per-particle Prompt form (``_per_particle``: USA, RoPE and the prompt model are then one kernel
    type whose gauges are stacked and vmapped over), the seeds a vmapped axis of keys
    ``split(fold_in(key, n), seeds)`` (the same starts for every model). Under the vmap each run
    stops at its own early stop (its states then frozen); the program runs until the last stops."""
    ts = np.linspace(0.0, t1, saves)
    keys = jax.random.split(jax.random.fold_in(key, n), seeds)
    labels = jnp.arange(n)

    def one(model: kernels.Prompt, k: PRNGKeyArray) -> Trajectory:
        x0 = sphere.uniform(k, n, d)
        return simulate(
            model, x0, labels, t1=t1, dt=dt, solver=solver, ts=ts, early_stop=early_stop
        )

    stacked = _stacked_forms(models, n, d)
    return _unstack(models, jax.vmap(lambda m: jax.vmap(lambda k: one(m, k))(keys))(stacked))


def _stacked_forms(models: Mapping[str, Model], n: int, d: int) -> kernels.Prompt:
    """The per-particle Prompt forms of ``models`` stacked on a leading axis (one pytree to vmap)."""
    return jax.tree.map(lambda *a: jnp.stack(a), *[_per_particle(m, n, d) for m in models.values()])


def _unstack(models: Mapping[str, Model], trs: Trajectory) -> dict[str, Trajectory]:
    return {name: jax.tree.map(lambda a, i=i: a[i], trs) for i, name in enumerate(models)}


@eqx.filter_jit
def _run_forms(
    models: Mapping[str, Model],
    x0: Float[Array, "n d"],
    *,
    t1: RealScalarLike,
    saves: int,
    dt: RealScalarLike,
    solver: str,
    early_stop: RealScalarLike,
) -> dict[str, Trajectory]:
    """Fig. 3's gauge-type models (USA and the gauge kernels) from one start ``x0`` in ONE compiled
    program: their per-particle Prompt forms vmapped, each run stopping at its own early stop; the
    final states are the observable ``x`` (no states saved)."""
    n, d = x0.shape
    ts = np.linspace(0.0, t1, saves)
    labels = jnp.arange(n)

    def one(model: kernels.Prompt) -> Trajectory:
        return simulate(
            model,
            x0,
            labels,
            t1=t1,
            dt=dt,
            solver=solver,
            ts=ts,
            early_stop=early_stop,
            save_states=False,
            observables={"x": _identity},
        )

    return _unstack(models, jax.vmap(one)(_stacked_forms(models, n, d)))


def _identity(x: Array) -> Array:
    return x


def _gauge_limit_point(
    kernel: kernels.GaugeKernel, x: Float[Array, "n d"], aux: ArrayLike
) -> Float[Array, " d"]:
    """The gauge frame's limit point ``u``: normalised mean of ``y_i = Psi_i x_i``."""
    return sphere.normalize(jnp.mean(kernel.to_gauge_frame(x, aux), axis=0))


@eqx.filter_jit
def _gauge_limit_points(
    kernel: kernels.GaugeKernel, xs: Float[Array, "b n d"]
) -> Float[Array, "b d"]:
    """``_gauge_limit_point`` of each configuration ``xs[b]`` (``(B, n, d)``, the kernel's labels), as
    one compiled program."""
    aux = kernel.default_aux(xs.shape[-2])
    return jax.vmap(lambda x: _gauge_limit_point(kernel, x, aux))(xs)


@functools.partial(jax.jit, static_argnums=0)
def _experiment_keys(
    seed: int,
) -> tuple[
    PRNGKeyArray, PRNGKeyArray, PRNGKeyArray, PRNGKeyArray, tuple[PRNGKeyArray, PRNGKeyArray]
]:
    """The experiment's keys from ``seed`` (one program instead of one per ``split``/``fold_in``):
    Fig. 2, Fig. 3, gauge equivalence (``split(key, 4)[1:]``; the first key drew the prompt gauges
    before the registry), Prop. 10 (``fold_in(key, 10)``) and Prop. 4's pair (``split(fold_in(key, 11))``)."""
    key = jax.random.key(seed)
    _, k_fig2, k_fig3, k_eq = jax.random.split(key, 4)
    kx, ky = jax.random.split(jax.random.fold_in(key, 11))
    return k_fig2, k_fig3, k_eq, jax.random.fold_in(key, 10), (kx, ky)


# Small steps of the experiment as one compiled program each (run eagerly, every JAX operation
# is a program of its own: about a hundred of them). Initial states stay eager: compiled as one
# program, XLA rewrites g / |g| (a multiply by rsqrt, 1 ulp apart) and the runs would start elsewhere.
_max_energy = jax.jit(theory.max_energy)
_latitude_height = jax.jit(theory.latitude_height, static_argnums=1)
_gram_rank = jax.jit(metrics.gram_rank, static_argnums=1)


@eqx.filter_jit
def _to_gauge_frame(kernel: kernels.GaugeKernel, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
    """``y = Psi x`` with the labels ``positions(n)`` (the USA run's start)."""
    return kernel.to_gauge_frame(x, kernels.positions(x.shape[-2]))


@eqx.filter_jit
def _gauge_equivalence_error(
    kernel: kernels.GaugeKernel, ys: Float[Array, "t n d"], xs: Float[Array, "t n d"]
) -> Float[Array, ""]:
    """``max |Psi^T y(t) - x(t)|`` over save times, particles and coordinates."""
    aux = kernels.positions(xs.shape[-2])
    back = jax.vmap(lambda y: kernel.from_gauge_frame(y, aux))(ys)
    return jnp.max(jnp.abs(back - xs))


@jax.jit
def _dirac_energy_distance_bias(
    beta: RealScalarLike, lam: RealScalarLike, s: Float[Array, " n"]
) -> Float[Array, ""]:
    """Energy of the distance-bias kernel at a Dirac: e^beta/(2 beta) mean_ij e^{-lam |s_i - s_j|}."""
    return jnp.exp(beta) / beta * jnp.mean(jnp.exp(-lam * jnp.abs(s[:, None] - s[None, :]))) / 2


@eqx.filter_jit
def _overlay_orbit(
    kernel: kernels.GaugeKernel,
    x: Float[Array, "n d"],
    aux: Array,
    s: Float[Array, " m"],
) -> Float[Array, "p d"]:
    """The theory's orbit of a gauge kernel: ``Psi(s)^T u`` (``Psi_k^T u`` for the prompt model)."""
    u = _gauge_limit_point(kernel, x, aux)
    if isinstance(kernel, kernels.Prompt):
        return einsum("kji,j->ki", kernel.gauges, u)
    P = jax.vmap(lambda a: kernel.gauge_matrix(a, x.shape[-1]))(s)
    return einsum("nji,j->ni", P, u)


def run(
    out_dir: str | os.PathLike[str],
    *,
    quick: bool = False,
    full: bool = False,
    quiet: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the USA-AV reproduction; write figures, data and ``summary.json``; return the summary.

    ``options`` override entries of ``EXPERIMENT.options`` (an unknown name raises ``ValueError``);
    ``full`` runs the default sizes (the paper's Fig. 2 settings were lost, App. B.2)."""
    S = EXPERIMENT.settings(EXPERIMENT.mode(quick=quick, full=full), **options)
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    steps = EXPERIMENT.start(quiet=quiet)
    timings = steps.timings
    checks: list[dict[str, Any]] = []
    k_fig2, k_fig3, k_eq, k_tf, k_dob = _experiment_keys(S["seed"])
    d, beta = S["d"], S["beta"]
    e_max = float(_max_energy(beta))

    # ---------------------------------------------------------------- Fig. 2
    models = _fig2_models(S)
    fig2: dict[tuple[str, int], dict[str, Any]] = {}
    form_err: dict[int, float] = {}
    with steps("fig2") as part:
        for n in S["fig2_n"]:
            part.set_postfix_str(f"n={n}")
            t0 = time.perf_counter()
            form_err[n] = float(_fig2_form_error(models, k_fig2, n, d))
            trs = _run_seeds(
                models,
                k_fig2,
                n,
                d,
                seeds=S["fig2_seeds"],
                t1=S["fig2_t1"],
                saves=S["fig2_saves"],
                dt=S["dt"],
                solver=S["solver"],
                early_stop=S["early_stop"],
            )
            jax.block_until_ready(trs)
            for m, tr in trs.items():
                fig2[(m, n)] = {
                    "ts": np.asarray(tr.ts)[0],
                    "gap": np.asarray(tr.collapse_gap),
                    "energy": np.asarray(tr.energy),
                    "x_final": np.asarray(tr.xs)[:, -1],
                    "stop_time": np.asarray(tr.stop_time),
                    "failed": np.asarray(tr.failed),
                    "wall_s": time.perf_counter() - t0,
                }
    n_max = max(S["fig2_n"])
    gaps_final = {k: v["gap"][:, -1] for k, v in fig2.items()}

    checks.append(
        check(
            "usa_collapse",
            gaps_final[("usa", n_max)].mean(),
            0.0,
            1e-2,
            f"mean over {S['fig2_seeds']} seeds of G_x at tau={S['fig2_t1']:g}, USA, n={n_max}, beta={beta:g}. "
            "Fig. 2 runs its three models at each n in one compiled program, each as its per-particle Prompt "
            "form (USA: identity gauges; RoPE, prompts: their gauges at their default labels); max |velocity "
            "difference| against the registry's models at a uniform start: "
            + ", ".join(f"n={k}: {v:.1e}" for k, v in form_err.items()),
        )
    )
    rope_gap = gaps_final[("rope", n_max)]
    checks.append(
        check(
            "rope_noncollapse",
            rope_gap.mean(),
            None,
            0.0,
            "mean G_x at the final time, RoPE omega=2pi, original frame; paper predicts no collapse (pass: > 0.05)",
            passed=lambda v: v > 0.05,
        )
    )
    checks.append(
        check(
            "prompt_noncollapse",
            gaps_final[("prompt", n_max)].mean(),
            None,
            0.0,
            "mean G_x at the final time, prompt model K=3; paper predicts no collapse (pass: > 0.05)",
            passed=lambda v: v > 0.05,
        )
    )
    rope_E = fig2[("rope", n_max)]["energy"][:, -1]
    checks.append(
        check(
            "rope_max_energy",
            rope_E.mean(),
            e_max,
            1e-3,
            f"mean final energy of the RoPE runs (n={n_max}); theory e^beta/(2 beta); worst seed {rope_E.min():.6g}",
            relative=True,
        )
    )
    # Latitude circle: x(s) = R_{-omega s} u. With s_i = i/n and omega = 2 pi the planar parts
    # cancel, so sum_ij <x_i, x_j> = n^2 h^2 with h = ||P_{E^perp} u||, i.e.
    # G_x = 1 - (n^2 h^2 - n)/(n(n-1)).
    rope_k = cast(kernels.GaugeKernel, models["rope"])
    x_rope = fig2[("rope", n_max)]["x_final"]
    us_jax = _gauge_limit_points(rope_k, jnp.asarray(x_rope))
    hs = np.asarray(_latitude_height(us_jax, tuple(S["plane"])))
    us = np.asarray(us_jax)
    lat_errs: list[Any] = []
    gap_theory: list[float] = []
    for x, u, h in zip(x_rope, us, hs):
        h = float(h)
        gap_theory.append(1 - (n_max**2 * h**2 - n_max) / (n_max * (n_max - 1)))
        lat_errs.append(np.max(np.abs(x[:, 2] - u[2])))
    lat_err = np.asarray(lat_errs)
    checks.append(
        check(
            "rope_latitude",
            float(np.median(lat_err)),
            0.0,
            1e-3,
            "median over seeds of max_i |x_i,3 - u_3|: the RoPE configuration lies on the latitude circle at "
            f"the height of the gauge frame's limit point u; worst seed {lat_err.max():.3g} (seeds still "
            "converging at the final time, stop time = t1, are included)",
        )
    )
    checks.append(
        check(
            "rope_latitude_gap",
            rope_gap.mean(),
            float(np.mean(gap_theory)),
            1e-3,
            "mean G_x of the RoPE runs against 1 - (n^2 h^2 - n)/(n(n-1)), h = height of u, per seed",
        )
    )

    # ------------------------------------------------------ gauge equivalence
    with steps("gauge_equivalence"):
        n_eq = S["fig2_n"][0]
        x0 = sphere.uniform(k_eq, n_eq, d)
        y0 = _to_gauge_frame(rope_k, x0)
        ts_eq = np.linspace(0.0, S["fig2_t1"], 11)
        tr_rope = simulate(rope_k, x0, t1=S["fig2_t1"], dt=S["dt"], solver=S["solver"], ts=ts_eq)
        tr_usa = simulate(
            kernels.USA(beta), y0, t1=S["fig2_t1"], dt=S["dt"], solver=S["solver"], ts=ts_eq
        )
        assert tr_usa.xs is not None and tr_rope.xs is not None  # states saved (the default)
        eq_err = float(_gauge_equivalence_error(rope_k, tr_usa.xs, tr_rope.xs))
    checks.append(
        check(
            "gauge_equivalence",
            eq_err,
            0.0,
            1e-4,
            f"max |x_RoPE(t) - Psi^T y_USA(t)| over {len(ts_eq)} save times to tau={S['fig2_t1']:g}, n={n_eq}, float32",
        )
    )

    # ---------------------------------------------------------------- Fig. 3
    n3 = S["fig3_n"]
    fig3_models = {
        "USA": _model("usa", S),
        "distance bias": _model("distance-bias", S),
        "Toeplitz (m=1)": _model("toeplitz", S),
        "RoPE": rope_k,
        "generalised RoPE (wavy gauge)": _model("gauge", S),
        "prompts (K=3)": models["prompt"],
    }
    x0 = sphere.uniform(k_fig3, n3, d)
    ts3 = np.linspace(0.0, S["fig3_t1"], 81)
    fig3: dict[str, dict[str, Any]] = {}
    run3 = dict(dt=S["dt"], solver=S["solver"], early_stop=S["early_stop"])
    with steps("fig3") as part:
        # USA and the gauge kernels: one program (their per-particle Prompt forms, as Fig. 2)
        part.set_postfix_str("model=USA and the gauge kernels")
        gauge_like = {
            k: m
            for k, m in fig3_models.items()
            if isinstance(m, (kernels.USA, kernels.GaugeKernel))
        }
        together = _run_forms(gauge_like, x0, t1=S["fig3_t1"], saves=ts3.size, **run3)
        for name, k in fig3_models.items():
            part.set_postfix_str(f"model={name}")
            tr = (
                together[name]
                if name in together
                else simulate(
                    k,
                    x0,
                    t1=S["fig3_t1"],
                    ts=ts3,
                    save_states=False,
                    observables={"x": _identity},
                    **run3,
                )
            )
            fig3[name] = {
                "ts": np.asarray(tr.ts),
                "energy": np.asarray(tr.energy),
                "gap": np.asarray(tr.collapse_gap),
                "x": np.asarray(tr.observables["x"])[-1],
                "stop_time": float(tr.stop_time),
                "aux": np.asarray(k.default_aux(n3)),
            }
    db = fig3["distance bias"]
    checks.append(
        check(
            "distance_bias_dirac",
            db["gap"][-1],
            0.0,
            1e-2,
            f"G_x at the end of the distance-bias run (lam={S['lam']:g}, n={n3}); Prop. 11: Dirac",
        )
    )
    db_dirac_E = float(_dirac_energy_distance_bias(beta, S["lam"], fig3["distance bias"]["aux"]))
    checks.append(
        check(
            "distance_bias_dirac_energy",
            db["energy"][-1],
            db_dirac_E,
            1e-3,
            "final energy of the distance-bias run against its value at a Dirac, e^beta/(2 beta) mean_ij e^{-lam|s_i-s_j|}",
            relative=True,
        )
    )
    tp = fig3["Toeplitz (m=1)"]
    checks.append(
        check(
            "toeplitz_great_circle",
            tp["energy"][-1],
            float(theory.great_circle_energy(1)),
            1e-3,
            "final energy of the Toeplitz run; maximiser: uniform great circle, E = 1/4",
            relative=True,
        )
    )
    checks.append(
        check(
            "toeplitz_gap",
            tp["gap"][-1],
            theory.great_circle_gap(n3),
            1e-3,
            "G_x of the Toeplitz configuration; a uniform great circle has 1 + 1/(n-1)",
        )
    )
    checks.append(
        check(
            "toeplitz_rank",
            float(_gram_rank(tp["x"], 1e-3)),
            2.0,
            0.0,
            "numerical rank (singular values above 1e-3 of the largest) of the Toeplitz configuration",
        )
    )
    pr = fig3["prompts (K=3)"]
    checks.append(
        check(
            "prompt_clusters",
            float(metrics.num_clusters(jnp.asarray(pr["x"]), S["cluster_threshold_rad"])),
            float(S["num_prompts"]),
            0.0,
            f"clusters (angular threshold {S['cluster_threshold_rad']} rad) at the end of the prompt run, K=3",
        )
    )
    for name, key_ in (
        ("RoPE", "rope_fig3_max_energy"),
        ("generalised RoPE (wavy gauge)", "wavy_gauge_max_energy"),
        ("prompts (K=3)", "prompt_max_energy"),
        ("USA", "usa_max_energy"),
    ):
        checks.append(
            check(
                key_,
                fig3[name]["energy"][-1],
                e_max,
                1e-3,
                f"final energy of the {name} run (n={n3}) against e^beta/(2 beta)",
                relative=True,
            )
        )

    # ------------------------------------- Prop. 10, Prop. 4, Thm. 4 (iii) (own keys: earlier draws unchanged)
    tf = _toeplitz_fourier(S, k_tf, checks, steps)
    dob = _dobrushin(S, k_dob, checks, steps)
    na = _nonatomic(S, checks, steps)  # float64 prompts: a NumPy Generator seeded by the settings

    # ---------------------------------------------------------------- figures + data
    with steps("figures"):
        figures = _figures(out, S, fig2, fig3, fig3_models, e_max, db_dirac_E)
        figures += _extra_figures(out, S, tf, dob, na)
    np.savez_compressed(
        out / "extra_data.npz",
        **{f"toeplitz_{k}_x": v["x"] for k, v in tf.items()},
        **{f"toeplitz_{k}_energy": v["energy"] for k, v in tf.items()},
        dobrushin_ts=dob["ts"],
        dobrushin_w1=dob["W"],
        **{f"nonatomic_n{n}_scaled_mmd2": v for n, v in na["scaled"].items()},
        nonatomic_flow_x=na["x"],
    )
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
        ts=ts3,
        names=np.array(list(fig3)),
    )
    S["stop_times"] = {
        **{
            f"fig2/{m}/n={n}": {
                "mean": float(v["stop_time"].mean()),
                "min": float(v["stop_time"].min()),
                "max": float(v["stop_time"].max()),
                "failed": int(v["failed"].sum()),
            }
            for (m, n), v in fig2.items()
        },
        **{f"fig3/{name}": v["stop_time"] for name, v in fig3.items()},
    }
    S["fig2_wall_s"] = {f"n={n}": round(fig2[("usa", n)]["wall_s"], 2) for n in S["fig2_n"]}
    S["fig2_form_error"] = {f"n={n}": v for n, v in form_err.items()}
    steps.close()
    return write_summary(
        out, _NAME, quick=quick, settings=S, checks=checks, timings=timings, figures=figures
    )


# ----------------------------------------------------------------------------
# Prop. 10 (App. G): Toeplitz kernels with arbitrary Fourier coefficients
# ----------------------------------------------------------------------------


def _toeplitz_fourier(
    S: Mapping[str, Any], key: PRNGKeyArray, checks: list[dict[str, Any]], steps: Steps
) -> dict[str, dict[str, Any]]:
    T = S["toeplitz_fourier"]
    n, d = T["n"], S["d"]
    x0 = sphere.uniform(key, n, d)
    ts = np.linspace(0.0, T["t1"], T["saves"])
    res: dict[str, dict[str, Any]] = {}
    with steps("toeplitz_fourier"):
        for name, c_hat in T["kernels"].items():
            k = kernels.ToeplitzSeries(c_hat)  # same coefficient count: one compilation for all
            tr = simulate(
                k, x0, t1=T["t1"], dt=S["dt"], solver=S["solver"], ts=ts, early_stop=S["early_stop"]
            )
            x = np.asarray(tr.xs)[-1]
            res[name] = {
                "c_hat": list(c_hat),
                "m": k.dominant_mode(n),
                "e_max": float(k.max_energy(n)),
                "energy": np.asarray(tr.energy),
                "ts": np.asarray(tr.ts),
                "x": x,
                "winding": winding_number(x),
                "stop_time": float(tr.stop_time),
                "planarity": float(np.linalg.svd(x, compute_uv=False)[2] / np.sqrt(n)),
            }
    for name, r in res.items():
        coeffs = ", ".join(f"{c:g}" for c in r["c_hat"])
        checks.append(
            check(
                f"toeplitz_fourier_{name}_energy",
                r["energy"][-1],
                r["e_max"],
                1e-4,
                f"final energy of the Toeplitz-series run, c_hat(0..{len(r['c_hat']) - 1}) = ({coeffs}), n={n}, d={d}, "
                f"t={r['stop_time']:g}, against max_k c_hat(k)/2 (Prop. 10, reconstruction: Parseval); tolerance: the "
                "measured convergence at t1 (relative gap below 2e-5) plus float32 rounding",
                relative=True,
            )
        )
        checks.append(
            check(
                f"toeplitz_fourier_{name}_winding",
                r["winding"],
                r["m"],
                0.0,
                f"winding number of the final path s -> x(s) in its best-fit plane against the dominant mode m* = "
                f"{r['m']} (great circle traversed m* times; 0 = Dirac); third singular value / sqrt(n) = "
                f"{r['planarity']:.2g}",
            )
        )
    rows = {c["name"]: c for c in checks}
    agree = sum(
        rows[f"toeplitz_fourier_{name}_energy"]["pass"]
        and rows[f"toeplitz_fourier_{name}_winding"]["pass"]
        for name in res
    )
    checks.append(
        check(
            "toeplitz_fourier",
            agree,
            len(res),
            0.0,
            "number of Toeplitz-series kernels (dominant mode "
            + ", ".join(f"{k}: {r['m']}" for k, r in res.items())
            + ") whose final path has both the maximal energy max_k c_hat(k)/2 and the winding number of the dominant "
            "mode (the rows toeplitz_fourier_*_energy / _winding); Prop. 10, reconstruction",
        )
    )
    return res


# ----------------------------------------------------------------------------
# Prop. 4 (App. D): Dobrushin stability
# ----------------------------------------------------------------------------


def _dobrushin(
    S: Mapping[str, Any],
    keys: tuple[PRNGKeyArray, PRNGKeyArray],
    checks: list[dict[str, Any]],
    steps: Steps,
) -> dict[str, Any]:
    D = S["dobrushin"]
    n, d, beta = D["n"], S["d"], S["beta"]
    kx, ky = keys
    x0 = sphere.uniform(kx, n, d)
    y0 = sphere.normalize(x0 + D["eps"] * jax.random.normal(ky, x0.shape, x0.dtype))
    ts = np.linspace(0.0, D["t1"], D["saves"])
    k = kernels.USA(beta)
    with steps("dobrushin"):
        tx = simulate(k, x0, t1=D["t1"], dt=S["dt"], solver=S["solver"], ts=ts)
        ty = simulate(k, y0, t1=D["t1"], dt=S["dt"], solver=S["solver"], ts=ts)
        W = np.array([w1_empirical(a, b) for a, b in zip(np.asarray(tx.xs), np.asarray(ty.xs))])
    L = dobrushin_rate(beta)
    ratio = W[1:] / (np.exp(L * ts[1:]) * W[0])
    rate = float(np.max(np.log(W[1:] / W[0]) / ts[1:]))
    checks.append(
        check(
            "dobrushin_stability",
            float(ratio.max()),
            None,
            0.0,
            f"max over {len(ts) - 1} save times t in (0, {D['t1']:g}] of W1(t) / (e^(L t) W1(0)); USA beta={beta:g}, "
            f"n={n}, d={d}, two systems 'x0' and 'x0 + {D['eps']:g} N(0, I), renormalised', W1(0) = {W[0]:.4g}, exact "
            f"W1 (chordal, assignment); L = e^beta (3 + 2 beta) = {L:.4g} (Prop. 4, reconstruction: 2 M_h + L_x + "
            f"L_mu); largest measured rate max_t log(W1(t)/W1(0))/t = {rate:.3g} (pass: ratio <= 1)",
            passed=lambda v: v <= 1.0,
        )
    )
    return {"ts": ts, "W": W, "L": L, "rate": rate}


# ----------------------------------------------------------------------------
# Thm. 4 (iii): a continuum of prompt gauges realises a nonatomic target law
# ----------------------------------------------------------------------------


def _nonatomic(S: Mapping[str, Any], checks: list[dict[str, Any]], steps: Steps) -> dict[str, Any]:
    P = S["nonatomic"]
    kappa, gamma, beta = P["kappa"], P["mmd_gamma"], S["beta"]
    rng = np.random.default_rng(P["seed"])  # float64 prompts z (52 binary digits to split)
    const = vmf_mmd_constant(kappa, gamma)
    scaled: dict[int, np.ndarray] = {}
    with steps("nonatomic"):
        for n in P["n"]:  # the maximiser's law: x_i = G(z_i), z_i ~ eta = Leb[0, 1) i.i.d.
            scaled[n] = np.array(
                [
                    n * mmd2_to_vmf(vmf_prompt_map(rng.random(n), kappa), kappa, gamma)
                    for _ in range(P["replicates"])
                ]
            )
        # the flow: one prompt per token, gauges Psi_G (Householder), tokens started in the gauge
        # frame symmetric about u (pairs y, R_pi y: the half-turn about u), which pins the gauge-frame
        # limit point to u by symmetry; the flow then ends on x_i = Psi_i^T u = G(z_i).
        n = P["flow_n"]
        u = np.array([1.0, 0.0, 0.0])
        g = vmf_prompt_map(rng.random(n), kappa)
        H = householder_gauges(g, u)
        tang = rng.standard_normal((n // 2, 3))
        tang -= np.outer(tang @ u, u)
        half = u + P["cap"] * tang
        y = np.concatenate([half, 2 * np.outer(half @ u, u) - half])
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        x0 = np.einsum("nji,nj->ni", H, y)
        k = kernels.Prompt(beta, jnp.asarray(np.asarray(H, np.float32)))
        aux = jnp.asarray(np.arange(n, dtype=np.int32))
        tr = simulate(
            k,
            jnp.asarray(np.asarray(x0, np.float32)),
            aux,
            t1=P["flow_t1"],
            dt=S["dt"],
            solver=S["solver"],
            ts=np.linspace(0.0, P["flow_t1"], 21),
        )
        xf = np.asarray(tr.xs)[-1].astype(np.float64)
        flow_energy = float(np.asarray(tr.energy)[-1])
    pooled = np.concatenate(list(scaled.values()))
    se = float(pooled.std(ddof=1) / np.sqrt(pooled.size))
    ns = ", ".join(str(n) for n in P["n"])
    checks.append(
        check(
            "nonatomic_prompt",
            float(pooled.mean()),
            const,
            3 * se,
            f"n MMD^2 between the maximiser's law (1/n) sum delta_G(z_i), z_i ~ Leb[0,1) i.i.d. (one prompt each), and "
            f"the target vMF(e_3, kappa={kappa:g}) (Gaussian kernel gamma={gamma:g}, exact integrals), pooled over "
            f"n in {{{ns}}} x {P['replicates']} draws, against 1 - kbar (E MMD^2 = (1 - kbar)/n: distance -> 0 as "
            f"n^(-1/2)); tolerance 3 standard errors of the pooled mean ({se:.3g}); per-n means "
            + ", ".join(f"{v.mean():.3g}" for v in scaled.values()),
        )
    )
    e_max = float(_max_energy(beta))
    checks.append(
        check(
            "nonatomic_prompt_flow",
            float(np.max(np.linalg.norm(xf - g, axis=1))),
            0.0,
            1e-4,
            f"max_i |x_i(t={P['flow_t1']:g}) - G(z_i)|: the prompt-gauge flow (n={n}, beta={beta:g}, Householder gauges "
            f"Psi_G, tokens started in the gauge frame symmetric about u) ends on the constructed maximiser; final "
            f"energy {flow_energy:.7g} vs e^beta/(2 beta) = {e_max:.7g}; float32; prompt kernel "
            "e^(beta <Psi x, Psi' y>)/beta: reconstruction of the lost kernel (10) (docs/math/kernels.md, Prompts)",
        )
    )
    checks.append(
        check(
            "nonatomic_prompt_energy",
            flow_energy,
            e_max,
            1e-5,
            "final energy of that flow against e^beta/(2 beta) (Thm. 4 (i)); float32 rounding",
            relative=True,
        )
    )
    return {"scaled": scaled, "const": const, "x": xf, "n": n}


def _extra_figures(
    out: Path,
    S: Mapping[str, Any],
    tf: Mapping[str, Mapping[str, Any]],
    dob: Mapping[str, Any],
    na: Mapping[str, Any],
) -> list[str]:
    import matplotlib.pyplot as plt

    from .. import plotting

    files = []
    names = list(tf)
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 6.4))
    for j, name in enumerate(names):
        r = tf[name]
        x = r["x"]
        c = x - x.mean(axis=0)
        _, _, vt = np.linalg.svd(c, full_matrices=False)
        a, b = c @ vt[0], c @ vt[1]
        ax = axes[0, j]
        ax.plot(np.append(a, a[0]), np.append(b, b[0]), color="0.8", lw=0.6)
        ax.scatter(a, b, c=np.arange(len(a)), s=6, cmap="viridis")
        ax.set_xlim(-1.1, 1.1)
        ax.set_ylim(-1.1, 1.1)
        ax.set_aspect("equal")
        ax.set_title(
            f"{name}: c_hat = {tuple(r['c_hat'])}\nm* = {r['m']}, winding {r['winding']}",
            fontsize=8,
        )
        ax = axes[1, j]
        ax.plot(r["ts"], r["energy"], label="E(t)")
        ax.axhline(r["e_max"], color="r", ls="--", label=r"$\max_k \hat c(k) / 2$")
        ax.set_xlabel("t")
        ax.legend(fontsize=7)
    fig.suptitle(
        f"Prop. 10: Toeplitz kernels with Fourier coefficients c_hat(0..3), n={S['toeplitz_fourier']['n']}, "
        "d=3; top: final path (centred) in its best-fit plane (colour = position s, grey = label order)",
        fontsize=9,
    )
    files.append(plotting.savefig(fig, out / "toeplitz_fourier.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ts, W, L = dob["ts"], dob["W"], dob["L"]
    axes[0].semilogy(ts, W, label=r"$W_1(\mu_t, \nu_t)$ (exact)")
    top = W[0] * 1e3  # the bound grows like e^{L t}: drawn up to three decades above W_1(0)
    bound = W[0] * np.exp(L * ts)
    shown = bound <= top
    axes[0].semilogy(ts[shown], bound[shown], "r--", label=r"$e^{L t} W_1(0)$")
    axes[0].set_ylim(W.min() / 2, top)
    axes[0].set_xlabel("t")
    axes[0].legend(fontsize=8)
    axes[1].semilogy(ts[1:], W[1:] / (W[0] * np.exp(L * ts[1:])))
    axes[1].axhline(1.0, color="r", ls="--")
    axes[1].set_xlabel("t")
    axes[1].set_ylabel("ratio to the bound")
    fig.suptitle(
        f"Prop. 4: Dobrushin stability, USA beta={S['beta']:g}, n={S['dobrushin']['n']}, "
        f"L = e^beta (3 + 2 beta) = {L:.3g} (reconstruction)",
        fontsize=9,
    )
    files.append(plotting.savefig(fig, out / "dobrushin.png"))

    P = S["nonatomic"]
    kappa = P["kappa"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    w = np.linspace(-1, 1, 200)
    axes[0].hist(
        na["x"][:, 2], bins=30, range=(-1, 1), density=True, alpha=0.6, label="flow's final law"
    )
    axes[0].plot(
        w, kappa * np.exp(kappa * w) / (2 * np.sinh(kappa)), "r--", label="vMF height density"
    )
    axes[0].set_xlabel(r"$\langle x, e_3\rangle$")
    axes[0].legend(fontsize=8)
    ns = np.array(list(na["scaled"]))
    means = np.array([v.mean() / n for n, v in na["scaled"].items()])
    ses = np.array([v.std(ddof=1) / np.sqrt(v.size) / n for n, v in na["scaled"].items()])
    axes[1].errorbar(ns, means, yerr=ses, fmt="o", label=r"mean MMD$^2$ $\pm$ 1 s.e.")
    nn = np.geomspace(ns.min(), ns.max(), 50)
    axes[1].loglog(nn, na["const"] / nn, "r--", label=r"$(1 - \bar k) / n$")
    axes[1].set_xlabel("n")
    axes[1].legend(fontsize=8)
    fig.suptitle(
        f"Thm. 4 (iii): one prompt z ~ Leb[0,1) per token realises vMF(e_3, kappa={kappa:g}) on S^2 "
        f"(flow: n={na['n']})",
        fontsize=9,
    )
    files.append(plotting.savefig(fig, out / "nonatomic_prompt.png"))
    return [str(Path(f).name) for f in files]


def _figures(
    out: Path,
    S: Mapping[str, Any],
    fig2: Mapping[tuple[str, int], Mapping[str, Any]],
    fig3: Mapping[str, Mapping[str, Any]],
    fig3_models: Mapping[str, Model],
    e_max: float,
    db_dirac_E: float,
) -> list[str]:
    import matplotlib.pyplot as plt

    from .. import plotting

    files = []
    # Fig. 2 -----------------------------------------------------------------
    labels = {
        "usa": "USA baseline",
        "rope": "RoPE ($\\omega = 2\\pi$)",
        "prompt": "prompts ($K=3$)",
    }
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    floor = 1e-7
    for ax, m in zip(axes, labels):
        for n in S["fig2_n"]:
            v = fig2[(m, n)]
            g = np.maximum(v["gap"], floor)
            mean = g.mean(0)
            se = g.std(0, ddof=1) / np.sqrt(g.shape[0])
            plotting.plot_curves(
                ax,
                v["ts"],
                mean,
                label=f"n={n}",
                band=(np.maximum(mean - se, floor), mean + se),
                logy=True,
            )
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
        plotting.plot_configuration(
            ax,
            v["x"],
            color=v["aux"].astype(float),
            overlay=overlay,
            title=f"{name}\nE={v['energy'][-1]:.4g}, $G_x$={v['gap'][-1]:.3g}, "
            f"stop t={v['stop_time']:.3g}",
        )
    fig.suptitle(
        f"Fig. 3: final configurations, n={S['fig3_n']}, d=3, beta={S['beta']:g}, same initial state; "
        "red dashed: theory orbit / points (gauge frame limit point u)",
        fontsize=10,
    )
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


def _theory_overlay(name: str, k: Model, v: Mapping[str, Any]) -> Float[np.ndarray, "m d"]:
    x, aux = v["x"], v["aux"]
    s = np.linspace(0, 1, 200)
    if name in ("USA", "distance bias"):
        m = x.mean(0)
        return np.stack([m / np.linalg.norm(m)] * 2)
    if name.startswith("Toeplitz"):
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        th = 2 * np.pi * s
        return np.cos(th)[:, None] * vt[0] + np.sin(th)[:, None] * vt[1]
    return np.asarray(
        _overlay_orbit(
            cast(kernels.GaugeKernel, k),
            jnp.asarray(x),
            jnp.asarray(aux),
            jnp.asarray(s, jnp.float32),
        )
    )


# ----------------------------------------------------------------------------
# closed forms and samplers of the remaining claims (Prop. 10, Prop. 4, Thm. 4 (iii))
# ----------------------------------------------------------------------------


def winding_number(x: ArrayLike, *, point_tol: float = 1e-3) -> int:
    r"""Winding number of the closed path $i \mapsto x_i$ (label order, closed by $x_n \to x_1$) around its
    centre $\bar x$ in its best-fit plane, up to orientation.

    The plane is spanned by the top two right singular vectors $v_1, v_2$ of the centred rows
    $x_i - \bar x$; with $\varphi_i = \operatorname{atan2}(\langle x_i - \bar x, v_2\rangle, \langle x_i - \bar x, v_1\rangle)$ the
    increments $\varphi_{i+1} - \varphi_i$ wrapped into $(-\pi, \pi]$ sum to $2 \pi w$ over the closed loop,
    $w \in \mathbb Z$. Returns $|w|$ (the orientation of $v_1, v_2$ is arbitrary), and $0$ for a point
    (root-mean-square spread below ``point_tol``: a Dirac mass). Meaningful when consecutive points
    are less than $\pi$ apart around the centre: a great or latitude circle traversed $m$ times at
    $n > 2m$ equispaced labels gives $m$.

    Args:
        x: ``(n, d)`` configuration, ``d >= 2``, rows in label order.
        point_tol: spread below which the configuration is a point.

    Returns:
        the winding number $|w|$ (an ``int``).

    Example:
        >>> import numpy as np
        >>> s = np.arange(1, 33) / 32
        >>> winding_number(np.stack([np.cos(6 * np.pi * s), np.sin(6 * np.pi * s), 0 * s], 1))
        3
    """
    a = np.asarray(x, np.float64)
    if a.ndim != 2 or a.shape[1] < 2 or a.shape[0] < 1:
        raise ValueError(f"x must be an (n, d) configuration with d >= 2, got shape {a.shape}")
    c = a - a.mean(axis=0)
    if np.sqrt(np.mean(np.sum(c * c, axis=1))) < point_tol:
        return 0
    _, _, vt = np.linalg.svd(c, full_matrices=False)
    phi = np.arctan2(c @ vt[1], c @ vt[0])
    step = np.diff(np.concatenate([phi, phi[:1]]))
    step = np.pi - np.mod(np.pi - step, 2 * np.pi)  # wrapped into (-pi, pi]
    return abs(int(np.rint(np.sum(step) / (2 * np.pi))))


def dobrushin_rate(beta: RealScalarLike) -> float:
    r"""Rate $L$ of the Dobrushin estimate $W_1(\mu_t, \nu_t) \le e^{L t} W_1(\mu_0, \nu_0)$ (USA-AV
    Prop. 4, App. D) for the USA kernel $h = e^{\beta \langle x, y\rangle} / \beta$: $L = e^\beta (3 + 2 \beta)$.

    Reconstruction (the statement of Prop. 4 was lost in extraction; App. D.3-D.4 keep its
    hypotheses and the method). With $F(x; \mu) = \int \nabla_x h(x, y)\, d\mu(y)$ and the velocity
    $V[\mu](x) = P_x F(x; \mu)$, the hypotheses of D.3.2 hold with

    $$M_h = \sup \|\nabla_x h\| = e^\beta, \qquad L_x = \sup \|\nabla_x^2 h\| = \beta e^\beta, \qquad L_\mu = \sup \|\nabla_y \nabla_x h\| = \sup \|e^{\beta \langle x, y\rangle} (I + \beta\, y x^\top)\| = (1 + \beta) e^\beta$$

    (for $\|x\|, \|y\| \le 1$). Lemma 3 (with $\|P_x - P_{x'}\| \le 2 \|x - x'\|$) gives
    $\|V[\mu](x) - V[\mu](x')\| \le (2 M_h + L_x) \|x - x'\|$ and $\|V[\mu] - V[\nu]\| \le L_\mu W_1(\mu, \nu)$.
    Coupling (D.4): push an optimal coupling $\pi_0$ of $\mu_0, \nu_0$ along the two flows,
    $D(t) = \int \|X_t - Y_t\|\, d\pi_0$; then $D' \le (2 M_h + L_x) D + L_\mu W_1(\mu_t, \nu_t) \le L D$ since
    $W_1(\mu_t, \nu_t) \le D(t)$, so $W_1(\mu_t, \nu_t) \le D(t) \le e^{L t} W_1(\mu_0, \nu_0)$ with

    $$L = 2 M_h + L_x + L_\mu = e^\beta (3 + 2 \beta).$$

    $W_1$ is for the chordal distance $\|x - y\|$; empirical laws of $n$-particle systems are
    solutions, so the bound holds between two particle systems.

    Example:
        >>> round(dobrushin_rate(1.0), 4)   # 5 e
        13.5914
    """
    b = float(beta)
    if not (math.isfinite(b) and b > 0):
        raise ValueError(f"beta must be > 0 and finite, got {beta!r}")
    return math.exp(b) * (3.0 + 2.0 * b)


def w1_empirical(x: ArrayLike, y: ArrayLike) -> float:
    r"""Exact $W_1$ between the uniform empirical laws of ``x`` and ``y`` (same ``n``), chordal cost:
    $W_1 = \min_\sigma \frac1n \sum_i \|x_i - y_{\sigma(i)}\|$ over permutations $\sigma$ (Birkhoff: an
    optimal coupling of two uniform laws on $n$ atoms is a permutation), solved by
    ``scipy.optimize.linear_sum_assignment``.

    Example:
        >>> import numpy as np
        >>> x = np.eye(3)
        >>> round(w1_empirical(x, x[::-1]), 6)   # the same law
        0.0
    """
    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(
            f"x and y must be (n, d) arrays of the same shape, got {a.shape} and {b.shape}"
        )
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    C = cdist(a, b)
    r, c = linear_sum_assignment(C)
    return float(C[r, c].mean())


def _split_digits(
    z: Float[ArrayLike, "*shape"],
) -> tuple[Float[np.ndarray, "*shape"] | np.float64, Float[np.ndarray, "*shape"] | np.float64]:
    """``z in [0, 1)`` -> ``(u1, u2)``: odd and even binary digits (26 each, float64), centred."""
    q = np.floor(np.asarray(z, np.float64) * 2.0**52).astype(np.uint64)
    u1, u2 = np.zeros(q.shape), np.zeros(q.shape)
    for j in range(26):
        u1 += ((q >> np.uint64(51 - 2 * j)) & np.uint64(1)).astype(np.float64) * 2.0 ** -(j + 1)
        u2 += ((q >> np.uint64(50 - 2 * j)) & np.uint64(1)).astype(np.float64) * 2.0 ** -(j + 1)
    return u1 + 2.0**-27, u2 + 2.0**-27


def vmf_prompt_map(z: ArrayLike, kappa: RealScalarLike) -> Float[np.ndarray, "*shape 3"]:
    r"""A measurable target map $G : [0, 1) \to S^2$ with $G_\# \mathrm{Leb} = \mathrm{vMF}(e_3, \kappa)$ (USA-AV Thm. 4 (iii)).

    A one-dimensional nonatomic prompt law realises a law on $S^2$: split the binary digits of
    $z = 0.b_1 b_2 b_3 \dots$ into $u_1 = 0.b_1 b_3 \dots$, $u_2 = 0.b_2 b_4 \dots$ (a measure-preserving map
    $[0, 1) \to [0, 1)^2$, the Borel isomorphism behind "standard Borel and nonatomic"; 26 digits
    each from a float64 $z$), then invert the von Mises-Fisher CDFs: the height $w = \langle x, e_3\rangle$
    has density $\kappa e^{\kappa w} / (2 \sinh \kappa)$ on $[-1, 1]$ and the azimuth is uniform, so

    $$w = 1 + \frac1\kappa \log\left(u_1 + (1 - u_1) e^{-2 \kappa}\right), \qquad G(z) = \left(\sqrt{1 - w^2} \cos 2 \pi u_2,\ \sqrt{1 - w^2} \sin 2 \pi u_2,\ w\right).$$

    Args:
        z: prompts in $[0, 1)$, any shape (float64; float32 inputs keep only 24 digits).
        kappa: concentration, ``> 0``.

    Returns:
        ``z.shape + (3,)`` unit vectors (float64).

    Example:
        >>> import numpy as np
        >>> x = vmf_prompt_map(np.random.default_rng(0).random(20000), 2.0)
        >>> round(float(x[:, 2].mean()), 2)   # E<x, e_3> = coth(2) - 1/2
        0.54
    """
    k = float(kappa)
    if not (math.isfinite(k) and k > 0):
        raise ValueError(f"kappa must be > 0 and finite, got {kappa!r}")
    zz = np.asarray(z, np.float64)
    if zz.size and (zz.min() < 0 or zz.max() >= 1):
        raise ValueError(f"z must lie in [0, 1), got range [{zz.min()}, {zz.max()}]")
    u1, u2 = _split_digits(zz)
    w = 1.0 + np.log(u1 + (1.0 - u1) * np.exp(-2.0 * k)) / k
    r = np.sqrt(np.clip(1.0 - w * w, 0.0, None))
    return np.stack([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2), w], axis=-1)


def householder_gauges(targets: ArrayLike, u: ArrayLike) -> Float[np.ndarray, "n d d"]:
    r"""Gauges $\Psi_i \in O(d)$ with $\Psi_i^\top u = g_i$: the reflections $\Psi_i = I - 2 v_i v_i^\top / \|v_i\|^2$,
    $v_i = u - g_i$ ($\Psi_i = I$ where $g_i = u$). With them the prompt kernel
    $h = e^{\beta \langle \Psi_\xi x, \Psi_\zeta y\rangle} / \beta$ (``mf.kernels.Prompt``, one prompt per token)
    is maximised by $x_i = \Psi_i^\top u = g_i$ (Thm. 4 (ii): the gauge $\Psi_G$ of a target map $G$).

    Example:
        >>> import numpy as np
        >>> H = householder_gauges(np.array([[0.0, 1.0, 0.0]]), np.array([1.0, 0.0, 0.0]))
        >>> (H[0].T @ np.array([1.0, 0.0, 0.0])).round(6).tolist()
        [0.0, 1.0, 0.0]
    """
    g = np.asarray(targets, np.float64)
    uu = np.asarray(u, np.float64)
    if g.ndim != 2 or uu.shape != (g.shape[1],):
        raise ValueError(f"targets must be (n, d) and u (d,), got {g.shape} and {uu.shape}")
    v = uu[None, :] - g
    nv = np.sum(v * v, axis=1)
    ok = nv > 1e-24
    H = (
        np.eye(g.shape[1])[None]
        - 2.0 * v[:, :, None] * v[:, None, :] / np.where(ok, nv, 1.0)[:, None, None]
    )
    return np.where(ok[:, None, None], H, np.eye(g.shape[1])[None])


def _vmf_kernel_mean(
    x: Float[ArrayLike, "*shape 3"], kappa: float, gamma: float
) -> Float[np.ndarray, "*shape"] | np.float64:
    """``(K nu)(x) = int e^{gamma (<x, y> - 1)} dnu(y)`` for ``nu = vMF(e_3, kappa)``."""
    r = np.linalg.norm(
        gamma * np.asarray(x, np.float64) + kappa * np.array([0.0, 0.0, 1.0]), axis=-1
    )
    return np.exp(np.log(kappa / r) + _log_sinh(r) - _log_sinh(kappa) - gamma)


def _log_sinh(r: Float[ArrayLike, "*shape"]) -> Float[np.ndarray, "*shape"] | np.float64:
    r = np.asarray(r, np.float64)
    return r + np.log1p(-np.exp(-2.0 * r)) - np.log(2.0)


def vmf_mmd_constant(kappa: RealScalarLike, gamma: RealScalarLike = 4.0) -> float:
    r"""$1 - \bar k$ with $\bar k = \iint k\, d\nu\, d\nu$, $k(x, y) = e^{\gamma (\langle x, y\rangle - 1)}$, $\nu = \mathrm{vMF}(e_3, \kappa)$:
    the constant of $\mathbb E[\mathrm{MMD}^2(\nu_n, \nu)] = (1 - \bar k) / n$ for $n$ i.i.d. draws $\nu_n$ (V-statistic:
    $\mathbb E \frac{1}{n^2} \sum_{i,j} k(x_i, x_j) = \frac1n + (1 - \frac1n) \bar k$).

    Funk-Hecke: $(K \nu)(x) = \int k(x, y)\, d\nu(y) = e^{-\gamma} \frac{\kappa \sinh r}{r \sinh \kappa}$,
    $r = \|\gamma x + \kappa e_3\|$; $\bar k$ integrates it against the height density
    $\kappa e^{\kappa w} / (2 \sinh \kappa)$ (``scipy.integrate.quad``).

    Example:
        >>> round(vmf_mmd_constant(2.0), 4)
        0.783
    """
    from scipy.integrate import quad

    k, g = float(kappa), float(gamma)
    if not (math.isfinite(k) and k > 0 and math.isfinite(g) and g > 0):
        raise ValueError(f"kappa and gamma must be > 0 and finite, got {kappa!r}, {gamma!r}")

    def integrand(w: float) -> float:
        x = np.array([math.sqrt(max(1.0 - w * w, 0.0)), 0.0, w])
        return float(_vmf_kernel_mean(x, k, g)) * math.exp(
            math.log(k) + k * w - math.log(2.0) - float(_log_sinh(k))
        )

    return 1.0 - quad(integrand, -1.0, 1.0, epsabs=1e-13, epsrel=1e-12)[0]


def mmd2_to_vmf(x: ArrayLike, kappa: RealScalarLike, gamma: RealScalarLike = 4.0) -> float:
    r"""$\mathrm{MMD}^2$ between the empirical law of ``x`` and $\nu = \mathrm{vMF}(e_3, \kappa)$ (exact, no sample of $\nu$),
    kernel $k(x, y) = e^{\gamma (\langle x, y\rangle - 1)}$ (``mf.metrics.mmd``'s Gaussian with $\gamma = 1/\sigma^2$):

    $$\mathrm{MMD}^2 = \frac{1}{n^2} \sum_{i,j} k(x_i, x_j) - \frac2n \sum_i (K \nu)(x_i) + \bar k$$

    with $(K \nu)$ and $\bar k$ as in ``vmf_mmd_constant``. Float64, $O(n^2)$ memory.

    Example:
        >>> import numpy as np
        >>> x = vmf_prompt_map(np.random.default_rng(1).random(2000), 2.0)
        >>> bool(2000 * mmd2_to_vmf(x, 2.0) < 3.0)   # n MMD^2 has mean 1 - kbar = 0.78
        True
    """
    a = np.asarray(x, np.float64)
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"x must be an (n, 3) array, got shape {a.shape}")
    k, g = float(kappa), float(gamma)
    kbar = 1.0 - vmf_mmd_constant(k, g)
    return float(
        np.mean(np.exp(g * (a @ a.T - 1.0))) - 2.0 * np.mean(_vmf_kernel_mean(a, k, g)) + kbar
    )
