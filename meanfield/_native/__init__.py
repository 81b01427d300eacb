"""Fused CPU kernels, compiled once per machine and cached: the phase-diagram sweep (``phase_kernel.c``, called
through ctypes) and the exp-kernel field (``exp_kernel.c``, an XLA FFI custom call that
``meanfield.kernels`` places inside any jitted, vmapped or differentiated program on the CPU).

Exp-kernel field (``exp_field_xla``; ``exp_field`` is the same code on NumPy arrays): XLA runs
``exp(beta X X^T) X`` as a matmul, an exponential pass over the ``n x n`` weights and a second
matmul, with all ``n^2`` exponentials and an ``n x n`` temporary per system. ``exp_kernel.c``
evaluates only the pairs ``i <= j`` (the weights are symmetric) in one pass over blocks of
rows, memory O(n d) per thread. ``meanfield.kernels`` wraps it in a ``custom_jvp`` whose
tangents are those of the XLA formulation, and in ``jax.lax.platform_dependent``, so that
other platforms run the XLA formulation. It needs jaxlib's FFI headers
(``jax.ffi.include_dir()``), checked by a self-test call through XLA at first use.

Phase-diagram sweep:

XLA:CPU runs the phase-diagram step as several passes over the ``(seeds, n, n)`` weights
(Gram matmul, exp, row sums, count, field matmul); at ``n = 32`` those passes, not the
exponentials, dominate. ``phase_kernel.c`` does one pass over the pairs ``i < j`` (half
the exponentials; ``w_ij`` is symmetric before the row normalisation) with the seeds in
SIMD lanes and the whole time loop of a block of seeds in L1 cache, threads over blocks
(OpenMP). BENCHMARKS.md has the measured speed-up. This is a CPU fast path for one
non-differentiable sweep, written by hand because no library fuses it;
``meanfield.phase_diagram``'s XLA kernel stays the reference it is tested against.

Both are the deliberate exceptions to "everything is JAX": CPU fast paths for the two hot loops,
each tested against the XLA formulation it replaces.

Each source is compiled once per machine and dtype (float64; float32 with ``-DMF_FLOAT32``)
with the system C compiler (``$CC``, else ``cc``/``gcc``/``clang``):
``-O3 -march=native -ffast-math -fopenmp`` (vectorised exponentials from glibc's libmvec;
no OpenMP: one thread), then linked without ``-ffast-math`` (GCC's ``crtfastmath.o`` would set
flush-to-zero for the whole process when the library loads), into a cache directory (``$MEANFIELD_CACHE_DIR``, else
``$XDG_CACHE_HOME/meanfield`` or ``~/.cache/meanfield``) under a name hashing the source,
the flags, the compiler's version and the CPU. The build is atomic (a temporary file
renamed), so concurrent processes are safe. Without a compiler, or with
``MEANFIELD_NATIVE=0``, ``available()`` and ``exp_available()`` are ``False``:
``meanfield.phase_diagram`` uses its XLA kernel (``backend="auto"``) and ``meanfield.kernels``
the XLA formulation of the fields.

When the compiler runs: the exp kernel at ``import meanfield.kernels`` (``prepare()``:
``build_exp()`` if it is not cached, then load and register the FFI targets, with one line on
stderr when it compiles), never while a function is being traced: ``exp_available()``, read by
``meanfield.kernels`` at trace time, only reports. ``prepare()`` initialises no JAX backend
(``XLA_FLAGS`` and ``jax.config`` set after ``import meanfield`` still apply); the self-test
through XLA runs at the first ``exp_available()``. The phase kernel, called outside any
trace, is built at its first use (``available()``, ``build_phase()``). ``meanfield info``
reports both, and ``meanfield info --rebuild-native`` rebuilds them.

Numbers (phase kernel): the same operations as the XLA kernel, in another order, with libmvec's
exponential (within a few ulp of the correctly rounded value). In float64 the states agree
with the XLA kernel and with the plain reference loop to 1e-11 or better and the clustering
fractions are equal (tests/test_phase_diagram.py: n = 32, d = 2, 100 steps at beta up to 9;
d = 2, 3, 5); in float32 the states agree to float32 rounding amplified by the dynamics
(tested to 2e-4) and a pair within that distance of the threshold can count differently.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["available", "unavailable_reason", "phase_run", "default_threads", "LANES", "DTYPES", "MAX_D", "SOURCE",
           "exp_available", "exp_unavailable_reason", "exp_field", "exp_field_xla", "set_exp_threads", "EXP_SOURCE",
           "EXP_TARGETS", "EXP_LANES", "EXP_MAX_D", "exp_default_threads", "exp_threads", "prepare",
           "build_exp", "build_phase", "FLAGS", "BUILD_RECIPE"]

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

#: how a library is built (part of its cache name): compile, then link without -ffast-math
BUILD_RECIPE = "compile -c, link -shared without -ffast-math"

_state: dict = {"lib": None, "error": None, "tried": False}
_lock = threading.RLock()


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


@functools.cache
def _cpu_tag() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _disabled() -> bool:
    return os.environ.get("MEANFIELD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


@functools.cache
def _compiler_version(cc: str) -> str:
    """``cc --version`` (part of every cache name): run once per compiler and process."""
    return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout


def _toolchain() -> tuple[str, str]:
    """``(compiler, its --version text)``; RuntimeError when disabled or missing."""
    if _disabled():
        raise RuntimeError("disabled by MEANFIELD_NATIVE=0")
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install cc/gcc/clang)")
    return cc, _compiler_version(cc)


def _library_paths(cc: str, version: str, source_path: Path, defines: list[str],
                   include: tuple[str, ...] | list[str] = ()) -> list[tuple[list[str], Path]]:
    """``(flags, cached library)`` of each flag set of ``FLAGS``, in the order they are tried.

    The cache name hashes the source, the headers it includes from ``include`` (their bytes),
    the flags, the compiler's version, the CPU and the build recipe."""
    source = source_path.read_bytes()
    headers = b"".join(sorted(p.read_bytes() for d in include for p in Path(d).rglob("c_api.h")))
    out = []
    for flags in FLAGS:
        flags = [*flags, *defines, *(f"-I{d}" for d in include)]
        tag = hashlib.sha256(b"\0".join([source, headers, " ".join(flags).encode(), version.encode(),
                                         _cpu_tag().encode(), BUILD_RECIPE.encode()])).hexdigest()[:16]
        out.append((flags, _cache_dir() / f"{source_path.stem}-{tag}.so"))
    return out


def _build_one(cc: str, version: str, source_path: Path, defines: list[str],
               include: tuple[str, ...] | list[str] = (), *, force: bool = False, announce=None,
               may_compile: bool = True) -> Path:
    """The cached library of one build of a source, compiled (``_compile``) with the first flag
    set that works if it is not in the cache. A flag set the compiler rejected is marked
    (``.failed``) and not tried again; ``force`` removes the libraries and marks first.
    ``may_compile=False`` only looks in the cache. ``announce()`` is called before compiling."""
    paths = _library_paths(cc, version, source_path, defines, include)
    if force:
        for _, target in paths:
            for stale in (target, target.with_suffix(".failed")):
                stale.unlink(missing_ok=True)
    errors = []
    for flags, target in paths:
        failed = target.with_suffix(".failed")  # a flag set this compiler rejected: not retried
        if failed.exists():
            errors.append(f"{' '.join(flags)}: {failed.read_text()[-500:]}")
            continue
        if not target.exists():
            if not may_compile:
                raise RuntimeError(f"not built ({target.name} is not in {target.parent}; "
                                   "meanfield.kernels builds it at import, `meanfield info --rebuild-native` too)")
            if announce is not None:
                announce()
            error = _compile(cc, flags, source_path, target)
            if error is not None:
                errors.append(f"{' '.join(flags)}: {error[-500:]}")
                failed.parent.mkdir(parents=True, exist_ok=True)
                failed.write_text(error)
                continue
        return target
    raise RuntimeError("the C compiler failed: " + " | ".join(errors))


def _compile(cc: str, flags: list[str], source_path: Path, target: Path) -> str | None:
    """Run the C compiler: ``source_path`` with ``flags`` into ``target``, atomically (a temporary
    file renamed, so concurrent processes are safe). Returns ``None``, or the compiler's error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        r = _compile_and_link(cc, flags, source_path, tmp)
        if r.returncode != 0:
            return r.stderr.strip() or f"exit status {r.returncode}"
        os.replace(tmp, target)
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile_and_link(cc: str, flags: list[str], source_path: Path, out: str) -> subprocess.CompletedProcess:
    """Compile with ``flags``, then link as a shared library WITHOUT ``-ffast-math``: linked
    with it, GCC adds ``crtfastmath.o``, whose constructor sets flush-to-zero for the whole
    process when the library is loaded (every subnormal in NumPy/JAX would become 0)."""
    obj = out + ".o"
    compile_flags = [f for f in flags if f != "-shared"]
    link_flags = ["-shared", *(f for f in flags if f in ("-fopenmp", "-fPIC"))]
    try:
        r = subprocess.run([cc, *compile_flags, "-c", "-o", obj, str(source_path)], capture_output=True,
                           text=True, timeout=300)
        if r.returncode == 0:
            r = subprocess.run([cc, *link_flags, "-o", out, obj, "-lm"], capture_output=True, text=True,
                               timeout=300)
        return r
    finally:
        if os.path.exists(obj):
            os.unlink(obj)


def _build_all(what: str, source_path: Path, include: list[str], force: bool) -> dict[str, Path]:
    """Every dtype of ``_BUILDS`` of one source; one line on stderr when the compiler runs (and
    one more if it fails: the fields then run the XLA formulation, ``meanfield info`` says why)."""
    cc, version = _toolchain()
    said: list[bool] = []

    def announce() -> None:
        if not said:
            said.append(True)
            print(f"meanfield: building the native {what} (once, cached in {_cache_dir()}) ...",
                  file=sys.stderr, flush=True)

    try:
        return {name: _build_one(cc, version, source_path, defines, include, force=force, announce=announce)
                for name, defines, _, _ in _BUILDS}
    except RuntimeError:
        if said:
            print(f"meanfield: the native {what} could not be built (`meanfield info` says why); "
                  "the XLA path runs instead", file=sys.stderr, flush=True)
        raise


def _reason(e: Exception) -> str:
    return str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"


#: the builds of each source: (dtype, -D flags, suffix of the entry points, C type of the reals)
_BUILDS: tuple[tuple[str, list[str], str, Any], ...] = (
    ("float64", [], "_f64", ctypes.c_double), ("float32", ["-DMF_FLOAT32"], "_f32", ctypes.c_float))


def build_phase(force: bool = False) -> dict[str, Path]:
    """Compile both dtypes of ``phase_kernel.c`` into the cache, unless they are there already.

    Runs the C compiler only for a library missing from the cache (or every one with ``force``,
    which first removes this source's cached libraries and failure marks for the current
    compiler), printing one line to stderr first. ``available()`` builds on its first call.

    Returns:
        ``{dtype name: path of the shared library}``.

    Raises:
        RuntimeError: disabled (``MEANFIELD_NATIVE=0``), no compiler, or the compiler failed
        (the message says which).
    """
    return _build_all("phase-diagram kernel", SOURCE, [], force)


def _build() -> dict:
    """``{dtype name: (entry point, ctypes pointer type of its reals)}`` for ``DTYPES``."""
    paths = build_phase()
    kernels = {}
    ip = ctypes.POINTER(ctypes.c_int)
    dp = ctypes.POINTER(ctypes.c_double)
    for name, _, suffix, ctype in _BUILDS:
        lib = ctypes.CDLL(str(paths[name]))
        fn = getattr(lib, "mf_phase_run" if name == "float64" else f"mf_phase_run{suffix}")
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
    return _once(_state, _build)


def _once(state: dict, build) -> dict | None:
    """``build()`` on the first call (its error kept in ``state``), thread-safe."""
    with _lock:
        if not state["tried"]:
            state["tried"] = True
            try:
                state["lib"] = build()
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                state["error"] = _reason(e)
        return state["lib"]


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


# ----------------------------------------------------------------------------
# the exp-kernel field (exp_kernel.c), an XLA FFI custom call
# ----------------------------------------------------------------------------

#: the C source of the fused exp-kernel field (``meanfield.kernels``' CPU fast path)
EXP_SOURCE = Path(__file__).with_name("exp_kernel.c")
#: XLA FFI targets by dtype: (field and sum, sum only)
EXP_TARGETS = {"float64": ("meanfield_exp_fs_f64", "meanfield_exp_s_f64"),
               "float32": ("meanfield_exp_fs_f32", "meanfield_exp_s_f32")}
#: columns per SIMD vector of the exp kernel, by dtype
EXP_LANES = {"float64": 8, "float32": 16}
#: largest dimension the exp kernel accepts
EXP_MAX_D = 64

_exp_state: dict = {"lib": None, "error": None, "prepared": False, "tested": False, "threads": None}


def _exp_include() -> str:
    import jax.ffi

    return jax.ffi.include_dir()


def build_exp(force: bool = False) -> dict[str, Path]:
    """Compile both dtypes of ``exp_kernel.c`` into the cache, unless they are there already.

    Runs the C compiler only for a library missing from the cache (or every one with ``force``,
    which first removes this source's cached libraries and failure marks for the current
    compiler and FFI headers), printing one line to stderr first. ``prepare()`` calls it when
    ``meanfield.kernels`` is imported, so that the compiler never runs while a function is
    being traced. Initialises no JAX backend.

    Returns:
        ``{dtype name: path of the shared library}``.

    Raises:
        RuntimeError: disabled (``MEANFIELD_NATIVE=0``), no compiler, or the compiler failed
        (the message says which).

    Example:
        >>> from meanfield import _native
        >>> if _native.exp_available():  # built (at import), so found in the cache: no compiler runs
        ...     print(sorted(_native.build_exp()))
        ... else:
        ...     print(['float32', 'float64'])
        ['float32', 'float64']
    """
    return _build_all("CPU kernels", EXP_SOURCE, [_exp_include()], force)


def _load_exp(paths: dict[str, Path]) -> dict:
    """dlopen the exp-kernel libraries and register their FFI targets with XLA (for the CPU).

    Registration initialises no JAX backend: ``xla_client.register_custom_call_target`` adds
    the handlers to XLA's process-wide table of targets, which needs no client (tested in
    tests/test_info.py: ``XLA_FLAGS`` set after ``import meanfield`` still apply)."""
    import jax.ffi

    libs = {}
    for name, _, suffix, ctype in _BUILDS:
        lib = ctypes.CDLL(str(paths[name]))
        lanes = int(getattr(lib, f"mf_exp_lanes{suffix}")())
        if lanes != EXP_LANES[name]:
            raise RuntimeError(f"the {name} exp kernel has {lanes} lanes, expected {EXP_LANES[name]}")
        fn = getattr(lib, f"mf_exp_field{suffix}")
        rp = ctypes.POINTER(ctype)
        fn.argtypes = [rp, rp, rp, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int, rp, rp]
        fn.restype = ctypes.c_int
        threads = getattr(lib, f"mf_exp_set_threads{suffix}")
        threads.argtypes = [ctypes.c_int]
        libs[name] = (lib, fn, rp, threads)
    for name, (lib, *_) in libs.items():
        for target in EXP_TARGETS[name]:
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, target)), platform="cpu")
    return {name: rest for name, (_, *rest) in libs.items()}


def _prepare(may_compile: bool) -> bool:
    with _lock:
        if not _exp_state["prepared"]:
            _exp_state["prepared"] = True
            try:
                if may_compile:
                    paths = build_exp()
                else:
                    cc, version = _toolchain()
                    paths = {name: _build_one(cc, version, EXP_SOURCE, defines, [_exp_include()], may_compile=False)
                             for name, defines, _, _ in _BUILDS}
                _exp_state["lib"] = _load_exp(paths)
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                _exp_state["error"] = _reason(e)
        return _exp_state["lib"] is not None


def prepare() -> bool:
    """Build the exp kernel if it is not cached (``build_exp``), load it and register its XLA
    FFI targets; once per process (later calls return the first answer). ``meanfield.kernels``
    calls it at import, so the C compiler runs there and never inside a traced function.

    No exception: a failure (``MEANFIELD_NATIVE=0``, no compiler, a compiler error) is kept as
    ``exp_unavailable_reason()`` and the fields use the XLA formulation. Initialises no JAX
    backend and reads no JAX configuration, so ``XLA_FLAGS`` and ``jax.config`` set after
    ``import meanfield`` still apply. The self-test through XLA runs at the first use
    (``exp_available()``).

    Returns:
        Whether the library is loaded (not yet self-tested).

    Example:
        >>> from meanfield import _native
        >>> _native.prepare() or _native.exp_unavailable_reason() is not None
        True
    """
    return _prepare(may_compile=True)


def _self_test() -> None:
    """One small call of each FFI target against NumPy (a handler XLA rejects fails here, not later)."""
    import jax

    # may run while a caller's function is being traced, and on a machine whose default device
    # is an accelerator: evaluate now, on the CPU
    with jax.ensure_compile_time_eval(), jax.default_device(jax.devices("cpu")[0]):
        _self_test_eager(jax)


def _self_test_eager(jax) -> None:
    """Through ``_partitioned_call``, the path ``meanfield.kernels`` traces (an FFI handler or a
    JAX API that this JAX lacks fails here, at first use, and leaves the XLA formulation)."""
    x = np.array([[[1.0, 0.0], [0.6, 0.8], [0.0, -1.0]]])
    beta = np.array([1.5])
    G = np.array([[[0.0, -1.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [[0.6, -0.8], [0.8, 0.6]]])
    y = np.einsum("nac,nc->na", G, x[0])
    Wx, Wy = np.exp(beta[0] * (x[0] @ x[0].T - 1.0)), np.exp(beta[0] * (y @ y.T - 1.0))
    Fy = np.einsum("nac,na->nc", G, Wy @ y / 3)
    for name in EXP_TARGETS:
        if name == "float64" and not jax.config.read("jax_enable_x64"):
            continue  # float64 arrays do not exist in this process (yet): float32 checks the handler
        xt, bt, Gt = x.astype(name), beta.astype(name), G.astype(name)
        F, S = jax.jit(_partitioned_call(name, True, "none"))(xt, bt)
        S2 = jax.jit(_partitioned_call(name, False, "none"))(xt, bt)
        Fg, Sg = jax.jit(_partitioned_call(name, True, "shared"))(xt, bt, Gt)
        tol = 1e-5 if name == "float32" else 1e-12
        close = lambda a, b, t=tol: np.allclose(np.asarray(a), b, rtol=t, atol=t)  # noqa: E731
        if not (close(F[0], Wx @ x[0] / 3) and close(S, Wx.sum()) and close(S2, Wx.sum())
                and close(Fg[0], Fy) and close(Sg, Wy.sum())):
            raise RuntimeError(f"the {name} exp kernel failed its self-test through XLA")


def _exp_library() -> dict | None:
    """The loaded exp kernel, self-tested on the first call (which sets its threads), or ``None``.
    Never runs the compiler: without ``prepare()`` it looks in the cache only."""
    if not _exp_state["prepared"]:
        _prepare(may_compile=False)
    with _lock:
        if _exp_state["lib"] is not None and not _exp_state["tested"]:
            _exp_state["tested"] = True
            try:
                _set_threads(_exp_state["lib"], exp_default_threads())
                _self_test()
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                _exp_state["lib"], _exp_state["error"] = None, _reason(e)
        return _exp_state["lib"]


def _set_threads(libs: dict, threads: int) -> None:
    for _, _, set_threads in libs.values():
        set_threads(threads)
    _exp_state["threads"] = threads


def exp_available() -> bool:
    """Whether the exp-kernel FFI targets are built, registered and pass their self-test.

    Never runs the C compiler (``prepare()``, at the import of ``meanfield.kernels``, built the
    kernel or recorded why not); the first call runs the self-test through XLA.

    Example:
        >>> from meanfield import _native
        >>> _native.exp_available() == (_native.exp_unavailable_reason() is None)
        True
    """
    return _exp_library() is not None


def exp_unavailable_reason() -> str | None:
    """Why ``exp_available()`` is ``False`` (``None`` when it is available)."""
    _exp_library()
    return _exp_state["error"]


def _forget_failures() -> None:
    """After a rebuild (``meanfield info --rebuild-native``): kernels that failed to build are
    tried again at their next use (a loaded library stays: its FFI targets are registered)."""
    with _lock:
        if _exp_state["lib"] is None and not _exp_state["tested"]:  # not loaded (a failed self-test stays)
            _exp_state.update(error=None, prepared=False)
        if _state["lib"] is None:
            _state.update(error=None, tried=False)


def exp_default_threads() -> int:
    """Threads of one exp-kernel call: ``$OMP_NUM_THREADS`` if set, else the CPUs of this process
    divided by its CPU devices (with ``--xla_force_host_platform_device_count`` or
    ``jax_num_cpu_devices`` a sharded batch runs one call per device at once), at least 1."""
    import jax

    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        devices = max(1, len(jax.devices("cpu")))
    except RuntimeError:
        devices = 1
    return max(1, default_threads() // devices)


def exp_threads() -> int:
    """The threads later exp-kernel calls use (``set_exp_threads``)."""
    if _exp_library() is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    return int(_exp_state["threads"])


def set_exp_threads(threads: int | None = None) -> None:
    """Threads of later exp-kernel calls (default ``exp_default_threads()``)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    _set_threads(libs, int(threads or exp_default_threads()))


def exp_field(x, beta, field: bool = True, gauge=None):
    """``(F, S)`` of the exp kernel on NumPy arrays (through ctypes, outside XLA).

    ``F_i = (1/n) sum_j exp(beta (<x_i, x_j> - 1)) x_j`` and ``S = sum_ij exp(beta (<x_i, x_j> - 1))``
    for every system of ``x`` ``(B, n, d)`` with ``beta`` ``(B,)``; ``F`` is ``None`` when
    ``field`` is ``False``. With orthogonal ``gauge`` matrices ``Psi_i`` (``(n, d, d)`` shared,
    or ``(B, n, d, d)``) the weights are those of ``y_i = Psi_i x_i`` and
    ``F_i = Psi_i^T (1/n) sum_j w_ij y_j`` (an exp-gauge kernel in its gauge frame).
    ``meanfield.kernels`` calls the same code through XLA's FFI.

    Example:
        >>> import numpy as np
        >>> from meanfield import _native
        >>> x = np.array([[[1.0, 0.0], [0.0, 1.0]]])  # two orthogonal unit vectors
        >>> F, S = _native.exp_field(x, np.array([2.0]))
        >>> bool(np.isclose(S[0], 2 + 2 * np.exp(-2.0))), bool(np.allclose(F[0, 0], [0.5, 0.5 * np.exp(-2.0)]))
        (True, True)
    """
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    x = np.ascontiguousarray(x)
    if x.dtype.name not in EXP_TARGETS:
        raise ValueError(f"x must be float64 or float32 for the native kernel, got dtype {x.dtype}")
    if x.ndim != 3 or x.shape[1] < 1 or not 1 <= x.shape[2] <= EXP_MAX_D:
        raise ValueError(f"x must have shape (B, n, d) with n >= 1 and 1 <= d <= {EXP_MAX_D}, got {x.shape}")
    beta = np.ascontiguousarray(beta, dtype=x.dtype)
    if beta.shape != x.shape[:1]:
        raise ValueError(f"beta must have shape {x.shape[:1]}, got {beta.shape}")
    fn, rp, _ = libs[x.dtype.name]
    B, n, d = x.shape
    G = None
    if gauge is not None:
        G = np.ascontiguousarray(gauge, dtype=x.dtype)
        if G.shape not in ((n, d, d), (B, n, d, d)):
            raise ValueError(f"gauge must have shape {(n, d, d)} or {(B, n, d, d)}, got {G.shape}")
    F = np.empty_like(x) if field else None
    S = np.empty(B, x.dtype)
    rc = fn(x.ctypes.data_as(rp), beta.ctypes.data_as(rp), G.ctypes.data_as(rp) if G is not None else None,
            int(G is not None and G.ndim == 3), B, n, d,
            F.ctypes.data_as(rp) if F is not None else None, S.ctypes.data_as(rp))
    if rc != 0:
        raise RuntimeError(f"the native exp kernel failed (B={B}, n={n}, d={d}, code {rc})")
    return F, S


def exp_field_xla(x, beta, field: bool = True, gauge=None):
    """``(F, S)`` of ``exp_field`` as an XLA FFI call on JAX arrays (CPU only; ``F`` is ``None``
    when ``field`` is ``False``). ``x``: ``(..., n, d)``, ``beta``: ``(...)``, float32 or float64;
    ``gauge``: ``None``, ``(n, d, d)`` (shared) or ``(..., n, d, d)``.

    Not differentiable by itself: ``meanfield.kernels`` wraps it in a ``custom_jvp``. Sharded
    inputs (``jax.sharding``: a sweep's batch axis over several devices) stay sharded: a
    ``custom_partitioning`` rule runs the call on each device's systems (batch axes split,
    ``n`` and ``d`` whole) instead of gathering the batch on every device."""
    if _exp_library() is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    mode = "none" if gauge is None else ("shared" if gauge.ndim == 3 else "batched")
    args = (x, beta) if gauge is None else (x, beta, gauge)
    out = _partitioned_call(np.dtype(x.dtype).name, bool(field), mode)(*args)
    return (out[0], out[1]) if field else (None, out)


def _local_call(name: str, field: bool, *args):
    import jax

    x, beta = args[0], args[1]
    fs, s_only = EXP_TARGETS[name]
    s_shape = jax.ShapeDtypeStruct(beta.shape, x.dtype)
    if field:
        return jax.ffi.ffi_call(fs, (jax.ShapeDtypeStruct(x.shape, x.dtype), s_shape))(*args)
    return jax.ffi.ffi_call(s_only, s_shape)(*args)


@functools.cache
def _partitioned_call(name: str, field: bool, mode: str):
    """The FFI call with a sharding rule: batch axes as the input's, ``n`` and ``d`` replicated
    (``mode``: no gauge, a shared ``(n, d, d)`` gauge, replicated, or a batched one)."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    def call(*args):
        return _local_call(name, field, *args)

    def shardings(mesh, arg_shapes):
        xs = arg_shapes[0]
        batch_rank = len(xs.shape) - 2
        sh = xs.sharding
        spec = tuple(sh.spec)[:batch_rank] if isinstance(sh, NamedSharding) else ()
        spec = spec + (None,) * (batch_rank - len(spec))
        mesh = sh.mesh if isinstance(sh, NamedSharding) else mesh
        x_sh = NamedSharding(mesh, PartitionSpec(*spec, None, None))
        b_sh = NamedSharding(mesh, PartitionSpec(*spec))
        g_sh = {"none": (), "shared": (NamedSharding(mesh, PartitionSpec()),),
                "batched": (NamedSharding(mesh, PartitionSpec(*spec, None, None, None)),)}[mode]
        return x_sh, b_sh, g_sh

    def infer(mesh, arg_shapes, result_shape):
        x_sh, b_sh, _ = shardings(mesh, arg_shapes)
        return (x_sh, b_sh) if field else b_sh

    def partition(mesh, arg_shapes, result_shape):
        x_sh, b_sh, g_sh = shardings(mesh, arg_shapes)
        return mesh, call, ((x_sh, b_sh) if field else b_sh), (x_sh, b_sh, *g_sh)

    wrapped = custom_partitioning(call)
    g_rule = {"none": "", "shared": ", n d e", "batched": ", ... n d e"}[mode]
    rule = f"... n d, ...{g_rule} -> " + ("... n d, ..." if field else "...")
    wrapped.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                          need_replication_factors=("n", "d") if mode == "none" else ("n", "d", "e"))
    return wrapped
