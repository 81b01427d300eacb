"""A sweep specification: TOML text parsed, validated and normalised (``Spec``).

A sweep is a TOML file (read with ``tomllib``)::

    name = "smoke"
    dtype = "float32"                  # or "float64"

    [model]
    kind = "usa"                       # any name of mf.kernels.MODELS (the registry): usa,
                                       # distance-bias, toeplitz, rope, phase-field, gauge, prompt,
                                       # sa; a list of names is a grid axis "model";
                                       # or "attention": one fixed query against n uniform keys
                                       # (``_attention``: no dynamics, no [time]);
                                       # or "continuum": the density solver (``_continuum``,
                                       # its own schema: grid over beta, mode, eps; no seeds)
    # the registry's parameters of the kind (all but beta): a number is fixed, a list of
    # numbers is a grid axis (traced parameters: weight_seed an int32 axis); static choices,
    # integers and booleans (mask, normalization, attention, heads, geometry, ...) one value or
    # a list: a static axis, one compilation per value (``Spec.statics``, ``Spec.at``); optional ones (Param.optional: mask, slope, width, include_self,
    # mask_normalized; normalization, alpha, switch_time; sa's attention, sinkhorn_iters,
    # tie_tol, heads, weights, value, weight_seed, regen_period) are recorded (hashed) only
    # when not their default
    backend = "xla"                    # optional: "auto" (default), "native" or "xla" (mf.simulate's
                                       # backend; hashed into the store only when given)
    noise = "independent"              # optional: the run's noise (mf.noise.Noise.names(): independent,
                                       # common; a list: a static axis), with
    sigma = [0.0, 0.1, 0.2]            # its amplitude >= 0: a number, or a list (a traced axis "sigma",
                                       # one compilation); the path of seed s: fold_in(key(s), 1);
                                       # time.solver = "rk2", no early_stop, no radial scheme;
                                       # both recorded (hashed) only when given
    frequencies = "lorentzian"         # optional: natural frequencies on the circle (grid.d = 2;
                                       # mf.frequencies.Distribution.names(): lorentzian, gaussian;
                                       # a list: a static axis), with
    spread = [0.25, 0.5]               # the law's scale > 0: a number, or a list (a traced axis
                                       # "spread", one compilation): the midpoint quantiles, or
    frequency_seed = 7                 # optionally (one integer >= 0, fixed) draws from key(7);
                                       # no early_stop, no radial scheme; recorded only when given

    [grid]
    n = [16, 32]                       # static shapes: one compilation per (model, n, d)
    d = 3                              # an int, or a list (a grid axis); gauge needs d = 3
    beta = [0.5, 1.0, 2.0, 4.0]        # a list; or {critical = [f, ...]}: beta = f n^(2/(d-1));
                                       # or {c = [c, ...], p = 0.5}: beta = c n^p
    seeds = 8                          # seeds seed .. seed + seeds - 1
    seed = 0

    [time]                             # not for kind = "attention"
    t1 = 5.0
    dt = 0.05
    solver = "rk2"                     # euler, rk2, rk4, tsit5, dopri5, heun (rtol/atol then)
    save = 11                          # number of equally spaced save times, or a list
    early_stop = 1e-8                  # optional (paper App. B.1)
    step_rule = "reference"            # optional: dt(beta) = dt / max(sqrt(beta) e^(beta - 1/2), 1)
    step = "renormalize"               # optional, solver = "euler" only: x + dt F then normalise (the
                                       # published code's update); default "projected": x + dt P_x F

    [output]
    observables = ["collapse_gap", "energy", "clusters"]   # + token_similarity, order_parameter,
                                       # mean_radius (model.normalization = "pre", "mix" or "peri":
                                       # the mean radius of the tokens)
    cluster_threshold = 0.1
    top_k = 8                          # attention order statistics A_(1..k)

The model parameters are those of the registry (``mf.kernels.MODELS[kind].params``, the
same names and defaults as ``mf.kernels.make`` and ``meanfield simulate``); ``beta`` is
the registry's ``beta``, given in ``[grid]``.

Sweep kinds. What a point of a sweep is comes from its kind, one ``SweepKind`` object per
module: ``_particles`` (every registry model: the particle dynamics), ``_attention`` (one
fixed query against ``n`` uniform keys, no dynamics) and ``_continuum`` (the density
solver). ``kind_of(name)`` picks it from ``[model] kind`` ("attention" and "continuum" name
their kinds, any registry name is ``particles``). A kind parses its spec sections
(``SweepKind.parse``; the kinds over ``n`` particles with seeds share ``ParticleGrid.parse``)
and tells the plan, the runner, the store and the figures the rest: the point's memory and
cost, the compiled point program, the store's variables and their dimensions, the size axis
(``n`` or ``resolution``), whether points have seeds and a ``[time]`` section, its plot.
Static settings given as lists (``Spec.statics``) are axes of groups: the plan and the runner
hand the kind ``Spec.at(setting)``, the single-valued spec of one value of each, so a kind
needs nothing to support them. plan, run and plot ask the kind and never branch on its name; a new kind is a new module
defining a subclass and calling ``register_kind`` (listed in ``_KIND_MODULES``).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import importlib
import itertools
import json
import math
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np

from .._checks import check_choice
from .._native import check_backend
from .._params import KEY_SEED_MAX, Param, applies_rules, check_applies
from .._params import check_float as _float
from .._params import check_int as _int
from .._params import check_keys as _unknown
from .._params import is_number as _is_num
from .._resources import Cost
from .._spelling import PAIR_WORDS, applies_problem, pair_problem, say_spec, size_problem
from ..geometry import SPHERE_OBSERVABLES, Geometry
from ..integrate import FIXED_STEP_SOLVERS, SOLVERS, RunTime
from ..masks import energy_problem
from ..masks import from_params as masks_from_params
from ..normalization import Scheme
from ..steps import Projected, StepRule
from ._diff import key_differences

__all__ = [
    "Spec",
    "SweepKind",
    "GroupEstimate",
    "STATIC_AXIS_KINDS",
    "ParticleGrid",
    "PointProgram",
    "register_kind",
    "backend_key",
    "sweep_kinds",
    "kind_of",
    "kind_names",
    "parse_spec",
    "load_spec",
    "spec_hash",
    "spec_differences",
    "OBSERVABLES",
    "SIM_OBSERVABLES",
    "SCALAR_SIM_OBSERVABLES",
    "ATTENTION_OBSERVABLES",
    "SPHERE_OBSERVABLES",
    "MAX_DIM",
    "MAX_SEED",
    "MAX_SEEDS",
    "MAX_SAVES",
]

SIM_OBSERVABLES = (
    "collapse_gap",
    "energy",
    "clusters",
    "token_similarity",
    "order_parameter",
    "first_merge_time",
    "num_plateaus",
    "final_clusters",
    "mean_radius",
)
#: Simulation observables that are one number per point (the others: one per save time);
#: ``num_plateaus`` needs an energy (``mf.metastability``).
SCALAR_SIM_OBSERVABLES = ("first_merge_time", "num_plateaus", "final_clusters")
_ENERGY_OBSERVABLES = ("energy", "num_plateaus")
ATTENTION_OBSERVABLES = ("top_weight", "top_weights", "ratios", "cumulative", "log_partition")
OBSERVABLES = SIM_OBSERVABLES + ATTENTION_OBSERVABLES

_TOP_KEYS = ("name", "description", "dtype", "model", "grid", "time", "output")
_GRID_KEYS = ("n", "d", "beta", "seeds", "seed")
_TIME_KEYS = (
    "t1",
    "dt",
    "solver",
    "save",
    "rtol",
    "atol",
    "early_stop",
    "max_steps",
    "step_rule",
    "step",
)
_STEP_RULES = ("fixed", "reference")
_OUTPUT_KEYS = ("observables", "cluster_threshold", "top_k")
_BETA_RULE_KEYS = ("critical", "c", "p")
_DTYPES = ("float32", "float64")

#: Largest ``n`` and ``d`` (array dimensions) and largest seed (seeds are int32 PRNG keys).
MAX_DIM = 2**31 - 1
MAX_SEED = 2**31 - 1
#: Most seeds and save times a spec may ask for: every value is a coordinate of the store
#: (and the save times are part of the normalised spec); split larger sweeps.
MAX_SEEDS = 10**7
MAX_SAVES = 10**6

#: Where two normalised specs differ (dotted keys); the store uses the same helper.
spec_differences = key_differences


# ----------------------------------------------------------------------------
# value checks
# ----------------------------------------------------------------------------


def _float_list(name: str, v: object, kind: str) -> list[float]:
    vals = v if isinstance(v, list) else [v]
    if not vals:
        raise ValueError(f"{name} must be a non-empty list of numbers, got []")
    out = [
        _float(f"{name}[{i}]" if isinstance(v, list) else name, x, kind) for i, x in enumerate(vals)
    ]
    if len(set(out)) != len(out):
        raise ValueError(f"{name} values must be distinct, got {vals!r}")
    return out


def _param_value(where: str, p: Param, v: object) -> Any:
    """A ``[model]`` value checked by the registry's ``Param``: traced parameters take a
    number or a list of numbers (a grid axis), static ones one value (a plane as a list) or,
    for the kinds ``STATIC_AXIS_KINDS``, a list of distinct values (a static axis)."""
    if p.traced:
        vals = v if isinstance(v, list) else [v]
        if not vals:
            raise ValueError(f"{where} must be a number or a non-empty list of numbers, got []")
        out = []
        for i, x in enumerate(vals):
            w = f"{where}[{i}]" if isinstance(v, list) else where
            if not _is_num(x):  # the registry lets arrays and tracers through: a spec holds numbers
                raise TypeError(f"{w} must be a number, got {x!r}")
            out.append(p.validate(x, w))
        if len(set(out)) != len(out):
            raise ValueError(f"{where} values must be distinct, got {vals!r}")
        return out if isinstance(v, list) else out[0]
    if isinstance(v, list) and p.kind != "plane":
        if p.kind not in STATIC_AXIS_KINDS:
            raise TypeError(
                f"{where} changes the compiled program: give one value, not a list, got {v!r} "
                f"(a list is a grid axis of a {' or '.join(STATIC_AXIS_KINDS)} setting only)"
            )
        if not v:
            raise ValueError(f"{where} must be a value or a non-empty list of values, got []")
        values = [p.validate(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if len(set(values)) != len(values):
            raise ValueError(f"{where} values must be distinct, got {v!r}")
        return values  # a static grid axis: one compilation per value
    value = p.validate(v, where)
    return list(value) if p.kind == "plane" else value  # JSON-serialisable


#: Kinds of static parameters that may be a list in ``[model]`` (a static grid axis: one
#: compilation per value, the value a coordinate of the store): ``normalization``, ``mask``,
#: ``attention``, ``heads``, ``geometry``, ``rescaled``, ...
STATIC_AXIS_KINDS = ("choice", "bool", "int>=1", "int>=0")


def _values(v: Any) -> list:
    """The values a ``[model]`` setting takes over the sweep: the list of a static axis, else [v]."""
    return list(v) if isinstance(v, list) else [v]


def _check_applies_axes(
    values: dict, defaults: dict, statics: Mapping[str, tuple], params: tuple[Param, ...]
) -> None:
    """``check_applies`` over the static axes: a parameter set away from its default is accepted
    when at least one value of its switch's list needs it (at the other values it is left at its
    default, ``Spec.at``); refused, naming the list, when none does. ``params``: the kinds'
    parameters, whose declarations (``Param.applies``) give the rules."""
    table = applies_rules(params)
    if not any(s in statics for rules in table.values() for s, _ in rules):
        check_applies(values, defaults, "model.", params)
        return
    for name, rules in table.items():
        switches = [s for s, _ in rules if s in values]
        if name not in values or not switches:
            continue
        sub = {name: values[name]}
        options = [list(statics.get(s, (values[s],))) for s in switches]
        errors = []
        for combo in itertools.product(*options):
            try:
                check_applies({**sub, **dict(zip(switches, combo))}, defaults, "model.", params)
                break
            except ValueError as e:
                errors.append(e)
        else:
            listed = [s for s in switches if s in statics]
            if not listed:
                raise errors[0]
            problem = applies_problem(name, values[name], rules, values, axes=listed, say=say_spec)
            raise ValueError(problem or errors[0])


def _kind_params(kinds: tuple) -> tuple[Param, ...]:
    """The registry's parameters of the model kinds ``kinds`` (what their rules are declared on)."""
    from ..kernels import MODELS

    return tuple(p for k in kinds if k in MODELS for p in MODELS[k].params)


def _inert(params: Mapping[str, Any], declared: tuple[Param, ...]) -> frozenset[str]:
    """The parameters that change nothing at the single-valued settings ``params`` (their declared ``Param.applies``:
    their switch takes none of the values they apply with): a static axis's point leaves them at
    their default."""
    out = set()
    for name, rules in applies_rules(declared).items():
        known = [(s, needs) for s, needs in rules if s in params]
        if name in params and known and not any(params[s] in needs for s, needs in known):
            out.add(name)
    return frozenset(out)


#: Optional ``[model]`` keys that apply only with some values of another: ``key: (switch, values)``.


def _recorded(values: Mapping[str, Any], accepted: Mapping[str, Param]) -> dict:
    """The ``[model]`` values the normalised spec records: all but the optional parameters at
    their default (``Param.optional``: specs written before they existed keep their hash)."""
    return {
        k: v
        for k, v in values.items()
        if not (accepted[k].optional and v == accepted[k].validate(accepted[k].default, k))
    }


def _model_params(
    grid: ParticleGrid, kinds: tuple[str, ...], model: dict, ds: tuple[int, ...]
) -> tuple[dict, dict[str, Param]]:
    """The ``[model]`` parameters of ``kinds`` (the union of their parameters, ``grid.model_params``,
    but ``beta``), defaults filled in; returns ``(values, params)`` with ``params: name -> Param``."""
    accepted: dict[str, Param] = {}
    owners: dict[str, list[str]] = {}
    for k in kinds:
        need_d = grid.required_dimension(k)
        for d in ds:  # the model's rule, as the registry and the command line state it
            problem = size_problem({}, d=d, required_d=need_d, model=k, say=say_spec)
            if problem is not None:
                raise ValueError(problem)
        for p in grid.model_params(k):
            if p.name == "beta":
                continue
            q = accepted.setdefault(p.name, p)
            if (q.traced, q.kind, q.choices) != (
                p.traced,
                p.kind,
                p.choices,
            ):  # pragma: no cover - registry
                raise ValueError(
                    f"model.{p.name} means different things for kinds {owners[p.name][0]!r} and {k!r}"
                )
            owners.setdefault(p.name, []).append(k)
    _unknown("model", model, ("kind",) + tuple(accepted))
    values = {}
    for name, p in accepted.items():
        if name not in model and not p.optional:
            defaults = [
                next(q.default for q in grid.model_params(k) if q.name == name)
                for k in owners[name]
            ]
            if any(dv != defaults[0] for dv in defaults):
                raise ValueError(
                    f"model.{name} has different defaults for the kinds of this sweep ("
                    + ", ".join(f"{k}: {dv!r}" for k, dv in zip(owners[name], defaults))
                    + "): give it explicitly"
                )
        value = _param_value(f"model.{name}", p, model.get(name, p.default))
        if p.traced and p.kind.startswith("int"):  # an int32 of the compiled program
            for x in value if isinstance(value, list) else [value]:
                if x > MAX_SEED:
                    raise ValueError(
                        f"model.{name} = {x} must be <= {MAX_SEED} (an int32 in the compiled program)"
                    )
        values[name] = value
    # a value that changes nothing: refused (with a static axis: at every value of its list)
    statics = _static_axes(values, accepted)
    fallback = {k: p.validate(p.default, k) for k, p in accepted.items()}
    for k in kinds:  # each kind's own rules (its parameters' ``applies``), whatever the order
        _check_applies_axes(values, fallback, statics, tuple(grid.model_params(k)))
    problem = size_problem({"plane": values.get("plane")}, d=min(ds), say=say_spec)
    if problem is not None:
        raise ValueError(problem)
    return values, accepted


def _static_axes(values: Mapping[str, Any], accepted: Mapping[str, Param]) -> dict[str, tuple]:
    """The static settings given as lists (``name -> values``, in the order of ``[model]``'s
    parameters): grid axes of one compilation per value."""
    return {
        k: tuple(v)
        for k, v in values.items()
        if isinstance(v, list) and not accepted[k].traced and accepted[k].kind != "plane"
    }


def _masked(params: Mapping[str, Any]) -> str:
    """Why a kind with an energy has none in this spec (``mf.masks.energy_problem``): ``params``
    set a mask, any value of a static axis (or ``""``)."""
    if "mask" not in params:
        return ""
    for value in _values(params["mask"]):
        problem = energy_problem(masks_from_params({"mask": value}))
        if problem is not None:
            return problem
    return ""


def _has_energy(grid_kind: ParticleGrid, model: str, params: Mapping[str, Any]) -> bool:
    """Whether ``model`` of the sweep has an energy: the kind's answer, and no mask."""
    return grid_kind.has_energy(model) and not _masked(params)


#: The step rule of a spec without ``time.step`` (not recorded then: such specs keep their hash).
_DEFAULT_STEP = Projected.name


def _step_of(time_spec: Mapping[str, Any] | None) -> StepRule:
    """The step rule of a spec's ``[time]`` (``time.step``; ``Projected()`` when absent)."""
    return StepRule.lookup((time_spec or {}).get("step", _DEFAULT_STEP))()


def _check_euclidean(obs: list, time_spec: dict | None, geometry: Any) -> None:
    """``model.geometry = 'euclidean'`` (``geometry``: that geometry's class): no observable of
    ``SPHERE_OBSERVABLES``, no step rule that ends on the sphere (``mf.simulate``'s refusals, when
    the spec is read)."""
    problem = geometry.observables_problem(obs, say=say_spec)
    if problem is not None:
        raise ValueError(f"output.observables {problem}")
    _step_of(time_spec).check(geometry=geometry, say=say_spec)


def _check_radius(
    obs: list, params: Mapping[str, Any], time_spec: dict | None, without: list[str]
) -> None:
    """``mean_radius`` needs tokens with a radius (``model.normalization`` in
    ``mf.normalization.RADIAL``, every kind of the sweep taking it: not those in ``without``),
    and those tokens cannot take ``time.step = 'renormalize'`` (it puts them back on the
    sphere): ``mf.simulate``'s refusals, when the spec is read."""
    from ..normalization import radial_names

    RADIAL = radial_names()  # the registered schemes with a radius

    schemes = _values(params.get("normalization", "post"))  # a static axis: every value
    if "mean_radius" in obs and without:
        raise ValueError(
            f"output.observables 'mean_radius' needs tokens with a radius; kind {without[0]!r} "
            f"takes no model.normalization"
        )
    scheme = next((v for v in schemes if v not in RADIAL), schemes[0])
    if "mean_radius" in obs and scheme not in RADIAL:
        raise ValueError(
            "output.observables 'mean_radius' needs tokens with a radius: model.normalization = "
            + " or ".join(repr(r) for r in RADIAL)
            + f", not {scheme!r}"
        )
    scheme = next((v for v in schemes if v in RADIAL), schemes[0])
    _step_of(time_spec).check(scheme=Scheme.lookup(scheme), say=say_spec)


def _variant_values(family: Any, choice: Any, scale: Any) -> tuple[Any, Any, dict[str, Param]]:
    """A ``[model]`` pair of a variant family (``mf.noise.Noise``: ``noise`` and ``sigma``;
    ``mf.frequencies.Distribution``: ``frequencies`` and ``spread``) checked as the family declares
    them (``family.flat_params()``: the member's name, then the members' parameters, among them
    the traced scale ``PAIR_WORDS[name][0]``): ``(choice, scale, params)`` with ``choice`` a
    registered name (a list of them: a static axis), ``scale`` a number in the declared range (a
    list: a traced axis), ``params`` their ``Param`` by name; ``(None, None, {})`` without either.
    The two go together, as their flags do (``meanfield._spelling.pair_problem``)."""
    if choice is None and scale is None:
        return None, None, {}
    choice_p, *members = family.flat_params()
    scale_name, is_what, whose, _ = PAIR_WORDS[choice_p.name]
    scale_p = next(p for p in members if p.name == scale_name)
    if choice is not None:
        choice = _param_value(f"model.{choice_p.name}", choice_p, choice)
    bound = scale_p.kind.removeprefix("float")  # ">=0", ">0"
    problem = pair_problem(
        choice_p.name,
        choice,
        choice_p.choices,
        scale_p.name,
        scale,
        is_what=is_what,
        whose=whose,
        bound=f"{bound[:-1]} {bound[-1]}",
        listable=True,
        say=say_spec,
    )
    if problem is not None:
        raise ValueError(problem)
    scale = _param_value(f"model.{scale_p.name}", scale_p, scale)
    return choice, scale, {choice_p.name: choice_p, scale_p.name: scale_p}


def _noise_values(noise: Any, sigma: Any) -> tuple[Any, Any, dict[str, Param]]:
    """``[model]``'s ``noise`` and ``sigma`` (``mf.noise``: the noise of every point's run) checked
    as the noise family declares them (``mf.noise.Noise.flat_params``): ``(noise, sigma, params)``
    with ``noise`` a registered name (a list of them: a static axis), ``sigma`` a number ``>= 0``
    (a list: a traced axis ``sigma``), ``params`` their ``Param`` by name; ``(None, None, {})``
    without a noise. The two go together, as ``--noise`` and ``--sigma`` do."""
    from ..noise import Noise

    return _variant_values(Noise, noise, sigma)


#: ``model.frequency_seed``: the key of the frequencies' draws, ``jax.random.key(K)``
#: (``meanfield simulate --frequency-seed K``); a static seed's range (``KEY_SEED_MAX``).
_FREQUENCY_SEED = Param(
    "frequency_seed",
    None,
    False,
    "int>=0",
    "draw the frequencies from jax.random.key(frequency_seed) (absent: the law's midpoint quantiles)",
    optional=True,
    maximum=KEY_SEED_MAX,
)


def _frequency_values(
    frequencies: Any, spread: Any, seed: Any
) -> tuple[Any, Any, Any, dict[str, Param]]:
    """``[model]``'s ``frequencies``, ``spread`` and ``frequency_seed`` (``mf.frequencies``: the
    natural frequencies of every point's run, ``meanfield simulate --frequencies NAME --spread S
    [--frequency-seed K]``): ``(frequencies, spread, seed, params)``, ``frequencies`` a registered
    law (a list: a static axis), ``spread`` a number ``> 0`` (a list: a traced axis ``spread``),
    ``seed`` one integer ``>= 0`` or None (the law's midpoint quantiles), ``params`` the ``Param``
    of those given; all None without frequencies."""
    from ..frequencies import Distribution

    if seed is not None and frequencies is None:
        raise ValueError(
            "model.frequency_seed draws the frequencies of model.frequencies: give both "
            "(model.frequencies = " + " or ".join(map(repr, Distribution.names())) + ")"
        )
    law, scale, params = _variant_values(Distribution, frequencies, spread)
    if seed is not None:
        if isinstance(seed, list):
            raise TypeError(
                f"model.frequency_seed is one seed, the same frequencies at every point (not an "
                f"axis), got {seed!r}"
            )
        seed = _FREQUENCY_SEED.validate(seed, "model.frequency_seed")
        params = {**params, "frequency_seed": _FREQUENCY_SEED}
    return law, scale, seed, params


def _check_noise(
    noise: Any,
    sigma: Any,
    params: Mapping[str, Any],
    solver: str,
    step: StepRule,
    early_stop: Any = None,
) -> None:
    """The refusals of the noise(s) ``noise`` (``mf.noise.Noise.check``, in the spec's spelling:
    ``time.solver``, ``model.normalization``, ``time.step``) for every value of a static axis."""
    from ..noise import Noise

    schemes = [Scheme.lookup(v) for v in _values(params.get("normalization", "post"))]
    scheme = next((s for s in schemes if s.radial), schemes[0])
    amplitude = min(_values(sigma))
    for name in _values(noise):
        Noise.coerce(name, sigma=amplitude).check(
            solver=solver, scheme=scheme, step=step, early_stop=early_stop, say=say_spec
        )


def _check_frequencies(frequencies: Any, params: Mapping[str, Any], ds: tuple[int, ...]) -> None:
    """What ``mf.simulate(frequencies=)`` refuses of the law(s) ``frequencies``, in the spec's
    spelling, at every value of a static axis: a ``d`` other than 2 (the law's samples are angular
    velocities on the circle) and a ``model.normalization`` whose tokens carry a radius
    (``Scheme.radial``, the rule of ``mf.simulate``)."""
    from ..frequencies import check_run  # the rule of mf.simulate and the command line

    law = frequencies if isinstance(frequencies, str) else frequencies[0]
    for d in ds:
        check_run(law=law, d=d, say=say_spec)
    for v in _values(params.get("normalization", "post")):
        check_run(law=law, scheme=Scheme.lookup(v), say=say_spec)


def _check_beta_rule(
    rule: str,
    power: float | None,
    factors: np.ndarray,
    ns: tuple[int, ...],
    ds: tuple[int, ...],
    dtype: str,
) -> None:
    r"""Every $\beta = f n^p$ of the grid is a positive finite number of ``dtype`` (computed in
    logarithms: ``p = 1000`` must not overflow before it is refused)."""
    top = math.log(float(np.finfo(dtype).max))
    low = math.log(float(np.finfo(dtype).tiny))
    for n in ns:
        for d in ds:
            p = 2.0 / (d - 1) if rule == "critical" else cast(float, power)
            for f in factors:
                log_beta = math.log(float(f)) + p * math.log(n)
                if not low <= log_beta <= top:
                    what = "critical = f" if rule == "critical" else "c"
                    raise ValueError(
                        f"grid.beta: {what} n^{p:g} = {float(f):g} x {n}^{p:g} = 10^{log_beta / math.log(10):.4g} "
                        f"for n = {n}, d = {d} is not a finite positive {dtype}; use a smaller |p| or other n"
                    )


# ----------------------------------------------------------------------------
# the spec
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spec:
    """A parsed, validated sweep specification.

    ``axes`` maps each traced grid axis (``beta`` or ``beta_factor``, then swept
    model parameters) to its values; ``n`` and ``d`` are static axes, ``seed``
    the innermost axis. Kind ``continuum`` (``_continuum.parse``): ``n`` holds the
    band-limits ``resolution``, ``axes`` are ``beta``, ``mode`` and (when a list) ``eps``,
    ``seeds`` is one placeholder (no ``seed`` dimension in the store). ``params`` holds every ``[model]`` parameter of the kinds
    (registry defaults filled in; a list for a swept one). ``data`` is the
    normalised dictionary (JSON-serialisable) whose canonical JSON gives ``hash``.
    """

    text: str
    data: dict
    name: str
    kinds: tuple
    kinds_axis: bool
    dtype: str
    params: dict  # model parameters, fixed values or lists
    n: tuple
    d: tuple
    d_axis: bool
    beta_rule: str | None  # None (explicit list), "critical" or "power"
    beta_power: float | None
    axes: dict  # traced axes: name -> np.ndarray (excluding seed)
    seeds: np.ndarray
    time: dict | None
    ts: np.ndarray | None
    observables: tuple
    cluster_threshold: float
    top_k: int
    #: The static settings given as lists (``name -> values``): grid axes of one compilation
    #: per value (``settings``), between ``model`` and ``n`` in the store.
    statics: dict = dataclasses.field(default_factory=dict)
    #: The parameters that change nothing at this spec's settings (``Spec.at``), by model kind
    #: (each kind's own rules): a point leaves them at their default, traced axes included.
    inert: dict = dataclasses.field(default_factory=dict)

    def inert_for(self, kind: str) -> frozenset[str]:
        """The parameters of model ``kind`` left at their default at this spec's settings."""
        return self.inert.get(kind, frozenset())

    @property
    def hash(self) -> str:
        return spec_hash(self.data)

    @property
    def kind(self) -> str:
        """The model kind (the first one when ``kind`` is a list, a grid axis)."""
        return self.kinds[0]

    @functools.cached_property
    def sweep_kind(self) -> SweepKind:
        """The kind of the points (``kind_of(self.kind)``): what plan, run and plot ask (looked up
        once per spec: a plan asks it for every group)."""
        return kind_of(self.kinds[0])

    @property
    def seeded(self) -> bool:
        """Whether the points have seeds (a ``seed`` dimension; ``SweepKind.seeded``): all kinds
        but ``continuum`` (deterministic; its batch keeps one placeholder seed internally)."""
        return self.sweep_kind.seeded

    @property
    def static_name(self) -> str:
        """Name of the static size axis (``SweepKind.size_axis``): ``n`` (particles, attention)
        or ``resolution`` (``continuum``: the band-limit ``L``, held in ``Spec.n``)."""
        return self.sweep_kind.size_axis

    @property
    def step_rule(self) -> str:
        """``"fixed"`` or ``"reference"`` (the beta-dependent step of the reference code)."""
        return (self.time or {}).get("step_rule", "fixed")

    @property
    def backend(self) -> str:
        """``mf.simulate``'s ``backend`` (``model.backend``, default ``"auto"``)."""
        return self.data["model"].get("backend", "auto")

    @property
    def step(self) -> str:
        """The name of the step rule, ``time.step`` (``"projected"`` or ``"renormalize"``:
        ``mf.steps.STEPS``; ``integrate.simulate(step=)``)."""
        return _step_of(self.time).name  # type: ignore[return-value]

    @property
    def run_time(self) -> RunTime:
        """The ``[time]`` table as a run's time (``mf.integrate.RunTime``; ``mf.simulate(time=)``):
        ``t1``, ``dt``, ``solver``, the save times, the tolerances, ``early_stop``, ``max_steps``,
        ``step``. Raises ``ValueError`` for a sweep kind without one."""
        T = self.time
        if T is None:
            raise ValueError(f"kind {self.kind!r} has no [time]: its points are not runs")
        return RunTime(
            T["t1"],
            T["dt"],
            T["solver"],
            self.ts,
            T.get("rtol"),
            T.get("atol"),
            T.get("early_stop"),
            T.get("max_steps"),
            T.get("step", _DEFAULT_STEP),
        )

    @property
    def step_variant(self) -> StepRule:
        """The step rule of ``time.step`` as an object (``mf.steps.StepRule``)."""
        return _step_of(self.time)

    def beta_values(self, n: int, d: int) -> np.ndarray | None:
        """The ``beta`` axis for static shape ``(n, d)`` (rules evaluated), or None (toeplitz)."""
        if self.beta_rule is None:
            return self.axes.get("beta")
        f = self.axes["beta_factor"]
        p = 2.0 / (d - 1) if self.beta_rule == "critical" else cast(float, self.beta_power)
        return f * float(n) ** p

    @property
    def settings(self) -> list[tuple[tuple[str, Any], ...]]:
        """Every combination of the static axes' values, as ``((name, value), ...)`` (row-major
        in the order of ``statics``); ``[()]`` without static axes.

        Example:
            >>> spec = parse_spec('[model]\\nkind = "usa"\\nmask = ["none", "causal"]\\n[grid]\\n'
            ...                   'n = [8]\\nbeta = [1.0]\\nseeds = 1\\n[time]\\nt1 = 1.0')
            >>> spec.settings
            [(('mask', 'none'),), (('mask', 'causal'),)]
        """
        return [
            tuple(zip(self.statics, combo)) for combo in itertools.product(*self.statics.values())
        ]

    def at(self, setting: tuple[tuple[str, Any], ...]) -> Spec:
        """The spec of one value of each static axis (``setting``, one of ``settings``): the same
        spec with ``params`` and the normalised ``data`` holding those values, no static axes, and
        the parameters that do not apply there (their declared ``Param.applies``: ``slope`` at a ``mask``
        other than ``'alibi'``) at their default (``inert``). Its point programs, memory and cost
        are those of the single-valued sweep (``setting = ()``: the spec itself).

        Example:
            >>> spec = parse_spec('[model]\\nkind = "usa"\\nmask = ["none", "alibi"]\\nslope = 0.5\\n'
            ...                   '[grid]\\nn = [8]\\nbeta = [1.0]\\nseeds = 1\\n[time]\\nt1 = 1.0')
            >>> one = spec.at((("mask", "none"),))
            >>> one.params["mask"], "slope" in one.inert_for("usa"), "slope" in spec.at((("mask", "alibi"),)).inert_for("usa")
            ('none', True, False)
        """
        if not setting:
            return self
        held = self._at
        if setting not in held:
            params = {**self.params, **dict(setting)}
            inert = {k: _inert(params, _kind_params((k,))) for k in self.kinds}
            model = {**self.data["model"], **dict(setting)}
            held[setting] = dataclasses.replace(
                self,
                data={**self.data, "model": model},
                params=params,
                statics={},
                inert=inert,
            )
        return held[setting]

    @functools.cached_property
    def _at(self) -> dict:
        return {}

    @property
    def grid_size(self) -> int:
        return (
            len(self.kinds)
            * math.prod(len(v) for v in self.statics.values())
            * len(self.n)
            * len(self.d)
            * int(np.prod([len(v) for v in self.axes.values()]))
            * len(self.seeds)
        )


# ----------------------------------------------------------------------------
# sweep kinds: the one interface of what a point of a sweep is
# ----------------------------------------------------------------------------


def backend_key(model: str, n: int, d: int, setting: tuple[tuple[str, Any], ...] = ()) -> str:
    """The key of group ``(model, n, d)`` in a store's record of its backends (``SweepKind.backends``);
    ``setting``: the group's values of the static axes (``Spec.settings``), named after the model.

    Example:
        >>> backend_key("usa", 24, 3), backend_key("usa", 24, 3, (("mask", "causal"),))
        ('usa n=24 d=3', 'usa mask=causal n=24 d=3')
    """
    named = "".join(f" {k}={v}" for k, v in setting)
    return f"{model}{named} n={int(n)} d={int(d)}"


@dataclasses.dataclass(frozen=True)
class GroupEstimate:
    """A sweep kind's answers to the plan's questions about one group (``SweepKind.estimate``):
    the estimated peak bytes of one point (``point_bytes``) and the ``Cost`` of a batch of points
    run together (``cost(batch)``), from one look at the group's model.

    Example:
        >>> from meanfield._resources import Cost
        >>> est = GroupEstimate(100, lambda b: Cost(steps=1, saves=0, bytes=100 * b, work=1.0 * b, batch=b))
        >>> est.point_bytes, est.cost(4).bytes
        (100, 400)
    """

    point_bytes: int
    batch_cost: Callable[[int], Cost] = dataclasses.field(repr=False)

    def cost(self, batch: int) -> Cost:
        """Estimated ``Cost`` of ``batch`` points run together."""
        return self.batch_cost(int(batch))


#: A compiled point's function: ``f(params: dict of traced scalars, seed) -> dict of outputs``
#: (the observables, ``status`` and the kind's extra variables).
PointProgram = Callable[[dict[str, Any], Any], dict[str, Any]]


class SweepKind(abc.ABC):
    """What a point of a sweep is: one subclass per kind, one module each (``_particles``,
    ``_attention``, ``_continuum``), registered with ``register_kind``.

    The kind parses its spec sections into a ``Spec`` (``parse``) and answers everything that
    differs between kinds: the point's memory and cost (``point_memory``, ``cost``, both at once:
    ``estimate``, what the plan asks once per group), its compiled
    program (``point_program``), the store's variables (``output_layout``, ``descriptions``,
    ``point_store_bytes``, ``attr_name``), the plan's notes and warnings (``describe_notes``,
    ``describe_warnings``) and its figures (``plot``, ``decorate_heatmap``). The class attributes
    fix the store's grid: the size axis (``size_axis``), a ``seed`` dimension (``seeded``), a
    ``[time]`` section and ``time`` coordinate (``timed``).
    """

    #: The kind's name (``particles``, ``attention``, ``continuum``).
    name: ClassVar[str]
    #: A few words on what it sweeps (error messages).
    summary: ClassVar[str]
    #: Name of the static size axis (``Spec.n``) in the store.
    size_axis: ClassVar[str] = "n"
    #: Whether points have seeds (a ``seed`` dimension).
    seeded: ClassVar[bool] = True
    #: Whether a spec has a ``[time]`` section (the store then a ``time`` coordinate).
    timed: ClassVar[bool] = True
    #: Whether ``[model] kind`` may be a list of its names (a grid axis ``model``).
    listable: ClassVar[bool] = True
    #: Descriptions of the store's data variables.
    descriptions: ClassVar[Mapping[str, str]] = {}

    @abc.abstractmethod
    def spec_names(self) -> tuple[str, ...]:
        """The values of ``[model] kind`` that choose this kind."""

    @abc.abstractmethod
    def parse(
        self,
        raw: dict,
        *,
        kinds: tuple[str, ...],
        kinds_axis: bool,
        name: str,
        description: str,
        dtype: str,
        text: str,
    ) -> Spec:
        """The ``Spec`` of the TOML dictionary ``raw`` (its top level already checked)."""

    @abc.abstractmethod
    def point_memory(self, spec: Spec, model: str, n: int, d: int) -> int:
        """Estimated peak bytes of one point of ``model`` at static shape ``(n, d)`` in a chunk."""

    @abc.abstractmethod
    def cost(self, spec: Spec, model: str, n: int, d: int, batch: int, point_bytes: int) -> Cost:
        """Estimated ``Cost`` of ``batch`` points run together (``point_bytes`` each)."""

    def estimate(self, spec: Spec, model: str, n: int, d: int) -> GroupEstimate:
        """The plan's questions about group ``(model, n, d)`` answered in one call: ``point_memory``
        and ``cost`` of a batch (``make_plan`` asks once per group; a kind that builds a model to
        answer overrides it to build it once)."""
        point_bytes = self.point_memory(spec, model, n, d)
        return GroupEstimate(
            point_bytes, lambda batch: self.cost(spec, model, n, d, batch, point_bytes)
        )

    @abc.abstractmethod
    def point_program(self, spec: Spec, model: str, n: int, d: int) -> PointProgram:
        """``f(params, seed) -> dict of outputs`` of one point (``run.point_program``)."""

    @abc.abstractmethod
    def output_layout(self, spec: Spec) -> dict[str, tuple[str, ...]]:
        """Data variable -> its dimensions after the grid dimensions (``time``, ``rank`` or none)."""

    @abc.abstractmethod
    def point_store_bytes(self, spec: Spec) -> int:
        """Bytes of one point's saved values in the store (uncompressed)."""

    def attr_name(self, param: str) -> str:
        """The store attribute of a fixed parameter (``model.<name>``)."""
        return f"model.{param}"

    def backends(self, spec: Spec, shapes: list[tuple[str, int, int]]) -> dict[str, str] | None:
        """The evaluation path of each group ``(model, n, d)``, keyed ``backend_key(model, n, d)``,
        ``"native"`` or ``"xla"``, decided once when the store is created and recorded in it
        (``meanfield.sweep.run``): a resumed sweep runs the recorded path whatever the machine's
        timings say. ``None`` (the default): the kind has no ``backend`` option. ``ValueError``
        when the spec's backend cannot run here (``"native"`` without the fused kernel)."""
        return None

    def describe_notes(self, spec: Spec) -> list[str]:
        """Lines of ``Plan.describe`` after the header (the step rule)."""
        return []

    def describe_warnings(self, spec: Spec, shapes: list[tuple[str, int, int]]) -> list[str]:
        """Warnings of ``Plan.describe`` over the groups' ``(model, n, d)``."""
        return []

    def plot(self, ds: Any, out_dir: Path) -> list[Path] | None:
        """The kind's own figures of a store (an ``xarray.Dataset``), or None: the standard ones."""
        return None

    def decorate_heatmap(self, ax: Any, heat: Any, ds: Any, a: str, b: str) -> None:
        """Draw over a standard heatmap of ``heat`` over dimensions ``(a, b)`` (matplotlib ``ax``)."""
        return None


class ParticleGrid(SweepKind):
    """A kind whose points are ``n`` particles or keys in ``d`` dimensions with seeds and registry
    parameters (``particles``, ``attention``): one parser of ``[model]``, ``[grid]`` (``n``, ``d``,
    ``beta`` and its rules, ``seeds``), ``[time]`` (when ``timed``) and ``[output]``."""

    #: Whether ``output.top_k`` ranks the points' values (it must then be <= every ``n``).
    ranked: ClassVar[bool] = False

    @abc.abstractmethod
    def model_params(self, model: str) -> tuple[Param, ...]:
        """The parameters of ``model`` (``beta`` given in ``[grid]``, the others in ``[model]``)."""

    def required_dimension(self, model: str) -> int | None:
        """The dimension ``model`` needs (``gauge``: 3), or None."""
        return None

    def has_energy(self, model: str) -> bool:
        """Whether ``model`` has an energy (``energy``, ``num_plateaus``, ``time.early_stop``);
        a spec with a ``mask`` has none whatever this says (``mf.masks``)."""
        return False

    @abc.abstractmethod
    def observables(self, kinds: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(accepted, default)`` observables of a sweep over ``kinds`` (a spec with a ``mask``
        then drops the energy's)."""

    def parse(
        self,
        raw: dict,
        *,
        kinds: tuple[str, ...],
        kinds_axis: bool,
        name: str,
        description: str,
        dtype: str,
        text: str,
    ) -> Spec:
        return _parse_particle_grid(
            self,
            raw,
            kinds=kinds,
            kinds_axis=kinds_axis,
            name=name,
            description=description,
            dtype=dtype,
            text=text,
        )


#: The modules of meanfield's own sweep kinds (each registers its kind when imported).
_KIND_MODULES = (
    "meanfield.sweep._particles",
    "meanfield.sweep._attention",
    "meanfield.sweep._continuum",
)
_KINDS: dict[str, SweepKind] = {}


def register_kind(kind: SweepKind) -> SweepKind:
    """Add a sweep kind (an instance of a ``SweepKind`` subclass) under its ``name``; returns it."""
    if not isinstance(kind, SweepKind):
        raise TypeError(f"register_kind takes a SweepKind instance, got {kind!r}")
    _KINDS[kind.name] = kind
    return kind


def sweep_kinds() -> dict[str, SweepKind]:
    """The sweep kinds by name, meanfield's own loaded at the first call (the kind modules
    import this one: they are found by name, like the models of the registry's entry points)."""
    if not all(m in sys.modules for m in _KIND_MODULES):
        for module in _KIND_MODULES:
            importlib.import_module(module)

    def rank(kind: SweepKind) -> int:  # meanfield's own in _KIND_MODULES order, then the others
        module = type(kind).__module__
        return _KIND_MODULES.index(module) if module in _KIND_MODULES else len(_KIND_MODULES)

    return {k.name: k for k in sorted(_KINDS.values(), key=rank)}


def kind_names() -> tuple[str, ...]:
    """Every accepted ``[model] kind``: the registry's models, then ``attention``, ``continuum``."""
    return tuple(n for k in sweep_kinds().values() for n in k.spec_names())


def kind_of(name: str) -> SweepKind:
    """The sweep kind of a ``[model] kind`` value (``ValueError`` listing the accepted ones).

    Example:
        >>> kind_of("usa").name, kind_of("attention").name, kind_of("continuum").size_axis
        ('particles', 'attention', 'resolution')
    """
    for kind in reversed(sweep_kinds().values()):  # the named kinds before the registry's models
        if name in kind.spec_names():
            return kind
    check_choice("model kind", name, kind_names())
    raise AssertionError("unreachable")  # pragma: no cover


def spec_hash(data: dict) -> str:
    """sha256 of the canonical JSON of the normalised spec (comments and layout do not count)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def load_spec(path: str | Path) -> Spec:
    """Read and validate a TOML spec file (``FileNotFoundError``, ``tomllib.TOMLDecodeError``, ``ValueError``)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"sweep spec {path} is a directory, not a TOML file")
    if not path.exists():
        raise FileNotFoundError(f"sweep spec not found: {path}")
    if not path.is_file():  # a FIFO or a device: reading it could wait forever
        raise ValueError(
            f"sweep spec {path} is not a regular file (a FIFO, socket or device), not a TOML file"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"sweep spec {path} is not UTF-8 text (byte {e.start}: {e.reason}), not a TOML file"
        ) from None
    return parse_spec(text, default_name=path.stem)


def parse_spec(text: str, *, default_name: str = "sweep") -> Spec:
    """Parse and validate the TOML text of a sweep (see the module docstring for the schema).

    Raises ``tomllib.TOMLDecodeError`` for malformed TOML, ``ValueError`` for
    unknown keys (listing the accepted ones) and invalid values, ``TypeError``
    for values of the wrong type.

    Example:
        >>> spec = parse_spec('[model]\\nkind = "usa"\\n[grid]\\nn = [8]\\nbeta = [1.0]\\nseeds = 2\\n[time]\\nt1 = 1.0')
        >>> spec.grid_size
        2
        >>> parse_spec('[model]\\nkind = "gauge"\\namplitude = [0.3, 0.6]\\n[grid]\\nn = [8]\\nbeta = [1.0]\\n'
        ...            'seeds = 2\\n[time]\\nt1 = 1.0').data["model"]  # optional ones at their default: not recorded
        {'kind': 'gauge', 'amplitude': [0.3, 0.6], 'k': 3, 'rescaled': False}
    """
    raw = tomllib.loads(text)
    _unknown("", raw, _TOP_KEYS)
    for table in ("model", "grid", "time", "output"):
        if table in raw and not isinstance(raw[table], dict):
            raise TypeError(f"[{table}] must be a table, got {raw[table]!r}")
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise TypeError(f"description must be a string, got {description!r}")
    dtype = raw.get("dtype", "float32")
    check_choice("dtype", dtype, _DTYPES)

    # model kinds: the sweep kind parses the rest ------------------------------------
    names = kind_names()
    model = raw.get("model", {})
    if "kind" not in model:
        raise ValueError(
            f"[model] needs kind = one of {', '.join(names)} (or a list of them: a grid axis)"
        )
    kind_raw = model["kind"]
    kinds_axis = isinstance(kind_raw, list)
    kinds = tuple(kind_raw) if kinds_axis else (kind_raw,)
    if not kinds:
        raise ValueError(
            f"model.kind must be a model name or a non-empty list; accepted: {', '.join(names)}"
        )
    for k in kinds:
        if not isinstance(k, str):
            raise TypeError(f"model.kind must be a string or a list of strings, got {kind_raw!r}")
        sk = kind_of(k)
        if kinds_axis and not sk.listable:
            raise ValueError(
                f"model.kind {k!r} ({sk.summary}) cannot share a sweep with other kinds"
            )
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"model.kind values must be distinct, got {kind_raw!r}")
    sweep_kind = kind_of(kinds[0])
    other = [k for k in kinds if kind_of(k) is not sweep_kind]
    if other:
        a, b = other[0], kinds[0]
        raise ValueError(
            f"model.kind {a!r} ({kind_of(a).summary}) cannot share a sweep with kind {b!r} "
            f"({kind_of(b).summary})"
        )
    return sweep_kind.parse(
        raw,
        kinds=kinds,
        kinds_axis=kinds_axis,
        name=name,
        description=description,
        dtype=dtype,
        text=text,
    )


def _parse_particle_grid(
    grid_kind: ParticleGrid,
    raw: dict,
    *,
    kinds: tuple[str, ...],
    kinds_axis: bool,
    name: str,
    description: str,
    dtype: str,
    text: str,
) -> Spec:
    """``ParticleGrid.parse``: ``[model]`` (the parameters of ``kinds``), ``[grid]`` over ``n``,
    ``d``, ``beta`` and seeds, ``[time]`` where ``grid_kind.timed`` and ``[output]``."""
    model = dict(raw.get("model", {}))
    model.pop("kind")
    kind = kinds[0]
    simulated = grid_kind.timed
    backend = model.pop("backend", None)  # recorded only when set: specs without it keep their hash
    if backend is not None:
        check_backend(backend, "model.backend")
        if not simulated:
            raise ValueError(
                f"model.backend applies to the simulated models, not kind {kind!r} (no dynamics)"
            )
    # the run's noise (mf.noise): recorded only when set, so specs without it keep their hash
    noise_raw, sigma_raw = model.pop("noise", None), model.pop("sigma", None)
    if not simulated and (noise_raw is not None or sigma_raw is not None):
        key = "noise" if noise_raw is not None else "sigma"
        raise ValueError(
            f"model.{key} applies to the simulated models, not kind {kind!r} (no dynamics)"
        )
    noise, sigma, noise_params = _noise_values(noise_raw, sigma_raw)
    # the natural frequencies (mf.frequencies): likewise recorded only when set
    frequencies_raw = {k: model.pop(k, None) for k in ("frequencies", "spread", "frequency_seed")}
    set_keys = [k for k, v in frequencies_raw.items() if v is not None]
    if not simulated and set_keys:
        raise ValueError(
            f"model.{set_keys[0]} applies to the simulated models, not kind {kind!r} (no dynamics)"
        )
    frequencies, spread, frequency_seed, frequency_params = _frequency_values(
        *frequencies_raw.values()
    )

    # grid -------------------------------------------------------------------
    grid = dict(raw.get("grid", {}))
    _unknown("grid", grid, _GRID_KEYS)
    for key in ("n", "seeds"):
        if key not in grid:
            raise ValueError(f"[grid] needs {key}")
    n_raw = grid["n"] if isinstance(grid["n"], list) else [grid["n"]]
    if not n_raw:
        raise ValueError("grid.n must be a non-empty list of integers >= 2, got []")
    ns = tuple(_int(f"grid.n[{i}]", v, 2, MAX_DIM) for i, v in enumerate(n_raw))
    if len(set(ns)) != len(ns):
        raise ValueError(f"grid.n values must be distinct, got {list(ns)}")
    d_given = grid.get("d", 3)
    d_axis = isinstance(d_given, list)
    d_raw = d_given if d_axis else [d_given]
    if not d_raw:
        raise ValueError("grid.d must be an integer >= 2 or a non-empty list, got []")
    ds = tuple(_int("grid.d", v, 2, MAX_DIM) for v in d_raw)
    if len(set(ds)) != len(ds):
        raise ValueError(f"grid.d values must be distinct, got {list(ds)}")
    seeds_n = _int("grid.seeds", grid["seeds"], 1, MAX_SEEDS)
    seed0 = _int("grid.seed", grid.get("seed", 0), 0, MAX_SEED)
    if seed0 + seeds_n - 1 > MAX_SEED:
        raise ValueError(
            f"grid.seed + grid.seeds - 1 = {seed0 + seeds_n - 1} must be <= {MAX_SEED} (seeds are int32 PRNG keys)"
        )

    # model parameters (the registry's) ------------------------------------------
    params, accepted = _model_params(grid_kind, kinds, model, ds)

    axes: dict[str, np.ndarray] = {}
    beta_rule, beta_power = None, None
    beta = grid.get("beta")
    no_beta = [k for k in kinds if not any(p.name == "beta" for p in grid_kind.model_params(k))]
    if len(no_beta) == len(kinds):
        if beta is not None:
            raise ValueError(
                f"grid.beta is not a parameter of kind {kind!r}; its parameters: {', '.join(accepted) or 'none'}"
            )
    elif beta is None:
        raise ValueError(
            f"[grid] needs beta for kind {kind!r}: a list, {{critical = [f, ...]}} or {{c = [...], p = ...}}"
        )
    elif isinstance(beta, dict):
        _unknown("grid.beta", beta, _BETA_RULE_KEYS)
        if "critical" in beta:
            if "c" in beta or "p" in beta:
                raise ValueError(
                    "grid.beta: give either critical = [f, ...] or c = [...] with p, not both"
                )
            beta_rule = "critical"
            axes["beta_factor"] = np.asarray(
                _float_list("grid.beta.critical", beta["critical"], "float>0")
            )
        elif "c" in beta and "p" in beta:
            beta_rule = "power"
            beta_power = _float("grid.beta.p", beta["p"])
            axes["beta_factor"] = np.asarray(_float_list("grid.beta.c", beta["c"], "float>0"))
        else:
            raise ValueError(
                "grid.beta rule needs critical = [f, ...] (beta = f n^(2/(d-1))) or both c = [...] and p (beta = c n^p)"
            )
    else:
        axes["beta"] = np.asarray(_float_list("grid.beta", beta, "float>0"))
    if beta_rule is not None:
        _check_beta_rule(beta_rule, beta_power, axes["beta_factor"], ns, ds, dtype)
    for pname, p in accepted.items():
        if p.traced and isinstance(params[pname], list):
            axes[pname] = np.asarray(params[pname])
    recorded = _recorded(params, accepted)
    if noise is not None:  # after the model's parameters: a sigma axis follows theirs
        params = {**params, "noise": noise, "sigma": sigma}
        accepted = {**accepted, **noise_params}
        recorded.update(noise=noise, sigma=sigma)
        if isinstance(sigma, list):
            axes["sigma"] = np.asarray(sigma)
    if frequencies is not None:  # after the noise's: a spread axis follows sigma's
        _check_frequencies(frequencies, params, ds)
        given_f = {"frequencies": frequencies, "spread": spread}
        if frequency_seed is not None:
            given_f["frequency_seed"] = frequency_seed
        params = {**params, **given_f}
        accepted = {**accepted, **frequency_params}
        recorded.update(given_f)
        if isinstance(spread, list):
            axes["spread"] = np.asarray(spread)
    if (
        "prompts" in params
    ):  # the rule of `simulate --prompts`, at the smallest n (every value of an axis)
        problem = size_problem(
            {"prompts": max(_values(params["prompts"]))}, n=min(ns), say=say_spec
        )
        if problem is not None:
            raise ValueError(problem)
    top = float(np.finfo(dtype).max)
    for where, value in [("grid.beta", axes.get("beta"))] + [
        (f"model.{k}", v) for k, v in params.items()
    ]:
        vals: list = [] if value is None else list(np.atleast_1d(np.asarray(value, dtype=object)))
        for x in vals:
            if _is_num(x) and not isinstance(x, bool) and abs(float(x)) > top:
                raise ValueError(
                    f"{where} = {float(x):g} is beyond the range of {dtype} (max {top:.3g})"
                )
    # the points are computed in ``dtype``: distinct there, not only as decimals
    for axis, axis_vals in axes.items():
        if axis_vals.dtype.kind in "iu":
            continue  # an integer parameter (weight_seed): an int32 of the program, not a float
        in_dtype = np.asarray(axis_vals, np.float64).astype(dtype)
        for j in range(len(axis_vals)):
            i = int(np.argmax(in_dtype == in_dtype[j]))
            if i < j:
                where = {"beta": "grid.beta", "beta_factor": "grid.beta factors"}.get(
                    axis, f"model.{axis}"
                )
                raise ValueError(
                    f"{where} values {float(axis_vals[i])!r} and {float(axis_vals[j])!r} are the same {dtype} number "
                    f"({float(in_dtype[j])!r}): two identical points; give values that differ in {dtype} "
                    f'(or dtype = "float64")'
                )

    # time -------------------------------------------------------------------
    tsec = raw.get("time")
    time_spec, ts = None, None
    if not simulated:
        if tsec is not None:
            raise ValueError(
                f"[time] does not apply to kind {kind!r} (one context per point, no dynamics)"
            )
    else:
        if tsec is None:
            raise ValueError("[time] with t1 is required for a simulated model")
        _unknown("time", tsec, _TIME_KEYS)
        if "t1" not in tsec:
            raise ValueError("[time] needs t1")
        t1 = _float("time.t1", tsec["t1"], "float>0")
        solver = tsec.get("solver", "rk2")
        check_choice("time.solver", solver, SOLVERS)
        dt = _float("time.dt", tsec.get("dt", 1e-2), "float>0")  # dt <= t1: RunTime.check
        time_spec = {"t1": t1, "dt": dt, "solver": solver}
        for key in ("rtol", "atol"):  # their rules: the run's (RunTime.check, below)
            if key in tsec:
                time_spec[key] = _float(f"time.{key}", tsec[key], "float>0")
        save = tsec.get("save", 21)
        if isinstance(save, list):
            if len(save) > MAX_SAVES:
                raise ValueError(f"time.save lists {len(save)} times, more than {MAX_SAVES}")
            ts = np.asarray([_float(f"time.save[{i}]", v, "float>=0") for i, v in enumerate(save)])
        else:
            ts = np.linspace(0.0, t1, _int("time.save", save, 2, MAX_SAVES))
        step = tsec.get("step", _DEFAULT_STEP)
        if not isinstance(step, str):
            raise TypeError(
                f"time.step must be a string, one of {', '.join(StepRule.names())}; got {step!r}"
            )
        # the rules of a run's time, as mf.simulate and the command line state them
        RunTime(t1, dt, solver, ts, time_spec.get("rtol"), time_spec.get("atol"), step=step).check(
            say=say_spec
        )
        time_spec["save"] = ts.tolist()
        stop = tsec.get("early_stop")
        if noise is not None:  # the noise's own refusals, in the spec's spelling
            _check_noise(noise, sigma, params, solver, _step_of({"step": step}), stop)
        if frequencies is not None and stop is not None:  # the frequencies' rule, as mf.simulate's
            from ..frequencies import check_run

            check_run(law=_values(frequencies)[0], early_stop=stop, say=say_spec)
        if "early_stop" in tsec:
            no_energy = [k for k in kinds if not _has_energy(grid_kind, k, params)]
            if no_energy:
                why = _masked(params)
                raise ValueError(
                    f"time.early_stop needs an energy; kind {no_energy[0]!r}"
                    + (
                        f" with model.mask = {params['mask']!r} has none ({why})"
                        if why
                        else " has none"
                    )
                )
            time_spec["early_stop"] = _float("time.early_stop", tsec["early_stop"], "float>0")
        if "max_steps" in tsec:
            time_spec["max_steps"] = _int("time.max_steps", tsec["max_steps"], 1, 2**31 - 1)
        rule = tsec.get("step_rule", "fixed")
        check_choice("time.step_rule", rule, _STEP_RULES)
        if rule == "reference":  # recorded only when set: specs without it keep their hash
            if solver not in FIXED_STEP_SOLVERS:
                raise ValueError(
                    f"time.step_rule = 'reference' needs a fixed-step solver ({', '.join(FIXED_STEP_SOLVERS)}), not {solver!r}"
                )
            if no_beta:
                raise ValueError(
                    f"time.step_rule = 'reference' needs a beta; kind {no_beta[0]!r} has none"
                )
            if True in _values(params.get("rescaled", False)):
                raise ValueError(
                    "time.step_rule = 'reference' is the reference code's step in original time; "
                    "set model.rescaled = false"
                )
            time_spec["step_rule"] = rule
        if step != _DEFAULT_STEP:  # recorded only when set: specs without it keep their hash
            time_spec["step"] = step

    # output -----------------------------------------------------------------
    out = dict(raw.get("output", {}))
    _unknown("output", out, _OUTPUT_KEYS)
    valid, default = grid_kind.observables(kinds)
    if _masked(params):  # a masked kernel has no energy
        valid = tuple(o for o in valid if o not in _ENERGY_OBSERVABLES)
        default = tuple(o for o in default if o not in _ENERGY_OBSERVABLES) or valid[:1]
    geometries = _values(params.get("geometry", "sphere"))  # any value of an axis
    euclidean = any(not Geometry.lookup(g).on_sphere for g in geometries)
    if euclidean:  # tokens in R^d: no energy, no cluster count of unit tokens
        default = tuple(o for o in default if o not in SPHERE_OBSERVABLES) or ("collapse_gap",)
    obs = out.get("observables", list(default))
    if not isinstance(obs, list) or not obs or not all(isinstance(o, str) for o in obs):
        raise TypeError(f"output.observables must be a non-empty list of names, got {obs!r}")
    for o in obs:
        if o not in valid:
            owner = (
                next((k for k in kinds if not _has_energy(grid_kind, k, params)), kind)
                if o in _ENERGY_OBSERVABLES
                else kind
            )
            masked = (
                f" with model.mask = {params['mask']!r} ({_masked(params)})"
                if o in _ENERGY_OBSERVABLES and grid_kind.has_energy(owner) and _masked(params)
                else ""
            )
            raise ValueError(
                f"unknown observable {o!r} for kind {owner!r}{masked}; accepted: {', '.join(valid)}"
            )
    if len(set(obs)) != len(obs):
        raise ValueError(f"output.observables has duplicates: {obs!r}")
    if euclidean:
        rd = next(g for g in map(Geometry.lookup, geometries) if not g.on_sphere)
        _check_euclidean(obs, time_spec, rd)
    if "mean_radius" in obs or not _step_of(time_spec).tangent:
        without = [
            k for k in kinds if all(p.name != "normalization" for p in grid_kind.model_params(k))
        ]
        _check_radius(obs, params, time_spec, without)
    threshold = _float("output.cluster_threshold", out.get("cluster_threshold", 0.1), "float>0")
    top_k = _int("output.top_k", out.get("top_k", 8), 1)
    if grid_kind.ranked and top_k > min(ns):
        raise ValueError(f"output.top_k = {top_k} must be <= the smallest n = {min(ns)}")

    data = {
        "name": name,
        "description": description,
        "dtype": dtype,
        "model": {
            "kind": list(kinds) if kinds_axis else kind,
            **recorded,
            **({} if backend is None else {"backend": backend}),
        },
        "grid": {
            "n": list(ns),
            "d": list(ds) if d_axis else ds[0],
            "beta": None
            if "beta" not in axes and beta_rule is None
            else (
                axes["beta"].tolist()
                if beta_rule is None
                else (
                    {"critical": axes["beta_factor"].tolist()}
                    if beta_rule == "critical"
                    else {"c": axes["beta_factor"].tolist(), "p": beta_power}
                )
            ),
            "seeds": seeds_n,
            "seed": seed0,
        },
        "time": time_spec,
        "output": {"observables": list(obs), "cluster_threshold": threshold, "top_k": top_k},
    }
    return Spec(
        text=text,
        data=data,
        name=name,
        kinds=kinds,
        kinds_axis=kinds_axis,
        dtype=dtype,
        params=params,
        n=ns,
        d=ds,
        d_axis=d_axis,
        beta_rule=beta_rule,
        beta_power=beta_power,
        axes=axes,
        seeds=np.arange(seed0, seed0 + seeds_n),
        time=time_spec,
        ts=ts,
        observables=tuple(obs),
        cluster_threshold=threshold,
        top_k=top_k,
        statics=_static_axes(params, accepted),
    )
