# ruff: noqa: B023  (closures are called immediately inside each loop iteration)
"""``python -m benchmarks.attention_variants [--quick] [--repeats N] [--rounds R] [--baseline REV]
[--only PART ...] [--out FILE]``: the attention variants of ``mf.models.SelfAttention`` (issue 28) against a PyTorch
transcription of simuformer's head loop, float32.

Rows (beta = 1 for the velocities; systems vmapped):

1. multi-head velocity, 16 x 1024 x 8 (systems x n x d), 8 heads, ``weights="gaussian"``,
   ``value="gaussian"`` (``weight_seed=0``): ``jax.jit(jax.vmap(lambda x: mf.velocity(model, x)))``;
2. causal velocity (``mask=mf.masks.Causal()``), the same shape, 1 head (identity weights) and 8 heads
   (random weights as in 1);
3. one head, identity weights, no mask (the fast path of ``field``: one ``(n, n)`` softmax, as before
   the variants): the same program built from the meanfield of git ``--baseline`` (default
   ``b1b32b0``, the commit before the variants; ``git archive`` into a temporary directory) and
   from this working tree, each in fresh processes, alternately (at least 3 each, the smallest
   median): its optimised HLO is compared with ours (equal text, debug information removed = the
   same program);
4. a random-weight SA phase diagram: a (beta x systems) grid, the published step
   ``x <- normalize(x + h F)`` (``step="renormalize"``, Euler, simuformer's ``postln``):
   ``mf.phase_diagram.sa_phase_diagram(weights="gaussian", value="gaussian", heads=H, ...)`` where it
   has that parameter, and always the equivalent ``jax.jit`` of ``jax.vmap`` (betas) of ``jax.vmap``
   (systems) of ``mf.simulate(SelfAttention(beta, Q_s, K_s, V_s), x0_s, t1, dt, solver="euler",
   step="renormalize")`` with the diagram's per-system draw (``mf.phase_diagram.system_weights``;
   one shared draw where that does not exist); against a PyTorch loop of simuformer's step over the
   same grid and weights (a Python loop over beta, steps and heads, batched over systems).

The PyTorch reference is simuformer's ``SimuXForm.step`` (``simuxform.py``; its NumPy transcription
is ``tests/_reference_sims.py`` ``simuformer_field``/``simuformer_step``): per head
``SM = softmax(beta * (x BF_h x^T + mask))`` (the causal ``-inf`` above the diagonal added before
beta), ``A += SM @ (x @ V_h) / H``, with ``BF_h = Q_h^T K_h`` and ``V_h`` (simuformer's, acting on
the right of rows) the transpose of meanfield's, from the same draw (``model.weight_stacks``); for the
velocity rows it adds the tangent projection ``A - <x, A> x`` (what ``mf.velocity`` returns). Both
are checked against the float64 NumPy ``simuformer_field`` on one system before they are timed.

Times: medians of ``--repeats`` calls, the JAX programs (and the plain-JAX formula of the same
field, for scale) in ``--rounds`` alternating rounds (the smallest per-round median), compilation
(``jit(...).lower(x).compile()``) timed separately; torch with 1 thread and with all cores, the
faster reported. Minor page faults per call of the JAX programs (``cases.faults_per_call``: fresh
pages of large temporaries). Prints a Markdown section (and writes it to ``--out``). Without torch installed the
torch columns read "torch not installed" and the ratios are omitted. Not a test: the numbers depend
on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BETA = 1.0
SHAPE, QUICK_SHAPE = (16, 1024, 8), (4, 256, 8)
HEADS = 8
# the phase-diagram grid: (betas, systems, n, d, heads, t1, dt)
GRID = ((0.5, 2.0, 4.0, 8.0), 64, 32, 8, 8, 10.0, 0.1)
QUICK_GRID = ((1.0, 4.0), 16, 16, 4, 2, 2.0, 0.1)
BASELINE = "b1b32b0"
VELOCITY = ("heads", "causal1", "causal", "fast")  # the velocity rows (``--only``)

# times one SA velocity program of a given meanfield checkout in a fresh process (prints
# "compile <s> median <s> faults <per call>"; writes the velocities and the optimised HLO text)
_BASELINE_SCRIPT = r"""
import resource, sys, time
sys.path.insert(0, sys.argv[1])
import jax, numpy as np
import meanfield as mf
assert mf.__file__.startswith(sys.argv[1]), mf.__file__
S, n, d, reps, rounds = (int(a) for a in sys.argv[2:7])
x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(n + d), S))
f = jax.jit(jax.vmap(lambda y: mf.velocity(mf.models.SelfAttention(1.0), y)))
t0 = time.perf_counter(); c = f.lower(x).compile(); t_c = time.perf_counter() - t0
open(sys.argv[8], "w").write(c.as_text())
jax.block_until_ready(c(x))
best = float("inf")
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(rounds):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); jax.block_until_ready(c(x)); ts.append(time.perf_counter() - t0)
    best = min(best, float(np.median(ts)))
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / (reps * rounds)
np.save(sys.argv[7], np.asarray(c(x)))
print(f"compile {t_c} median {best} faults {faults}")
"""


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------
# the PyTorch transcription of simuformer's step (simuxform.py:268-331)
# ----------------------------------------------------------------------------


def torch_simuformer_field(x, BF, V, beta: float, causal: bool = False):
    """``A = (1/H) sum_h softmax(beta (x BF_h x^T + mask)) @ (x @ V_h)`` on ``(S, n, d)`` tensors;
    ``BF``, ``V``: ``(H, d, d)``, or ``(S, H, d, d)`` with one draw per system (simuformer's
    ``--noanneal 0``); simuformer's convention: ``V`` acts on the right of rows."""
    import torch

    H, n = BF.shape[-3], x.shape[-2]
    out = torch.zeros_like(x)
    mask = (
        torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype), diagonal=1) if causal else None
    )
    for h in range(H):
        sm = x @ BF[..., h, :, :] @ x.transpose(-1, -2)
        if mask is not None:
            sm = sm + mask
        sm = torch.softmax(sm * beta, dim=-1)
        out = out + (sm @ (x @ V[..., h, :, :])) / H
    return out


def torch_velocity(x, BF, V, beta: float, causal: bool = False):
    """``torch_simuformer_field`` projected on the tangent spaces (what ``mf.velocity`` returns)."""
    A = torch_simuformer_field(x, BF, V, beta, causal)
    return A - (A * x).sum(-1, keepdim=True) * x


def torch_postln_grid(x0, BF, V, betas, t1: float, dt: float):
    """simuformer's ``postln`` loop, ``x <- normalize(x + eta A)`` with ``eta = dt``, for each beta
    (a Python loop over betas, steps and heads, batched over systems); the final states ``(B, S, n, d)``."""
    import torch

    steps = round(t1 / dt)
    finals = []
    with torch.no_grad():
        for beta in betas:
            x = x0.clone()
            for _ in range(steps):
                A = torch_simuformer_field(x, BF, V, float(beta))
                x = torch.nn.functional.normalize(x + dt * A, dim=-1)
            finals.append(x)
    return torch.stack(finals)


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def _simuformer_weights(model, d: int):
    """``(BF, V_sim)`` as float32 ``(H, d, d)`` NumPy stacks from ``model.weight_stacks``:
    ``BF_h = Q_h^T K_h`` and simuformer's ``V_h`` = meanfield's ``V_h^T`` (identity for ``None``)."""
    import jax.numpy as jnp
    import numpy as np

    H = model.num_heads()
    Q, K, V = model.weight_stacks(d, jnp.float32)

    def stack(M):
        if M is None:
            return np.broadcast_to(np.eye(d, dtype=np.float32), (H, d, d))
        M = np.asarray(M, np.float32)
        return np.broadcast_to(M, (H, d, d)) if M.ndim == 2 else M

    Qs, Ks, Vs = stack(Q), stack(K), stack(V)
    BF = np.einsum("hki,hkj->hij", Qs.astype(np.float64), Ks.astype(np.float64))
    return BF.astype(np.float32), np.ascontiguousarray(np.swapaxes(Vs, 1, 2))


def _numpy_reference(x1, BF, V, beta: float, causal: bool):
    """float64 ``simuformer_field`` (tests/_reference_sims.py) of one system, projected; None
    when the tests directory is not importable (run from the repository root)."""
    import numpy as np

    try:
        from tests._reference_sims import simuformer_field
    except ImportError:
        return None
    x = np.asarray(x1, np.float64)
    A = simuformer_field(x, BF, V, beta, sequential=causal)
    return A - np.sum(A * x, -1, keepdims=True) * x


def _rel(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _plain_jax_velocity(BF, V, beta: float, causal: bool):
    """The same formula in plain JAX (one einsum per product, all heads at once), vmapped, jitted."""
    import jax
    import jax.numpy as jnp

    BF, V = jnp.asarray(BF), jnp.asarray(V)

    def one(x):
        n = x.shape[0]
        s = beta * jnp.einsum("id,hde,je->hij", x, BF, x)
        if causal:
            s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
        A = jnp.mean(jax.nn.softmax(s, axis=-1) @ jnp.einsum("jd,hde->hje", x, V), axis=0)
        return A - jnp.sum(A * x, -1, keepdims=True) * x

    return jax.jit(jax.vmap(one))


def _compile(fn, *args):
    t0 = time.perf_counter()
    c = fn.lower(*args).compile()
    return c, time.perf_counter() - t0


def _program_text(hlo: str) -> str:
    """Optimised HLO without its debug information (source file names, lines, stack frames and
    op metadata, which name the checkout): equal texts are the same program."""
    blocks = [
        b
        for b in hlo.split("\n\n")
        if b.split("\n", 1)[0].strip()
        not in ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
    ]
    text = "\n\n".join(blocks)
    return re.sub(r",? ?(metadata=\{[^}]*\}|stack_frame_id=\d+)", "", text)


def _fresh_sa(src: str, S: int, n: int, d: int, reps: int, rounds: int):
    """``(compile s, median s, optimised HLO text, velocities, page faults per call)`` of the identity-SA program of the
    meanfield package under ``src`` in a fresh process, or a string saying why not."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="mf-fresh-") as tmp:
        out, hlo = Path(tmp) / "v.npy", Path(tmp) / "hlo.txt"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        args = [src, S, n, d, reps, rounds, out, hlo]
        r = subprocess.run(
            [sys.executable, "-c", _BASELINE_SCRIPT, *map(str, args)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
        )
        if r.returncode != 0:
            return f"fresh run failed: {r.stderr.strip()[-300:]}"
        m = re.search(r"compile (\S+) median (\S+) faults (\S+)", r.stdout)
        if not m:
            return f"fresh run output not understood: {r.stdout[-200:]}"
        return (
            float(m.group(1)),
            float(m.group(2)),
            hlo.read_text(),
            np.load(out),
            float(m.group(3)),
        )


def _baseline(rev: str, S: int, n: int, d: int, reps: int, rounds: int, log):
    """The identity-SA program of meanfield at git ``rev`` (``git archive`` into a temporary
    directory: no change to the repository) and of this working tree, each in fresh processes,
    alternately (``max(rounds, 3)`` processes each, ``max(reps, 10)`` calls): ``(old, new)`` results of ``_fresh_sa`` with the
    smallest median of their processes, or a string saying why not."""
    with tempfile.TemporaryDirectory(prefix="mf-baseline-") as tmp:
        arch = subprocess.run(
            ["git", "archive", "--format=tar", rev, "meanfield"], cwd=ROOT, capture_output=True
        )
        if arch.returncode != 0:
            return f"git archive {rev} failed: {arch.stderr.decode().strip()[:200]}"
        subprocess.run(["tar", "-x", "-C", tmp], input=arch.stdout, check=True)
        best: dict = {}
        for r in range(max(rounds, 3)):
            for which, src in (("old", tmp), ("new", str(ROOT))):
                log(
                    f"fast path in a fresh process: {which} ({rev if which == 'old' else 'working tree'}), round {r + 1}"
                )
                res = _fresh_sa(src, S, n, d, max(reps, 10), 1)
                if isinstance(res, str):
                    return res
                if which not in best or res[1] < best[which][1]:
                    best[which] = res
        return best["old"], best["new"]


# ----------------------------------------------------------------------------
# the cases
# ----------------------------------------------------------------------------


def velocity_rows(
    shape, reps: int, rounds: int, baseline: str | None, log, only: tuple[str, ...] = VELOCITY
) -> tuple[list, list]:
    import jax
    import numpy as np

    import meanfield as mf

    from .cases import faults_per_call, fmt_r, fmt_t, timeit_interleaved, timeit_threads

    S, n, d = shape
    torch_ok = _have_torch()
    if torch_ok:
        import torch
    x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(n + d), S))
    xn = np.asarray(x)
    rand = {"weights": "gaussian", "value": "gaussian", "weight_seed": 0}
    cases = [
        (
            "heads",
            f"{HEADS} heads, gaussian Q, K, V",
            mf.models.SelfAttention(BETA, heads=HEADS, **rand),
            False,
        ),
        (
            "causal1",
            "causal, 1 head, identity weights",
            mf.models.SelfAttention(BETA, mask=mf.masks.Causal()),
            True,
        ),
        (
            "causal",
            f"causal, {HEADS} heads, gaussian Q, K, V",
            mf.models.SelfAttention(BETA, heads=HEADS, mask=mf.masks.Causal(), **rand),
            True,
        ),
        (
            "fast",
            "1 head, identity weights, no mask (fast path)",
            mf.models.SelfAttention(BETA),
            False,
        ),
    ]
    cases = [c[1:] for c in cases if c[0] in only]
    rows, notes = [], []
    for label, model, causal in cases:
        log(f"velocity: {label}")
        fast, t_compile = _compile(jax.jit(jax.vmap(lambda y: mf.velocity(model, y))), x)
        BF, Vs = _simuformer_weights(model, d)
        plain, _ = _compile(_plain_jax_velocity(BF, Vs, BETA, causal), x)
        v = np.asarray(fast(x))
        ref = _numpy_reference(xn[0], BF, Vs, BETA, causal)
        errs = {"meanfield": _rel(v[0], ref) if ref is not None else None}
        tj = timeit_interleaved({"mf": lambda: fast(x), "plain": lambda: plain(x)}, reps, rounds)
        faults = (faults_per_call(lambda: fast(x), 2), faults_per_call(lambda: plain(x), 2))
        if torch_ok:
            xt, BFt, Vt = (torch.from_numpy(np.array(a)) for a in (xn, BF, Vs))
            vt = torch_velocity(xt, BFt, Vt, BETA, causal).numpy()
            errs["torch"] = _rel(vt[0], ref) if ref is not None else None
            errs["torch vs meanfield"] = _rel(vt, v)
            with torch.no_grad():
                t_torch, k_torch = timeit_threads(
                    "torch", lambda: torch_velocity(xt, BFt, Vt, BETA, causal), reps
                )
            torch_cell, ratio = f"{fmt_t(t_torch)} ({k_torch} thr)", fmt_r(t_torch / tj["mf"])
        else:
            torch_cell, ratio = "torch not installed", "-"
        base_cell = "-"
        if baseline and label.endswith("(fast path)"):
            b = _baseline(baseline, S, n, d, reps, rounds, log)
            if isinstance(b, str):
                base_cell = b
            else:
                (o_compile, o_time, o_hlo, o_v, o_f), (n_compile, n_time, n_hlo, _, n_f) = b
                same = (
                    "the same optimised HLO"
                    if _program_text(o_hlo) == _program_text(n_hlo) == _program_text(fast.as_text())
                    else "**optimised HLO differs**"
                )
                base_cell = (
                    f"fresh processes: {fmt_t(o_time)} at {baseline} against {fmt_t(n_time)} now "
                    f"({fmt_r(o_time / n_time)}; compile {fmt_t(o_compile)}, {fmt_t(n_compile)}; "
                    f"page faults / call {o_f:.0f}, {n_f:.0f}); "
                    f"{same}; max |diff| {float(np.abs(o_v - v).max()):.1e}"
                )
        err_cell = ", ".join(f"{k} {e:.1e}" for k, e in errs.items() if e is not None) or "-"
        rows.append(
            [
                f"{S} x {n} x {d}, {label}",
                fmt_t(tj["mf"]),
                fmt_t(t_compile),
                fmt_t(tj["plain"]),
                torch_cell,
                ratio,
                fmt_r(tj["plain"] / tj["mf"]),
                f"{faults[0]:.0f}, {faults[1]:.0f}",
                base_cell,
                err_cell,
            ]
        )
    notes.append(
        "meanfield: `jax.jit(jax.vmap(lambda x: mf.velocity(model, x)))` with `model` the "
        "`mf.models.SelfAttention(1.0, ...)` of the row (random rows: `weights='gaussian', value='gaussian', "
        "weight_seed=0`, drawn inside the program); compile = `lower(x).compile()`, excluded from the time. "
        "plain JAX: the same field written directly (`einsum` logits of all heads, softmax, mean over heads, "
        "projection; the weights as constants). torch: simuformer's head loop (`SimuXForm.step`, a Python "
        "loop over heads, batched matmuls over systems, the causal `-inf` added before beta), plus the "
        "tangent projection; float32, the faster of 1 and all threads (thr). 'vs torch' = torch / meanfield, "
        "'vs plain JAX' = plain JAX / meanfield. Max rel diff: against the float64 NumPy `simuformer_field` "
        "(tests/_reference_sims.py) on system 0, projected; 'torch vs meanfield' on every system."
    )
    return rows, notes


def grid_rows(grid, reps: int, torch_reps: int, log) -> tuple[list, list]:
    import inspect

    import jax
    import jax.numpy as jnp
    import numpy as np

    import meanfield as mf
    from meanfield import phase_diagram as pd

    from .cases import fmt_r, fmt_t, timeit

    betas, S, n, d, H, t1, dt = grid
    torch_ok = _have_torch()
    x0 = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(7), S))
    x0n = np.asarray(x0)
    B = jnp.asarray(betas, jnp.float32)
    rand = {"weights": "gaussian", "value": "gaussian", "weight_seed": 0, "heads": H}
    per_system = hasattr(pd, "system_weights")
    if per_system:  # sa_phase_diagram's draw: system s from fold_in(key(weight_seed), s)
        qkv = pd.system_weights(np.arange(S), d, dtype=jnp.float32, **rand)
    else:  # one draw for the grid
        qkv = mf.models.SelfAttention(1.0, **rand).weight_stacks(d, jnp.float32)
    # (S, H, d, d) stacks
    Q, K, V = (jnp.broadcast_to(jnp.reshape(M, (-1, H, d, d)), (S, H, d, d)) for M in qkv)

    def run(B, x0, Q, K, V):
        def one(beta, x, q, k, v):
            model = mf.models.SelfAttention(beta, q, k, v)
            return mf.simulate(model, x, t1=t1, dt=dt, solver="euler", step="renormalize").xs[-1]

        per_beta = lambda b: jax.vmap(lambda *a: one(b, *a))(x0, Q, K, V)  # noqa: E731
        return jax.vmap(per_beta)(B)

    log(
        f"grid: {len(betas)} betas x {S} systems, n = {n}, d = {d}, {H} heads, {round(t1 / dt)} steps"
    )
    sim, t_compile = _compile(jax.jit(run), B, x0, Q, K, V)
    finals = np.asarray(sim(B, x0, Q, K, V))
    t_sim = timeit(lambda: sim(B, x0, Q, K, V), reps)[0]
    threshold = 0.9  # lower than the diagrams' 0.999: a check that sees the states move together

    def fraction(xs):  # (..., S, n, d) -> seed-mean clustering fraction per beta
        G = np.einsum("...id,...jd->...ij", xs, xs)
        off = ~np.eye(n, dtype=bool)
        return np.mean(np.sum((G > threshold) & off, axis=(-1, -2)) / (n * (n - 1)), axis=-1)

    c_mf = fraction(finals.astype(np.float64))
    shape = f"{len(betas)} beta x {S} systems, n = {n}, d = {d}, {H} heads, {round(t1 / dt)} Euler steps"
    rows = [
        [
            shape,
            "`jit(vmap(vmap(mf.simulate)))` of `SelfAttention(beta, Q_s, K_s, V_s)`, `solver='euler', step='renormalize'`",
            fmt_t(t_sim),
            fmt_t(t_compile),
            "1.00x",
            "-",
        ]
    ]
    notes = []
    if "weights" in inspect.signature(pd.sa_phase_diagram).parameters:
        kw = {"weights": "gaussian", "value": "gaussian", "heads": H}
        params = inspect.signature(pd.sa_phase_diagram).parameters
        kw = {k: v for k, v in kw.items() if k in params}
        call = lambda: pd.sa_phase_diagram(  # noqa: E731
            None,
            betas,
            x0=x0n,
            dt=dt,
            t1=t1,
            checkpoints=2,
            step="renormalize",
            threshold=threshold,
            dtype=np.float32,
            **kw,
        )
        t0 = time.perf_counter()
        frac = np.asarray(call())
        t_first = time.perf_counter() - t0
        t_pd = timeit(call, reps, warmup=0)[0]
        rows.append(
            [
                shape,
                f"`sa_phase_diagram({', '.join(f'{k}={v!r}' for k, v in kw.items())}, step='renormalize')`",
                fmt_t(t_pd),
                f"first call {fmt_t(t_first)}",
                fmt_r(t_pd / t_sim),
                f"final fraction max |diff| vs simulate {float(np.abs(frac[:, -1] - c_mf).max()):.1e}",
            ]
        )
    else:
        notes.append(
            "`mf.phase_diagram.sa_phase_diagram` has no `weights` parameter at this commit: only the "
            "equivalent `mf.simulate` program is timed."
        )
    if torch_ok:
        import torch

        from .cases import timeit_threads

        BF = np.einsum("shki,shkj->shij", np.asarray(Q, np.float64), np.asarray(K, np.float64))
        Vs = np.swapaxes(np.asarray(V), -1, -2)  # simuformer's V acts on the right of rows
        xt, BFt, Vt = (torch.from_numpy(np.ascontiguousarray(a, np.float32)) for a in (x0n, BF, Vs))
        ft = torch_postln_grid(xt, BFt, Vt, betas, t1, dt).numpy()
        t_torch, k = timeit_threads(
            "torch", lambda: torch_postln_grid(xt, BFt, Vt, betas, t1, dt), torch_reps
        )
        c_t = fraction(ft.astype(np.float64))
        rows.append(
            [
                shape,
                f"PyTorch loop of simuformer's `postln` step (loops over beta, steps, heads; {k} thr)",
                fmt_t(t_torch),
                "-",
                fmt_r(t_torch / t_sim),
                f"final states max |diff| vs simulate {float(np.abs(ft - finals).max()):.1e}; "
                f"fraction max |diff| {float(np.abs(c_t - c_mf).max()):.1e}",
            ]
        )
    else:
        rows.append([shape, "PyTorch loop", "torch not installed", "-", "-", "-"])
    notes.append(
        f"Grid: betas {list(betas)}, {S} systems from `mf.sphere.uniform` (the same for every beta and "
        f"program), float32, `weights='gaussian', value='gaussian', heads={H}, weight_seed=0` ("
        + (
            "system s draws its own weights, `mf.phase_diagram.system_weights`, the same for every beta: "
            "`sa_phase_diagram`'s draw and simuformer's `--noanneal 0`"
            if per_system
            else "one draw for the whole grid, simuformer's `--noanneal 2`"
        )
        + "), `t1 = "
        f"{t1:g}`, `dt = {dt:g}` (`x <- normalize(x + dt F)`; simuformer's `postln` with eta = dt, "
        "`--rawstep`). meanfield: one program for the grid (betas and systems vmapped), median of "
        f"{reps} after compilation; torch: median of {torch_reps} (after one run) at 1 and at all threads, the faster. The ratio column is time / meanfield's simulate "
        f"program. Final seed-mean fraction of pairs with <x_i, x_j> > {threshold:g} by beta (meanfield): "
        + ", ".join(f"{b:g}: {c:.3f}" for b, c in zip(betas, c_mf))
        + "."
    )
    return rows, notes


def _versions() -> str:
    import jax
    import jaxlib
    import numpy

    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    except OSError:
        rev = "?"
    try:
        import torch

        tv = f"torch {torch.__version__}"
    except ImportError:
        tv = "torch not installed"
    return (
        f"python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"numpy {numpy.__version__}, {tv}, meanfield at git {rev} (+ working tree); JAX backend "
        f"{jax.default_backend()}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.attention_variants", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small shapes ({'x'.join(map(str, QUICK_SHAPE))}, a 2 x 16 grid)",
    )
    p.add_argument("--repeats", type=int, default=5, help="calls per program and round (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument(
        "--baseline",
        default=BASELINE,
        help=f"git revision whose identity-SA program row 3 times (default {BASELINE}; '' skips it)",
    )
    p.add_argument(
        "--only",
        nargs="*",
        choices=(*VELOCITY, "grid"),
        default=(*VELOCITY, "grid"),
        help="parts to run: the velocity rows heads (8 heads), causal1, causal (8 heads), fast "
        "(identity, 1 head, against --baseline) and the grid (default: all)",
    )
    p.add_argument("--out", help="also write the Markdown section to this file")
    args = p.parse_args(argv)

    from .__main__ import _machine
    from .cases import Result

    t_start = time.perf_counter()
    load0 = os.getloadavg()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    results = []
    if set(args.only) & set(VELOCITY):
        shape = QUICK_SHAPE if args.quick else SHAPE
        rows, notes = velocity_rows(
            shape, args.repeats, args.rounds, args.baseline or None, log, tuple(args.only)
        )
        results.append(
            Result(
                "SelfAttention velocity, float32 (systems x n x d, vmapped over systems, beta = 1)",
                [
                    "case",
                    "meanfield",
                    "compile",
                    "plain JAX",
                    "torch (simuformer head loop)",
                    "vs torch",
                    "vs plain JAX",
                    "page faults / call (meanfield, plain JAX)",
                    "before the variants",
                    "max rel diff",
                ],
                rows,
                notes,
            )
        )
    if "grid" in args.only:
        grid = QUICK_GRID if args.quick else GRID
        rows, notes = grid_rows(grid, args.repeats, max(1, args.repeats // 2), log)
        results.append(
            Result(
                "Random-weight SA phase diagram (float32, the published step)",
                ["grid", "implementation", "time", "compile", "time / meanfield simulate", "check"],
                rows,
                notes,
            )
        )
    total = time.perf_counter() - t_start
    load1 = os.getloadavg()
    cmd = (
        "python -m benchmarks.attention_variants"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    )
    lines = [
        "## Attention variants (`python -m benchmarks.attention_variants`, issue 28)",
        "",
        f"Generated by `{cmd}` on {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC (total "
        f"{total / 60:.1f} min); load average {load0[0]:.1f} at the start and {load1[0]:.1f} at the end.",
        "",
        "- " + _machine()[0] + "; no GPU",
        "- " + _versions(),
        "",
    ]
    from .__main__ import _table

    for r in results:
        lines += _table(r)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
