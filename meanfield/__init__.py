"""meanfield: a JAX engine for the mathematics of collapse in transformers.

Public API (see README.md for a tour)::

    import meanfield as mf
    mf.sphere, mf.kernels, mf.models, mf.metrics, mf.theory,
    mf.energy, mf.velocity, mf.simulate, mf.positions,
    mf.attention, mf.depth, mf.prototypes, mf.design, mf.analysis,
    mf.phase_diagram, mf.random_batch, mf.continuum, mf.metastability

Models are named in one registry, ``mf.kernels.MODELS`` (``mf.kernels.make(name, ...)``),
from which the CLI flags, sweep specs and reproductions derive.

Edges (import explicitly): ``meanfield.sweep`` (spec, plan, run, zarr store, plots),
``meanfield.plotting``, ``meanfield.cli``, ``meanfield.info``, ``meanfield.reproduce``.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from . import (
    analysis,
    attention,
    continuum,
    depth,
    design,
    kernels,
    metastability,
    metrics,
    models,
    phase_diagram,
    prototypes,
    random_batch,
    sphere,
    theory,
)
from .energy import energy, field, velocity
from .integrate import Trajectory, simulate
from .models import positions

try:
    __version__ = _version("meanfield")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "__version__",
    "analysis",
    "attention",
    "continuum",
    "depth",
    "design",
    "energy",
    "field",
    "kernels",
    "metastability",
    "metrics",
    "models",
    "phase_diagram",
    "positions",
    "prototypes",
    "random_batch",
    "simulate",
    "sphere",
    "theory",
    "Trajectory",
    "velocity",
]
