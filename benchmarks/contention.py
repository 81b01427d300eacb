"""``python -m benchmarks.contention [--repeats N] [--rounds R] [--busy K] [--out FILE]``: the native
exp-kernel field against its XLA path when other processes compete for the CPUs.

For each shape (seeds x n x d, float32, ``jax.jit(jax.vmap(lambda x: mf.velocity(USA(1.0), x)))``
as in ``benchmarks.cases``) and each condition (quiet; ``K`` busy background processes,
``python -c "while True: pass"``), the median time of: the native kernel with its default
adaptive threads (``_native.set_exp_threads()``: no more threads than idle CPUs at each call),
the native kernel with all its threads fixed (``adaptive=False``: the behaviour before issue 17),
the native kernel on one thread, and the XLA path (``backend="xla"``). The programs are timed in
alternating rounds (a change of load hits all of them alike); each entry is the median of all
``rounds x repeats`` calls after a warm-up. Prints a Markdown table (and writes it to ``--out``).
Not a test: the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

SHAPES = ((1, 2048, 3), (1, 4096, 16))


def _busy(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _fmt(t: float) -> str:
    return f"{t * 1e3:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.contention", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--repeats", type=int, default=15, help="calls per program and round (default 15)"
    )
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument(
        "--busy", type=int, default=2, help="busy background processes when loaded (default 2)"
    )
    p.add_argument("--out", help="also write the Markdown table to this file")
    args = p.parse_args(argv)

    import jax
    import numpy as np

    import meanfield as mf
    from meanfield import _native

    if not _native.exp_library().available:
        print(
            f"the native kernel is not available: {_native.exp_library().reason}", file=sys.stderr
        )
        return 1
    most = _native.exp_default_threads()
    kernel = mf.kernels.USA(1.0)
    native = jax.jit(jax.vmap(lambda x: mf.velocity(kernel, x, backend="native")))
    xla = jax.jit(jax.vmap(lambda x: mf.velocity(kernel, x, backend="xla")))
    modes = {
        "native, adaptive threads (default)": (native, dict(threads=most, adaptive=True)),
        f"native, {most} threads fixed (before)": (native, dict(threads=most, adaptive=False)),
        "native, 1 thread": (native, dict(threads=1, adaptive=False)),
        "XLA path": (xla, None),
    }
    inputs = {
        shape: jax.vmap(lambda k, s=shape: mf.sphere.uniform(k, s[1], s[2]))(
            jax.random.split(jax.random.key(shape[1] + shape[2]), shape[0])
        )
        for shape in SHAPES
    }
    for shape, x in inputs.items():  # the paths agree before they are timed
        diff = float(np.abs(np.asarray(native(x)) - np.asarray(xla(x))).max())
        assert diff < 1e-4, (shape, diff)

    rows = []
    for condition, k in (("quiet", 0), (f"{args.busy} busy processes", args.busy)):
        procs = _busy(k)
        try:
            time.sleep(1.0 if k else 0.0)
            load = os.getloadavg()[0]
            for shape, x in inputs.items():
                samples: dict[str, list[float]] = {m: [] for m in modes}
                now = []
                for _ in range(args.rounds):
                    for m, (fn, threads) in modes.items():
                        if threads is not None:
                            _native.set_exp_threads(**threads)
                        fn(x).block_until_ready()  # warm-up (and the compile, the first time)
                        if threads is not None and threads["adaptive"]:
                            now.append(_native.exp_threads_now(*shape))
                        for _ in range(args.repeats):
                            t0 = time.perf_counter()
                            fn(x).block_until_ready()
                            samples[m].append(time.perf_counter() - t0)
                _native.set_exp_threads()
                med = {m: float(np.median(ts)) for m, ts in samples.items()}
                first = next(iter(modes))
                rows.append(
                    [
                        condition,
                        f"{shape[0]} x {shape[1]} x {shape[2]}",
                        *(_fmt(med[m]) for m in modes),
                        f"{med['XLA path'] / med[first]:.2f}x",
                        f"{min(now)}-{max(now)}",
                        f"{load:.1f}",
                    ]
                )
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
        finally:
            _stop(procs)
    header = [
        "condition",
        "seeds x n x d",
        *modes,
        "XLA path / native (default)",
        "adaptive threads",
        "load avg (1 min)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
