"""On-disk store of a sweep: an xarray Dataset in a zarr store, filled chunk by chunk, resumable.

Layout of ``STORE.zarr``::

    zarr.json, <variables>/, <coordinates>/    the Dataset (xarray, zarr format 3)
    _sweep/zarr.json                            a zarr group holding the bookkeeping:
    _sweep/initialized                          the plan (blocks per shape), written last at creation
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
swept model parameters, ``seed``, and ``time`` or ``rank``. ``status``: 0 pending,
1 ok, 2 failed (the state went non-finite).
"""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np

__all__ = ["create", "check_resumable", "done_chunks", "write_chunk", "load", "plot"]

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


def grid_dims(spec) -> list[str]:
    dims = ["model"] if spec.kinds_axis else []
    dims.append("n")
    if spec.d_axis:
        dims.append("d")
    return dims + list(spec.axes) + ["seed"]


def _group_index(spec, g) -> tuple:
    idx = [spec.kinds.index(g.kind)] if spec.kinds_axis else []
    idx.append(spec.n.index(g.n))
    if spec.d_axis:
        idx.append(spec.d.index(g.d))
    return tuple(idx)


def _versions() -> dict:
    import jax

    from . import __version__

    devs = jax.devices()
    return {
        "meanfield_version": __version__,
        "jax_version": jax.__version__,
        "python_version": platform.python_version(),
        "devices": f"{len(devs)} x {devs[0].platform}:{getattr(devs[0], 'device_kind', '')}",
        "process_count": jax.process_count(),
    }


_DESCRIPTIONS = {
    "collapse_gap": "collapse gap G_x = 1 - 1/(n(n-1)) sum_{i!=j} <x_i, x_j>",
    "energy": "interaction energy E = 1/(2 n^2) sum h (times e^-beta when rescaled)",
    "clusters": "number of clusters (angular threshold cluster_threshold)",
    "token_similarity": "token similarity ||Pi X||^2 / ||X||^2",
    "top_weight": "largest attention weight A_(1)",
    "top_weights": "ordered attention weights A_(1..k)",
    "ratios": "A_(k) / A_(1)",
    "cumulative": "sum_{i<=k} A_(i)",
    "log_partition": "log Z_n = log sum_j exp(-beta T_j)",
    "stop_time": "time at which the run ended (t1 unless stopped early or failed)",
    "num_steps": "accepted solver steps",
    "status": "0 pending, 1 ok, 2 failed (non-finite state)",
}


def _skeleton(plan):
    """The Dataset with every point pending (NaN / 0), and its zarr encoding."""
    import xarray as xr

    from .sweep import _output_layout

    spec = plan.spec
    dims = grid_dims(spec)
    coords: dict = {}
    if spec.kinds_axis:
        coords["model"] = np.asarray(spec.kinds, dtype=object)  # variable-length strings (zarr v3 "string")
    coords["n"] = np.asarray(spec.n, np.int64)
    if spec.d_axis:
        coords["d"] = np.asarray(spec.d, np.int64)
    for k, v in spec.axes.items():
        coords[k] = np.asarray(v)
    coords["seed"] = spec.seeds.astype(np.int64)
    if spec.simulated:
        coords["time"] = np.asarray(spec.ts)
    if any(t == ("rank",) for t in _output_layout(spec).values()):
        coords["rank"] = np.arange(1, spec.top_k + 1)
    if spec.beta_rule is not None:
        bdims = ["n"] + (["d"] if spec.d_axis else []) + ["beta_factor"]
        vals = np.stack([np.stack([spec.beta_values(n, d) for d in spec.d]) for n in spec.n])
        if not spec.d_axis:
            vals = vals[:, 0]
        coords["beta"] = (bdims, vals)
    grid_shape = tuple(len(coords[d]) for d in dims)
    zblock = (1,) * (len(dims) - len(plan.zarr_block)) + tuple(plan.zarr_block)
    fdt = np.float64 if spec.dtype == "float64" else np.float32
    data_vars, encoding = {}, {}
    layout = dict(_output_layout(spec))
    layout["status"] = ()
    for name, trailing in layout.items():
        shape = grid_shape + tuple(len(coords[t]) for t in trailing)
        if name == "status":
            arr = np.zeros(shape, np.int8)
        elif name == "num_steps":
            arr = np.zeros(shape, np.int32)
        else:
            arr = np.full(shape, np.nan, fdt)
        attrs = {"description": _DESCRIPTIONS.get(name, name)}
        if name == "status":
            attrs.update(flag_values=[0, 1, 2], flag_meanings="pending ok failed")
        data_vars[name] = (dims + list(trailing), arr, attrs)
        encoding[name] = {"chunks": zblock + tuple(shape[len(dims):])}
    attrs = {
        "sweep_name": spec.name,
        "description": spec.data.get("description", ""),
        "model": ", ".join(spec.kinds),
        "spec": spec.text,
        "spec_hash": spec.hash,
        "spec_json": json.dumps(spec.data, sort_keys=True),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **_versions(),
    }
    if not spec.d_axis:
        attrs["d"] = spec.d[0]
    for k, v in spec.params.items():
        if k not in spec.axes:
            attrs[f"model.{k}"] = v if not isinstance(v, bool) else int(v)
    return xr.Dataset(data_vars, coords=coords, attrs=attrs), encoding


def create(out, plan) -> None:
    """Create the store (all points pending) unless it was fully initialised before."""
    out = Path(out)
    if (out / _META / "initialized").exists():
        return
    ds, encoding = _skeleton(plan)
    ctx = _quiet_zarr()
    try:
        import zarr

        ds.to_zarr(out, mode="w", encoding=encoding, consolidated=True)
        zarr.open_group(out / _META, mode="w")
    finally:
        ctx.__exit__(None, None, None)
    (out / _META / "done").mkdir(parents=True, exist_ok=True)
    info = {
        "blocks": [list(g.block) for g in plan.groups],
        "zarr_block": list(plan.zarr_block),
        "spec_hash": plan.spec.hash,
    }
    _atomic_write(out / _META / "initialized", json.dumps(info))


def check_resumable(out, spec):
    """Check that ``out`` is a store of ``spec``; return its stored blocks (None: not initialised).

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
    if stored != spec.data:
        from .sweep import spec_differences

        diffs = spec_differences(stored, spec.data)
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


def write_chunk(out, plan, cid: int, gi: int, slices: tuple, results: dict, layout: dict) -> None:
    """Write one chunk's results (flat over the block, row-major) then its completion mark."""
    import zarr

    out = Path(out)
    g = plan.groups[gi]
    block_shape = tuple(s.stop - s.start for s in slices)
    prefix = _group_index(plan.spec, g)
    ctx = _quiet_zarr()
    try:
        root = zarr.open_group(out, mode="r+", use_consolidated=False)
        for name, value in results.items():
            trailing = value.shape[1:]
            region = prefix + tuple(slices) + tuple(slice(None) for _ in trailing)
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
        from .sweep import make_plan, parse_spec

        spec = parse_spec(ds.attrs["spec"], default_name=ds.attrs.get("sweep_name", "sweep"))
        total = len(make_plan(spec, blocks=info["blocks"], devices=1).chunks)
        ds.attrs["chunks_total"] = total
    ds.attrs["chunks_done"] = len(done_chunks(store))
    return ds


# ----------------------------------------------------------------------------
# standard figures (matplotlib imported here only)
# ----------------------------------------------------------------------------


def _select_rest(da, keep: list[str]):
    """Take the first index of every dimension not in ``keep``; return (array, note)."""
    sel = {d: 0 for d in da.dims if d not in keep}
    note = ", ".join(f"{d}={da[d].values[0]}" for d in sel if d in da.coords)
    return da.isel(sel), note


def plot(store, out_dir=None) -> list[Path]:
    """Draw the standard views of a sweep store into ``out_dir`` (PNG files); return their paths.

    * curves against time: mean over seeds with a band of +- one standard error,
      one panel per ``n``, one curve per value of the first swept axis;
    * heatmaps: final-time (or scalar) mean over seeds over the first two axes
      with several values (``n`` and ``beta``/``beta_factor`` typically).

    Other axes are held at their first value (named in the titles). Failed and
    pending points are left out of the means.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = load(store)
    out_dir = Path(out_dir) if out_dir is not None else Path(str(Path(store)).rstrip("/").removesuffix(".zarr") + "_plots")
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = ds["status"] == 1
    axes_order = [d for d in ds["status"].dims if d != "seed"]
    multi = [d for d in axes_order if ds.sizes[d] > 1]
    paths = []
    skip = ("status", "num_steps", "stop_time")
    for name in ds.data_vars:
        if name in skip:
            continue
        da = ds[name].where(ok)
        nseed = ok.sum("seed")
        mean = da.mean("seed")
        se = da.std("seed") / np.sqrt(np.maximum(nseed, 1))
        if "time" in da.dims:
            color_axis = next((d for d in multi if d != "n"), None)
            panel_axis = "n"
            keep = [panel_axis, "time"] + ([color_axis] if color_axis else [])
            m, note = _select_rest(mean, keep)
            s, _ = _select_rest(se, keep)
            npanel = m.sizes[panel_axis]
            fig, axs = plt.subplots(1, npanel, figsize=(4 * npanel, 3.4), squeeze=False, sharey=True)
            for j in range(npanel):
                ax = axs[0, j]
                mj, sj = m.isel({panel_axis: j}), s.isel({panel_axis: j})
                ncol = mj.sizes[color_axis] if color_axis else 1
                for c in range(ncol):
                    mc = mj.isel({color_axis: c}) if color_axis else mj
                    sc = sj.isel({color_axis: c}) if color_axis else sj
                    t = ds["time"].values
                    label = f"{color_axis}={mj[color_axis].values[c]:.4g}" if color_axis and mj[color_axis].dtype.kind in "fi" else (
                        f"{color_axis}={mj[color_axis].values[c]}" if color_axis else None)
                    ax.plot(t, mc.values, label=label)
                    ax.fill_between(t, (mc - sc).values, (mc + sc).values, alpha=0.25)
                ax.set_title(f"n={int(m[panel_axis].values[j])}" + (f" ({note})" if note else ""), fontsize=9)
                ax.set_xlabel("time")
                if j == 0:
                    ax.set_ylabel(name)
                    if color_axis:
                        ax.legend(fontsize=7)
            fig.suptitle(f"{ds.attrs.get('sweep_name', '')}: {name} (mean +- s.e. over seeds)", fontsize=10)
            fig.tight_layout()
            p = out_dir / f"{name}_vs_time.png"
            fig.savefig(p, dpi=110)
            plt.close(fig)
            paths.append(p)
        final = mean.isel(time=-1) if "time" in mean.dims else mean
        if "rank" in final.dims:
            final = final.isel(rank=0)
        if len(multi) >= 2:
            a, b = multi[0], multi[1]
            h, note = _select_rest(final, [a, b])
            h = h.transpose(b, a)
            fig, ax = plt.subplots(figsize=(5, 4))
            im = ax.imshow(h.values, origin="lower", aspect="auto")
            ax.set_xticks(range(h.sizes[a]), [f"{v:.3g}" if np.asarray(v).dtype.kind in "fi" else str(v) for v in h[a].values], rotation=45, fontsize=7)
            ax.set_yticks(range(h.sizes[b]), [f"{v:.3g}" if np.asarray(v).dtype.kind in "fi" else str(v) for v in h[b].values], fontsize=7)
            ax.set_xlabel(a)
            ax.set_ylabel(b)
            fig.colorbar(im, ax=ax, label=name)
            if ds.attrs.get("model") == "attention" and (a, b) == ("n", "beta") and "d" in ds.attrs:
                # the critical scale of long-context attention, beta = 2 n^(2/(d-1)) (paper Fig. 3)
                nn = h["n"].values.astype(float)
                crit = 2.0 * nn ** (2.0 / (int(ds.attrs["d"]) - 1))
                lb = np.log(h["beta"].values.astype(float))
                ax.plot(range(len(nn)), np.interp(np.log(crit), lb, np.arange(len(lb)), left=np.nan, right=np.nan),
                        "w--", label="beta = 2 n^alpha")
                ax.legend(fontsize=7, loc="lower right")
            when = "final time" if "time" in ds[name].dims else "mean over seeds"
            ax.set_title(f"{name} ({when})" + (f"\n{note}" if note else ""), fontsize=9)
            fig.tight_layout()
            p = out_dir / f"{name}_heatmap_{a}_{b}.png"
            fig.savefig(p, dpi=110)
            plt.close(fig)
            paths.append(p)
    return paths
