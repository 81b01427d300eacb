"""Shared fixtures for the meanfield tests (kept minimal).

Float64 tests use ``jax.enable_x64(True)`` as a context manager (or the ``x64``
fixture below), so double precision never leaks into other tests.

Every meanfield module is imported here under jaxtyping's import hook with beartype, so
the shape and dtype annotations of the package (``Float[Array, "n d"]``, ...) are checked
at run time in the whole suite (STYLE: jaxtyping annotations carry shapes).
"""

import importlib
import os
import pkgutil

# Under pytest-xdist (the README's `pytest -n 2`, CI's two workers on two cores) every worker is a
# JAX process with XLA's multi-threaded CPU operations: the workers then oversubscribe the cores.
# Each worker runs XLA's CPU operations on one thread instead (measured: test_sweep.py and
# test_integrate.py with -n 2 on the 2-core box, 219 s -> 202 s wall). Set before JAX creates its
# backend; a user's own XLA_FLAGS is left as it is, and test subprocesses that set XLA_FLAGS
# replace it.
if os.environ.get("PYTEST_XDIST_WORKER") and "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false"

import jax  # noqa: E402
import pytest  # noqa: E402
from jaxtyping import install_import_hook  # noqa: E402

with install_import_hook("meanfield", "beartype.beartype"):
    import meanfield

    for _mod in pkgutil.walk_packages(meanfield.__path__, "meanfield."):
        if not _mod.name.endswith("__main__"):
            importlib.import_module(_mod.name)


@pytest.fixture
def x64():
    """Run the test body with JAX x64 enabled; restored afterwards."""
    with jax.enable_x64(True):
        yield


def _native_off() -> bool:
    return os.environ.get("MEANFIELD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def pytest_collection_modifyitems(config, items):
    """With ``MEANFIELD_NATIVE=0`` (the second pass of ``.ci/run``: the XLA formulation that
    accelerators run), tests marked ``native`` test the C kernels themselves and are skipped."""
    if not _native_off():
        return
    skip = pytest.mark.skip(reason="MEANFIELD_NATIVE=0: the native kernels are off")
    for item in items:
        if item.get_closest_marker("native") is not None:
            item.add_marker(skip)
