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
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import _paths

__all__ = [
    "EXPERIMENTS",
    "PAPERS",
    "QUICK_COST_S",
    "STATUS_REFRESH_S",
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
    "noise": "meanfield.reproduce.noise",
}

#: The reproductions that ``meanfield reproduce`` (no name) runs and reports: the four papers, the
#: mean-field limit they share (``continuum``, docs/math/continuum.md), the attention variants as
#: dynamics (``dynamics``: heads, masks, Sinkhorn, hardmax against their papers) and noise and
#: natural frequencies (``noise``, docs/math/noise.md).
PAPERS: tuple[str, ...] = (
    "usa-av",
    "attention",
    "depth",
    "prototypes",
    "continuum",
    "dynamics",
    "noise",
)

#: Wall seconds of each quick run in the two-process run of ``meanfield reproduce --quick`` on the
#: 2-core box (BENCHMARKS.md, "The whole quick run"; git 35c0088+, 2026-12-03): with several
#: processes the longest start first, so that the last one to finish is a short one (the report's
#: order stays ``PAPERS``'s). The times with two processes, not alone: an experiment whose compute
#: is multi-threaded (continuum) slows down more beside another than one that mostly compiles.
#: design and metastability are not in that run: their entries are rough estimates (only the
#: order matters); noise's is its quick run alone on a loaded 2-core box (51 s with the particles
#: against the density equation and the homogenized limit, 2026-12-07), not yet measured in the
#: two-process run.
QUICK_COST_S: dict[str, float] = {
    "usa-av": 61.0,
    "attention": 86.0,
    "depth": 50.0,
    "prototypes": 70.0,
    "continuum": 104.0,
    "design": 120.0,
    "metastability": 60.0,
    "dynamics": 60.0,
    "noise": 50.0,
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
    environment (the compilation cache, ``EQX_ON_ERROR``) is this process's.

    Each experiment's verdict (``name: k/n checks pass in T s``) is printed on stdout the moment it
    finishes, whatever still runs. Unless ``quiet``, stderr gets a line when an experiment starts
    and, when stderr is a terminal (or a notebook), live progress: each experiment's bar on its own
    line and, with several processes, one more line naming the experiments running and how long
    each has run. When stderr is not a terminal (a log, CI) only the start lines are written there,
    never a redrawn bar. An experiment that raises stops the run with its error once the
    experiments already running have finished (what they wrote stays in ``out_dir``).

    >>> run_experiments(["nope"])
    Traceback (most recent call last):
    ...
    ValueError: unknown experiment 'nope'; accepted: usa-av, attention, depth, prototypes, design, continuum, metastability, dynamics, noise
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
    special = _paths.special_file_under(out) if out.is_dir() else None
    if special is not None:  # refused before any experiment, not waited on after one
        raise ValueError(
            f"out_dir {str(out)!r} holds {special[0]!r}, {special[1]}: it cannot be written"
        )
    mode = "quick" if quick else "full" if full else "default"
    tasks = [(i, name, EXPERIMENTS[name]) for i, name in enumerate(names, 1)]
    common = (str(out), len(names), quick, full, quiet, mode, not quiet and _live(sys.stderr))
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


def _live(stream: Any) -> bool:
    """Whether progress may be redrawn on ``stream``: a terminal, or a notebook's output (where
    ``tqdm.auto`` draws widgets). Anything else (a file, a pipe, CI's log) gets plain lines only."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
    return type(stream).__module__.startswith("ipykernel")


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
    bars: bool = False,
) -> dict[str, Any]:
    """Run one experiment here (in this process) and return its summary, with its total time.

    ``quiet``: no start line; ``bars``: the experiment draws its progress bars (else it runs quiet).
    A worker of ``_run_concurrently`` also tells the parent when the experiment starts (``_EVENTS``).
    """
    t0 = time.perf_counter()
    if _EVENTS is not None:
        _EVENTS.put((name, time.time()))
    if not quiet:
        print(f"[meanfield {i}/{count}] reproduce {name} ({mode})", file=sys.stderr, flush=True)
    opts = {"full": True} if full else {}
    summary = importlib.import_module(module).run(Path(out), quick=quick, quiet=not bars, **opts)
    summary.setdefault("timings", {})["total_s"] = round(time.perf_counter() - t0, 2)
    path = Path(out) / name / "summary.json"
    if path.is_file():  # the experiment's own summary, with the time of the whole experiment
        import json

        _paths.write_output(path, json.dumps(summary, indent=2, allow_nan=True), "summary")
    return summary


def _print_result(name: str, summary: dict[str, Any]) -> None:
    """The verdict line of one experiment, on stdout: ``name: k/n checks pass in T s``."""
    failed = [c["name"] for c in summary["checks"] if not c["pass"]]
    total_s = summary.get("timings", {}).get("total_s")
    print(
        f"{name}: {len(summary['checks']) - len(failed)}/{len(summary['checks'])} checks pass"
        + (f" in {total_s:.0f} s" if isinstance(total_s, (int, float)) else "")
        + (f" (failing: {', '.join(failed)})" if failed else ""),
        flush=True,
    )


#: Seconds between two redraws of the line of running experiments (``_run_concurrently``).
STATUS_REFRESH_S = 1.0

#: In a worker of ``_run_concurrently``: where ``_run_one`` says that an experiment starts.
_EVENTS: Any = None


def _running_text(started: dict[str, float], now: float) -> str:
    """The line of running experiments: each name and how long it has run (m:ss), longest first.

    >>> _running_text({"depth": 100.0, "continuum": 0.0}, 125.0)
    'running: continuum 2:05, depth 0:25'
    """
    if not started:
        return "starting"
    shown = sorted(started.items(), key=lambda kv: kv[1])
    return "running: " + ", ".join(
        f"{name} {int(now - t0) // 60}:{int(now - t0) % 60:02d}" for name, t0 in shown
    )


def _run_concurrently(
    tasks: list[tuple[int, str, str]],
    common: tuple[str, int, bool, bool, bool, str, bool],
    jobs: int,
) -> dict[str, dict[str, Any]]:
    """``_run_one`` of each task in ``jobs`` spawned processes, the costliest first; each verdict is
    printed the moment its experiment finishes, and the summaries are returned in the tasks' order.

    With live progress (``common[-1]``, ``bars``) a status bar below the workers' bars counts the
    finished experiments and names the running ones with their times (redrawn every
    ``STATUS_REFRESH_S``), under the lock the workers' bars share. The first experiment that raises
    cancels those not started and raises its error once the running ones have finished."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from tqdm.auto import tqdm

    bars = common[-1]
    ctx = multiprocessing.get_context("spawn")
    slots, events = ctx.Queue(), ctx.Queue()
    for slot in range(jobs):
        slots.put(slot)
    lock = ctx.RLock()
    order = sorted(tasks, key=lambda t: -QUICK_COST_S.get(t[1], 0.0))
    rank = {name: k for k, (_, name, _) in enumerate(tasks)}
    results: dict[str, dict[str, Any]] = {}
    started: dict[str, float] = {}
    old_lock = tqdm.get_lock()
    tqdm.set_lock(lock)  # this process's status bar and the workers' bars draw one at a time
    status = tqdm(
        total=len(tasks),
        desc="reproduce",
        position=jobs,
        disable=not bars,
        leave=False,
        bar_format="{desc}: {n}/{total} done [{elapsed}] {postfix}",
    )
    try:
        with ProcessPoolExecutor(
            jobs, mp_context=ctx, initializer=_init_worker, initargs=(slots, lock, events)
        ) as pool:
            futures = {
                pool.submit(_run_one, i, name, module, *common): name for i, name, module in order
            }
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=STATUS_REFRESH_S, return_when=FIRST_COMPLETED)
                _drain(events, started, results)
                # several at once: in the report's order, so that the output is deterministic
                for f in sorted(done, key=lambda f: rank[futures[f]]):
                    name = futures[f]
                    started.pop(name, None)
                    if f.exception() is not None:
                        for p in pending:
                            p.cancel()
                        raise f.exception()  # type: ignore[misc]
                    results[name] = f.result()
                    status.clear()
                    _print_result(name, results[name])
                    status.update()
                if pending:
                    status.set_postfix_str(_running_text(started, time.time()))
    finally:
        status.close()
        tqdm.set_lock(old_lock)
    return {name: results[name] for _, name, _ in tasks}


def _drain(events: Any, started: dict[str, float], results: Mapping[str, Any]) -> None:
    """Move the start times that workers sent to ``events`` into ``started`` (an experiment whose
    result is already in ``results`` ran and finished between two looks: it is not running)."""
    import queue

    while True:
        try:
            name, t0 = events.get_nowait()
        except queue.Empty:
            return
        if name not in results:
            started[name] = t0


def _init_worker(slots: Any, lock: Any, events: Any = None) -> None:
    """A worker process of ``_run_concurrently``: its progress bars on their own line (``slot``),
    drawn under one lock shared by the workers and the parent's status bar; ``events`` hears when
    each of its experiments starts."""
    global _EVENTS
    from tqdm import tqdm

    from . import _common

    tqdm.set_lock(lock)
    _common.BAR_POSITION = slots.get()
    _EVENTS = events
