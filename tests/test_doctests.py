"""Run the ``Example:`` sections of every public module's docstrings.

STYLE.md: docstrings state the formula, then arguments and returns, then a short
example; these tests keep the examples true. The whole run takes about 1-2 minutes
on a 2-core CPU (mostly compilation), hence ``slow``.
"""

import doctest
import importlib

import pytest

MODULES = [
    "continuum",
    "metastability",
    "notebooks",
    "_resources",
    "sphere",
    "kernels._base",
    "kernels._exp",
    "kernels._toeplitz",
    "kernels._gauge",
    "kernels._registry",
    "metrics",
    "theory",
    "analysis",
    "design",
    "random_batch",
    "integrate",
    "models",
    "energy",
    "depth",
    "prototypes",
    "attention",
    "phase_diagram",
    "_native",
    "_native._cache",
    "_native._exp",
    "_native._phase",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"meanfield.{name}")
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    assert result.attempted > 0, f"meanfield.{name} has no docstring examples"
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} doctest examples failed in meanfield.{name}"
    )
