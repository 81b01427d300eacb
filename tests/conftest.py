"""Shared fixtures for the meanfield tests (kept minimal).

Float64 tests use ``jax.enable_x64(True)`` as a context manager (or the ``x64``
fixture below), so double precision never leaks into other tests.
"""

import jax
import pytest


@pytest.fixture
def x64():
    """Run the test body with JAX x64 enabled; restored afterwards."""
    with jax.enable_x64(True):
        yield
