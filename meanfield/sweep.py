"""Sweep engine: declarative grids over ``(n, beta, seed, ...)``, compiled once per shape,
chunked to a memory budget, sharded across devices, stored resumably (DESIGN.md, Scale-out).

A sweep is a TOML file (read with ``tomllib``)::

    name = "smoke"
    dtype = "float32"                  # or "float64"

    [model]
    kind = "usa"                       # usa, distance-bias, toeplitz, rope, phase-field,
                                       # prompt, sa, attention
    # kernel parameters: a number is fixed, a list is a grid axis (see MODEL_PARAMS)

    [grid]
    n = [16, 32]                       # static shapes: one compilation per (n, d)
    d = 3                              # an int, or a list (a grid axis)
    beta = [0.5, 1.0, 2.0, 4.0]        # a list; or {critical = [f, ...]}: beta = f n^(2/(d-1));
                                       # or {c = [c, ...], p = 0.5}: beta = c n^p
    seeds = 8                          # seeds seed .. seed + seeds - 1
    seed = 0

    [time]                             # not for kind = "attention"
    t1 = 5.0
    dt = 0.05
    solver = "rk2"                     # euler, rk2, rk4, tsit5, dopri5 (rtol/atol then)
    save = 11                          # number of equally spaced save times, or a list
    early_stop = 1e-8                  # optional (paper App. B.1)

    [output]
    observables = ["collapse_gap", "energy", "clusters"]
    cluster_threshold = 0.1
    top_k = 8                          # attention order statistics A_(1..k)

Execution: the points of a grid with the same static shape ``(n, d)`` are one
batch: ``beta``, the other swept scalars and the seeds are ``vmap``-ed traced
axes of one jitted function, compiled once per ``(n, d)`` (padding across ``n``
with masks was measured slower; docs/sweep_benchmarks.md). The batch is cut into
chunks that fit the memory budget (estimated from the shapes), padded to one
size per shape, and each chunk is laid out over ``jax.devices()`` with a
``Mesh`` over the batch axis (``NamedSharding``). Every chunk is written to the
zarr store as whole zarr chunks followed by a completion mark, so a killed sweep
resumes with ``--resume`` and computes only the missing chunks.

Point ``(n, d, params, seed)`` starts from ``x0 = mf.sphere.uniform(jax.random.key(seed), n, d)``
whatever the chunking or device count, so results do not depend on either.

CLI: ``meanfield sweep SPEC.toml --out STORE.zarr [--resume] [--memory 2GB] [--dry-run] [--quiet]``
and ``meanfield plot STORE.zarr [--out DIR]`` (also ``python -m meanfield.sweep ...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import re
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, cast

import numpy as np

from ._checks import check_choice

__all__ = [
    "Spec",
    "Plan",
    "parse_spec",
    "load_spec",
    "make_plan",
    "run_sweep",
    "load",
    "parse_memory",
    "main",
    "plot_main",
    "MODELS",
    "MODEL_PARAMS",
    "OBSERVABLES",
]

MODELS = ("usa", "distance-bias", "toeplitz", "rope", "phase-field", "prompt", "sa", "attention")
SIM_OBSERVABLES = ("collapse_gap", "energy", "clusters", "token_similarity")
ATTENTION_OBSERVABLES = ("top_weight", "top_weights", "ratios", "cumulative", "log_partition")
OBSERVABLES = SIM_OBSERVABLES + ATTENTION_OBSERVABLES

TOP_KEYS = ("name", "description", "dtype", "model", "grid", "time", "output")
GRID_KEYS = ("n", "d", "beta", "seeds", "seed")
TIME_KEYS = ("t1", "dt", "solver", "save", "rtol", "atol", "early_stop", "max_steps", "step_rule")
STEP_RULES = ("fixed", "reference")
OUTPUT_KEYS = ("observables", "cluster_threshold", "top_k")
BETA_RULE_KEYS = ("critical", "c", "p")
SOLVERS = ("euler", "rk2", "rk4", "tsit5", "dopri5")
DTYPES = ("float32", "float64")


@dataclasses.dataclass(frozen=True)
class _Param:
    """A model parameter: ``traced`` ones may be lists (grid axes); static ones change the program."""

    traced: bool
    default: Any
    kind: str  # "float>=0", "float>0", "float", "bool", "int>=1", "int>=0", "plane", "gauges"


_RESCALED = _Param(False, False, "bool")
_PLANE = _Param(False, [0, 1], "plane")

#: Parameters of each model kind (besides ``beta`` in [grid]); traced ones may be lists (axes).
MODEL_PARAMS: dict[str, dict[str, _Param]] = {
    "usa": {"rescaled": _RESCALED},
    "distance-bias": {"lam": _Param(True, 1.0, "float>=0"), "rescaled": _RESCALED},
    "toeplitz": {"m": _Param(True, 1.0, "float>0")},
    "rope": {"omega": _Param(True, 2 * math.pi, "float"), "plane": _PLANE, "rescaled": _RESCALED},
    "phase-field": {
        # phi(s) = omega s + amplitude sin(2 pi frequency s)
        "omega": _Param(True, 2 * math.pi, "float"),
        "amplitude": _Param(True, 0.0, "float"),
        "frequency": _Param(False, 1, "int>=1"),
        "plane": _PLANE,
        "rescaled": _RESCALED,
    },
    "prompt": {
        "prompts": _Param(False, 3, "int>=1"),
        "gauges": _Param(False, "random", "gauges"),
        "gauge_seed": _Param(False, 0, "int>=0"),
        "plane": _PLANE,
        "rescaled": _RESCALED,
    },
    "sa": {"normalized": _Param(False, True, "bool"), "rescaled": _RESCALED},
    "attention": {},
}

#: Status variable values (CF flag_values / flag_meanings).
PENDING, OK, FAILED = 0, 1, 2


# ----------------------------------------------------------------------------
# spec
# ----------------------------------------------------------------------------


def _unknown(table: str, got: dict, accepted) -> None:
    bad = sorted(set(got) - set(accepted))
    if bad:
        where = f"[{table}]" if table else "top level"
        raise ValueError(
            f"unknown key{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} in {where}; "
            f"accepted keys: {', '.join(accepted)}"
        )


def _is_num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _float(name: str, v, kind: str = "float") -> float:
    if not _is_num(v):
        raise TypeError(f"{name} must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v!r}")
    if kind == "float>0" and v <= 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    if kind == "float>=0" and v < 0:
        raise ValueError(f"{name} must be >= 0, got {v!r}")
    return v


def _int(name: str, v, minimum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return int(v)


def _float_list(name: str, v, kind: str) -> list[float]:
    vals = v if isinstance(v, list) else [v]
    if not vals:
        raise ValueError(f"{name} must be a non-empty list of numbers, got []")
    out = [_float(f"{name}[{i}]" if isinstance(v, list) else name, x, kind) for i, x in enumerate(vals)]
    if len(set(out)) != len(out):
        raise ValueError(f"{name} values must be distinct, got {vals!r}")
    return out


def _param_value(name: str, p: _Param, v):
    if p.traced:
        vals = _float_list(name, v, p.kind)
        return vals if isinstance(v, list) else vals[0]
    if p.kind == "bool":
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be true or false, got {v!r}")
        return v
    if p.kind.startswith("int"):
        return _int(name, v, int(p.kind[-1]))
    if p.kind == "plane":
        if not (isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in v)):
            raise TypeError(f"{name} must be a pair of coordinate indices like [0, 1], got {v!r}")
        if v[0] == v[1] or min(v) < 0:
            raise ValueError(f"{name} must be two distinct indices >= 0, got {v!r}")
        return list(v)
    if p.kind == "gauges":
        check_choice(name, v, ("rotation", "random"))
        return v
    raise AssertionError(p.kind)  # pragma: no cover


@dataclasses.dataclass(frozen=True)
class Spec:
    """A parsed, validated sweep specification.

    ``axes`` maps each traced grid axis (``beta`` or ``beta_factor``, then swept
    model parameters) to its values; ``n`` and ``d`` are static axes, ``seed``
    the innermost axis. ``data`` is the normalised dictionary (defaults filled in)
    whose canonical JSON gives ``hash``.
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

    @property
    def hash(self) -> str:
        return spec_hash(self.data)

    @property
    def kind(self) -> str:
        """The model kind (the first one when ``kind`` is a list, a grid axis)."""
        return self.kinds[0]

    @property
    def simulated(self) -> bool:
        return self.kinds[0] != "attention"

    def beta_values(self, n: int, d: int) -> np.ndarray | None:
        """The ``beta`` axis for static shape ``(n, d)`` (rules evaluated), or None (toeplitz)."""
        if self.beta_rule is None:
            return self.axes.get("beta")
        f = self.axes["beta_factor"]
        p = 2.0 / (d - 1) if self.beta_rule == "critical" else cast(float, self.beta_power)
        return f * float(n) ** p

    @property
    def grid_size(self) -> int:
        return len(self.kinds) * len(self.n) * len(self.d) * int(np.prod([len(v) for v in self.axes.values()])) * len(self.seeds)


def spec_hash(data: dict) -> str:
    """sha256 of the canonical JSON of the normalised spec (comments and layout do not count)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def load_spec(path) -> Spec:
    """Read and validate a TOML spec file (``FileNotFoundError``, ``tomllib.TOMLDecodeError``, ``ValueError``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep spec not found: {path}")
    text = path.read_text()
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
    """
    raw = tomllib.loads(text)
    _unknown("", raw, TOP_KEYS)
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
    check_choice("dtype", dtype, DTYPES)

    # model ------------------------------------------------------------------
    model = dict(raw.get("model", {}))
    if "kind" not in model:
        raise ValueError(f"[model] needs kind = one of {', '.join(MODELS)} (or a list of them: a grid axis)")
    kind_raw = model.pop("kind")
    kinds_axis = isinstance(kind_raw, list)
    kinds = tuple(kind_raw) if kinds_axis else (kind_raw,)
    if not kinds:
        raise ValueError(f"model.kind must be a model name or a non-empty list; accepted: {', '.join(MODELS)}")
    for k in kinds:
        if not isinstance(k, str):
            raise TypeError(f"model.kind must be a string or a list of strings, got {kind_raw!r}")
        check_choice("model kind", k, MODELS)
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"model.kind values must be distinct, got {kind_raw!r}")
    if "attention" in kinds and len(kinds) > 1:
        raise ValueError("model.kind 'attention' (no dynamics) cannot share a sweep with simulated models")
    kind = kinds[0]
    accepted = {}
    for k in kinds:
        accepted.update(MODEL_PARAMS[k])
    _unknown("model", model, ("kind",) + tuple(accepted))
    params = {}
    for pname, p in accepted.items():
        params[pname] = _param_value(f"model.{pname}", p, model.get(pname, p.default))

    # grid -------------------------------------------------------------------
    grid = dict(raw.get("grid", {}))
    _unknown("grid", grid, GRID_KEYS)
    for key in ("n", "seeds"):
        if key not in grid:
            raise ValueError(f"[grid] needs {key}")
    n_raw = grid["n"] if isinstance(grid["n"], list) else [grid["n"]]
    if not n_raw:
        raise ValueError("grid.n must be a non-empty list of integers >= 2, got []")
    ns = tuple(_int(f"grid.n[{i}]", v, 2) for i, v in enumerate(n_raw))
    if len(set(ns)) != len(ns):
        raise ValueError(f"grid.n values must be distinct, got {list(ns)}")
    d_given = grid.get("d", 3)
    d_axis = isinstance(d_given, list)
    d_raw = d_given if d_axis else [d_given]
    if not d_raw:
        raise ValueError("grid.d must be an integer >= 2 or a non-empty list, got []")
    ds = tuple(_int("grid.d", v, 2) for v in d_raw)
    if len(set(ds)) != len(ds):
        raise ValueError(f"grid.d values must be distinct, got {list(ds)}")
    seeds_n = _int("grid.seeds", grid["seeds"], 1)
    seed0 = _int("grid.seed", grid.get("seed", 0), 0)
    for pname in ("plane",):
        if pname in params and max(params[pname]) >= min(ds):
            raise ValueError(f"model.plane {params[pname]} needs indices < d = {min(ds)}")

    axes: dict[str, np.ndarray] = {}
    beta_rule, beta_power = None, None
    beta = grid.get("beta")
    if kinds == ("toeplitz",):
        if beta is not None:
            raise ValueError("grid.beta is not a parameter of kind 'toeplitz' (h = cos(2 pi m (t - s)) <x, y>)")
    elif beta is None:
        raise ValueError(f"[grid] needs beta for kind {kind!r}: a list, {{critical = [f, ...]}} or {{c = [...], p = ...}}")
    elif isinstance(beta, dict):
        _unknown("grid.beta", beta, BETA_RULE_KEYS)
        if "critical" in beta:
            if "c" in beta or "p" in beta:
                raise ValueError("grid.beta: give either critical = [f, ...] or c = [...] with p, not both")
            beta_rule = "critical"
            axes["beta_factor"] = np.asarray(_float_list("grid.beta.critical", beta["critical"], "float>0"))
        elif "c" in beta and "p" in beta:
            beta_rule = "power"
            beta_power = _float("grid.beta.p", beta["p"])
            axes["beta_factor"] = np.asarray(_float_list("grid.beta.c", beta["c"], "float>0"))
        else:
            raise ValueError("grid.beta rule needs critical = [f, ...] (beta = f n^(2/(d-1))) or both c = [...] and p (beta = c n^p)")
    else:
        axes["beta"] = np.asarray(_float_list("grid.beta", beta, "float>0"))
    for pname, p in accepted.items():
        if p.traced and isinstance(params[pname], list):
            axes[pname] = np.asarray(params[pname])

    # time -------------------------------------------------------------------
    tsec = raw.get("time")
    time_spec, ts = None, None
    if kind == "attention":
        if tsec is not None:
            raise ValueError("[time] does not apply to kind 'attention' (one context per point, no dynamics)")
    else:
        if tsec is None:
            raise ValueError("[time] with t1 is required for a simulated model")
        _unknown("time", tsec, TIME_KEYS)
        if "t1" not in tsec:
            raise ValueError("[time] needs t1")
        t1 = _float("time.t1", tsec["t1"], "float>0")
        solver = tsec.get("solver", "rk2")
        check_choice("time.solver", solver, SOLVERS)
        dt = _float("time.dt", tsec.get("dt", 1e-2), "float>0")
        if dt > t1:
            raise ValueError(f"time.dt = {dt:g} must be <= t1 = {t1:g}")
        time_spec = {"t1": t1, "dt": dt, "solver": solver}
        if solver in ("tsit5", "dopri5"):
            if "rtol" not in tsec or "atol" not in tsec:
                raise ValueError(f"time.solver {solver!r} is adaptive: give both rtol and atol")
            time_spec["rtol"] = _float("time.rtol", tsec["rtol"], "float>0")
            time_spec["atol"] = _float("time.atol", tsec["atol"], "float>0")
        elif "rtol" in tsec or "atol" in tsec:
            raise ValueError(f"time.rtol/atol apply to the adaptive solvers tsit5, dopri5, not {solver!r}")
        save = tsec.get("save", 21)
        if isinstance(save, list):
            ts = np.asarray([_float(f"time.save[{i}]", v, "float>=0") for i, v in enumerate(save)])
            if ts.size == 0 or np.any(np.diff(ts) <= 0) or ts.max() > t1:
                raise ValueError(f"time.save must be increasing times in [0, t1 = {t1:g}], got {save!r}")
        else:
            ts = np.linspace(0.0, t1, _int("time.save", save, 2))
        time_spec["save"] = ts.tolist()
        if "early_stop" in tsec:
            if "sa" in kinds:
                raise ValueError("time.early_stop needs an energy; kind 'sa' has none")
            time_spec["early_stop"] = _float("time.early_stop", tsec["early_stop"], "float>0")
        if "max_steps" in tsec:
            time_spec["max_steps"] = _int("time.max_steps", tsec["max_steps"], 1)
        rule = tsec.get("step_rule", "fixed")
        check_choice("time.step_rule", rule, STEP_RULES)
        if rule == "reference":  # recorded only when set: specs without it keep their hash
            if solver not in ("euler", "rk2", "rk4"):
                raise ValueError(f"time.step_rule = 'reference' needs a fixed-step solver (euler, rk2, rk4), not {solver!r}")
            if "toeplitz" in kinds:
                raise ValueError("time.step_rule = 'reference' needs a beta; kind 'toeplitz' has none")
            if params.get("rescaled", False):
                raise ValueError(
                    "time.step_rule = 'reference' is the reference code's step in original time; "
                    "set model.rescaled = false"
                )
            time_spec["step_rule"] = rule

    # output -----------------------------------------------------------------
    out = dict(raw.get("output", {}))
    _unknown("output", out, OUTPUT_KEYS)
    valid: tuple[str, ...]
    if kind == "attention":
        valid, default = ATTENTION_OBSERVABLES, ["top_weight"]
    elif "sa" in kinds:
        valid, default = tuple(o for o in SIM_OBSERVABLES if o != "energy"), ["collapse_gap"]
    else:
        valid, default = SIM_OBSERVABLES, ["collapse_gap", "energy"]
    obs = out.get("observables", default)
    if not isinstance(obs, list) or not obs or not all(isinstance(o, str) for o in obs):
        raise TypeError(f"output.observables must be a non-empty list of names, got {obs!r}")
    for o in obs:
        if o not in valid:
            raise ValueError(f"unknown observable {o!r} for kind {kind!r}; accepted: {', '.join(valid)}")
    if len(set(obs)) != len(obs):
        raise ValueError(f"output.observables has duplicates: {obs!r}")
    threshold = _float("output.cluster_threshold", out.get("cluster_threshold", 0.1), "float>0")
    top_k = _int("output.top_k", out.get("top_k", 8), 1)
    if kind == "attention" and top_k > min(ns):
        raise ValueError(f"output.top_k = {top_k} must be <= the smallest n = {min(ns)}")

    data = {
        "name": name,
        "description": description,
        "dtype": dtype,
        "model": {"kind": list(kinds) if kinds_axis else kind, **params},
        "grid": {
            "n": list(ns),
            "d": list(ds) if d_axis else ds[0],
            "beta": None if "beta" not in axes and beta_rule is None else (
                axes["beta"].tolist() if beta_rule is None
                else ({"critical": axes["beta_factor"].tolist()} if beta_rule == "critical"
                      else {"c": axes["beta_factor"].tolist(), "p": beta_power})
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
    )


def spec_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys where two normalised specs differ."""
    keys = sorted(set(a) | set(b))
    diffs = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        name = f"{prefix}{k}"
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs += spec_differences(va, vb, name + ".")
        elif va != vb:
            diffs.append(name)
    return diffs


# ----------------------------------------------------------------------------
# plan
# ----------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_memory(size) -> int:
    """Bytes of a size like ``"2GB"`` (10^9), ``"512MiB"`` (2^20), ``"1.5gb"`` or an int.

    Example:
        >>> parse_memory("2GB"), parse_memory("1KiB")
        (2000000000, 1024)
    """
    if _is_num(size):
        value = float(size)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(size))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"memory must be a size like 2GB, 512MB, 1GiB or a number of bytes, got {size!r}")
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"memory must be > 0, got {size!r}")
    return int(value)


def _fmt_bytes(b: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{int(b)} B"


def point_memory(spec: Spec, kind: str, n: int, d: int) -> int:
    """Estimated peak bytes of one grid point of shape ``(n, d)`` inside a vmapped chunk.

    Simulation: the dense ``n x n`` logits and weights of the field (tiled rows of
    1024 above 2^24 pairs), a few copies per Runge--Kutta stage of the ``(n, d)``
    state, the saved observables; cluster counting adds an ``n x n`` adjacency.
    Attention: the ``(n, d)`` keys with their Gaussian draws and a few ``(n,)`` vectors.
    """
    b = 8 if spec.dtype == "float64" else 4
    if not spec.simulated:
        return b * (3 * n * d + 6 * n + 4 * spec.top_k) + 256
    rows = n if n * n <= 2**24 else 1024
    T, ts = cast(dict, spec.time), cast(np.ndarray, spec.ts)  # simulated: both set
    stages = {"euler": 1, "rk2": 2, "rk4": 4, "tsit5": 7, "dopri5": 7}[T["solver"]]
    pairs = 3 * rows * n
    if "clusters" in spec.observables:
        pairs += 2 * n * n
    if kind in ("rope", "phase-field", "prompt"):
        pairs += n * d * d  # the gauge matrices
    states = (2 * stages + 6) * n * d
    outputs = len(ts) * (len(spec.observables) + 3)
    return b * (pairs + states + outputs) + 256


@dataclasses.dataclass(frozen=True)
class Group:
    """All points of one model kind and static shape ``(n, d)``: one compilation."""

    kind: str
    n: int
    d: int
    block: tuple  # points per chunk along each traced axis (then seed)
    point_bytes: int

    def chunk_slices(self, shape) -> list[tuple]:
        ranges = [range(0, s, b) for s, b in zip(shape, self.block)]
        out = []
        for starts in np.ndindex(*[len(r) for r in ranges]):
            out.append(tuple(
                slice(r[i], min(r[i] + b, s)) for r, i, b, s in zip(ranges, starts, self.block, shape)
            ))
        return out


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a sweep runs: groups (compilations), chunk blocks, memory."""

    spec: Spec
    groups: tuple
    batch_shape: tuple  # traced axes + seed
    zarr_block: tuple  # zarr chunk shape over batch_shape
    devices: int
    memory: int

    @property
    def chunks(self) -> list[tuple[int, int, tuple]]:
        """``(chunk id, group index, slices over batch_shape)`` for every chunk, in order."""
        out, cid = [], 0
        for gi, g in enumerate(self.groups):
            for sl in g.chunk_slices(self.batch_shape):
                out.append((cid, gi, sl))
                cid += 1
        return out

    def padded_size(self, g: Group) -> int:
        p = int(np.prod(g.block))
        return -(-p // self.devices) * self.devices

    def describe(self) -> str:
        spec = self.spec
        chunks = self.chunks
        axes = ([f"model={len(spec.kinds)}"] if spec.kinds_axis else []) + [f"n={len(spec.n)}"] + ([f"d={len(spec.d)}"] if spec.d_axis else [])
        axes += [f"{k}={len(v)}" for k, v in spec.axes.items()] + [f"seed={len(spec.seeds)}"]
        if spec.simulated:
            axes.append(f"time={len(cast(np.ndarray, spec.ts))}")
        lines = [
            f"sweep {spec.name!r}: model {', '.join(spec.kinds)}, {spec.grid_size} points ({' x '.join(axes)})",
            f"devices: {self.devices}; memory budget {_fmt_bytes(self.memory)} per device",
            f"compilations: {len(self.groups)} (one per model and static shape (n, d)); chunks: {len(chunks)}",
        ]
        if _step_rule(spec) == "reference":
            lines.append(
                f"steps: dt(beta) = {cast(dict, spec.time)['dt']:g} / max(sqrt(beta) e^(beta - 1/2), 1) (step_rule = "
                f"'reference'), one beta per chunk so a chunk runs its own step count"
            )
        for g in self.groups:
            nchunks = len(g.chunk_slices(self.batch_shape))
            pts = int(np.prod(g.block))
            pad = self.padded_size(g)
            lines.append(
                f"  {g.kind} n={g.n} d={g.d}: {int(np.prod(self.batch_shape))} points in {nchunks} chunk(s) of "
                f"{pts} (padded to {pad}), ~{_fmt_bytes(g.point_bytes)} per point, "
                f"~{_fmt_bytes(g.point_bytes * pad / self.devices)} per chunk per device"
            )
        worst = max(g.point_bytes for g in self.groups)
        if worst > self.memory:
            lines.append(
                f"warning: one point needs ~{_fmt_bytes(worst)}, more than the budget "
                f"{_fmt_bytes(self.memory)}: chunks hold one point per device"
            )
        if spec.simulated and not spec.params.get("rescaled", False):
            limit = float(np.log(np.finfo(spec.dtype).max))
            over = sum(
                int(np.sum(cast(np.ndarray, spec.beta_values(g.n, g.d)) >= limit))
                for g in self.groups
                if g.kind != "toeplitz" and not (g.kind == "sa" and spec.params.get("normalized", True))
            )
            if over:
                lines.append(
                    f"warning: {over} (shape, beta) pair(s) with beta >= {limit:.1f} overflow exp(beta <x, y>) "
                    f"in {spec.dtype}; those points will be recorded as failed (set model.rescaled = true)"
                )
        lines += self._step_warnings()
        return "\n".join(lines)

    def _step_warnings(self) -> list[str]:
        """Fixed explicit steps much longer than the interaction time scale overshoot (the energy
        then decreases along a run). Rate of an exp kernel: ``sqrt(beta) e^(beta - 1/2)`` (the
        reference code's step rule ``dt <= 0.1 / max(sqrt(beta) e^(beta - 1/2), 1)``),
        ``sqrt(beta) e^(-1/2)`` when rescaled; normalised self-attention: ``beta``. Warns when
        ``dt x rate > 1`` (10x the reference rule; measured: projected RK2 at dt = 0.05, beta = 4,
        USA, dt x rate = 3.3, lost energy)."""
        spec = self.spec
        if not spec.simulated or cast(dict, spec.time)["solver"] not in ("euler", "rk2", "rk4"):
            return []
        if _step_rule(spec) == "reference":
            return []  # dt x rate <= dt by construction
        dt, rescaled = cast(dict, spec.time)["dt"], bool(spec.params.get("rescaled", False))
        worst, count = 0.0, 0
        for g in self.groups:
            if g.kind == "toeplitz":
                continue
            b = np.asarray(spec.beta_values(g.n, g.d), dtype=np.float64)
            if g.kind == "sa" and spec.params.get("normalized", True):
                rate = b
            else:
                rate = np.sqrt(b) * np.exp((0.0 if rescaled else b) - 0.5)
            r = dt * rate
            count += int(np.sum(r > 1.0))
            worst = max(worst, float(r.max()))
        if not count:
            return []
        return [
            f"warning: time.dt = {dt:g} is long for {count} (shape, beta) pair(s) (dt x rate up to {worst:.3g} > 1; "
            f"rate sqrt(beta) e^(beta - 1/2) for exp kernels): fixed explicit steps may overshoot and lose "
            f"energy; use dt <= {dt / worst:.3g} or model.rescaled = true"
        ]


def _block_for(capacity: int, shape: tuple) -> tuple:
    """Largest block ``(1, .., 1, r, full, .., full)`` over ``shape`` with at most ``capacity`` points."""
    block = [1] * len(shape)
    rem = max(1, capacity)
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] <= rem:
            block[i] = shape[i]
            rem //= shape[i]
        else:
            block[i] = max(1, rem)
            break
    return tuple(block)


def _step_rule(spec: Spec) -> str:
    return (spec.time or {}).get("step_rule", "fixed")


def make_plan(spec: Spec, memory="2GB", *, devices: int | None = None, blocks: list | None = None) -> Plan:
    """Cut the grid into chunks: per ``(n, d)``, blocks over (traced axes, seed) that fit ``memory``
    per device; ``blocks`` (from a store being resumed) overrides the computed ones."""
    import jax

    memory_b = parse_memory(memory)
    ndev = len(jax.devices()) if devices is None else int(devices)
    batch_shape = tuple(len(v) for v in spec.axes.values()) + (len(spec.seeds),)
    shapes = [(k, n, d) for k in spec.kinds for n in spec.n for d in spec.d]
    pbytes = [point_memory(spec, k, n, d) for k, n, d in shapes]
    if blocks is None:
        raw = [_block_for(ndev * max(1, memory_b // pb), batch_shape) for pb in pbytes]
        if _step_rule(spec) == "reference":
            # one beta per chunk: its points share the step count, so a vmapped chunk runs
            # exactly that many steps (no padding to the longest run of the grid)
            axis = [i for i, name in enumerate(spec.axes) if name in ("beta", "beta_factor")][0]
            raw = [tuple(1 if i == axis else b for i, b in enumerate(blk)) for blk in raw]
        # zarr chunks: the smallest block; larger blocks are made unions of whole zarr chunks
        zb = min(raw, key=lambda b: int(np.prod(b)))
        # the axis where the zarr block is partial (None: one block holds the whole batch)
        partial = [i for i, (b, s) in enumerate(zip(zb, batch_shape)) if b < s]
        blocks = []
        for blk in raw:
            b = list(blk)
            if partial and b[partial[-1]] < batch_shape[partial[-1]]:
                k = partial[-1]
                b[k] = max(zb[k], (b[k] // zb[k]) * zb[k])
            blocks.append(tuple(b))
        zarr_block = zb
    else:
        blocks = [tuple(b) for b in blocks]
        zarr_block = min(blocks, key=lambda b: int(np.prod(b)))
    groups = tuple(Group(k, n, d, blk, pb) for (k, n, d), blk, pb in zip(shapes, blocks, pbytes))
    return Plan(spec, groups, batch_shape, tuple(zarr_block), ndev, memory_b)


# ----------------------------------------------------------------------------
# the per-point programs
# ----------------------------------------------------------------------------


def _build_model(spec: Spec, kind: str, params: dict, d: int):
    """The kernel or model of one point (``params``: traced scalars by name)."""
    import jax
    import jax.numpy as jnp

    from . import kernels, models, sphere

    P = {**spec.params, **params}
    resc = P.get("rescaled", False)
    beta: Any = params.get("beta")  # None for toeplitz only
    if kind == "usa":
        return kernels.USA(beta, rescaled=resc)
    if kind == "distance-bias":
        return kernels.DistanceBias(beta, P["lam"], rescaled=resc)
    if kind == "toeplitz":
        return kernels.Toeplitz(P["m"])
    if kind == "rope":
        return kernels.RoPE(beta, P["omega"], tuple(P["plane"]), rescaled=resc)
    if kind == "phase-field":
        omega, amp, freq = P["omega"], P["amplitude"], P["frequency"]
        return kernels.PhaseField(
            beta, lambda s: omega * s + amp * jnp.sin(2 * jnp.pi * freq * s), tuple(P["plane"]), rescaled=resc
        )
    if kind == "prompt":
        K = P["prompts"]
        if P["gauges"] == "rotation":  # Psi_k = rotation by 2 pi k / K in `plane`
            G = jnp.stack([sphere.rotation(2 * np.pi * k / K, d, tuple(P["plane"])) for k in range(K)])
        else:  # Haar-random, as in `meanfield reproduce usa-av`
            G = kernels.random_gauges(jax.random.key(P["gauge_seed"]), K, d)
        return kernels.Prompt(beta, jnp.asarray(G, spec.dtype), rescaled=resc)
    if kind == "sa":
        return models.SelfAttention(beta, normalized=P["normalized"], rescaled=resc)
    raise AssertionError(kind)  # pragma: no cover


def _output_layout(spec: Spec) -> dict[str, tuple]:
    """Data variable -> trailing dims after the grid dims."""
    out: dict[str, tuple[str, ...]]
    if spec.simulated:
        out = {o: ("time",) for o in spec.observables}
        out["stop_time"] = ()
        out["num_steps"] = ()
    else:
        out = {o: (() if o in ("top_weight", "log_partition") else ("rank",)) for o in spec.observables}
    return out


def _point_fn(spec: Spec, kind: str, n: int, d: int):
    """``f(params: dict of scalars, seed) -> dict of outputs`` for static shape ``(n, d)``."""
    import jax
    import jax.numpy as jnp

    from . import attention, metrics, sphere
    from .integrate import simulate
    from .phase_diagram import usa_step_size

    dtype = jnp.dtype(spec.dtype)

    if not spec.simulated:
        k = spec.top_k
        q = jnp.zeros((d,), dtype).at[0].set(1.0)  # keys are uniform: any fixed query is alike

        def attn(params, seed):
            keys = sphere.uniform(jax.random.key(seed), n, d, dtype)
            beta = params["beta"].astype(dtype)
            w = attention.top_weights(q, keys, beta, k)
            out = {
                "top_weight": w[0],
                "top_weights": w,
                "ratios": w / w[0],
                "cumulative": jnp.cumsum(w),
                "log_partition": attention.log_partition(q, keys, beta),
            }
            out = {o: out[o] for o in spec.observables}
            ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in out.values()]))
            out["status"] = jnp.where(ok, OK, FAILED).astype(jnp.int8)
            return out

        return attn

    T = cast(dict, spec.time)
    thr = spec.cluster_threshold
    extra = {}
    if "clusters" in spec.observables:
        extra["clusters"] = lambda x: metrics.num_clusters(x, thr).astype(dtype)
    if "token_similarity" in spec.observables:
        extra["token_similarity"] = metrics.token_similarity

    ts = cast(np.ndarray, spec.ts)
    dt, max_steps = T["dt"], T.get("max_steps")
    if _step_rule(spec) == "reference":
        # beta-dependent step, traced: one compilation for the whole beta axis; the bound on
        # the step count comes from the smallest step of this shape's betas
        h_min = float(np.min(usa_step_size(cast(np.ndarray, spec.beta_values(n, d)), T["dt"])))
        max_steps = max_steps or int(np.ceil(T["t1"] / h_min)) + len(ts) + 2

    def sim(params, seed):
        x0 = sphere.uniform(jax.random.key(seed), n, d, dtype)
        model = _build_model(spec, kind, {k: v.astype(dtype) for k, v in params.items()}, d)
        step = dt
        if _step_rule(spec) == "reference":
            step = usa_step_size(params["beta"].astype(dtype), T["dt"])
        traj = simulate(
            model,
            x0,
            t1=T["t1"],
            dt=step,
            solver=T["solver"],
            ts=spec.ts,
            rtol=T.get("rtol"),
            atol=T.get("atol"),
            observables=extra,
            save_states=False,
            early_stop=T.get("early_stop"),
            max_steps=max_steps,
        )
        vals = {"collapse_gap": traj.collapse_gap, "energy": traj.energy, **traj.observables}
        out = {o: vals[o] for o in spec.observables}
        out["stop_time"] = traj.stop_time.astype(dtype)
        out["num_steps"] = jnp.asarray(traj.num_steps, jnp.int32)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(out[o])) for o in spec.observables]))
        out["status"] = jnp.where(traj.failed | ~finite, FAILED, OK).astype(jnp.int8)
        return out

    return sim


def _chunk_inputs(spec: Spec, g: Group, sl: tuple, size: int) -> tuple[dict, np.ndarray]:
    """Flat per-point inputs of one chunk (row-major over the block), padded to ``size``."""
    names = list(spec.axes)
    grids = {}
    for name, s in zip(names, sl[:-1]):
        grids[name] = spec.axes[name][s]
    idx = np.meshgrid(*[np.arange(s.stop - s.start) for s in sl], indexing="ij")
    params = {}
    for i, name in enumerate(names):
        params[name] = grids[name][idx[i].ravel()]
    if "beta_factor" in params:
        p = 2.0 / (g.d - 1) if spec.beta_rule == "critical" else cast(float, spec.beta_power)
        params["beta"] = params.pop("beta_factor") * float(g.n) ** p
    seeds = spec.seeds[sl[-1]][idx[-1].ravel()]
    count = seeds.size
    pad = size - count
    if pad:
        params = {k: np.concatenate([v, np.repeat(v[-1:], pad)]) for k, v in params.items()}
        seeds = np.concatenate([seeds, np.repeat(seeds[-1:], pad)])
    dt = np.float64 if spec.dtype == "float64" else np.float32
    return {k: v.astype(dt) for k, v in params.items()}, seeds.astype(np.int32)


class _Runner:
    """Compiled, sharded batch function per static shape, built lazily."""

    def __init__(self, plan: Plan):
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.plan = plan
        devs = jax.devices()[: plan.devices] if plan.devices <= len(jax.devices()) else jax.devices()
        self.mesh = Mesh(np.asarray(devs), ("batch",))
        self.sharding = NamedSharding(self.mesh, PartitionSpec("batch"))
        self.fns: dict[int, Any] = {}
        self.compile_s: dict[int, float] = {}

    def __call__(self, gi: int, params: dict, seeds: np.ndarray) -> dict:
        import jax

        g = self.plan.groups[gi]
        if gi not in self.fns:
            fn = jax.vmap(_point_fn(self.plan.spec, g.kind, g.n, g.d))
            self.fns[gi] = jax.jit(fn, in_shardings=self.sharding, out_shardings=self.sharding)
        # global arrays built from the (identical) host copies: works on one host and on several
        put = lambda v: jax.make_array_from_callback(v.shape, self.sharding, lambda idx: v[idx])  # noqa: E731
        dev_params = {k: put(v) for k, v in params.items()}
        dev_seeds = put(seeds)
        t0 = time.perf_counter()
        out = self.fns[gi](dev_params, dev_seeds)
        if jax.process_count() > 1:  # pragma: no cover - multi-host
            from jax.experimental import multihost_utils

            out = multihost_utils.process_allgather(out, tiled=True)
        out = {k: np.asarray(v) for k, v in out.items()}
        self.compile_s.setdefault(gi, time.perf_counter() - t0)
        return out


# ----------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------


def run_sweep(spec, out, *, resume: bool = False, memory="2GB", dry_run: bool = False, quiet: bool = False):
    """Run a sweep into a zarr store; return the ``Plan`` (with ``dry_run``, only the plan).

    Args:
        spec: a ``Spec``, a path to a TOML file, or TOML text.
        out: path of the zarr store (a directory, conventionally ``*.zarr``).
        resume: continue an interrupted sweep of the same spec in ``out`` (only
            missing chunks run; the chunking stored in ``out`` is kept).
        memory: budget per device for one chunk, e.g. ``"2GB"``.
        dry_run: print the plan (to stdout, also with ``quiet``) and stop.
        quiet: no plan or progress output while running.

    Raises:
        FileExistsError: ``out`` exists and ``resume`` is False.
        ValueError: ``resume`` into a store of a different spec (naming the keys).

    Example:
        >>> run_sweep("sweeps/smoke.toml", "/tmp/smoke.zarr", quiet=True)   # doctest: +SKIP
        >>> ds = load("/tmp/smoke.zarr")                                     # doctest: +SKIP
    """
    from . import store

    if isinstance(spec, Spec):
        sp = spec
    elif isinstance(spec, Path) or (isinstance(spec, str) and "\n" not in spec and (spec.endswith(".toml") or Path(spec).is_file())):
        sp = load_spec(spec)
    elif isinstance(spec, str):
        sp = parse_spec(spec)
    else:
        raise TypeError(f"spec must be a Spec, a path to a TOML file or TOML text, got {type(spec).__name__}")
    out = Path(out)
    memory_b = parse_memory(memory)

    import jax

    multi = jax.process_count() > 1
    writer = jax.process_index() == 0
    blocks = None
    if writer and out.exists():
        if not resume:
            raise FileExistsError(f"store {out} already exists; use --resume or another path")
        blocks = store.check_resumable(out, sp)
    plan = make_plan(sp, memory_b, blocks=blocks)
    if multi:  # pragma: no cover - several hosts: every process follows process 0's plan
        from jax.experimental import multihost_utils

        arr = np.asarray([g.block for g in plan.groups], np.int64)
        plan = make_plan(sp, memory_b, blocks=np.asarray(multihost_utils.broadcast_one_to_all(arr)).tolist())
    if dry_run:
        if writer:
            print(plan.describe())
        return plan
    if not quiet and writer:
        print(plan.describe(), file=sys.stderr)

    if writer:
        store.create(out, plan)
    done = store.done_chunks(out) if writer else set()
    if multi:  # pragma: no cover
        flags = np.asarray([c[0] in done for c in plan.chunks], np.int32)
        flags = np.asarray(multihost_utils.broadcast_one_to_all(flags))
        done = {c[0] for c, f in zip(plan.chunks, flags) if f}
    todo = [c for c in plan.chunks if c[0] not in done]
    if sp.dtype == "float64":
        with jax.enable_x64(True):  # scoped: x64 is not switched on for the caller
            _execute(plan, out, todo, writer, quiet)
    else:
        _execute(plan, out, todo, writer, quiet)
    return plan


def _execute(plan: Plan, out: Path, todo: list, writer: bool, quiet: bool) -> None:
    from . import store

    sp = plan.spec
    runner = _Runner(plan)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(plan.chunks), initial=len(plan.chunks) - len(todo), unit="chunk",
               disable=quiet, desc=sp.name, file=sys.stderr)
    points, t_start = 0, time.perf_counter()
    layout = _output_layout(sp)
    for cid, gi, sl in todo:
        g = plan.groups[gi]
        size = plan.padded_size(g)
        params, seeds = _chunk_inputs(sp, g, sl, size)
        count = int(np.prod([s.stop - s.start for s in sl]))
        res = runner(gi, params, seeds)
        if writer:
            store.write_chunk(out, plan, cid, gi, sl, {k: v[:count] for k, v in res.items()}, layout)
        points += count
        rate = points / max(time.perf_counter() - t_start, 1e-9)
        bar.set_postfix_str(f"{rate:.3g} points/s", refresh=False)
        bar.update(1)
    bar.close()


def load(store_path):
    """Open a sweep store as an ``xarray.Dataset`` (lazy; ``status``: 0 pending, 1 ok, 2 failed)."""
    from . import store

    return store.load(store_path)


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------


def main(argv=None) -> int:
    """``meanfield sweep SPEC.toml --out STORE.zarr [--resume] [--memory SIZE] [--dry-run] [--quiet]``."""
    parser = argparse.ArgumentParser(
        prog="meanfield sweep",
        description="Run a declarative parameter sweep (TOML spec) into a resumable zarr store.",
    )
    parser.add_argument("spec", help="sweep specification (TOML)")
    parser.add_argument("--out", required=True, help="output zarr store (a directory, e.g. results.zarr)")
    parser.add_argument("--resume", action="store_true", help="complete the missing chunks of an existing store")
    parser.add_argument("--memory", default="2GB", help="memory budget per device for one chunk (default 2GB)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (grid, chunks, compilations, memory) and exit")
    parser.add_argument("--quiet", action="store_true", help="no plan or progress bar")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    run_sweep(spec, args.out, resume=args.resume, memory=args.memory, dry_run=args.dry_run, quiet=args.quiet)
    return 0


def plot_main(argv=None) -> int:
    """``meanfield plot STORE.zarr [--out DIR]``: curves against time (error bands over seeds), heatmaps."""
    from . import store

    parser = argparse.ArgumentParser(prog="meanfield plot", description="Standard figures of a sweep store.")
    parser.add_argument("store", help="zarr store written by `meanfield sweep`")
    parser.add_argument("--out", default=None, help="directory for the PNGs (default: STORE_plots next to the store)")
    args = parser.parse_args(argv)
    paths = store.plot(args.store, args.out)
    for p in paths:
        print(p)
    return 0


def _cli(entry, argv) -> int:
    try:
        return entry(argv)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, tomllib.TOMLDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv and argv[0] == "plot":
        sys.exit(_cli(plot_main, argv[1:]))
    if argv and argv[0] == "sweep":
        argv = argv[1:]
    sys.exit(_cli(main, argv))
