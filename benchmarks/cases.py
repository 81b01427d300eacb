# ruff: noqa: B023  (closures are called immediately inside each loop iteration)
"""Benchmark cases: each returns a ``Result`` (table rows + notes) for BENCHMARKS.md.

Times are medians of several repeats after a warm-up call (compilation is timed
separately where it matters). Every fast path is checked against its reference
(max difference reported) before it is timed.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

import meanfield as mf
from meanfield import _native
from meanfield import phase_diagram as pd

from . import references as ref


@dataclass
class Result:
    title: str
    header: list[str]
    rows: list[list] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)


def _block(out):
    return jax.block_until_ready(out)


def timeit(fn, repeats: int = 5, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        _block(fn())
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _block(fn())
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), ts


def faults_per_call(fn, calls: int = 5) -> float:
    """Minor page faults of this process per call of ``fn()`` (fresh pages the allocator
    maps for large temporaries: each costs about a microsecond)."""
    _block(fn())
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        _block(fn())
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / calls


def timeit_interleaved(fns: dict, repeats: int = 7, rounds: int = 3) -> dict:
    """Median times of several functions measured in alternating rounds (each round
    ``repeats`` calls of each), so that a change of machine load hits all of them alike;
    the result is the smallest per-round median."""
    for fn in fns.values():
        _block(fn())
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            best[k] = min(best[k], timeit(fn, repeats, warmup=0)[0])
    return best


THREADS = sorted({1, os.cpu_count() or 1})


def timeit_threads(lib: str, fn, repeats: int) -> tuple[float, int]:
    """Median time of a reference at its faster thread count (1 or all cores): OpenMP/BLAS
    thread pools degrade badly when the cores are shared, so both are tried."""
    best = (float("inf"), 1)
    for k in THREADS:
        restore = ref.set_threads(lib, k)
        try:
            t, _ = timeit(fn, repeats)
        finally:
            restore()
        best = min(best, (t, k))
    return best


def pick_torch_threads(fn) -> int:
    """Set torch to its faster thread count for ``fn`` (a short prefix of the real run)."""
    import torch

    best = (float("inf"), 1)
    for k in THREADS:
        torch.set_num_threads(k)
        t, _ = timeit(fn, 2)
        best = min(best, (t, k))
    torch.set_num_threads(best[1])
    return best[1]


def fmt_t(t: float) -> str:
    if t >= 1.0:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_r(r: float) -> str:
    return f"{r:.2f}x"


# ----------------------------------------------------------------------------
# machine limits: exp throughput and GEMM rate
# ----------------------------------------------------------------------------


def machine_limits(quick: bool, log) -> Result:
    """Measured float32/float64 ``exp`` throughput (fused exp + sum) and GEMM rate (jnp.dot)."""
    res = Result("Machine limits (measured in this run)", ["quantity", "float32", "float64"])
    m = 2**22 if quick else 2**24
    g = 512 if quick else 1536
    reps = 3 if quick else 7
    limits = {}
    with jax.enable_x64(True):
        for dt in (jnp.float32, jnp.float64):
            a = jax.random.uniform(jax.random.key(0), (m,), dt, -1.0, 1.0)
            f = jax.jit(lambda a: jnp.sum(jnp.exp(a)))
            t = min(timeit(lambda: f(a), reps)[1])
            limits[("exp", jnp.dtype(dt).name)] = m / t
            A = jax.random.normal(jax.random.key(1), (g, g), dt)
            B = jax.random.normal(jax.random.key(2), (g, g), dt)
            h = jax.jit(jnp.dot)
            t = min(timeit(lambda: h(A, B), reps)[1])
            limits[("gemm", jnp.dtype(dt).name)] = 2 * g**3 / t
    log(f"limits: {limits}")
    res.rows.append(
        ["exp throughput (exp/s)"] + [f"{limits[('exp', k)]:.3g}" for k in ("float32", "float64")]
    )
    res.rows.append(
        ["GEMM rate (flop/s)"] + [f"{limits[('gemm', k)]:.3g}" for k in ("float32", "float64")]
    )
    res.notes.append(
        f"exp: `jnp.sum(jnp.exp(a))` on {m} uniform(-1, 1) values (exp and reduction fused); "
        f"GEMM: `jnp.dot` of two {g} x {g} matrices, 2 g^3 flops. Best of {reps} (the machine's capability; medians would measure the other jobs)."
    )
    res.data = {f"{k}_{d}": v for (k, d), v in limits.items()}
    return res


def _fractions(pairs_per_s, d, limits, dtype="float32"):
    """Achieved pair rate as a fraction of the exp throughput (1 exp per pair) and of the
    GEMM-bound pair rate (4 d flops per pair: Gram entry and weighted sum)."""
    exp_rate = limits[f"exp_{dtype}"]
    gemm_pairs = limits[f"gemm_{dtype}"] / (4 * d)
    return pairs_per_s / exp_rate, pairs_per_s / gemm_pairs


# ----------------------------------------------------------------------------
# USA velocity against NumPy, plain JAX, torch
# ----------------------------------------------------------------------------


_FRESH_VELOCITY = r"""
import json, resource, sys, time
import jax, numpy as np
import meanfield as mf
from benchmarks import references as ref
S, n, d, which = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(n + d), S))
if which in ("meanfield", "xla"):
    backend = "auto" if which == "meanfield" else "xla"  # meanfield's default, or its XLA path
    f = jax.jit(jax.vmap(lambda x: mf.velocity(mf.kernels.USA(1.0), x, backend=backend)))
    call = lambda: f(x)
else:
    g = ref.usa_velocity_jax()
    call = lambda: g(x, 1.0)
call().block_until_ready()
ts = []
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(int(sys.argv[5])):
    t0 = time.perf_counter(); call().block_until_ready(); ts.append(time.perf_counter() - t0)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / len(ts)
print(json.dumps(dict(t=float(np.median(ts)), faults=faults)))
"""


def _fresh_velocity(S, n, d, which, reps) -> dict:
    """Median time of a vmapped USA velocity in a fresh Python process (fresh allocator state)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", _FRESH_VELOCITY, str(S), str(n), str(d), which, str(reps)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def usa_velocity(quick: bool, log, limits) -> Result:
    import torch

    shapes = [(100, 256, 3), (16, 1024, 8), (1, 4096, 16)]
    if quick:
        shapes = [(10, 128, 3), (4, 256, 8), (1, 512, 16)]
    reps = 3 if quick else 7
    beta = 1.0
    res = Result(
        "USA velocity, float32 (seeds x n x d, vmapped over seeds)",
        [
            "seeds x n x d",
            "meanfield",
            "meanfield, XLA path",
            "plain JAX",
            "NumPy",
            "torch",
            "vs NumPy",
            "vs plain JAX",
            "vs torch",
            "vs its XLA path",
            "page faults / call (meanfield, plain JAX)",
            "fresh process: meanfield, plain JAX (faults / call)",
            "pairs/s",
            "of exp rate",
            "of GEMM-bound rate",
            "max rel diff",
        ],
    )
    kernel = mf.kernels.USA(beta)
    fast = jax.jit(jax.vmap(lambda x: mf.velocity(kernel, x)))
    fast_xla = jax.jit(
        jax.vmap(lambda x: mf.velocity(kernel, x, backend="xla"))
    )  # the XLA formulation
    plain = ref.usa_velocity_jax()
    for S, n, d in shapes:
        x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(
            jax.random.split(jax.random.key(n + d), S)
        )
        xn = np.asarray(x)
        xt = torch.from_numpy(xn.copy())
        v_ref = ref.usa_velocity_numpy(xn.astype(np.float64), beta)
        v_fast = np.asarray(fast(x))
        v_xla = np.asarray(fast_xla(x))
        err = float(np.abs(v_fast - v_ref).max() / np.abs(v_ref).max())
        err_xla = float(np.abs(v_xla - v_ref).max() / np.abs(v_ref).max())
        tj = timeit_interleaved(
            {"fast": lambda: fast(x), "xla": lambda: fast_xla(x), "plain": lambda: plain(x, beta)},
            reps,
        )
        t_fast, t_xla, t_plain = tj["fast"], tj["xla"], tj["plain"]
        pf = (faults_per_call(lambda: fast(x)), faults_per_call(lambda: plain(x, beta)))
        fresh = {w: _fresh_velocity(S, n, d, w, reps) for w in ("meanfield", "plain")}
        t_np, k_np = timeit_threads("numpy", lambda: ref.usa_velocity_numpy(xn, beta), reps)
        t_torch, k_torch = timeit_threads("torch", lambda: ref.usa_velocity_torch(xt, beta), reps)
        rate = S * n * n / t_fast
        fe, fg = _fractions(rate, d, limits)
        res.rows.append(
            [
                f"{S} x {n} x {d}",
                fmt_t(t_fast),
                fmt_t(t_xla),
                fmt_t(t_plain),
                f"{fmt_t(t_np)} ({k_np} thr)",
                f"{fmt_t(t_torch)} ({k_torch} thr)",
                fmt_r(t_np / t_fast),
                fmt_r(t_plain / t_fast),
                fmt_r(t_torch / t_fast),
                fmt_r(t_xla / t_fast),
                f"{pf[0]:.0f}, {pf[1]:.0f}",
                f"{fmt_t(fresh['meanfield']['t'])}, {fmt_t(fresh['plain']['t'])} "
                f"({fresh['meanfield']['faults']:.0f}, {fresh['plain']['faults']:.0f})",
                f"{rate:.3g}",
                f"{fe:.0%}",
                f"{fg:.0%}",
                f"{err:.1e} ({err_xla:.1e})",
            ]
        )
        res.data[f"{S}x{n}x{d}"] = dict(
            fast=t_fast,
            xla=t_xla,
            plain=t_plain,
            numpy=t_np,
            torch=t_torch,
            err=err,
            faults=pf,
            fresh=fresh,
        )
        log(
            f"usa velocity {S}x{n}x{d}: fast {fmt_t(t_fast)} xla path {fmt_t(t_xla)} plain {fmt_t(t_plain)} "
            f"numpy {fmt_t(t_np)} torch {fmt_t(t_torch)} faults {pf}"
        )
    res.notes.append(
        "meanfield: `jax.jit(jax.vmap(lambda x: mf.velocity(mf.kernels.USA(1.0), x)))`, its default "
        "path on the CPU: the fused C kernel called through XLA's FFI (`meanfield/_native/exp_kernel.c`: "
        "the n (n + 1) / 2 exponentials of the pairs i <= j, rows 4 at a time against SIMD vectors of "
        "columns, no n x n array; threads over seeds). 'meanfield, XLA path': the same program traced "
        'with `backend="xla"` (the reference formulation, and the path on accelerators): '
        "dense for n <= 1024, else the 512 x 1024 tiles of `kernels._exp._tiled_exp`; under the vmap the "
        f"seeds run in equal chunks of at most `kernels.BATCH_BYTES` = {mf.kernels.BATCH_BYTES // 2**20} "
        "MiB of weights (`kernels._exp._exp_op`, a custom batching rule). plain JAX: `P_x exp(beta X X^T) X / n` "
        "vmapped and jitted (the same operations on one `(seeds, n, n)` array). The three JAX programs are "
        "timed in alternating rounds. NumPy and torch: batched matmuls, float32, each timed with 1 thread "
        "and with all cores and reported at the faster setting (thr). `max rel diff`: meanfield (its XLA "
        "path in brackets) against the float64 NumPy result. `pairs/s` counts the n^2 pairs of each "
        "system per second of meanfield's time: the native kernel evaluates n (n + 1) / 2 exponentials "
        "for them, so its pair rate can exceed the machine's exp rate."
    )
    res.notes.append(
        "Page faults: a temporary larger than the allocator's mmap threshold (32 MiB in glibc) is "
        "mapped afresh on every call, and each new page faults (~1 us per 4 KiB page). A plain vmap at "
        "16 x 1024 x 8 forms 64 MiB weight arrays: in some processes the allocator recycles them (no "
        "faults, the plain and chunked programs then run the same operations at the same speed), in "
        "others it does not (measured 30 ms instead of 4 ms per call). The native kernel allocates "
        "O(n d) per thread; the chunked XLA path never more than `BATCH_BYTES` at once. The 'fresh process' column times each program "
        "alone in a new Python process (what a script or a new notebook kernel sees)."
    )
    return res


def gauge_overhead(quick: bool, log) -> Result:
    shapes = [(100, 256, 3), (16, 1024, 8)] if not quick else [(10, 128, 3), (4, 256, 8)]
    reps = 3 if quick else 7
    res = Result(
        "Exp-gauge kernels against USA at equal n, d (float32, vmapped over seeds)",
        [
            "seeds x n x d",
            "USA",
            "RoPE",
            "Prompt (K=3)",
            "RoPE / USA",
            "Prompt / USA",
            "max diff vs pairwise",
        ],
    )
    for S, n, d in shapes:
        x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(7), S))
        models = {
            "usa": mf.kernels.USA(1.0),
            "rope": mf.kernels.RoPE(1.0, 2 * np.pi),
            "prompt": mf.kernels.Prompt(1.0, mf.kernels.random_gauges(jax.random.key(3), 3, d)),
        }
        fns = {
            name: jax.jit(jax.vmap(lambda x, k=k: mf.velocity(k, x))) for name, k in models.items()
        }
        times = timeit_interleaved({name: (lambda f=f: f(x)) for name, f in fns.items()}, reps)
        # fast gauge path against the single-pair reference on the first seed (small n only)
        m = min(n, 256)
        err = 0.0
        for name in ("rope", "prompt"):
            k = models[name]
            a = mf.velocity(k, x[0, :m])
            b = mf.velocity(k, x[0, :m], method="pairwise")
            err = max(err, float(jnp.abs(a - b).max()))
        res.rows.append(
            [
                f"{S} x {n} x {d}",
                fmt_t(times["usa"]),
                fmt_t(times["rope"]),
                fmt_t(times["prompt"]),
                fmt_r(times["rope"] / times["usa"]),
                fmt_r(times["prompt"] / times["usa"]),
                f"{err:.1e}",
            ]
        )
        log(f"gauge {S}x{n}x{d}: {times}")
        res.data[f"{S}x{n}x{d}"] = times
    res.notes.append(
        "RoPE and Prompt evaluate `Psi_i^T usa_field(Psi x)_i` (O(n^2 d)): the native kernel applies "
        "the gauge matrices `Psi_i` (computed by XLA, shared by the batch) when it loads a system "
        "(`y_i = Psi_i x_i`) and when it writes the field (`Psi_i^T`), O(n d^2) against its O(n^2 d); "
        "as separate XLA fusions the transforms cost 1.2-1.3x the USA time. The XLA path applies them "
        "as sums of d broadcast products (fused; a batched einsum of d x d matrices per particle was "
        "2-8x slower on XLA:CPU). Timed in "
        "alternating rounds with USA. The last column compares with `method='pairwise'` (a d x d "
        "rotation per pair) on one seed."
    )
    return res


# ----------------------------------------------------------------------------
# n = 2^17 velocity: tiled, peak memory in a subprocess
# ----------------------------------------------------------------------------

_BIG_SCRIPT = r"""
import json, resource, sys, time
import jax, jax.numpy as jnp
import meanfield as mf
n, d, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
x = mf.sphere.uniform(jax.random.key(0), n, d)
f = jax.jit(lambda x: mf.velocity(mf.kernels.USA(1.0), x, backend="native" if mode == "native" else "xla"))
t0 = time.perf_counter(); v = f(x).block_until_ready(); t_first = time.perf_counter() - t0
t0 = time.perf_counter(); v = f(x).block_until_ready(); t_run = time.perf_counter() - t0
tangent = float(jnp.abs(jnp.sum(v * x, -1)).max())
# spot check 64 rows against the dense formula
i = jnp.arange(64) * (n // 64)
W = jnp.exp(x[i] @ x.T)
F = W @ x / n
vr = F - jnp.sum(F * x[i], -1, keepdims=True) * x[i]
err = float(jnp.abs(vr - v[i]).max() / jnp.abs(vr).max())
# VmHWM: this process's own peak (Linux keeps ru_maxrss across exec, so a subprocess started
# from a large benchmark process would report the parent's size)
try:
    peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except (OSError, StopIteration):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(dict(n=n, d=d, t_first=t_first, t_run=t_run, peak_bytes=peak, tangent=tangent, err=err)))
"""


def big_n(quick: bool, log) -> Result:
    n, d = (2**15, 3) if quick else (2**17, 3)
    res = Result(
        f"Velocity at n = {n}, d = {d} (float32, tiled; each in a fresh subprocess)",
        [
            "implementation",
            "first call (compile + run)",
            "second call",
            "pairs/s",
            "peak RSS",
            "n x n matrix would be",
            "rel err (64 rows)",
        ],
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for mode, label in [
        ("native", "`mf.velocity` (default: the fused C kernel, rows split over threads)"),
        ("xla", "`mf.velocity`, XLA path (512 x 1024 tiles of `kernels._exp._tiled_exp`)"),
    ]:
        out = subprocess.run(
            [sys.executable, "-c", _BIG_SCRIPT, str(n), str(d), mode],
            capture_output=True,
            text=True,
            timeout=1500,
            cwd=root,
        )
        if out.returncode != 0:
            last = [ln for ln in out.stderr.strip().splitlines() if ln.strip()][-3:]
            res.rows.append([label, "FAILED", "-", "-", "-", "-", "-"])
            res.notes.append(f"{mode} FAILED: `{' / '.join(ln.strip() for ln in last)[:600]}`")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        res.rows.append(
            [
                label,
                fmt_t(r["t_first"]),
                fmt_t(r["t_run"]),
                f"{n * n / r['t_run']:.3g}",
                f"{r['peak_bytes'] / 2**30:.2f} GiB",
                f"{n * n * 4 / 2**30:.0f} GiB",
                f"{r['err']:.1e}",
            ]
        )
        res.data[mode] = r
        log(f"big n {mode}: {r}")
    res.notes.append(
        "`mf.velocity(mf.kernels.USA(1.0), x)` under jit. Native: memory O(n d) per thread. XLA path "
        f'(`backend="xla"`): row tiles of '
        f"`mf.kernels.DEFAULT_BLOCK` = {mf.kernels.DEFAULT_BLOCK} (lax.map) accumulated over column "
        f"tiles twice as wide (lax.scan), memory O(n d + block^2). Peak RSS = `VmHWM` of the subprocess (its own high-water mark, which includes the Python/JAX "
        f"runtime, about 0.3 GiB)."
    )
    return res


# ----------------------------------------------------------------------------
# phase diagrams
# ----------------------------------------------------------------------------


def _x0_64(S, n, d, seed=0):
    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.key(seed), S)
        return np.asarray(jax.vmap(lambda k: mf.sphere.uniform(k, n, d, jnp.float64))(keys))


def sa_sweep(quick: bool, log, limits=None) -> Result:
    import torch

    S, B = (256, 4) if quick else (2048, 20)
    n, d, dt, t1, C, thr = 32, 2, 0.1, 10.0, 200, 0.999
    betas = np.linspace(0.1, 9.0, B)
    N, h, idx = pd.checkpoint_steps(t1, dt, C)
    Nq, hq, idxq = pd.published_checkpoint_steps(t1, dt, C)  # the published code's time grid
    x0 = _x0_64(S, n, d)
    reps = 1 if quick else 3
    torch_betas = [0, B - 1]  # the torch reference costs the same for every beta (fixed steps)
    res = Result(
        f"SA phase diagram: n = {n}, d = {d}, {S} seeds x {B} beta in [0.1, 9], Euler dt = {dt} "
        f"to t = {t1:g} ({N} steps), {C} checkpoints, float64",
        [
            "implementation",
            "time (full sweep)",
            "meanfield is faster by",
            "max |diff| of per-seed fraction vs meanfield",
            "note",
        ],
    )
    with jax.enable_x64(True):
        x0j = jnp.asarray(x0)

        def fast(packed=False, seed_chunk=None, backend="auto"):
            return pd.sa_phase_diagram(
                None,
                betas,
                x0=x0j,
                dt=dt,
                t1=t1,
                checkpoints=C,
                threshold=thr,
                per_seed=True,
                packed=packed,
                seed_chunk=seed_chunk,
                backend=backend,
            ).per_seed

        backend = pd._resolve_backend("auto", x0j, False)
        t0 = time.perf_counter()
        mine = fast()
        t_first = time.perf_counter() - t0
        t_fast, ts = timeit(fast, reps, warmup=0)
        threads = _native.default_threads()
        old_omp = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            t_one, _ = timeit(fast, 1, warmup=0) if backend == "native" else (float("nan"), None)
        finally:
            if old_omp is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = old_omp
        xla = lambda **kw: fast(backend="xla", **kw)  # noqa: E731
        t_xla, _ = timeit(xla, reps, warmup=1)
        xla_diff = float(np.abs(xla() - mine).max())
        t_packed, _ = timeit(lambda: xla(packed=True), 1, warmup=1)
        packed_diff = float(np.abs(xla(packed=True) - mine).max())
        t_256, _ = timeit(lambda: xla(seed_chunk=256), 1, warmup=1)
        saved = pd._run_one_beta_cpu["fn"]
        pd._run_one_beta_cpu["fn"] = None  # XLA's default fusion choices
        try:
            t_default, _ = timeit(xla, 1, warmup=1)
            default_diff = float(np.abs(xla() - mine).max())
        finally:
            pd._run_one_beta_cpu["fn"] = saved
        log(
            f"SA fast ({backend}) {ts}, 1 thread {t_one}, xla {t_xla}, packed {t_packed}, chunk 256 {t_256}, "
            f"default fusions {t_default}"
        )
        t0 = time.perf_counter()
        plain = ref.phase_diagram_jax_plain(x0j, betas, [h] * B, [N] * B, [idx] * B, threshold=thr)
        t_plain = time.perf_counter() - t0  # includes its single compile
        plain_diff = float(np.abs(plain - mine).max())
        log(f"SA plain jax {t_plain:.2f}")

        def published():  # the published update and time grid (XLA kernel: backend="auto" picks it)
            return pd.sa_phase_diagram(
                None,
                betas,
                x0=x0j,
                dt=dt,
                t1=t1,
                checkpoints=C,
                threshold=thr,
                per_seed=True,
                step="renormalize",
                schedule="published",
            ).per_seed

        t_pub, _ = timeit(published, 1, warmup=1)
        pub = published()
        pub_gap = np.abs(
            pub.mean(1) - mine.mean(1)
        )  # seed-mean fraction: published vs projected default
        log(
            f"SA published step {t_pub:.2f}, vs projected max {pub_gap.max():.3f} mean {pub_gap.mean():.4f}"
        )
    # float32 (JAX's default dtype): the same sweep through both kernels
    x0f = jnp.asarray(x0, jnp.float32)

    def f32(backend):
        return pd.sa_phase_diagram(
            None,
            betas,
            x0=x0f,
            dt=dt,
            t1=t1,
            checkpoints=C,
            threshold=thr,
            per_seed=True,
            backend=backend,
        ).per_seed

    t_f32 = {be: timeit(lambda be=be: f32(be), 1, warmup=1)[0] for be in ("auto", "xla")}
    f32_diff = float(np.abs(f32("auto") - mine).mean())
    log(f"SA float32 {t_f32}")
    xt = torch.from_numpy(x0.copy())
    tb = [betas[i] for i in torch_betas]
    k_t = pick_torch_threads(
        lambda: ref.phase_diagram_torch(xt, tb[-1:], [h], [5], [np.minimum(idx, 5)], threshold=thr)
    )
    t_torch_k = {}
    for k in [k_t] + [k for k in THREADS if k != k_t]:  # the faster setting first, then the others
        torch.set_num_threads(k)
        t0 = time.perf_counter()
        tr = ref.phase_diagram_torch(xt, tb, [hq] * 2, [Nq] * 2, [idxq] * 2, threshold=thr)
        t_torch_k[k] = time.perf_counter() - t0
        if k == k_t:
            torch_diff = float(np.abs(tr - pub[torch_betas]).max())
        log(f"SA torch ({k} threads) {t_torch_k[k]:.2f} s for {len(tb)} betas")
    torch.set_num_threads(k_t)
    k_t = min(t_torch_k, key=t_torch_k.get)  # the faster over the whole 2-beta run
    t_torch_part = t_torch_k[k_t]
    t_torch = t_torch_part * B / len(tb)
    chunk = min(pd._auto_chunk(n, np.float64), S)
    native_rows = (
        [
            [
                f"meanfield `sa_phase_diagram` (default: `backend='{backend}'`, fused C kernel, {threads} threads)",
                fmt_t(t_fast),
                "1.00x",
                "0",
                f"median of {reps}; first call {fmt_t(t_first)} (incl. loading or building the kernel)",
            ],
            [
                "meanfield, native kernel on 1 thread (`OMP_NUM_THREADS=1`)",
                fmt_t(t_one),
                fmt_r(t_one / t_fast),
                "0",
                "one run; compare with PyTorch on 1 thread",
            ],
        ]
        if backend == "native"
        else [
            [
                f"meanfield `sa_phase_diagram` (default: `backend='{backend}'`)",
                fmt_t(t_fast),
                "1.00x",
                "0",
                f"median of {reps}; first call incl. compile {fmt_t(t_first)}; the native kernel did not build: "
                f"{_native.phase_library().reason}",
            ],
        ]
    )
    res.rows += native_rows + [
        [
            f"meanfield, `backend='xla'` (XLA kernel, automatic seed chunks of {chunk})",
            fmt_t(t_xla),
            fmt_r(t_xla / t_fast),
            f"{xla_diff:.1e}",
            f"median of {reps}",
        ],
        [
            f"meanfield in float32 (`backend='{pd._resolve_backend('auto', x0f, False)}'`)",
            fmt_t(t_f32["auto"]),
            fmt_r(t_f32["auto"] / t_fast),
            f"mean {f32_diff:.1e}",
            "one run; float32 differs from float64 at pairs near the threshold (mean |diff| over all entries)",
        ],
        [
            "meanfield in float32, `backend='xla'`",
            fmt_t(t_f32["xla"]),
            fmt_r(t_f32["xla"] / t_fast),
            "-",
            "one run",
        ],
        [
            "meanfield, `backend='xla'`, seed chunks of 256",
            fmt_t(t_256),
            fmt_r(t_256 / t_fast),
            "-",
            "one run; 256 seeds keep one core busy",
        ],
        [
            "meanfield, `backend='xla'`, XLA:CPU's default fusions (no `CPU_COMPILER_OPTIONS`)",
            fmt_t(t_default),
            fmt_r(t_default / t_fast),
            f"{default_diff:.1e}",
            "one run",
        ],
        [
            "meanfield, `backend='xla'`, `packed=True` (half the exponentials)",
            fmt_t(t_packed),
            fmt_r(t_packed / t_fast),
            f"{packed_diff:.1e}",
            "RFP-packed symmetric kernel; one run",
        ],
        [
            "plain JAX port (vmap seeds, scan steps, full exp)",
            fmt_t(t_plain),
            fmt_r(t_plain / t_fast),
            f"{plain_diff:.1e}",
            "one run incl. its compile",
        ],
        [
            "meanfield, `step='renormalize'`, `schedule='published'` (the published update and time grid; "
            "XLA kernel)",
            fmt_t(t_pub),
            fmt_r(t_pub / t_fast),
            "-",
            f"one run; {Nq} steps; seed-mean fraction vs the projected default: max |diff| {pub_gap.max():.3f}, "
            f"mean {pub_gap.mean():.4f} (two consistent discretisations, O(h^2) apart per step)",
        ],
        [
            "PyTorch: our re-implementation of the published loop, with the published step "
            "(loop beta/steps, bmm, softmax, x + h F then normalise, mask)",
            fmt_t(t_torch),
            fmt_r(t_torch / t_fast),
            f"{torch_diff:.1e}",
            f"diff vs meanfield `step='renormalize'`, `schedule='published'`; measured on {len(tb)} of {B} betas "
            f"({fmt_t(t_torch_part)}), x{B / len(tb):g} (cost is the same for every beta); torch threads {k_t}, "
            f"the faster of {THREADS}",
        ],
    ]
    for k, tk in t_torch_k.items():
        if k != k_t:
            res.rows.append(
                [
                    f"PyTorch re-implementation of the published loop, {k} thread{'s' if k > 1 else ''}",
                    fmt_t(tk * B / len(tb)),
                    fmt_r(tk * B / len(tb) / t_fast),
                    "-",
                    f"measured on {len(tb)} betas, x{B / len(tb):g}",
                ]
            )
    res.data = dict(
        fast=t_fast,
        backend=backend,
        one_thread=t_one,
        xla=t_xla,
        float32=t_f32,
        packed=t_packed,
        plain=t_plain,
        torch=t_torch,
        torch_part=t_torch_part,
        published=t_pub,
        published_vs_projected=dict(max=float(pub_gap.max()), mean=float(pub_gap.mean())),
        torch_by_threads=t_torch_k,
        chunk256=t_256,
        default_fusions=t_default,
        diffs=dict(xla=xla_diff, packed=packed_diff, plain=plain_diff, torch=torch_diff),
        final_fraction=mine.mean(1)[:, -1].tolist(),
        betas=betas.tolist(),
    )
    pairs = S * B * N * n * n
    exps = S * B * N * n * (n + 1) // 2  # the native kernel: pairs i < j and the diagonal
    res.notes.append(
        f"Pair interactions: {pairs:.3g} ({pairs / t_fast:.3g} pairs/s for meanfield, "
        f"{pairs / t_xla:.3g} with the XLA kernel"
        + (
            f"; the XLA kernel evaluates one exponential per pair: {pairs / t_xla / limits['exp_float64']:.0%} of "
            f"the measured float64 exp throughput; 10x the PyTorch re-implementation of the published loop would need "
            f"{10 * pairs / t_torch:.3g} pairs/s, {10 * pairs / t_torch / limits['exp_float64']:.0%} of it, "
            f"at one exponential per pair. The native kernel evaluates n (n + 1) / 2 per system and step "
            f"({exps:.3g} in all): {exps / t_fast:.3g} exp/s, {exps / t_fast / limits['exp_float64']:.0%} of "
            f"XLA's measured float64 exp throughput, with the rest of the step in the same pass"
            if limits
            else ""
        )
        + "). "
        "Final clustering fraction by beta (meanfield): "
        + ", ".join(f"{b:.2f}: {f:.3f}" for b, f in zip(betas, mine.mean(1)[:, -1]))
        + ". A per-seed difference of k/(n(n-1)) = k x 1.0e-3 is k pairs whose <x_i, x_j> sits "
        "within rounding of the threshold."
    )
    return res


_DEVICES_SWEEP = r"""
import json, sys, time
import jax
jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))
jax.config.update("jax_enable_x64", True)
import numpy as np, jax.numpy as jnp
from meanfield import phase_diagram as pd
d = np.load(sys.argv[2])
x0, betas, t1, C, thr = jnp.asarray(d["x0"]), d["betas"], float(d["t1"]), int(d["C"]), float(d["thr"])
# warm-up: both metric modes (few-step and many-step betas) on both devices (a task goes to
# the least-loaded device: two tasks cover two devices), then one timed run
pd.usa_phase_diagram(None, betas[:2], x0=x0, t1=t1, checkpoints=C, threshold=thr, backend="xla")
pd.usa_phase_diagram(None, betas[-2:], x0=x0, t1=t1 * float(d["short"]), checkpoints=C, threshold=thr,
                     backend="xla")
t0 = time.perf_counter()
out = pd.usa_phase_diagram(None, betas, x0=x0, t1=t1, checkpoints=C, threshold=thr, per_seed=True, backend="xla")
t = time.perf_counter() - t0
np.save(sys.argv[3], out.per_seed)
print(json.dumps(dict(t=t, devices=len(jax.devices()))))
"""


def usa_sweep(quick: bool, log) -> Result:
    import torch

    S, B = (64, 6) if quick else (256, 20)
    n, d, t1, C, thr = 32, 2, 0.25, 200, 0.999
    betas = np.linspace(0.1, 9.0, B)
    if quick:
        betas = np.linspace(0.1, 5.0, B)
    grids = [pd.checkpoint_steps(t1, float(pd.usa_step_size(b)), C) for b in betas]
    Ns, hs, idxs = (list(v) for v in zip(*grids))
    # the published code's time grid (steps of exactly h_beta): the PyTorch re-implementation
    pub_grids = [pd.published_checkpoint_steps(t1, float(pd.usa_step_size(b)), C) for b in betas]
    Nq, hq, idxq = (list(v) for v in zip(*pub_grids))
    x0 = _x0_64(S, n, d, seed=1)
    cap = 400 if quick else 1000  # reference runs longer than this are timed on a prefix and scaled
    res = Result(
        f"USA phase diagram: n = {n}, d = {d}, {S} seeds x {B} beta in [{betas[0]:g}, {betas[-1]:g}], "
        f"Euler step 0.1 / max(sqrt(beta) e^(beta - 1/2), 1) to t = {t1:g} "
        f"({sum(Ns)} steps in all, max {max(Ns)}), {C} checkpoints, float64",
        [
            "implementation",
            "time (full sweep)",
            "meanfield is faster by",
            "max |diff| vs meanfield",
            "note",
        ],
    )
    with jax.enable_x64(True):
        x0j = jnp.asarray(x0)
        # warm-up: compile both metric modes once (same shapes): the smallest beta (few steps,
        # every step a checkpoint) and the largest beta on a short run (sparse checkpoints)
        backend = pd._resolve_backend("auto", x0j, False)
        for be, rule in (("auto", "projected"), ("xla", "projected"), ("auto", "renormalize")):
            pd.usa_phase_diagram(
                None, betas[:1], x0=x0j, t1=t1, checkpoints=C, threshold=thr, backend=be, step=rule
            )
            pd.usa_phase_diagram(
                None,
                betas[-1:],
                x0=x0j,
                t1=t1 * min(1.0, (2 * C + 10) / Ns[-1]),
                checkpoints=C,
                threshold=thr,
                backend=be,
                step=rule,
            )
        t0 = time.perf_counter()
        out = pd.usa_phase_diagram(
            None, betas, x0=x0j, t1=t1, checkpoints=C, threshold=thr, per_seed=True
        )
        t_fast = time.perf_counter() - t0
        mine = out.per_seed
        t0 = time.perf_counter()
        xla_out = pd.usa_phase_diagram(
            None, betas, x0=x0j, t1=t1, checkpoints=C, threshold=thr, per_seed=True, backend="xla"
        )
        t_xla = time.perf_counter() - t0
        xla_diff = float(np.abs(xla_out.per_seed - mine).max())
        log(f"USA fast ({backend}) {t_fast:.2f}, xla {t_xla:.2f}")
        # padded alternative: vmap over beta runs every point for max(N) steps (the XLA kernel)
        t_pad = t_xla * B * max(Ns) / sum(Ns)
        # plain JAX port (scan, static length: one compile per distinct step count), prefix-timed
        Np = [min(N, cap) for N in Ns]
        ip = [np.minimum(i, m) for i, m in zip(idxs, Np)]
        t0 = time.perf_counter()
        plain = ref.phase_diagram_jax_plain(x0j, betas, hs, Np, ip, threshold=thr, normalized=False)
        t_plain_part = time.perf_counter() - t0
        # the published update and time grid (XLA kernel: backend="auto" picks it), one run after
        # the same warm-up shapes
        t0 = time.perf_counter()
        pub = pd.usa_phase_diagram(
            None,
            betas,
            x0=x0j,
            t1=t1,
            checkpoints=C,
            threshold=thr,
            per_seed=True,
            step="renormalize",
            schedule="published",
        ).per_seed
        t_pub = time.perf_counter() - t0
        pub_gap = np.abs(pub.mean(1) - mine.mean(1))
        log(
            f"USA published step {t_pub:.2f}, vs projected max {pub_gap.max():.3f} mean {pub_gap.mean():.4f}"
        )
    scale = sum(Ns) / sum(Np)
    full = [i for i, (a, b) in enumerate(zip(Ns, Np)) if a == b]
    plain_diff = float(np.abs(plain[full] - mine[full]).max()) if full else float("nan")
    xt = torch.from_numpy(x0.copy())
    k_t = pick_torch_threads(
        lambda: ref.phase_diagram_torch(
            xt,
            betas[-1:],
            hq[-1:],
            [20],
            [np.minimum(idxq[-1], 20)],
            threshold=thr,
            normalized=False,
        )
    )
    Nqp = [min(N, cap) for N in Nq]
    iqp = [np.minimum(i, m) for i, m in zip(idxq, Nqp)]
    full_q = [i for i, (a, b) in enumerate(zip(Nq, Nqp)) if a == b]
    t0 = time.perf_counter()
    tr = ref.phase_diagram_torch(xt, betas, hq, Nqp, iqp, threshold=thr, normalized=False)
    t_torch_part = time.perf_counter() - t0
    torch_diff = float(np.abs(tr[full_q] - pub[full_q]).max()) if full_q else float("nan")
    scale_q = sum(Nq) / sum(Nqp)
    log(f"USA torch part {t_torch_part:.2f} plain part {t_plain_part:.2f}")
    t_torch, t_plain = t_torch_part * scale_q, t_plain_part * scale
    note_scale = (
        f"betas with more than {cap} steps run their first {cap} steps; time scaled by total steps "
        f"({sum(Ns)} / {sum(Np)} = {scale:.2f}); measured {{}}"
    )
    # the same sweep with one CPU device per core (fresh process): the (beta, chunk) tasks of
    # 256 seeds are too small for XLA to split one over both cores; two devices run two at once
    import tempfile

    ncpu = os.cpu_count() or 1
    dev_row = []
    if ncpu > 1:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryDirectory() as tmp:
            np.savez(
                os.path.join(tmp, "in.npz"),
                x0=x0,
                betas=betas,
                t1=t1,
                C=C,
                thr=thr,
                short=min(1.0, (2 * C + 10) / Ns[-1]),
            )
            r = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _DEVICES_SWEEP,
                    str(ncpu),
                    os.path.join(tmp, "in.npz"),
                    os.path.join(tmp, "out.npy"),
                ],
                capture_output=True,
                text=True,
                timeout=1800,
                cwd=root,
                check=True,
            )
            info = json.loads(r.stdout.strip().splitlines()[-1])
            dev_diff = float(np.abs(np.load(os.path.join(tmp, "out.npy")) - mine).max())
        t_dev = info["t"]
        log(f"USA on {info['devices']} devices {t_dev:.2f}")
        dev_row = [
            [
                f"meanfield, `backend='xla'`, {info['devices']} CPU devices (`jax_num_cpu_devices = {ncpu}`, "
                "fresh process)",
                fmt_t(t_dev),
                fmt_r(t_dev / t_fast),
                f"{dev_diff:.1e}",
                f"XLA tasks spread over the devices; PyTorch re-implementation / this: {fmt_r(t_torch / t_dev)}",
            ]
        ]
        res.data["devices"] = dict(t=t_dev, n=info["devices"], diff=dev_diff)
    res.rows += [
        [
            f"meanfield `usa_phase_diagram` (default: `backend='{backend}'`; per-beta step counts, rescaled time)",
            fmt_t(t_fast),
            "1.00x",
            "0",
            "one run after a warm-up",
        ],
        [
            "meanfield, `backend='xla'` (one CPU device)",
            fmt_t(t_xla),
            fmt_r(t_xla / t_fast),
            f"{xla_diff:.1e}",
            f"one run after a compile-only warm-up; PyTorch re-implementation / this: {fmt_r(t_torch / t_xla)}",
        ],
        *dev_row,
        [
            "XLA kernel, beta vmapped and padded to max N (estimate)",
            fmt_t(t_pad),
            fmt_r(t_pad / t_fast),
            "-",
            f"B max(N) / sum(N) = {B * max(Ns) / sum(Ns):.1f} times the work of the XLA row",
        ],
        [
            "plain JAX port (vmap seeds, scan steps)",
            fmt_t(t_plain),
            fmt_r(t_plain / t_fast),
            f"{plain_diff:.1e}",
            note_scale.format(fmt_t(t_plain_part)) + " incl. one compile per distinct N",
        ],
        [
            "meanfield, `step='renormalize'`, `schedule='published'` (the published update and time grid; "
            "XLA kernel)",
            fmt_t(t_pub),
            fmt_r(t_pub / t_fast),
            "-",
            f"one run; seed-mean fraction vs the projected default: max |diff| {pub_gap.max():.3f}, "
            f"mean {pub_gap.mean():.4f}",
        ],
        [
            "PyTorch: our re-implementation of the published loop, with the published step",
            fmt_t(t_torch),
            fmt_r(t_torch / t_fast),
            f"{torch_diff:.1e}",
            f"diff vs meanfield `step='renormalize'`, `schedule='published'` on the {len(full_q)} betas run to the "
            f"end; betas with more than {cap} steps run their first {cap}, time scaled by total steps "
            f"({sum(Nq)} / {sum(Nqp)} = {scale_q:.2f}); measured {fmt_t(t_torch_part)}; torch threads {k_t}",
        ],
    ]
    res.data.update(
        fast=t_fast,
        backend=backend,
        xla=t_xla,
        plain=t_plain,
        torch=t_torch,
        steps=Ns,
        published=t_pub,
        published_steps=Nq,
        published_vs_projected=dict(max=float(pub_gap.max()), mean=float(pub_gap.mean())),
        diffs=dict(xla=xla_diff, plain=plain_diff, torch=torch_diff),
        final_fraction=mine.mean(1)[:, -1].tolist(),
        betas=betas.tolist(),
    )
    res.notes.append(
        "Differences are compared on the betas run to the end by the references "
        f"({len(full)} of {B}; PyTorch: {len(full_q)}). Final clustering fraction by beta (meanfield): "
        + ", ".join(f"{b:.2f}: {f:.3f}" for b, f in zip(betas, mine.mean(1)[:, -1]))
    )
    return res


# ----------------------------------------------------------------------------
# USA-AV Fig. 2
# ----------------------------------------------------------------------------


def fig2(quick: bool, log) -> Result:
    """USA, RoPE and Prompt at each n as ONE per-particle-gauge kernel vmapped over models and
    seeds: USA = identity gauges, RoPE = R(omega s_i), Prompt = its 3 gauges by block."""
    ns = [64] if quick else [64, 128, 256, 512]
    seeds = 4 if quick else 100
    t1 = 2.0 if quick else 20.0
    d, beta, dt = 3, 1.0, 1e-2
    ts = np.linspace(0.0, t1, 41)
    G3 = mf.kernels.random_gauges(jax.random.key(11), 3, d)
    res = Result(
        f"USA-AV Fig. 2: 3 models (USA, RoPE, Prompt K=3) x {ns} n, projected RK2 dt = {dt}, t = {t1:g}, "
        f"early stop 1e-8, float32",
        [
            "n",
            "compile",
            f"run ({seeds} seeds x 3 models)",
            "compiles",
            "pair evaluations / s",
            "stop time (mean, per model)",
        ],
    )
    total = 0.0
    for n in ns:
        s = (jnp.arange(1, n + 1) / n).astype(jnp.float32)
        gauges = jnp.stack(
            [
                jnp.broadcast_to(jnp.eye(d), (n, d, d)),
                jax.vmap(lambda a: mf.sphere.rotation(2 * np.pi * a, d, (0, 1)))(s),
                G3[(jnp.arange(n) * 3) // n],
            ]
        ).astype(jnp.float32)
        models = [mf.kernels.Prompt(beta, g) for g in gauges]
        stacked = jax.tree.map(lambda *a: jnp.stack([jnp.asarray(v) for v in a]), *models)
        traces = []

        @jax.jit
        def run(model, keys):
            traces.append(1)

            def one(m, k):
                x0 = mf.sphere.uniform(k, n, d)
                tr = mf.simulate(
                    m,
                    x0,
                    jnp.arange(n),
                    t1=t1,
                    dt=dt,
                    solver="rk2",
                    ts=ts,
                    save_states=False,
                    early_stop=1e-8,
                )
                return tr.collapse_gap, tr.stop_time

            return jax.vmap(lambda m: jax.vmap(lambda k: one(m, k))(keys))(model)

        keys = jax.random.split(jax.random.fold_in(jax.random.key(5), n), seeds)
        t0 = time.perf_counter()
        compiled = run.lower(stacked, keys).compile()
        t_compile = time.perf_counter() - t0
        t0 = time.perf_counter()
        gap, stop = _block(compiled(stacked, keys))
        t_run = time.perf_counter() - t0
        total += t_run + t_compile
        stop = np.asarray(stop)
        # RK2: two field evaluations per step, each n^2 pairs, until the batch's last member stops
        evals = 2 * np.ceil(stop.max(axis=1) / dt).sum() * seeds * n * n
        res.rows.append(
            [
                str(n),
                fmt_t(t_compile),
                fmt_t(t_run),
                str(len(traces)),
                f"{evals / t_run:.3g}",
                ", ".join(f"{float(v):.1f}" for v in stop.mean(1)),
            ]
        )
        log(f"fig2 n={n}: compile {t_compile:.1f} run {t_run:.1f} traces {len(traces)}")
        res.data[str(n)] = dict(compile=t_compile, run=t_run, traces=len(traces))
    # equivalence of the per-particle gauge form with the named kernels (small check)
    n = ns[0]
    x0 = mf.sphere.uniform(jax.random.key(2), n, d)
    s = jnp.arange(1, n + 1) / n
    rope = mf.kernels.RoPE(beta, 2 * np.pi)
    as_prompt = mf.kernels.Prompt(
        beta, jax.vmap(lambda a: mf.sphere.rotation(2 * np.pi * a, d, (0, 1)))(s)
    )
    err = float(jnp.abs(mf.velocity(rope, x0) - mf.velocity(as_prompt, x0, jnp.arange(n))).max())
    res.notes.append(
        f"Each n compiles once for all 3 models and all {seeds} seeds (per-particle gauges: a `Prompt` "
        f"kernel with K = n gauges and labels 0..n-1, stacked over models and vmapped; the vmapped field "
        f"runs through the native kernel in the gauge frame). One run per n at full size (no "
        f"extrapolation); the early-stop rule ends a vmapped batch when all its members stop. Full "
        f"Fig. 2 wall time: {fmt_t(total)} including compiles. Pair evaluations / s counts the steps "
        f"of each model's batch up to its last stop time. RoPE as per-particle gauges vs "
        f"`mf.kernels.RoPE`: max velocity difference {err:.1e}."
    )
    res.data["total"] = total
    return res


# ----------------------------------------------------------------------------
# formulations of the dense step: XLA:CPU's fusion choices, measured per shape
# ----------------------------------------------------------------------------


def _field_variants():
    """Unit-weight USA fields ``(1/n) exp(beta (X X^T - 1)) X`` of one system, by formulation."""

    def dot(x, beta):  # meanfield's dense path: two matmuls
        return jnp.exp(beta * (x @ x.T - 1.0)) @ x / x.shape[0]

    def bcast_gram(x, beta):  # Gram matrix as a sum of d broadcast products (fuses with the exp)
        G = sum(x[:, None, k] * x[None, :, k] for k in range(x.shape[1]))
        return jnp.exp(beta * (G - 1.0)) @ x / x.shape[0]

    def reduce_field(x, beta):  # field as d broadcast-multiply reductions instead of a matmul
        W = jnp.exp(beta * (x @ x.T - 1.0))
        return jnp.stack([jnp.sum(W * x[None, :, k], 1) for k in range(x.shape[1])], 1) / x.shape[0]

    def symmetric(m):  # upper-triangular blocks only: (m + 1) / (2 m) of the exponentials
        def f(x, beta):
            n = x.shape[0]
            e = np.linspace(0, n, m + 1).round().astype(int)
            xs = [x[a:b] for a, b in zip(e[:-1], e[1:])]
            F = [0.0] * m
            for i in range(m):
                for j in range(i, m):
                    W = jnp.exp(beta * (xs[i] @ xs[j].T - 1.0))
                    F[i] = F[i] + W @ xs[j]
                    if i != j:
                        F[j] = F[j] + jnp.einsum("ij,id->jd", W, xs[i])
            return jnp.concatenate(F) / n

        return f

    return {
        "two matmuls (meanfield)": dot,
        "broadcast Gram + matmul": bcast_gram,
        "matmul + reductions": reduce_field,
        "symmetric, 2 x 2 blocks (75% of exps)": symmetric(2),
        "symmetric, 4 x 4 blocks (62.5% of exps)": symmetric(4),
    }


def formulations(quick: bool, log) -> Result:
    shapes = (
        [(100, 256, 3), (16, 1024, 8), (1, 1024, 3)] if not quick else [(10, 128, 3), (2, 256, 8)]
    )
    reps = 3 if quick else 7
    variants = _field_variants()
    opts = {"XLA default fusions": None, "matmuls only to YNNPACK": pd.CPU_COMPILER_OPTIONS}
    cols = [f"{v} / {o}" for o in opts for v in variants]
    res = Result(
        "Formulations of the dense USA field (float32, seeds vmapped), time relative to meanfield's",
        ["formulation / compile options"] + [f"{S} x {n} x {d}" for S, n, d in shapes],
    )
    base_name = "meanfield (`USA.field`: default backend 'auto')"
    xla_name = 'meanfield\'s XLA path (`use_backend("xla")`, chunked)'
    rel = {c: [] for c in [base_name, xla_name] + cols}
    for S, n, d in shapes:
        x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(
            jax.random.split(jax.random.key(n + d), S)
        )
        ref_F = jax.vmap(lambda y: variants["two matmuls (meanfield)"](y, 1.0))(x)
        fns = {
            "meanfield": jax.jit(
                jax.vmap(lambda y: mf.kernels.USA(1.0, rescaled=True).field(y, None))
            )
        }

        def xla_field(y):
            with mf.kernels.use_backend("xla"):  # traced with the XLA formulation
                return mf.kernels.USA(1.0, rescaled=True).field(y, None)

        fns[xla_name] = jax.jit(jax.vmap(xla_field))
        for oname, o in opts.items():
            for vname, v in variants.items():
                f = jax.jit(jax.vmap(lambda y, v=v: v(y, 1.0)), compiler_options=o)
                err = float(jnp.abs(f(x) - ref_F).max() / jnp.abs(ref_F).max())
                if err > 1e-5:
                    raise AssertionError(f"formulation {vname} / {oname} differs by {err:.1e}")
                fns[f"{vname} / {oname}"] = f
        times = timeit_interleaved({k: (lambda f=f: f(x)) for k, f in fns.items()}, reps, rounds=2)
        base = times["meanfield"]
        rel[base_name].append(fmt_t(base))
        for c in [xla_name, *cols]:
            rel[c].append(fmt_r(times[c] / base))
        res.data[f"{S}x{n}x{d}"] = times
        log(f"formulations {S}x{n}x{d}: " + ", ".join(f"{k} {fmt_t(v)}" for k, v in times.items()))
    res.rows = [[k] + v for k, v in rel.items()]
    res.notes.append(
        "Each entry is the time of the formulation over meanfield's (the rescaled USA field under vmap, "
        "through the native kernel on the CPU); every formulation is checked against the two-matmul field first (relative "
        "difference < 1e-5). 'matmuls only to YNNPACK' compiles with `phase_diagram.CPU_COMPILER_OPTIONS` "
        "(library code cannot set compiler options for a caller's jit, so `mf.velocity` uses XLA's "
        "defaults; the phase-diagram kernel, which owns its jit, uses the option). The symmetric "
        "variants compute only the upper block triangle of the weights (half the exponentials in the "
        "limit of many blocks): on XLA:CPU the extra slices and transposed products cost more than "
        "the saved exponentials at these shapes."
    )
    return res


# ----------------------------------------------------------------------------
# sweep engine: beta-dependent steps, bucketed by beta vs padded
# ----------------------------------------------------------------------------


def sweep_steps(quick: bool, log) -> Result:
    """``sweeps/usa_reference_steps.toml`` (fewer seeds): one beta per chunk (the plan) against
    the whole beta axis in one vmapped chunk (every point runs the longest step count)."""
    import dataclasses as _dc

    from meanfield import sweep as sw
    from meanfield.sweep import run as sw_run

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = sw.load_spec(os.path.join(root, "sweeps", "usa_reference_steps.toml"))
    seeds = 8 if quick else 32
    betas = spec.axes["beta"][:6] if quick else spec.axes["beta"]
    spec = _dc.replace(spec, seeds=spec.seeds[:seeds], axes={**spec.axes, "beta": betas})
    steps = [
        int(np.ceil(spec.time["t1"] / pd.usa_step_size(float(b), spec.time["dt"]))) for b in betas
    ]
    res = Result(
        f'Sweep engine, beta-dependent steps (`step_rule = "reference"`): USA n = 32, d = 2, '
        f"{len(betas)} beta in [{betas[0]:g}, {betas[-1]:g}] x {seeds} seeds, Euler to t = {spec.time['t1']:g} "
        f"({sum(steps)} steps over the betas, max {max(steps)}), float64",
        [
            "plan",
            "chunks",
            "point-steps run",
            "time (incl. one compile)",
            "bucketed is faster by",
            "max |diff| of the observables",
        ],
    )
    outs, times = {}, {}
    with jax.enable_x64(True):
        plans = {
            "one beta per chunk (the sweep plan)": sw.make_plan(spec, "2GB", devices=1),
            "all betas in one chunk (padded)": sw.make_plan(
                spec, "2GB", devices=1, blocks=[(len(betas), seeds)]
            ),
        }
        for name, plan in plans.items():
            runner = sw_run.Runner(plan)
            t0 = time.perf_counter()
            vals = {}
            for _, gi, sl in plan.chunks:
                params, sd = sw_run.chunk_inputs(
                    spec, plan.groups[gi], sl, plan.padded_size(plan.groups[gi])
                )
                out = runner(gi, params, sd)
                count = (sl[0].stop - sl[0].start) * (sl[1].stop - sl[1].start)
                for k, v in out.items():
                    vals.setdefault(k, []).append(v[:count])
            times[name] = time.perf_counter() - t0
            outs[name] = {k: np.concatenate(v) for k, v in vals.items()}
            log(f"sweep steps {name}: {times[name]:.1f} s, {len(plan.chunks)} chunks")
    a, b = outs.values()
    diff = max(float(np.nanmax(np.abs(a[k] - b[k]))) for k in spec.observables)
    t_b, t_p = times.values()
    res.rows += [
        [list(plans)[0], str(len(betas)), f"{seeds * sum(steps):.3g}", fmt_t(t_b), "1.00x", "0"],
        [
            list(plans)[1],
            "1",
            f"{seeds * len(betas) * max(steps):.3g}",
            fmt_t(t_p),
            fmt_r(t_p / t_b),
            f"{diff:.1e}",
        ],
    ]
    res.notes.append(
        "Both plans run the same compiled point function (`meanfield.sweep.run.point_program`, the step a traced "
        "value; `mf.simulate` with a traced dt) through the sweep's runner, without the store. "
        "Under one vmap every member runs until the last one finishes, so the padded plan runs "
        f"{len(betas) * max(steps) / sum(steps):.1f} times the steps (the step counts in the "
        "column exclude the landings on the save times)."
    )
    res.data = dict(times=times, diff=diff, steps=steps)
    return res
