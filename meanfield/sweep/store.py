"""On-disk store of a sweep: an xarray Dataset in a zarr store, filled chunk by chunk, resumable.

The store knows nothing of specs and plans: ``create`` receives the layout as plain data
(``meanfield.sweep.plan.store_layout``) and writes everything later readers need into
the store itself (the spec's text, normalised JSON and hash in the attributes; the
chunking and the chunk count in ``_sweep/initialized``).

Layout of ``STORE.zarr``::

    zarr.json, <variables>/, <coordinates>/    the Dataset (xarray, zarr format 3)
    _sweep/zarr.json                            a zarr group holding the bookkeeping:
    _sweep/initialized                          the chunking (blocks per group), written last at creation
    _sweep/done/000017                          completion mark of chunk 17

Each sweep chunk covers whole zarr chunks of every variable (the zarr chunking is
the smallest chunk block; larger blocks are unions of it), and zarr writes each
chunk file atomically (temporary file and rename). A chunk's completion mark is
written (atomically, by rename) after all its data. A sweep killed at any moment
(SIGKILL included) therefore leaves complete chunks marked and the rest unmarked;
``--resume`` recomputes exactly the unmarked chunks and overwrites any partial
files they left, so the store ends with the data of an uninterrupted run.

Dimensions: ``model`` (when ``kind`` is a list), ``n``, ``d`` (when a list),
``beta`` or ``beta_factor`` (then ``beta`` is a coordinate over ``(n, [d], beta_factor)``),
swept model parameters, ``seed``, and ``time`` or ``rank``. ``status``: ``PENDING`` (0),
``OK`` (1), ``FAILED`` (2: the state went non-finite).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import numpy as np

from ._diff import key_differences

__all__ = ["create", "check_resumable", "done_chunks", "write_chunk", "load", "PENDING", "OK", "FAILED"]

#: Values of the ``status`` variable (CF ``flag_values``/``flag_meanings``).
PENDING, OK, FAILED = 0, 1, 2

_META = "_sweep"


def _quiet_zarr():
    """Silence zarr's notice that consolidated metadata is not in the v3 spec (xarray uses it)."""
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
    warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr hierarchy.*")
    return ctx


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _coord(value):
    """A coordinate of the layout as xarray takes it (strings variable-length: zarr v3 "string")."""
    if isinstance(value, tuple):
        dims, vals = value
        return (list(dims), _coord(vals))
    arr = np.asarray(value)
    return arr.astype(object) if arr.dtype.kind == "U" else arr


def _skeleton(layout: dict):
    """The Dataset with every point pending (NaN / 0), and its zarr encoding."""
    import xarray as xr

    dims = list(layout["dims"])
    coords = {k: _coord(v) for k, v in layout["coords"].items()}
    sizes = {k: (len(v[1]) if isinstance(v, tuple) else len(v)) for k, v in coords.items()}
    grid_shape = tuple(sizes[d] for d in dims)
    zblock = tuple(layout["chunks"])
    data_vars, encoding = {}, {}
    variables = dict(layout["variables"])
    variables["status"] = {"dims": [], "dtype": "int8",
                           "description": f"{PENDING} pending, {OK} ok, {FAILED} failed (non-finite state)"}
    for name, var in variables.items():
        trailing = list(var["dims"])
        shape = grid_shape + tuple(sizes[t] for t in trailing)
        dtype = np.dtype(var["dtype"])
        arr = np.full(shape, np.nan if dtype.kind == "f" else PENDING, dtype)
        attrs = {"description": var["description"]}
        if name == "status":
            attrs.update(flag_values=[PENDING, OK, FAILED], flag_meanings="pending ok failed")
        data_vars[name] = (dims + trailing, arr, attrs)
        encoding[name] = {"chunks": zblock + tuple(shape[len(dims):])}
    attrs = {**layout["attrs"], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return xr.Dataset(data_vars, coords=coords, attrs=attrs), encoding


def create(out, layout: dict) -> None:
    """Create the store (all points pending) unless it was fully initialised before.

    ``layout`` is plain data (``meanfield.sweep.plan.store_layout``): ``dims``, ``coords``,
    ``variables``, ``chunks``, ``attrs`` (with ``spec_json`` and ``spec_hash``), ``blocks``
    and ``chunks_total``.
    """
    out = Path(out)
    if (out / _META / "initialized").exists():
        return
    ds, encoding = _skeleton(layout)
    ctx = _quiet_zarr()
    try:
        import zarr

        ds.to_zarr(out, mode="w", encoding=encoding, consolidated=True)
        zarr.open_group(out / _META, mode="w")
    finally:
        ctx.__exit__(None, None, None)
    (out / _META / "done").mkdir(parents=True, exist_ok=True)
    info = {
        "blocks": [list(b) for b in layout["blocks"]],
        "zarr_block": list(layout["chunks"]),
        "spec_hash": layout["attrs"]["spec_hash"],
        "chunks_total": int(layout["chunks_total"]),
    }
    _atomic_write(out / _META / "initialized", json.dumps(info))


def check_resumable(out, spec_json: dict):
    """Check that ``out`` is a store of the normalised spec ``spec_json``; return its stored
    blocks (None: not initialised).

    Raises ``ValueError`` naming the differing keys when the spec differs.
    """
    out = Path(out)
    if not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory (a zarr store); use another path")
    root = out / "zarr.json"
    if not root.exists():
        if any(out.iterdir()):
            raise ValueError(f"{out} is not a sweep store (no zarr.json); use another path")
        return None
    try:
        attrs = json.loads(root.read_text()).get("attributes", {})
    except (OSError, json.JSONDecodeError):
        attrs = {}
    if "spec_json" not in attrs:
        if (out / _META / "initialized").exists():
            raise ValueError(f"{out} is not a sweep store (no spec in its attributes)")
        return None  # killed while being created: it will be created again
    stored = json.loads(attrs["spec_json"])
    given = json.loads(json.dumps(spec_json, sort_keys=True))  # as it would be stored
    if stored != given:
        diffs = key_differences(stored, given)
        raise ValueError(
            f"cannot resume: store {out} was made from a different spec (differing keys: "
            f"{', '.join(diffs)}); use the same spec or another path"
        )
    mark = out / _META / "initialized"
    if not mark.exists():
        return None
    return json.loads(mark.read_text())["blocks"]


def done_chunks(out) -> set[int]:
    """Ids of the chunks whose completion mark exists."""
    d = Path(out) / _META / "done"
    if not d.is_dir():
        return set()
    return {int(p.name) for p in d.iterdir() if p.name.isdigit()}


def write_chunk(out, cid: int, index: tuple, slices: tuple, results: dict) -> None:
    """Write one chunk's results then its completion mark.

    ``index``: integer positions along the leading grid dimensions (model, n, d);
    ``slices``: the chunk's block along the remaining grid dimensions; ``results``:
    name -> array flat over the block (row-major), with the variable's trailing axes.
    """
    import zarr

    out = Path(out)
    block_shape = tuple(s.stop - s.start for s in slices)
    ctx = _quiet_zarr()
    try:
        root = zarr.open_group(out, mode="r+", use_consolidated=False)
        for name, value in results.items():
            trailing = value.shape[1:]
            region = tuple(index) + tuple(slices) + tuple(slice(None) for _ in trailing)
            root[name][region] = np.asarray(value).reshape(block_shape + trailing)  # type: ignore[index]
    finally:
        ctx.__exit__(None, None, None)
    _atomic_write(out / _META / "done" / f"{cid:06d}", "")


def load(store):
    """Open a sweep store as an ``xarray.Dataset`` (lazy arrays).

    ``attrs["chunks_done"]``/``attrs["chunks_total"]`` say how complete it is;
    ``status`` marks pending (0), ok (1) and failed (2) points.
    """
    import xarray as xr

    store = Path(store)
    if not (store / "zarr.json").exists():
        raise FileNotFoundError(f"sweep store not found: {store}")
    ctx = _quiet_zarr()
    try:
        ds = xr.open_zarr(store, consolidated=True)
    finally:
        ctx.__exit__(None, None, None)
    mark = store / _META / "initialized"
    if mark.exists():
        info = json.loads(mark.read_text())
        if "chunks_total" in info:
            ds.attrs["chunks_total"] = info["chunks_total"]
    ds.attrs["chunks_done"] = len(done_chunks(store))
    return ds
