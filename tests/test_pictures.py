"""The pictures meanfield writes, checked by content (``tests/_figures.py``).

Every axis of every figure that ``meanfield simulate`` and a sweep's ``plot_store`` write spans a
nonzero range, a log axis spans at least a decade, tick labels do not overlap, and the marks are
where the data is: the tokens of ``configuration.png`` at the projected final state (the circle
for d = 2, the sphere from a fixed camera for d = 3, the run's principal plane for d > 3), on
pixels of the saved PNG that are not background.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _figures import assert_readable, axis_problems, capture_saved_figures, data_to_pixels
from matplotlib.figure import Figure

from meanfield import plotting

# ---------------------------------------------------------------- the checker can fail


def test_the_axis_check_finds_unreadable_axes():
    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [0.93, 1.0])
    ax.set_yscale("log")  # less than a decade on a log axis
    ax.set_xlim(0.5, 0.5 + 1e-9)  # a point, up to rounding
    problems = axis_problems(fig)
    assert any("log y axis over less than a decade" in p for p in problems), problems
    assert any("x range [0.5, 0.5] has no width" in p for p in problems), problems
    fig = Figure(figsize=(1.5, 1.5))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_xticks(np.linspace(0, 1, 12), [f"{v:.6f}" for v in np.linspace(0, 1, 12)])
    assert any("x tick labels overlap" in p for p in axis_problems(fig))
    fig = Figure()
    ax = fig.subplots()
    ax.scatter([0.0, 5.0], [0.0, 0.0])
    ax.set_xlim(-1, 1)
    assert any("scatter points outside" in p for p in axis_problems(fig))


# ---------------------------------------------------------------- data_scale


def test_data_scale_never_logs_less_than_a_decade():
    ax = Figure().subplots()
    assert plotting.data_scale(ax, [0.93, 0.97, 1.0], log=True) == "linear"
    lo, hi = ax.get_ylim()
    assert lo < 0.93 and hi > 1.0 and hi - lo < 0.1  # the data's range, padded
    assert plotting.data_scale(ax, [1e-6, 1e-3, 1.0], log=True) == "log"
    lo, hi = ax.get_ylim()
    assert lo < 1e-6 and hi > 1.0 and hi / lo < 1e7
    assert plotting.data_scale(ax, [0.02, 0.5], log=True) == "log"  # one decade and more
    assert plotting.data_scale(ax, [0.02, 0.5]) == "linear"  # auto: two decades
    assert plotting.data_scale(ax, [1e-9, 1.0], log=False) == "linear"
    assert plotting.data_scale(ax, [3.0, 3.0, np.nan]) == "linear"
    assert ax.get_ylim() == pytest.approx((2.85, 3.15))  # a constant: +-5%
    plotting.data_scale(ax, [0.0, 0.0])
    assert ax.get_ylim() == pytest.approx((-0.05, 0.05))
    assert plotting.data_scale(ax, [1e-6, 1.0], axis="x", log=True) == "log"
    assert ax.get_xscale() == "log"


# ---------------------------------------------------------------- configurations


def _on_circle(n, centres, spread, seed=0):
    rng = np.random.default_rng(seed)
    th = np.repeat(centres, n // len(centres)) + spread * rng.normal(size=n)
    return np.stack([np.cos(th), np.sin(th)], 1)


def test_clustered_circle_is_drawn_on_the_circle():
    """Two tight clusters in d = 2 (a causal ALiBi end state): a projection on principal
    components had no spread in PC2 (a flat line, overlapping ticks); on the circle it reads."""
    x = _on_circle(32, [0.3, 2.4], 1e-4)
    fig = Figure(figsize=(4, 4))
    ax = fig.subplots()
    plotting.plot_configuration(ax, x, title="two clusters")
    assert_readable(fig)
    assert ax.get_xlim() == pytest.approx((-1.1, 1.1)) and ax.get_ylim() == ax.get_xlim()
    offsets = np.asarray(ax.collections[0].get_offsets())
    np.testing.assert_allclose(np.sort(offsets, 0), np.sort(x, 0), atol=1e-12)


def test_sphere_view_projects_with_the_camera():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    fig = Figure(figsize=(4, 4))
    ax = fig.subplots()
    view = plotting.projection(x, elev=30.0, azim=-60.0)
    plotting.plot_configuration(ax, x, projection=view)
    assert_readable(fig)
    e, a = np.deg2rad(30.0), np.deg2rad(-60.0)
    right = np.array([-np.sin(a), np.cos(a), 0.0])
    up = np.array([-np.sin(e) * np.cos(a), -np.sin(e) * np.sin(a), np.cos(e)])
    toward = np.cross(right, up)
    expected = np.stack([x @ right, x @ up], 1)
    # drawn far side first: the offsets are the tokens sorted by depth
    order = np.argsort(x @ toward, kind="stable")
    np.testing.assert_allclose(ax.collections[0].get_offsets(), expected[order], atol=1e-12)
    faces = ax.collections[0].get_facecolors()
    back = (x @ toward)[order] < 0
    assert faces[back, :3].mean() > faces[~back, :3].mean()  # far side pale (toward white)


def test_high_dimension_uses_a_plane_fixed_over_the_run():
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(6, 30, 6))
    xs /= np.linalg.norm(xs, axis=-1, keepdims=True)
    view = plotting.projection(xs)
    assert view.kind == "pca" and view.on_sphere
    np.testing.assert_allclose(view.basis.T @ view.basis, np.eye(2), atol=1e-12)
    # fitted on every frame: the leading plane of the stacked, centred tokens
    pts = xs.reshape(-1, 6)
    w, v = np.linalg.eigh(np.cov(pts.T))
    top = v[:, np.argsort(w)[::-1][:2]]
    np.testing.assert_allclose(np.abs(top.T @ view.basis), np.eye(2), atol=1e-8)
    p = view.screen(xs)
    assert p.shape == (6, 30, 2) and np.all(np.linalg.norm(p, axis=-1) <= 1 + 1e-12)


def test_tokens_off_the_sphere_get_limits_from_the_data():
    x = np.array([[10.0, 20.0], [10.5, 20.0], [10.0, 20.2]])
    view = plotting.projection(x)
    assert view.kind == "plane" and not view.on_sphere
    (x0, x1), (y0, y1) = view.limits
    assert x0 < 10.0 and x1 > 10.5 and y0 < 20.0 and y1 > 20.2 and x1 - x0 < 1.0
    fig = Figure()
    plotting.plot_configuration(fig.subplots(), x)
    assert_readable(fig)


# ---------------------------------------------------------------- meanfield simulate


def _simulate(tmp_path, monkeypatch, *args):
    from meanfield import cli

    saved = capture_saved_figures(monkeypatch)
    out = tmp_path / "run"
    rc = cli.main(["simulate", *map(str, args), "--out", str(out)])
    assert rc == 0
    figs = {p.name: f for p, f in saved}
    assert set(figs) == {"configuration.png", "observables.png"}
    for name, fig in figs.items():
        assert_readable(fig, name=name)
    return out, figs


def _saved(out):
    """The run's numbers from its store ``run.zarr`` (``mf.sweep.load``): the final state and the
    observables over time as float64 (the figures' data)."""
    from meanfield import sweep

    ds = sweep.load(out)
    data = {"x_final": ds["x"].values[-1]}
    for name in ("collapse_gap", "energy"):
        if name in ds:
            data[name] = ds[name].values.astype(np.float64)
    return data


def _check_configuration(out, fig, xfinal_screen):
    """The tokens of configuration.png: the scatter at the projected final state, and the saved
    PNG's pixels there not background (saturated: grey guides and white are not)."""
    from PIL import Image

    ax = fig.axes[0]
    offsets = np.asarray(ax.collections[0].get_offsets())
    np.testing.assert_allclose(np.sort(offsets, axis=0), np.sort(xfinal_screen, axis=0), atol=1e-5)
    img = np.asarray(Image.open(out / "configuration.png").convert("RGB")).astype(int)
    px = np.round(data_to_pixels(ax, xfinal_screen, img.shape)).astype(int)
    sat = img.max(-1) - img.min(-1)
    assert np.all(sat[px[:, 1], px[:, 0]] >= 40)


def test_simulate_causal_alibi_circle(tmp_path, monkeypatch):
    """The issue's case: a causal ALiBi run in d = 2 clusters; its configuration is on the
    circle, its observables have no energy panel (a masked kernel has no energy)."""
    out, figs = _simulate(
        tmp_path, monkeypatch, "--mask", "alibi", "--n", 32, "--d", 2, "--beta", 4,
        "--t1", 15, "--saves", 16,
    )  # fmt: skip
    data = _saved(out)
    _check_configuration(out, figs["configuration.png"], data["x_final"])
    ax = figs["configuration.png"].axes[0]
    assert ax.get_xlim() == pytest.approx((-1.1, 1.1))
    obs = figs["observables.png"]
    labels = [a.get_ylabel() for a in obs.axes]
    assert labels == ["collapse gap $G_x$", "clusters (angle 0.1)"]  # no empty energy panel
    gap = data["collapse_gap"]
    gap_ax = obs.axes[0]
    expected = "log" if gap.max() / gap.min() >= 10 else "linear"
    assert gap_ax.get_yscale() == expected
    lo, hi = gap_ax.get_ylim()
    assert lo <= gap.min() and hi >= gap.max() and (hi - lo) < 2 * (gap.max() - gap.min()) + 1e-9
    line = gap_ax.get_lines()[0]
    np.testing.assert_allclose(line.get_ydata(), gap)


@pytest.mark.slow
def test_simulate_sphere_and_energy_panels(tmp_path, monkeypatch):
    out, figs = _simulate(
        tmp_path, monkeypatch, "--n", 32, "--d", 3, "--beta", 4, "--t1", 6, "--saves", 13
    )
    data = _saved(out)
    view = plotting.projection(data["x_final"])  # the camera is fixed: any state's view
    _check_configuration(out, figs["configuration.png"], view.screen(data["x_final"]))
    obs = figs["observables.png"]
    assert [a.get_ylabel() for a in obs.axes] == [
        "collapse gap $G_x$",
        "energy $E$",
        "clusters (angle 0.1)",
    ]
    summary = json.loads((out / "summary.json").read_text())
    lo, hi = obs.axes[1].get_ylim()
    assert lo <= data["energy"].min() and hi >= summary["theory_max_energy"]


@pytest.mark.slow
def test_simulate_sa_in_high_dimension(tmp_path, monkeypatch):
    out, figs = _simulate(
        tmp_path, monkeypatch, "--kernel", "sa", "--n", 24, "--d", 5, "--t1", 4, "--saves", 9
    )
    obs = figs["observables.png"]
    assert "energy $E$" not in [a.get_ylabel() for a in obs.axes]
    data = _saved(out)
    ax = figs["configuration.png"].axes[0]
    assert ax.get_xlim() == pytest.approx((-1.1, 1.1))  # the unit disc of the principal plane
    offsets = np.asarray(ax.collections[0].get_offsets())
    assert offsets.shape == (24, 2) and np.all(np.linalg.norm(offsets, axis=1) <= 1 + 1e-5)
    # drawn: x_final through an orthonormal (d, 2) map (the run's principal plane)
    basis, *_ = np.linalg.lstsq(data["x_final"].astype(float), offsets, rcond=None)
    np.testing.assert_allclose(data["x_final"] @ basis, offsets, atol=1e-4)
    np.testing.assert_allclose(basis.T @ basis, np.eye(2), atol=1e-3)
    assert figs["configuration.png"].axes[0].get_xlabel().endswith("principal plane (fixed)")


# ---------------------------------------------------------------- sweep plots

SWEEP = """
name = "pictures"
[model]
kind = "usa"
[grid]
n = [5, 7]
d = 3
beta = [1.0, 8.0, 200.0]
seeds = 2
seed = 10
[time]
t1 = 6.0
dt = 0.05
solver = "rk2"
save = 7
[output]
observables = ["collapse_gap", "energy", "clusters"]
"""


@pytest.mark.slow
def test_sweep_plots_read(tmp_path, monkeypatch):
    from meanfield import sweep

    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP)
    store = tmp_path / "s.zarr"
    sweep.run_sweep(spec, store, quiet=True)
    saved = capture_saved_figures(monkeypatch)
    paths = sweep.plot_store(store, tmp_path / "plots")
    assert paths and {p.name for p, _ in saved} == {p.name for p in paths}
    for p, fig in saved:
        assert_readable(fig, name=p.name)
    ds = sweep.load(store)
    figs = {p.name: f for p, f in saved}
    # the collapse gap at beta = 8 falls by decades: a log axis; the cluster count: linear
    gap_fig = figs["collapse_gap_vs_time.png"]
    gap = ds["collapse_gap"].sel(beta=[1.0, 8.0]).mean("seed").values
    assert gap.max() / gap.min() >= 100
    assert gap_fig.axes[0].get_yscale() == "log"
    assert figs["clusters_vs_time.png"].axes[0].get_yscale() == "linear"
    # beta = 200 overflows (failed points): no curve and no legend entry, a note instead
    labels = gap_fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["beta=1", "beta=8"]
    assert "no finite value: beta=200" in gap_fig._suptitle.get_text()
