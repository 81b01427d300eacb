"""meanfield: a JAX engine for the mathematics of collapse in transformers.

Public API (a tour: README.md, then docs/tour.md)::

    import meanfield as mf
    mf.sphere, mf.kernels, mf.models, mf.metrics, mf.theory,
    mf.energy, mf.velocity, mf.simulate, mf.positions,
    mf.attention, mf.depth, mf.prototypes, mf.design, mf.analysis,
    mf.phase_diagram, mf.random_batch, mf.continuum, mf.metastability, mf.masks,
    mf.normalization, mf.geometry, mf.steps, mf.matmul_precision

Models are named in one registry, ``mf.kernels.MODELS`` (``mf.kernels.make(name, ...)``),
from which the CLI flags, sweep specs and reproductions derive.

Every name above is loaded when first used (PEP 562): ``import meanfield`` imports neither
JAX nor any submodule, ``mf.simulate`` imports the engine (JAX, the native kernels: their
build at first use is one line on stderr) and ``mf.depth`` its optimiser (optax) then.
``from meanfield import simulate`` and ``import meanfield.continuum`` work as usual.

The engine's matrix products state ``precision=HIGHEST`` (full float32 on GPUs, whose JAX default
is TF32); ``with mf.matmul_precision("default"):`` trades it for speed (docs/precision.md).

Edges (import explicitly): ``meanfield.sweep`` (spec, plan, run, zarr store, plots),
``meanfield.plotting``, ``meanfield.cli``, ``meanfield.info``, ``meanfield.reproduce``.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# the distribution that installs this package ([project] name in pyproject.toml): its metadata
# holds the version; "meanfield" on PyPI is an unrelated project
_DISTRIBUTION = "meanfield-transformers"

if TYPE_CHECKING:  # what the names below are, for type checkers and the docs
    from . import (
        analysis,
        attention,
        continuum,
        depth,
        design,
        frequencies,
        geometry,
        kernels,
        masks,
        metastability,
        metrics,
        models,
        noise,
        normalization,
        phase_diagram,
        prototypes,
        random_batch,
        sphere,
        steps,
        theory,
    )
    from ._precision import matmul_precision
    from .energy import energy, field, velocity
    from .integrate import Trajectory, simulate
    from .models import positions

    __version__: str

__all__ = [
    "__version__",
    "analysis",
    "attention",
    "continuum",
    "depth",
    "design",
    "energy",
    "field",
    "frequencies",
    "geometry",
    "kernels",
    "masks",
    "matmul_precision",
    "metastability",
    "metrics",
    "models",
    "noise",
    "normalization",
    "phase_diagram",
    "positions",
    "prototypes",
    "random_batch",
    "simulate",
    "sphere",
    "steps",
    "theory",
    "Trajectory",
    "velocity",
]

#: The public submodules, imported when first used.
_SUBMODULES = frozenset(
    {
        "analysis",
        "attention",
        "continuum",
        "depth",
        "design",
        "frequencies",
        "geometry",
        "kernels",
        "masks",
        "metastability",
        "metrics",
        "models",
        "noise",
        "normalization",
        "phase_diagram",
        "prototypes",
        "random_batch",
        "sphere",
        "steps",
        "theory",
    }
)
#: The public functions and classes: name -> the submodule that defines it.
_NAMES = {
    "energy": "energy",
    "field": "energy",
    "velocity": "energy",
    "simulate": "integrate",
    "Trajectory": "integrate",
    "positions": "models",
    "matmul_precision": "_precision",
}


def __getattr__(name: str) -> Any:
    """A public name, imported at its first use and kept (PEP 562)."""
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    elif name in _SUBMODULES or (not name.startswith("__") and _is_submodule(name)):
        value = importlib.import_module(
            f"{__name__}.{name}"
        )  # any submodule: ``mf.integrate`` as before
    elif name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version(_DISTRIBUTION)
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            value = "0.0.0"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _is_submodule(name: str) -> bool:
    import importlib.util

    return name.isidentifier() and importlib.util.find_spec(f"{__name__}.{name}") is not None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The package's module: ``mf.energy`` stays the function ``meanfield.energy.energy``
    when the submodule ``meanfield.energy`` is imported (the import system sets the package's
    attribute ``energy`` to the submodule; eager imports used to overwrite it right after)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _NAMES and name == _NAMES[name] and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
