r"""The sweep kind ``particles``: the dynamics of ``n`` particles of any registry model
(``mf.kernels.MODELS``: usa, rope, sa, ... and models registered from outside).

A point ``(model, n, d, params, seed)`` starts from ``x0 = mf.sphere.uniform(jax.random.key(seed),
n, d)`` and runs ``mf.simulate`` with the model ``mf.kernels.build(model, params, d=d)`` (the
registry's constructor, the swept parameters traced) and the spec's ``[time]``; with
``model.noise`` (``mf.noise``) the run is the SDE of ``Noise.coerce(noise, sigma=sigma)`` (``sigma``
traced) driven by the key ``jax.random.fold_in(jax.random.key(seed), 1)``, the key of
``meanfield simulate --noise NAME --sigma S --seed seed``; with ``model.frequencies``
(``mf.frequencies``, ``d = 2``) every token rotates at its natural frequency, ``mf.simulate(
frequencies=law.sample(n, key=..., dtype=dtype))`` with ``law = Distribution.coerce(frequencies,
spread=spread)`` (``spread`` traced): the law's midpoint quantiles, or draws from the key
``jax.random.key(frequency_seed)``, the same at every seed (``meanfield simulate --frequencies NAME
--spread S [--frequency-seed K]``). It records the
observables at the save times (``collapse_gap``, ``energy``, ``clusters``, ``token_similarity``,
``order_parameter``, ``mean_radius`` for the schemes with a radius, ``mf.normalization``) or once
(``first_merge_time``, ``num_plateaus``, ``final_clusters``), the stop time and the step count.
Its memory and cost are ``meanfield._resources.run_cost`` (shared with ``meanfield simulate``)
with the model's ``footprint``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, cast

import numpy as np

from .. import _resources
from .._params import Param
from .._resources import Cost, run_cost
from .plan import grid_model
from .spec import (
    _ENERGY_OBSERVABLES,
    SCALAR_SIM_OBSERVABLES,
    SIM_OBSERVABLES,
    GroupEstimate,
    ParticleGrid,
    PointProgram,
    Spec,
    backend_key,
    register_kind,
)

__all__ = ["Particles", "PARTICLES", "CLUSTER_OBSERVABLES", "DESCRIPTIONS", "counts_clusters"]

#: Observables that count clusters at every save (``metrics.num_clusters``).
CLUSTER_OBSERVABLES = ("clusters", "first_merge_time", "final_clusters")

#: Descriptions of the data variables of a particles store.
DESCRIPTIONS = {
    "collapse_gap": "collapse gap G_x = 1 - 1/(n(n-1)) sum_{i!=j} <x_i, x_j>",
    "energy": "interaction energy E = 1/(2 n^2) sum h (times e^-beta when rescaled)",
    "clusters": "number of clusters (angular threshold cluster_threshold)",
    "first_merge_time": "first save time with fewer clusters than at t = 0 (inf: none before t1; mf.metastability)",
    "num_plateaus": "number of energy plateaus: metastable stages (mf.metastability.num_plateaus, rate_tol 0.02, rel_tol 0.02, min_points 3)",
    "final_clusters": "number of clusters at the last save (angular threshold cluster_threshold)",
    "token_similarity": "token similarity ||Pi X||^2 / ||X||^2",
    "order_parameter": "order parameter r = |(1/n) sum_i x_i| (mf.metrics.order_parameter; r^2 = token_similarity on the sphere)",
    "mean_radius": "mean radius (1/n) sum_i r_i of the tokens x_i = r_i theta_i (mf.normalization: pre, mix, peri)",
    "stop_time": "time at which the run ended (t1 unless stopped early or failed)",
    "num_steps": "accepted solver steps",
}


def counts_clusters(spec: Spec) -> bool:
    """Whether the spec's observables need the cluster count at every save."""
    return any(o in spec.observables for o in CLUSTER_OBSERVABLES)


def _batch_cost(spec: Spec, kind: str, n: int, d: int) -> Callable[[int], Cost]:
    """``batch -> run_cost`` of ``batch`` points of ``kind`` at shape ``(n, d)``: the group's model
    (``grid_model``), its smallest step and footprint looked at once."""
    T = cast(dict, spec.time)
    reference = spec.step_rule == "reference"
    model = grid_model(spec, kind, n, d)
    dt = float(np.min(model.reference_step(T["dt"]))) if reference else T["dt"]
    footprint = model.footprint(n, d)
    noise = _noise_numbers(spec, n, d)

    def cost(batch: int) -> Cost:
        return run_cost(
            n=n,
            d=d,
            t1=T["t1"],
            dt=dt,
            saves=len(cast(np.ndarray, spec.ts)),
            itemsize=8 if spec.dtype == "float64" else 4,
            batch=batch,
            solver=T["solver"],
            footprint=footprint,
            save_states=False,
            observables=len(spec.observables) + 2,
            clusters=counts_clusters(spec),
            step_grid=not reference,
            max_steps=T.get("max_steps"),
            noise=noise,
        )

    return cost


def _noise_numbers(spec: Spec, n: int, d: int) -> int:
    """The numbers a step of a point's Brownian path draws (the largest over a noise axis), 0
    without ``model.noise``: ``run_cost``'s ``noise``."""
    names = spec.params.get("noise")
    if names is None:
        return 0
    from ..noise import Noise

    values = names if isinstance(names, (list, tuple)) else [names]
    return max(math.prod(Noise.coerce(v, sigma=0.0).control_shape(n, d)) for v in values)


def _point_cost(spec: Spec, kind: str, n: int, d: int, batch: int) -> Cost:
    """``run_cost`` of ``batch`` points of ``kind`` at shape ``(n, d)``."""
    return _batch_cost(spec, kind, n, d)(batch)


class Particles(ParticleGrid):
    """The particle dynamics of every registry model (``[model] kind = NAME``, a list of names:
    a grid axis ``model``)."""

    name: ClassVar[str] = "particles"
    summary: ClassVar[str] = "particle dynamics"
    descriptions: ClassVar[dict[str, str]] = DESCRIPTIONS

    def spec_names(self) -> tuple[str, ...]:
        from .. import kernels

        return tuple(kernels.MODELS)

    def model_params(self, model: str) -> tuple[Param, ...]:
        from .. import kernels

        return tuple(kernels.MODELS[model].params)

    def required_dimension(self, model: str) -> int | None:
        from .. import kernels

        return kernels.MODELS[model].d

    def has_energy(self, model: str) -> bool:
        from .. import kernels

        return kernels.MODELS[model].has_energy

    def observables(self, kinds: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if any(not self.has_energy(k) for k in kinds):
            return tuple(o for o in SIM_OBSERVABLES if o not in _ENERGY_OBSERVABLES), (
                "collapse_gap",
            )
        return SIM_OBSERVABLES, ("collapse_gap", "energy")

    def point_memory(self, spec: Spec, model: str, n: int, d: int) -> int:
        return _point_cost(spec, model, n, d, 1).point_bytes

    def estimate(self, spec: Spec, model: str, n: int, d: int) -> GroupEstimate:
        """``point_memory`` and ``cost`` from one look at the group's model (``grid_model``)."""
        cost = _batch_cost(spec, model, n, d)
        return GroupEstimate(cost(1).point_bytes, cost)

    def cost(self, spec: Spec, model: str, n: int, d: int, batch: int, point_bytes: int) -> Cost:
        r"""Steps $\lfloor t_1 / \mathrm{dt} \rfloor + \text{saves} + 1$ (``dt`` the smallest step
        of the reference rule), the host step grid of a concrete fixed step, the states, the saved
        observables and the pairwise working set per point, $4 d + 8$ flop a pair and a field
        evaluation (``meanfield._resources.run_cost``)."""
        return _point_cost(spec, model, n, d, batch)

    def point_program(
        self, spec: Spec, model: str, n: int, d: int, backend: str | None = None
    ) -> PointProgram:
        """``backend``: the path the point runs (``"native"`` or ``"xla"``, the store's recorded
        decision, ``backends``); ``None``: the spec's ``model.backend``."""
        return _program(spec, model, n, d, spec.backend if backend is None else backend)

    def backends(self, spec: Spec, shapes: list[tuple[str, int, int]]) -> dict[str, str]:
        r"""``mf.kernels.resolve_backend(spec.backend, n, d, dtype, measured=False)`` of each group:
        ``"auto"`` is the fused kernel wherever it is available and takes the dtype and ``d``,
        never a timing (the crossover record of the kernel cache would make the numbers depend on
        the cache: float32 results differ by about 1e-7 between the paths); ``"native"`` where
        the kernel cannot run is a ``ValueError`` naming the group, before the store exists."""
        from .. import kernels

        out = {}
        for kind, n, d in shapes:
            try:
                out[backend_key(kind, n, d)] = kernels.resolve_backend(
                    spec.backend, n, d, spec.dtype, measured=False
                )
            except ValueError as e:
                raise ValueError(
                    f"model.backend = {spec.backend!r} cannot run {kind} at n = {n}, d = {d}: {e}"
                ) from None
        return out

    def output_layout(self, spec: Spec) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {
            o: (() if o in SCALAR_SIM_OBSERVABLES else ("time",)) for o in spec.observables
        }
        out["stop_time"] = ()
        out["num_steps"] = ()
        return out

    def point_store_bytes(self, spec: Spec) -> int:
        b = 8 if spec.dtype == "float64" else 4
        return len(cast(np.ndarray, spec.ts)) * len(spec.observables) * b + 2 * b + 1

    def describe_notes(self, spec: Spec) -> list[str]:
        lines = []
        if spec.step_rule == "reference":
            lines.append(
                f"steps: dt(beta) = {cast(dict, spec.time)['dt']:g} / max(sqrt(beta) e^(beta - 1/2), 1) (step_rule = "
                f"'reference'), one beta per chunk so a chunk runs its own step count"
            )
        rule = spec.step_variant
        if not rule.tangent:
            lines.append(f"step: {rule.name} ({rule.update}; time.step = {rule.name!r})")
        noise = spec.params.get("noise")
        if noise is not None:
            sigma = (
                f"a traced axis of {len(spec.axes['sigma'])} values"
                if "sigma" in spec.axes
                else f"{spec.params['sigma']:g}"
            )
            lines.append(
                f"noise: {noise if isinstance(noise, str) else ', '.join(noise)} (mf.noise), sigma "
                f"{sigma}; the path of seed s from jax.random.fold_in(jax.random.key(s), 1)"
            )
        law = spec.params.get("frequencies")
        if law is not None:
            spread = (
                f"a traced axis of {len(spec.axes['spread'])} values"
                if "spread" in spec.axes
                else f"{spec.params['spread']:g}"
            )
            seed = spec.params.get("frequency_seed")
            lines.append(
                f"frequencies: {law if isinstance(law, str) else ', '.join(law)} "
                f"(mf.frequencies), spread {spread}; "
                + (
                    "the law's midpoint quantiles"
                    if seed is None
                    else f"drawn from jax.random.key({seed}) (every seed)"
                )
            )
        return lines

    def describe_warnings(self, spec: Spec, shapes: list[tuple[str, int, int]]) -> list[str]:
        lines = []
        limit = float(np.log(np.finfo(spec.dtype).max))
        over = sum(
            int(np.sum(grid_model(spec, k, n, d).overflows(spec.dtype))) for k, n, d in shapes
        )
        if over:
            lines.append(
                f"warning: {over} (shape, beta) pair(s) with beta >= {limit:.1f} overflow exp(beta <x, y>) "
                f"in {spec.dtype}; those points will be recorded as failed (set model.rescaled = true)"
            )
        return lines + _step_warnings(spec, shapes)


def _step_warnings(spec: Spec, shapes: list[tuple[str, int, int]]) -> list[str]:
    r"""Fixed explicit steps much longer than the interaction time scale overshoot (the energy
    then decreases along a run): the rule of ``meanfield simulate``
    (``meanfield._resources.step_ratios``: $\mathrm{dt} \times \text{rate} > 1$, rate $\sqrt\beta\, e^{\beta - 1/2}$
    for exp kernels, $\sqrt\beta\, e^{-1/2}$ rescaled, $\beta$ for normalised
    self-attention; measured: projected RK2 at dt = 0.05, beta = 4, USA, dt x rate = 3.3,
    lost energy), over every (shape, beta) pair of the grid."""
    if spec.step_rule == "reference":
        return []  # reference rule: dt x rate <= dt by construction
    T = cast(dict, spec.time)
    ratios = [
        _resources.step_ratios(
            grid_model(spec, k, n, d).interaction_rate(), T["dt"], solver=T["solver"]
        )
        for k, n, d in shapes
    ]
    if not any(np.any(np.asarray(r) > 0) for r in ratios):
        return []  # no model of this sweep has a rate
    text = _resources.step_warning_text(
        np.concatenate([np.ravel(r) for r in ratios]),
        T["dt"],
        dt_name="time.dt",
        rescaled_hint="model.rescaled = true",
    )
    return [text] if text else []


def _program(spec: Spec, kind: str, n: int, d: int, backend: str) -> PointProgram:
    """The point program of model ``kind`` at static shape ``(n, d)`` on ``backend``
    (``Particles.point_program``)."""
    import diffrax
    import jax
    import jax.numpy as jnp

    from .. import integrate, kernels, metastability, metrics, sphere
    from . import store

    dtype = jnp.dtype(spec.dtype)
    T = cast(dict, spec.time)
    thr = spec.cluster_threshold
    extra: dict[str, Any] = {}
    counts = counts_clusters(spec)
    if counts:
        extra["clusters"] = lambda x: metrics.num_clusters(x, thr).astype(dtype)
    if "token_similarity" in spec.observables:
        extra["token_similarity"] = metrics.token_similarity
    if "order_parameter" in spec.observables:
        extra["order_parameter"] = metrics.order_parameter
    if "mean_radius" in spec.observables:  # mf.simulate passes the radii to a `radius` parameter
        extra["mean_radius"] = lambda x, radius: jnp.mean(radius).astype(dtype)

    # the registry's parameters of this kind: fixed values from the spec, swept ones traced
    # (those that do not apply at this value of a static axis, ``spec.inert_for(kind)``: their defaults)
    names = {p.name for p in kernels.MODELS[kind].params} - spec.inert_for(kind)
    fixed = {k: v for k, v in spec.params.items() if k in names and k not in spec.axes}
    noise_of = _noise_of(spec)
    frequencies_of = _frequencies_of(spec, n, dtype)

    ts = cast(np.ndarray, spec.ts)
    run_time = spec.run_time
    dt, max_steps = T["dt"], T.get("max_steps")
    reference = spec.step_rule == "reference"
    if reference:
        # beta-dependent step, traced: one compilation for the whole beta axis; the bound on
        # the step count comes from the smallest step of this shape's betas
        betas = np.asarray(spec.beta_values(n, d), dtype=np.float64)
        over = kernels.MODELS[kind].over_grid(fixed, d, beta=betas)
        h_min = float(np.min(over.reference_step(T["dt"])))
        max_steps = max_steps or int(np.ceil(T["t1"] / h_min)) + len(ts) + 2

    def sim(params: dict[str, Any], seed: Any) -> dict[str, Any]:
        key = jax.random.key(seed)
        x0 = sphere.uniform(key, n, d, dtype)
        traced = {  # integer parameters (weight_seed) stay integers: a PRNG key's seed
            k: v if jnp.issubdtype(v.dtype, jnp.integer) else v.astype(dtype)
            for k, v in params.items()
            if k in names
        }
        model = kernels.build(kind, {**fixed, **traced}, d=d, dtype=dtype)
        step: Any = model.reference_step(T["dt"]) if reference else dt
        traj = integrate.simulate(
            model,
            x0,
            time=run_time.replace(dt=step, max_steps=max_steps),  # the spec's [time], as simulate's
            observables=extra,
            save_states=False,
            backend=backend,
            adjoint=diffrax.ForwardMode(),  # no reverse-mode gradients here: no checkpointed loop to trace
            # the key of `meanfield simulate --noise ... --seed seed`: x0 from key(seed), the path from
            # fold_in(key(seed), 1)
            noise=None if noise_of is None else noise_of(params),
            key=None if noise_of is None else jax.random.fold_in(key, 1),
            frequencies=None if frequencies_of is None else frequencies_of(params),
        )
        vals = {"collapse_gap": traj.collapse_gap, "energy": traj.energy, **traj.observables}
        if counts:  # mf.metastability observables: one number per point
            vals["first_merge_time"] = metastability.first_merge_time(
                traj.ts, vals["clusters"]
            ).astype(dtype)
            vals["final_clusters"] = vals["clusters"][-1]
        if "num_plateaus" in spec.observables:
            energy = cast(Any, traj.energy)  # a model with an energy (checked by the spec)
            vals["num_plateaus"] = metastability.num_plateaus(energy).astype(dtype)
        out = {o: vals[o] for o in spec.observables}
        out["stop_time"] = traj.stop_time.astype(dtype)
        out["num_steps"] = jnp.asarray(traj.num_steps, jnp.int32)
        # +inf is a result in store.INFINITE_RESULTS (first_merge_time: nothing merged before t1)
        finite = jnp.all(
            jnp.stack(
                [
                    jnp.all(
                        (jnp.isfinite(out[o]) | (out[o] == jnp.inf))
                        if o in store.INFINITE_RESULTS
                        else jnp.isfinite(out[o])
                    )
                    for o in spec.observables
                ]
            )
        )
        out["status"] = jnp.where(traj.failed | ~finite, store.FAILED, store.OK).astype(jnp.int8)
        return out

    return sim


def _noise_of(spec: Spec) -> Callable[[dict[str, Any]], Any] | None:
    """``params -> the point's noise`` (``mf.noise.Noise.coerce(model.noise, sigma=...)``, ``sigma``
    the point's traced value on a ``sigma`` axis), or None for a spec without ``model.noise``."""
    name = spec.params.get("noise")
    if name is None:
        return None
    from ..noise import Noise

    def noise(params: dict[str, Any]) -> Any:
        sigma = params["sigma"] if "sigma" in spec.axes else spec.params["sigma"]
        return Noise.coerce(name, sigma=sigma)

    return noise


def _frequencies_of(spec: Spec, n: int, dtype: Any) -> Callable[[dict[str, Any]], Any] | None:
    """``params -> the point's (n,) angular velocities`` (``Distribution.coerce(model.frequencies,
    spread=...).sample(n, key=..., dtype=dtype)``, ``spread`` the point's traced value on a ``spread``
    axis; ``key`` ``jax.random.key(model.frequency_seed)`` or None: the midpoint quantiles), or None
    for a spec without ``model.frequencies``."""
    name = spec.params.get("frequencies")
    if name is None:
        return None
    import jax

    from ..frequencies import Distribution

    seed = spec.params.get("frequency_seed")

    def frequencies(params: dict[str, Any]) -> Any:
        spread = params["spread"] if "spread" in spec.axes else spec.params["spread"]
        law = Distribution.coerce(name, spread=spread)
        return law.sample(n, key=None if seed is None else jax.random.key(seed), dtype=dtype)

    return frequencies


#: The kind object (registered).
PARTICLES = register_kind(Particles())
