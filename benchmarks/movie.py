"""``python -m benchmarks.movie [--frames F] [--n N] [--out FILE]``: wall time of
``mf.plotting.animate`` (the movie of ``meanfield simulate --movie``).

A run of ``N`` particles on S^2 (USA, beta = 4, saved at ``F`` times) is written as an mp4
(ffmpeg from the ``imageio-ffmpeg`` wheel) and as a GIF (Pillow); each row is the wall time of
``animate`` (cluster counts, drawing, encoding; the simulation excluded), the frames per second it
reached and the file size. The target (issue 30): 400 frames at n = 512 in under 30 s on the
2-core CPU. Prints a Markdown table (and writes it to ``--out``). Not a test: the numbers depend
on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.movie", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--frames", type=int, default=400)
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import jax
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")  # a script: no display
    import meanfield as mf
    from meanfield import plotting

    x0 = mf.sphere.uniform(jax.random.key(0), args.n, 3)
    traj = mf.simulate(
        mf.kernels.USA(4.0), x0, t1=20.0, dt=0.02, ts=np.linspace(0, 20, args.frames)
    )
    jax.block_until_ready(traj.xs)
    rows = [
        f"Command: `python -m benchmarks.movie --frames {args.frames} --n {args.n}` "
        f"({os.cpu_count()} CPUs; measured {time.strftime('%Y-%m-%d')}).",
        "",
        "| format | frames | n | d | wall time | frames / s | file size |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".mp4", ".gif"):
            path = Path(tmp) / f"movie{suffix}"
            t0 = time.perf_counter()
            plotting.animate(traj, path)
            wall = time.perf_counter() - t0
            rows.append(
                f"| {suffix[1:]} | {args.frames} | {args.n} | 3 | {wall:.1f} s | {args.frames / wall:.0f} | "
                f"{path.stat().st_size / 1e6:.1f} MB |"
            )
    text = "\n".join(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
