"""Command line of the sweep engine: ``meanfield sweep``, ``meanfield plot`` and
``python -m meanfield.sweep`` (``console``).

Every user error -- a bad spec or argument, a missing file, an existing store, a store that
cannot be written (``OSError``: a file in the path, permissions, a read-only file system), a
damaged store, a sweep past the machine's limits -- is one line on stderr and exit status 2,
without a traceback or a usage dump.

``--help`` and the parser's errors return before JAX is imported (the engine is imported
when a command runs). The process itself (``main()``/``console()`` without arguments,
``meanfield sweep``, ``python -m meanfield.sweep``) calls
``meanfield.compilation_cache.configure_process()`` once its arguments are parsed, before
JAX is imported; a call with an argument list changes no process-wide setting.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Callable, Sequence
from typing import NoReturn

__all__ = ["main", "plot_main", "console"]


class _UsageError(Exception):
    """An argparse error, reported as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage dump): ``error`` raises ``_UsageError``."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status of ``--help`` (errors raise ``_UsageError``)."""
    known = {s for a in parser._actions for s in a.option_strings}
    try:
        return parser.parse_args(_attach_values(argv, known))
    except SystemExit as e:  # --help
        return int(e.code or 0)


_VALUE_FLAGS = (
    "--out",
    "--memory",
    "--verify",
    "--part",
    "--num-processes",
    "--process-id",
    "--heartbeat-timeout",
    "--join-timeout",
)


def _attach_values(argv: list[str], known: set[str]) -> list[str]:
    """``--memory -1GB`` as ``--memory=-1GB``: a value that starts with ``-`` but is no flag
    reaches its option (argparse would take it for an unknown flag)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if (
            tok in _VALUE_FLAGS
            and i + 1 < len(argv)
            and argv[i + 1].startswith("-")
            and argv[i + 1] not in known
        ):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def _one_line(e: BaseException) -> str:
    """An exception as one line: ``strerror: filename`` for an ``OSError`` from the system."""
    if isinstance(e, OSError) and e.strerror and e.filename:
        return f"{e.strerror}: {e.filename}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _guarded(prog: str, fn: Callable[[], int]) -> int:
    """Run ``fn``; user errors become one line on stderr and status 2."""
    try:
        return fn()
    except _UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError, tomllib.TOMLDecodeError) as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _sweep_parser() -> _Parser:
    parser = _Parser(
        prog="meanfield sweep",
        description="Run a declarative parameter sweep (TOML spec) into a resumable zarr store, "
        "or check a store (--verify).",
    )
    parser.add_argument("spec", nargs="?", help="sweep specification (TOML)")
    parser.add_argument("--out", help="output zarr store (a directory, e.g. results.zarr)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="complete the missing (and recompute the damaged) chunks of an existing store",
    )
    parser.add_argument(
        "--memory", default="2GB", help="memory budget per device for one chunk (default 2GB)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (grid, chunks, compilations, memory, estimates), check it and exit",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="run past the work bound, the available memory, the chunk count or the free disk space",
    )
    parser.add_argument(
        "--verify",
        metavar="STORE",
        help="check every completed chunk of STORE and its record of the evaluation paths (exit 0: "
        "sound, with the recorded paths; 1: one line per damaged chunk)",
    )
    parser.add_argument("--quiet", action="store_true", help="no plan or progress bar")
    jobs = parser.add_argument_group(
        "job arrays",
        "independent jobs (e.g. a Slurm array) filling one shared store, each its share of the chunks",
    )
    jobs.add_argument(
        "--part",
        metavar="I/N",
        help="run only part I of N (1-based: 1 <= I <= N) of the plan's chunks; the part creates the "
        "store or joins it (no --resume needed), verifies and completes its own chunks only",
    )
    jobs.add_argument(
        "--status",
        action="store_true",
        help="print done / running / pending / damaged chunks and failed points per part of --out "
        "(SPEC optional: the stored spec) and exit (0; 1 when chunks are damaged)",
    )
    dist = parser.add_argument_group(
        "several processes (jax.distributed)",
        "one sweep run by N cooperating processes over one Mesh of all "
        "their devices; process 0 writes the store. Give all three of --coordinator, --num-processes, "
        "--process-id, or --distributed",
    )
    dist.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="address of process 0 (the coordinator), the same for every process",
    )
    dist.add_argument("--num-processes", metavar="N", type=int, help="number of processes")
    dist.add_argument(
        "--process-id", metavar="I", type=int, help="this process, 0 .. N-1 (0 writes the store)"
    )
    dist.add_argument(
        "--distributed",
        action="store_true",
        help="jax.distributed.initialize() with the cluster's environment (Slurm srun, Open MPI, ...)",
    )
    dist.add_argument(
        "--heartbeat-timeout",
        metavar="SECONDS",
        type=int,
        default=100,
        help="a process silent this long is taken for dead and every process stops (default 100)",
    )
    dist.add_argument(
        "--join-timeout",
        metavar="SECONDS",
        type=int,
        default=120,
        help="a process that has not joined all the others this long after its start of the join "
        "stops with one line, exit status 2 (default 120)",
    )
    return parser


def _configure_process() -> None:
    """The process's set-up before JAX is imported (``meanfield.compilation_cache``)."""
    from .. import compilation_cache

    compilation_cache.configure_process()


def _distributed(args: argparse.Namespace) -> bool:
    """Join ``jax.distributed`` when asked (before any JAX computation of this process: the
    CLI's own process, never a library call); whether it was asked. Bounded by
    ``--join-timeout`` (``_distributed.join``: past it, one line and exit status 2)."""
    given = [
        args.coordinator is not None,
        args.num_processes is not None,
        args.process_id is not None,
    ]
    if not any(given) and not args.distributed:
        return False
    if any(given) and not all(given):
        raise _UsageError(
            "--coordinator, --num-processes and --process-id go together (or --distributed alone)"
        )
    from . import _distributed as _dist

    try:
        _dist.check_args(
            args.coordinator,
            args.num_processes,
            args.process_id,
            join_timeout=args.join_timeout,
            heartbeat_timeout=args.heartbeat_timeout,
        )
    except ValueError as e:
        raise _UsageError(str(e)) from None
    _dist.join(
        args.coordinator,
        args.num_processes,
        args.process_id,
        join_timeout=args.join_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
    )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``meanfield sweep SPEC.toml --out STORE.zarr [--resume] [--memory SIZE] [--dry-run] [--force] [--quiet]
    [--part I/N] [--coordinator HOST:PORT --num-processes N --process-id I | --distributed]``,
    ``meanfield sweep [SPEC.toml] --out STORE.zarr --status`` or ``meanfield sweep --verify STORE.zarr``.

    Returns the exit status: 0 done, 1 ``--verify`` or ``--status`` found damage, 2 a user
    error (one line on stderr), 130 interrupted. ``argv`` None: the process's own arguments,
    and the process is set up for its run (``meanfield.compilation_cache.configure_process()``).
    """
    return _sweep(argv, process=argv is None)


def _sweep(argv: Sequence[str] | None, *, process: bool) -> int:
    """``main``; ``process``: set up the process (``_configure_process``) once the arguments are parsed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _sweep_parser()

    def run() -> int:
        args = _parse(parser, argv)
        if isinstance(args, int):  # --help
            return args
        for flag, value in (("--out", args.out), ("--verify", args.verify), ("SPEC", args.spec)):
            if value is not None and not value.strip():
                raise _UsageError(f"{flag} must be a path, got {value!r}")
        if process:  # the arguments parse: the process's set-up, before anything imports JAX
            _configure_process()
        dist_flags = (args.coordinator, args.num_processes, args.process_id)
        distributed = args.distributed or any(v is not None for v in dist_flags)
        if args.verify is not None:
            if (
                args.spec is not None
                or args.out is not None
                or args.resume
                or args.dry_run
                or args.part
                or args.status
                or distributed
            ):
                raise _UsageError(
                    "--verify STORE takes no spec, --out, --resume, --dry-run, --part, --status "
                    "or distributed flags"
                )
            return _verify(args.verify)
        if args.status:
            if args.out is None:
                raise _UsageError("--status needs --out STORE")
            if args.resume or args.dry_run or args.force or args.part or distributed:
                raise _UsageError("--status takes only SPEC (optional) and --out STORE")
            return _status(args.spec, args.out)
        if args.spec is None:
            raise _UsageError("the following arguments are required: spec (or --verify STORE)")
        if args.out is None:
            raise _UsageError("the following arguments are required: --out")
        from .run import parse_part, run_sweep
        from .spec import load_spec

        part = parse_part(args.part) if args.part is not None else None
        if part is not None and distributed:
            raise _UsageError(
                "--part runs one process of a job array; it does not combine with --coordinator, "
                "--num-processes, --process-id or --distributed"
            )
        spec = load_spec(args.spec)
        _distributed(args)
        run_sweep(
            spec,
            args.out,
            resume=args.resume,
            memory=args.memory,
            dry_run=args.dry_run,
            quiet=args.quiet,
            force=args.force,
            part=part,
        )
        return 0

    return _guarded("meanfield sweep", run)


def _verify(path: str) -> int:
    """``--verify STORE``: 0 and a summary on stdout when every completed chunk is sound;
    1 and one line per damaged chunk on stderr otherwise."""
    from pathlib import Path

    from .store import Damage, load, recorded_backends, verify

    store = Path(path)
    if not (store / "zarr.json").exists():
        raise FileNotFoundError(f"sweep store not found: {store}")
    damages = verify(store)
    if damages:
        first: dict[int | None, Damage] = {}
        for d in damages:
            first.setdefault(d.chunk, d)
        meta = [d for d in damages if d.chunk is None]
        for d in meta + [
            d for c, d in first.items() if c is not None
        ]:  # every metadata file, each chunk once
            print(f"damaged: {d}", file=sys.stderr)
        chunks = len(first) - (None in first)
        if not meta:
            print(
                f"{store}: {chunks} damaged chunk(s); resume the sweep to recompute them",
                file=sys.stderr,
            )
        elif all(d.repairable for d in meta):
            print(
                f"{store}: {chunks} damaged chunk(s), {len(meta)} damaged bookkeeping or metadata file(s); "
                "resume the sweep to repair them",
                file=sys.stderr,
            )
        else:
            print(
                f"{store}: {chunks} damaged chunk(s); coordinates or metadata are damaged",
                file=sys.stderr,
            )
        return 1
    ds = load(store, verify=False)
    done, total = ds.attrs["chunks_done"], ds.attrs.get("chunks_total", "?")
    pending = "" if done == total else f" ({total - done} not computed yet: resume to finish)"
    backends = recorded_backends(store)
    paths = (
        ""
        if not backends
        else "; evaluation paths as recorded: "
        + "; ".join(f"{v} for {k}" for k, v in sorted(backends.items()))
    )
    print(f"{store}: sound; {done} of {total} chunks done and verified{pending}{paths}")
    if backends and "native" in backends.values():
        from .. import _native

        lib = _native.exp_library()
        if not lib.available:
            print(
                f"{store}: note: its chunks ran the fused C kernel, not available here "
                f"({lib.reason}): `--resume` refuses to run its missing chunks on this machine",
                file=sys.stderr,
            )
    return 0


def _status(spec: str | None, out: str) -> int:
    """``--status``: one summary line and a table of the parts on stdout; 1 when chunks are damaged."""
    from .run import sweep_status
    from .spec import load_spec

    st = sweep_status(out, load_spec(spec) if spec is not None else None)
    t = st["total"]
    split = f"split into {st['parts']} parts" if st["parts"] else "not split into parts"
    print(
        f"{out}: {split}; {t['done']} of {t['chunks']} chunks done, {t['running']} running, "
        f"{t['pending']} pending, {t['damaged']} damaged; {t['failed_points']} failed points"
    )
    cols = ("part", "chunks", "done", "running", "pending", "damaged", "failed_points")
    width = max(4, *(len(r["part"]) for r in st["rows"])) + 2
    print(f"{cols[0]:<{width}}" + "  ".join(f"{c:>{len(c)}}" for c in cols[1:]))
    for row in st["rows"]:
        print(f"{row['part']:<{width}}" + "  ".join(f"{row[c]:>{len(c)}}" for c in cols[1:]))
    for line in st["repairable"]:
        print(f"damaged: {line}", file=sys.stderr)
    if st["repairable"]:
        print(f"{out}: damaged bookkeeping or metadata: `--resume` repairs it", file=sys.stderr)
    if t["damaged"]:
        print(
            f"{out}: {t['damaged']} damaged chunk(s): `--resume` (or the part's own run) recomputes them",
            file=sys.stderr,
        )
    return 1 if t["damaged"] or st["repairable"] else 0


def plot_main(argv: Sequence[str] | None = None) -> int:
    """``meanfield plot STORE.zarr [--out DIR] [--no-verify]``: curves against time (error bands
    over seeds), heatmaps. Returns the exit status (2 and one line on stderr for a user error,
    a damaged store included)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="meanfield plot", description="Standard figures of a sweep store.")
    parser.add_argument("store", help="zarr store written by `meanfield sweep`")
    parser.add_argument(
        "--out",
        default=None,
        help="directory for the PNGs (default: STORE_plots next to the store)",
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="do not check the store's chunks first (large stores, stores of earlier versions)",
    )

    def run() -> int:
        args = _parse(parser, argv)
        if isinstance(args, int):  # --help
            return args
        for flag, value in (("STORE", args.store), ("--out", args.out)):
            if value is not None and not value.strip():
                raise _UsageError(f"{flag} must be a path, got {value!r}")
        from .plot import plot_store

        try:
            paths = plot_store(args.store, args.out, verify=not args.no_verify)
        except RuntimeError as e:  # a codec's error on data read unverified (--no-verify): one line
            raise ValueError(
                f"{args.store}: data do not decode ({_one_line(e)}); the store is damaged: "
                f"`meanfield sweep --verify {args.store}` names the chunk"
            ) from None
        for p in paths:
            print(p)
        return 0

    return _guarded("meanfield plot", run)


def console(argv: Sequence[str] | None = None) -> int:
    """``python -m meanfield.sweep [sweep] SPEC ...`` or ``python -m meanfield.sweep plot STORE ...``;
    a user error (bad spec, missing file, existing store, ...) is one line on stderr and status 2.
    ``argv`` None: the process's own arguments, the process set up as by ``main()``."""
    process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plot":
        return plot_main(argv[1:])
    if argv and argv[0] == "sweep":
        argv = argv[1:]
    return _sweep(argv, process=process)
