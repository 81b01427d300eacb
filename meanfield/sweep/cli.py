"""Command line of the sweep engine: ``meanfield sweep``, ``meanfield plot`` and
``python -m meanfield.sweep`` (``console``: user errors as one line on stderr, status 2)."""

from __future__ import annotations

import argparse
import sys
import tomllib

from .plot import plot_store
from .run import run_sweep
from .spec import load_spec

__all__ = ["main", "plot_main", "console"]


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
    parser = argparse.ArgumentParser(prog="meanfield plot", description="Standard figures of a sweep store.")
    parser.add_argument("store", help="zarr store written by `meanfield sweep`")
    parser.add_argument("--out", default=None, help="directory for the PNGs (default: STORE_plots next to the store)")
    args = parser.parse_args(argv)
    for p in plot_store(args.store, args.out):
        print(p)
    return 0


def console(argv=None) -> int:
    """``python -m meanfield.sweep [sweep] SPEC ...`` or ``python -m meanfield.sweep plot STORE ...``;
    a user error (bad spec, missing file, existing store) is one line on stderr and status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    entry = main
    if argv and argv[0] == "plot":
        entry, argv = plot_main, argv[1:]
    elif argv and argv[0] == "sweep":
        argv = argv[1:]
    try:
        return entry(argv)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, tomllib.TOMLDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
