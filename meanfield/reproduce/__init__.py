"""``meanfield reproduce``: one experiment per paper, theory beside every number.

Each experiment module exposes ``run(out_dir, *, quick=False, full=False, quiet=False, **options) -> dict``
which writes ``out_dir/<name>/`` (figures, data, ``summary.json``) and returns the summary, and
``EXPERIMENT`` (``_common.Experiment``), where its options (a value per size: quick, default,
full) and its steps are declared once: ``options`` replace declared values, and an unknown name
raises the same ``ValueError`` in every experiment, before any work. ``EXPERIMENT.describe()``
lists the options, one line each: what it sets and its values.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "EXPERIMENTS",
    "PAPERS",
    "QUICK_COST_S",
    "default_jobs",
    "get",
    "get_path",
    "run_experiments",
]

EXPERIMENTS: dict[str, str] = {
    "usa-av": "meanfield.reproduce.usa_av",
    "attention": "meanfield.reproduce.attention",
    "depth": "meanfield.reproduce.depth",
    "prototypes": "meanfield.reproduce.prototypes",
    "design": "meanfield.reproduce.design",
    "continuum": "meanfield.reproduce.continuum",
    "metastability": "meanfield.reproduce.metastability",
    "dynamics": "meanfield.reproduce.dynamics",
}

#: The reproductions that ``meanfield reproduce`` (no name) runs and reports: the four papers, the
#: mean-field limit they share (``continuum``, MATH.md Sec. 5) and the attention variants as
#: dynamics (``dynamics``: heads, masks, Sinkhorn, hardmax against their papers).
PAPERS: tuple[str, ...] = ("usa-av", "attention", "depth", "prototypes", "continuum", "dynamics")

#: Wall seconds of each quick run in the two-process run of ``meanfield reproduce --quick`` on the
#: 2-core box (BENCHMARKS.md, "The whole quick run"; git 35c0088+, 2026-12-03): with several
#: processes the longest start first, so that the last one to finish is a short one (the report's
#: order stays ``PAPERS``'s). The times with two processes, not alone: an experiment whose compute
#: is multi-threaded (continuum) slows down more beside another than one that mostly compiles.
#: design and metastability are not in that run: their entries are rough estimates (only the
#: order matters).
QUICK_COST_S: dict[str, float] = {
    "usa-av": 61.0,
    "attention": 86.0,
    "depth": 50.0,
    "prototypes": 70.0,
    "continuum": 104.0,
    "design": 120.0,
    "metastability": 60.0,
    "dynamics": 60.0,
}


def get(name: str) -> ModuleType:
    """The experiment module for ``name`` (one of ``EXPERIMENTS``)."""
    return importlib.import_module(get_path(name))


def default_jobs(n_experiments: int) -> int:
    """Processes that ``run_experiments`` uses when ``jobs`` is None: one per core this process
    may run on, at most one per experiment (measured on the 2-core box: two processes finish the
    quick papers in BENCHMARKS.md's time against one; XLA compiles each program on one core, so a
    second experiment compiles while the first computes)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        cores = os.cpu_count() or 1
    return max(1, min(int(n_experiments), cores))


def run_experiments(
    names: Sequence[str] | None = None,
    out_dir: str | os.PathLike[str] = "out/reproduce",
    *,
    quick: bool = False,
    full: bool = False,
    quiet: bool = False,
    jobs: int | None = None,
    report: bool | None = None,
) -> dict[str, dict[str, Any]]:
    """Run experiments (default: every entry of ``PAPERS``) and return their summaries by name,
    in the order of ``names``; with ``report`` (default: when ``names`` is None) also write
    ``out_dir/REPORT.md`` and ``report.html``.

    ``jobs`` processes run the experiments concurrently (default ``default_jobs``; 1 runs them
    one after the other in this process). Each process is a fresh interpreter
    (``multiprocessing``'s spawn start method, through ``concurrent.futures``), so an experiment
    computes the same numbers whichever process runs it and whatever ran before it there; the
    environment (the compilation cache, ``EQX_ON_ERROR``) is this process's. Progress bars are
    drawn one line per process. An experiment that raises stops the run with its error once the
    experiments already running have finished (what they wrote stays in ``out_dir``).

    >>> run_experiments(["nope"])
    Traceback (most recent call last):
    ...
    ValueError: unknown experiment 'nope'; accepted: usa-av, attention, depth, prototypes, design, continuum, metastability, dynamics
    """
    names = list(PAPERS) if names is None else list(names)
    for name in names:
        get_path(name)
    if quick and full:
        raise ValueError("quick and full exclude each other; pass at most one")
    if jobs is None:
        jobs = default_jobs(len(names))
    elif not isinstance(jobs, int):
        raise TypeError(f"jobs must be a positive integer or None, got {jobs!r}")
    elif isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer or None, got {jobs!r}")
    jobs = min(jobs, max(1, len(names)))
    out = Path(out_dir)
    mode = "quick" if quick else "full" if full else "default"
    tasks = [(i, name, EXPERIMENTS[name]) for i, name in enumerate(names, 1)]
    common = (str(out), len(names), quick, full, quiet, mode)
    summaries: dict[str, dict[str, Any]] = {}
    if jobs == 1:
        for i, name, module in tasks:
            summaries[name] = _run_one(i, name, module, *common)
            _print_result(name, summaries[name])
    else:
        summaries = _run_concurrently(tasks, common, jobs)
    if report if report is not None else names == list(PAPERS):
        from .report import write_report

        write_report(out, summaries, quick=quick)
    return summaries


def get_path(name: str) -> str:
    """The module path of experiment ``name`` (one of ``EXPERIMENTS``), without importing it."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; accepted: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def _run_one(
    i: int,
    name: str,
    module: str,
    out: str,
    count: int,
    quick: bool,
    full: bool,
    quiet: bool,
    mode: str,
) -> dict[str, Any]:
    """Run one experiment here (in this process) and return its summary, with its total time."""
    t0 = time.perf_counter()
    if not quiet:
        print(f"[meanfield {i}/{count}] reproduce {name} ({mode})", file=sys.stderr, flush=True)
    opts = {"full": True} if full else {}
    summary = importlib.import_module(module).run(Path(out), quick=quick, quiet=quiet, **opts)
    summary.setdefault("timings", {})["total_s"] = round(time.perf_counter() - t0, 2)
    path = Path(out) / name / "summary.json"
    if path.is_file():  # the experiment's own summary, with the time of the whole experiment
        import json

        path.write_text(json.dumps(summary, indent=2, allow_nan=True))
    return summary


def _print_result(name: str, summary: dict[str, Any]) -> None:
    failed = [c["name"] for c in summary["checks"] if not c["pass"]]
    print(
        f"{name}: {len(summary['checks']) - len(failed)}/{len(summary['checks'])} checks pass"
        + (f" (failing: {', '.join(failed)})" if failed else ""),
        flush=True,
    )


def _run_concurrently(
    tasks: list[tuple[int, str, str]], common: tuple[str, int, bool, bool, bool, str], jobs: int
) -> dict[str, dict[str, Any]]:
    """``_run_one`` of each task in ``jobs`` spawned processes, the costliest first; results are
    printed as they finish and returned in the tasks' order."""
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")
    slots = ctx.Queue()
    for slot in range(jobs):
        slots.put(slot)
    lock = ctx.RLock()
    order = sorted(tasks, key=lambda t: -QUICK_COST_S.get(t[1], 0.0))
    with ProcessPoolExecutor(
        jobs, mp_context=ctx, initializer=_init_worker, initargs=(slots, lock)
    ) as pool:
        futures = {
            pool.submit(_run_one, i, name, module, *common): name for i, name, module in order
        }
        pending = set(futures)
        results: dict[str, dict[str, Any]] = {}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:
                    for p in pending:
                        p.cancel()
                    raise f.exception()  # type: ignore[misc]
                results[futures[f]] = f.result()
                _print_result(futures[f], results[futures[f]])
    return {name: results[name] for _, name, _ in tasks}


def _init_worker(slots: Any, lock: Any) -> None:
    """A worker process of ``_run_concurrently``: its progress bars on their own line (``slot``),
    drawn under one lock shared by the workers."""
    from tqdm import tqdm

    from . import _common

    tqdm.set_lock(lock)
    _common.BAR_POSITION = slots.get()
