"""Run the ``Example:`` sections of every public module's docstrings (STYLE.md: docstrings end with an example)."""

import doctest
import importlib

import pytest

MODULES = [
    "sphere",
    "kernels",
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
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"meanfield.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples failed in meanfield.{name}"
