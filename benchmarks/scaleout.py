"""``python -m benchmarks.scaleout [--scale 4] [--chunks 8] [--repeats 1] [--out FILE]``: the smoke sweep
(``sweeps/smoke.toml``, its seeds times ``--scale``) run by one process, by two cooperating
processes (``jax.distributed``, ``--coordinator localhost:PORT``) and by a job array of three
independent parts (``--part i/3`` started at once), all on this machine.

The processes share this machine's CPUs, so the ratio to one process measures the overhead of
scaling out (process start-up and compilation in every process, collectives, claims and
contention), not a speed-up. Every run is a fresh ``python -m meanfield sweep`` into a new store
(import, compilation and writing included); wall time from the first start to the last exit,
the median of ``--repeats``. All runs use the same ``--memory``, chosen so that one device holds
``--chunks`` chunks per group. Prints a Markdown table (and writes it to ``--out``). Not a test:
the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def _spec(scale: int) -> str:
    text = (ROOT / "sweeps" / "smoke.toml").read_text()
    seeds = tomllib.loads(text)["grid"]["seeds"]
    out = text.replace(f"seeds = {seeds}", f"seeds = {seeds * scale}").replace(
        'name = "smoke"', 'name = "smoke_x"'
    )
    assert tomllib.loads(out)["grid"]["seeds"] == seeds * scale
    return out


def _launch(commands: list[list[str]], env: dict) -> float:
    """Start the commands at once; wall seconds until the last exits (RuntimeError on a failure)."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "meanfield", "sweep", *c],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in commands
    ]
    try:
        errs = [(p.wait(1800), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    wall = time.perf_counter() - t0
    bad = [(rc, err.strip().splitlines()[-1:]) for rc, err in errs if rc != 0]
    if bad:
        raise RuntimeError(f"a sweep process failed: {bad}")
    return wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scaleout", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--scale", type=int, default=4, help="seeds of sweeps/smoke.toml times this (default 4)"
    )
    p.add_argument(
        "--chunks", type=int, default=8, help="chunks per group on one device (default 8)"
    )
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration (default 1)")
    p.add_argument("--out", help="also write the Markdown table to this file")
    args = p.parse_args(argv)

    import numpy as np

    from meanfield import sweep

    text = _spec(args.scale)
    spec = sweep.parse_spec(text)
    plan1 = sweep.make_plan(spec, "1TB", devices=1)
    per_group = int(np.prod(plan1.batch_shape))
    pb = max(g.point_bytes for g in plan1.groups)
    memory = str(pb * -(-per_group // args.chunks))
    env = dict(os.environ)
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaleout-") as tmp:
        base = Path(tmp)
        spec_path = base / "smoke_x.toml"
        spec_path.write_text(text)

        def single(out):
            return [[str(spec_path), "--out", str(out), "--memory", memory, "--quiet"]]

        def distributed(out):
            port = _free_port()
            return [
                [
                    str(spec_path),
                    "--out",
                    str(out),
                    "--memory",
                    memory,
                    "--quiet",
                    "--coordinator",
                    f"localhost:{port}",
                    "--num-processes",
                    "2",
                    "--process-id",
                    str(i),
                ]
                for i in range(2)
            ]

        def parts(out):
            return [
                [
                    str(spec_path),
                    "--out",
                    str(out),
                    "--memory",
                    memory,
                    "--quiet",
                    "--part",
                    f"{i}/3",
                ]
                for i in (1, 2, 3)
            ]

        configs = [
            ("one process", 1, single),
            ("2 processes (jax.distributed)", 2, distributed),
            ("3 parts (--part i/3, at once)", 3, parts),
        ]
        walls: dict[str, list[float]] = {name: [] for name, _, _ in configs}
        stores: dict[str, Path] = {}
        for r in range(args.repeats):
            for (
                name,
                _,
                make,
            ) in configs:  # alternating: a change of load hits every configuration alike
                out = base / f"{len(stores)}-{r}.zarr"
                walls[name].append(_launch(make(out), env))
                print(f"{name}: {walls[name][-1]:.1f} s", file=sys.stderr, flush=True)
                if name in stores:
                    shutil.rmtree(out)
                else:
                    stores[name] = out
        ref = sweep.load(stores["one process"])
        t1 = statistics.median(walls["one process"])
        for name, procs, _ in configs:
            ds = sweep.load(stores[name])
            diff = max(
                float(
                    np.nanmax(
                        np.abs(np.asarray(ds[k].values, np.float64) - np.asarray(ref[k].values))
                    )
                )
                for k in ("collapse_gap", "energy")
            )
            t = statistics.median(walls[name])
            rows.append((name, procs, ds.attrs["chunks_total"], t, t / t1, diff))
    load1 = os.getloadavg()[0]
    lines = [
        f"Smoke sweep x {args.scale}: {spec.grid_size} points ({len(spec.n)} n x {len(spec.axes['beta'])} beta x "
        f"{len(spec.seeds)} seeds), `--memory {memory}` ({args.chunks} chunks per group on one device); "
        f"median of {args.repeats} run(s); load average {load0:.1f} -> {load1:.1f} on {os.cpu_count()} cores.",
        "",
        "| configuration | processes | chunks | wall (s) | / one process | overhead | max abs diff vs one process |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, procs, chunks, t, ratio, diff in rows:
        lines.append(
            f"| {name} | {procs} | {chunks} | {t:.1f} | {ratio:.2f} | {100 * (ratio - 1):+.0f}% | {diff:.1e} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
