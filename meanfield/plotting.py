r"""Matplotlib figures from results (an edge module: the core never imports it).

Views of configurations $x \in (S^{d-1})^n$ (``projection``: the circle for $d = 2$, the sphere
seen from a fixed camera for $d = 3$, a principal plane fixed over a run for $d > 3$), curves such
as the collapse gap $G_x(t)$ with bands, axis ranges from the data (``data_scale``), movies of a
run (``animate``) and saving. Nothing here selects a matplotlib backend: figures go where the
caller's backend sends them (inline in a notebook, a file with ``savefig``); movies are drawn on
their own Agg canvas, whatever the backend.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.colors import Colormap, Normalize, is_color_like, to_rgba, to_rgba_array
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from . import _params, _paths

if TYPE_CHECKING:
    from mpl_toolkits.mplot3d.axes3d import Axes3D

__all__ = [
    "Projection",
    "projection",
    "camera",
    "sphere_axes",
    "plot_configuration",
    "plot_curves",
    "data_scale",
    "decade_limits",
    "cluster_colors",
    "savefig",
    "animate",
    "MOVIE_FORMATS",
    "MOVIE_PIXELS",
    "MOVIE_FPS",
    "CLUSTER_PALETTE",
    "BACK_FADE",
]

#: Movie formats of ``animate``: ``.mp4`` (ffmpeg from the ``imageio-ffmpeg`` wheel) and ``.gif`` (Pillow).
MOVIE_FORMATS = (".mp4", ".gif")

#: Sides of a movie frame in pixels (``size`` times ``dpi``): at least 16 (room for the panels),
#: at most 4096 (a GIF keeps every frame in memory).
MOVIE_PIXELS = (16, 4096)

#: Frames per second of ``animate``: an integer in this range.
MOVIE_FPS = (1, 1000)

#: Token colours of ``cluster_colors``: matplotlib's tab10 without its grey (grey is for guides).
CLUSTER_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)

#: How far a token on the far hemisphere of a sphere view is blended toward white.
BACK_FADE = 0.55

_GUIDE = "0.6"  # the circle / sphere guides: grey, never a token colour


# --------------------------------------------------------------------------- projections


def camera(elev: float = 20.0, azim: float = 35.0) -> np.ndarray:
    r"""Orthonormal frame ``(e1, e2, v)`` (rows, ``(3, 3)``) of an orthographic camera.

    $v = (\cos\epsilon \cos\alpha, \cos\epsilon \sin\alpha, \sin\epsilon)$ points from the origin
    to the viewer (elevation $\epsilon$, azimuth $\alpha$ in degrees, matplotlib's ``view_init``
    convention); $e_1 = (-\sin\alpha, \cos\alpha, 0)$ is screen right and $e_2 = v \times e_1$
    screen up, so $e_1 \times e_2 = v$. A point $x$ is drawn at $(\langle x, e_1\rangle,
    \langle x, e_2\rangle)$ with depth $\langle x, v\rangle$ (positive: the near hemisphere).
    """
    e, a = np.deg2rad(elev), np.deg2rad(azim)
    v = np.array([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)])
    e1 = np.array([-np.sin(a), np.cos(a), 0.0])
    e2 = np.cross(v, e1)
    return np.stack([e1, e2, v])


@dataclass(frozen=True, eq=False)
class Projection:
    r"""A fixed linear map of tokens $x \in \mathbb{R}^d$ to the plane of a picture.

    Screen coordinates $p = x B$ (``basis`` $B$: ``(d, 2)``, orthonormal columns) and, for the
    sphere view, a depth $\langle x, v\rangle$ (``depth``: ``(d,)``; near hemisphere positive).
    Built by ``projection``; ``kind`` is ``"circle"`` ($d = 2$), ``"sphere"`` ($d = 3$, fixed
    camera), ``"pca"`` ($d > 3$, principal plane), ``"plane"`` (tokens not on the unit sphere:
    the same maps with limits from the data) or ``"line"`` ($d = 1$).
    """

    kind: str
    basis: np.ndarray
    depth: np.ndarray | None
    limits: tuple[tuple[float, float], tuple[float, float]]
    on_sphere: bool
    description: str

    def screen(self, x: npt.ArrayLike) -> np.ndarray:
        """Screen coordinates ``(..., 2)`` of tokens ``x`` ``(..., d)``."""
        return np.asarray(x, dtype=np.float64) @ self.basis

    def depth_of(self, x: npt.ArrayLike) -> np.ndarray | None:
        """Depth ``(...)`` of tokens ``x`` ``(..., d)`` toward the camera, or None (flat views)."""
        return None if self.depth is None else np.asarray(x, dtype=np.float64) @ self.depth

    def draw_guides(self, ax: Axes) -> None:
        """The unit circle (the sphere's outline, or the disc the sphere projects into), for the
        sphere view its equator and two meridians (near halves solid, far halves dotted);
        limits, equal aspect, and ticks only where coordinates are not on the sphere."""
        if self.on_sphere:
            th = np.linspace(0.0, 2.0 * np.pi, 241)
            ax.plot(np.cos(th), np.sin(th), color=_GUIDE, lw=0.9, zorder=0.5)
            if self.kind == "sphere":
                c, s = np.cos(th), np.sin(th)
                z = np.zeros_like(th)
                for circle in (
                    np.stack([c, s, z], 1),  # equator
                    np.stack([c, z, s], 1),  # meridian in the x-z plane
                    np.stack([z, c, s], 1),  # meridian in the y-z plane
                ):
                    p, dep = self.screen(circle), self.depth_of(circle)
                    assert dep is not None
                    near = np.where(dep >= 0, 1.0, np.nan)
                    far = np.where(dep <= 0, 1.0, np.nan)
                    ax.plot(p[:, 0] * near, p[:, 1] * near, color=_GUIDE, lw=0.5, zorder=0.5)
                    ax.plot(p[:, 0] * far, p[:, 1] * far, color=_GUIDE, lw=0.5, ls=":", zorder=0.5)
                top = self.screen(np.array([0.0, 0.0, 1.0]))
                ax.plot([top[0]], [top[1]], "+", color=_GUIDE, ms=5, zorder=0.5)  # north pole
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_xlabel(self.description, fontsize=7)
        else:
            if self.kind == "pca":
                names = ("PC1", "PC2")
            elif self.basis.shape[0] == 3:  # the camera's screen axes
                names = ("$\\langle x, e_1 \\rangle$", "$\\langle x, e_2 \\rangle$")
            else:
                names = ("$x_1$", "$x_2$")
            ax.set_xlabel(names[0], fontsize=8)
            ax.set_ylabel(names[1], fontsize=8)
            ax.tick_params(labelsize=7)
        ax.set_xlim(*self.limits[0])
        ax.set_ylim(*self.limits[1])
        ax.set_aspect("equal", adjustable="box")


def projection(xs: npt.ArrayLike, *, elev: float = 20.0, azim: float = 35.0) -> Projection:
    r"""The view of tokens ``xs`` (``(..., n, d)``: one state or all states of a run), fixed once.

    * $d = 2$: the plane itself, tokens at their angle on the unit circle;
    * $d = 3$: the sphere seen from an orthographic camera at elevation ``elev`` and azimuth
      ``azim`` (degrees, ``camera``): screen $(\langle x, e_1\rangle, \langle x, e_2\rangle)$,
      depth $\langle x, v\rangle$; every state is projected with the same camera;
    * $d > 3$: the plane of the two leading principal directions of all the given tokens (centred
      PCA of every finite token of every state, fitted once; each principal direction's largest
      component made positive), tokens drawn at their orthogonal projection $x B$, which lies in
      the unit disc (drawn). Fitted on a whole run, the plane does not move between frames;
      fitted on one state (``plot_configuration`` without ``projection``) it is that state's.

    Tokens not on the unit sphere (|x| off 1 by more than 1e-3: a Euclidean model): the same maps,
    with equal limits from the data instead of the unit disc.

    Example:
        >>> import jax, meanfield as mf
        >>> xs = mf.sphere.uniform(jax.random.key(0), 8, 5)[None]  # (T, n, d): one state
        >>> view = mf.plotting.projection(xs)
        >>> view.kind, view.basis.shape, view.screen(xs).shape
        ('pca', (5, 2), (1, 8, 2))
    """
    xs = np.asarray(xs, dtype=np.float64)
    if xs.ndim < 2:
        raise ValueError(f"projection needs tokens (..., n, d), got shape {xs.shape}")
    d = xs.shape[-1]
    pts = xs.reshape(-1, d)
    pts = pts[np.all(np.isfinite(pts), axis=1)]
    norms = np.linalg.norm(pts, axis=1)
    on_sphere = bool(pts.shape[0] > 0 and np.all(np.abs(norms - 1.0) <= 1e-3))
    depth = None
    if d == 1:
        kind, basis = "line", np.array([[1.0, 0.0]])
        description = "$S^0$ on a line"
    elif d == 2:
        kind, basis = "circle", np.eye(2)
        description = "$S^1$"
    elif d == 3:
        frame = camera(elev, azim)
        kind, basis, depth = "sphere", frame[:2].T.copy(), frame[2].copy()
        description = f"$S^2$, camera elev {elev:g}°, azim {azim:g}° (far side pale)"
    else:
        kind = "pca"
        if pts.shape[0] >= 2:
            centred = pts - pts.mean(0)
            w, v = np.linalg.eigh(centred.T @ centred)
            basis = v[:, np.argsort(w)[::-1][:2]]
            flip = np.sign(basis[np.argmax(np.abs(basis), axis=0), [0, 1]])
            basis = basis * np.where(flip == 0, 1.0, flip)
        else:
            basis = np.eye(d)[:, :2]
        description = f"$S^{{{d - 1}}}$ on its principal plane (fixed)"
    if on_sphere:
        limits = ((-1.1, 1.1), (-1.1, 1.1))
    else:
        p = pts @ basis if pts.size else np.zeros((1, 2))
        lo, hi = p.min(0), p.max(0)
        centre = (lo + hi) / 2
        half = 0.55 * float(np.max(hi - lo))
        if not half > 0:
            half = max(0.1 * float(np.max(np.abs(centre))), 1.0)
        limits = (
            (float(centre[0] - half), float(centre[0] + half)),
            (float(centre[1] - half), float(centre[1] + half)),
        )
        kind = "plane" if kind in ("circle", "sphere") else kind
        depth = None  # near and far halves belong to the sphere: off it, no fading
        if d == 3:
            description = f"$\\mathbb{{R}}^3$, camera elev {elev:g}°, azim {azim:g}°"
        elif d > 3:
            description = f"$\\mathbb{{R}}^{{{d}}}$ on its principal plane (fixed)"
        else:
            description = f"$\\mathbb{{R}}^{{{d}}}$"
    return Projection(kind, basis, depth, limits, on_sphere, description)


_fit = projection  # for plot_configuration, whose argument of that name hides the function


def _fade(rgba: np.ndarray, back: np.ndarray) -> np.ndarray:
    """``rgba`` (n, 4) with the rows ``back`` blended toward white by ``BACK_FADE``."""
    out = rgba.copy()
    out[back, :3] = out[back, :3] + BACK_FADE * (1.0 - out[back, :3])
    return out


def cluster_colors(labels: npt.ArrayLike) -> np.ndarray:
    """RGBA ``(n, 4)``: one ``CLUSTER_PALETTE`` colour per cluster label, largest cluster first
    (colours repeat after nine clusters)."""
    labels = np.asarray(labels)
    uniq, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    order = np.lexsort((uniq, -counts))  # by size, then by label: deterministic
    rank = np.empty(len(uniq), dtype=int)
    rank[order] = np.arange(len(uniq))
    palette = to_rgba_array(CLUSTER_PALETTE)
    return palette[rank[inverse.ravel()] % len(palette)]


def _token_rgba(color: Any, n: int, cmap: str | Colormap = "viridis") -> np.ndarray:
    """Per-token RGBA ``(n, 4)`` from None (one colour), a colour, RGBA rows, or values (a colormap)."""
    if color is None:
        return np.tile(to_rgba("C0"), (n, 1))
    if isinstance(color, str) or (is_color_like(color) and np.shape(color) != (n,)):
        return np.tile(to_rgba(color), (n, 1))  # one colour (a name, or an RGB(A) tuple)
    c = np.asarray(color)
    if c.ndim == 2 and c.shape in ((n, 3), (n, 4)):
        return to_rgba_array(c)
    c = np.asarray(c, dtype=np.float64).reshape(n)
    finite = c[np.isfinite(c)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    from matplotlib import colormaps

    cm = colormaps[cmap] if isinstance(cmap, str) else cmap
    return cm(Normalize(lo, hi)(c))


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
    color: npt.ArrayLike | str | None = None,
    overlay: npt.ArrayLike | None = None,
    title: str | None = None,
    cmap: str | Colormap = "viridis",
    projection: Projection | None = None,
    size: float | None = None,
) -> Axes:
    r"""Scatter a configuration ``x`` ``(n, d)`` on ``ax``.

    On a 2D axis, through ``projection`` (default: ``projection(x)``, fitted on ``x``): $d = 2$
    on the unit circle, $d = 3$ on the sphere from a fixed camera (far-side tokens pale, drawn
    first), $d > 3$ on a principal plane inside the unit disc. Pass the ``projection`` of a whole
    run to draw its states in one frame. On a 3D axis with $d = 3$: a wireframe sphere view.

    Args:
        ax: the axis.
        x: ``(n, d)`` tokens.
        color: per-token values (a ``cmap`` scale, e.g. positions $s_i$), RGBA rows, one colour,
            or None (values ``i / n``).
        overlay: ``(m, d)`` points of the theory's orbit: stars (``m <= 8``) or a dashed line.
        title: axis title.
        cmap: colormap of values.
        projection: a fixed view (``projection``).
        size: marker area in points^2 (default from ``n``).

    Returns:
        ``ax``.
    """
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    c: Any = np.arange(n) / n if color is None else color
    rgba = _token_rgba(c, n, cmap)
    s = _marker_area(n) if size is None else float(size)
    o = None if overlay is None else np.asarray(overlay, dtype=np.float64)
    style: dict[str, Any] = (
        dict(ls="none", marker="*", ms=12, mfc="none")
        if o is not None and len(o) <= 8
        else dict(ls="--", lw=1.0)
    )
    if d == 3 and getattr(ax, "name", "") == "3d":
        ax3: Any = ax  # a 3D axis (its name says so)
        sphere_axes(ax3)
        s3 = 6.0 if size is None else s  # the markers of the published 3D figures
        ax3.scatter(x[:, 0], x[:, 1], x[:, 2], c=rgba, s=s3, depthshade=False)
        if o is not None:
            ax3.plot(o[:, 0], o[:, 1], o[:, 2], color="r", label="theory", **style)
    else:
        view = projection if projection is not None else _fit(x)
        view.draw_guides(ax)
        p = view.screen(x)
        depth = view.depth_of(x)
        order = np.arange(n) if depth is None else np.argsort(depth, kind="stable")
        shown = rgba if depth is None else _fade(rgba, depth < 0)
        ax.scatter(p[order, 0], p[order, 1], c=shown[order], s=s, linewidths=0, zorder=2)
        if o is not None:
            q = view.screen(o)
            ax.plot(q[:, 0], q[:, 1], color="r", label="theory", zorder=3, **style)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def _marker_area(n: int) -> float:
    """Marker area (points^2) that keeps ``n`` tokens legible: large for few, small for many."""
    return float(np.clip(1600.0 / max(n, 1), 3.0, 36.0))


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


def decade_limits(ax: Axes) -> None:
    r"""Widen each log axis of ``ax`` whose limits span less than a decade to one decade, about the
    geometric centre of its limits (a power law fitted over a factor 4 of $n$ still reads as a slope
    on log-log axes, with tick labels to read it by). Linear axes and wider log axes: unchanged.

    Example:
        >>> from matplotlib.figure import Figure
        >>> import meanfield as mf
        >>> ax = Figure().subplots()
        >>> _ = ax.loglog([30.0, 60.0, 120.0], [0.3, 0.2, 0.1])
        >>> ax.set_xlim(30.0, 120.0)
        (30.0, 120.0)
        >>> mf.plotting.decade_limits(ax)
        >>> lo, hi = ax.get_xlim()
        >>> round(float(hi / lo), 6), round(float((lo * hi) ** 0.5), 6)
        (10.0, 60.0)
    """
    for get, set_, scale in (
        (ax.get_xlim, ax.set_xlim, ax.get_xscale),
        (ax.get_ylim, ax.set_ylim, ax.get_yscale),
    ):
        if scale() != "log":
            continue
        lo, hi = sorted(get())
        if lo > 0 and hi / lo < 10.0:
            mid = (lo * hi) ** 0.5
            set_(mid / 10.0**0.5, mid * 10.0**0.5)


def data_scale(
    ax: Axes,
    values: npt.ArrayLike,
    *,
    axis: Literal["x", "y"] = "y",
    log: bool | None = None,
    pad: float = 0.05,
) -> str:
    r"""Scale and limits of one axis of ``ax`` from the finite ``values`` it shows; returns the scale.

    Log only over at least a decade of positive values: ``log=True`` asks for it (a linear axis
    when the values span less than a factor 10), ``log=None`` chooses it when they span two
    decades, ``log=False`` never. Limits: the values' range padded by ``pad`` of it (a factor
    $10^{\text{pad}}$ per side on a log axis); a constant gets $\pm 5\%$ of its size (or
    $\pm 0.05$ at zero), so an axis never collapses to a point. No finite value: unchanged.

    Example:
        >>> from matplotlib.figure import Figure
        >>> import meanfield as mf
        >>> ax = Figure().subplots()
        >>> mf.plotting.data_scale(ax, [0.93, 0.97, 1.0], log=True)  # under a decade: linear
        'linear'
        >>> mf.plotting.data_scale(ax, [1e-6, 1.0], log=True)
        'log'
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    set_scale = ax.set_xscale if axis == "x" else ax.set_yscale
    set_lim = ax.set_xlim if axis == "x" else ax.set_ylim
    if v.size == 0:
        return ax.get_xscale() if axis == "x" else ax.get_yscale()
    lo, hi = float(v.min()), float(v.max())
    decades = np.log10(hi / lo) if lo > 0 else 0.0
    use_log = log is not False and lo > 0 and decades >= (1.0 if log else 2.0)
    if use_log:
        set_scale("log")
        f = 10.0 ** (pad * decades)
        set_lim(lo / f, hi * f)
        return "log"
    set_scale("linear")
    span = hi - lo
    if span <= 1e-12 * max(abs(lo), abs(hi), 1e-300):
        half = 0.05 * abs(lo) if lo != 0 else 0.05
        set_lim(lo - half, hi + half)
    else:
        set_lim(lo - pad * span, hi + pad * span)
    return "linear"


def savefig(fig: Figure, path: str | os.PathLike[str], dpi: int = 110) -> str:
    """Lay out ``fig`` (``tight_layout``), write it to ``path`` at ``dpi``, close it; return the path as a string.

    ``path`` must be a regular file or a new one (``ValueError`` for a FIFO, socket, device or
    directory, checked without opening it: ``meanfield._paths.check_output``). The figure is
    rendered by the canvas of its format (PNG: Agg), whatever the matplotlib backend."""
    if isinstance(path, (str, os.PathLike)):
        target = os.fspath(path)
        if not os.path.splitext(target)[1]:  # matplotlib adds the default format's suffix
            from matplotlib import rcParams

            target = target.rstrip(".") + "." + str(rcParams["savefig.format"])
        _paths.check_output(target, "figure path")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    if "matplotlib.pyplot" in sys.modules:  # a pyplot figure: release it (others: nothing to do)
        import matplotlib.pyplot as plt

        plt.close(fig)
    return str(path)


# --------------------------------------------------------------------------- movies


def _movie_path(path: object) -> Path:
    """``path`` checked: a known suffix and a writable regular or new file (probed before any
    work, without opening a FIFO or device: ``meanfield._paths.output_problem``)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"movie path must be a file name (str or os.PathLike) ending in .mp4 or .gif, got {path!r:.80}"
        )
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
    why = _paths.output_problem(p)
    if why is not None:
        raise ValueError(f"movie path {str(path)!r} cannot be written ({why})")
    return p


def _movie_data(traj: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(ts, xs, energy, gap)`` of a trajectory or a pair ``(ts, xs)``, checked."""
    if isinstance(traj, tuple) and len(traj) == 2:
        ts, xs = traj
        energy = gap = None
    elif hasattr(traj, "xs") and hasattr(traj, "ts"):
        ts, xs = traj.ts, traj.xs
        energy, gap = getattr(traj, "energy", None), getattr(traj, "collapse_gap", None)
    else:
        raise TypeError(
            "traj must be a Trajectory (mf.simulate, mf.metastability.simulate_long) or a pair "
            f"(ts, xs), got {type(traj).__name__}"
        )
    if xs is None:
        raise ValueError("traj has no saved states (animate needs them): run with save_states=True")
    try:
        xs = np.asarray(xs)
        ts = np.asarray(ts, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            "traj must hold real arrays: times ts (T,) and states xs (T, n, d)"
        ) from None
    if xs.dtype.kind not in "iuf":
        raise TypeError(f"traj's states must be real numbers (T, n, d), got dtype {xs.dtype}")
    if xs.ndim != 3 or xs.shape[0] == 0 or ts.shape != (xs.shape[0],):
        raise ValueError(
            "traj must be a non-empty trajectory: states (T, n, d) and T times, got "
            f"{xs.shape} and {ts.shape}"
        )
    return (
        ts,
        xs,
        None if energy is None else np.asarray(energy, dtype=np.float64),
        None if gap is None else np.asarray(gap, dtype=np.float64),
    )


class _Movie:
    """The frames of ``animate`` on a figure of its own (an Agg canvas, no pyplot).

    Static parts (guides, curves, axes) are rendered once; each frame restores them and draws the
    tokens, trails, time cursor and title at that frame's projected positions (2D artists whose
    data is set before drawing: nothing waits on a 3D projection). ``ax`` is the configuration
    axis, in the screen coordinates of ``view``.
    """

    def __init__(
        self,
        ts: np.ndarray,
        xs: np.ndarray,
        *,
        energy: np.ndarray | None,
        gap: np.ndarray,
        num: np.ndarray,
        rgba: np.ndarray,
        view: Projection,
        size: tuple[float | int, float | int],
        dpi: float,
        trail: int,
        marker_size: float | None,
    ) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import LineCollection
        from matplotlib.ticker import MaxNLocator

        self.ts, self.xs, self.num, self.view, self.trail = ts, xs, num, view, int(trail)
        n = xs.shape[1]
        self.rgba = rgba
        self.fig = Figure(figsize=size, dpi=dpi)
        self.canvas = FigureCanvasAgg(self.fig)
        gs = self.fig.add_gridspec(1, 2, width_ratios=(1.0, 1.1))
        ax = self.ax = self.fig.add_subplot(gs[0])
        view.draw_guides(ax)
        self.trails = LineCollection([], linewidths=1.2, zorder=1.5)
        ax.add_collection(self.trails)
        self.points = ax.scatter(
            [],
            [],
            s=_marker_area(n) if marker_size is None else marker_size,
            linewidths=0,
            zorder=2,
        )
        # a text at a fixed place (an axis title moves with the artists when laid out)
        self.title = ax.text(
            0.5, 1.02, " ", transform=ax.transAxes, ha="center", va="bottom", fontsize=9
        )

        bx = self.bx = self.fig.add_subplot(gs[1])
        tpos = np.maximum(ts, ts[ts > 0].min() if np.any(ts > 0) else 1.0)
        steps = np.diff(ts)
        uniform = steps.size == 0 or bool(np.allclose(steps, steps.mean(), rtol=1e-3))
        logt = bool(not uniform and np.any(ts > 0) and tpos.max() / tpos.min() > 100)
        self.tpos = tpos if logt else ts
        if energy is not None and np.any(np.isfinite(energy)):
            curve, name = energy, "energy $E$"
            data_scale(bx, energy, log=False)
        else:
            curve, name = gap, "collapse gap $G_x$"
            data_scale(bx, gap, log=True)
        self.curve = curve
        bx.plot(self.tpos, curve, color="C0", lw=1.2)
        bx.set_ylabel(name, color="C0", fontsize=8)
        if np.any(np.isfinite(num)):  # (no angular clusters off the sphere: no axis)
            cx = bx.twinx()
            cx.step(self.tpos, num, where="post", color="C3", lw=1.0)
            cx.set_ylabel("clusters", color="C3", fontsize=8)
            cx.set_ylim(0, max(float(np.nanmax(num)), 1.0) * 1.08 + 0.5)
            cx.yaxis.set_major_locator(MaxNLocator(integer=True))
            cx.tick_params(labelsize=7)
            (self.cmark,) = cx.plot([self.tpos[0]], [num[0]], "s", color="C3", ms=3)
        else:
            (self.cmark,) = bx.plot([], [])  # nothing to mark
        if logt:
            bx.set_xscale("log")
        if self.tpos.size > 1 and self.tpos[-1] > self.tpos[0]:
            bx.set_xlim(self.tpos[0], self.tpos[-1])
        else:
            data_scale(bx, self.tpos, axis="x", log=False)
        bx.set_xlabel("t", fontsize=8)
        bx.tick_params(labelsize=7)
        self.cursor = bx.axvline(self.tpos[0], color="0.4", lw=0.8)
        (self.mark,) = bx.plot([self.tpos[0]], [curve[0]], "o", color="C0", ms=4)
        self.title.set_text(self._title(len(ts) - 1))  # the widest title lays out the figure
        self.fig.tight_layout()
        self.moving = (self.trails, self.points, self.cursor, self.mark, self.cmark, self.title)
        for a in self.moving:
            a.set_visible(False)
        self.canvas.draw()  # the static parts once
        self.background = self.canvas.copy_from_bbox(self.fig.bbox)
        for a in self.moving:
            a.set_visible(True)
        self.width, self.height = self.canvas.get_width_height()

    def _title(self, k: int) -> str:
        if not np.isfinite(self.num[k]):
            return f"t = {self.ts[k]:.3g}"
        c = int(self.num[k])
        return f"t = {self.ts[k]:.3g}, {c} cluster{'' if c == 1 else 's'}"

    def frame(self, k: int) -> np.ndarray:
        """The RGB image ``(h, w, 3)`` of state ``k``."""
        x = self.xs[k]
        p = self.view.screen(x)
        depth = self.view.depth_of(x)
        order = np.arange(len(x)) if depth is None else np.argsort(depth, kind="stable")
        rgba = self.rgba if depth is None else _fade(self.rgba, depth < 0)
        self.points.set_offsets(p[order])
        self.points.set_facecolor(cast(Any, rgba[order]))  # RGBA rows (the stubs want tuples)
        if self.trail > 0 and k > 0:
            past = self.view.screen(self.xs[max(0, k - self.trail) : k + 1])  # (k', n, 2)
            self.trails.set_segments(list(np.swapaxes(past, 0, 1)))
            faint = self.rgba.copy()
            faint[:, 3] = 0.5
            self.trails.set_color(cast(Any, faint))
        else:
            self.trails.set_segments([])
        self.cursor.set_xdata([self.tpos[k], self.tpos[k]])
        self.mark.set_data([self.tpos[k]], [self.curve[k]])
        if np.isfinite(self.num[k]):
            self.cmark.set_data([self.tpos[k]], [self.num[k]])
        self.title.set_text(self._title(k))
        self.canvas.restore_region(self.background)
        for a in self.moving:
            self.fig.draw_artist(a)
        return np.asarray(self.canvas.buffer_rgba())[:, :, :3].copy()

    def frames(self) -> Iterator[np.ndarray]:
        for k in range(self.xs.shape[0]):
            yield self.frame(k)


def _check_movie_options(
    n: int,
    *,
    fps: Any = MOVIE_FPS[0],
    dpi: Any,
    size: Any,
    color: Any,
    trail: Any,
    elev: Any,
    azim: Any,
    marker_size: Any,
) -> dict[str, Any]:
    """The options of ``animate`` for ``n`` tokens, checked (``TypeError``/``ValueError`` naming
    the argument and what it accepts) and normalised: ``fps``, ``trail`` Python ints, ``dpi``,
    ``elev``, ``azim``, ``marker_size`` floats, ``size`` a pair of floats."""
    fps = _params.check_int("fps", fps, minimum=MOVIE_FPS[0], maximum=MOVIE_FPS[1])
    trail = _params.check_int("trail", trail, minimum=0)
    dpi = _params.check_float("dpi", dpi, "float>0")
    if isinstance(size, (str, bytes)) or not hasattr(size, "__len__") or len(size) != 2:
        raise TypeError(f"size must be a pair (width, height) in inches, got {size!r:.80}")
    size = tuple(_params.check_float(f"size[{i}]", v, "float>0") for i, v in enumerate(size))
    lo, hi = MOVIE_PIXELS
    for i, side in enumerate(("width", "height")):
        px = size[i] * dpi
        if not lo <= px <= hi:
            raise ValueError(
                f"size[{i}] x dpi (the frame's {side}) must be {lo} to {hi} pixels, got "
                f"{size[i]:g} x {dpi:g} = {px:g}"
            )
    elev = _params.check_float("elev", elev)
    azim = _params.check_float("azim", azim)
    if marker_size is not None:
        marker_size = _params.check_float("marker_size", marker_size, "float>0")
    accepted = f"'cluster', None, a matplotlib colour, n = {n} per-token values or {n} RGB(A) rows"
    if isinstance(color, str):
        if color != "cluster" and not is_color_like(color):
            raise ValueError(f"color must be {accepted}, got {color!r:.80}")
    elif color is not None and not (is_color_like(color) and np.shape(color) != (n,)):
        try:
            c = np.asarray(color)
        except (TypeError, ValueError):
            raise TypeError(f"color must be {accepted}, got {color!r:.80}") from None
        if c.dtype.kind not in "iuf" or c.shape not in ((n,), (n, 3), (n, 4)):
            raise ValueError(
                f"color must be {accepted}, got an array of shape {c.shape} and dtype {c.dtype}"
            )
        if c.ndim == 2 and not (np.all(np.isfinite(c)) and c.min() >= 0 and c.max() <= 1):
            raise ValueError(
                f"color's RGB(A) rows must be in [0, 1], got values in [{c.min()}, {c.max()}]"
            )
    return dict(
        fps=fps, dpi=dpi, size=size, trail=trail, elev=elev, azim=azim, marker_size=marker_size
    )


def _build_movie(
    traj: Any,
    *,
    threshold: object = 0.1,
    dpi: object = 72,
    size: object = (8.0, 4.0),
    color: Any = "cluster",
    trail: object = 0,
    elev: object = 20.0,
    azim: object = 35.0,
    marker_size: object = None,
) -> _Movie:
    """The movie of ``animate`` before encoding (checked input; non-finite states left out)."""
    import jax

    from . import metastability

    ts, xs, energy, gap = _movie_data(traj)
    metastability._check_threshold(threshold)
    checked = _check_movie_options(
        xs.shape[1],
        dpi=dpi,
        size=size,
        color=color,
        trail=trail,
        elev=elev,
        azim=azim,
        marker_size=marker_size,
    )
    angle = cast(float, threshold)  # checked above
    ok = np.all(np.isfinite(xs), axis=(1, 2))
    xs, ts = xs[ok], ts[ok]
    if xs.shape[0] == 0:
        raise ValueError("traj has no finite state to draw")
    if not np.all(np.isfinite(ts)):
        raise ValueError("traj's times must be finite where its states are")
    energy = None if energy is None else energy[ok]
    # a pair (ts, xs): G_x = sum_i |x_i - xbar|^2 / (n - 1), as mf.metrics.collapse_gap
    if gap is None:
        xd = xs.astype(np.float64)
        gap = np.sum((xd - xd.mean(1, keepdims=True)) ** 2, axis=(1, 2)) / max(xs.shape[1] - 1, 1)
    else:
        gap = gap[ok]
    n = xs.shape[1]
    unit = _on_sphere(xs)
    if unit:
        num = np.asarray(
            jax.vmap(lambda x: metastability._clusters(x, angle, block_size=None).num)(xs)
        )
    else:  # clusters are angular: none for tokens off the sphere
        num = np.full(xs.shape[0], np.nan)
    if isinstance(color, str) and color == "cluster":
        if unit:
            labels = np.asarray(metastability._clusters(xs[-1], angle, block_size=None).labels)
            rgba = cluster_colors(labels)
        else:
            rgba = _token_rgba(None, n)
    else:
        rgba = _token_rgba(color, n)
    view = projection(xs, elev=checked["elev"], azim=checked["azim"])
    return _Movie(
        ts,
        xs,
        energy=energy,
        gap=gap,
        num=num,
        rgba=rgba,
        view=view,
        size=checked["size"],
        dpi=checked["dpi"],
        trail=checked["trail"],
        marker_size=checked["marker_size"],
    )


def _on_sphere(xs: np.ndarray) -> bool:
    return bool(np.all(np.abs(np.linalg.norm(xs.astype(np.float64), axis=-1) - 1.0) <= 1e-3))


def animate(
    traj: Any,
    path: object,
    *,
    fps: object = 20,
    threshold: object = 0.1,
    dpi: object = 72,
    size: object = (8.0, 4.0),
    color: Any = "cluster",
    trail: object = 0,
    elev: object = 20.0,
    azim: object = 35.0,
    marker_size: object = None,
) -> str:
    r"""Write a movie of a run: the tokens (left) and the run's curve with its cluster count (right).

    One frame per saved state of ``traj`` (``mf.simulate`` or ``mf.metastability.simulate_long``
    with ``save_states=True``), every state drawn through one view fixed for the whole run
    (``projection(xs)``): $d = 2$, the tokens at their angle on the unit circle; $d = 3$, the
    sphere seen from an orthographic camera at ``elev``, ``azim`` (degrees; tokens on the far
    hemisphere pale and drawn first), every frame projected anew; $d > 3$, the orthogonal
    projection on the plane of the two leading principal directions of all the run's tokens
    (centred PCA fitted once on every frame, so the camera never moves; the tokens lie inside
    the unit disc). Tokens off the unit sphere (a Euclidean model): the same maps with limits
    from the data.

    Right panel: the energy $E(t)$ where the run has one, otherwise the collapse gap $G_x(t)$
    (a log axis when it spans a decade); the cluster count
    ``mf.metastability.clusters(x, threshold).num`` on the right axis; a cursor at the frame's time.

    The figure is drawn on its own Agg canvas (no pyplot, whatever ``MPLBACKEND`` says): static
    parts once, the tokens of each frame over them. ``.mp4``: H.264 through ffmpeg from the
    ``imageio-ffmpeg`` wheel; ``.gif``: Pillow.

    An ``.mp4`` frame of odd width or height (H.264 needs even sides) is padded with one white
    row or column; a GIF keeps the canvas's size.

    Args:
        traj: a ``Trajectory`` with states, or a pair ``(ts, xs)``.
        path: output file (``str`` or ``os.PathLike``), ``.mp4`` or ``.gif``: a regular file or a
            new one, checked writable before any frame is drawn (a FIFO, device or directory is
            refused without being opened).
        fps: frames per second, an integer in ``MOVIE_FPS`` (1 to 1000).
        threshold: angle of the cluster count (radians, in ``(0, pi)``).
        dpi, size: frame resolution: ``size = (width, height)`` in inches (positive) times
            ``dpi`` (positive), each side ``MOVIE_PIXELS`` (16 to 4096) pixels.
        color: ``"cluster"`` (default: each token in the colour of the cluster it ends in, the
            clusters of the last frame at ``threshold``, fixed over the run, largest first in
            ``CLUSTER_PALETTE``), None (one colour), a matplotlib colour (a name or an RGB(A)
            tuple), ``n`` per-token values (viridis) or ``n`` RGB(A) rows in ``[0, 1]``.
        trail: draw each token's path over its last ``trail`` saved positions (an integer
            ``>= 0``; 0: none).
        elev, azim: the camera of $d = 3$ (degrees, finite).
        marker_size: token marker area in points^2 (positive; default from ``n``).

    Returns:
        the path written, as a string.

    Raises:
        TypeError, ValueError: a bad argument, named in the message with what it accepts (no
            states, an empty trajectory, a bad suffix, an unwritable path, a non-integer ``fps``,
            a frame too small or too large, an unknown colour, ...); nothing is written.
        ImportError: ``.mp4`` without ``imageio-ffmpeg`` (the message names the package).

    Example:
        >>> import jax, meanfield as mf  # doctest: +SKIP
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 64, 3)  # doctest: +SKIP
        >>> traj = mf.simulate(mf.kernels.USA(4.0), x0, t1=30.0, dt=0.1)  # doctest: +SKIP
        >>> mf.plotting.animate(traj, "usa.gif", trail=5)  # doctest: +SKIP
        'usa.gif'
    """
    _, xs, _, _ = _movie_data(traj)  # the input first, then the path, then any work
    from . import metastability

    metastability._check_threshold(threshold)
    rate = _check_movie_options(
        xs.shape[1],
        fps=fps,
        dpi=dpi,
        size=size,
        color=color,
        trail=trail,
        elev=elev,
        azim=azim,
        marker_size=marker_size,
    )["fps"]
    out = _movie_path(path)
    movie = _build_movie(
        traj,
        threshold=threshold,
        dpi=dpi,
        size=size,
        color=color,
        trail=trail,
        elev=elev,
        azim=azim,
        marker_size=marker_size,
    )
    w, h = movie.width, movie.height
    if out.suffix.lower() == ".gif":
        from PIL import Image

        imgs = [
            Image.fromarray(f).quantize(colors=64, method=Image.Quantize.FASTOCTREE)
            for f in movie.frames()
        ]
        imgs[0].save(
            out,
            save_all=True,
            append_images=imgs[1:],
            duration=max(1, round(1000 / rate)),
            loop=0,
        )
    else:
        import imageio_ffmpeg

        we, he = w + w % 2, h + h % 2  # H.264 in yuv420p needs even sides: pad with white
        writer = imageio_ffmpeg.write_frames(
            str(out), (we, he), fps=rate, macro_block_size=1, quality=7, ffmpeg_log_level="error"
        )
        writer.send(None)
        try:
            for f in movie.frames():
                if (we, he) != (w, h):
                    f = np.pad(f, ((0, he - h), (0, we - w), (0, 0)), constant_values=255)
                writer.send(np.ascontiguousarray(f))
        finally:
            writer.close()
    return str(out)
