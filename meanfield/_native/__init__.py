"""Fused CPU kernels, compiled once per machine and cached: the exp-kernel field (``exp_kernel.c``,
an XLA FFI custom call that ``meanfield.kernels`` places inside any jitted, vmapped or
differentiated program on the CPU) and the phase-diagram sweep (``phase_kernel.c``, called
through ctypes).

Both are the deliberate exceptions to "everything is JAX": CPU fast paths for the two hot loops,
each tested against the XLA formulation it replaces, and chosen by the ``backend`` option
(``"auto" | "native" | "xla"``) of ``mf.field``, ``mf.velocity``, ``mf.energy``,
``mf.simulate``, the phase diagrams, ``meanfield simulate --backend`` and a sweep's
``[model] backend``.

Four private modules:

- ``_cache``: the build cache (compile, validate, lock, record failures, load only from a
  private directory; ``MEANFIELD_NATIVE=0`` makes every kernel unavailable) and the thread
  policy shared by both kernels;
- ``_crossover``: the measurement that ``backend="auto"`` follows, shared by both kernels
  (``Plan``: time the kernel and the XLA path at a few shapes on this machine, record the
  ``Crossover`` beside the library, read it back);
- ``_exp``: the exp kernel: ``prepare()`` (build and register its FFI targets, at
  ``import meanfield.kernels``), ``exp_field_xla`` and its sharding rule, the tangent, threads,
  and its crossover;
- ``_phase``: the phase-diagram kernel, ``phase_run``, and its crossover (``phase_crossover``,
  per dtype, timed against the XLA sweep kernel that ``meanfield.phase_diagram`` passes in).

Each kernel is one ``Library`` object, ``exp_library()`` and ``phase_library()``: ``available``,
``reason`` (why not) and, for the exp kernel, ``crossover``; the phase kernel's is
``phase_crossover(dtype, xla_sweep)``. ``meanfield info`` shows them.

Example:
    >>> from meanfield import _native
    >>> lib = _native.exp_library()
    >>> lib.available or lib.reason is not None
    True
"""

from __future__ import annotations

from ._cache import (
    BUILD_RECIPE,
    CC_TIMEOUT,
    FLAGS,
    LOAD_CHECK_TIMEOUT,
    LOCK_MARGIN,
    LONG_CALL,
    VERSION_TIMEOUT,
    BuildFailed,
    Library,
    RefusedPath,
    _lock,
    default_threads,
    threads_now,
)
from ._exp import (
    CROSSOVER_BATCH,
    CROSSOVER_DS,
    CROSSOVER_N,
    CROSSOVER_NS,
    CROSSOVER_REPS,
    EXP_LANES,
    EXP_MAX_D,
    EXP_SOURCE,
    EXP_TANGENT_TARGETS,
    EXP_TARGETS,
    Crossover,
    _exp_state,
    build_exp,
    exp_default_threads,
    exp_field,
    exp_field_xla,
    exp_library,
    exp_tangent,
    exp_threads,
    exp_threads_now,
    prepare,
    set_exp_threads,
)
from ._phase import (
    DTYPES,
    LANES,
    MAX_D,
    PHASE_CROSSOVER_DS,
    PHASE_CROSSOVER_N,
    PHASE_CROSSOVER_NS,
    PHASE_CROSSOVER_REPS,
    PHASE_CROSSOVER_SEEDS,
    PHASE_CROSSOVER_STEPS,
    SOURCE,
    XlaSweep,
    _state,
    build_phase,
    phase_crossover,
    phase_library,
    phase_run,
)

#: Accepted values of the ``backend`` option (``mf.field``, ``mf.velocity``, ``mf.energy``,
#: ``mf.simulate``, the phase diagrams, ``meanfield simulate --backend``, a sweep's ``[model] backend``).
BACKENDS = ("auto", "native", "xla")


def check_backend(backend: object, name: str = "backend") -> str:
    """``backend`` if it is one of ``BACKENDS``, else ``ValueError`` naming it (as ``name``: the
    CLI says ``--backend``, a sweep spec ``model.backend``) and the accepted values.

    ``"native"``: meanfield's fused C kernel on the CPU (``meanfield._native``; an error where it
    cannot run: not built, ``MEANFIELD_NATIVE=0``, a dtype or dimension it does not take);
    ``"xla"``: the XLA formulation (the reference, and what accelerators run); ``"auto"`` (the
    default): the fused kernel where it was measured faster on this machine
    (``meanfield._native.exp_library().crossover`` for the fields,
    ``meanfield._native.phase_crossover`` for the phase diagrams; ``meanfield info`` shows both),
    else XLA, resolved when a program is traced: the two paths round differently, so the last
    bits of an ``"auto"`` call follow the timing recorded in the kernel cache
    (``meanfield.kernels.resolve_backend``); a sweep decides ``"auto"`` once per store, without
    any timing, and records the decision in the store.

    Example:
        >>> import meanfield as mf
        >>> mf.kernels.check_backend("xla")
        'xla'
        >>> mf.kernels.check_backend("fast")
        Traceback (most recent call last):
        ValueError: backend must be one of 'auto', 'native', 'xla', got 'fast'
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend


__all__ = [
    "BACKENDS",
    "check_backend",
    "exp_library",
    "phase_library",
    "Library",
    "Crossover",
    "phase_run",
    "phase_crossover",
    "XlaSweep",
    "default_threads",
    "LANES",
    "DTYPES",
    "MAX_D",
    "SOURCE",
    "exp_field",
    "exp_field_xla",
    "exp_tangent",
    "EXP_TANGENT_TARGETS",
    "set_exp_threads",
    "EXP_SOURCE",
    "EXP_TARGETS",
    "EXP_LANES",
    "EXP_MAX_D",
    "exp_default_threads",
    "exp_threads",
    "exp_threads_now",
    "threads_now",
    "prepare",
    "RefusedPath",
    "BuildFailed",
    "LONG_CALL",
    "build_exp",
    "build_phase",
    "FLAGS",
    "BUILD_RECIPE",
    "CC_TIMEOUT",
    "LOAD_CHECK_TIMEOUT",
    "LOCK_MARGIN",
    "VERSION_TIMEOUT",
    "CROSSOVER_NS",
    "CROSSOVER_DS",
    "CROSSOVER_N",
    "CROSSOVER_BATCH",
    "CROSSOVER_REPS",
    "PHASE_CROSSOVER_NS",
    "PHASE_CROSSOVER_DS",
    "PHASE_CROSSOVER_N",
    "PHASE_CROSSOVER_SEEDS",
    "PHASE_CROSSOVER_STEPS",
    "PHASE_CROSSOVER_REPS",
]


def _forget_failures() -> None:
    """After a rebuild (``meanfield info --rebuild-native``): kernels that failed to build are
    tried again at their next use (a loaded library stays: its FFI targets are registered), and
    the crossovers are measured again."""
    with _lock:
        if (
            _exp_state["lib"] is None and not _exp_state["tested"]
        ):  # not loaded (a failed self-test stays)
            _exp_state.update(error=None, prepared=False)
        _exp_state["crossover"] = None
        _state["crossover"] = {}
        if _state["lib"] is None:
            _state.update(error=None, tried=False)
