r"""Matplotlib figures from results (an edge module: the core never imports it).

Sphere views of configurations $x \in (S^{d-1})^n$, curves such as the collapse gap $G_x(t)$
with bands, and saving. Nothing here selects a matplotlib backend: figures go where the
caller's backend sends them (inline in a notebook, a file with ``savefig``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

__all__ = ["sphere_axes", "plot_configuration", "plot_curves", "savefig"]


def sphere_axes(ax, *, elev: float = 20.0, azim: float = 35.0, alpha: float = 0.08):
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


def plot_configuration(ax, x, *, color=None, overlay=None, title: str | None = None, cmap="viridis"):
    """Scatter a configuration ``x`` (n, d) on ``ax``.

    ``d = 3``: on a sphere view (``ax`` must be 3D). Otherwise the first two
    principal directions of ``x`` (a projection). ``color``: per-point values
    (e.g. positions $s_i$). ``overlay``: (m, d) points of the theory's orbit,
    drawn as a dashed line.
    """
    x = np.asarray(x)
    c = np.arange(len(x)) / len(x) if color is None else np.asarray(color)
    if x.shape[1] == 3 and getattr(ax, "name", "") == "3d":
        sphere_axes(ax)
        ax.scatter(x[:, 0], x[:, 1], x[:, 2], c=c, cmap=cmap, s=6, depthshade=False)
        if overlay is not None:
            o = np.asarray(overlay)
            style = dict(ls="none", marker="*", ms=12, mfc="none") if len(o) <= 8 else dict(ls="--", lw=1.0)
            ax.plot(o[:, 0], o[:, 1], o[:, 2], color="r", label="theory", **style)
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


def plot_curves(ax, t, ys, *, label=None, band=None, color=None, logy=False):
    """Plot ``ys`` against ``t`` with an optional ``(lower, upper)`` band."""
    line = ax.plot(t, ys, label=label, color=color)[0]
    if band is not None:
        ax.fill_between(t, band[0], band[1], color=line.get_color(), alpha=0.25, lw=0)
    if logy:
        ax.set_yscale("log")
    return line


def savefig(fig, path, dpi: int = 110):
    """Lay out ``fig`` (``tight_layout``), write it to ``path`` at ``dpi``, close it; return the path as a string."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return str(path)
