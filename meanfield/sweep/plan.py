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
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np

from .. import _resources, kernels
from .._resources import Cost, ResourceLimitError, check_cost, format_bytes
from ..models import Model
from .spec import GroupEstimate, Spec, _is_num

__all__ = [
    "Plan",
    "Group",
    "make_plan",
    "with_blocks",
    "parse_memory",
    "point_memory",
    "grid_model",
    "grid_dims",
    "output_layout",
    "store_layout",
    "ResourceLimitError",
    "MAX_CHUNKS",
    "MAX_STEPS",
]

#: Chunks past which a plan is refused without ``force`` (each chunk is a completion mark
#: and a lock file in the store, and one dispatch).
MAX_CHUNKS = 10**6

#: Steps per point past which a plan is refused even with ``force``: the step count is an
#: int32 (``num_steps``, the solver's ``max_steps``).
MAX_STEPS = 2**31 - 1

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_memory(size: object) -> int:
    """Bytes of a size like ``"2GB"`` ($10^9$), ``"512MiB"`` ($2^{20}$), ``"1.5gb"`` or an int.

    Example:
        >>> parse_memory("2GB"), parse_memory("1KiB")
        (2000000000, 1024)
    """
    if _is_num(size):
        value = float(cast(float, size))
    else:
        m = re.fullmatch(
            r"\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(size)
        )
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(
                f"memory must be a size like 2GB, 512MB, 1GiB or a number of bytes, got {size!r}"
            )
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"memory must be > 0 and finite, got {size!r}")
    return int(value)


def _fmt_bytes(b: int | float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{int(b)} B"


# grid_model's results for the last few specs (a plan asks for the model of each group several
# times: the dt warning, the step bound, the memory and cost estimates; a 1000-group plan built
# 8000 models). Keyed by the spec object's identity, which the entry keeps alive; a Spec is frozen.
_GRID_MODELS: dict[int, tuple[Spec, dict[tuple[str, int, int], Model]]] = {}
_GRID_MODEL_SPECS = 4


def grid_model(spec: Spec, kind: str, n: int, d: int) -> Model:
    """The model of ``kind`` with the spec's parameters and the betas of shape ``(n, d)`` as an array
    (``ModelEntry.over_grid``): its ``interaction_rate()``, ``reference_step()`` and
    ``footprint()`` over the grid (the dt warning, the step bound, the cost estimate). Built once
    per spec and group (remembered for the last few specs)."""
    held = _GRID_MODELS.get(id(spec))
    if held is None or held[0] is not spec:
        while len(_GRID_MODELS) >= _GRID_MODEL_SPECS:
            del _GRID_MODELS[next(iter(_GRID_MODELS))]
        held = _GRID_MODELS[id(spec)] = (spec, {})
    models = held[1]
    key = (kind, int(n), int(d))
    if key not in models:
        models[key] = _grid_model(spec, kind, n, d)
    return models[key]


def _grid_model(spec: Spec, kind: str, n: int, d: int) -> Model:
    entry = kernels.MODELS[kind]
    names = {p.name for p in entry.params} - spec.inert_for(kind)
    fixed = {
        k: v for k, v in spec.params.items() if k in names and k not in spec.axes and k != "beta"
    }
    if "beta" not in names:
        return entry.over_grid(fixed, d)
    return entry.over_grid(fixed, d, beta=np.asarray(spec.beta_values(n, d), dtype=np.float64))


def point_memory(spec: Spec, kind: str, n: int, d: int) -> int:
    r"""Estimated peak bytes of one grid point of model ``kind`` and shape ``(n, d)`` inside a
    vmapped chunk: the sweep kind's ``point_memory``. Particles: the ``point_bytes`` of the one
    cost estimate (``meanfield._resources.run_cost``, shared with ``meanfield simulate`` and the
    plan's limits) with the model's ``footprint`` (its working set and dense-or-tiled rule), the
    states of the solver's stages and the saved observables; tested against XLA's own peak
    (``compiled.memory_analysis()``). Attention: the ``(n, d)`` keys with their Gaussian draws and
    a few ``(n,)`` vectors. Continuum (``n`` holds the band-limit ``L``): ``_continuum.point_memory``.
    """
    return spec.sweep_kind.point_memory(spec, kind, n, d)


@dataclasses.dataclass(frozen=True)
class Group:
    """All points of one model kind, one value of each static axis (``setting``, one of
    ``Spec.settings``) and static shape ``(n, d)``: one compilation. ``estimate``: the sweep
    kind's answers for the group (``SweepKind.estimate``), asked once by ``make_plan``."""

    kind: str
    n: int
    d: int
    block: tuple  # points per chunk along each traced axis (then seed)
    point_bytes: int
    setting: tuple = ()  # ((name, value), ...) of the static axes
    estimate: GroupEstimate | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        """``usa`` or ``usa mask=causal``: the model and the group's values of the static axes."""
        return self.kind + "".join(f" {k}={v}" for k, v in self.setting)

    def num_chunks(self, shape: Sequence[int]) -> int:
        """Chunks of this group over the batch ``shape`` (without listing them)."""
        return math.prod(-(-s // b) for s, b in zip(shape, self.block))

    def chunk_slices(self, shape: Sequence[int]) -> list[tuple[slice, ...]]:
        ranges = [range(0, s, b) for s, b in zip(shape, self.block)]
        out = []
        for starts in np.ndindex(*[len(r) for r in ranges]):
            out.append(
                tuple(
                    slice(r[i], min(r[i] + b, s))
                    for r, i, b, s in zip(ranges, starts, self.block, shape)
                )
            )
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
    def num_chunks(self) -> int:
        """Number of chunks (computed, not listed: safe for any grid)."""
        return sum(g.num_chunks(self.batch_shape) for g in self.groups)

    @property
    def chunks(self) -> list[tuple[int, int, tuple]]:
        """``(chunk id, group index, slices over batch_shape)`` for every chunk, in order.

        Lists every chunk: call ``check`` first (it refuses more than ``MAX_CHUNKS``)."""
        out, cid = [], 0
        for gi, g in enumerate(self.groups):
            for sl in g.chunk_slices(self.batch_shape):
                out.append((cid, gi, sl))
                cid += 1
        return out

    def padded_size(self, g: Group) -> int:
        p = int(np.prod(g.block))
        return -(-p // self.devices) * self.devices

    def group_spec(self, g: Group) -> Spec:
        """The spec of group ``g``'s values of the static axes (``Spec.at``): what its point
        program, memory and cost are made from."""
        return self.spec.at(g.setting)

    def group_index(self, gi: int) -> tuple[int, ...]:
        """Indices of group ``gi`` along the static grid dimensions (``model``, the static axes,
        ``n``, ``d``)."""
        spec, g = self.spec, self.groups[gi]
        idx = [spec.kinds.index(g.kind)] if spec.kinds_axis else []
        idx += [spec.statics[k].index(v) for k, v in g.setting]
        idx.append(spec.n.index(g.n))
        if spec.d_axis:
            idx.append(spec.d.index(g.d))
        return tuple(idx)

    # ------------------------------------------------------------------ estimates

    @property
    def points_per_group(self) -> int:
        return math.prod(self.batch_shape)

    def cost(self, g: Group, batch: int) -> Cost:
        r"""Estimated cost of ``batch`` points of group ``g`` run together: the sweep kind's
        ``cost`` (particles: ``meanfield._resources.run_cost``, the estimate of ``meanfield
        simulate``, steps $\lfloor t_1 / \mathrm{dt} \rfloor + \text{saves} + 1$ with ``dt`` the
        smallest step of the reference rule, $4 d + 8$ flop a pair and a field evaluation;
        attention: ``point_memory`` per point and $n (2 d + 10)$ flop per point, one context, no
        steps; continuum: ``_continuum.cost``).
        """
        if g.estimate is not None:  # the kind's answer, from make_plan
            return g.estimate.cost(batch)
        return self.spec.sweep_kind.cost(self.group_spec(g), g.kind, g.n, g.d, batch, g.point_bytes)

    def store_bytes(self) -> int:
        """Bytes of the store's data (uncompressed): every point's saved values."""
        spec = self.spec
        return spec.grid_size * spec.sweep_kind.point_store_bytes(spec)

    def check(
        self,
        *,
        force: bool = False,
        out: str | Path | None = None,
        device_memory: tuple[int, int] | None = None,
    ) -> None:
        """Refuse, before anything is allocated, a sweep past this machine's limits
        (``ResourceLimitError``, a ``ValueError``, one line with the estimate).

        * steps per point past ``MAX_STEPS`` (int32 step counts): refused even with ``force``;
        * one chunk (per device) needing more memory than the device has in total: refused
          even with ``force``; more than is available now: refused unless ``force``
          (``meanfield._resources.check_cost``);
        * the whole sweep's arithmetic past ``_resources.WORK_LIMIT``, more than ``MAX_CHUNKS``
          chunks, or a store larger than the free space of ``out``'s file system: refused
          unless ``force``.

        ``device_memory``: ``(available, total)`` bytes of one device (default: this
        machine's memory, ``machine_memory``; accelerators pass their own).
        """
        avail, total = device_memory if device_memory is not None else (None, None)
        spec = self.spec
        hint = " (pass --force to run anyway)"
        work = 0.0
        for g in self.groups:
            per_device = -(-self.padded_size(g) // self.devices)
            chunk = self.cost(g, per_device)
            where = f"{g.label} {spec.static_name}={g.n} d={g.d}"
            if chunk.steps > MAX_STEPS:
                raise ResourceLimitError(
                    f"sweep {spec.name!r} needs {float(chunk.steps):.3g} steps per point ({where}: t1 / dt), more "
                    f"than {MAX_STEPS} (int32 step counts); lengthen time.dt or shorten time.t1"
                )
            check_cost(
                chunk,
                force=force,
                what=f"sweep {spec.name!r}: one chunk of {where} ({per_device} point(s) per device)",
                memory=avail,
                total=total,
                max_work=math.inf,
            )  # memory here; the work of all below
            work += self.cost(g, self.points_per_group).work
        if not force and not work <= _resources.WORK_LIMIT:
            raise ResourceLimitError(
                f"sweep {spec.name!r} needs ~{work:.2g} flop for {spec.grid_size:.3g} points "
                f"({self._cost_line()}), more than the limit {_resources.WORK_LIMIT:.2g} (hours on a CPU){hint}"
            )
        chunks = self.num_chunks
        if not force and chunks > MAX_CHUNKS:
            raise ResourceLimitError(
                f"sweep {spec.name!r} cuts into {chunks:.3g} chunks, more than {MAX_CHUNKS} (a file each in the "
                f"store); raise --memory{hint}"
            )
        if out is not None and not force:
            size = self.store_bytes()
            free = _free_space(Path(out))
            if free is not None and size > free:
                raise ResourceLimitError(
                    f"sweep {spec.name!r} writes ~{format_bytes(size)} (uncompressed) into {out}, more than the "
                    f"{format_bytes(free)} free there{hint}"
                )

    def _cost_line(self) -> str:
        """Steps and saves per point, the largest point (``run_cost``), the work in all."""
        costs = [self.cost(g, 1) for g in self.groups]
        worst = max(costs, key=lambda c: c.bytes)
        steps = max(c.steps for c in costs)
        return (
            f"{_count(steps)} steps and {_count(worst.saves)} saves per point, "
            f"up to {format_bytes(worst.bytes)} per point"
        )

    def describe(self) -> str:
        spec = self.spec
        nchunks = self.num_chunks
        sn = spec.static_name
        axes = (
            ([f"model={len(spec.kinds)}"] if spec.kinds_axis else [])
            + [f"{k}={len(v)}" for k, v in spec.statics.items()]
            + [f"{sn}={len(spec.n)}"]
            + ([f"d={len(spec.d)}"] if spec.d_axis else [])
        )
        axes += [f"{k}={len(v)}" for k, v in spec.axes.items()] + (
            [f"seed={len(spec.seeds)}"] if spec.seeded else []
        )
        if spec.sweep_kind.timed:
            axes.append(f"time={len(cast(np.ndarray, spec.ts))}")
        lines = [
            f"sweep {spec.name!r}: model {', '.join(spec.kinds)}, {spec.grid_size} points ({' x '.join(axes)})",
            f"devices: {self.devices}; memory budget {_fmt_bytes(self.memory)} per device",
            f"compilations: {len(self.groups)} (one per model"
            + "".join(f", {k}" for k in spec.statics)
            + f" and static shape ({sn}, d)); chunks: {nchunks}",
        ]
        lines += spec.sweep_kind.describe_notes(spec)
        shown = self.groups if len(self.groups) <= 20 else self.groups[:20]
        for g in shown:
            pts = int(np.prod(g.block))
            pad = self.padded_size(g)
            lines.append(
                f"  {g.label} {sn}={g.n} d={g.d}: {self.points_per_group} points in {g.num_chunks(self.batch_shape)} chunk(s) of "
                f"{pts} (padded to {pad}), ~{_fmt_bytes(g.point_bytes)} per point, "
                f"~{_fmt_bytes(g.point_bytes * pad / self.devices)} per chunk per device"
            )
        if len(shown) < len(self.groups):
            lines.append(f"  ... and {len(self.groups) - len(shown)} more groups")
        work = sum(self.cost(g, self.points_per_group).work for g in self.groups)
        lines.append(
            f"estimate: {self._cost_line()}; ~{work:.2g} flop in all; store ~{format_bytes(self.store_bytes())} "
            "uncompressed"
        )
        worst = max(g.point_bytes for g in self.groups)
        if worst > self.memory:
            lines.append(
                f"warning: one point needs ~{_fmt_bytes(worst)}, more than the budget "
                f"{_fmt_bytes(self.memory)}: chunks hold one point per device"
            )
        for setting in spec.settings:  # per value of the static axes: its spec's warnings
            lines += spec.sweep_kind.describe_warnings(
                spec.at(setting),
                [(g.kind, g.n, g.d) for g in self.groups if g.setting == setting],
            )
        return "\n".join(lines)


def _count(k: int) -> str:
    return str(k) if k < 10**6 else f"{float(k):.3g}"


def _free_space(path: Path) -> int | None:
    """Free bytes of the file system that would hold ``path`` (its nearest existing ancestor)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        if not p.is_dir():
            return None  # a file in the way: the creation reports it
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _block_for(capacity: int, shape: tuple[int, ...]) -> tuple[int, ...]:
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


def make_plan(
    spec: Spec,
    memory: object = "2GB",
    *,
    devices: int | None = None,
    blocks: list | None = None,
) -> Plan:
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
    # the kind answers the plan's questions about each group once (its memory and cost)
    shapes = [
        (k, s, n, d) for k in spec.kinds for s in spec.settings for n in spec.n for d in spec.d
    ]
    kind = spec.sweep_kind
    estimates = [kind.estimate(spec.at(s), k, n, d) for k, s, n, d in shapes]
    pbytes = [e.point_bytes for e in estimates]
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
    groups = tuple(
        Group(k, n, d, blk, e.point_bytes, s, e)
        for (k, s, n, d), blk, e in zip(shapes, blocks, estimates)
    )
    return Plan(spec, groups, batch_shape, tuple(zarr_block), ndev, memory_b)


def with_blocks(plan: Plan, blocks: list) -> Plan:
    """``plan`` with the chunking ``blocks`` (a store's, one block per group): the same groups and
    estimates (``make_plan`` with ``blocks``, without asking the kind again)."""
    if len(blocks) != len(plan.groups):
        raise ValueError(f"blocks: one per group ({len(plan.groups)}), got {len(blocks)}")
    groups = tuple(dataclasses.replace(g, block=tuple(b)) for g, b in zip(plan.groups, blocks))
    zarr_block = min((tuple(b) for b in blocks), key=lambda b: int(np.prod(b)))
    return dataclasses.replace(plan, groups=groups, zarr_block=zarr_block)


# ----------------------------------------------------------------------------
# the layout of the store (plain data: the store imports nothing from here)
# ----------------------------------------------------------------------------


def grid_dims(spec: Spec) -> list[str]:
    """The grid dimensions of the store: ``model`` (a list of kinds), the static axes (``mask``,
    ``normalization``, ``heads``, ... given as lists), ``n`` (``resolution`` for
    ``continuum``), ``d`` (a list), the traced axes, ``seed`` (not for ``continuum``)."""
    dims = ["model"] if spec.kinds_axis else []
    dims += list(spec.statics)
    dims.append(spec.static_name)
    if spec.d_axis:
        dims.append("d")
    return dims + list(spec.axes) + (["seed"] if spec.seeded else [])


def output_layout(spec: Spec) -> dict[str, tuple[str, ...]]:
    """Data variable -> its dimensions after the grid dimensions (``time``, ``rank`` or none)."""
    return spec.sweep_kind.output_layout(spec)


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
    for k, v in spec.statics.items():  # strings, integers or booleans
        coords[k] = list(v)
    coords[spec.static_name] = np.asarray(spec.n, np.int64)
    if spec.d_axis:
        coords["d"] = np.asarray(spec.d, np.int64)
    for k, v in spec.axes.items():
        coords[k] = np.asarray(v)
    if spec.seeded:
        coords["seed"] = spec.seeds.astype(np.int64)
    layout = output_layout(spec)
    if spec.sweep_kind.timed:  # the save times
        coords["time"] = np.asarray(spec.ts)
    if any(t == ("rank",) for t in layout.values()):
        coords["rank"] = np.arange(1, spec.top_k + 1)
    if spec.beta_rule is not None:
        bdims = ["n"] + (["d"] if spec.d_axis else []) + ["beta_factor"]
        vals = np.stack(
            [np.stack([cast(np.ndarray, spec.beta_values(n, d)) for d in spec.d]) for n in spec.n]
        )
        if not spec.d_axis:
            vals = vals[:, 0]
        coords["beta"] = (bdims, vals)
    int_vars = {"num_steps": "int32", "solver_status": "int8"}
    descriptions = spec.sweep_kind.descriptions
    variables = {
        name: {
            "dims": list(trailing),
            "dtype": int_vars.get(name, spec.dtype),
            "description": descriptions.get(name, name),
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
        if k not in spec.axes and k not in spec.statics:
            attrs[spec.sweep_kind.attr_name(k)] = v if not isinstance(v, bool) else int(v)
    zblock = (
        list(plan.zarr_block) if spec.seeded else list(plan.zarr_block)[:-1]
    )  # no seed dimension
    return {
        "dims": dims,
        "coords": coords,
        "variables": variables,
        "chunks": [1] * (len(dims) - len(zblock)) + zblock,
        "attrs": attrs,
        "blocks": [list(g.block) for g in plan.groups],
        "chunks_total": plan.num_chunks,
    }
