"""Running a sweep: the per-point programs, compiled once per group, sharded over the
devices, executed chunk by chunk into the store (``run_sweep``).

Point ``(n, d, params, seed)`` starts from ``x0 = mf.sphere.uniform(jax.random.key(seed), n, d)``
whatever the chunking or device count, so results depend on either only through the
rounding of XLA's batched programs (measured bound in docs/sweeps.md, "Chunking and
rounding"; a fixed chunking, as kept by ``--resume``, is bit-reproducible), and its
model is ``mf.kernels.build(kind, params, d=d, dtype=dtype)``: the registry's constructor,
the same as ``mf.kernels.make`` and ``meanfield simulate``, with the swept parameters as
traced values. Each chunk is laid out over ``jax.devices()`` with a ``Mesh`` over the
batch axis (``NamedSharding``).
"""

from __future__ import annotations

import platform
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import attention, integrate, kernels, metrics, sphere
from ..phase_diagram import usa_step_size
from . import _continuum, store
from .plan import Group, Plan, make_plan, parse_memory, store_layout
from .spec import Spec, load_spec, parse_spec

__all__ = ["run_sweep", "point_program", "chunk_inputs", "Runner"]


def point_program(spec: Spec, kind: str, n: int, d: int):
    """``f(params: dict of scalars, seed) -> dict of outputs`` for one point of model ``kind``
    and static shape ``(n, d)``; ``params`` holds the traced axes of the point (``beta`` and
    the swept model parameters), ``status`` is ``store.OK`` or ``store.FAILED``. Kind
    ``continuum``: ``_continuum.point_program`` (``n`` is the band-limit; the seed is unused)."""
    if spec.continuum:
        return _continuum.point_program(spec, n, d)
    dtype = jnp.dtype(spec.dtype)

    if not kernels.MODELS[kind].simulated:
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
            out["status"] = jnp.where(ok, store.OK, store.FAILED).astype(jnp.int8)
            return out

        return attn

    T = cast(dict, spec.time)
    thr = spec.cluster_threshold
    extra = {}
    if "clusters" in spec.observables:
        extra["clusters"] = lambda x: metrics.num_clusters(x, thr).astype(dtype)
    if "token_similarity" in spec.observables:
        extra["token_similarity"] = metrics.token_similarity

    # the registry's parameters of this kind: fixed values from the spec, swept ones traced
    names = {p.name for p in kernels.MODELS[kind].params}
    fixed = {k: v for k, v in spec.params.items() if k in names and k not in spec.axes}

    ts = cast(np.ndarray, spec.ts)
    dt, max_steps = T["dt"], T.get("max_steps")
    reference = spec.step_rule == "reference"
    if reference:
        # beta-dependent step, traced: one compilation for the whole beta axis; the bound on
        # the step count comes from the smallest step of this shape's betas
        h_min = float(np.min(usa_step_size(cast(np.ndarray, spec.beta_values(n, d)), T["dt"])))
        max_steps = max_steps or int(np.ceil(T["t1"] / h_min)) + len(ts) + 2

    def sim(params, seed):
        x0 = sphere.uniform(jax.random.key(seed), n, d, dtype)
        traced = {k: v.astype(dtype) for k, v in params.items() if k in names}
        model = kernels.build(kind, {**fixed, **traced}, d=d, dtype=dtype)
        step = usa_step_size(params["beta"].astype(dtype), T["dt"]) if reference else dt
        traj = integrate.simulate(
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
        out["status"] = jnp.where(traj.failed | ~finite, store.FAILED, store.OK).astype(jnp.int8)
        return out

    return sim


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
    return {k: v.astype(dt) for k, v in params.items()}, seeds.astype(np.int32)


_PROGRAMS: OrderedDict[tuple, Any] = OrderedDict()
_PROGRAMS_MAX = 32


def _batched_program(spec: Spec, g: Group, sharding: NamedSharding):
    """The jitted, sharded ``vmap`` of ``point_program`` for group ``g``, memoised by the spec's
    hash, the model, the shape and the devices: running the same sweep again in this process
    (a resume, a second store) reuses its compilation. At most ``_PROGRAMS_MAX`` are kept."""
    key = (spec.hash, g.kind, g.n, g.d, tuple(int(d.id) for d in sharding.mesh.devices.flat))
    fn = _PROGRAMS.get(key)
    if fn is None:
        fn = jax.jit(jax.vmap(point_program(spec, g.kind, g.n, g.d)), in_shardings=sharding, out_shardings=sharding)
        _PROGRAMS[key] = fn
        while len(_PROGRAMS) > _PROGRAMS_MAX:
            _PROGRAMS.popitem(last=False)
    return fn


class Runner:
    """Compiled, sharded batch function per group, built lazily: ``runner(gi, params, seeds)``
    runs one chunk of group ``gi`` (inputs from ``chunk_inputs``) and returns host arrays."""

    def __init__(self, plan: Plan):
        self.plan = plan
        devs = jax.devices()[: plan.devices] if plan.devices <= len(jax.devices()) else jax.devices()
        self.mesh = Mesh(np.asarray(devs), ("batch",))
        self.sharding = NamedSharding(self.mesh, PartitionSpec("batch"))
        self.fns: dict[int, Any] = {}
        self.compile_s: dict[int, float] = {}

    def __call__(self, gi: int, params: dict, seeds: np.ndarray) -> dict:
        g = self.plan.groups[gi]
        if gi not in self.fns:
            self.fns[gi] = _batched_program(self.plan.spec, g, self.sharding)
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


def _as_spec(spec) -> Spec:
    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, Path) or (isinstance(spec, str) and "\n" not in spec and (spec.endswith(".toml") or Path(spec).is_file())):
        return load_spec(spec)
    if isinstance(spec, str):
        return parse_spec(spec)
    raise TypeError(f"spec must be a Spec, a path to a TOML file or TOML text, got {type(spec).__name__}")


def run_sweep(
    spec,
    out,
    *,
    resume: bool = False,
    memory="2GB",
    dry_run: bool = False,
    quiet: bool = False,
    force: bool = False,
) -> Plan:
    """Run a sweep into a zarr store; return the ``Plan`` (with ``dry_run``, only the plan).

    Before anything is allocated the plan's estimates (steps, saves, memory per point and
    per chunk, total work, store size) are checked against this machine (``Plan.check``):
    past its memory or the work bound the sweep is refused with the estimate
    (``ResourceLimitError``), unless ``force`` where running anyway can make sense.

    The store is created atomically (a second writer on the same new path gets
    ``FileExistsError``; with ``resume`` it joins the sweep instead). With ``resume``, every
    chunk marked done is verified first (``store.verify``); a damaged one is reported (one
    line on stderr per chunk) and recomputed. Chunks are computed under per-chunk claims
    (``store.claim``): several processes resuming one store at once share its chunks, and
    each returns once every chunk is done.

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

    Raises:
        FileExistsError: ``out`` exists (or was created meanwhile by another process) and
            ``resume`` is False.
        ValueError: ``resume`` into a store of a different spec (naming the keys), or of an
            earlier format (``store.StoreFormatError``).
        ResourceLimitError: the estimates exceed this machine (a ``ValueError``).
        OSError: ``out`` cannot be written (a file in its path, permissions, read-only).

    Example:
        >>> run_sweep("sweeps/smoke.toml", "/tmp/smoke.zarr", quiet=True)   # doctest: +SKIP
        >>> ds = load("/tmp/smoke.zarr")                                     # doctest: +SKIP
    """
    sp = _as_spec(spec)
    out = Path(out)
    memory_b = parse_memory(memory)

    multi = jax.process_count() > 1
    writer = jax.process_index() == 0
    info = None
    if writer and out.exists():
        if not resume:
            raise FileExistsError(f"store {out} already exists; use --resume or another path")
        info = store.check_resumable(out, sp.data)
    plan = make_plan(sp, memory_b, blocks=info["blocks"] if info else None)
    if multi:  # pragma: no cover - several hosts: every process follows process 0's plan
        from jax.experimental import multihost_utils

        arr = np.asarray([g.block for g in plan.groups], np.int64)
        plan = make_plan(sp, memory_b, blocks=np.asarray(multihost_utils.broadcast_one_to_all(arr)).tolist())
    if dry_run:
        if writer:
            print(plan.describe())
        plan.check(force=force, device_memory=_device_memory())
        return plan
    plan.check(force=force, out=out if info is None else None, device_memory=_device_memory())

    if writer and info is None:
        layout = store_layout(plan)
        layout["attrs"].update(_versions())
        try:
            store.create(out, layout)
        except FileExistsError:
            if not resume:
                raise FileExistsError(
                    f"store {out} was created by another process meanwhile; use --resume to join it or another path"
                ) from None
            info = store.check_resumable(out, sp.data)  # join the other writer: its chunking
            if info is not None:
                plan = make_plan(sp, memory_b, blocks=info["blocks"])
    if not quiet and writer:  # after the creation: a path that cannot be written is the one line
        print(plan.describe(), file=sys.stderr)
    done = store.done_chunks(out) if writer else set()
    if writer and info is not None and done:
        done -= _report_damage(out, store.verify(out))
    if multi:  # pragma: no cover
        flags = np.asarray([c[0] in done for c in plan.chunks], np.int32)
        flags = np.asarray(multihost_utils.broadcast_one_to_all(flags))
        done = {c[0] for c, f in zip(plan.chunks, flags) if f}
    todo = [c for c in plan.chunks if c[0] not in done]
    if sp.dtype == "float64":
        with jax.enable_x64(True):  # scoped: x64 is not switched on for the caller
            _execute(plan, out, todo, writer, quiet, claims=not multi)
    else:
        _execute(plan, out, todo, writer, quiet, claims=not multi)
    return plan


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
            raise store.StoreDamagedError(out, [d])  # coordinates or metadata: not recomputable
        by_chunk.setdefault(d.chunk, []).append(d)
    for i, (cid, ds) in enumerate(sorted(by_chunk.items())):
        if i == 10:
            print(f"warning: {len(by_chunk) - 10} more damaged chunks of {out}: recomputing them", file=sys.stderr)
            break
        more = f" (and {len(ds) - 1} more file(s))" if len(ds) > 1 else ""
        print(f"warning: chunk {cid} of {out} is damaged ({ds[0].path}: {ds[0].reason}{more}): recomputing it",
              file=sys.stderr)
    return set(by_chunk)


def _execute(plan: Plan, out: Path, todo: list, writer: bool, quiet: bool, *, claims: bool = True) -> None:
    """Compute the chunks of ``todo``. With ``claims`` (one process), each chunk runs under its
    claim and is skipped when another writer holds it or has completed it soundly; the chunks
    held by others are waited for at the end, so every chunk is done on return."""
    from tqdm.auto import tqdm

    sp = plan.spec
    runner = Runner(plan)
    bar = tqdm(total=plan.num_chunks, initial=plan.num_chunks - len(todo), unit="chunk",
               disable=quiet, desc=sp.name, file=sys.stderr)
    points, t_start = 0, time.perf_counter()

    def compute(cid: int, gi: int, sl: tuple) -> None:
        nonlocal points
        g = plan.groups[gi]
        params, seeds = chunk_inputs(sp, g, sl, plan.padded_size(g))
        count = int(np.prod([s.stop - s.start for s in sl]))
        res = runner(gi, params, seeds)
        if writer:
            region = sl if sp.seeded else sl[:-1]  # continuum: no seed dimension in the store
            store.write_chunk(out, cid, plan.group_index(gi), region, {k: v[:count] for k, v in res.items()})
        points += count
        rate = points / max(time.perf_counter() - t_start, 1e-9)
        bar.set_postfix_str(f"{rate:.3g} points/s", refresh=False)

    def claimed(chunk: tuple, wait: bool) -> bool:
        cid = chunk[0]
        with store.claim(out, cid, wait=wait) as got:
            if not got:
                return False
            if not (store.is_done(out, cid) and not store.verify(out, [cid])):  # not done soundly by another
                store.discard(out, cid)
                compute(*chunk)
        return True

    deferred = []
    for chunk in todo:
        if not (writer and claims):  # pragma: no cover - several hosts: every process runs every chunk
            compute(*chunk)
        elif not claimed(chunk, wait=False):
            deferred.append(chunk)
            continue
        bar.update(1)
    for chunk in deferred:  # held by another writer: wait for it, then check its result
        claimed(chunk, wait=True)
        bar.update(1)
    bar.close()
