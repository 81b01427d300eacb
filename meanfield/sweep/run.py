"""Running a sweep: the per-point programs, compiled once per group, sharded over the
devices, executed chunk by chunk into the store (``run_sweep``).

Point ``(n, d, params, seed)`` starts from ``x0 = mf.sphere.uniform(jax.random.key(seed), n, d)``
whatever the chunking or device count, so results depend on either only through the
rounding of XLA's batched programs (measured bound in docs/sweeps.md, "Chunking and
rounding"; a fixed chunking, as kept by ``--resume``, is bit-reproducible), and its
model is ``mf.kernels.build(kind, params, d=d, dtype=dtype)``: the registry's constructor,
the same as ``mf.kernels.make`` and ``meanfield simulate``, with the swept parameters as
traced values. Each chunk is laid out over ``jax.devices()`` with a ``Mesh`` over the
batch axis (``NamedSharding``); under ``jax.distributed`` the mesh spans every process's
devices and process 0 writes. A job array splits the chunks between independent processes
(``run_sweep(..., part=(i, N))``, ``assign_parts``, ``sweep_status``).
"""

from __future__ import annotations

import math
import platform
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import store
from .plan import MAX_CHUNKS, Group, Plan, make_plan, parse_memory, store_layout, with_blocks
from .spec import PointProgram, Spec, backend_key, load_spec, parse_spec

__all__ = [
    "run_sweep",
    "sweep_status",
    "point_program",
    "chunk_inputs",
    "Runner",
    "assign_parts",
    "parse_part",
    "PointProgramError",
]


def point_program(
    spec: Spec, kind: str, n: int, d: int, backend: str | None = None
) -> PointProgram:
    """``f(params: dict of scalars, seed) -> dict of outputs`` for one point of model ``kind``
    and static shape ``(n, d)``: the sweep kind's ``point_program``. ``params`` holds the traced
    axes of the point (``beta`` and the swept model parameters), ``status`` is ``store.OK`` or
    ``store.FAILED``. Particles: the model is ``mf.kernels.build(kind, params, d=d)``; kind
    ``continuum``: ``_continuum.point_program`` (``n`` is the band-limit; the seed is unused).
    ``backend``: the evaluation path decided for the store (``"native"`` or ``"xla"``, a kind
    with a ``backend`` option only); ``None``: the spec's ``model.backend``."""
    if backend is None:
        return spec.sweep_kind.point_program(spec, kind, n, d)
    return spec.sweep_kind.point_program(spec, kind, n, d, backend=backend)  # type: ignore[call-arg]


def chunk_inputs(spec: Spec, g: Group, sl: tuple, size: int) -> tuple[dict, np.ndarray]:
    """Flat per-point inputs of one chunk (row-major over the block), padded to ``size``:
    the traced axes by name (``beta`` evaluated from its rule) and the seeds."""
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
    # integer parameters (weight_seed) are int32 in the program, the others the float dtype
    cast_to = lambda v: v.astype(np.int32 if v.dtype.kind in "iu" else dt)  # noqa: E731
    return {k: cast_to(v) for k, v in params.items()}, seeds.astype(np.int32)


_PROGRAMS: OrderedDict[tuple, Any] = OrderedDict()
_PROGRAMS_MAX = 32


def _batched_program(
    spec: Spec, g: Group, sharding: NamedSharding, backend: str | None = None
) -> Callable[..., Any]:
    """The jitted, sharded ``vmap`` of ``point_program`` for group ``g`` on ``backend`` (the
    store's decision), memoised by the spec's hash, the model, the shape, the backend and the
    devices: running the same sweep again in this process (a resume, a second store) reuses its
    compilation. At most ``_PROGRAMS_MAX`` are kept. ``spec``: the sweep's; the group's values of
    its static axes are taken here (``Spec.at``)."""
    spec = spec.at(g.setting)
    key = (
        spec.hash,
        g.kind,
        g.n,
        g.d,
        backend,
        tuple(int(d.id) for d in sharding.mesh.devices.flat),
    )
    fn = _PROGRAMS.get(key)
    if fn is None:
        # shard_map: every device runs the vmapped program on its own points, its own solver loop
        # included (a loop over a sharded batch would agree on its stopping test across all
        # devices at every step: a collective per step, across processes under jax.distributed)
        local = jax.shard_map(
            jax.vmap(point_program(spec, g.kind, g.n, g.d, backend)),
            mesh=sharding.mesh,
            in_specs=(sharding.spec, sharding.spec),
            out_specs=sharding.spec,
            check_vma=False,
        )
        fn = jax.jit(local, in_shardings=sharding, out_shardings=sharding)
        _PROGRAMS[key] = fn
        while len(_PROGRAMS) > _PROGRAMS_MAX:
            _PROGRAMS.popitem(last=False)
    return fn


class Runner:
    """Compiled, sharded batch function per group, built lazily: ``runner(gi, params, seeds)``
    runs one chunk of group ``gi`` (inputs from ``chunk_inputs``) and returns host arrays.
    ``backends``: the store's evaluation path of each group (``SweepKind.backends``, keyed
    ``spec.backend_key``); ``None``: the spec's ``model.backend``."""

    def __init__(self, plan: Plan, backends: dict[str, str] | None = None):
        self.plan = plan
        self.backends = backends
        devs = (
            jax.devices()[: plan.devices] if plan.devices <= len(jax.devices()) else jax.devices()
        )
        self.mesh = Mesh(np.asarray(devs), ("batch",))
        self.sharding = NamedSharding(self.mesh, PartitionSpec("batch"))
        self.fns: dict[int, Any] = {}
        self.compile_s: dict[int, float] = {}

    def __call__(self, gi: int, params: dict, seeds: np.ndarray) -> dict:
        g = self.plan.groups[gi]
        if gi not in self.fns:
            backend = None if self.backends is None else self.backends[_group_key(g)]
            self.fns[gi] = _batched_program(self.plan.spec, g, self.sharding, backend)
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


def _group_key(g: Group) -> str:
    """The key of group ``g`` in the store's record of its backends (``backend_key``)."""
    return backend_key(g.kind, g.n, g.d, g.setting)


def _decide_backends(plan: Plan) -> dict[str, str] | None:
    """The evaluation path of each group (``SweepKind.backends``), asked once per value of the
    static axes with that value's spec and keyed ``_group_key``; None: the kind has no
    ``backend`` option."""
    sp = plan.spec
    out: dict[str, str] = {}
    for setting in sp.settings:
        groups = [g for g in plan.groups if g.setting == setting]
        decided = sp.sweep_kind.backends(sp.at(setting), [(g.kind, g.n, g.d) for g in groups])
        if decided is None:
            return None
        out.update({_group_key(g): decided[backend_key(g.kind, g.n, g.d)] for g in groups})
    return out


def _versions() -> dict:
    """Software and devices of the run (attributes of the store)."""
    from .. import __version__

    devs = jax.devices()
    return {
        "meanfield_version": __version__,
        "jax_version": jax.__version__,
        "python_version": platform.python_version(),
        "devices": f"{len(devs)} x {devs[0].platform}:{getattr(devs[0], 'device_kind', '')}",
        "process_count": jax.process_count(),
    }


def _as_spec(spec: object) -> Spec:
    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, Path) or (
        isinstance(spec, str)
        and "\n" not in spec
        and (spec.endswith(".toml") or Path(spec).is_file())
    ):
        return load_spec(spec)
    if isinstance(spec, str):
        return parse_spec(spec)
    raise TypeError(
        f"spec must be a Spec, a path to a TOML file or TOML text, got {type(spec).__name__}"
    )


def parse_part(part: object) -> tuple[int, int]:
    """``(i, N)`` of a job-array part: ``"2/3"`` (ASCII digits) or a pair, 1-based (part ``i`` of
    ``N``, ``1 <= i <= N <= MAX_CHUNKS``); ``ValueError`` naming the value otherwise. A sweep
    refuses an ``N`` larger than its number of chunks (``run_sweep``).

    Example:
        >>> parse_part("2/3")
        (2, 3)
    """
    if isinstance(part, str):
        text = part.strip()
        bits = text.split("/")
        if len(bits) != 2 or not all(re.fullmatch(r"[0-9]+", b.strip()) for b in bits):
            raise ValueError(f"part must be I/N with integers 1 <= I <= N (e.g. 2/3), got {part!r}")
        i, n = int(bits[0]), int(bits[1])
    elif (
        isinstance(part, tuple | list)
        and len(part) == 2
        and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in part)
    ):
        i, n = int(part[0]), int(part[1])
    else:
        raise TypeError(f"part must be 'I/N' or a pair (I, N) of integers, got {part!r}")
    if not 1 <= i <= n:
        raise ValueError(
            f"part {i}/{n}: I must be between 1 and N (parts are numbered from 1), got I = {i}, N = {n}"
        )
    if n > MAX_CHUNKS:
        raise ValueError(
            f"part {i}/{n}: N must be <= {MAX_CHUNKS} (a sweep has at most that many chunks), got N = {n}"
        )
    return i, n


def assign_parts(plan: Plan, parts: int) -> list[int]:
    r"""The part (``1..parts``) of every chunk of ``plan.chunks``, for a job array of ``parts``.

    Contiguous runs of chunks balanced by estimated work: chunk $k$ of work $w_k$ (points times
    the group's flop per point, ``Plan.cost``) goes to part $\lfloor N (W_{k-1} + w_k / 2) / W
    \rfloor + 1$, with $W_k$ the cumulative work and $W$ the total. Chunks are ordered by group,
    so each part compiles few groups. Depends only on the spec and the chunking (stored in the
    store), never on the devices or the machine: every part computes the same assignment.

    Example:
        >>> from meanfield.sweep import parse_spec, make_plan
        >>> spec = parse_spec("[model]\nkind = 'usa'\n[grid]\nn = [8]\nbeta = [1.0]\nseeds = 4\n[time]\nt1 = 0.5\ndt = 0.1")
        >>> assign_parts(make_plan(spec, "1B", devices=1), 2)
        [1, 1, 2, 2]
    """
    if not (isinstance(parts, int | np.integer) and parts >= 1):
        raise ValueError(f"parts must be an integer >= 1, got {parts!r}")
    per_point = [max(plan.cost(g, 1).work, 1.0) for g in plan.groups]
    w = np.asarray(
        [per_point[gi] * math.prod(s.stop - s.start for s in sl) for _, gi, sl in plan.chunks],
        np.float64,
    )
    if not w.size:
        return []
    mid = np.cumsum(w) - w / 2
    return [
        int(p) for p in np.minimum(np.floor(parts * mid / w.sum()), parts - 1).astype(np.int64) + 1
    ]


def run_sweep(
    spec: object,
    out: str | Path,
    *,
    resume: bool = False,
    memory: object = "2GB",
    dry_run: bool = False,
    quiet: bool = False,
    force: bool = False,
    part: object = None,
) -> Plan:
    """Run a sweep into a zarr store; return the ``Plan`` (with ``dry_run``, only the plan).

    Before anything is allocated the plan's estimates (steps, saves, memory per point and
    per chunk, total work, store size) are checked against this machine (``Plan.check``):
    past its memory or the work bound the sweep is refused with the estimate
    (``ResourceLimitError``), unless ``force`` where running anyway can make sense.

    The store is created atomically (a second writer on the same new path gets
    ``FileExistsError``; with ``resume`` it joins the sweep instead). With ``resume``, damaged
    bookkeeping and metadata are restored first (``store.repair``: one line on stderr each),
    then every chunk marked done is verified (``store.verify``); a damaged one is reported (one
    line on stderr per chunk) and recomputed. Chunks are computed under per-chunk claims
    (``store.claim``): several processes resuming one store at once share its chunks, and
    each returns once every chunk is done.

    The evaluation path of each group (``model.backend``: the fused C kernel or XLA, which round
    differently) is decided once, when the store is created, and recorded in it
    (``store.recorded_backends``): ``"auto"`` takes the fused kernel wherever it is available
    and takes the dtype and ``d``, never a timing (``SweepKind.backends``), so the numbers do not
    depend on the crossover recorded in a kernel cache; every chunk, resumed ones included,
    runs the recorded path (a store that recorded the fused kernel is not resumed where it
    cannot run: one ``ValueError``). ``"native"`` that cannot run is refused before the store
    exists.

    With ``part = (i, N)`` (or ``"i/N"``, 1-based) only the chunks of part ``i`` of ``N``
    run (``assign_parts``): independent jobs (a job array) fill one shared store, each its
    share. A part creates the store or joins it (no ``resume`` needed: parts started at once
    race safely on the creation), verifies its own completed chunks, recomputes its damaged
    and missing ones, and never writes another part's chunks; the split ``N`` is recorded in
    the store (``store.record_parts``) and another ``N`` is refused.

    Under ``jax.distributed`` (``jax.process_count() > 1``) every process runs every chunk on
    its devices of one ``Mesh``; process 0 plans, checks, creates and writes the store, and
    sends the plan (its chunking) and the chunks to skip to the others. A process started
    with another spec (or grid) than process 0's, or another ``dry_run``, stops every process
    before the store is touched (``ValueError`` naming the processes and spec hashes). An
    error of process 0 before the first chunk (an existing store, another spec, a limit)
    stops every process with that message.

    Args:
        spec: a ``Spec``, a path to a TOML file, or TOML text.
        out: path of the zarr store (a directory, conventionally ``*.zarr``).
        resume: continue an interrupted sweep of the same spec in ``out`` (only
            missing or damaged chunks run; the chunking stored in ``out`` is kept).
        memory: budget per device for one chunk, e.g. ``"2GB"``.
        dry_run: print the plan (to stdout, also with ``quiet``), check it, and stop: nothing
            is allocated or written.
        quiet: no plan or progress output while running.
        force: run past the work bound, the available (not the total) memory, the chunk
            count bound and the free disk space.
        part: ``(i, N)`` or ``"i/N"``: run only part ``i`` of ``N`` (``parse_part``); not
            with several processes of ``jax.distributed``.

    Raises:
        FileExistsError: ``out`` exists (or was created meanwhile by another process) and
            ``resume`` is False.
        ValueError: ``resume`` into a store of a different spec (naming the keys), or of an
            earlier format (``store.StoreFormatError``); ``model.backend = "native"`` where the
            fused kernel cannot run, or a resume of a store that recorded it there; a bad ``part`` (``N`` larger than the
            number of chunks included), or a store split into another number of parts; an
            empty ``out``.
        ResourceLimitError: the estimates exceed this machine (a ``ValueError``).
        OSError: ``out`` cannot be written (a file in its path, permissions, read-only).

    Example:
        >>> run_sweep("sweeps/smoke.toml", "/tmp/smoke.zarr", quiet=True)   # doctest: +SKIP
        >>> run_sweep("sweeps/smoke.toml", "/tmp/smoke.zarr", part="2/3")   # doctest: +SKIP
        >>> ds = load("/tmp/smoke.zarr")                                     # doctest: +SKIP
    """
    if isinstance(out, str) and not out.strip():  # Path("") is the current directory
        raise ValueError(f"out must be the path of the store, got {out!r}")
    sp = _as_spec(spec)
    out = Path(out)
    memory_b = parse_memory(memory)
    share = parse_part(part) if part is not None else None
    if (
        jax.process_count() > 1
    ):  # pragma: no cover - exercised by tests/test_distributed.py (subprocesses)
        if share is not None:
            raise ValueError(
                "part: a job-array part runs as one process; under jax.distributed every process "
                "already shares every chunk (drop --part or the distributed flags)"
            )
        plan, todo, backends = _setup_distributed(
            sp, out, resume=resume, memory_b=memory_b, dry_run=dry_run, quiet=quiet, force=force
        )
        writer = jax.process_index() == 0
    else:
        plan, todo, backends = _setup(
            sp,
            out,
            resume=resume or share is not None,
            memory_b=memory_b,
            dry_run=dry_run,
            quiet=quiet,
            force=force,
            share=share,
        )
        writer = True
    if dry_run:
        return plan
    multi = jax.process_count() > 1
    if sp.dtype == "float64":
        with jax.enable_x64(True):  # scoped: x64 is not switched on for the caller
            _execute(plan, out, todo, writer, quiet, claims=not multi, backends=backends)
    else:
        _execute(plan, out, todo, writer, quiet, claims=not multi, backends=backends)
    return plan


def _setup(
    sp: Spec,
    out: Path,
    *,
    resume: bool,
    memory_b: int,
    dry_run: bool,
    quiet: bool,
    force: bool,
    share: tuple[int, int] | None = None,
) -> tuple[Plan, list, dict[str, str] | None]:
    """Plan, check, create or join the store, verify what is done: ``(plan, chunks to run,
    backends)``. With ``share = (i, N)`` only part ``i``'s chunks are verified and returned.
    ``backends``: the evaluation path of each group (``SweepKind.backends``), decided here for a
    new store (``model.backend = "native"`` that cannot run is refused before the store
    exists) and recorded in it; for an existing one, the recorded decision (``_stored_backends``)."""
    info = None
    if out.exists():
        if not resume:
            raise FileExistsError(f"store {out} already exists; use --resume or another path")
        info = store.check_resumable(out, sp.data)
        if info is not None and not dry_run:
            for d in store.repair(
                out
            ):  # bookkeeping and metadata: restored before anything reads them
                print(f"warning: repaired {d}", file=sys.stderr)
    plan = make_plan(sp, memory_b, blocks=info["blocks"] if info else None)  # the one plan
    if share is not None and share[1] > plan.num_chunks:
        raise ValueError(
            f"part {share[0]}/{share[1]}: N = {share[1]} is more than the {plan.num_chunks} chunk(s) of "
            f"this sweep; use N <= {plan.num_chunks}"
        )
    backends = (
        _stored_backends(out, plan)
        if info is not None
        else _decide_backends(plan)  # a "native" that cannot run: refused here
    )
    if dry_run:
        print(plan.describe())
        plan.check(force=force, device_memory=_device_memory())
        return plan, [], backends
    plan.check(force=force, out=out if info is None else None, device_memory=_device_memory())
    if info is None:
        layout = store_layout(plan)
        layout["attrs"].update(_versions())
        if backends is not None:
            layout["backends"] = backends
        try:
            store.create(out, layout)
        except FileExistsError:
            if not resume:
                raise FileExistsError(
                    f"store {out} was created by another process meanwhile; use --resume to join it or another path"
                ) from None
            info = store.check_resumable(out, sp.data)  # join the other writer: its chunking
            if info is not None:
                plan = with_blocks(plan, info["blocks"])
                backends = _stored_backends(out, plan)  # and its decision
    chunks = plan.chunks
    if share is not None:
        store.record_parts(out, share[1])
        owner = assign_parts(plan, share[1])
        chunks = [c for c, p in zip(chunks, owner) if p == share[0]]
    if not quiet:  # after the creation: a path that cannot be written is the one line
        what = (
            f" (part {share[0]}/{share[1]}: {len(chunks)} of {plan.num_chunks} chunks)"
            if share
            else ""
        )
        print(plan.describe() + what, file=sys.stderr)
    mine = {c[0] for c in chunks}
    done = store.done_chunks(out) & mine
    if info is not None and done:
        done -= _report_damage(out, store.verify(out, sorted(done) if share else None))
    return plan, [c for c in chunks if c[0] not in done], backends


def _stored_backends(out: Path, plan: Plan) -> dict[str, str] | None:
    """The evaluation paths recorded in the existing store ``out`` (``store.recorded_backends``),
    which its resumed chunks run whatever this machine's kernel cache says: ``ValueError`` (one
    line) when the record lacks a group, or names the fused kernel and it cannot run here. A
    store without the record (written by an earlier meanfield version) of a kind with a
    ``backend`` option: decided now (``SweepKind.backends``), with one line on stderr."""
    recorded = store.recorded_backends(out)
    keys = [_group_key(g) for g in plan.groups]
    if recorded is None:
        decided = _decide_backends(plan)
        if decided is not None:
            print(
                f"warning: store {out} does not record which evaluation path its chunks ran (made by "
                f"an earlier meanfield version): the chunks run now take {_paths_text(decided)}",
                file=sys.stderr,
            )
        return decided
    missing = [k for k in keys if k not in recorded]
    if missing:
        raise store.StoreError(
            f"store {out} records no evaluation path for {', '.join(missing)}; run the sweep into "
            "a new store"
        )
    native = [k for k in keys if recorded[k] == "native"]
    if native:
        from .. import _native

        lib = _native.exp_library()
        if not lib.available:
            raise ValueError(
                f"store {out} was computed with the fused C kernel (backend 'native' for "
                f"{', '.join(native)}, decided when it was created) and it is not available here "
                f"({lib.reason}); resume where it runs: its chunks must run the recorded path"
            )
    return {k: recorded[k] for k in keys}


def _paths_text(backends: dict[str, str]) -> str:
    """``native for usa n=24 d=3; xla for ...``: the record of the backends in words."""
    return "; ".join(f"{v} for {k}" for k, v in sorted(backends.items()))


def _setup_distributed(
    sp: Spec, out: Path, *, resume: bool, memory_b: int, dry_run: bool, quiet: bool, force: bool
) -> tuple[Plan, list, dict[str, str] | None]:  # pragma: no cover - several processes
    """``_setup`` on process 0; the others receive its outcome (an error message, or the
    chunking and which chunks are done) through ``broadcast_one_to_all``, so that every
    process runs the same chunks in the same order, or every process stops. First, before
    process 0 touches the store, every process checks that all run the same spec
    (``_distributed.agree``: ``DisagreementError`` on every process otherwise)."""
    from jax.experimental import multihost_utils

    from ._distributed import agree

    # every process runs process 0's spec, or every process stops here: another grid would
    # write its results under process 0's labels, another grid shape would break a collective
    agree(sp.hash, sp.grid_size, dry_run)
    writer = jax.process_index() == 0
    plan = todo = backends = None
    error: BaseException | None = None
    if writer:
        try:
            plan, todo, backends = _setup(
                sp, out, resume=resume, memory_b=memory_b, dry_run=dry_run, quiet=quiet, force=force
            )
        except Exception as e:  # noqa: BLE001 - sent to the other processes, then raised here
            error = e
    message = np.zeros(_MESSAGE, np.int32)
    if error is not None:
        sent = f"{type(error).__name__}: {error}".encode()[: _MESSAGE - 1]
        message[0] = 1 + len(sent)
        message[1 : 1 + len(sent)] = np.frombuffer(sent, np.uint8)
    message = np.asarray(multihost_utils.broadcast_one_to_all(message))
    if error is not None:
        raise error
    if message[0]:
        text = bytes(message[1 : int(message[0])].astype(np.uint8)).decode(errors="replace")
        raise _ProcessZeroError(f"process 0 stopped the sweep: {text}")
    # the plan of process 0, with its chunking: the others make theirs once, with its blocks
    groups = len(sp.kinds) * len(sp.settings) * len(sp.n) * len(sp.d)
    blocks = (
        np.asarray([g.block for g in plan.groups], np.int32)
        if plan is not None
        else np.zeros((groups, len(sp.axes) + 1), np.int32)
    )
    blocks = np.asarray(multihost_utils.broadcast_one_to_all(blocks))
    if not writer:
        plan = make_plan(sp, memory_b, blocks=blocks.tolist())
    plan = cast(Plan, plan)
    # process 0's evaluation paths (the store's record): 0 none, 1 xla, 2 native per group
    keys = [_group_key(g) for g in plan.groups]
    codes = np.asarray(
        [0 if backends is None else 1 + ("xla", "native").index(backends[k]) for k in keys],
        np.int32,
    )
    codes = np.asarray(multihost_utils.broadcast_one_to_all(codes))
    backends = (
        None
        if not keys or not codes[0]
        else {k: ("xla", "native")[int(c) - 1] for k, c in zip(keys, codes)}
    )
    if dry_run:
        return plan, [], backends
    pending = {c[0] for c in todo} if todo is not None else set()
    flags = np.asarray([c[0] in pending for c in plan.chunks], np.int32)
    flags = np.asarray(multihost_utils.broadcast_one_to_all(flags))
    return plan, [c for c, f in zip(plan.chunks, flags) if f], backends


def sweep_status(out: str | Path, spec: object = None) -> dict:
    """Progress of the store ``out`` per job-array part: what ``meanfield sweep --status`` prints.

    The chunks are those of the stored chunking; the split is the one recorded by the parts
    (``store.recorded_parts``; none recorded: one row for the whole store). Per part: chunks,
    ``done`` (marked and sound), ``running`` (claimed by a live writer now), ``pending``
    (neither), ``damaged`` (marked but failing ``store.verify``: ``--resume`` recomputes
    them) and ``failed_points`` (status ``FAILED``, the state went non-finite, in done chunks).

    Args:
        out: the store.
        spec: the spec it was made from (checked against the store, as ``--resume`` does), or
            None: the spec text stored in the store.

    Returns:
        ``{"store", "parts", "rows": [{"part": "i/N" or "all", "chunks", "done", "running",
        "pending", "damaged", "failed_points"}, ...], "total": {...}, "repairable": [...]}``;
        ``repairable`` lists damaged bookkeeping or metadata (``store.repair``, run by
        ``--resume``, restores it; its chunks are then checked).

    Raises:
        FileNotFoundError: no store at ``out``.
        ValueError: another spec, not a sweep store, or a store of an earlier format.
    """
    import json

    out = Path(out)
    if not (out / "zarr.json").exists():
        raise FileNotFoundError(f"sweep store not found: {out}")
    if spec is None:
        try:
            attrs = store.stored_attributes(out)
            sp = parse_spec(attrs["spec"])
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise store.StoreError(
                f"{out} is not a sweep store (no readable spec in its attributes: {e})"
            ) from None
        info = store.check_resumable(out, json.loads(attrs["spec_json"]))
    else:
        sp = _as_spec(spec)
        info = store.check_resumable(out, sp.data)
    if info is None:  # an empty directory
        raise FileNotFoundError(f"sweep store not found: {out}")
    plan = make_plan(sp, 1, devices=1, blocks=info["blocks"])
    parts = store.recorded_parts(out)
    if parts is not None and not 1 <= parts <= plan.num_chunks:
        raise store.StoreError(
            f"{out}: the recorded split into {parts} parts is impossible for "
            f"{plan.num_chunks} chunk(s) (_sweep/parts was edited); remove that file"
        )
    chunks = plan.chunks
    owner = assign_parts(plan, parts) if parts else [0] * len(chunks)
    done = store.done_chunks(out, plan.num_chunks)
    damages = store.verify(out)
    if any(
        d.chunk is None and not d.repairable for d in damages
    ):  # coordinates: the store is unusable
        raise store.StoreDamagedError(
            out, [d for d in damages if d.chunk is None and not d.repairable]
        )
    repairable = [str(d) for d in damages if d.chunk is None]
    damaged = {d.chunk for d in damages}
    metadata_damaged = any(
        d.path.name == "zarr.json" for d in damages
    )  # the data cannot be read until repaired
    failed = store.failed_points(out, done - damaged) if not metadata_damaged else {}
    keys = ("chunks", "done", "running", "pending", "damaged", "failed_points")
    rows = {p: dict.fromkeys(keys, 0) for p in (range(1, parts + 1) if parts else [0])}
    for (cid, _, _), p in zip(chunks, owner):
        row = rows[p]
        row["chunks"] += 1
        if cid in damaged:
            row["damaged"] += 1
        elif cid in done:
            row["done"] += 1
            row["failed_points"] += failed.get(cid, 0)
        elif store.is_claimed(out, cid):
            row["running"] += 1
        else:
            row["pending"] += 1
    total = {k: sum(r[k] for r in rows.values()) for k in keys}
    listed = [{"part": f"{p}/{parts}" if parts else "all", **r} for p, r in rows.items()]
    return {
        "store": str(out),
        "parts": parts,
        "rows": listed,
        "total": total,
        "repairable": repairable,
    }


class PointProgramError(ValueError):
    """The program of a chunk failed while it was traced, compiled or run: a model's own code (a
    plugin's field that raises, even ``SystemExit``) or the device (out of memory). A
    ``ValueError`` (one line from the CLI) naming the model, the shape, the chunk and the error;
    the chunk was not written (no mark: its claim is released), so the store keeps its
    completed chunks and stays sound (``--verify``); the cause is chained (``__cause__``)."""

    def __init__(self, out: Path, cid: int, group: Group, error: BaseException) -> None:
        text = " ".join(str(error).split()) or "(no message)"
        text = text if len(text) <= 300 else text[:297] + "..."
        super().__init__(
            f"model {group.label!r} failed at n = {group.n}, d = {group.d} (chunk {cid} of {out}, "
            f"not written): {type(error).__name__}: {text}"
        )


#: Bytes of process 0's error message sent to the other processes.
_MESSAGE = 1024


class _ProcessZeroError(ValueError):
    """Process 0 stopped a distributed sweep before its first chunk (its message; the CLI
    reports one line)."""


def _device_memory() -> tuple[int, int] | None:
    """``(available, total)`` bytes of one accelerator (``memory_stats``); None on CPU
    (the limits then use this machine's memory)."""
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return None
    stats = getattr(dev, "memory_stats", lambda: None)() or {}
    limit = stats.get("bytes_limit")
    if not limit:
        return None
    return int(limit) - int(stats.get("bytes_in_use", 0)), int(limit)


def _report_damage(out: Path, damages: list) -> set[int]:
    """One line on stderr per damaged chunk (the first ten, then a count); their ids."""
    by_chunk: dict[int, list] = {}
    for d in damages:
        if d.chunk is None:
            if d.repairable:  # restored by ``store.repair`` meanwhile (another writer's damage)
                continue
            raise store.StoreDamagedError(out, [d])  # coordinates or metadata: not recomputable
        by_chunk.setdefault(d.chunk, []).append(d)
    for i, (cid, ds) in enumerate(sorted(by_chunk.items())):
        if i == 10:
            print(
                f"warning: {len(by_chunk) - 10} more damaged chunks of {out}: recomputing them",
                file=sys.stderr,
            )
            break
        more = f" (and {len(ds) - 1} more file(s))" if len(ds) > 1 else ""
        print(
            f"warning: chunk {cid} of {out} is damaged ({ds[0].path}: {ds[0].reason}{more}): recomputing it",
            file=sys.stderr,
        )
    return set(by_chunk)


def _execute(
    plan: Plan,
    out: Path,
    todo: list,
    writer: bool,
    quiet: bool,
    *,
    claims: bool = True,
    backends: dict[str, str] | None = None,
) -> None:
    """Compute the chunks of ``todo`` on the store's ``backends``. With ``claims`` (one process),
    each chunk runs under its claim and is skipped when another writer holds it or has completed
    it soundly; the chunks held by others are waited for at the end, so every chunk is done on
    return."""
    from tqdm.auto import tqdm

    sp = plan.spec
    runner = Runner(plan, backends)
    bar = tqdm(
        total=len(todo), unit="chunk", disable=quiet or not writer, desc=sp.name, file=sys.stderr
    )
    points, t_start = 0, time.perf_counter()

    def compute(cid: int, gi: int, sl: tuple) -> None:
        nonlocal points
        g = plan.groups[gi]
        params, seeds = chunk_inputs(sp, g, sl, plan.padded_size(g))
        count = int(np.prod([s.stop - s.start for s in sl]))
        try:
            res = runner(gi, params, seeds)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a model's code (a plugin's) failed
            raise PointProgramError(out, cid, g, e) from e
        if writer:
            region = sl if sp.seeded else sl[:-1]  # continuum: no seed dimension in the store
            store.write_chunk(
                out, cid, plan.group_index(gi), region, {k: v[:count] for k, v in res.items()}
            )
        points += count
        rate = points / max(time.perf_counter() - t_start, 1e-9)
        bar.set_postfix_str(f"{rate:.3g} points/s", refresh=False)

    def claimed(chunk: tuple, wait: bool) -> bool:
        cid = chunk[0]
        with store.claim(out, cid, wait=wait) as got:
            if not got:
                return False
            if not (
                store.is_done(out, cid) and not store.verify(out, [cid])
            ):  # not done soundly by another
                store.discard(out, cid)
                compute(*chunk)
        return True

    deferred = []
    for chunk in todo:
        if not (
            writer and claims
        ):  # pragma: no cover - several hosts: every process runs every chunk
            compute(*chunk)
        elif not claimed(chunk, wait=False):
            deferred.append(chunk)
            continue
        bar.update(1)
    for chunk in deferred:  # held by another writer: wait for it, then check its result
        claimed(chunk, wait=True)
        bar.update(1)
    bar.close()
