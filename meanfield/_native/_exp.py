"""The exp-kernel field (``exp_kernel.c``), an XLA FFI custom call that ``meanfield.kernels``
places inside any jitted, vmapped or differentiated program on the CPU.

Exp-kernel field (``exp_field_xla``; ``exp_field`` is the same code on NumPy arrays): XLA runs
``exp(beta X X^T) X`` as a matmul, an exponential pass over the ``n x n`` weights and a second
matmul, with all ``n^2`` exponentials and an ``n x n`` temporary per system. ``exp_kernel.c``
evaluates only the pairs ``i <= j`` (the weights are symmetric) in one pass over blocks of
rows, memory O(n d) per thread. Its tangent along ``dy`` (``exp_tangent``, FFI targets
``EXP_TANGENT_TARGETS``) is again a symmetric pair sum, evaluated the same way; the map
``dy -> dF`` is symmetric (a Hessian), so reverse mode runs the same kernel. ``meanfield.kernels``
wraps the field in a ``custom_jvp`` whose tangents use it, and in ``jax.lax.platform_dependent``
(the tangent: a primitive with a CPU lowering), so that other platforms run the XLA formulation. It needs jaxlib's FFI headers
(``jax.ffi.include_dir()``), checked by a self-test call through XLA at first use.

Threads: at most ``exp_default_threads()`` per exp-kernel call (``set_exp_threads``); each call
with more than one system or more than 512 particles takes no more threads than the CPUs of
this process that other processes left idle (``exp_threads_now``: the non-idle time of those
CPUs in ``/proc/stat`` minus this process's own CPU time, over the last >= 100 ms). On a loaded
machine a team of threads waits at the end of a call for its member that waits for a CPU, and
fewer threads finish sooner (BENCHMARKS.md, contention); work is handed out dynamically, one
system or one virtual worker at a time. A long call (about 8 ms of one CPU or more) takes all
its threads: a late thread then delays its end by one chunk, and each thread is a share of a
loaded machine. The phase kernel does the same per call (``threads_now``). No library call sets
an environment variable (``OMP_*`` included).

No result depends on the thread count: a system of more than 512 particles deals its windows of
128 rows to a fixed number of virtual workers (at most 32, set by ``n`` and ``d`` alone), whose
sums are added in worker order, so the same input gives the same bits for any thread count,
schedule or call (``tests/test_native_determinism.py``; the phase kernel runs each block of
seeds on one thread).

When the compiler runs: the exp kernel at ``import meanfield.kernels`` (``prepare()``:
``build_exp()`` if it is not cached, then load and register the FFI targets, with one line on
stderr when it compiles), never while a function is being traced: ``exp_library()``, read by
``meanfield.kernels`` at trace time, only reports. ``prepare()`` initialises no JAX backend
(``XLA_FLAGS`` and ``jax.config`` set after ``import meanfield`` still apply); the self-test
through XLA runs at the first ``exp_library().available``. ``meanfield info`` reports it, and
``meanfield info --rebuild-native`` rebuilds it.

Crossover (``backend="auto"``): which of the fused kernel and XLA's formulation is faster
depends on the CPU (on an AVX2 host without AVX-512 the XLA path wins at ``d = 8``; on the
reference machine the two tie there). So ``exp_library().crossover`` is measured on this machine
once per built library, the first time ``"auto"`` asks for it: both paths timed (median of
``CROSSOVER_REPS`` calls, float32, ``CROSSOVER_BATCH`` systems) at ``n`` in ``CROSSOVER_NS``
(``d = 3``) and ``d`` in ``CROSSOVER_DS`` (``n = CROSSOVER_N``), about a second in all, and
recorded beside the float32 library (``NAME.crossover.json``, written atomically; a read-only
cache keeps it for the process). ``meanfield info`` shows it; ``--rebuild-native`` measures
again. No fixed rule tuned on another CPU. The timing, the rule and the record are
``_crossover.Plan``'s, shared with the phase kernel (``_PLAN`` here).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from jaxtyping import Float

from ._cache import (
    _BUILDS,
    Library,
    _build_all,
    _build_one,
    _load_library,
    _lock,
    _reason,
    _summary,
    _toolchain,
    _warn_unavailable,
    default_threads,
)
from ._crossover import Crossover, Plan, alternate

if TYPE_CHECKING:  # JAX is imported at first use, never by ``import meanfield._native``
    from jax import Array, ShapeDtypeStruct
    from jax.sharding import AbstractMesh, Mesh, NamedSharding
    from numpy.typing import ArrayLike

#: the loaded exp kernel of one dtype: (field entry point, pointer type of its reals, (set
#: threads, set adaptive, threads now), tangent entry point)
_Kernels = tuple[Any, Any, tuple[Any, Any, Any], Any]

__all__ = [
    "CROSSOVER_BATCH",
    "CROSSOVER_DS",
    "CROSSOVER_N",
    "CROSSOVER_NS",
    "CROSSOVER_RECIPE",
    "CROSSOVER_REPS",
    "Crossover",
    "EXP_LANES",
    "EXP_MAX_D",
    "EXP_SOURCE",
    "EXP_TANGENT_TARGETS",
    "EXP_TARGETS",
    "build_exp",
    "exp_default_threads",
    "exp_field",
    "exp_field_xla",
    "exp_library",
    "exp_tangent",
    "exp_threads",
    "exp_threads_now",
    "prepare",
    "set_exp_threads",
]

#: the C source of the fused exp-kernel field (``meanfield.kernels``' CPU fast path)
EXP_SOURCE = Path(__file__).with_name("exp_kernel.c")
#: XLA FFI targets by dtype: (field and sum, sum only)
EXP_TARGETS = {
    "float64": ("meanfield_exp_fs_f64", "meanfield_exp_s_f64"),
    "float32": ("meanfield_exp_fs_f32", "meanfield_exp_s_f32"),
}
#: XLA FFI targets of the field's tangent (``exp_tangent``), by dtype
EXP_TANGENT_TARGETS = {"float64": "meanfield_exp_t_f64", "float32": "meanfield_exp_t_f32"}
#: columns per SIMD vector of the exp kernel, by dtype
EXP_LANES = {"float64": 8, "float32": 16}
#: largest dimension the exp kernel accepts
EXP_MAX_D = 64

_exp_state: dict = {
    "lib": None,
    "error": None,
    "prepared": False,
    "tested": False,
    "threads": None,
    "adaptive": True,
    "paths": None,
    "crossover": None,
}


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
        RuntimeError: disabled (``MEANFIELD_NATIVE=0``), no compiler, the compiler failed
        (``BuildFailed``), or the cache directory or a library in it is refused because others
        can write it (``RefusedPath``); the message says which.

    Example:
        >>> from meanfield import _native
        >>> if _native.exp_library().available:  # built (at import), so found in the cache: no compiler runs
        ...     print(sorted(_native.build_exp()))
        ... else:
        ...     print(['float32', 'float64'])
        ['float32', 'float64']
    """
    return _build_all("CPU kernels", EXP_SOURCE, [_exp_include()], force)


def _load_exp(paths: dict[str, Path]) -> dict[str, _Kernels]:
    """dlopen the exp-kernel libraries and register their FFI targets with XLA (for the CPU).

    Registration initialises no JAX backend: ``xla_client.register_custom_call_target`` adds
    the handlers to XLA's process-wide table of targets, which needs no client (tested in
    tests/test_info.py: ``XLA_FLAGS`` set after ``import meanfield`` still apply)."""
    import jax.ffi

    libs: dict[str, tuple[ctypes.CDLL, _Kernels]] = {}
    for name, _, suffix, ctype in _BUILDS:
        lib = _load_library(paths[name])
        lanes = int(getattr(lib, f"mf_exp_lanes{suffix}")())
        if lanes != EXP_LANES[name]:
            raise RuntimeError(
                f"the {name} exp kernel has {lanes} lanes, expected {EXP_LANES[name]}"
            )
        fn = getattr(lib, f"mf_exp_field{suffix}")
        rp = ctypes.POINTER(ctype)
        fn.argtypes = [rp, rp, rp, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int, rp, rp]
        fn.restype = ctypes.c_int
        threads = getattr(lib, f"mf_exp_set_threads{suffix}")
        threads.argtypes = [ctypes.c_int]
        adaptive = getattr(lib, f"mf_exp_set_adaptive{suffix}")
        adaptive.argtypes = [ctypes.c_int]
        now = getattr(lib, f"mf_exp_threads_now{suffix}")
        now.argtypes, now.restype = [ctypes.c_double], ctypes.c_int
        tangent = getattr(lib, f"mf_exp_tangent{suffix}")
        tangent.argtypes = [rp, rp, rp, ctypes.c_int64, ctypes.c_int, ctypes.c_int, rp]
        tangent.restype = ctypes.c_int
        libs[name] = (lib, (fn, rp, (threads, adaptive, now), tangent))
    for name, (lib, _) in libs.items():
        for target in (*EXP_TARGETS[name], EXP_TANGENT_TARGETS[name]):
            jax.ffi.register_ffi_target(
                target, jax.ffi.pycapsule(getattr(lib, target)), platform="cpu"
            )
    return {name: kernels for name, (_, kernels) in libs.items()}


def _prepare(may_compile: bool) -> bool:
    with _lock:
        if not _exp_state["prepared"]:
            _exp_state["prepared"] = True
            try:
                if may_compile:
                    paths = build_exp()
                else:
                    cc, version = _toolchain()
                    paths = {
                        name: _build_one(
                            cc, version, EXP_SOURCE, defines, [_exp_include()], may_compile=False
                        )
                        for name, defines, _, _ in _BUILDS
                    }
                _exp_state["lib"] = _load_exp(paths)
                _exp_state["paths"] = paths
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                _exp_state["error"] = _reason(e)
                _warn_unavailable(_summary(e))
        return _exp_state["lib"] is not None


def prepare() -> bool:
    """Build the exp kernel if it is not cached (``build_exp``), load it and register its XLA
    FFI targets; once per process (later calls return the first answer). ``meanfield.kernels``
    calls it at import, so the C compiler runs there and never inside a traced function.

    No exception: a failure (``MEANFIELD_NATIVE=0``, no compiler, a compiler error) is kept as
    ``exp_library().reason`` and the fields use the XLA formulation. Initialises no JAX
    backend and reads no JAX configuration, so ``XLA_FLAGS`` and ``jax.config`` set after
    ``import meanfield`` still apply. The self-test through XLA runs at the first use
    (``exp_library().available``).

    Returns:
        Whether the library is loaded (not yet self-tested).

    Example:
        >>> from meanfield import _native
        >>> _native.prepare() or _native.exp_library().reason is not None
        True
    """
    return _prepare(may_compile=True)


def _self_test() -> None:
    """One small call of each FFI target against NumPy (a handler XLA rejects fails here, not later)."""
    import jax

    # may run while a caller's function is being traced, and on a machine whose default device
    # is an accelerator: evaluate now, on the CPU
    with jax.ensure_compile_time_eval(), jax.default_device(jax.local_devices(backend="cpu")[0]):
        _self_test_eager(jax)


def _self_test_eager(jax: ModuleType) -> None:
    """Through ``_partitioned_call``, the path ``meanfield.kernels`` traces (an FFI handler or a
    JAX API that this JAX lacks fails here, at first use, and leaves the XLA formulation)."""
    x = np.array([[[1.0, 0.0], [0.6, 0.8], [0.0, -1.0]]])
    beta = np.array([1.5])
    G = np.array([[[0.0, -1.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [[0.6, -0.8], [0.8, 0.6]]])
    y = np.einsum("nac,nc->na", G, x[0])
    Wx, Wy = np.exp(beta[0] * (x[0] @ x[0].T - 1.0)), np.exp(beta[0] * (y @ y.T - 1.0))
    Fy = np.einsum("nac,na->nc", G, Wy @ y / 3)
    dx = np.array([[[0.3, -0.2], [0.1, 0.5], [-0.4, 0.2]]])
    C = beta[0] * Wx * (dx[0] @ x[0].T + x[0] @ dx[0].T)
    dF = (C @ x[0] + Wx @ dx[0]) / 3
    for name in EXP_TARGETS:
        if name == "float64" and not jax.config.read("jax_enable_x64"):
            continue  # float64 arrays do not exist in this process (yet): float32 checks the handler
        xt, bt, Gt = x.astype(name), beta.astype(name), G.astype(name)
        F, S = jax.jit(_partitioned_call(name, True, "none"))(xt, bt)
        S2 = jax.jit(_partitioned_call(name, False, "none"))(xt, bt)
        Fg, Sg = jax.jit(_partitioned_call(name, True, "shared"))(xt, bt, Gt)
        t = jax.ffi.ffi_call(EXP_TANGENT_TARGETS[name], jax.ShapeDtypeStruct(xt.shape, xt.dtype))
        dFt = jax.jit(t)(xt, dx.astype(name), bt)
        tol = 1e-5 if name == "float32" else 1e-12
        close = lambda a, b, t=tol: np.allclose(np.asarray(a), b, rtol=t, atol=t)  # noqa: E731
        if not (
            close(F[0], Wx @ x[0] / 3)
            and close(S, Wx.sum())
            and close(S2, Wx.sum())
            and close(Fg[0], Fy)
            and close(Sg, Wy.sum())
            and close(dFt[0], dF)
        ):
            raise RuntimeError(f"the {name} exp kernel failed its self-test through XLA")


def _exp_library() -> dict[str, _Kernels] | None:
    """The loaded exp kernel, self-tested on the first call (which sets its threads), or ``None``.
    Never runs the compiler: without ``prepare()`` it looks in the cache only."""
    if not _exp_state["prepared"]:
        _prepare(may_compile=False)
    with _lock:
        if _exp_state["lib"] is not None and not _exp_state["tested"]:
            _exp_state["tested"] = True
            try:
                _set_threads(_exp_state["lib"], exp_default_threads(), adaptive=True)
                _self_test()
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                _exp_state["lib"], _exp_state["error"] = None, _reason(e)
                _warn_unavailable(_summary(e))
        return _exp_state["lib"]


def _set_threads(libs: dict[str, _Kernels], threads: int, adaptive: bool) -> None:
    for _, _, (set_threads, set_adaptive, _), _ in libs.values():
        set_threads(threads)
        set_adaptive(int(adaptive))
    _exp_state["threads"], _exp_state["adaptive"] = threads, adaptive


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
    """The most threads of later exp-kernel calls (``set_exp_threads``)."""
    if _exp_library() is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    return int(_exp_state["threads"])


def exp_threads_now(B: int = 1, n: int = 2048, d: int = 3) -> int:
    """The threads an exp-kernel call on ``B`` systems of ``n`` particles in dimension ``d`` would
    use now: ``exp_threads()``, or fewer on a loaded machine while adaptive (``set_exp_threads``):
    no more than the CPUs of this process that other processes left idle over the last >= 100 ms
    (``threads_now``, computed in C), at least 1; a long call (``B n (n + 1) / 2 (2 d + 4)`` above
    1.2e8, about 8 ms of one CPU) takes them all."""
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    if B <= 1 and n <= 512:
        return 1  # one small system: one thread, whatever the setting
    return int(next(iter(libs.values()))[2][2](float(B) * n * (n + 1) / 2 * (2 * d + 4)))


def set_exp_threads(threads: int | None = None, *, adaptive: bool = True) -> None:
    """Threads of later exp-kernel calls: at most ``threads`` (default ``exp_default_threads()``).

    ``adaptive`` (default): each call that runs more than one system, or one system of more than
    512 particles, takes no more threads than the CPUs of this process that other processes left
    idle over the last >= 100 ms (``exp_threads_now``): on a machine loaded by other processes a
    team of threads waits for its slowest member, and one thread finishes sooner (BENCHMARKS.md,
    contention); a long call (about 8 ms of one CPU or more) takes them all (each thread is a
    share of a loaded machine, and a late one delays the end by one chunk of work).
    ``adaptive=False``: always ``threads``. The results are the same bits for any thread count:
    batches run whole systems per thread, and a system of more than 512 particles always sums
    its rows through the same fixed set of virtual workers, whether one thread runs them or
    several share them (``tests/test_native_determinism.py``). Sets no environment variable.
    """
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if not isinstance(adaptive, bool):
        raise TypeError(f"adaptive must be True or False, got {adaptive!r}")
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    _set_threads(libs, int(threads or exp_default_threads()), adaptive)


def exp_field(
    x: ArrayLike, beta: ArrayLike, field: bool = True, gauge: ArrayLike | None = None
) -> tuple[Float[np.ndarray, "B n d"] | None, Float[np.ndarray, " B"]]:
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
        raise ValueError(
            f"x must have shape (B, n, d) with n >= 1 and 1 <= d <= {EXP_MAX_D}, got {x.shape}"
        )
    beta = np.ascontiguousarray(beta, dtype=x.dtype)
    if beta.shape != x.shape[:1]:
        raise ValueError(f"beta must have shape {x.shape[:1]}, got {beta.shape}")
    fn, rp, _, _ = libs[x.dtype.name]
    B, n, d = x.shape
    G = None
    if gauge is not None:
        G = np.ascontiguousarray(gauge, dtype=x.dtype)
        if G.shape not in ((n, d, d), (B, n, d, d)):
            raise ValueError(f"gauge must have shape {(n, d, d)} or {(B, n, d, d)}, got {G.shape}")
    F = np.empty_like(x) if field else None
    S = np.empty(B, x.dtype)
    rc = fn(
        x.ctypes.data_as(rp),
        beta.ctypes.data_as(rp),
        G.ctypes.data_as(rp) if G is not None else None,
        int(G is not None and G.ndim == 3),
        B,
        n,
        d,
        F.ctypes.data_as(rp) if F is not None else None,
        S.ctypes.data_as(rp),
    )
    if rc != 0:
        raise RuntimeError(f"the native exp kernel failed (B={B}, n={n}, d={d}, code {rc})")
    return F, S


def exp_tangent(y: ArrayLike, dy: ArrayLike, beta: ArrayLike) -> Float[np.ndarray, "B n d"]:
    r"""The tangent of the exp-kernel field along ``dy`` on NumPy arrays (through ctypes).

    For every system of ``y``, ``dy`` ``(B, n, d)`` with ``beta`` ``(B,)``:

    $$dF_i = \frac1n \sum_j \left[\beta w_{ij} (\langle dy_i, y_j\rangle + \langle y_i, dy_j\rangle) y_j + w_{ij}\, dy_j\right], \quad w_{ij} = e^{\beta (\langle y_i, y_j\rangle - 1)},$$

    the derivative of ``exp_field``'s $F$ along ``dy`` (one pass over the pairs $i \le j$: both
    weights are symmetric). The map $dy \mapsto dF$ is the Hessian of $S / (2 \beta n)$, so it is
    symmetric: its own transpose. ``meanfield.kernels`` calls the same code through XLA's FFI
    (``EXP_TANGENT_TARGETS``) for ``jax.jvp``, ``jax.grad`` and Hessian-vector products.

    Example:
        >>> import numpy as np
        >>> from meanfield import _native
        >>> y, dy = np.array([[[1.0, 0.0], [1.0, 0.0]]]), np.array([[[0.0, 1.0], [0.0, 0.0]]])
        >>> _native.exp_tangent(y, dy, np.array([2.0]))[0].tolist()   # (dy_0 + dy_1) / 2 per row
        [[0.0, 0.5], [0.0, 0.5]]
    """
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    y, dy = np.ascontiguousarray(y), np.ascontiguousarray(dy)
    if y.dtype.name not in EXP_TARGETS or dy.dtype != y.dtype:
        raise ValueError(
            f"y and dy must be float64 or float32 arrays of one dtype, got {y.dtype} and {dy.dtype}"
        )
    if y.ndim != 3 or y.shape[1] < 1 or not 1 <= y.shape[2] <= EXP_MAX_D or dy.shape != y.shape:
        raise ValueError(
            f"y and dy must have one shape (B, n, d) with n >= 1 and 1 <= d <= {EXP_MAX_D}, "
            f"got {y.shape} and {dy.shape}"
        )
    beta = np.ascontiguousarray(beta, dtype=y.dtype)
    if beta.shape != y.shape[:1]:
        raise ValueError(f"beta must have shape {y.shape[:1]}, got {beta.shape}")
    _, rp, _, fn = libs[y.dtype.name]
    B, n, d = y.shape
    dF = np.empty_like(y)
    rc = fn(
        y.ctypes.data_as(rp),
        dy.ctypes.data_as(rp),
        beta.ctypes.data_as(rp),
        B,
        n,
        d,
        dF.ctypes.data_as(rp),
    )
    if rc != 0:
        raise RuntimeError(f"the native exp tangent failed (B={B}, n={n}, d={d}, code {rc})")
    return dF


def exp_field_xla(
    x: Float[Array, "*batch n d"],
    beta: Float[Array, "*batch"],
    field: bool = True,
    gauge: Float[Array, "n d d"] | Float[Array, "*batch n d d"] | None = None,
) -> tuple[Float[Array, "*batch n d"] | None, Float[Array, "*batch"]]:
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


@functools.cache
def _tangent_call(name: str) -> Callable[..., Array]:
    """The FFI call of the tangent ``(y, dy, beta) -> dF`` with the sharding rule of
    ``_partitioned_call``: batch axes as ``y``'s, ``n`` and ``d`` whole (a sharded batch runs
    on each device's systems, no all-gather)."""
    import jax
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    def call(y: Array, dy: Array, beta: Array) -> Array:
        return jax.ffi.ffi_call(EXP_TANGENT_TARGETS[name], jax.ShapeDtypeStruct(y.shape, y.dtype))(
            y, dy, beta
        )

    def shardings(
        mesh: Mesh | AbstractMesh, arg_shapes: tuple[ShapeDtypeStruct, ...]
    ) -> tuple[NamedSharding, NamedSharding]:
        ys = arg_shapes[0]
        batch_rank = len(ys.shape) - 2
        sh = ys.sharding
        spec = tuple(sh.spec)[:batch_rank] if isinstance(sh, NamedSharding) else ()
        spec = spec + (None,) * (batch_rank - len(spec))
        mesh = sh.mesh if isinstance(sh, NamedSharding) else mesh
        return NamedSharding(mesh, PartitionSpec(*spec, None, None)), NamedSharding(
            mesh, PartitionSpec(*spec)
        )

    def infer(
        mesh: Mesh | AbstractMesh,
        arg_shapes: tuple[ShapeDtypeStruct, ...],
        result_shape: ShapeDtypeStruct,
    ) -> NamedSharding:
        return shardings(mesh, arg_shapes)[0]

    def partition(
        mesh: Mesh | AbstractMesh,
        arg_shapes: tuple[ShapeDtypeStruct, ...],
        result_shape: ShapeDtypeStruct,
    ) -> tuple[Mesh | AbstractMesh, Callable[..., Array], NamedSharding, tuple[NamedSharding, ...]]:
        y_sh, b_sh = shardings(mesh, arg_shapes)
        return mesh, call, y_sh, (y_sh, y_sh, b_sh)

    wrapped = custom_partitioning(call)
    wrapped.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule="... n d, ... n d, ... -> ... n d",
        need_replication_factors=("n", "d"),
    )
    return wrapped


def _local_call(name: str, field: bool, *args: Array) -> Any:
    import jax

    x, beta = args[0], args[1]
    fs, s_only = EXP_TARGETS[name]
    s_shape = jax.ShapeDtypeStruct(beta.shape, x.dtype)
    if field:
        return jax.ffi.ffi_call(fs, (jax.ShapeDtypeStruct(x.shape, x.dtype), s_shape))(*args)
    return jax.ffi.ffi_call(s_only, s_shape)(*args)


@functools.cache
def _partitioned_call(name: str, field: bool, mode: str) -> Callable[..., Any]:
    """The FFI call with a sharding rule: batch axes as the input's, ``n`` and ``d`` replicated
    (``mode``: no gauge, a shared ``(n, d, d)`` gauge, replicated, or a batched one)."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    def call(*args: Array) -> Any:
        return _local_call(name, field, *args)

    def shardings(
        mesh: Mesh | AbstractMesh, arg_shapes: tuple[ShapeDtypeStruct, ...]
    ) -> tuple[NamedSharding, NamedSharding, tuple[NamedSharding, ...]]:
        xs = arg_shapes[0]
        batch_rank = len(xs.shape) - 2
        sh = xs.sharding
        spec = tuple(sh.spec)[:batch_rank] if isinstance(sh, NamedSharding) else ()
        spec = spec + (None,) * (batch_rank - len(spec))
        mesh = sh.mesh if isinstance(sh, NamedSharding) else mesh
        x_sh = NamedSharding(mesh, PartitionSpec(*spec, None, None))
        b_sh = NamedSharding(mesh, PartitionSpec(*spec))
        g_sh = {
            "none": (),
            "shared": (NamedSharding(mesh, PartitionSpec()),),
            "batched": (NamedSharding(mesh, PartitionSpec(*spec, None, None, None)),),
        }[mode]
        return x_sh, b_sh, g_sh

    def infer(
        mesh: Mesh | AbstractMesh, arg_shapes: tuple[ShapeDtypeStruct, ...], result_shape: Any
    ) -> NamedSharding | tuple[NamedSharding, NamedSharding]:
        x_sh, b_sh, _ = shardings(mesh, arg_shapes)
        return (x_sh, b_sh) if field else b_sh

    def partition(
        mesh: Mesh | AbstractMesh, arg_shapes: tuple[ShapeDtypeStruct, ...], result_shape: Any
    ) -> tuple[Mesh | AbstractMesh, Callable[..., Any], Any, tuple[NamedSharding, ...]]:
        x_sh, b_sh, g_sh = shardings(mesh, arg_shapes)
        return mesh, call, ((x_sh, b_sh) if field else b_sh), (x_sh, b_sh, *g_sh)

    wrapped = custom_partitioning(call)
    g_rule = {"none": "", "shared": ", n d e", "batched": ", ... n d e"}[mode]
    rule = f"... n d, ...{g_rule} -> " + ("... n d, ..." if field else "...")
    wrapped.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=rule,
        need_replication_factors=("n", "d") if mode == "none" else ("n", "d", "e"),
    )
    return wrapped


# ----------------------------------------------------------------------------
# the crossover: where the fused kernel is faster than XLA's formulation, on this machine
# ----------------------------------------------------------------------------


#: ``n`` of the measurement at ``d = 3`` (where the kernel's call overhead and XLA's meet)
CROSSOVER_NS = (32, 128, 512)
#: ``d`` of the measurement at ``n = CROSSOVER_N`` (the kernel's cost grows with ``d`` faster than XLA's GEMMs)
CROSSOVER_DS = (3, 8, 16, 32)
#: ``n`` of the measurement over ``d``
CROSSOVER_N = 512
#: systems per timed call (a small batch, as in a sweep of seeds)
CROSSOVER_BATCH = 4
#: timed calls of each path at each shape (the median is kept)
CROSSOVER_REPS = 7
#: what the record depends on besides the library (a different recipe is measured again)
CROSSOVER_RECIPE = f"field F of exp(beta (x x^T - 1)) x / n, float32, B={CROSSOVER_BATCH}, median of {CROSSOVER_REPS}, v1"

#: how the exp kernel's crossover is measured and recorded (``_crossover.Plan``)
_PLAN = Plan(
    CROSSOVER_RECIPE,
    ns=CROSSOVER_NS,
    n_axis_d=3,
    ds=CROSSOVER_DS,
    d_axis_n=CROSSOVER_N,
    top_d=EXP_MAX_D,
    unit=f"per call of {CROSSOVER_BATCH} systems",
)


def _crossover_rule(times: dict[str, list[float]]) -> tuple[int, int | None]:
    """``(max_d, min_n)`` of measured ``times`` (see ``Crossover``)."""
    return _PLAN.rule(times)


def _measure(shapes: Sequence[tuple[int, int]] | None = None) -> dict[str, list[float]]:
    """``{"n x d": [kernel seconds, XLA seconds]}``: medians of ``CROSSOVER_REPS`` calls of each
    path (jitted, float32, ``CROSSOVER_BATCH`` systems) at ``shapes`` (default ``_PLAN.shapes()``),
    alternated so that a change of load hits both."""
    import jax
    import jax.numpy as jnp

    from .._precision import einsum

    def xla(x: Float[Array, "B n d"], b: Float[Array, " B"]) -> Float[Array, "B n d"]:
        W = jnp.exp(b[:, None, None] * (einsum("bnd,bmd->bnm", x, x) - 1.0))
        return einsum("bnm,bmd->bnd", W, x) / x.shape[1]

    def fused_field(x: Float[Array, "B n d"], b: Float[Array, " B"]) -> Float[Array, "B n d"]:
        return _partitioned_call("float32", True, "none")(x, b)[0]

    fused = jax.jit(fused_field)
    plain = jax.jit(xla)
    rng = np.random.default_rng(0)
    times = {}
    for n, d in _PLAN.shapes() if shapes is None else shapes:
        x = rng.standard_normal((CROSSOVER_BATCH, n, d)).astype(np.float32)
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        xj, bj = jnp.asarray(x), jnp.full((CROSSOVER_BATCH,), 2.0, jnp.float32)
        times[f"{n} x {d}"] = alternate(
            functools.partial(_blocking, fused, xj, bj),
            functools.partial(_blocking, plain, xj, bj),
            CROSSOVER_REPS,
        )
    return times


def _blocking(f: Callable[..., Array], *args: Array) -> Array:
    """``f(*args)``, waited for (what a timed call measures)."""
    return f(*args).block_until_ready()


def _crossover_path() -> Path | None:
    paths = _exp_state["paths"]
    return None if paths is None else paths["float32"].with_suffix(".crossover.json")


def _read_crossover(path: Path) -> Crossover | None:
    """The recorded crossover, or ``None`` (missing, unreadable, another recipe)."""
    return _PLAN.read(path)


def _crossover() -> Crossover:
    """The crossover of the loaded library: read beside it, else measured now (on the CPU, eagerly
    even inside a trace) and recorded there when the cache directory can be written."""
    with _lock:
        if _exp_state["crossover"] is None:
            _exp_state["crossover"] = _PLAN.obtain(_crossover_path(), _measure)
        return _exp_state["crossover"]


#: the exp kernel of this process (``exp_library()``)
_LIBRARY = Library("exp kernel", _exp_library, lambda: _exp_state["error"], _crossover)


def exp_library() -> Library:
    """The exp kernel (``Library``: ``available``, ``reason``, ``crossover``).

    Never runs the C compiler (``prepare()``, at the import of ``meanfield.kernels``, built the
    kernel or recorded why not); the first ``available`` runs the self-test through XLA, the first
    ``crossover`` reads or measures it.

    Example:
        >>> from meanfield import _native
        >>> lib = _native.exp_library()
        >>> lib.available == (lib.reason is None)
        True
    """
    return _LIBRARY
