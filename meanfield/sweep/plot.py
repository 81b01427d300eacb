"""The standard figures of a sweep store: curves against time and heatmaps (PNG files).

Figures are ``matplotlib.figure.Figure`` objects saved directly (no pyplot, no backend
switch: nothing process-wide changes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._paths import open_output
from .spec import SweepKind, kind_of, sweep_kinds
from .store import OK, load

__all__ = ["plot_store", "save_figure"]


def _select_rest(da: Any, keep: list[str]) -> tuple[Any, str]:
    """Take the first index of every dimension not in ``keep``; return (array, note)."""
    sel = {d: 0 for d in da.dims if d not in keep}
    note = ", ".join(f"{d}={da[d].values[0]}" for d in sel if d in da.coords)
    return da.isel(sel), note


def _label(v: Any) -> str:
    return f"{v:.3g}" if np.asarray(v).dtype.kind in "fi" else str(v)


def _store_kind(ds: Any) -> SweepKind:
    """The sweep kind of a store (its ``model`` attribute: the spec's kinds); a model no longer
    registered in this process is plotted as particles (the standard figures)."""
    first = str(ds.attrs.get("model", "")).split(", ")[0]
    try:
        return kind_of(first)
    except ValueError:
        return sweep_kinds()["particles"]


def save_figure(fig: Any, path: Path) -> None:
    """``fig`` as a PNG at ``path``, opened without blocking (``meanfield._paths.open_output``): a
    FIFO, a device or a directory in its place is one ``ValueError`` naming it, never a write
    that waits for a reader."""
    with open_output(path, "figure") as f:
        fig.savefig(f, format="png", dpi=110)


def plot_store(
    store: str | Path, out_dir: str | Path | None = None, *, verify: bool = True
) -> list[Path]:
    r"""Draw the standard views of a sweep store into ``out_dir`` (PNG files); return their paths.

    * curves against time: mean over seeds with a band of $\pm$ one standard error,
      one panel per ``n``, one curve per value of the first swept axis;
    * heatmaps: final-time (or scalar) mean over seeds over the first two axes
      with several values (``n`` and ``beta``/``beta_factor`` typically).

    A sweep kind may draw its own figures instead (``SweepKind.plot``): a ``continuum`` store (the
    density solver) gets the measured growth rate, the theory and their ratio over ``(beta,
    mode)`` (``_continuum.plot``); or draw over the heatmaps (``SweepKind.decorate_heatmap``: the
    critical scale of ``attention``).

    Other axes are held at their first value (named in the titles). Failed and
    pending points are left out of the means (a curve with no finite value is named in the
    title instead of drawn). Axis ranges come from the data (``mf.plotting.data_scale``): a
    curve's value axis is logarithmic when its means are positive and span two decades or more,
    linear otherwise; a quantity with no finite value gets no figure. ``out_dir`` defaults to
    ``STORE_plots`` next to the store.

    The store is verified first (``load(store, verify=verify)``): a damaged chunk raises
    ``StoreDamagedError`` naming it before anything is drawn.
    """
    from matplotlib.figure import Figure

    from ..plotting import data_scale

    ds = load(store, verify=verify)
    if ds.attrs.get("result") == "run":  # a run's store: one point, no grid to draw
        raise ValueError(
            f"{store} is the store of one run (meanfield simulate), not of a sweep: its figures are "
            "the configuration.png and observables.png that simulate draws beside it"
        )
    out_dir = (
        Path(out_dir)
        if out_dir is not None
        else Path(str(Path(store)).rstrip("/").removesuffix(".zarr") + "_plots")
    )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise type(e)(
            f"cannot write the plots to {out_dir}: {e.strerror or e} ({e.filename or out_dir})"
        ) from None
    kind = _store_kind(ds)
    own = kind.plot(ds, out_dir)
    if own is not None:
        return own
    ok = ds["status"] == OK
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
        if not np.any(np.isfinite(mean.values)):
            continue  # no finite value (every point failed or pending): nothing to draw
        if "time" in da.dims:
            color_axis = next((d for d in multi if d != "n"), None)
            panel_axis = "n"
            keep = [panel_axis, "time"] + ([color_axis] if color_axis else [])
            m, note = _select_rest(mean, keep)
            s, _ = _select_rest(se, keep)
            npanel = m.sizes[panel_axis]
            fig = Figure(figsize=(4 * npanel, 3.4))
            axs = fig.subplots(1, npanel, squeeze=False, sharey=True)
            t = ds["time"].values
            means: list[Any] = []
            bands: list[Any] = []
            missing: set[str] = set()
            for j in range(npanel):
                ax = axs[0, j]
                mj, sj = m.isel({panel_axis: j}), s.isel({panel_axis: j})
                ncol = mj.sizes[color_axis] if color_axis else 1
                for c in range(ncol):
                    mc = mj.isel({color_axis: c}) if color_axis else mj
                    sc = sj.isel({color_axis: c}) if color_axis else sj
                    label = (
                        f"{color_axis}={_label(mj[color_axis].values[c])}" if color_axis else None
                    )
                    if not np.any(np.isfinite(mc.values)):
                        missing.add(label or name)  # no curve (and no legend entry) without data
                        continue
                    lines = ax.plot(t, mc.values, label=label)
                    lo, hi = (mc - sc).values, (mc + sc).values
                    ax.fill_between(t, lo, hi, color=lines[0].get_color(), alpha=0.25, lw=0)
                    means.append(mc.values)
                    bands += [lo, hi]
                ax.set_title(
                    f"n={int(m[panel_axis].values[j])}" + (f" ({note})" if note else ""), fontsize=9
                )
                ax.set_xlabel("time")
                data_scale(ax, t, axis="x", log=False, pad=0.0)
                if j == 0:
                    ax.set_ylabel(name)
            if color_axis:  # on the first panel with a curve
                ax = next((a for a in axs[0] if a.get_legend_handles_labels()[0]), axs[0, 0])
                ax.legend(fontsize=7)
            if means:  # the shared y axis: the scale from the means, the range with the bands
                mv = np.concatenate([np.ravel(v) for v in means])
                bv = np.concatenate([np.ravel(v) for v in bands])
                if data_scale(axs[0, 0], mv) == "log":
                    data_scale(axs[0, 0], np.concatenate([mv, bv[bv > 0]]), log=True)
                else:
                    data_scale(axs[0, 0], np.concatenate([mv, bv]), log=False)
            fig.suptitle(
                f"{ds.attrs.get('sweep_name', '')}: {name} (mean +- s.e. over seeds)"
                + (f"; no finite value: {', '.join(sorted(missing))}" if missing else ""),
                fontsize=10,
            )
            fig.tight_layout()
            p = out_dir / f"{name}_vs_time.png"
            save_figure(fig, p)
            paths.append(p)
        final = mean.isel(time=-1) if "time" in mean.dims else mean
        if "rank" in final.dims:
            final = final.isel(rank=0)
        if len(multi) >= 2:
            a, b = multi[0], multi[1]
            h, note = _select_rest(final, [a, b])
            h = h.transpose(b, a)
            if not np.any(np.isfinite(h.values)):
                continue  # no finite final value on this plane
            fig = Figure(figsize=(5, 4))
            ax = fig.subplots()
            im = ax.imshow(h.values, origin="lower", aspect="auto")
            v = h.values[np.isfinite(h.values)]
            if v.size and v.min() == v.max():  # a constant: a colour scale around it, not a point
                half = 0.05 * abs(float(v[0])) or 0.05
                im.set_clim(float(v[0]) - half, float(v[0]) + half)
            ax.set_xticks(
                range(h.sizes[a]), [_label(v) for v in h[a].values], rotation=45, fontsize=7
            )
            ax.set_yticks(range(h.sizes[b]), [_label(v) for v in h[b].values], fontsize=7)
            ax.set_xlabel(a)
            ax.set_ylabel(b)
            fig.colorbar(im, ax=ax, label=name)
            kind.decorate_heatmap(ax, h, ds, a, b)
            when = "final time" if "time" in ds[name].dims else "mean over seeds"
            ax.set_title(f"{name} ({when})" + (f"\n{note}" if note else ""), fontsize=9)
            fig.tight_layout()
            p = out_dir / f"{name}_heatmap_{a}_{b}.png"
            save_figure(fig, p)
            paths.append(p)
    return paths
