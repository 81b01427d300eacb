"""``python -m benchmarks.normalization [--quick] [--repeats N] [--rounds R] [--out FILE]``: the
layer-norm schemes of ``mf.normalization`` (issue 29) at equal shape, against Post-LN and against a
PyTorch loop of simuformer's step, float32.

One run = ``STEPS`` Euler steps of ``dt = 0.1`` of ``SYSTEMS`` systems of ``n`` tokens in ``d``
dimensions, one head, identity weights, beta = 1, vmapped over systems:
``jax.jit(jax.vmap(lambda x: mf.simulate(SelfAttention(1.0, normalization=s), x, t1, dt=dt,
solver="euler", save_states=False).collapse_gap))`` for each scheme ``s`` (the radial schemes
integrate $x = r\\theta$ in $\\mathbb R^d$: their radius is one norm per token, so they should cost
what Post-LN costs, not another ``(n, n)`` pass). Post-LN is also run with ``step="renormalize"``,
simuformer's update ``x <- normalize(x + dt A)``.

The PyTorch reference is simuformer's ``SimuXForm.step`` for ``--norm postln, preln, periln, ngpt``
(one head, identity weights: ``A = softmax(beta x x^T) x``, batched over systems, a Python loop over
steps), with its own radius update for Pre-/Peri-LN (``r <- r + dt r 1^T A``: simuformer's, not the
paper's; the cost is the same); ``torch.no_grad``, the faster of 1 thread and all cores.

Times: medians of ``--repeats`` calls in ``--rounds`` alternating rounds (the smallest per-round median);
compilation timed separately. Prints a Markdown section (and writes it to ``--out``). Not a test.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE, QUICK_SHAPE = (16, 512, 8), (4, 128, 8)
STEPS, DT = 20, 0.1
SCHEMES = ("post", "pre", "mix", "peri", "ngpt", "scaling")
TORCH_MODES = {"post": "postln", "pre": "preln", "peri": "periln", "ngpt": "ngpt"}


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def torch_simuformer_run(x0, mode: str, beta: float, steps: int, dt: float, alpha: float = 0.2):
    """simuformer's ``step`` loop (one head, identity weights) on ``(S, n, d)`` tensors; the final
    directions."""
    import torch

    x = x0.clone()
    r = torch.ones(x.shape[:-1] + (1,), dtype=x.dtype)
    with torch.no_grad():
        for _ in range(steps):
            A = torch.softmax(beta * (x @ x.transpose(-1, -2)), dim=-1) @ x
            if mode == "postln":
                x = torch.nn.functional.normalize(x + dt * A, dim=-1)
            elif mode == "ngpt":
                a = A / (A.norm(dim=-1, keepdim=True) + 1e-9)
                x = torch.nn.functional.normalize(x + dt * alpha * a, dim=-1)
            elif mode == "preln":
                r = r + dt * r * A.sum(-1, keepdim=True)
                tangent = A - (A * x).sum(-1, keepdim=True) * x
                x = torch.nn.functional.normalize(x + dt * tangent / (r + 1e-9), dim=-1)
            else:  # periln
                a = A / (A.norm(dim=-1, keepdim=True) + 1e-9)
                r = r + dt * r * a.sum(-1, keepdim=True)
                x = torch.nn.functional.normalize(x + dt * a / (r + 1e-9), dim=-1)
    return x


def _median_best(fn, reps: int, rounds: int) -> float:
    import numpy as np

    best = float("inf")
    for _ in range(rounds):
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        best = min(best, float(np.median(ts)))
    return best


def rows(shape, reps: int, rounds: int, log) -> list[dict]:
    import jax
    import numpy as np

    import meanfield as mf

    S, n, d = shape
    t1 = STEPS * DT
    x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(7), S))
    programs = {}
    for scheme in SCHEMES:
        for step in ("projected", "renormalize") if scheme == "post" else ("projected",):
            model = mf.models.SelfAttention(1.0, normalization=scheme)

            def run(y, model=model, step=step):
                tr = mf.simulate(
                    model, y, t1=t1, dt=DT, solver="euler", step=step, save_states=False
                )
                return tr.collapse_gap

            f = jax.jit(jax.vmap(run))
            t0 = time.perf_counter()
            c = f.lower(x).compile()
            programs[(scheme, step)] = (c, time.perf_counter() - t0)
            jax.block_until_ready(c(x))
    times = {k: float("inf") for k in programs}
    for r in range(rounds):  # alternating rounds: every scheme under the same load
        log(f"meanfield round {r + 1}/{rounds}")
        for k, (c, _) in programs.items():
            times[k] = min(times[k], _median_best(lambda c=c: jax.block_until_ready(c(x)), reps, 1))
    torch_t: dict = {}
    if _have_torch():
        import torch

        xt = torch.from_numpy(np.asarray(x))
        for scheme, mode in TORCH_MODES.items():
            best = float("inf")
            for threads in sorted({1, torch.get_num_threads()}):
                torch.set_num_threads(threads)
                log(f"torch {mode}, {threads} thread(s)")
                torch_simuformer_run(xt, mode, 1.0, STEPS, DT)  # warm-up
                t = _median_best(
                    lambda mode=mode: torch_simuformer_run(xt, mode, 1.0, STEPS, DT), reps, rounds
                )
                if t < best:
                    best, torch_t[scheme] = t, (t, threads)
    base = times[("post", "projected")]
    out = []
    for (scheme, step), (_, compile_s) in programs.items():
        t = times[(scheme, step)]
        tt = (
            torch_t.get(scheme)
            if step == ("renormalize" if scheme == "post" else "projected")
            else None
        )
        out.append(
            dict(
                scheme=scheme,
                step=step,
                radius=scheme in mf.normalization.RADIAL,
                time=t,
                compile=compile_s,
                vs_post=t / base,
                torch=tt,
            )
        )
    return out


def _fmt(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.2f} s"


def section(shape, results: list[dict], args) -> str:
    import jax

    S, n, d = shape
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        rev = "?"
    try:
        import torch

        tv = torch.__version__
    except ImportError:
        tv = "not installed"
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Normalisation schemes (`python -m benchmarks.normalization`, issue 29)",
        "",
        f"Generated by `python -m benchmarks.normalization --repeats {args.repeats} --rounds {args.rounds}` on "
        f"{now}, meanfield at git {rev} (plus the working tree), python {platform.python_version()}, "
        f"jax {jax.__version__}, torch {tv}. {S} systems x n = {n} x d = {d}, one head, identity weights, "
        f"beta = 1, {STEPS} Euler steps of dt = {DT}, float32, vmapped over systems.",
        "",
        "| scheme | step | radius | meanfield | compile | vs Post-LN | torch (simuformer step loop) | vs torch |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r["torch"] is None:
            tcell, ratio = "", ""
        else:
            t, thr = r["torch"]
            tcell, ratio = f"{_fmt(t)} ({thr} thr)", f"{t / r['time']:.2f}x"
        lines.append(
            f"| {r['scheme']} | {r['step']} | {'yes' if r['radius'] else 'no'} | {_fmt(r['time'])} | "
            f"{_fmt(r['compile'])} | {r['vs_post']:.2f}x | {tcell} | {ratio} |"
        )
    lines += [
        "",
        "- meanfield: `jax.jit(jax.vmap(lambda x: mf.simulate(SelfAttention(1.0, normalization=s), x, "
        f"t1={STEPS * DT:g}, dt={DT}, solver='euler', step=..., save_states=False).collapse_gap))`; 'vs Post-LN' = "
        "time / the Post-LN projected row's (measured in alternating rounds).",
        "- torch: simuformer's `SimuXForm.step` for `--norm postln, preln, periln, ngpt` (one head, identity "
        "weights; its own Pre-/Peri-LN radius update `r += dt r 1^T A`), a Python loop over steps, batched over "
        "systems, `torch.no_grad`, the faster of 1 thread and all cores; 'vs torch' = torch / meanfield, "
        "against the row of the same update (Post-LN: `step='renormalize'`; the others: the projected Euler "
        "step, which is the same arithmetic up to the order of operations). Mix-LN and LN-scaling have no "
        "simuformer mode.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.normalization")
    p.add_argument("--quick", action="store_true", help=f"shape {QUICK_SHAPE} instead of {SHAPE}")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    shape = QUICK_SHAPE if args.quick else SHAPE

    def log(msg: str) -> None:
        print(f"[normalization] {msg}", file=sys.stderr, flush=True)

    text = section(shape, rows(shape, args.repeats, args.rounds, log), args)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
