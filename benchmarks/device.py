# ruff: noqa: B023  (closures are called immediately inside each loop iteration)
"""``python -m benchmarks.device [--smoke] [--out DIR] [--budget S] [--only SECTION ...] [--rev REV]``

The measurements that matter at accelerator sizes, on whatever device JAX finds (written for
one NVIDIA GPU; runs the same code on the CPU), in one process and within a time budget, in this
order (the library's measurements first, the device's limits last):

1. ``field``: ``mf.velocity``, ``mf.energy`` and ``jax.grad`` of the energy of
   ``mf.kernels.USA(1.0)`` (float32) for single systems up to ``n = 65536`` and for batches
   of seeds (vmapped), each against plain JAX (``P_x exp(beta X X^T) X / n``, the energy
   ``sum exp(beta X X^T) / (2 n^2 beta)`` and its ``jax.grad``), each checked against a
   float64 evaluation (rows of the field and gradient, the whole energy). Compile and run
   timed separately; pairs/s, fractions of the measured exp/s and GEMM-bound rate (filled in
   once ``roofline`` has measured them).
2. ``phase``: the SA and USA phase diagrams (BENCHMARKS.md's settings: ``n = 32``, ``d = 2``,
   20 beta in ``[0.1, 9]``, float64, 2048 seeds) against ``references.phase_diagram_jax_plain``.
3. ``sweep``: one chunk of the sweep engine's compiled, sharded batch program
   (``meanfield.sweep.run._batched_program``, inputs from ``chunk_inputs``), in memory (no
   zarr store).
4. ``simulate``: a long ``mf.simulate`` (RK2) of one large system and of a vmapped batch of
   seeds against a plain-JAX ``lax.scan`` of the same projected Heun steps.
5. ``roofline``: the device's limits measured in the same run, each a one-operation program
   compiled on its own: float32 GEMM flop/s (``jnp.dot`` of square matrices at
   ``Precision.HIGHEST`` and at ``DEFAULT``, which is TF32 on NVIDIA GPUs), float64 GEMM, memory
   bandwidth (a scaled copy: bytes read + written), exp/s (``jnp.sum(jnp.exp(a))`` over a large
   array); then the extras: exp/s with the arguments formed in registers (``sum(exp(iota * s -
   1))``, one dimension like the array's, ``s`` a runtime scalar) and float64 exp/s. Best of
   several repeats. Last because a compile can hang there: on an H200 (jax 0.11.2) the former
   registers measurement, ``sum(exp(p q^T))`` over a 16384 x 16384 broadcast, sat in XLA's GPU
   compiler ("Very slow compile? input_reduce_fusion") until the watchdog stopped the run. Each
   roofline measurement now runs under its own stall timer (``roofline_item_s`` of the profile):
   past it the results are written and the process exits (status 3), every other section
   having finished.

Sections run in that order whatever the order of ``--only``. Every section is wrapped: a
failure is recorded (error text in the JSON) and the others run; a section is skipped when the
global deadline (``--budget`` seconds from the start, default 420) is near, and a watchdog
writes what was measured and exits if a call overruns the deadline by more than ``GRACE_S``.
The JSON (``DIR/device-<slug of the device kind>.json``) and the Markdown (``.md`` beside it,
also printed) are rewritten after every measurement.

Numerical checks (tolerances in ``TOLERANCES``) are enforced on the CPU and for float64 or
``Precision.HIGHEST`` results everywhere; float32 results at the default matmul precision on an
accelerator (TF32 on NVIDIA) are recorded, not checked. Exit status 1 when a section failed (an
error or a check out of tolerance); with ``--smoke`` also when a section was skipped for lack
of time. ``--smoke``: tiny sizes, the same code paths, on the CPU in about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from . import cpu_name

T_START = time.perf_counter()  # deadlines count from the start of the process (this import)

SECTIONS = ("field", "phase", "sweep", "simulate", "roofline")
#: Share of the time left that each section may use (renormalised over the sections still to run).
SHARES = {"field": 0.42, "phase": 0.22, "sweep": 0.11, "simulate": 0.20, "roofline": 0.05}
#: Seconds past the budget after which the watchdog writes the results and exits.
GRACE_S = 45.0
#: Relative tolerances of the checks (max |a - ref| / max |ref|; per-seed clustering fractions:
#: max |a - ref|, a fraction 1 / (n (n - 1)) per pair at the threshold).
TOLERANCES = {
    "velocity": 2e-3,  # the projection cancels the radial part: float32 rounding times ~sqrt(n)
    "energy": 1e-4,
    "grad": 1e-4,
    "fraction": 0.02,
    "final energy": 1e-4,
}
ROOT = Path(__file__).resolve().parents[1]

PROFILES = {
    # accelerator sizes (the default on a GPU/TPU)
    "full": dict(
        gemm=8192,
        stream=2**28,
        roofline_item_s=90.0,
        best_of=10,
        single=[1024, 4096, 16384, 65536],
        batches=[(256, 1024), (64, 4096)],
        d=3,
        block=(16384, 8192),
        check_rows=256,
        target_s=1.0,
        max_reps=7,
        min_item_s=8.0,
        sa=dict(seeds=2048, betas=20, t1=10.0, dt=0.1, checkpoints=200),
        usa=dict(seeds=2048, betas=20, beta_max=9.0, t1=0.25, checkpoints=200, cap=1000),
        sweep=dict(n=[64, 256], seeds=256, t1=4.0, groups=2, memory="8GB"),
        sim=dict(n=4096, t1=10.0, dt=0.01, seeds=1024, n_batch=256),
        slow_call_s=60.0,
    ),
    # the default without --smoke when JAX finds only a CPU
    "cpu": dict(
        gemm=1024,
        stream=2**24,
        roofline_item_s=90.0,
        best_of=5,
        single=[1024, 4096, 16384],
        batches=[(64, 256), (16, 1024)],
        d=3,
        block=(16384, 4096),
        check_rows=128,
        target_s=1.0,
        max_reps=5,
        min_item_s=8.0,
        sa=dict(seeds=2048, betas=20, t1=10.0, dt=0.1, checkpoints=200),
        usa=dict(seeds=256, betas=20, beta_max=9.0, t1=0.25, checkpoints=200, cap=1000),
        sweep=dict(n=[16, 64], seeds=64, t1=4.0, groups=2, memory="2GB"),
        sim=dict(n=1024, t1=2.0, dt=0.01, seeds=64, n_batch=128),
        slow_call_s=60.0,
    ),
    # --smoke: every code path at tiny sizes
    "smoke": dict(
        gemm=128,
        stream=2**18,
        roofline_item_s=30.0,
        best_of=3,
        single=[256, 1536],
        batches=[(4, 128)],
        d=3,
        block=(1536, 768),
        check_rows=64,
        target_s=0.05,
        max_reps=3,
        min_item_s=1.0,
        sa=dict(seeds=16, betas=3, t1=1.0, dt=0.1, checkpoints=5),
        usa=dict(seeds=16, betas=3, beta_max=3.0, t1=0.02, checkpoints=5, cap=1000),
        sweep=dict(n=[8], seeds=4, t1=0.5, groups=1, memory="1GB"),
        sim=dict(n=128, t1=0.5, dt=0.01, seeds=4, n_batch=64),
        slow_call_s=30.0,
    ),
}


class Skip(Exception):
    """A section (or item) skipped for a documented reason: not a failure."""


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T_START:7.1f}s] {msg}", flush=True)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def fmt_t(t) -> str:
    if t is None or not math.isfinite(t):
        return "-"
    if t >= 1.0:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_g(v, pct=False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.0%}" if pct else f"{v:.3g}"


def fmt_r(r) -> str:
    return "-" if r is None or not math.isfinite(r) else f"{r:.2f}x"


# ----------------------------------------------------------------------------
# run state, JSON/Markdown output, deadlines, watchdog
# ----------------------------------------------------------------------------


class Run:
    def __init__(self, out: Path, name: str, budget: float, smoke: bool, meta: dict):
        self.lock = threading.RLock()
        self.json_path = out / f"device-{name}.json"
        self.md_path = out / f"device-{name}.md"
        self.deadline = T_START + budget
        self.section_deadline = self.deadline
        self.smoke = smoke
        self.current: str | None = None
        self.data: dict = {"meta": meta, "limits": {}, "sections": {}}

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def section_left(self) -> float:
        return min(self.section_deadline, self.deadline) - time.perf_counter()

    def write(self) -> None:
        with self.lock:
            for _ in range(3):
                try:
                    text = json.dumps(self.data, indent=1, default=_jsonable)
                    md = markdown(self.data)
                    break
                except RuntimeError:  # a dict changed size under the watchdog's thread
                    time.sleep(0.05)
            else:
                return
            for path, body in ((self.json_path, text), (self.md_path, md)):
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(body)
                os.replace(tmp, path)

    def abort(self, reason: str | None = None) -> None:
        """Watchdog: a call overran the deadline by GRACE_S (or one measurement its stall limit,
        ``reason``): record, write, exit. XLA's compiler cannot be interrupted from Python, so
        this is the only way out of a compile that does not finish."""
        acquired = self.lock.acquire(timeout=5)
        reason = reason or (
            f"watchdog: still running {GRACE_S:.0f} s past the deadline "
            f"({self.data['meta']['budget_s']:.0f} s); the process was stopped"
        )
        try:
            name = self.current
            if name and name in self.data["sections"]:
                sec = self.data["sections"][name]
                sec["status"] = "failed"
                sec["error"] = reason
            for s in SECTIONS:
                self.data["sections"].setdefault(
                    s, {"status": "skipped", "reason": "watchdog stopped the run"}
                )
            fill_fractions(self.data)
            self.data["meta"]["total_s"] = time.perf_counter() - T_START
            self.write()
        finally:
            if acquired:
                self.lock.release()
        log(f"{reason}; partial results in {self.json_path}")
        os._exit(3)

    @contextlib.contextmanager
    def stall(self, limit_s: float, what: str):
        """Run the block under a stall timer: past ``limit_s`` seconds, ``abort`` (record, write
        what was measured, exit with status 3)."""
        reason = (
            f"stall: {what} still running after {limit_s:.0f} s (a compile that does not "
            "finish?); the process was stopped"
        )
        timer = threading.Timer(limit_s, self.abort, kwargs=dict(reason=reason))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


def _jsonable(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(o)


def _x64():
    """The float64 context manager of this JAX version."""
    import jax

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # older releases

    return enable_x64()


class CompileClock:
    """Seconds JAX spent tracing, lowering and compiling (its monitoring events), so that the
    compile time inside a library call (which jits internally) is measured, not guessed."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __init__(self):
        self.total = 0.0
        self.count = 0
        self.ok = False
        try:
            import jax.monitoring

            jax.monitoring.register_event_duration_secs_listener(self._listen)
            self.ok = True
        except Exception:  # an older or newer JAX without the hook: compile times unknown
            pass

    def _listen(self, event, duration, *args, **kwargs):
        if event in self.EVENTS:
            self.total += float(duration)
            self.count += 1

    def timed(self, call):
        """``(result, wall seconds, compile seconds or None)`` of ``call()`` (blocked)."""
        import jax

        c0 = self.total
        t0 = time.perf_counter()
        out = jax.block_until_ready(call())
        wall = time.perf_counter() - t0
        comp = self.total - c0 if self.ok else None
        return out, wall, comp


CLOCK: CompileClock | None = None


def compile_fn(fn, *args, precision=None):
    """``(compiled, seconds)``: ``jax.jit(fn)`` lowered and compiled for ``args`` (under the
    default matmul ``precision`` when given)."""
    import jax

    ctx = jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()
    t0 = time.perf_counter()
    with ctx:
        compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def time_calls(call, target_s: float, max_reps: int) -> dict:
    """A first call (warm-up), then repeats up to ``target_s`` in all: median and best."""
    import jax
    import numpy as np

    t0 = time.perf_counter()
    out = jax.block_until_ready(call())
    first = time.perf_counter() - t0
    reps = max(1, min(max_reps, int(target_s / max(first, 1e-9))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        ts.append(time.perf_counter() - t0)
    return dict(first=first, median=float(np.median(ts)), best=min(ts), reps=reps, out=out)


def _times(call, reps):
    import jax

    jax.block_until_ready(call())
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        ts.append(time.perf_counter() - t0)
    return ts


def free_memory() -> tuple[int | None, str]:
    """Bytes free for new arrays on the default device (``memory_stats``), else the host's."""
    import jax

    dev = jax.devices()[0]
    try:
        st = dev.memory_stats()
    except Exception:
        st = None
    if st and st.get("bytes_limit"):
        return int(st["bytes_limit"]) - int(st.get("bytes_in_use", 0)), "device"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "host"
    except OSError:
        pass
    return None, "unknown"


def add_check(sec: dict, name: str, value: float, tol: float | None, note: str = "") -> None:
    """A numerical check: ``tol=None`` records the value without enforcing a tolerance."""
    ok = None if tol is None else bool(value <= tol)
    sec["checks"].append(dict(name=name, value=float(value), tol=tol, ok=ok, note=note))
    if ok is False:
        log(f"CHECK FAILED {name}: {value:.3g} > {tol:g} {note}")


def item_error(r: dict, e: BaseException, oom_is_skip: bool) -> None:
    """An exception of one measurement, recorded in its row: out of memory of a reference as a
    skip, anything else as an error (the section then fails, the others still run)."""
    msg = f"{type(e).__name__}: {e}".strip()
    oom = "RESOURCE_EXHAUSTED" in msg or "out of memory" in msg.lower()
    if oom and oom_is_skip:
        r["skipped"] = "memory: " + msg.splitlines()[0][:300]
    else:
        r["error"] = msg[:2000]
        r["traceback"] = traceback.format_exc()[-3000:]
    log(
        f"{r.get('case', '?')} {r.get('quantity', '')} {r.get('impl', '')}: {msg.splitlines()[0][:300]}"
    )


def rel_diff(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = float(np.max(np.abs(b)))
    return float(np.max(np.abs(a - b)) / (scale if scale > 0 else 1.0))


def enforced(accelerator: bool, dtype: str, precision: str | None) -> bool:
    """Checks are enforced except for float32 at the default matmul precision on an accelerator
    (TF32 on NVIDIA: recorded only)."""
    return not accelerator or dtype == "float64" or precision == "highest"


# ----------------------------------------------------------------------------
# 1. roofline
# ----------------------------------------------------------------------------


def sec_roofline(run: Run, sec: dict, P: dict) -> None:
    """The device's limits, each a one-operation program compiled on its own (compile timed
    apart from the runs) under a stall timer; the optional extras last."""
    import jax
    import jax.numpy as jnp

    reps = P["best_of"]
    g, m = P["gemm"], P["stream"]
    lim = run.data["limits"]
    HI, DEF = jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT

    def measure(name, fn, args, count, unit, note, x64=False):
        """``count / best time`` of the compiled ``fn(*args)`` (``args``: a thunk, so that the
        inputs are made in the right float mode), recorded as limit ``name``."""
        if run.left() < 2.0:
            sec["rows"].append(dict(quantity=name, skipped="budget: not enough time left"))
            log(f"roofline {name}: skipped (budget)")
            return
        limit = P["roofline_item_s"]
        log(f"roofline {name}: compiling and timing (stall limit {limit:.0f} s) ...")
        with run.stall(limit, f"roofline {name}"), _x64() if x64 else contextlib.nullcontext():
            xs = jax.block_until_ready(args())
            compiled, t_c = compile_fn(fn, *xs)
            t = min(_times(lambda: compiled(*xs), reps))
        value = count / t
        lim[name] = value
        sec["rows"].append(
            dict(quantity=name, value=value, unit=unit, note=note, compile_s=t_c, best_s=t)
        )
        log(f"roofline {name}: {value:.3g} {unit} (compile {fmt_t(t_c)}, best {fmt_t(t)})")
        fill_fractions(run.data)
        run.write()

    def normal(shape, dtype):
        return lambda: (
            jax.random.normal(jax.random.key(1), shape, dtype),
            jax.random.normal(jax.random.key(2), shape, dtype),
        )

    def uniform(size, dtype):
        return lambda: (jax.random.uniform(jax.random.key(3), (size,), dtype, -1.0, 1.0),)

    for name, prec, note in (
        ("gemm_f32_highest", HI, "Precision.HIGHEST (full float32)"),
        ("gemm_f32_default", DEF, "Precision.DEFAULT (TF32 on NVIDIA GPUs)"),
    ):
        measure(
            name,
            lambda a, b, prec=prec: jnp.dot(a, b, precision=prec),
            normal((g, g), jnp.float32),
            2 * g**3,
            "flop/s",
            f"jnp.dot of two {g} x {g} float32, {note}",
        )
    measure(
        "gemm_f64",
        lambda a, b: jnp.dot(a, b, precision=HI),
        normal((g, g), jnp.float64),
        2 * g**3,
        "flop/s",
        f"jnp.dot of two {g} x {g} float64",
        x64=True,
    )
    measure(
        "bandwidth",
        lambda a: a * 1.5 + 0.5,
        uniform(m, jnp.float32),
        2 * 4 * m,
        "bytes/s",
        f"a * 1.5 + 0.5 on {m} float32: bytes read + written",
    )
    measure(
        "exp_f32",
        lambda a: jnp.sum(jnp.exp(a)),
        uniform(m, jnp.float32),
        m,
        "exp/s",
        f"jnp.sum(jnp.exp(a)) over {m} float32 (fused; reads the array)",
    )
    # extras (nothing else uses them). The arguments formed in registers: the same
    # one-dimensional reduction as exp_f32, fed by an iota instead of an array; the scale is a
    # runtime scalar so that XLA cannot fold the program to a constant. (The former
    # `sum(exp(p[:, None] * q[None, :]))` over 16384 x 16384 never finished compiling on an H200.)
    measure(
        "exp_f32_registers",
        lambda s: jnp.sum(jnp.exp(jax.lax.iota(jnp.float32, m) * s - 1.0)),
        lambda: (jnp.asarray(2.0 / m, jnp.float32),),
        m,
        "exp/s",
        f"jnp.sum(jnp.exp(iota * s - 1)) over {m} float32, s = 2 / {m} a runtime scalar "
        "(arguments formed in registers, no array read)",
    )
    measure(
        "exp_f64",
        lambda a: jnp.sum(jnp.exp(a)),
        uniform(m // 2, jnp.float64),
        m // 2,
        "exp/s",
        f"jnp.sum(jnp.exp(a)) over {m // 2} float64",
        x64=True,
    )
    for key, v in lim.items():
        add_check(
            sec, f"{key} positive and finite", 0.0 if v > 0 and math.isfinite(v) else 1.0, 0.0
        )
    sec["notes"].append(
        f"Best of {reps} calls after a warm-up (the device's capability); each quantity is one "
        "small program, compiled on its own (compile column) under a stall timer of "
        f"{P['roofline_item_s']:.0f} s. Run last: nothing here can hold up the other sections."
    )


def fill_fractions(data: dict) -> None:
    """The field rows' fractions of the measured limits (``frac_exp``: pairs/s over ``exp_f32``;
    ``frac_gemm``: 4 n^2 d flops per pair, 2 n^2 d for the energy, at the GEMM rate of the
    precision of the products), once ``roofline`` has measured them. meanfield's products state
    ``Precision.HIGHEST`` (``mf.matmul_precision``), so its rows count against the HIGHEST rate;
    plain JAX at the default precision against the DEFAULT (TF32 on NVIDIA) rate."""
    lim = data.get("limits", {})
    for r in data.get("sections", {}).get("field", {}).get("rows", []):
        if "pairs_per_s" not in r:
            continue
        highest = r.get("precision") == "highest" or r.get("impl", "").startswith("meanfield")
        gemm = lim.get("gemm_f32_highest" if highest else "gemm_f32_default")
        exp_rate = lim.get("exp_f32")
        flops_pair = (2 if r.get("quantity") == "energy" else 4) * r.get("d", 3)
        r["frac_exp"] = r["pairs_per_s"] / exp_rate if exp_rate else None
        r["frac_gemm"] = r["pairs_per_s"] * flops_pair / gemm if gemm else None


# ----------------------------------------------------------------------------
# 2. field, energy, gradient
# ----------------------------------------------------------------------------


def _plain(quantity: str, beta: float):
    """Plain JAX for one system: the dense ``n x n`` formulation (as ``references.usa_velocity_jax``)."""
    import jax
    import jax.numpy as jnp

    def energy(x):
        n = x.shape[0]
        return jnp.sum(jnp.exp(beta * (x @ x.T))) / (2 * n * n * beta)

    def velocity(x):
        F = jnp.exp(beta * (x @ x.T)) @ x / x.shape[0]
        return F - jnp.sum(F * x, axis=-1, keepdims=True) * x

    return {"velocity": velocity, "energy": energy, "grad": jax.grad(energy)}[quantity]


def _meanfield(quantity: str, kernel, backend=None, block=None):
    import jax

    import meanfield as mf

    if quantity == "velocity":
        return lambda x: mf.velocity(kernel, x, backend=backend, block_size=block)
    if quantity == "energy":
        return lambda x: mf.energy(kernel, x, backend=backend, block_size=block)
    return jax.grad(lambda x: mf.energy(kernel, x, backend=backend, block_size=block))


def _reference64(x32, beta: float, rows):
    """float64 plain evaluation of one system (host array ``x32``): the field and the gradient of
    the energy on ``rows``, the whole energy (in row blocks: no ``n x n`` array)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    n, d = x32.shape
    blk = math.gcd(n, 1024)
    with _x64():
        x = jnp.asarray(np.asarray(x32, np.float64))

        @jax.jit
        def ref(x, r):
            xr = x[r]
            W = jnp.exp(beta * (xr @ x.T))
            F = W @ x / n
            v = F - jnp.sum(F * xr, -1, keepdims=True) * xr
            g = W @ x / n**2  # d/dx_i of sum_ij exp(beta <x_i, x_j>) / (2 n^2 beta)
            sums = jax.lax.map(
                lambda xb: jnp.sum(jnp.exp(beta * (xb @ x.T))), x.reshape(n // blk, blk, d)
            )
            return v, g, jnp.sum(sums) / (2 * n * n * beta)

        v, g, E = ref(x, jnp.asarray(rows))
        return np.asarray(v), np.asarray(g), float(E)


def sec_field(run: Run, sec: dict, P: dict) -> None:
    import jax
    import numpy as np

    import meanfield as mf

    beta, d = 1.0, P["d"]
    kernel = mf.kernels.USA(beta)
    accelerator = jax.default_backend() != "cpu"
    sec["tolerances"] = {k: TOLERANCES[k] for k in ("velocity", "energy", "grad")}
    cases = [(None, n) for n in P["single"]] + [(S, n) for S, n in P["batches"]]
    bytes_per = {"velocity": 2, "energy": 1, "grad": 3}  # n x n float32 arrays plain JAX holds
    for S, n in cases:
        label = f"{S or 1} x {n} x {d}"
        if run.section_left() < P["min_item_s"]:
            sec["rows"].append(dict(case=label, skipped="budget: not enough time left"))
            log(f"field {label}: skipped (budget)")
            continue
        keys = jax.random.split(jax.random.key(n + d), S or 1)
        x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(keys)
        x = x if S else x[0]
        x0 = np.asarray(x if not S else x[0])
        rows = np.arange(min(n, P["check_rows"])) * (n // min(n, P["check_rows"]))
        v64, g64, E64 = _reference64(x0, beta, rows)
        ref64 = {"velocity": v64, "energy": E64, "grad": g64}
        for q in ("velocity", "energy", "grad"):
            impls = [("meanfield", _meanfield(q, kernel), None)]
            if accelerator:
                impls.append(
                    ("meanfield, matmul precision highest", _meanfield(q, kernel), "highest")
                )
            else:  # the path accelerators run, on this CPU
                impls.append(("meanfield, backend='xla'", _meanfield(q, kernel, "xla"), None))
            if q == "velocity" and n >= P["block"][0]:
                b = P["block"][1]
                impls.append((f"meanfield, block_size={b}", _meanfield(q, kernel, None, b), None))
            impls.append(("plain JAX", _plain(q, beta), None))
            outs, times = {}, {}
            for impl, fn, prec in impls:
                r = dict(case=label, seeds=S or 1, n=n, d=d, quantity=q, impl=impl)
                sec["rows"].append(r)
                if run.section_left() < P["min_item_s"] / 4:
                    r["skipped"] = "budget: not enough time left"
                    continue
                if impl == "plain JAX":
                    need = (S or 1) * n * n * 4 * bytes_per[q]
                    free, where = free_memory()
                    r["needs_bytes"] = need
                    if free is not None and need > 0.8 * free:
                        r["skipped"] = (
                            f"memory: needs ~{need / 2**30:.1f} GiB of n x n arrays, "
                            f"{free / 2**30:.1f} GiB free ({where})"
                        )
                        log(f"field {label} {q} {impl}: skipped (memory)")
                        run.write()
                        continue
                try:
                    f = jax.vmap(fn) if S else fn
                    compiled, t_c = compile_fn(f, x, precision=prec)
                    tm = time_calls(lambda: compiled(x), P["target_s"], P["max_reps"])
                    out = np.asarray(tm.pop("out"))
                except Exception as e:
                    item_error(r, e, impl == "plain JAX")
                    run.write()
                    continue
                outs[impl], times[impl] = out, tm["median"]
                pairs = (S or 1) * n * n / tm["median"]
                r.update(
                    compile_s=t_c,
                    first_s=tm["first"],
                    run_s=tm["median"],
                    best_s=tm["best"],
                    reps=tm["reps"],
                    pairs_per_s=pairs,
                    precision=prec or "default",
                )
                fill_fractions(run.data)
                one = out[0] if S else out
                if q == "energy":
                    r["rel_f64"] = abs(float(one) - E64) / abs(E64)
                else:
                    r["rel_f64"] = rel_diff(one[rows], ref64[q])
                check = enforced(accelerator, "float32", prec)
                add_check(
                    sec,
                    f"{label} {q} {impl} vs float64",
                    r["rel_f64"],
                    TOLERANCES[q] if check else None,
                    ""
                    if check
                    else "float32 at the default matmul precision (TF32 on NVIDIA): recorded",
                )
                log(
                    f"field {label} {q} {impl}: compile {fmt_t(t_c)} run {fmt_t(tm['median'])} "
                    f"({tm['reps']} reps) {pairs:.3g} pairs/s rel diff vs f64 {r['rel_f64']:.1e}"
                )
                run.write()
                del out, one
            if "plain JAX" in times:
                for r in sec["rows"]:
                    if r.get("case") == label and r.get("quantity") == q and "run_s" in r:
                        r["vs_plain"] = times["plain JAX"] / r["run_s"]
                        if r["impl"] != "plain JAX":
                            r["rel_plain"] = rel_diff(outs[r["impl"]], outs["plain JAX"])
                            if r["impl"] == "meanfield":
                                check = enforced(accelerator, "float32", None)
                                add_check(
                                    sec,
                                    f"{label} {q} meanfield vs plain JAX",
                                    r["rel_plain"],
                                    2 * TOLERANCES[q] if check else None,
                                    "" if check else "float32, default matmul precision: recorded",
                                )
            del outs
            run.write()
    sec["notes"] += [
        "USA(1.0), float32, d = 3: `mf.velocity`, `mf.energy`, `jax.grad` of `mf.energy` under "
        "`jax.jit` (batches: `jax.vmap` over seeds), the library's default path (accelerators: the "
        "XLA formulation, dense up to n = 1024 then 512 x 1024 tiles). Plain JAX: the dense n x n "
        "formulation (`P_x exp(beta X X^T) X / n`, `sum exp(beta X X^T) / (2 n^2 beta)` and its "
        "`jax.grad`), skipped when its n x n arrays would not fit the free memory.",
        "compile: `jax.jit(f).lower(x).compile()`; run: median of repeats after a warm-up call. "
        "pairs/s: seeds x n^2 per second; of exp/s: against the measured `exp_f32` (one exp per "
        "pair); of GEMM-bound: 4 n^2 d flops (2 n^2 d for the energy) at the measured GEMM rate of "
        "the matmul precision of the products (meanfield's state HIGHEST: the HIGHEST rate; plain "
        "JAX: the DEFAULT rate, TF32 on NVIDIA). Both filled in once `roofline` (run last) has "
        "measured the rates. vs plain JAX: plain time / this time.",
        "rel diff vs float64: max |a - ref| / max |ref| over "
        f"{P['check_rows']} evenly spaced rows (the whole energy) of the first seed, against a "
        "float64 plain evaluation of the same float32 states.",
    ]


# ----------------------------------------------------------------------------
# 3. phase diagrams
# ----------------------------------------------------------------------------


def _x0_64(S, n, d, seed):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import meanfield as mf

    with _x64():
        keys = jax.random.split(jax.random.key(seed), S)
        return np.asarray(jax.vmap(lambda k: mf.sphere.uniform(k, n, d, jnp.float64))(keys))


def _phase_rows(run, sec, P, case, pairs, mine_call, plain_call, plain_scale, compare, check):
    """Time meanfield (first call: compile + run; second call: run) and the plain reference
    (one call; its compile from JAX's compile events), record rows and the agreement."""
    import numpy as np

    clock = CLOCK
    mine, t_first, c_first = clock.timed(mine_call)
    t_run = None
    if t_first < P["slow_call_s"] and run.section_left() > 2 * t_first:
        _, t_run, _ = clock.timed(mine_call)
    if t_run is None:
        t_run = t_first - (c_first or 0.0)
    r = dict(case=case, impl="meanfield", first_s=t_first, compile_s=c_first, run_s=t_run)
    r["pairs_per_s"] = pairs / t_run
    sec["rows"].append(r)
    log(
        f"phase {case} meanfield: first {fmt_t(t_first)} (compile {fmt_t(c_first)}) run {fmt_t(t_run)}"
    )
    run.write()
    if plain_call is None:
        return mine, r
    if run.section_left() < P["min_item_s"] / 2:
        sec["rows"].append(
            dict(case=case, impl="plain JAX", skipped="budget: not enough time left")
        )
        return mine, r
    try:
        plain, t_total, c_plain = clock.timed(plain_call)
    except Exception as e:
        rp = dict(case=case, impl="plain JAX (`references.phase_diagram_jax_plain`)")
        item_error(rp, e, True)
        sec["rows"].append(rp)
        return mine, r
    t_plain = (t_total - (c_plain or 0.0)) * plain_scale
    rp = dict(
        case=case,
        impl="plain JAX (`references.phase_diagram_jax_plain`)",
        first_s=t_total,
        compile_s=c_plain,
        run_s=t_plain,
        scale=plain_scale,
        pairs_per_s=pairs / t_plain,
    )
    rp["vs_plain"] = 1.0
    r["vs_plain"] = t_plain / t_run
    a, b = compare(mine, plain)
    diff = float(np.max(np.abs(a - b))) if a.size else float("nan")
    rp["max_diff"] = diff
    sec["rows"].append(rp)
    add_check(sec, f"{case}: meanfield vs plain JAX (per-seed fraction)", diff, check)
    log(f"phase {case} plain: {fmt_t(t_total)} (compile {fmt_t(c_plain)}), max diff {diff:.1e}")
    run.write()
    return mine, r


def _guarded(sec: dict, case: str, fn):
    """``fn()``, or its exception recorded as an error row (the next case still runs)."""
    try:
        return fn()
    except Exception as e:
        r = dict(case=case, impl="meanfield")
        sec["rows"].append(r)
        item_error(r, e, False)
        return None


def sec_phase(run: Run, sec: dict, P: dict) -> None:
    import jax.numpy as jnp
    import numpy as np

    from meanfield import phase_diagram as pd

    from . import references as ref

    n, d, thr = 32, 2, 0.999
    tol = TOLERANCES["fraction"]
    # SA: Euler dt to t1, the same steps for every beta
    c = P["sa"]
    S, B, C = c["seeds"], c["betas"], c["checkpoints"]
    betas = np.linspace(0.1, 9.0, B)
    N, h, idx = pd.checkpoint_steps(c["t1"], c["dt"], C)
    x0 = _x0_64(S, n, d, 0)
    case = f"SA, {S} seeds x {B} beta, {N} steps, float64"
    with _x64():
        x0j = jnp.asarray(x0)

        def sa(x, dt=c["dt"], t1=c["t1"], betas=betas, C=C):
            return pd.sa_phase_diagram(
                None, betas, x0=x, dt=dt, t1=t1, checkpoints=C, threshold=thr, per_seed=True
            ).per_seed

        def sa64():
            mine, r = _phase_rows(
                run, sec, P, case, S * B * N * n * n,
                lambda: sa(x0j),
                lambda: ref.phase_diagram_jax_plain(
                    x0j, betas, [h] * B, [N] * B, [idx] * B, threshold=thr
                ),
                1.0,
                lambda a, b: (a, b),
                tol,
            )  # fmt: skip
            r["steps"] = N
            return mine

        mine64 = _guarded(sec, case, sa64)
    if run.section_left() > P["min_item_s"]:
        x0f = jnp.asarray(x0, jnp.float32)
        case32 = f"SA, {S} seeds x {B} beta, {N} steps, float32"

        def sa32():
            mine32, r32 = _phase_rows(
                run, sec, P, case32, S * B * N * n * n, lambda: sa(x0f), None, 1.0, None, None
            )  # fmt: skip
            r32["steps"] = N
            if mine64 is not None:
                r32["mean_diff_vs_float64"] = float(np.nanmean(np.abs(mine32 - mine64)))

        _guarded(sec, case32, sa32)
    # USA: beta-dependent steps to t1 (BENCHMARKS.md's USA row), plain JAX capped at `cap` steps
    c = P["usa"]
    if run.section_left() < P["min_item_s"]:
        sec["rows"].append(dict(case="USA", skipped="budget: not enough time left"))
        return
    S, B, C, cap = c["seeds"], c["betas"], c["checkpoints"], c["cap"]
    betas = np.linspace(0.1, c["beta_max"], B)
    grids = [pd.checkpoint_steps(c["t1"], float(pd.usa_step_size(b)), C) for b in betas]
    Ns, hs, idxs = (list(v) for v in zip(*grids))
    Np = [min(k, cap) for k in Ns]
    ip = [np.minimum(i, m) for i, m in zip(idxs, Np)]
    full = [i for i, (a, b) in enumerate(zip(Ns, Np)) if a == b]
    x0 = _x0_64(S, n, d, 1)
    case = f"USA, {S} seeds x {B} beta, {sum(Ns)} steps in all (max {max(Ns)}), float64"
    with _x64():
        x0j = jnp.asarray(x0)

        def usa():
            _, r = _phase_rows(
                run, sec, P, case, S * sum(Ns) * n * n,
                lambda: pd.usa_phase_diagram(
                    None, betas, x0=x0j, t1=c["t1"], checkpoints=C, threshold=thr, per_seed=True
                ).per_seed,
                lambda: ref.phase_diagram_jax_plain(
                    x0j, betas, hs, Np, ip, threshold=thr, normalized=False
                ),
                sum(Ns) / sum(Np),
                lambda a, b: (a[full], b[full]),
                tol,
            )  # fmt: skip
            r["steps"] = sum(Ns)

        _guarded(sec, case, usa)
    sec["notes"] += [
        "n = 32, d = 2, threshold 0.999, betas evenly spaced from 0.1; SA: Euler dt to t1 (projected "
        "step), USA: step 0.1 / max(sqrt(beta) e^(beta - 1/2), 1) to t1 (BENCHMARKS.md's rows). "
        "meanfield: `sa_phase_diagram` / `usa_phase_diagram` (default backend: the XLA kernel on "
        "accelerators), first call (compile + run; compile = JAX's trace, lowering and compile "
        "events) then a second call (run). Plain JAX: `references.phase_diagram_jax_plain` "
        "(vmap seeds, scan steps, one compile per distinct step count), one call; its run time = "
        "call - compile events.",
        f"USA plain JAX: betas with more than {c['cap']} steps run their first {c['cap']}; its run "
        "time is scaled by total steps (the `scale` of its row); differences on the betas run to "
        "the end. pairs/s: seeds x steps x n^2 per second of run.",
    ]


# ----------------------------------------------------------------------------
# 4. a sweep chunk
# ----------------------------------------------------------------------------

SWEEP_TOML = """\
name = "device"
description = "sweeps/smoke.toml's USA model and observables at device sizes"
dtype = "float32"

[model]
kind = "usa"

[grid]
n = {n}
d = 3
beta = [0.5, 1.0, 2.0, 4.0]
seeds = {seeds}
seed = 0

[time]
t1 = {t1}
dt = 0.01
solver = "rk2"
save = 9

[output]
observables = ["collapse_gap", "energy", "clusters"]
cluster_threshold = 0.1
"""


def sec_sweep(run: Run, sec: dict, P: dict) -> None:
    import jax
    import numpy as np

    import meanfield as mf

    try:
        from meanfield.sweep import plan as sw_plan
        from meanfield.sweep import run as sw_run
        from meanfield.sweep import spec as sw_spec
        from meanfield.sweep import store as sw_store
    except ImportError as e:  # e.g. zarr imported by the package on this machine
        raise Skip(f"meanfield.sweep does not import here: {e}") from None
    c = P["sweep"]
    accelerator = jax.default_backend() != "cpu"
    spec = sw_spec.parse_spec(
        SWEEP_TOML.format(n=c["n"], seeds=c["seeds"], t1=c["t1"]), default_name="device"
    )
    plan = sw_plan.make_plan(spec, c["memory"], devices=1)
    runner = sw_run.Runner(plan)
    done: set[int] = set()
    for _, gi, sl in plan.chunks:
        if gi in done or len(done) >= c["groups"]:
            continue
        if run.section_left() < P["min_item_s"]:
            sec["rows"].append(dict(case=f"group {gi}", skipped="budget: not enough time left"))
            break
        done.add(gi)
        g = plan.groups[gi]
        size = plan.padded_size(g)
        params, seeds = sw_run.chunk_inputs(spec, g, sl, size)
        count = int(np.prod([s.stop - s.start for s in sl]))
        fn = sw_run._batched_program(spec, g, runner.sharding)
        put = lambda v: jax.make_array_from_callback(v.shape, runner.sharding, lambda i: v[i])  # noqa: E731
        dp, ds = {k: put(v) for k, v in params.items()}, put(seeds)
        try:
            t0 = time.perf_counter()
            compiled = fn.lower(dp, ds).compile()
            t_c = time.perf_counter() - t0
            tm = time_calls(lambda: compiled(dp, ds), P["target_s"], min(P["max_reps"], 3))
            out = {k: np.asarray(v)[:count] for k, v in tm.pop("out").items()}
        except Exception as e:
            r = dict(case=f"usa n = {g.n}, d = {g.d}: {count} points (padded {size})")
            sec["rows"].append(r)
            item_error(r, e, False)
            run.write()
            continue
        steps = int(np.max(out["num_steps"]))
        ok = int(np.sum(out["status"] == sw_store.OK))
        case = f"usa n = {g.n}, d = {g.d}: {count} points (padded {size}), {steps} RK2 steps"
        r = dict(
            case=case,
            n=g.n,
            d=g.d,
            points=count,
            padded=size,
            steps=steps,
            compile_s=t_c,
            first_s=tm["first"],
            run_s=tm["median"],
            reps=tm["reps"],
            points_per_s=count / tm["median"],
            point_steps_per_s=count * steps / tm["median"],
            pairs_per_s=2 * size * steps * g.n**2 / tm["median"],
            status_ok=ok,
        )
        sec["rows"].append(r)
        add_check(sec, f"{case}: points failed", float(count - ok), 0.0)
        # point 0 against mf.simulate of the same model, start and settings
        beta0, seed0 = float(params["beta"][0]), int(seeds[0])
        tr = mf.simulate(
            mf.kernels.USA(beta0),
            mf.sphere.uniform(jax.random.key(seed0), g.n, g.d),
            t1=c["t1"],
            dt=0.01,
            solver="rk2",
            ts=spec.ts,
            save_states=False,
        )
        diff = rel_diff(out["energy"][0], np.asarray(tr.energy))
        r["rel_diff_point0"] = diff
        check = enforced(accelerator, "float32", None)
        add_check(
            sec,
            f"{case}: point 0 energy vs mf.simulate",
            diff,
            TOLERANCES["final energy"] if check else None,
            "" if check else "float32, default matmul precision: recorded",
        )
        log(
            f"sweep {case}: compile {fmt_t(t_c)} run {fmt_t(tm['median'])} "
            f"{r['point_steps_per_s']:.3g} point-steps/s, point 0 vs simulate {diff:.1e}"
        )
        run.write()
    sec["notes"].append(
        "One chunk per (n, d) group of a spec with sweeps/smoke.toml's model and observables "
        f"(n = {c['n']}, 4 betas x {c['seeds']} seeds, t1 = {c['t1']:g}, RK2 dt = 0.01, 9 saves, "
        f"float32), planned with `make_plan(spec, {c['memory']!r}, devices=1)`: the sweep's "
        "compiled, sharded program (`meanfield.sweep.run._batched_program`, inputs from "
        "`chunk_inputs`) lowered and compiled, then timed on that chunk in memory (no store). "
        "pairs/s: 2 field evaluations per step x padded points x n^2."
    )


# ----------------------------------------------------------------------------
# 5. long simulate
# ----------------------------------------------------------------------------


def _plain_sim(beta: float, h: float, steps: int):
    """Projected Heun (``mf.simulate``'s ``solver="rk2"``) as a ``lax.scan``: ``k1 = f(x)``,
    ``k2 = f(x + h k1)`` with ``f`` the tangent field at the normalised state, then
    ``x <- normalize(x + h (k1 + k2) / 2)``; returns the final energy."""
    import jax
    import jax.numpy as jnp

    def f(x):
        xh = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
        F = jnp.exp(beta * (xh @ xh.T)) @ xh / x.shape[0]
        return F - jnp.sum(F * xh, -1, keepdims=True) * xh

    def body(x, _):
        k1 = f(x)
        k2 = f(x + h * k1)
        x = x + 0.5 * h * (k1 + k2)
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True), None

    def run(x0):
        x, _ = jax.lax.scan(body, x0, None, length=steps)
        n = x.shape[0]
        return jnp.sum(jnp.exp(beta * (x @ x.T))) / (2 * n * n * beta)

    return run


def sec_simulate(run: Run, sec: dict, P: dict) -> None:
    import jax
    import numpy as np

    import meanfield as mf

    c = P["sim"]
    beta, d, t1, dt = 1.0, 3, c["t1"], c["dt"]
    steps = int(round(t1 / dt))
    kernel = mf.kernels.USA(beta)
    accelerator = jax.default_backend() != "cpu"

    def mine(x):
        tr = mf.simulate(kernel, x, t1=t1, dt=dt, solver="rk2", save_states=False)
        return tr.energy[-1], tr.num_steps

    for S, n in ((None, c["n"]), (c["seeds"], c["n_batch"])):
        case = f"{S or 1} x {n} x {d}, {steps} RK2 steps" + (" (vmapped)" if S else "")
        if run.section_left() < P["min_item_s"]:
            sec["rows"].append(dict(case=case, skipped="budget: not enough time left"))
            continue
        keys = jax.random.split(jax.random.key(7 + n), S or 1)
        x = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(keys)
        x = x if S else x[0]
        res = {}
        for impl, fn in (
            ("meanfield", mine),
            ("plain JAX (lax.scan)", _plain_sim(beta, dt, steps)),
        ):
            r = dict(case=case, seeds=S or 1, n=n, impl=impl)
            sec["rows"].append(r)
            if run.section_left() < P["min_item_s"] / 3:
                r["skipped"] = "budget: not enough time left"
                continue
            try:
                f = jax.vmap(fn) if S else fn
                compiled, t_c = compile_fn(f, x)
                tm = time_calls(lambda: compiled(x), P["target_s"], min(P["max_reps"], 3))
                out = tm.pop("out")
            except Exception as e:
                item_error(r, e, impl != "meanfield")
                run.write()
                continue
            E = np.asarray(out[0] if impl == "meanfield" else out)
            nsteps = int(np.max(np.asarray(out[1]))) if impl == "meanfield" else steps
            res[impl] = (E, tm["median"])
            r.update(
                compile_s=t_c,
                first_s=tm["first"],
                run_s=tm["median"],
                reps=tm["reps"],
                steps=nsteps,
                steps_per_s=nsteps / tm["median"],
                system_steps_per_s=(S or 1) * nsteps / tm["median"],
                pairs_per_s=2 * (S or 1) * nsteps * n * n / tm["median"],
            )
            log(
                f"simulate {case} {impl}: compile {fmt_t(t_c)} run {fmt_t(tm['median'])} "
                f"{r['steps_per_s']:.3g} steps/s"
            )
            run.write()
        if len(res) == 2:
            (Em, _), (Ep, tp) = res["meanfield"], res["plain JAX (lax.scan)"]
            diff = rel_diff(Em, Ep)
            for r in sec["rows"]:
                if r.get("case") == case and "run_s" in r:
                    r["vs_plain"] = tp / r["run_s"]
                    r["rel_diff_final_energy"] = diff
            check = enforced(accelerator, "float32", None)
            add_check(
                sec,
                f"{case}: final energy meanfield vs plain JAX",
                diff,
                TOLERANCES["final energy"] if check else None,
                "" if check else "float32, default matmul precision: recorded",
            )
    sec["notes"].append(
        f"`mf.simulate(mf.kernels.USA(1.0), x0, t1={t1:g}, dt={dt:g}, solver='rk2', "
        "save_states=False)` under `jax.jit` (the batch: `jax.vmap` over seeds, one program) "
        "against a plain-JAX `lax.scan` of the same projected Heun steps (dense n x n field); "
        "compile separately, run = median after a warm-up. steps/s: steps of one run per second; "
        "pairs/s: 2 field evaluations per step x seeds x n^2. The check compares the final energies."
    )


# ----------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------


def _not_run(r: dict) -> str:
    if r.get("error"):
        return f"ERROR: `{r['error'].splitlines()[0][:200]}`"
    return f"skipped ({r.get('skipped', 'not run')})"


def _sec_head(name: str, sec: dict) -> list[str]:
    st = sec.get("status", "?")
    head = f"**{st}** in {sec.get('elapsed_s', 0.0):.1f} s"
    if st == "skipped":
        head = f"**skipped**: {sec.get('reason', '')}"
    if sec.get("error"):
        head += f"; error: `{sec['error'].strip().splitlines()[-1][:300]}`"
    return [head, ""]


def _checks_md(sec: dict) -> list[str]:
    bad = [c for c in sec.get("checks", []) if c["ok"] is False]
    rec = [c for c in sec.get("checks", []) if c["ok"] is None]
    lines = []
    if bad:
        lines.append(
            "- CHECKS FAILED: "
            + "; ".join(f"{c['name']}: {c['value']:.2e} > {c['tol']:g}" for c in bad)
        )
    n_ok = sum(1 for c in sec.get("checks", []) if c["ok"])
    if sec.get("checks"):
        lines.append(
            f"- checks: {n_ok} within tolerance, {len(bad)} out of tolerance, {len(rec)} recorded "
            "without a tolerance (float32 at the default matmul precision on an accelerator)"
        )
    return lines


def _summary(data: dict) -> list[str]:
    """The rows of BENCHMARKS.md's accelerator table."""
    lim = data.get("limits", {})
    S = data.get("sections", {})
    kind = data["meta"].get("device_kind", "device")
    out = [f"| measurement | {kind} | vs plain JAX |", "|---|---|---|"]

    def lim_row(label, key, unit):
        v = lim.get(key)
        out.append(f"| {label} | {fmt_g(v) + ' ' + unit if v else 'not measured'} | - |")

    lim_row("GEMM float32, `Precision.HIGHEST`", "gemm_f32_highest", "flop/s")
    lim_row("GEMM float32, `Precision.DEFAULT` (TF32 on NVIDIA)", "gemm_f32_default", "flop/s")
    lim_row("GEMM float64", "gemm_f64", "flop/s")
    lim_row("memory bandwidth (scaled copy)", "bandwidth", "bytes/s")
    lim_row("exp/s, `sum(exp(a))` over an array (float32)", "exp_f32", "exp/s")
    lim_row("exp/s, arguments formed in registers (float32)", "exp_f32_registers", "exp/s")
    lim_row("exp/s, `sum(exp(a))` over an array (float64)", "exp_f64", "exp/s")
    for r in S.get("field", {}).get("rows", []):
        if r.get("impl") == "meanfield":
            val = (
                f"{fmt_t(r['run_s'])} ({fmt_g(r['pairs_per_s'])} pairs/s)"
                if "run_s" in r
                else _not_run(r)
            )
            out.append(f"| {r['quantity']}, {r['case']} | {val} | {fmt_r(r.get('vs_plain'))} |")
    for name in ("phase", "sweep", "simulate"):
        for r in S.get(name, {}).get("rows", []):
            if r.get("impl", "meanfield") != "meanfield" or "case" not in r:
                continue
            label = {"phase": "phase diagram", "sweep": "sweep chunk", "simulate": "simulate"}[name]
            val = fmt_t(r["run_s"]) if "run_s" in r else _not_run(r)
            if "steps_per_s" in r:
                val += f" ({fmt_g(r['steps_per_s'])} steps/s)"
            if "point_steps_per_s" in r:
                val += f" ({fmt_g(r['point_steps_per_s'])} point-steps/s)"
            out.append(f"| {label}: {r['case']} | {val} | {fmt_r(r.get('vs_plain'))} |")
    return out


def markdown(data: dict) -> str:
    m = data["meta"]
    S = data.get("sections", {})
    L = [
        f"### `python -m benchmarks.device{' --smoke' if m.get('profile') == 'smoke' else ''}` "
        f"on {m.get('device_kind', '?')}",
        "",
        f"{m.get('date', '')}; {m.get('device_count', '?')} x {m.get('device_kind', '?')} "
        f"(platform {m.get('platform', '?')}), jax {m.get('jax', '?')}, jaxlib {m.get('jaxlib', '?')}, "
        f"python {m.get('python', '?')}, meanfield at git {m.get('git_rev', '?')}; profile "
        f"{m.get('profile', '?')}, EQX_ON_ERROR {m.get('eqx_on_error', '?')}, default matmul "
        f"precision {m.get('matmul_precision', '?')}; budget {m.get('budget_s', 0):.0f} s, total "
        f"{m.get('total_s', time.perf_counter() - T_START):.0f} s. Section wall times: "
        + ", ".join(
            f"{k} {v.get('elapsed_s', 0.0):.0f} s ({v.get('status', '?')})" for k, v in S.items()
        ),
        "",
    ]
    if m.get("calls"):  # results merged from several calls on the same machine
        L += [f"Merged from {len(m['calls'])} calls on the same machine: {m.get('merged', '')}", ""]
        for c in m["calls"]:
            L.append(
                f"- call {c.get('call', '?')} ({c.get('date', '?')}): `python -m benchmarks.device "
                f"{' '.join(c.get('argv', []))}`, budget {c.get('budget_s', 0):.0f} s, total "
                f"{c.get('total_s', 0):.0f} s; sections taken from it: "
                f"{', '.join(c.get('sections', []))}. {c.get('outcome', '')}"
            )
        L.append("")
    L += _summary(data) + [""]
    if "roofline" in S:
        sec = S["roofline"]
        title = "#### Roofline" + ("" if m.get("calls") else " (measured in this run)")
        L += [title, ""] + _sec_head("roofline", sec)
        L += ["| quantity | value | compile | how |", "|---|---|---|---|"]
        for r in sec.get("rows", []):
            if "value" not in r:
                L.append(f"| {r.get('quantity', '-')} | {_not_run(r)} | | |")
                continue
            L.append(
                f"| {r['quantity']} | {fmt_g(r['value'])} {r['unit']} | "
                f"{fmt_t(r.get('compile_s'))} | {r['note']} |"
            )
        L += [""] + [f"- {n}" for n in sec.get("notes", [])] + _checks_md(sec) + [""]
    if "field" in S:
        sec = S["field"]
        L += ["#### Field, energy and gradient (USA, float32)", ""] + _sec_head("field", sec)
        L += [
            "| seeds x n x d | quantity | implementation | compile | run | pairs/s | of exp/s "
            "| of GEMM-bound | vs plain JAX | rel diff vs float64 | rel diff vs plain JAX |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sec.get("rows", []):
            if "skipped" in r or "run_s" not in r:
                L.append(
                    f"| {r['case']} | {r.get('quantity', '-')} | {r.get('impl', '-')} | "
                    f"{_not_run(r)} | | | | | | | |"
                )
                continue
            L.append(
                f"| {r['case']} | {r['quantity']} | {r['impl']} | {fmt_t(r['compile_s'])} | "
                f"{fmt_t(r['run_s'])} | {fmt_g(r['pairs_per_s'])} | {fmt_g(r.get('frac_exp'), True)} | "
                f"{fmt_g(r.get('frac_gemm'), True)} | {fmt_r(r.get('vs_plain'))} | "
                f"{r['rel_f64']:.1e} | "
                + (f"{r['rel_plain']:.1e}" if r.get("rel_plain") is not None else "-")
                + " |"
            )
        L += [""] + [f"- {n}" for n in sec.get("notes", [])] + _checks_md(sec) + [""]
    for name, title, cols in (
        (
            "phase",
            "#### Phase diagrams (n = 32, d = 2)",
            [
                ("implementation", "impl"),
                ("first call", "first_s"),
                ("of it compile", "compile_s"),
                ("run", "run_s"),
                ("pairs/s", "pairs_per_s"),
                ("plain / meanfield", "vs_plain"),
                ("max diff", "max_diff"),
            ],
        ),
        (
            "sweep",
            "#### A sweep chunk (in memory)",
            [
                ("compile", "compile_s"),
                ("run", "run_s"),
                ("points/s", "points_per_s"),
                ("point-steps/s", "point_steps_per_s"),
                ("pairs/s", "pairs_per_s"),
                ("point 0 vs simulate", "rel_diff_point0"),
            ],
        ),
        (
            "simulate",
            "#### Long simulate (USA(1.0), float32)",
            [
                ("implementation", "impl"),
                ("compile", "compile_s"),
                ("run", "run_s"),
                ("steps/s", "steps_per_s"),
                ("pairs/s", "pairs_per_s"),
                ("plain / this", "vs_plain"),
                ("final energy rel diff", "rel_diff_final_energy"),
            ],
        ),
    ):
        if name not in S:
            continue
        sec = S[name]
        L += [title, ""] + _sec_head(name, sec)
        L += ["| case | " + " | ".join(c for c, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for r in sec.get("rows", []):
            if "skipped" in r or "error" in r:
                first = f"{r['impl']} | " if cols[0][1] == "impl" and r.get("impl") else ""
                pad = len(cols) - (1 if first else 0)
                L.append(f"| {r.get('case', '-')} | {first}{_not_run(r)}" + " |" * pad)
                continue
            cells = []
            for _, k in cols:
                v = r.get(k)
                if k == "impl":
                    cells.append(str(v or "meanfield"))
                elif k.endswith("_s") and not k.endswith("per_s"):
                    cells.append(fmt_t(v))
                elif k == "vs_plain":
                    cells.append(fmt_r(v))
                elif k in ("max_diff", "rel_diff_point0", "rel_diff_final_energy"):
                    cells.append("-" if v is None else f"{v:.1e}")
                else:
                    cells.append(fmt_g(v))
            L.append(f"| {r.get('case', '-')} | " + " | ".join(cells) + " |")
        L += [""] + [f"- {n}" for n in sec.get("notes", [])] + _checks_md(sec) + [""]
    return "\n".join(L) + "\n"


# ----------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------


def _git_rev() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=10,
            ).stdout.strip()
            return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("MEANFIELD_GIT_REV", "unknown (no git here; pass --rev)")


def _meta(args, profile: str) -> dict:
    import jax

    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except (ImportError, AttributeError):
        jaxlib_version = "?"
    try:
        precision = str(jax.config.jax_default_matmul_precision)
    except AttributeError:
        precision = "?"
    dev = jax.devices()[0]
    free, where = free_memory()
    cpu = cpu_name()
    return dict(
        device_kind=str(getattr(dev, "device_kind", dev.platform)),
        platform=dev.platform,
        backend=jax.default_backend(),
        device_count=jax.device_count(),
        memory_free_bytes=free,
        memory_where=where,
        jax=jax.__version__,
        jaxlib=jaxlib_version,
        python=platform.python_version(),
        git_rev=args.rev or _git_rev(),
        date=f"{_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC",
        host_cpu=f"{cpu}, {os.cpu_count()} cores",
        profile=profile,
        budget_s=args.budget,
        argv=sys.argv[1:],
        matmul_precision=precision,
        # unset: equinox's in-program checks (meanfield's traced-value checks) are host callbacks
        eqx_on_error=os.environ.get("EQX_ON_ERROR", "unset"),
        env={
            k: os.environ[k]
            for k in (
                "EQX_ON_ERROR",
                "XLA_FLAGS",
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                "XLA_PYTHON_CLIENT_MEM_FRACTION",
                "MEANFIELD_NATIVE",
                "JAX_DEFAULT_MATMUL_PRECISION",
                "JAX_PLATFORMS",
            )
            if k in os.environ
        },
        tolerances=TOLERANCES,
    )


RUNNERS = {
    "roofline": sec_roofline,
    "field": sec_field,
    "phase": sec_phase,
    "sweep": sec_sweep,
    "simulate": sec_simulate,
}


def main(argv=None) -> int:
    global CLOCK
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.device", description=__doc__.split("\n\n")[1]
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, every code path (CPU, ~1 min)")
    p.add_argument(
        "--out",
        default=None,
        help="directory of device-<name>.json/.md (default benchmarks/results; "
        "a temporary directory with --smoke)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds from the start after which remaining work is skipped (default 420; 240 with --smoke)",
    )
    p.add_argument("--only", nargs="*", choices=SECTIONS, help="run only these sections")
    p.add_argument("--profile", choices=sorted(PROFILES), help="sizes (default: smoke with --smoke, "
                   "full on an accelerator, cpu on a CPU)")  # fmt: skip
    p.add_argument("--rev", default=None, help="git revision to record (where git is unavailable)")
    args = p.parse_args(argv)
    if args.budget is None:
        args.budget = 240.0 if args.smoke else 420.0

    import jax

    backend = jax.default_backend()
    profile = args.profile or ("smoke" if args.smoke else ("cpu" if backend == "cpu" else "full"))
    P = PROFILES[profile]
    if args.out:
        out = Path(args.out)
    elif args.smoke:
        out = Path(tempfile.mkdtemp(prefix="meanfield-device-"))
    else:
        out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    CLOCK = CompileClock()
    meta = _meta(args, profile)
    name = slug(meta["device_kind"]) if meta["platform"] != "cpu" else "cpu"
    run = Run(out, name, args.budget, args.smoke, meta)
    log(
        f"device {meta['device_kind']} ({meta['platform']}, {meta['device_count']} device(s)), "
        f"jax {meta['jax']}, profile {profile}, budget {args.budget:.0f} s, writing {run.json_path}"
    )
    watchdog = threading.Timer(max(1.0, run.left() + GRACE_S), run.abort)
    watchdog.daemon = True
    watchdog.start()
    # the fixed order whatever the order of --only: the roofline (where a compile can hang) last
    todo = [s for s in SECTIONS if s in (args.only or SECTIONS)]
    min_start = 2.0 if args.smoke else 10.0
    for i, sname in enumerate(todo):
        sec = {"status": "running", "rows": [], "checks": [], "notes": []}
        with run.lock:
            run.data["sections"][sname] = sec
            run.current = sname
        left = run.left()
        if left < min_start:
            sec.update(status="skipped", reason=f"deadline: {left:.0f} s of the budget left")
            log(f"section {sname}: skipped (deadline)")
            run.write()
            continue
        share = SHARES[sname] / sum(SHARES[s] for s in todo[i:])
        run.section_deadline = time.perf_counter() + left * share
        log(f"section {sname} (up to {left * share:.0f} s) ...")
        t0 = time.perf_counter()
        try:
            RUNNERS[sname](run, sec, P)
            sec["status"] = "ok"
        except Skip as e:
            sec.update(status="skipped", reason=str(e))
        except Exception as e:  # recorded; the other sections still run
            sec.update(status="failed", error=f"{type(e).__name__}: {e}")
            sec["traceback"] = traceback.format_exc()[-4000:]
            log(f"section {sname} FAILED: {type(e).__name__}: {e}")
        errs = [r for r in sec["rows"] if r.get("error")]
        if errs and sec["status"] == "ok":
            sec.update(
                status="failed",
                error=f"{len(errs)} measurement(s) failed: " + errs[0]["error"].splitlines()[0],
            )
        bad = [c for c in sec["checks"] if c["ok"] is False]
        if bad and sec["status"] == "ok":
            sec.update(
                status="failed",
                error=f"{len(bad)} check(s) out of tolerance: " + "; ".join(c["name"] for c in bad),
            )
        skipped_items = [r for r in sec["rows"] if "skipped" in r and "budget" in r["skipped"]]
        if args.smoke and skipped_items and sec["status"] == "ok":
            sec.update(
                status="failed", error=f"{len(skipped_items)} item(s) skipped for lack of time"
            )
        sec["elapsed_s"] = time.perf_counter() - t0
        log(f"section {sname}: {sec['status']} in {sec['elapsed_s']:.1f} s")
        run.write()
    watchdog.cancel()
    run.current = None
    fill_fractions(run.data)
    run.data["meta"]["total_s"] = time.perf_counter() - T_START
    run.write()
    print(run.md_path.read_text(), flush=True)
    failed = [k for k, v in run.data["sections"].items() if v["status"] == "failed"]
    if args.smoke:
        failed += [k for k, v in run.data["sections"].items() if v["status"] == "skipped"
                   and str(v.get("reason", "")).startswith("deadline")]  # fmt: skip
    log(
        f"wrote {run.json_path} and {run.md_path}; "
        + (f"FAILED: {', '.join(failed)}" if failed else "no section failed")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
