"""The fused CPU kernel of the phase-diagram sweep (``phase_kernel.c``), built at first use.

XLA:CPU runs the phase-diagram step as several passes over the ``(seeds, n, n)`` weights
(Gram matmul, exp, row sums, count, field matmul); at ``n = 32`` those passes, not the
exponentials, dominate. ``phase_kernel.c`` does one pass over the pairs ``i < j`` (half
the exponentials; ``w_ij`` is symmetric before the row normalisation) with the seeds in
SIMD lanes and the whole time loop of a block of seeds in L1 cache, threads over blocks
(OpenMP). BENCHMARKS.md has the measured speed-up. This is a CPU fast path for one
non-differentiable sweep, written by hand because no library fuses it;
``meanfield.phase_diagram``'s XLA kernel stays the reference it is tested against, and
everything else in meanfield is JAX.

The source is compiled once per machine and dtype (float64; float32 with ``-DMF_FLOAT32``)
with the system C compiler (``$CC``, else ``cc``/``gcc``/``clang``):
``-O3 -march=native -ffast-math -fopenmp`` (vectorised exponentials from glibc's libmvec;
no OpenMP: one thread), into a cache directory (``$MEANFIELD_CACHE_DIR``, else
``$XDG_CACHE_HOME/meanfield`` or ``~/.cache/meanfield``) under a name hashing the source,
the flags, the compiler's version and the CPU. The build is atomic (a temporary file
renamed), so concurrent processes are safe. Without a compiler, or with
``MEANFIELD_NATIVE=0``, ``available()`` is ``False`` and ``meanfield.phase_diagram`` uses
its XLA kernel (``backend="auto"``).

Numbers: the same operations as the XLA kernel, in another order, with libmvec's
exponential (within a few ulp of the correctly rounded value). In float64 the states agree
with the XLA kernel and with the plain reference loop to 1e-11 or better and the clustering
fractions are equal (tests/test_phase_diagram.py: n = 32, d = 2, 100 steps at beta up to 9;
d = 2, 3, 5); in float32 the states agree to float32 rounding amplified by the dynamics
(tested to 2e-4) and a pair within that distance of the threshold can count differently.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

__all__ = ["available", "unavailable_reason", "phase_run", "default_threads", "LANES", "DTYPES", "MAX_D", "SOURCE"]

#: seeds per SIMD block of the kernel, by dtype (``S`` is padded to a multiple)
LANES = {"float64": 8, "float32": 16}
#: dtypes with a kernel: the C source compiled once per dtype (float32 with ``-DMF_FLOAT32``)
DTYPES = ("float64", "float32")
#: largest dimension the kernel accepts
MAX_D = 64
#: the C source
SOURCE = Path(__file__).with_name("phase_kernel.c")
#: compiler flags, tried in order (the second without OpenMP: one thread)
FLAGS = (
    ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared"],
    ["-O3", "-march=native", "-ffast-math", "-fPIC", "-shared"],
)

_state: dict = {"lib": None, "error": None, "tried": False}
_lock = threading.Lock()


def _cache_dir() -> Path:
    if os.environ.get("MEANFIELD_CACHE_DIR"):
        return Path(os.environ["MEANFIELD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meanfield"


def _compiler() -> str | None:
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"].split()[0])
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _cpu_tag() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _compile(cc: str, version: str, source: bytes, defines: list[str]) -> ctypes.CDLL:
    """Compile (or load from the cache) one build of the source; the first flag set that works."""
    errors = []
    for flags in FLAGS:
        flags = [*flags, *defines]
        tag = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), version.encode(),
                                         _cpu_tag().encode()])).hexdigest()[:16]
        target = _cache_dir() / f"phase_kernel-{tag}.so"
        failed = target.with_suffix(".failed")  # a flag set this compiler rejected: not retried
        if failed.exists():
            errors.append(f"{' '.join(flags)}: {failed.read_text()[-500:]}")
            continue
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
            os.close(fd)
            r = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True,
                               text=True, timeout=300)
            if r.returncode != 0:
                os.unlink(tmp)
                errors.append(f"{' '.join(flags)}: {r.stderr.strip()[-500:]}")
                failed.write_text(r.stderr.strip() or f"exit status {r.returncode}")
                continue
            os.replace(tmp, target)
        return ctypes.CDLL(str(target))
    raise RuntimeError("the C compiler failed: " + " | ".join(errors))


def _build() -> dict:
    """``{dtype name: (entry point, ctypes pointer type of its reals)}`` for ``DTYPES``."""
    if os.environ.get("MEANFIELD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        raise RuntimeError("disabled by MEANFIELD_NATIVE=0")
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install cc/gcc/clang)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    source = SOURCE.read_bytes()
    kernels = {}
    ip = ctypes.POINTER(ctypes.c_int)
    dp = ctypes.POINTER(ctypes.c_double)
    for name, defines, entry, ctype in (("float64", [], "mf_phase_run", ctypes.c_double),
                                        ("float32", ["-DMF_FLOAT32"], "mf_phase_run_f32", ctypes.c_float)):
        lib = _compile(cc, version, source, defines)
        fn = getattr(lib, entry)
        rp = ctypes.POINTER(ctype)
        fn.argtypes = [rp, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_double,
                       ctypes.c_double, ctypes.c_int, ip, ctypes.c_int, ctypes.c_double, ctypes.c_int,
                       dp, rp, ctypes.c_int]
        fn.restype = ctypes.c_int
        lanes = int(lib.mf_lanes())
        if lanes != LANES[name]:
            raise RuntimeError(f"the {name} build has {lanes} lanes, expected {LANES[name]}")
        kernels[name] = (fn, rp)
    return kernels


def _library() -> dict | None:
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                _state["lib"] = _build()
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                _state["error"] = str(e)
        return _state["lib"]


def available() -> bool:
    """Whether the native kernel is built and loaded (builds it on the first call).

    Example:
        >>> from meanfield import _native
        >>> _native.available() == (_native.unavailable_reason() is None)
        True
    """
    return _library() is not None


def unavailable_reason() -> str | None:
    """Why ``available()`` is ``False`` (``None`` when it is available)."""
    _library()
    return _state["error"]


def default_threads() -> int:
    """Threads of the kernel: ``$OMP_NUM_THREADS`` if set, else the CPUs this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def phase_run(x0, beta: float, shift: float, step: float, nsteps: int, ckpt, threshold: float,
              normalized: bool, threads: int | None = None):
    """Run ``nsteps`` Euler steps of every seed of ``x0`` with the native kernel.

    Args:
        x0: ``(S, n, d)`` float64 or float32 array (any ``S``; padded internally to a multiple
            of ``LANES[dtype]``); the kernel computes in that dtype.
        beta, shift: weights ``exp(beta <x_i, x_j> - shift)``; step: Euler step in that scale.
        nsteps: number of steps; ckpt: distinct sorted step indices in ``[0, nsteps]`` whose
            state's clustering fraction is returned; threshold: on ``<x_i, x_j>``.
        normalized: SA (row-normalised) or USA (``1/n``) field.
        threads: OpenMP threads (default ``default_threads()``).

    Returns:
        ``(fractions (S, len(ckpt)), final states (S, n, d))``: NumPy arrays, float64 fractions,
        states in the dtype of ``x0``.

    Example:
        >>> import numpy as np
        >>> from meanfield import _native
        >>> x0 = np.tile([[1.0, 0.0], [0.0, 1.0]], (3, 1, 1))  # 3 seeds of two orthogonal particles
        >>> fr, xs = _native.phase_run(x0, 1.0, 0.0, 0.5, 40, [0, 40], 0.9, True)
        >>> fr.shape, xs.shape, fr[0].tolist()  # they meet: <x_1, x_2> > 0.9 at step 40
        ((3, 2), (3, 2, 2), [0.0, 1.0])
    """
    kernels = _library()
    if kernels is None:
        raise RuntimeError(f"the native phase-diagram kernel is not available: {_state['error']}")
    dtype = np.asarray(x0).dtype
    if dtype.name not in DTYPES:
        raise ValueError(f"x0 must be float64 or float32 for the native kernel, got dtype {dtype}")
    fn, rp = kernels[dtype.name]
    x0 = np.ascontiguousarray(x0)
    if x0.ndim != 3 or x0.shape[1] < 2 or not 1 <= x0.shape[2] <= MAX_D:
        raise ValueError(f"x0 must have shape (S, n, d) with n >= 2 and 1 <= d <= {MAX_D}, got {x0.shape}")
    S, n, d = x0.shape
    if isinstance(nsteps, bool) or not isinstance(nsteps, int | np.integer) or nsteps < 0:
        raise ValueError(f"nsteps must be an integer >= 0, got {nsteps!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    pad = (-S) % LANES[dtype.name]
    xp = np.concatenate([x0, np.repeat(x0[:1], pad, axis=0)]) if pad else x0
    ck = np.ascontiguousarray(ckpt, dtype=np.intc)
    if ck.ndim != 1 or (ck.size and (ck.min() < 0 or ck.max() > nsteps or np.any(np.diff(ck) <= 0))):
        raise ValueError(f"ckpt must be distinct sorted steps in [0, {nsteps}], got {ck.tolist()}")
    Sp = xp.shape[0]
    frac = np.zeros((Sp, ck.size))
    xout = np.empty_like(xp)
    rc = fn(
        xp.ctypes.data_as(rp), Sp, n, d, float(beta), float(shift), float(step), int(nsteps),
        ck.ctypes.data_as(ctypes.POINTER(ctypes.c_int)), ck.size, float(threshold), int(bool(normalized)),
        frac.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), xout.ctypes.data_as(rp),
        int(threads or default_threads()),
    )
    if rc != 0:
        raise RuntimeError(f"the native phase-diagram kernel failed (S={S}, n={n}, d={d})")
    return frac[:S], xout[:S]
