r"""Labelled results: a run and a phase diagram as xarray data, and a run's zarr store.

A run (``mf.simulate``'s ``Trajectory``) is an ``xarray.Dataset`` (``Trajectory.to_xarray``, built
by ``trajectory_dataset``) under the conventions of a point of a sweep store
(``meanfield.sweep.store``):

* coordinates ``time`` (the save times ``ts``, their dtype), ``token`` (``0 .. n-1``) and ``dim``
  (``0 .. d-1``);
* ``x`` over ``(time, token, dim)``: the saved states (the directions $\theta_i$ for the schemes
  with a radius; absent with ``save_states=False``), ``radius`` over ``(time, token)`` for those
  schemes, ``collapse_gap`` and ``energy`` (when the model has one) over ``time``, each user
  observable under its own name over ``time`` (and ``<name>_1``, ... for its trailing axes),
  ``aux`` over ``token`` when given (the token labels, e.g. positions or prompt ids);
* ``stop_time``, ``num_steps``, ``stopped``, ``failure`` (the code of ``mf.integrate.FAILURES``)
  and ``status`` (the store's flag: 1 ok, 2 failed: the run failed or a saved number is NaN or
  infinite) as scalars; every variable's ``description`` attribute says what it is;
* attributes: ``result = "run"``, the model (``model``: its registry name; ``model.<param>``: its
  parameters, as a sweep store names the fixed ones), ``n``, ``d``, the settings given
  (``attrs``: ``t1``, ``dt``, ``solver``, ``seed``, ...), ``spec_json`` and ``spec_hash`` (those
  attributes as canonical JSON and its sha256: what a sweep store records of its spec) and the
  versions (``meanfield_version``, ``jax_version``, ``python_version``, ``devices``, the names a
  sweep store uses).

``write_run(path, ds)`` writes such a Dataset as a sweep store of one point (no grid dimension,
one chunk: checksummed arrays, the completion mark and its digest), so that
``mf.sweep.load(path)`` verifies and opens a run exactly as it opens a sweep: the same variables,
coordinates, values and attributes, plus the store's ``created``, ``chunks_done`` and
``chunks_total``. ``meanfield simulate --out DIR`` writes ``DIR/run.zarr`` this way.

Phase diagrams over several ``n`` (``mf.phase_diagram.sa_phase_diagram(n=[16, 32])``) are labelled
by ``phase_diagram_dataset``: ``fraction`` over ``(n, beta, time)`` (and, with ``per_seed``,
``per_seed`` over ``(n, beta, seed, time)`` and ``steps`` over ``(n, beta)``).

An edge of the package (DESIGN, principle 5): xarray and zarr are imported here, when used, and
no core module imports this one at import time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "trajectory_dataset",
    "write_run",
    "check_run_path",
    "phase_diagram_dataset",
    "over_n",
    "labelled_over",
    "RUN_STORE",
    "DESCRIPTIONS",
]

#: The name of a run's store in ``meanfield simulate --out DIR``: ``DIR/run.zarr``.
RUN_STORE = "run.zarr"

#: ``description`` of each variable of a run (those of a particles sweep where they are the same).
DESCRIPTIONS = {
    "x": "token states x_i(t) at the save times (the directions theta_i for the schemes with a radius)",
    "radius": "radii r_i = |x_i| of the tokens x_i = r_i theta_i (mf.normalization: pre, mix, peri)",
    "collapse_gap": "collapse gap G_x = 1 - 1/(n(n-1)) sum_{i!=j} <x_i, x_j>",
    "energy": "interaction energy E = 1/(2 n^2) sum h (times e^-beta when rescaled)",
    "aux": "token labels xi_i (positions or prompt ids: the model's aux)",
    "stop_time": "time at which the run ended (t1 unless stopped early or failed)",
    "num_steps": "accepted solver steps",
    "stopped": "the early-stop rule fired (saved values after stop_time repeat the final state's)",
}

#: Attributes a run's Dataset sets itself (``attrs`` may not give them).
_OWN_ATTRS = (
    "result",
    "spec_json",
    "spec_hash",
    "meanfield_version",
    "jax_version",
    "python_version",
    "devices",
    "created",
    "chunks_done",
    "chunks_total",
)


def _versions() -> dict[str, str]:
    """The software and devices of the run (the attribute names of a sweep store)."""
    import platform

    import jax

    from . import __version__

    devs = jax.devices()
    return {
        "meanfield_version": __version__,
        "jax_version": jax.__version__,
        "python_version": platform.python_version(),
        "devices": f"{len(devs)} x {devs[0].platform}:{getattr(devs[0], 'device_kind', '')}",
    }


def _attr_value(value: Any) -> Any:
    """``value`` as a JSON attribute (a bool as 0/1, as a sweep store writes them), or ``None``
    when it is not a number, string, bool, 0-d array or list of them (an object with a string
    ``name``, e.g. a variant Module, is recorded by its name)."""
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, list | tuple):
        items = [_attr_value(v) for v in value]
        return None if any(v is None for v in items) else items
    if hasattr(value, "shape") and hasattr(value, "dtype") and np.ndim(value) == 0:
        return _attr_value(np.asarray(value).item())
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else None


def _model_attrs(model: Any) -> dict[str, Any]:
    """``model`` (its registry name, else its class name) and ``model.<param>`` for each
    parameter of its class's schema (``params()``) that it holds as a recordable value."""
    cls = type(model)
    name = getattr(cls, "name", None)
    out: dict[str, Any] = {"model": name if isinstance(name, str) else cls.__name__}
    params = getattr(cls, "params", None)
    try:
        schema = tuple(params()) if callable(params) else ()
    except Exception:  # noqa: BLE001 - a model without a schema: its name only
        schema = ()
    for p in schema:
        pname = getattr(p, "name", None)
        if isinstance(pname, str) and hasattr(model, pname):
            value = _attr_value(getattr(model, pname))
            if value is not None:
                out[f"model.{pname}"] = value
    # the parameters of the model's variants (a registered scheme's own, too)
    from ._declare import Variant, declared_params

    for f in dataclasses.fields(model) if dataclasses.is_dataclass(model) else ():
        variant = getattr(model, f.name, None)
        if isinstance(variant, Variant):
            for q in declared_params(type(variant)):
                value = _attr_value(getattr(variant, q.name))
                if value is not None:
                    out.setdefault(f"model.{q.name}", value)
    return out


def _status_attrs() -> dict[str, Any]:
    """The attributes of ``status``, as a sweep store writes them."""
    from .sweep.store import FAILED, OK, PENDING

    return {
        "description": f"{PENDING} pending, {OK} ok, {FAILED} failed (non-finite state)",
        "flag_values": [PENDING, OK, FAILED],
        "flag_meanings": "pending ok failed",
    }


def trajectory_dataset(
    traj: Any,
    model: Any = None,
    *,
    aux: Any = None,
    attrs: Mapping[str, Any] | None = None,
    failures: Sequence[str] = (),
) -> Any:
    """The run ``traj`` (one ``mf.simulate`` result, not a vmapped batch) as an
    ``xarray.Dataset`` (module docstring); ``Trajectory.to_xarray`` calls it with ``failures``,
    the reasons of the failure codes (``mf.integrate.FAILURES``), named in the description of
    ``failure``.

    Example:
        >>> import jax, meanfield as mf
        >>> from meanfield._labelled import trajectory_dataset
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
        >>> traj = mf.simulate(mf.kernels.USA(1.0), x0, t1=0.2, dt=0.1)
        >>> ds = trajectory_dataset(traj, attrs={"t1": 0.2})
        >>> dict(ds["x"].sizes), float(ds.attrs["t1"])
        ({'time': 2, 'token': 4, 'dim': 3}, 0.2)
    """
    import xarray as xr

    from .sweep.store import FAILED, OK

    ts = np.asarray(traj.ts)
    if ts.ndim != 1:
        raise ValueError(
            f"to_xarray takes one run: ts has shape {ts.shape}, not (T,) (a batch of runs from "
            "jax.vmap: take run i with jax.tree.map(lambda a: a[i], traj))"
        )
    T = ts.shape[0]
    data: dict[str, Any] = {}
    n = d = None
    if traj.xs is not None:
        xs = np.asarray(traj.xs)
        n, d = xs.shape[1], xs.shape[2]
        data["x"] = (("time", "token", "dim"), xs)
    if traj.radius is not None:
        r = np.asarray(traj.radius)
        n = r.shape[1]
        data["radius"] = (("time", "token"), r)
    data["collapse_gap"] = (("time",), np.asarray(traj.collapse_gap))
    if traj.energy is not None:
        data["energy"] = (("time",), np.asarray(traj.energy))
    for name, value in dict(traj.observables).items():
        if not isinstance(name, str) or name in DESCRIPTIONS or name in ("status", "failure"):
            raise ValueError(
                f"observable {name!r} cannot be a variable of the run's Dataset: its name is one of "
                f"the run's own ({', '.join(sorted({*DESCRIPTIONS, 'status', 'failure'}))}) or not "
                "a string; rename it"
            )
        v = np.asarray(value)
        if v.shape[:1] != (T,):
            raise ValueError(
                f"observable {name!r} has shape {v.shape}, not ({T}, ...): one value per save"
            )
        data[name] = (("time",) + tuple(f"{name}_{k}" for k in range(1, v.ndim)), v)
    if aux is not None:
        a = np.asarray(aux)
        if a.ndim == 0 or (n is not None and a.shape[0] != n):
            raise ValueError(
                f"aux must hold one label per token, shape ({n if n is not None else 'n'}, ...), "
                f"got shape {a.shape}"
            )
        n = a.shape[0]
        data["aux"] = (("token",) + tuple(f"aux_{k}" for k in range(1, a.ndim)), a)
    data["stop_time"] = ((), np.asarray(traj.stop_time))
    data["num_steps"] = ((), np.asarray(traj.num_steps))
    data["stopped"] = ((), np.asarray(traj.stopped))
    if traj.failure is not None:
        data["failure"] = ((), np.asarray(traj.failure).astype(np.int8))
    nonfinite = any(
        v[1].dtype.kind in "fc" and not np.all(np.isfinite(v[1])) for v in data.values()
    )
    failed = bool(np.asarray(traj.failed)) or nonfinite
    data["status"] = ((), np.asarray(FAILED if failed else OK, np.int8))
    variables = {}
    for name, (dims, value) in data.items():
        if name == "status":
            vattrs = _status_attrs()
        elif name == "failure":
            reasons = ", ".join(f"{i} {r or 'none'}" for i, r in enumerate(failures))
            vattrs = {"description": f"why the run failed (mf.integrate.FAILURES): {reasons}"}
        else:
            vattrs = {"description": DESCRIPTIONS.get(name, f"observable {name}")}
        variables[name] = (dims, value, vattrs)
    coords: dict[str, Any] = {"time": ts}
    if n is not None:
        coords["token"] = np.arange(n, dtype=np.int64)
    if d is not None:
        coords["dim"] = np.arange(d, dtype=np.int64)
    for dims, value, _ in variables.values():  # the trailing axes of observables and aux
        for k, dim in enumerate(dims):
            if dim not in coords:
                coords[dim] = np.arange(value.shape[k], dtype=np.int64)
    settings: dict[str, Any] = {} if model is None else _model_attrs(model)
    if n is not None:
        settings["n"] = int(n)
    if d is not None:
        settings["d"] = int(d)
    for key, value in dict(attrs or {}).items():
        if not isinstance(key, str) or key in _OWN_ATTRS:
            raise ValueError(
                f"attribute {key!r} is not accepted: a string other than the run's own "
                f"({', '.join(_OWN_ATTRS)})"
            )
        if value is None:
            continue
        recorded = _attr_value(value)
        if recorded is None:
            raise TypeError(
                f"attribute {key!r} must be a number, string, bool or list of them, got "
                f"{type(value).__name__}"
            )
        settings[key] = recorded
    spec_json = json.dumps(settings, sort_keys=True)
    ds_attrs = {
        "result": "run",
        **settings,
        "spec_json": spec_json,
        "spec_hash": hashlib.sha256(spec_json.encode()).hexdigest(),
        **_versions(),
    }
    return xr.Dataset(variables, coords=coords, attrs=ds_attrs)


def check_run_path(path: str | os.PathLike[str]) -> Path:
    """``path`` where ``write_run`` may write a run's store: new, or a run's store it replaces
    (``ValueError`` for anything else: a file, or a directory that is not a run's store)."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return path
    meta = path / "zarr.json"
    try:
        result = json.loads(meta.read_text()).get("attributes", {}).get("result")
    except (OSError, ValueError, AttributeError):
        result = None
    if path.is_symlink() or not path.is_dir() or result != "run":
        raise ValueError(
            f"{path} exists and is not the store of a run (meanfield simulate writes one there and "
            "replaces only another run's); remove it or choose another --out"
        )
    return path


def write_run(path: str | os.PathLike[str], ds: Any) -> Path:
    """Write the run ``ds`` (``trajectory_dataset``) as a one-point sweep store at ``path``
    (module docstring), replacing a run's store there (``check_run_path``); the new store is
    complete before it takes the place of the old one. Returns ``path``.

    Example:
        >>> import jax, tempfile, meanfield as mf
        >>> from meanfield._labelled import write_run
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
        >>> ds = mf.simulate(mf.kernels.USA(1.0), x0, t1=0.2, dt=0.1).to_xarray()
        >>> path = write_run(tempfile.mkdtemp() + "/run.zarr", ds)
        >>> bool((mf.sweep.load(path)["x"] == ds["x"]).all())
        True
    """
    from .sweep import store

    path = check_run_path(path)
    layout = {
        "dims": [],
        "coords": {name: np.asarray(c.values) for name, c in ds.coords.items()},
        "variables": {
            name: {
                "dims": list(v.dims),
                "dtype": str(v.dtype),
                "description": v.attrs.get("description", name),
            }
            for name, v in ds.data_vars.items()
            if name != "status"
        },
        "chunks": [],
        "attrs": dict(ds.attrs),
        "blocks": [[]],
        "chunks_total": 1,
    }
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    new = path.with_name(f".{path.name}.new-{tag}")
    old = path.with_name(f".{path.name}.old-{tag}")
    try:
        store.create(new, layout)
        store.write_chunk(
            new, 0, (), (), {name: np.asarray(v.values)[None] for name, v in ds.data_vars.items()}
        )
        if path.exists():
            os.rename(path, old)
        os.rename(new, path)
    finally:
        for leftover in (new, old):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return path


def phase_diagram_dataset(
    ns: Sequence[Any],
    results: Sequence[Any],
    betas: Any,
    times: Any,
    attrs: Mapping[str, Any],
    dim: str = "n",
) -> Any:
    """Phase diagrams of one sweep at several ``n`` (``results[i]`` at ``ns[i]``: ``(B, C)``
    arrays, or ``PhaseDiagram``s) as one ``xarray.Dataset`` with coordinates ``n``, ``beta``,
    ``time`` (and ``seed`` for per-seed results): ``fraction`` over ``(n, beta, time)``,
    ``per_seed`` over ``(n, beta, seed, time)`` and ``steps`` over ``(n, beta)``. The values
    are the arrays given, stacked (no arithmetic). ``dim``: the name of the first coordinate
    (``"sigma"``: diagrams at several noise amplitudes, ``ns`` their values). Results that are
    themselves Datasets (a list of ``n`` and a list of ``sigma``) are concatenated along ``dim``.

    Example:
        >>> import numpy as np
        >>> from meanfield._labelled import phase_diagram_dataset
        >>> ds = phase_diagram_dataset([4, 8], [np.zeros((1, 2)), np.ones((1, 2))], [1.0],
        ...                            [0.0, 1.0], {})
        >>> dict(ds["fraction"].sizes), ds["fraction"].sel(n=8).values.tolist()
        ({'n': 2, 'beta': 1, 'time': 2}, [[1.0, 1.0]])
    """
    import xarray as xr

    recorded = {k: v for k, v in ((k, _attr_value(v)) for k, v in attrs.items()) if v is not None}
    label = np.asarray(ns, np.int64 if dim == "n" else np.float64)
    if results and isinstance(results[0], xr.Dataset):  # an inner labelled axis
        ds = xr.concat(list(results), dim=dim, combine_attrs="drop_conflicts")
        ds = ds.assign_coords({dim: label})
        ds.attrs = {**recorded, **_versions()}
        return ds
    coords: dict[str, Any] = {
        dim: label,
        "beta": np.asarray(betas),
        "time": np.asarray(times),
    }
    desc = "clustering fraction #{i != j: <x_i, x_j> > threshold} / (n (n - 1))"
    if results and hasattr(results[0], "per_seed"):
        per = np.stack([np.asarray(r.per_seed) for r in results])
        coords["seed"] = np.arange(per.shape[2], dtype=np.int64)
        variables = {
            "fraction": (
                (dim, "beta", "time"),
                np.stack([np.asarray(r.fraction) for r in results]),
                {"description": f"{desc}, averaged over seeds"},
            ),
            "per_seed": ((dim, "beta", "seed", "time"), per, {"description": f"{desc}, by seed"}),
            "steps": (
                (dim, "beta"),
                np.stack([np.asarray(r.steps) for r in results]),
                {"description": "steps run"},
            ),
        }
    else:
        variables = {
            "fraction": (
                (dim, "beta", "time"),
                np.stack([np.asarray(r) for r in results]),
                {"description": f"{desc}, averaged over seeds"},
            )
        }
    return xr.Dataset(variables, coords=coords, attrs={**recorded, **_versions()})


def over_n(function: Callable[..., Any], n: Any, kwargs: dict[str, Any], times: Any) -> Any:
    """``function(**kwargs, n=m)`` for each ``m`` of the list ``n``, labelled
    (``phase_diagram_dataset``, ``times``: the checkpoint times); the phase diagrams' entry for a
    list of ``n``."""
    ns = list(n)
    if not ns or not all(isinstance(m, int | np.integer) and not isinstance(m, bool) for m in ns):
        raise TypeError(f"n must be an int or a non-empty list of ints, got {n!r}")
    if len(set(int(m) for m in ns)) != len(ns):
        raise ValueError(f"n must not repeat a value, got {n!r}")
    if kwargs.get("x0") is not None:
        raise ValueError(
            "x0 fixes n (its shape (seeds, n, d)): give x0 with an int n, or a list of n without x0"
        )
    return labelled_over(function, "n", [int(m) for m in ns], kwargs, times)


def labelled_over(
    function: Callable[..., Any],
    dim: str,
    values: Sequence[Any],
    kwargs: dict[str, Any],
    times: Any,
) -> Any:
    """``function(**kwargs, dim=v)`` for each ``v`` of ``values``, labelled over ``dim``
    (``phase_diagram_dataset``; ``times``: the checkpoint times): the phase diagrams' entry for a
    list of ``n`` or of ``sigma``."""
    if len(set(values)) != len(values):
        raise ValueError(f"{dim} must not repeat a value, got {list(values)!r}")
    results = [function(**{**kwargs, dim: v}) for v in values]
    skip = {"key", "betas", "x0", "per_seed", "seed_chunk", "mask", "dtype", dim}
    attrs = {k: v for k, v in kwargs.items() if k not in skip}
    attrs["function"] = function.__name__
    betas = np.atleast_1d(np.asarray(kwargs["betas"], np.float64))  # as the sweeps take them
    return phase_diagram_dataset(values, results, betas, times, attrs, dim=dim)
