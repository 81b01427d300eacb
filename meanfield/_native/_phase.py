"""The phase-diagram kernel (``phase_kernel.c``, called through ctypes outside any trace).

XLA:CPU runs the phase-diagram step as several passes over the ``(seeds, n, n)`` weights
(Gram matmul, exp, row sums, count, field matmul); at ``n = 32`` those passes, not the
exponentials, dominate. ``phase_kernel.c`` does one pass over the pairs ``i < j`` (half
the exponentials; ``w_ij`` is symmetric before the row normalisation) with the seeds in
SIMD lanes and the whole time loop of a block of seeds in L1 cache, threads over blocks
(OpenMP). BENCHMARKS.md has the measured speed-up. This is a CPU fast path for one
non-differentiable sweep, written by hand because no library fuses it;
``meanfield.phase_diagram``'s XLA kernel stays the reference it is tested against.

Built at its first use (``phase_library()``, ``build_phase()``); ``meanfield info`` reports it and
``meanfield info --rebuild-native`` rebuilds it. A short run takes no more threads than the CPUs
other processes left idle (``threads_now``).

Numbers (phase kernel): the same operations as the XLA kernel, in another order, with libmvec's
exponential (within a few ulp of the correctly rounded value). In float64 the states agree
with the XLA kernel and with the plain reference loop to 1e-11 or better and the clustering
fractions are equal (tests/test_phase_diagram.py: n = 32, d = 2, 100 steps at beta up to 9;
d = 2, 3, 5); in float32 the states agree to float32 rounding amplified by the dynamics
(tested to 2e-4) and a pair within that distance of the threshold can count differently.

Crossover (``backend="auto"`` of the phase diagrams): where the kernel beats the XLA sweep kernel
depends on the CPU, the dtype, the shape and the load (on the 2-core reference machine, 16 seeds
x 10 steps: 1.5-5x faster at ``d = 2`` for ``n`` from 8 to 128, 1.1-1.8x at ``n = 32``, ``d = 32``;
at ``n = 8`` in float32, measured while other processes loaded the machine, XLA was faster). So
``phase_crossover(dtype, xla_sweep)`` measures it on this machine once per built library and
dtype, the first time ``"auto"`` asks: SA sweeps of both paths at ``n`` in
``PHASE_CROSSOVER_NS`` (``d = 2``) and ``d`` in ``PHASE_CROSSOVER_DS`` (``n =
PHASE_CROSSOVER_N``), about a second and a half (mostly XLA's compilations), recorded beside the
library of that dtype (``NAME.crossover.json``) with ``_crossover.Plan``, as the exp kernel's.
``xla_sweep`` is ``meanfield.phase_diagram``'s sweep kernel, passed in (this package imports no
engine module). ``meanfield info`` shows the crossover of JAX's default float.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from jaxtyping import Float

from ._cache import (
    _BUILDS,
    LONG_CALL,
    Crossover,
    Library,
    _build_all,
    _load_library,
    _lock,
    _reason,
    _summary,
    _warn_unavailable,
    default_threads,
    threads_now,
)
from ._crossover import Plan, alternate

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = [
    "DTYPES",
    "LANES",
    "MAX_D",
    "PHASE_CROSSOVER_DS",
    "PHASE_CROSSOVER_N",
    "PHASE_CROSSOVER_NS",
    "PHASE_CROSSOVER_REPS",
    "PHASE_CROSSOVER_SEEDS",
    "PHASE_CROSSOVER_STEPS",
    "SOURCE",
    "XlaSweep",
    "build_phase",
    "phase_crossover",
    "phase_library",
    "phase_run",
]

#: seeds per SIMD block of the kernel, by dtype (``S`` is padded to a multiple)
LANES = {"float64": 8, "float32": 16}
#: dtypes with a kernel: the C source compiled once per dtype (float32 with ``-DMF_FLOAT32``)
DTYPES = ("float64", "float32")
#: largest dimension the kernel accepts
MAX_D = 64
#: the C source
SOURCE = Path(__file__).with_name("phase_kernel.c")

#: the loaded kernel of one dtype: (entry point, ctypes pointer type of its reals)
_Kernel = tuple[Any, Any]

#: ``lib``: ``{dtype name: _Kernel}`` once loaded; ``paths``: the libraries; ``crossover``: the
#: measured crossover by dtype name
_state: dict[str, Any] = {
    "lib": None,
    "error": None,
    "tried": False,
    "paths": None,
    "crossover": {},
}


def build_phase(force: bool = False) -> dict[str, Path]:
    """Compile both dtypes of ``phase_kernel.c`` into the cache, unless they are there already.

    Runs the C compiler only for a library missing from the cache (or every one with ``force``,
    which first removes this source's cached libraries and failure marks for the current
    compiler), printing one line to stderr first. ``phase_library()`` builds on its first look.

    Returns:
        ``{dtype name: path of the shared library}``.

    Raises:
        RuntimeError: disabled (``MEANFIELD_NATIVE=0``), no compiler, the compiler failed
        (``BuildFailed``), or the cache directory or a library in it is refused because others
        can write it (``RefusedPath``); the message says which.
    """
    return _build_all("phase-diagram kernel", SOURCE, [], force)


def _build() -> dict[str, _Kernel]:
    """``{dtype name: (entry point, ctypes pointer type of its reals)}`` for ``DTYPES``."""
    paths = build_phase()
    kernels: dict[str, _Kernel] = {}
    ip = ctypes.POINTER(ctypes.c_int)
    dp = ctypes.POINTER(ctypes.c_double)
    for name, _, suffix, ctype in _BUILDS:
        lib = _load_library(paths[name])
        fn = getattr(lib, "mf_phase_run" if name == "float64" else f"mf_phase_run{suffix}")
        rp = ctypes.POINTER(ctype)
        fn.argtypes = [
            rp,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_double,
            ctypes.c_double,
            ctypes.c_double,
            ctypes.c_int,
            ip,
            ctypes.c_int,
            ctypes.c_double,
            ctypes.c_int,
            dp,
            rp,
            ctypes.c_int,
        ]
        fn.restype = ctypes.c_int
        lanes = int(lib.mf_lanes())
        if lanes != LANES[name]:
            raise RuntimeError(f"the {name} build has {lanes} lanes, expected {LANES[name]}")
        kernels[name] = (fn, rp)
    _state["paths"] = paths
    return kernels


def _library() -> dict[str, _Kernel] | None:
    return _once(_state, _build)


def _once(
    state: dict[str, Any], build: Callable[[], dict[str, _Kernel]]
) -> dict[str, _Kernel] | None:
    """``build()`` on the first call (its error kept in ``state``), thread-safe."""
    with _lock:
        if not state["tried"]:
            state["tried"] = True
            try:
                state["lib"] = build()
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                state["error"] = _reason(e)
                _warn_unavailable(f"phase-diagram kernel: {_summary(e)}")
        return state["lib"]


#: the phase-diagram kernel of this process (``phase_library()``)
_LIBRARY = Library("phase-diagram kernel", _library, lambda: _state["error"])


def phase_library() -> Library:
    """The phase-diagram kernel (``Library``: ``available``, ``reason``); built at the first look.

    Example:
        >>> from meanfield import _native
        >>> lib = _native.phase_library()
        >>> lib.available == (lib.reason is None)
        True
    """
    return _LIBRARY


def _phase_threads(S: int, n: int, d: int, nsteps: int) -> int:
    """The phase kernel's threads: all (``default_threads()``) for a long run, else ``threads_now``."""
    work = float(S) * n * (n + 1) / 2 * (2 * d + 4) * max(1, nsteps)
    return default_threads() if work > LONG_CALL else threads_now(default_threads())


def phase_run(
    x0: ArrayLike,
    beta: float,
    shift: float,
    step: float,
    nsteps: int,
    ckpt: ArrayLike,
    threshold: float,
    normalized: bool,
    threads: int | None = None,
) -> tuple[Float[np.ndarray, "S C"], Float[np.ndarray, "S n d"]]:
    """Run ``nsteps`` Euler steps of every seed of ``x0`` with the native kernel.

    Args:
        x0: ``(S, n, d)`` float64 or float32 array (any ``S``; padded internally to a multiple
            of ``LANES[dtype]``); the kernel computes in that dtype.
        beta, shift: weights ``exp(beta <x_i, x_j> - shift)``; step: Euler step in that scale.
        nsteps: number of steps; ckpt: distinct sorted step indices in ``[0, nsteps]`` whose
            state's clustering fraction is returned; threshold: on ``<x_i, x_j>``.
        normalized: SA (row-normalised) or USA (``1/n``) field.
        threads: OpenMP threads (default ``default_threads()``; for a short run, under about
            8 ms of one CPU, ``threads_now(default_threads())``: fewer on a machine loaded by
            other processes). The results do not depend on it.

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
        raise ValueError(
            f"x0 must have shape (S, n, d) with n >= 2 and 1 <= d <= {MAX_D}, got {x0.shape}"
        )
    S, n, d = x0.shape
    if isinstance(nsteps, bool) or not isinstance(nsteps, int | np.integer) or nsteps < 0:
        raise ValueError(f"nsteps must be an integer >= 0, got {nsteps!r}")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    pad = (-S) % LANES[dtype.name]
    xp = np.concatenate([x0, np.repeat(x0[:1], pad, axis=0)]) if pad else x0
    ck = np.ascontiguousarray(ckpt, dtype=np.intc)
    if ck.ndim != 1 or (
        ck.size and (ck.min() < 0 or ck.max() > nsteps or np.any(np.diff(ck) <= 0))
    ):
        raise ValueError(f"ckpt must be distinct sorted steps in [0, {nsteps}], got {ck.tolist()}")
    Sp = xp.shape[0]
    frac = np.zeros((Sp, ck.size))
    xout = np.empty_like(xp)
    rc = fn(
        xp.ctypes.data_as(rp),
        Sp,
        n,
        d,
        float(beta),
        float(shift),
        float(step),
        int(nsteps),
        ck.ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
        ck.size,
        float(threshold),
        int(bool(normalized)),
        frac.ctypes.data_as(ctypes.POINTER(ctypes.c_double)),
        xout.ctypes.data_as(rp),
        int(threads or _phase_threads(Sp, n, d, nsteps)),
    )
    if rc != 0:
        raise RuntimeError(f"the native phase-diagram kernel failed (S={S}, n={n}, d={d})")
    return frac[:S], xout[:S]


# ----------------------------------------------------------------------------
# the crossover: where the fused kernel is faster than the XLA sweep kernel, on this machine
# ----------------------------------------------------------------------------

#: ``n`` of the measurement at ``d = 2`` (the phase diagrams' plane)
PHASE_CROSSOVER_NS = (8, 32, 128)
#: ``d`` of the measurement at ``n = PHASE_CROSSOVER_N`` (the kernel's lead shrinks with ``d``)
PHASE_CROSSOVER_DS = (2, 8, 32)
#: ``n`` of the measurement over ``d`` (the published phase diagrams' ``n``)
PHASE_CROSSOVER_N = 32
#: seeds per timed sweep
PHASE_CROSSOVER_SEEDS = 16
#: Euler steps per timed sweep (SA, ``beta = 1``, the clustering fraction at every step)
PHASE_CROSSOVER_STEPS = 10
#: timed sweeps of each path at each shape (the fastest is kept)
PHASE_CROSSOVER_REPS = 5

#: ``xla_sweep(x0, beta, step, nsteps, threshold)``: a call without arguments that runs the XLA
#: sweep kernel (``meanfield.phase_diagram``; SA, the fraction at every step) once on
#: the seeds ``x0`` ``(S, n, d)`` and waits for it: what the kernel is timed against
XlaSweep = Callable[[np.ndarray, float, float, int, float], Callable[[], object]]


@functools.cache
def _plan(dtype: str) -> Plan:
    """How the crossover of the ``dtype`` build is measured (``_crossover.Plan``)."""
    return Plan(
        f"SA sweep, beta 1, {PHASE_CROSSOVER_SEEDS} seeds x {PHASE_CROSSOVER_STEPS} steps, "
        f"{dtype}, best of {PHASE_CROSSOVER_REPS}, v1",
        ns=PHASE_CROSSOVER_NS,
        n_axis_d=2,
        ds=PHASE_CROSSOVER_DS,
        d_axis_n=PHASE_CROSSOVER_N,
        top_d=MAX_D,
        unit=f"per sweep of {PHASE_CROSSOVER_SEEDS} seeds x {PHASE_CROSSOVER_STEPS} steps, {dtype}",
    )


def _measure(
    dtype: str, xla_sweep: XlaSweep, shapes: Sequence[tuple[int, int]]
) -> dict[str, list[float]]:
    """``{"n x d": [kernel seconds, XLA seconds]}``: the fastest of ``PHASE_CROSSOVER_REPS`` sweeps
    of each path at ``shapes``, alternated (``_crossover.alternate``). The fastest, not the median:
    the kernel's first calls at a shape (its OpenMP team waking, the load estimate of
    ``threads_now`` settling) took up to 10x its later ones on the 2-core reference machine under
    load (0.52, 0.12, 0.06, 0.05, 0.05 ms at 8 x 2), and the crossover is a property of the
    machine, not of one moment's load."""
    threads_now(default_threads())  # a first sample of the load: the timed calls see its estimate
    rng = np.random.default_rng(0)
    beta, step, threshold = 1.0, 0.1, 0.9
    ckpt = np.arange(PHASE_CROSSOVER_STEPS + 1)
    times = {}
    for n, d in shapes:
        x = rng.standard_normal((PHASE_CROSSOVER_SEEDS, n, d))
        x = (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(dtype)
        kernel = functools.partial(
            phase_run, x, beta, beta, step, PHASE_CROSSOVER_STEPS, ckpt, threshold, True
        )
        xla = xla_sweep(x, beta, step, PHASE_CROSSOVER_STEPS, threshold)
        times[f"{n} x {d}"] = alternate(kernel, xla, PHASE_CROSSOVER_REPS, min)
    return times


def phase_crossover(dtype: str, xla_sweep: XlaSweep) -> Crossover | None:
    """Where the phase kernel of ``dtype`` (``"float64"`` or ``"float32"``) was faster than the XLA
    sweep kernel on this machine (``Crossover``: what ``backend="auto"`` of the phase diagrams
    follows), or ``None`` when the kernel is not available.

    Read from its record beside the ``dtype`` library (``NAME.crossover.json``), else measured now,
    once per built library and dtype (both paths timed, SA sweeps of ``PHASE_CROSSOVER_SEEDS``
    seeds x ``PHASE_CROSSOVER_STEPS`` steps, best of ``PHASE_CROSSOVER_REPS``, at ``n`` in
    ``PHASE_CROSSOVER_NS`` (``d = 2``) and ``d`` in ``PHASE_CROSSOVER_DS`` (``n =
    PHASE_CROSSOVER_N``): a second or two, mostly XLA's compilations) and recorded there; kept
    for the process. ``xla_sweep`` runs the XLA path (``XlaSweep``; ``meanfield.phase_diagram``
    passes its sweep kernel, which this package does not import).

    Example:
        >>> from meanfield import _native
        >>> def never(*args):
        ...     raise AssertionError("not measured: the crossover is given")
        >>> _native._state["crossover"]["float32"] = _native.Crossover(64, 2, {}, 0.0)  # as recorded
        >>> c = _native.phase_crossover("float32", never)
        >>> c is None or c.prefers_native(32, 2)
        True
        >>> del _native._state["crossover"]["float32"]
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if _library() is None:
        return None
    with _lock:
        found: Crossover | None = _state["crossover"].get(dtype)
        if found is None:
            path = _state["paths"][dtype].with_suffix(".crossover.json")
            found = _plan(dtype).obtain(path, functools.partial(_measure, dtype, xla_sweep))
            _state["crossover"][dtype] = found
        return found
