"""meanfield: a JAX engine for the mathematics of collapse in transformers.

Public API (see README.md for a tour)::

    import meanfield as mf
    mf.sphere, mf.kernels, mf.models, mf.metrics, mf.theory,
    mf.energy, mf.velocity, mf.simulate, mf.positions,
    mf.attention, mf.depth, mf.prototypes, mf.design, mf.analysis,
    mf.phase_diagram, mf.random_batch

Edges (import explicitly): ``meanfield.sweep`` (xarray/zarr store), ``meanfield.plotting``,
``meanfield.cli``, ``meanfield.reproduce``.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from . import (
    analysis,
    attention,
    depth,
    design,
    kernels,
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
from .kernels import positions

try:
    __version__ = _version("meanfield")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "analysis",
    "attention",
    "design",
    "depth",
    "energy",
    "field",
    "kernels",
    "metrics",
    "models",
    "phase_diagram",
    "random_batch",
    "phase_diagram",
    "positions",
    "prototypes",
    "sphere",
    "theory",
    "simulate",
    "Trajectory",
    "velocity",
]
