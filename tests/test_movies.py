"""Movies of a run (``mf.plotting.animate``) checked by what their frames show.

The first and last frames are decoded (Pillow for GIF, ffmpeg for mp4) and the pixels at the tokens'
positions (the trajectory through the movie's fixed view: the circle for d = 2, the sphere seen
from the camera ``(elev, azim)`` for d = 3, computed here from the camera's formula, then the
axis transform) must be token-coloured in that frame; positions the tokens reach by the end that
were empty at the start must be empty in the first frame. A movie whose tokens do not move (the
frozen 3D scatter of issue 41) fails these checks: ``test_a_frozen_movie_fails_the_check``.
Token colours are saturated (``mf.plotting.CLUSTER_PALETTE``, C0); the guides, text and
background are grey, black and white.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from _figures import data_to_pixels

import meanfield as mf
from meanfield import plotting

ROOT = Path(__file__).resolve().parents[1]
SATURATED = 40  # max - min of the RGB channels (0..255) of a token pixel; grey and white: ~0


def _run(d: int, *, n: int = 32, t1: float = 8.0, saves: int = 5, seed: int = 0):
    x0 = mf.sphere.uniform(jax.random.key(seed), n, d)
    return mf.simulate(mf.kernels.USA(4.0), x0, t1=t1, dt=0.02, ts=np.linspace(0.0, t1, saves))


@pytest.fixture(scope="module")
def run2():
    return _run(2, n=16)


@pytest.fixture(scope="module")
def run3():
    # seed 2: its two end clusters lie away from every start token (with seed 0 the one end
    # cluster sits on a start token, and nothing tells a moving movie from a frozen one)
    return _run(3, seed=2)


def _screen(x: np.ndarray, elev: float, azim: float) -> np.ndarray:
    """Screen coordinates of tokens: the plane itself (d = 2) or the orthographic camera (d = 3),
    written out here rather than taken from the module under test."""
    if x.shape[-1] == 2:
        return x
    e, a = np.deg2rad(elev), np.deg2rad(azim)
    right = np.array([-np.sin(a), np.cos(a), 0.0])
    up = np.array([-np.sin(e) * np.cos(a), -np.sin(e) * np.sin(a), np.cos(e)])
    return np.stack([x @ right, x @ up], axis=-1)


def _frames(path: Path) -> list[np.ndarray]:
    """RGB frames of a movie file."""
    if path.suffix == ".gif":
        from PIL import Image

        out = []
        with Image.open(path) as im:
            for k in range(im.n_frames):
                im.seek(k)
                out.append(np.asarray(im.convert("RGB")))
        return out
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    return [np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in reader]


def _saturation(img: np.ndarray, px: np.ndarray, radius: int = 0) -> np.ndarray:
    """Largest channel spread in the (2 radius + 1)^2 pixels around each pixel position ``px``."""
    sat = img.max(-1).astype(int) - img.min(-1).astype(int)
    cols = np.clip(np.round(px[:, 0]).astype(int), radius, img.shape[1] - 1 - radius)
    rows = np.clip(np.round(px[:, 1]).astype(int), radius, img.shape[0] - 1 - radius)
    out = np.zeros(len(px), int)
    for dr in range(-radius, radius + 1):
        for dc in range(-radius, radius + 1):
            out = np.maximum(out, sat[rows + dr, cols + dc])
    return out


def movie_problems(
    frames, traj, *, pair=False, moved_min=5, elev=20.0, azim=35.0, **build
) -> list[str]:
    """What the first and last frames get wrong about where the tokens are (``pair``: the movie
    was made from ``(ts, xs)``, without the run's energy: another side panel, another layout)."""
    ts, xs = np.asarray(traj.ts), np.asarray(traj.xs, np.float64)
    source = (ts, xs) if pair else traj
    layout = plotting._build_movie(source, elev=elev, azim=azim, **build)  # its axes, in Agg
    first, last = frames[0], frames[-1]
    problems = []
    if first.shape != (layout.height, layout.width, 3):
        return [f"frame shape {first.shape}, layout {(layout.height, layout.width)}"]
    p0 = data_to_pixels(layout.ax, _screen(xs[0], elev, azim), first.shape)
    p1 = data_to_pixels(layout.ax, _screen(xs[-1], elev, azim), last.shape)
    for name, img, px in (("first", first, p0), ("last", last, p1)):
        miss = np.flatnonzero(_saturation(img, px, radius=1) < SATURATED)
        if miss.size:
            problems.append(f"{name} frame: no token drawn at {miss.size} token positions")
    # where the tokens end up, away from every start position: empty at the start
    # (a marker's radius, sqrt(area) / 2 points, plus two pixels)
    r = 0.5 * np.sqrt(layout.points.get_sizes()[0]) * layout.fig.dpi / 72.0 + 2.0
    dist = np.linalg.norm(p1[:, None, :] - p0[None, :, :], axis=-1).min(1)
    moved = np.flatnonzero(dist > r)
    if moved.size < moved_min:
        problems.append(f"only {moved.size} tokens moved away from all start positions")
    full = np.flatnonzero(_saturation(first, p1[moved]) >= SATURATED)
    if full.size:
        problems.append(
            f"first frame: tokens already drawn at {full.size} of {moved.size} end positions"
        )
    return problems


@pytest.mark.parametrize("d", [2, 3])
def test_frames_show_the_tokens_where_the_trajectory_puts_them(d, run2, run3, tmp_path):
    traj = {2: run2, 3: run3}[d]
    path = Path(plotting.animate(traj, tmp_path / "m.gif", color=None, dpi=50, size=(6, 3)))
    frames = _frames(path)
    assert len(frames) == traj.xs.shape[0]
    assert movie_problems(frames, traj, color=None, dpi=50, size=(6, 3)) == []
    # the camera is the caller's: another azimuth draws the sphere elsewhere
    if d == 3:
        moved = plotting.animate(
            traj, tmp_path / "az.gif", color=None, dpi=50, size=(6, 3), azim=120.0
        )
        other = _frames(Path(moved))
        assert movie_problems(other, traj, color=None, dpi=50, size=(6, 3), azim=120.0) == []
        assert movie_problems(other, traj, color=None, dpi=50, size=(6, 3)) != []


def test_a_noisy_run_is_a_moving_movie(tmp_path):
    """A run with noise (issue 49: movies of noisy runs): the noisy Kuramoto model on the circle,
    every frame checked against the trajectory, and the noise moves it (not the noise-free run)."""
    x0 = mf.sphere.uniform(jax.random.key(4), 16, 2)
    ts = np.linspace(0.0, 3.0, 5)
    kw = dict(t1=3.0, dt=0.05, ts=ts)
    traj = mf.simulate(
        mf.kernels.Kuramoto(1.5), x0, noise=mf.noise.Independent(0.8), key=jax.random.key(5), **kw
    )
    still = mf.simulate(mf.kernels.Kuramoto(1.5), x0, **kw)
    assert np.abs(np.asarray(traj.xs[-1]) - np.asarray(still.xs[-1])).max() > 0.1
    path = Path(plotting.animate(traj, tmp_path / "noisy.gif", color=None, dpi=50, size=(6, 3)))
    frames = _frames(path)
    assert len(frames) == len(ts)
    assert movie_problems(frames, traj, color=None, dpi=50, size=(6, 3)) == []


def test_a_frozen_movie_fails_the_check(run3, tmp_path):
    path = Path(plotting.animate(run3, tmp_path / "m.gif", color=None, dpi=50, size=(6, 3)))
    frames = _frames(path)
    frozen = [frames[0]] * len(frames)  # what the blitted 3D scatter wrote
    problems = movie_problems(frozen, run3, color=None, dpi=50, size=(6, 3))
    assert any(p.startswith("last frame: no token drawn") for p in problems), problems


@pytest.mark.filterwarnings("ignore:os.fork")
def test_mp4_frames_show_the_tokens(run3, tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    path = Path(plotting.animate(run3, tmp_path / "m.mp4", color=None, dpi=50, size=(6, 3)))
    frames = _frames(path)
    assert len(frames) == run3.xs.shape[0]
    # H.264 blurs colours a little: the check of the GIF, on the decoded frames
    assert movie_problems(frames, run3, color=None, dpi=50, size=(6, 3)) == []


def test_trails_and_cluster_colours(run2, tmp_path):
    from matplotlib.colors import to_rgba_array

    path = plotting.animate(run2, tmp_path / "m.gif", trail=3, size=(6, 3))
    frames = _frames(Path(path))
    xs = np.asarray(run2.xs, np.float64)
    layout = plotting._build_movie(run2, trail=3, size=(6, 3))
    # the trail in frame 1: the middle of the chord from a token's position in frame 0 to its
    # position in frame 1 (a straight segment between saves) is token-coloured, not in frame 0
    p0 = data_to_pixels(layout.ax, xs[0], frames[1].shape)
    p1 = data_to_pixels(layout.ax, xs[1], frames[1].shape)
    far = np.linalg.norm(p1 - p0, axis=1) > 12
    assert far.sum() >= 3
    middle = (p0[far] + p1[far]) / 2
    assert np.all(_saturation(frames[1], middle, radius=1) >= SATURATED)
    assert np.mean(_saturation(frames[0], middle) >= SATURATED) < 0.5
    p1 = data_to_pixels(layout.ax, xs[-1], frames[-1].shape)
    # colour by cluster: each token in its final cluster's palette colour (largest first)
    labels = np.asarray(mf.metastability.clusters(xs[-1], 0.1).labels)
    palette = to_rgba_array(plotting.CLUSTER_PALETTE)[:, :3] * 255
    big = np.argmax(np.bincount(labels))
    img = frames[-1].astype(float)
    cols, rows = np.round(p1[labels == big]).astype(int).T
    assert np.abs(img[rows, cols] - palette[0]).max() < 30


def _gathering(frames, traj, *, pair=False, **build) -> tuple[int, int]:
    """Token-coloured pixels of the configuration panel in the first and last frames."""
    source = (np.asarray(traj.ts), np.asarray(traj.xs)) if pair else traj
    layout = plotting._build_movie(source, **build)
    x0, y0, x1, y1 = layout.ax.bbox.extents
    h = frames[0].shape[0]
    rows = slice(int(h - y1) + 2, int(h - y0) - 2)
    cols = slice(int(x0) + 2, int(x1) - 2)

    def coloured(img):
        sat = img.max(-1).astype(int) - img.min(-1).astype(int)
        return int(np.sum(sat[rows, cols] >= SATURATED))

    return coloured(frames[0]), coloured(frames[-1])


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3])
def test_usa_movie_shows_the_tokens_gathering(d, tmp_path):
    """Issue 41's acceptance: a USA run (n = 64, beta = 4, t1 = 30) gives a movie whose frames
    show the tokens gathering into clusters, under the default backend and MPLBACKEND=svg."""
    traj = _run(d, n=64, t1=30.0, saves=6)
    build = dict(dpi=50, size=(6, 3))
    path = Path(plotting.animate(traj, tmp_path / "usa.gif", **build))
    frames = _frames(path)
    # where the trajectory puts them, in cluster colours (far-side tokens pale); on a circle
    # dense with 64 start tokens an end cluster may sit on one: the gathering is the check of motion
    assert movie_problems(frames, traj, moved_min=0, **build) == []
    start, end = _gathering(frames, traj, **build)
    assert end < 0.25 * start, (start, end)  # 64 spread tokens -> a few overlapping clusters
    num = [int(mf.metastability.clusters(traj.xs[k], 0.1).num) for k in (0, -1)]
    assert num[0] > 20 and num[-1] <= 3
    # the same movie under MPLBACKEND=svg, in a process of its own
    data = tmp_path / "run.npz"
    np.savez(data, ts=np.asarray(traj.ts), xs=np.asarray(traj.xs))
    script = (
        "import sys, numpy as np\n"
        "from meanfield import plotting\n"
        "z = np.load(sys.argv[1])\n"
        "plotting.animate((z['ts'], z['xs']), sys.argv[2], dpi=50, size=(6, 3))\n"
    )
    env = {**os.environ, "MPLBACKEND": "svg", "JAX_PLATFORMS": "cpu"}
    p = subprocess.run(
        [sys.executable, "-c", script, str(data), str(tmp_path / "svg.gif")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    svg_frames = _frames(tmp_path / "svg.gif")
    # a pair (ts, xs) has no energy: the side panel differs, the tokens do not
    assert movie_problems(svg_frames, traj, pair=True, moved_min=0, **build) == []
    svg_start, svg_end = _gathering(svg_frames, traj, pair=True, **build)
    assert svg_end < 0.25 * svg_start, (svg_start, svg_end)


def test_high_dimension_and_tokens_off_the_sphere(tmp_path):
    """d = 5: one principal plane for the whole run (the frames' view does not move); tokens in
    R^2 off the sphere: limits from the data, no cluster axis. Pairs (ts, xs): no simulation."""
    rng = np.random.default_rng(0)
    ts = np.linspace(0.0, 1.5, 4)
    a = rng.normal(size=(12, 5))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b = rng.normal(size=(12, 5))
    b -= np.sum(a * b, 1, keepdims=True) * a
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    xs = np.cos(ts)[:, None, None] * a + np.sin(ts)[:, None, None] * b  # great circles
    path = plotting.animate((ts, xs), tmp_path / "d5.gif", color=None, dpi=50, size=(6.0, 3.0))
    frames = _frames(Path(path))
    layout = plotting._build_movie((ts, xs), color=None, dpi=50, size=(6.0, 3.0))
    assert layout.view.kind == "pca"
    np.testing.assert_allclose(layout.view.basis, plotting.projection(xs).basis)
    for k in (0, -1):
        px = data_to_pixels(layout.ax, layout.view.screen(xs[k]), frames[k].shape)
        assert np.all(_saturation(frames[k], px, radius=1) >= SATURATED)

    flat = np.stack([np.stack([5.0 + t * np.arange(6), 2.0 - t * np.ones(6)], 1) for t in ts])
    path = plotting.animate((ts, flat), tmp_path / "flat.gif", color=None, dpi=50, size=(6.0, 3.0))
    frames = _frames(Path(path))
    layout = plotting._build_movie((ts, flat), color=None, dpi=50, size=(6.0, 3.0))
    assert layout.view.kind == "plane" and len(layout.fig.axes) == 2  # no twin cluster axis
    (x0, x1), (y0, y1) = layout.view.limits
    assert x0 < 5.0 and x1 > 5.0 + 1.5 * 5 and y0 < 0.5 and y1 > 2.0
    for k in (0, -1):
        px = data_to_pixels(layout.ax, flat[k], frames[k].shape)
        assert np.all(_saturation(frames[k], px, radius=1) >= SATURATED)


@pytest.mark.filterwarnings("ignore:os.fork")
def test_mp4_of_odd_frame_size_is_padded_to_even_sides(run3, tmp_path):
    """H.264 needs even sides: a figsize x dpi of odd pixels (275 x 175) gives frames padded with a
    white column and row (276 x 176) whose top-left 275 x 175 show the tokens where they are."""
    pytest.importorskip("imageio_ffmpeg")
    build = dict(color=None, dpi=50, size=(5.5, 3.5))
    layout = plotting._build_movie(run3, **build)
    assert (layout.width, layout.height) == (275, 175)
    frames = _frames(Path(plotting.animate(run3, tmp_path / "odd.mp4", **build)))
    assert len(frames) == run3.xs.shape[0] and frames[0].shape == (176, 276, 3)
    for f in (frames[0], frames[-1]):  # the padding: white, whatever H.264 blurs at the edge
        assert f[-1, :-2].min() >= 200 and f[:-2, -1].min() >= 200
    assert movie_problems([f[:175, :275] for f in frames], run3, **build) == []


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:os.fork")
def test_simulate_figures_and_movies_do_not_depend_on_the_matplotlib_backend(
    run3, tmp_path, capsys
):
    """``meanfield simulate``'s figures and movie, and ``animate``'s mp4, under ``matplotlib.use``
    of a backend without Agg's blitting (svg: ``animate`` failed there with 'FigureCanvasSVG' object
    has no attribute 'copy_from_bbox'), in this process: the same pixels as under Agg (each is
    drawn on a canvas of its own, whatever the backend). The backend is restored."""
    import matplotlib
    from PIL import Image

    from meanfield import cli

    original = matplotlib.get_backend()
    argv = ["simulate", "--n", "8", "--t1", "0.4", "--dt", "0.05", "--saves", "4", "--seed", "1"]
    try:
        for backend in ("agg", "svg"):
            matplotlib.use(backend)
            assert matplotlib.get_backend().lower() == backend
            out = tmp_path / backend
            assert cli.main([*argv, "--out", str(out), "--movie", str(out / "m.gif")]) == 0
            if backend == "svg":
                pytest.importorskip("imageio_ffmpeg")
                build = dict(color=None, dpi=50, size=(6, 3))
                path = Path(plotting.animate(run3, out / "m.mp4", **build))
                assert movie_problems(_frames(path), run3, **build) == []
    finally:
        matplotlib.use(original)
    capsys.readouterr()
    assert matplotlib.get_backend() == original

    def pixels(path: Path) -> np.ndarray:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))

    for name in ("configuration.png", "observables.png"):
        assert np.array_equal(pixels(tmp_path / "svg" / name), pixels(tmp_path / "agg" / name))
    got, ref = _frames(tmp_path / "svg" / "m.gif"), _frames(tmp_path / "agg" / "m.gif")
    assert len(got) == len(ref) == 4 and all(np.array_equal(a, b) for a, b in zip(got, ref))
