"""Command line of the sweep engine: ``meanfield sweep``, ``meanfield plot`` and
``python -m meanfield.sweep`` (``console``).

Every user error -- a bad spec or argument, a missing file, an existing store, a store that
cannot be written (``OSError``: a file in the path, permissions, a read-only file system), a
damaged store, a sweep past the machine's limits -- is one line on stderr and exit status 2,
without a traceback or a usage dump.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Callable

from .plot import plot_store
from .run import run_sweep
from .spec import load_spec
from .store import Damage, load, verify

__all__ = ["main", "plot_main", "console"]


class _UsageError(Exception):
    """An argparse error, reported as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage dump): ``error`` raises ``_UsageError``."""

    def error(self, message):  # type: ignore[override]
        raise _UsageError(message)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status of ``--help`` (errors raise ``_UsageError``)."""
    known = {s for a in parser._actions for s in a.option_strings}
    try:
        return parser.parse_args(_attach_values(argv, known))
    except SystemExit as e:  # --help
        return int(e.code or 0)


_VALUE_FLAGS = ("--out", "--memory", "--verify")


def _attach_values(argv: list[str], known: set[str]) -> list[str]:
    """``--memory -1GB`` as ``--memory=-1GB``: a value that starts with ``-`` but is no flag
    reaches its option (argparse would take it for an unknown flag)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in _VALUE_FLAGS and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1] not in known:
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
    parser.add_argument("--resume", action="store_true",
                        help="complete the missing (and recompute the damaged) chunks of an existing store")
    parser.add_argument("--memory", default="2GB", help="memory budget per device for one chunk (default 2GB)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (grid, chunks, compilations, memory, estimates), check it and exit")
    parser.add_argument("--force", action="store_true",
                        help="run past the work bound, the available memory, the chunk count or the free disk space")
    parser.add_argument("--verify", metavar="STORE",
                        help="check every completed chunk of STORE (exit 0: sound, 1: one line per damaged chunk)")
    parser.add_argument("--quiet", action="store_true", help="no plan or progress bar")
    return parser


def main(argv=None) -> int:
    """``meanfield sweep SPEC.toml --out STORE.zarr [--resume] [--memory SIZE] [--dry-run] [--force] [--quiet]``
    or ``meanfield sweep --verify STORE.zarr``.

    Returns the exit status: 0 done, 1 ``--verify`` found damage, 2 a user error (one line
    on stderr), 130 interrupted.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _sweep_parser()

    def run() -> int:
        args = _parse(parser, argv)
        if isinstance(args, int):  # --help
            return args
        if args.verify is not None:
            if args.spec is not None or args.out is not None or args.resume or args.dry_run:
                raise _UsageError("--verify STORE takes no spec, --out, --resume or --dry-run")
            return _verify(args.verify)
        if args.spec is None:
            raise _UsageError("the following arguments are required: spec (or --verify STORE)")
        if args.out is None:
            raise _UsageError("the following arguments are required: --out")
        spec = load_spec(args.spec)
        run_sweep(spec, args.out, resume=args.resume, memory=args.memory, dry_run=args.dry_run,
                  quiet=args.quiet, force=args.force)
        return 0

    return _guarded("meanfield sweep", run)


def _verify(path: str) -> int:
    """``--verify STORE``: 0 and a summary on stdout when every completed chunk is sound;
    1 and one line per damaged chunk on stderr otherwise."""
    from pathlib import Path

    store = Path(path)
    if not (store / "zarr.json").exists():
        raise FileNotFoundError(f"sweep store not found: {store}")
    damages = verify(store)
    if damages:
        first: dict[int | None, Damage] = {}
        for d in damages:
            first.setdefault(d.chunk, d)
        for d in first.values():
            print(f"damaged: {d}", file=sys.stderr)
        fix = "resume the sweep to recompute them" if None not in first else "coordinates or metadata are damaged"
        print(f"{store}: {len(first)} damaged chunk(s); {fix}", file=sys.stderr)
        return 1
    ds = load(store, verify=False)
    done, total = ds.attrs["chunks_done"], ds.attrs.get("chunks_total", "?")
    pending = "" if done == total else f" ({total - done} not computed yet: resume to finish)"
    print(f"{store}: sound; {done} of {total} chunks done and verified{pending}")
    return 0


def plot_main(argv=None) -> int:
    """``meanfield plot STORE.zarr [--out DIR] [--no-verify]``: curves against time (error bands
    over seeds), heatmaps. Returns the exit status (2 and one line on stderr for a user error,
    a damaged store included)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="meanfield plot", description="Standard figures of a sweep store.")
    parser.add_argument("store", help="zarr store written by `meanfield sweep`")
    parser.add_argument("--out", default=None, help="directory for the PNGs (default: STORE_plots next to the store)")
    parser.add_argument("--no-verify", action="store_true",
                        help="do not check the store's chunks first (large stores, stores of earlier versions)")

    def run() -> int:
        args = _parse(parser, argv)
        if isinstance(args, int):  # --help
            return args
        for p in plot_store(args.store, args.out, verify=not args.no_verify):
            print(p)
        return 0

    return _guarded("meanfield plot", run)


def console(argv=None) -> int:
    """``python -m meanfield.sweep [sweep] SPEC ...`` or ``python -m meanfield.sweep plot STORE ...``;
    a user error (bad spec, missing file, existing store, ...) is one line on stderr and status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plot":
        return plot_main(argv[1:])
    if argv and argv[0] == "sweep":
        argv = argv[1:]
    return main(argv)
