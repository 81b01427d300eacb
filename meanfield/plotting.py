r"""Matplotlib figures from results (an edge module: the core never imports it).

Sphere views of configurations $x \in (S^{d-1})^n$, curves such as the collapse gap $G_x(t)$
with bands, and saving. Nothing here selects a matplotlib backend: figures go where the
caller's backend sends them (inline in a notebook, a file with ``savefig``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from mpl_toolkits.mplot3d.axes3d import Axes3D

__all__ = [
    "sphere_axes",
    "plot_configuration",
    "plot_curves",
    "savefig",
    "animate",
    "MOVIE_FORMATS",
]

#: Movie formats of ``animate``: ``.mp4`` (ffmpeg from the ``imageio-ffmpeg`` wheel) and ``.gif`` (Pillow).
MOVIE_FORMATS = (".mp4", ".gif")


def sphere_axes(
    ax: Axes3D, *, elev: float = 20.0, azim: float = 35.0, alpha: float = 0.08
) -> Axes3D:
    """Draw a light unit sphere wireframe on a 3D axis, equal aspect, no ticks."""
    u, v = np.mgrid[0 : 2 * np.pi : 40j, 0 : np.pi : 20j]
    ax.plot_wireframe(
        np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="grey", alpha=alpha, lw=0.5
    )
    ax.set_box_aspect((1, 1, 1))
    ax.set_xlim(-1, 1)
    ax.set_ylim(-1, 1)
    ax.set_zlim(-1, 1)
    ax.view_init(elev=elev, azim=azim)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_zticks([])
    return ax


def plot_configuration(
    ax: Axes,
    x: npt.ArrayLike,
    *,
    color: npt.ArrayLike | None = None,
    overlay: npt.ArrayLike | None = None,
    title: str | None = None,
    cmap: str | Colormap = "viridis",
) -> Axes:
    """Scatter a configuration ``x`` (n, d) on ``ax``.

    ``d = 3``: on a sphere view (``ax`` must be 3D). Otherwise the first two
    principal directions of ``x`` (a projection). ``color``: per-point values
    (e.g. positions $s_i$). ``overlay``: (m, d) points of the theory's orbit,
    drawn as a dashed line.
    """
    x = np.asarray(x)
    c = np.arange(len(x)) / len(x) if color is None else np.asarray(color)
    if x.shape[1] == 3 and getattr(ax, "name", "") == "3d":
        ax3: Axes3D = ax  # a 3D axis (its name says so)
        sphere_axes(ax3)
        ax3.scatter(x[:, 0], x[:, 1], x[:, 2], c=c, cmap=cmap, s=6, depthshade=False)
        if overlay is not None:
            o = np.asarray(overlay)
            style: dict[str, Any] = (
                dict(ls="none", marker="*", ms=12, mfc="none")
                if len(o) <= 8
                else dict(ls="--", lw=1.0)
            )
            ax3.plot(o[:, 0], o[:, 1], o[:, 2], color="r", label="theory", **style)
    else:
        xc = x - x.mean(0)
        _, _, vt = np.linalg.svd(xc, full_matrices=False)
        P = vt[:2].T
        p = x @ P
        ax.scatter(p[:, 0], p[:, 1], c=c, cmap=cmap, s=6)
        if overlay is not None:
            o = np.asarray(overlay) @ P
            ax.plot(o[:, 0], o[:, 1], "r--", lw=1.0, label="theory")
        ax.set_aspect("equal")
        ax.set_xlabel("PC1")
        ax.set_ylabel("PC2")
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def plot_curves(
    ax: Axes,
    t: npt.ArrayLike,
    ys: npt.ArrayLike,
    *,
    label: str | None = None,
    band: tuple[npt.ArrayLike, npt.ArrayLike] | np.ndarray | None = None,
    color: Any = None,
    logy: bool = False,
) -> Line2D:
    """Plot ``ys`` against ``t`` with an optional ``(lower, upper)`` band."""
    line = ax.plot(t, ys, label=label, color=color)[0]
    if band is not None:
        ax.fill_between(t, band[0], band[1], color=line.get_color(), alpha=0.25, lw=0)
    if logy:
        ax.set_yscale("log")
    return line


def savefig(fig: Figure, path: str | os.PathLike[str], dpi: int = 110) -> str:
    """Lay out ``fig`` (``tight_layout``), write it to ``path`` at ``dpi``, close it; return the path as a string."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return str(path)


def _movie_path(path: str | os.PathLike[str]) -> Path:
    """``path`` checked: a known suffix and a writable file (probed before any work)."""
    p = Path(path)
    if p.suffix.lower() not in MOVIE_FORMATS:
        raise ValueError(f"movie path must end in one of {MOVIE_FORMATS}, got {str(path)!r}")
    if p.suffix.lower() == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise ImportError(
                "writing an .mp4 movie needs the package imageio-ffmpeg (pip install imageio-ffmpeg); "
                "or write a .gif (Pillow)"
            ) from None
    existed = p.exists()
    try:
        with open(p, "ab"):
            pass
    except OSError as e:
        raise ValueError(
            f"movie path {str(path)!r} cannot be written ({e.strerror or type(e).__name__})"
        ) from None
    if not existed:
        p.unlink()
    return p


def animate(
    traj: Any,
    path: str | os.PathLike[str],
    *,
    fps: int = 20,
    threshold: float = 0.1,
    dpi: int = 72,
    size: tuple[float, float] = (8.0, 4.0),
) -> str:
    r"""Write a movie of a run: the configuration (left) with its energy and cluster count (right).

    One frame per saved state of ``traj`` (``mf.simulate`` or ``mf.metastability.simulate_long``
    with ``save_states=True``). ``d = 3``: a sphere view; other ``d``: the first two coordinates
    (``d = 2``: the circle). The cluster count is ``mf.metastability.clusters(x, threshold).num``,
    computed once for all frames. Artists are updated in place and the canvas is rendered to
    memory: no figure per frame. ``.mp4``: H.264 through ffmpeg from the ``imageio-ffmpeg`` wheel;
    ``.gif``: Pillow.

    Args:
        traj: a ``Trajectory`` with states, or a pair ``(ts, xs)``.
        path: output file, ``.mp4`` or ``.gif``; checked writable before any frame is drawn.
        fps: frames per second.
        threshold: angle of the cluster count (radians, in ``(0, pi)``).
        dpi, size: frame resolution (inches times dpi).

    Returns:
        the path written, as a string.

    Raises:
        ValueError: no states, an empty trajectory, a bad suffix or an unwritable path.
        ImportError: ``.mp4`` without ``imageio-ffmpeg`` (the message names the package).
    """
    import jax

    from . import metastability

    if isinstance(traj, tuple) and len(traj) == 2:
        ts, xs = traj
        energy = None
    else:
        ts, xs, energy = (
            getattr(traj, "ts", None),
            getattr(traj, "xs", None),
            getattr(traj, "energy", None),
        )
    if xs is None:
        raise ValueError("animate needs saved states: run with save_states=True")
    xs = np.asarray(xs)
    ts = np.asarray(ts, dtype=np.float64)
    if xs.ndim != 3 or xs.shape[0] == 0 or ts.shape != (xs.shape[0],):
        raise ValueError(
            f"animate needs a non-empty trajectory: states (T, n, d) and T times, got {xs.shape} and {ts.shape}"
        )
    fps = int(fps)
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")
    metastability._check_threshold(threshold)
    out = _movie_path(path)
    ok = np.all(np.isfinite(xs), axis=(1, 2))
    xs, ts = xs[ok], ts[ok]
    if xs.shape[0] == 0:
        raise ValueError("the trajectory has no finite state to draw")
    energy = None if energy is None else np.asarray(energy, dtype=np.float64)[ok]
    num = np.asarray(
        jax.vmap(lambda x: metastability._clusters(x, threshold, block_size=None).num)(xs)
    )
    n, d = xs.shape[1:]
    fig = plt.figure(figsize=size, dpi=dpi)
    if d == 3:
        ax = fig.add_subplot(1, 2, 1, projection="3d")
        sphere_axes(ax)
        sc = ax.scatter(xs[0, :, 0], xs[0, :, 1], xs[0, :, 2], s=4, c="C0", depthshade=False)
    else:
        ax = fig.add_subplot(1, 2, 1)
        th = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(th), np.sin(th), color="grey", lw=0.5)
        ax.set_xlim(-1.1, 1.1)
        ax.set_ylim(-1.1, 1.1)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        sc = ax.scatter(xs[0, :, 0], xs[0, :, 1], s=4, c="C0")
    title = ax.set_title("", fontsize=9)
    bx = fig.add_subplot(1, 2, 2)
    tpos = np.maximum(ts, ts[ts > 0].min() if np.any(ts > 0) else 1.0)
    steps = np.diff(ts)
    uniform = steps.size == 0 or bool(np.allclose(steps, steps.mean(), rtol=1e-3))
    logt = bool(not uniform and np.any(ts > 0) and tpos.max() / tpos.min() > 100)  # a log save grid
    if energy is not None and np.all(np.isfinite(energy)):
        bx.plot(tpos, energy, color="C0", lw=1.0)
        bx.set_ylabel("energy", color="C0", fontsize=8)
        ey = energy
    else:
        ey = np.zeros_like(ts)
    (mark,) = bx.plot([tpos[0]], [ey[0]], "o", color="C0", ms=4)
    cx = bx.twinx()
    cx.step(tpos, num, where="post", color="C3", lw=1.0)
    cx.set_ylabel("clusters", color="C3", fontsize=8)
    (cmark,) = cx.plot([tpos[0]], [num[0]], "s", color="C3", ms=3)
    if logt:
        bx.set_xscale("log")
    bx.set_xlabel("t", fontsize=8)
    bx.tick_params(labelsize=7)
    cx.tick_params(labelsize=7)
    fig.tight_layout()
    canvas: Any = fig.canvas  # Agg: copy_from_bbox, restore_region, buffer_rgba
    moving = (sc, mark, cmark, title)
    for a in moving:
        a.set_animated(True)
    canvas.draw()  # the static parts once (sphere, curves, axes); frames redraw only the moving artists
    background = canvas.copy_from_bbox(fig.bbox)
    w, h = canvas.get_width_height()

    def frames() -> Iterator[np.ndarray]:
        for k in range(xs.shape[0]):
            x = xs[k]
            if d == 3:
                sc._offsets3d = (x[:, 0], x[:, 1], x[:, 2])
            else:
                sc.set_offsets(x[:, :2])
            mark.set_data([tpos[k]], [ey[k]])
            cmark.set_data([tpos[k]], [num[k]])
            title.set_text(f"t = {ts[k]:.3g}, {int(num[k])} clusters")
            canvas.restore_region(background)
            for a in moving:
                ax.draw_artist(a) if a is title else cast(Axes, a.axes).draw_artist(a)
            yield np.asarray(canvas.buffer_rgba())[:, :, :3].copy()

    try:
        if out.suffix.lower() == ".gif":
            from PIL import Image

            imgs = [
                Image.fromarray(f).quantize(colors=64, method=Image.Quantize.FASTOCTREE)
                for f in frames()
            ]
            imgs[0].save(
                out,
                save_all=True,
                append_images=imgs[1:],
                duration=max(1, round(1000 / fps)),
                loop=0,
            )
        else:
            import imageio_ffmpeg

            writer = imageio_ffmpeg.write_frames(
                str(out), (w, h), fps=fps, macro_block_size=1, quality=7, ffmpeg_log_level="error"
            )
            writer.send(None)
            try:
                for f in frames():
                    writer.send(np.ascontiguousarray(f))
            finally:
                writer.close()
    finally:
        plt.close(fig)
    return str(out)
