"""``python -m benchmarks.reproduce [--experiments NAME ...] [--full] [--out DIR] [--whole-jobs J ...]``: where the time of
``meanfield reproduce --quick`` goes, compilation against computation (issue 32, "measure first").

Each experiment runs in a fresh process, as ``meanfield reproduce NAME --quick`` runs it
(``meanfield.compilation_cache.configure_process()``: ``EQX_ON_ERROR=nan`` and JAX's persistent
compilation cache, here in an empty temporary directory so that every program compiles as on a
first run; the native C kernels already built). JAX reports every compilation through its public
``jax.monitoring`` listeners: the time to trace a jitted function (``jaxpr_trace_duration``), to
lower it to an MLIR module and to compile that with XLA (``backend_compile_duration``, the
persistent cache's lookup and write included). Each event is charged to the function of
``meanfield/reproduce/`` that was on the call stack when it happened (the step of the experiment,
e.g. ``design._meanfield_experiment``), and each program is named by its function name with the
shapes and types of its arguments (JAX's ``Compiling ... with global shapes and types`` record), so
a program compiled twice in one run shows up. That count is an upper bound: static parameters (the
size of an ``iota``, a closure's constants) are not part of the name, so two programs that differ
only in them count as one program compiled twice. The exact count is the persistent cache's own: it
starts empty, so each of its hits (``/jax/compilation_cache/cache_hits``) is an XLA module this run
had already built, traced and lowered again and served by the cache instead of XLA (listed by step
and program at the end); programs the cache refuses (host callbacks) are counted apart, since a
second build of one of them would not show.

Per experiment: wall time of ``run()``, the compile share (trace + lower + XLA), programs compiled,
programs compiled more than once, and the steps that compile most. Everything else in the wall time
is computation, Python and I/O (figures included). Writes ``DIR/reproduce.json`` (default
``out/benchmarks``) and prints Markdown tables. Not a test: the numbers depend on the machine and its
load.

``--whole-jobs 1 2`` times something else: the whole ``meanfield reproduce --quick --jobs J`` as a
user runs it on a fresh machine (a fresh process and an empty meanfield cache, so the native build
and every compilation are included), for each ``J``, with the verdict of every check; it writes
``DIR/reproduce_whole.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 3600
_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "xla",
}


def _step() -> str:
    """The innermost function of ``meanfield/reproduce/`` on the call stack (``module.function``)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/meanfield/reproduce/" in path:
            return f"{Path(path).stem}.{frame.f_code.co_name}"
        frame = frame.f_back
    return "(outside the experiment)"


def _child(name: str, out: str, full: bool) -> dict:
    """Run one experiment in this (fresh) process and return its compile events and wall time."""
    from meanfield import compilation_cache

    compilation_cache.configure_process()  # as `meanfield reproduce` does, before JAX is imported
    import logging

    import jax
    import jax.monitoring

    from meanfield import reproduce

    per_step: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    programs: collections.Counter = collections.Counter()
    # the persistent cache starts empty, so a hit is a program this run has already compiled: traced and
    # lowered again (identical XLA module), its XLA compilation served by the cache
    last = [""]
    again: collections.Counter = collections.Counter()
    cache_requests = [0]

    def on_event(event: str, **_: object) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            again[f"{_step()}: {last[0]}"] += 1
        elif event == "/jax/compilation_cache/compile_requests_use_cache":
            cache_requests[0] += 1

    def on_duration(event: str, duration: float, **_: object) -> None:
        kind = _EVENTS.get(event)
        if kind is not None:
            step = per_step[_step()]
            step[kind] += duration
            if kind == "xla":
                step["programs"] += 1

    class _Programs(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if isinstance(record.msg, str) and record.msg.startswith(
                "Compiling %s with global shapes"
            ):
                programs[f"{record.args[0]} {record.args[1]}"] += 1  # type: ignore[index]
                last[0] = f"{record.args[0]}"  # type: ignore[index]

    for logger_name in ("jax._src.interpreters.pxla", "jax._src.dispatch", "jax._src.pjit"):
        logger = logging.getLogger(logger_name)
        logger.addHandler(_Programs() if logger_name.endswith("pxla") else logging.NullHandler())
        logger.propagate = False
    jax.config.update("jax_log_compiles", True)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)

    mod = reproduce.get(name)
    t0 = time.perf_counter()
    summary = mod.run(Path(out), quick=not full, quiet=True, **({"full": True} if full else {}))
    wall = time.perf_counter() - t0
    return {
        "experiment": name,
        "wall_s": wall,
        "checks": len(summary["checks"]),
        "passed": sum(bool(c["pass"]) for c in summary["checks"]),
        "timings": summary.get("timings", {}),
        "steps": {k: dict(v) for k, v in per_step.items()},
        "programs": len(programs),
        "compiles": sum(programs.values()),
        "twice": {k: v for k, v in programs.items() if v > 1},
        # exact: XLA modules this run built twice (the second served by its own persistent cache), per step
        "lowered_again": dict(again),
        # programs compiled without the persistent cache (host callbacks): a second build of one would not show above
        "uncacheable": sum(v.get("programs", 0) for v in per_step.values()) - cache_requests[0],
    }


def _run_child(name: str, full: bool, cache_root: Path) -> dict:
    with tempfile.TemporaryDirectory() as xla, tempfile.TemporaryDirectory() as out:
        env = dict(
            os.environ,
            JAX_COMPILATION_CACHE_DIR=xla,
            MEANFIELD_CACHE_DIR=str(cache_root),
            MPLBACKEND="Agg",
        )
        env.pop("MEANFIELD_COMPILATION_CACHE", None)
        args = [sys.executable, "-m", "benchmarks.reproduce", "--child", name, "--child-out", out]
        proc = subprocess.run(
            args + (["--full"] if full else []),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(rows: list[dict]) -> str:
    lines = [
        "| experiment | wall (s) | compile (s) | share | trace / lower / XLA (s) | programs | same name and shapes twice (upper bound) "
        "| built twice (exact) | not cacheable | checks passed |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    tot = collections.Counter()
    for r in rows:
        k = collections.Counter()
        for s in r["steps"].values():
            k.update(s)
        comp = k["trace"] + k["lower"] + k["xla"]
        tot.update(
            {
                "wall": r["wall_s"],
                "comp": comp,
                "trace": k["trace"],
                "lower": k["lower"],
                "xla": k["xla"],
                "programs": r["programs"],
                "twice": len(r["twice"]),
                "again": sum(r.get("lowered_again", {}).values()),
                "uncacheable": r.get("uncacheable", 0),
            }
        )
        again = sum(r.get("lowered_again", {}).values())
        lines.append(
            f"| {r['experiment']} | {r['wall_s']:.1f} | {comp:.1f} | {comp / r['wall_s']:.0%} | "
            f"{k['trace']:.1f} / {k['lower']:.1f} / {k['xla']:.1f} | {r['programs']} | {len(r['twice'])} | "
            f"{again} | {r.get('uncacheable', 0)} | {r['passed']}/{r['checks']} |"
        )
    if len(rows) > 1:
        lines.append(
            f"| **all** | {tot['wall']:.1f} | {tot['comp']:.1f} | {tot['comp'] / tot['wall']:.0%} | "
            f"{tot['trace']:.1f} / {tot['lower']:.1f} / {tot['xla']:.1f} | {tot['programs']} | {tot['twice']} | "
            f"{tot['again']} | {tot['uncacheable']} | |"
        )
    return "\n".join(lines)


def _steps_table(rows: list[dict], top: int) -> str:
    lines = [
        "| experiment | step (function of meanfield/reproduce) | compile (s) | programs |",
        "|---|---|---:|---:|",
    ]
    for r in rows:
        ranked = sorted(
            r["steps"].items(),
            key=lambda kv: -(kv[1].get("trace", 0) + kv[1].get("lower", 0) + kv[1].get("xla", 0)),
        )
        for step, s in ranked[:top]:
            comp = s.get("trace", 0) + s.get("lower", 0) + s.get("xla", 0)
            lines.append(
                f"| {r['experiment']} | `{step}` | {comp:.1f} | {int(s.get('programs', 0))} |"
            )
    return "\n".join(lines)


def _whole(jobs: int, full: bool) -> dict:
    """``meanfield reproduce --quick --jobs JOBS`` (every paper, the report), timed as a user runs it
    on a fresh machine: a fresh process, an empty meanfield cache (the native kernels built at its
    first import, JAX's persistent compilation cache empty)."""
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
        os.chmod(cache, 0o700)
        env = dict(os.environ, MEANFIELD_CACHE_DIR=cache, MPLBACKEND="Agg")
        for k in ("MEANFIELD_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR"):
            env.pop(k, None)
        args = [
            sys.executable,
            "-m",
            "meanfield",
            "reproduce",
            "--full" if full else "--quick",
            "--quiet",
            "--out",
            out,
            "--jobs",
            str(jobs),
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(
            args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(
                f"--jobs {jobs}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"
            )
        from meanfield.reproduce import PAPERS

        summaries = {n: json.loads((Path(out) / n / "summary.json").read_text()) for n in PAPERS}
    failing = sorted(
        f"{n}/{c['name']}" for n, s in summaries.items() for c in s["checks"] if not c["pass"]
    )
    return {
        "jobs": jobs,
        "wall_s": wall,
        "checks": sum(len(s["checks"]) for s in summaries.values()),
        "failing": failing,
        "experiment_s": {n: s["timings"].get("total_s") for n, s in summaries.items()},
    }


def _whole_table(rows: list[dict]) -> str:
    names = list(rows[0]["experiment_s"])
    lines = [
        "| --jobs | wall (s) | vs --jobs 1 | checks passed | "
        + " | ".join(f"{n} (s)" for n in names)
        + " |",
        "|---:|---:|---:|---|" + "---:|" * len(names),
    ]
    ref = next((r["wall_s"] for r in rows if r["jobs"] == 1), None)
    for r in rows:
        ratio = f"{ref / r['wall_s']:.2f}x" if ref else "—"
        lines.append(
            f"| {r['jobs']} | {r['wall_s']:.1f} | {ratio} | {r['checks'] - len(r['failing'])}/{r['checks']} | "
            + " | ".join(f"{r['experiment_s'][n]:.1f}" for n in names)
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from meanfield.reproduce import EXPERIMENTS, PAPERS

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.reproduce", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--experiments",
        nargs="+",
        choices=list(EXPERIMENTS),
        default=list(PAPERS),
        help="experiments to measure (default: those `meanfield reproduce` runs)",
    )
    p.add_argument("--full", action="store_true", help="the full sizes instead of --quick")
    p.add_argument("--top", type=int, default=4, help="steps listed per experiment (default 4)")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "benchmarks")
    p.add_argument(
        "--whole-jobs",
        type=int,
        nargs="+",
        metavar="JOBS",
        help="instead: time the whole `meanfield reproduce --quick --jobs JOBS` for each JOBS, each from an "
        "empty cache (native build and XLA compilation included), as on a fresh machine",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.child_out, args.full)))
        return 0
    if args.whole_jobs:
        whole = []
        for jobs in args.whole_jobs:
            print(
                f"[benchmarks.reproduce] meanfield reproduce --jobs {jobs} ...",
                file=sys.stderr,
                flush=True,
            )
            whole.append(_whole(jobs, args.full))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "reproduce_whole.json").write_text(
            json.dumps({"full": args.full, "rows": whole}, indent=2)
        )
        print(_whole_table(whole))
        for r in whole:
            print(f"--jobs {r['jobs']} failing: {', '.join(r['failing']) or 'none'}")
        return 0
    with tempfile.TemporaryDirectory() as cache_root:
        os.chmod(cache_root, 0o700)
        prebuild = (
            "import meanfield.kernels"  # the native kernels built once, outside the measurements
        )
        subprocess.run(
            [sys.executable, "-c", prebuild],
            cwd=ROOT,
            check=True,
            env=dict(os.environ, MEANFIELD_CACHE_DIR=cache_root),
            capture_output=True,
        )
        rows = []
        for name in args.experiments:
            print(f"[benchmarks.reproduce] {name} ...", file=sys.stderr, flush=True)
            rows.append(_run_child(name, args.full, Path(cache_root)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reproduce.json").write_text(
        json.dumps({"full": args.full, "rows": rows}, indent=2)
    )
    print(_table(rows))
    print()
    print(_steps_table(rows, args.top))
    again = [(r["experiment"], k, v) for r in rows for k, v in r.get("lowered_again", {}).items()]
    if again:
        print()
        print("Programs built twice in one run (step: program, extra builds):")
        for name, k, v in sorted(again, key=lambda t: -t[2]):
            print(f"- {name} `{k}` x{v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
