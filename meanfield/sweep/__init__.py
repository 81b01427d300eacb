"""Sweep engine: declarative grids over ``(model, n, d, beta, seed, ...)``, compiled once per
shape, chunked to a memory budget, sharded across devices, stored resumably (DESIGN.md, Scale-out).

Data flows ``spec -> plan -> run -> store -> plot``:

* ``meanfield.sweep.spec``: the TOML spec parsed, validated and normalised (``Spec``); the
  model kinds and their parameters are those of the registry ``mf.kernels.MODELS`` (and the
  kinds ``attention`` and ``continuum``);
* ``meanfield.sweep.plan``: groups (one compilation per model, value of each static axis and static shape), chunks
  bounded by a memory budget, the store's layout (``Plan``, ``make_plan``);
* ``meanfield.sweep.run``: the per-point programs (the model from ``mf.kernels.build``),
  sharded over ``jax.devices()``, executed chunk by chunk (``run_sweep``);
* ``meanfield.sweep.store``: the zarr store (xarray Dataset), resumable, created atomically,
  checksummed (crc32c) and verified by its readers, filled under per-chunk claims (several
  writers at once); it imports nothing from spec, plan or run: what it needs is written
  into the store at creation;
* ``meanfield.sweep.plot``: the standard figures of a store;
* the sweep kinds, one module each behind one interface (``meanfield.sweep.spec.SweepKind``:
  the spec's sections, the point's cost and program, the store's variables, the figures):
  ``meanfield.sweep._particles`` (every registry model), ``meanfield.sweep._attention`` (one
  fixed query against ``n`` uniform keys) and ``meanfield.sweep._continuum`` (the mean-field
  density solver ``mf.continuum.solve`` over ``(beta, mode, eps)``: measured against
  theoretical growth rates).

CLI: ``meanfield sweep SPEC.toml --out STORE.zarr [--resume] [--memory 2GB] [--dry-run] [--force] [--quiet]``
with ``--part I/N`` (one part of a job array) or ``--coordinator HOST:PORT --num-processes N
--process-id I`` (one of N processes of ``jax.distributed``), ``meanfield sweep [SPEC] --out
STORE.zarr --status``, ``meanfield sweep --verify STORE.zarr`` and ``meanfield plot STORE.zarr
[--out DIR] [--no-verify]`` (also ``python -m meanfield.sweep ...``).
See docs/sweeps.md ("Scaling out": one machine, ``jax.distributed``, job arrays).

The names below load their submodule when first used (PEP 562): ``import meanfield.sweep``
imports neither JAX nor zarr, and ``meanfield sweep --help`` returns before either.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below are, for type checkers and the docs
    from .cli import main, plot_main
    from .plan import Group, Plan, make_plan, parse_memory
    from .plot import plot_store
    from .run import assign_parts, parse_part, run_sweep, sweep_status
    from .spec import OBSERVABLES, Spec, load_spec, parse_spec, spec_differences, spec_hash
    from .store import (
        FAILED,
        OK,
        PENDING,
        StoreDamagedError,
        StoreError,
        StoreFormatError,
        load,
        verify,
    )

__all__ = [
    "Spec",
    "Plan",
    "Group",
    "parse_spec",
    "load_spec",
    "spec_hash",
    "spec_differences",
    "make_plan",
    "parse_memory",
    "run_sweep",
    "sweep_status",
    "assign_parts",
    "parse_part",
    "load",
    "verify",
    "StoreError",
    "StoreDamagedError",
    "StoreFormatError",
    "plot_store",
    "main",
    "plot_main",
    "OBSERVABLES",
    "PENDING",
    "OK",
    "FAILED",
]

#: Where each public name is defined.
_HOMES = {
    "main": "cli",
    "plot_main": "cli",
    "Group": "plan",
    "Plan": "plan",
    "make_plan": "plan",
    "parse_memory": "plan",
    "plot_store": "plot",
    "assign_parts": "run",
    "parse_part": "run",
    "run_sweep": "run",
    "sweep_status": "run",
    "OBSERVABLES": "spec",
    "Spec": "spec",
    "load_spec": "spec",
    "parse_spec": "spec",
    "spec_differences": "spec",
    "spec_hash": "spec",
    "FAILED": "store",
    "OK": "store",
    "PENDING": "store",
    "StoreDamagedError": "store",
    "StoreError": "store",
    "StoreFormatError": "store",
    "load": "store",
    "verify": "store",
}


def __getattr__(name: str) -> Any:
    """A public name, imported at its first use and kept (PEP 562)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
