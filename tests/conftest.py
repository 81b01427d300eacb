"""Shared fixtures for the meanfield tests (kept minimal).

Float64 tests use ``jax.enable_x64(True)`` as a context manager (or the ``x64``
fixture below), so double precision never leaks into other tests.

Every meanfield module is imported here under jaxtyping's import hook with beartype, so
the shape and dtype annotations of the package (``Float[Array, "n d"]``, ...) are checked
at run time in the whole suite (STYLE: jaxtyping annotations carry shapes); functions without
a jaxtyping annotation are checked by beartype alone (tests/_typecheck.py).
"""

import importlib
import json
import os
import pkgutil
from pathlib import Path

# XLA's CPU compiler set for speed in the suite (most of the suite's time is XLA compiling small
# programs): the legacy loop emitters (about 40% less compile time a program, results those of the
# default emitters but for the last bit of a few reductions: docs/testing.md, "The round of
# 2026-12-07 (2)") and LLVM at -O0 (a third less compile time again, pass 1 of CI 2,135 s -> 1,548 s:
# "The round of 2026-12-07 (4)"). At -O0 the float32 arithmetic of a few functions (the Gaussian draw
# under x0 and the noise) may round its last bit differently in two differently fused programs, and
# a subnormal is read as zero, and code that runs long is 2-5x slower: the tests whose claim is
# bit-level agreement of such draws between a sweep's program and mf.simulate's, or subnormal
# arithmetic, and the few whose time is execution, not compilation (the depth, noise and attention
# reproductions, a 300,000-token clustering, the critical-output sampler) are marked `xla_default`
# and run with XLA's defaults only (the third pytest call of .ci/run). Set before JAX's backend
# starts, so the `meanfield` processes the tests start inherit it. MEANFIELD_TEST_XLA_DEFAULT=1 keeps XLA's
# defaults (the second pass of .ci/run: the closed-form modules as users compile them, and the
# tests marked xla_default). An XLA without the flags would abort at backend start: a child
# process tries them once (the xdist workers inherit the result with the environment); a user's
# own setting of the emitters is kept.
TEST_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0"


def _with_test_flags() -> None:
    import subprocess
    import sys

    flags = os.environ.get("XLA_FLAGS", "")
    if (
        os.environ.get("MEANFIELD_TEST_XLA_DEFAULT") == "1"
        or "xla_cpu_use_fusion_emitters" in flags
    ):
        return
    env = dict(os.environ, XLA_FLAGS=f"{flags} {TEST_XLA_FLAGS}".strip(), JAX_PLATFORMS="cpu")
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    if subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0:
        os.environ["XLA_FLAGS"] = env["XLA_FLAGS"]


_with_test_flags()

import jax  # noqa: E402
import pytest  # noqa: E402

# jaxtyping's import hook, with beartype alone on the functions that carry no jaxtyping annotation
# (the same checks at a twentieth of the cost: tests/_typecheck.py); MEANFIELD_TEST_JAXTYPED=1 puts
# jaxtyped itself on every function, as jaxtyping's own hook does
if os.environ.get("MEANFIELD_TEST_JAXTYPED") == "1":
    from jaxtyping import install_import_hook
else:
    from _typecheck import install_import_hook

with install_import_hook("meanfield", "beartype.beartype"):
    import meanfield

    for _mod in pkgutil.walk_packages(meanfield.__path__, "meanfield."):
        if not _mod.name.endswith("__main__"):
            importlib.import_module(_mod.name)

# The exp kernels are built at import (above); the phase-diagram kernel is built at its first look.
# Looking now puts it in the suite's cache before any test runs, so no test's output holds the
# one-time build notice because it happened to run first (tests that build a kernel themselves use
# a cache directory of their own).
_PHASE_KERNEL_AVAILABLE = meanfield._native.phase_library().available


@pytest.fixture
def x64():
    """Run the test body with JAX x64 enabled; restored afterwards."""
    with jax.enable_x64(True):
        yield


def _xla_default() -> bool:
    """Whether this process compiles with XLA's default CPU code generation (not TEST_XLA_FLAGS)."""
    return "xla_backend_optimization_level=0" not in os.environ.get("XLA_FLAGS", "")


def _native_off() -> bool:
    return os.environ.get("MEANFIELD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


# The inner loop (docs/testing.md): `pytest -m fast -n 2` runs every test whose recorded time
# (tests/durations.json, refreshed from a full run's JUnit report by tests/_durations.py) is under
# FAST_SECONDS, and every test not recorded yet; CI runs them all.
DURATIONS = Path(__file__).with_name("durations.json")
FAST_SECONDS = 0.3


def recorded_durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tests recorded under ``FAST_SECONDS`` (or not recorded) and not marked ``slow`` are marked
    ``fast``. Under TEST_XLA_FLAGS, tests marked ``xla_default`` are skipped (they run in the
    third pytest call of ``.ci/run``). With ``MEANFIELD_NATIVE=0`` (the second pass of ``.ci/run``: the XLA formulation that
    accelerators run), tests marked ``native`` test the C kernels themselves and are skipped.

    (Under ``-n``, pytest-xdist runs each test file in one worker, ``--dist loadfile`` in the
    ``addopts`` of pyproject.toml: the programs and runs a file's tests share are built once.)"""
    times = recorded_durations()
    fast = pytest.mark.fast
    for item in items:
        t = times.get(item.nodeid)
        if item.get_closest_marker("slow") is None and (t is None or t < FAST_SECONDS):
            item.add_marker(fast)
    if not _xla_default():
        later = pytest.mark.skip(
            reason="xla_default: needs XLA's default code generation (the third pytest call of "
            ".ci/run, MEANFIELD_TEST_XLA_DEFAULT=1)"
        )
        for item in items:
            if item.get_closest_marker("xla_default") is not None:
                item.add_marker(later)
    if not _native_off():
        return
    skip = pytest.mark.skip(reason="MEANFIELD_NATIVE=0: the native kernels are off")
    for item in items:
        if item.get_closest_marker("native") is not None:
            item.add_marker(skip)


# Every program XLA compiles for the CPU keeps its machine code in ~20 memory mappings for as long as
# its jit cache holds it, and Linux allows a process 65530 mappings (vm.max_map_count). One xdist
# worker runs ~900 tests and compiles thousands of programs; module-level jits (the reproductions',
# the kernels') are never freed, and at the limit LLVM's code allocation fails and the worker dies
# with a segmentation fault inside XLA's compiler (clean-clone CI at 75cef44, efbc360 and 0bb1e5d;
# a loop compiling ~2750 distinct small jits reproduces it: "LLVM compilation error: Cannot allocate
# memory", exit 139). So the compiled-program caches are emptied whenever the worker holds more than
# about half the limit: later tests recompile what they need (it fires about twice per worker, ~8 s each).
_MAPS = "/proc/self/maps"
_MAPS_LIMIT = 32_000


def _mappings() -> int:
    try:
        with open(_MAPS, "rb") as f:  # one read, then count lines (a line loop costs ~40 ms at 30k)
            return f.read().count(b"\n")
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True)
def _bounded_compiled_programs():
    yield
    if _mappings() > _MAPS_LIMIT:
        jax.clear_caches()
        import gc

        gc.collect()
