"""Run the ``Example:`` sections of every public module's docstrings.

STYLE.md: docstrings state the formula, then arguments and returns, then a short
example; these tests keep the examples true. The whole run takes about 1-2 minutes
on a 2-core CPU (mostly compilation), hence ``slow``.
"""

import doctest
import importlib
from pathlib import Path

import pytest

import meanfield


def _modules_with_examples() -> list[str]:
    """Every module of the package whose source holds a ``>>>`` example (found, not listed: a
    new module's examples run without an edit here)."""
    root = Path(meanfield.__file__).parent
    names = []
    for path in sorted(root.rglob("*.py")):
        if ">>> " not in path.read_text():
            continue
        parts = path.relative_to(root).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    """The discovery above sees the modules that hold examples (a module in each layer)."""
    for name in (
        "continuum",
        "kernels._exp",
        "_native._crossover",
        "sweep.spec",
        "reproduce._common",
    ):
        assert name in MODULES, name


@pytest.mark.slow
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"meanfield.{name}" if name else "meanfield")
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    assert result.attempted > 0, f"meanfield.{name} has no docstring examples"
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} doctest examples failed in meanfield.{name}"
    )
