"""How a sweep runs: groups (one compilation per model and static shape), chunks that fit a
memory budget, and the layout of its store (``Plan``, ``make_plan``, ``store_layout``).

The points of a grid with the same model and static shape ``(n, d)`` are one group:
``beta``, the other swept scalars and the seeds are ``vmap``-ed traced axes of one jitted
function (padding across ``n`` with masks was measured slower; docs/sweep_benchmarks.md).
A group's batch is cut into blocks that fit the memory budget (estimated from the
shapes), padded to one size per group; every block covers whole zarr chunks of the store.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import cast

import numpy as np

from .spec import Spec, _is_num

__all__ = [
    "Plan",
    "Group",
    "make_plan",
    "parse_memory",
    "point_memory",
    "grid_dims",
    "output_layout",
    "store_layout",
]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

#: Descriptions of the data variables of a store.
_DESCRIPTIONS = {
    "collapse_gap": "collapse gap G_x = 1 - 1/(n(n-1)) sum_{i!=j} <x_i, x_j>",
    "energy": "interaction energy E = 1/(2 n^2) sum h (times e^-beta when rescaled)",
    "clusters": "number of clusters (angular threshold cluster_threshold)",
    "token_similarity": "token similarity ||Pi X||^2 / ||X||^2",
    "top_weight": "largest attention weight A_(1)",
    "top_weights": "ordered attention weights A_(1..k)",
    "ratios": "A_(k) / A_(1)",
    "cumulative": "sum_{i<=k} A_(i)",
    "log_partition": "log Z_n = log sum_j exp(-beta T_j)",
    "stop_time": "time at which the run ended (t1 unless stopped early or failed)",
    "num_steps": "accepted solver steps",
}

# models whose field carries a (d, d) gauge matrix per particle
_GAUGED = ("rope", "phase-field", "gauge", "prompt")


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


def _fmt_bytes(b: int | float) -> str:
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
    if kind in _GAUGED:
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

    def group_index(self, gi: int) -> tuple[int, ...]:
        """Indices of group ``gi`` along the static grid dimensions (``model``, ``n``, ``d``)."""
        spec, g = self.spec, self.groups[gi]
        idx = [spec.kinds.index(g.kind)] if spec.kinds_axis else []
        idx.append(spec.n.index(g.n))
        if spec.d_axis:
            idx.append(spec.d.index(g.d))
        return tuple(idx)

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
        if spec.step_rule == "reference":
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
        if spec.step_rule == "reference":
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


def make_plan(spec: Spec, memory="2GB", *, devices: int | None = None, blocks: list | None = None) -> Plan:
    """Cut the grid into chunks: per ``(n, d)``, blocks over (traced axes, seed) that fit ``memory``
    per device; ``blocks`` (from a store being resumed) overrides the computed ones.

    ``devices`` defaults to ``len(jax.devices())``.
    """
    memory_b = parse_memory(memory)
    if devices is None:
        import jax

        devices = len(jax.devices())
    ndev = int(devices)
    batch_shape = tuple(len(v) for v in spec.axes.values()) + (len(spec.seeds),)
    shapes = [(k, n, d) for k in spec.kinds for n in spec.n for d in spec.d]
    pbytes = [point_memory(spec, k, n, d) for k, n, d in shapes]
    if blocks is None:
        raw = [_block_for(ndev * max(1, memory_b // pb), batch_shape) for pb in pbytes]
        if spec.step_rule == "reference":
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
# the layout of the store (plain data: the store imports nothing from here)
# ----------------------------------------------------------------------------


def grid_dims(spec: Spec) -> list[str]:
    """The grid dimensions of the store: ``model`` (a list of kinds), ``n``, ``d`` (a list),
    the traced axes, ``seed``."""
    dims = ["model"] if spec.kinds_axis else []
    dims.append("n")
    if spec.d_axis:
        dims.append("d")
    return dims + list(spec.axes) + ["seed"]


def output_layout(spec: Spec) -> dict[str, tuple[str, ...]]:
    """Data variable -> its dimensions after the grid dimensions (``time``, ``rank`` or none)."""
    out: dict[str, tuple[str, ...]]
    if spec.simulated:
        out = {o: ("time",) for o in spec.observables}
        out["stop_time"] = ()
        out["num_steps"] = ()
    else:
        out = {o: (() if o in ("top_weight", "log_partition") else ("rank",)) for o in spec.observables}
    return out


def store_layout(plan: Plan) -> dict:
    """Everything the store needs to be created, as plain data.

    ``dims`` (the grid dimensions), ``coords`` (name -> values, or ``(dims, values)``),
    ``variables`` (name -> ``{"dims": trailing dims, "dtype", "description"}``), ``chunks``
    (the zarr chunk over the grid dimensions), ``attrs`` (the spec's text, normalised JSON
    and hash, fixed model parameters), ``blocks`` (the plan's block per group) and
    ``chunks_total``.
    """
    spec = plan.spec
    dims = grid_dims(spec)
    coords: dict = {}
    if spec.kinds_axis:
        coords["model"] = list(spec.kinds)
    coords["n"] = np.asarray(spec.n, np.int64)
    if spec.d_axis:
        coords["d"] = np.asarray(spec.d, np.int64)
    for k, v in spec.axes.items():
        coords[k] = np.asarray(v)
    coords["seed"] = spec.seeds.astype(np.int64)
    layout = output_layout(spec)
    if spec.simulated:
        coords["time"] = np.asarray(spec.ts)
    if any(t == ("rank",) for t in layout.values()):
        coords["rank"] = np.arange(1, spec.top_k + 1)
    if spec.beta_rule is not None:
        bdims = ["n"] + (["d"] if spec.d_axis else []) + ["beta_factor"]
        vals = np.stack([np.stack([cast(np.ndarray, spec.beta_values(n, d)) for d in spec.d]) for n in spec.n])
        if not spec.d_axis:
            vals = vals[:, 0]
        coords["beta"] = (bdims, vals)
    variables = {
        name: {
            "dims": list(trailing),
            "dtype": "int32" if name == "num_steps" else spec.dtype,
            "description": _DESCRIPTIONS.get(name, name),
        }
        for name, trailing in layout.items()
    }
    attrs: dict = {
        "sweep_name": spec.name,
        "description": spec.data.get("description", ""),
        "model": ", ".join(spec.kinds),
        "spec": spec.text,
        "spec_hash": spec.hash,
        "spec_json": json.dumps(spec.data, sort_keys=True),
    }
    if not spec.d_axis:
        attrs["d"] = spec.d[0]
    for k, v in spec.params.items():
        if k not in spec.axes:
            attrs[f"model.{k}"] = v if not isinstance(v, bool) else int(v)
    return {
        "dims": dims,
        "coords": coords,
        "variables": variables,
        "chunks": [1] * (len(dims) - len(plan.zarr_block)) + list(plan.zarr_block),
        "attrs": attrs,
        "blocks": [list(g.block) for g in plan.groups],
        "chunks_total": len(plan.chunks),
    }
