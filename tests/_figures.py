"""Checks of what a matplotlib figure shows, for tests of the pictures meanfield writes.

``axis_problems(fig)`` lists the axes that cannot be read: a range of zero width or not finite,
a log axis over less than a decade, tick labels drawn over each other, data outside the limits.
``capture_saved_figures(monkeypatch)`` records every ``Figure`` written by ``savefig`` (pyplot or
not), so a test can check the figures a command wrote.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

__all__ = [
    "AUDITED_CLI",
    "FigureAudit",
    "audit_record",
    "audited_command",
    "assert_readable",
    "axis_problems",
    "capture_saved_figures",
    "data_to_pixels",
]


def _spans(ax: Any) -> list[tuple[str, tuple[float, float], str]]:
    out = [("x", ax.get_xlim(), ax.get_xscale()), ("y", ax.get_ylim(), ax.get_yscale())]
    if getattr(ax, "name", "") == "3d":
        out.append(("z", ax.get_zlim(), ax.get_zscale()))
    return out


def _renderer(fig: Figure) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _overlaps(boxes: list[Any]) -> bool:
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i], boxes[j]
            # overlap by more than a pixel in both directions
            if min(a.x1, b.x1) - max(a.x0, b.x0) > 1.0 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1.0:
                return True
    return False


def _inside(values: np.ndarray, lim: tuple[float, float], tol: float) -> bool:
    lo, hi = min(lim), max(lim)
    v = values[np.isfinite(values)]
    span = hi - lo
    return bool(np.all((v >= lo - tol * span) & (v <= hi + tol * span)))


def axis_problems(fig: Figure, *, name: str = "figure") -> list[str]:
    """What makes an axis of ``fig`` unreadable (empty list: none).

    Every visible axis: each range finite and of nonzero width (more than 1e-6 of its values,
    and 1e-12); a log axis spans at least a
    decade; the visible tick labels of one axis do not overlap; the finite points of every line
    and scatter drawn in data coordinates lie inside the limits (1% tolerance).
    """
    problems = []
    renderer = _renderer(fig)
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison:
            continue
        where = f"{name}: axis {i} ({ax.get_label() or ax.get_ylabel() or ax.get_title()!r})"
        for which, (lo, hi), scale in _spans(ax):
            # a width at rounding level of its values is no range either (a flat principal
            # component: limits +-1e-8 around 0 with every tick label at one place)
            if (
                not (math.isfinite(lo) and math.isfinite(hi))
                or abs(hi - lo) <= 1e-6 * max(abs(lo), abs(hi))
                or abs(hi - lo) < 1e-12
            ):
                problems.append(f"{where}: {which} range [{lo:.6g}, {hi:.6g}] has no width")
                continue
            if scale == "log" and max(lo, hi) / min(lo, hi) < 10.0 * (1 - 1e-9):
                problems.append(
                    f"{where}: log {which} axis over less than a decade [{lo:.4g}, {hi:.4g}]"
                )
        if getattr(ax, "name", "") != "3d":
            for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
                labels = [
                    t.label1 if which == "x" or t.label1.get_visible() else t.label2
                    for t in axis.get_major_ticks()
                ]
                boxes = [
                    lab.get_window_extent(renderer)
                    for lab in labels
                    if lab.get_visible() and lab.get_text()
                ]
                if _overlaps(boxes):
                    problems.append(f"{where}: {which} tick labels overlap")
            problems += _data_outside(ax, where)
    return problems


def _data_outside(ax: Axes, where: str) -> list[str]:
    problems = []
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    for line in ax.get_lines():
        if not isinstance(line, Line2D) or line.get_transform() != ax.transData:
            continue  # axhline/axvline: one coordinate in axes units
        xy = np.asarray(line.get_xydata(), dtype=float)
        if xy.size and not (_inside(xy[:, 0], xlim, 0.01) and _inside(xy[:, 1], ylim, 0.01)):
            problems.append(f"{where}: line {line.get_label()!r} outside the limits")
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_offset_transform() == ax.transData:
            off = np.asarray(coll.get_offsets(), dtype=float)
            if off.size and not (_inside(off[:, 0], xlim, 0.01) and _inside(off[:, 1], ylim, 0.01)):
                problems.append(f"{where}: scatter points outside the limits")
    return problems


def assert_readable(fig: Figure, *, name: str = "figure") -> None:
    problems = axis_problems(fig, name=name)
    assert not problems, "\n".join(problems)


def _saved_path(fname: Any) -> Path:
    """The path a figure is saved to: ``fname`` itself, or the file an open file object (what
    ``meanfield._paths.open_output`` returns: its ``name`` is the descriptor) writes."""
    if isinstance(fname, (str, os.PathLike)):
        return Path(fname)
    name = getattr(fname, "name", None)
    if isinstance(name, str):
        return Path(name)
    try:
        return Path(os.readlink(f"/proc/self/fd/{fname.fileno()}"))
    except (OSError, AttributeError, ValueError):
        return Path(f"<stream {name!r}>")


def capture_saved_figures(monkeypatch: Any) -> list[tuple[Path, Figure]]:
    """Patch ``Figure.savefig`` to record ``(path, figure)`` of every figure saved after it."""
    saved: list[tuple[Path, Figure]] = []
    original = Figure.savefig

    def record(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> Any:
        path = _saved_path(fname)
        out = original(self, fname, *args, **kwargs)
        saved.append((path, self))
        return out

    monkeypatch.setattr(Figure, "savefig", record)
    return saved


def data_to_pixels(ax: Axes, xy: np.ndarray, image_shape: tuple[int, ...]) -> np.ndarray:
    """Pixel (column, row) of data points ``xy`` (m, 2) of ``ax`` in an image of ``image_shape``
    (rows, columns, ...) rendered from its figure at any dpi (rows counted from the top)."""
    frac = ax.figure.transFigure.inverted().transform(ax.transData.transform(xy))
    h, w = image_shape[:2]
    return np.stack([frac[:, 0] * w, (1.0 - frac[:, 1]) * h], axis=1)


class FigureAudit:
    """Every figure saved while active (``Figure.savefig``, pyplot or not), checked by
    :func:`axis_problems` as it is saved: ``.saved`` the paths, ``.problems`` what cannot be read."""

    def __init__(self) -> None:
        self.saved: list[Path] = []
        self.problems: list[str] = []
        self._original: Any = None

    def __enter__(self) -> FigureAudit:
        original = self._original = Figure.savefig
        audit = self

        def checked(fig: Figure, fname: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(fig, fname, *args, **kwargs)
            audit.saved.append(Path(fname))
            audit.problems += axis_problems(fig, name=Path(str(fname)).name)
            return out

        Figure.savefig = checked  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        Figure.savefig = self._original  # type: ignore[method-assign]


#: ``python -c AUDITED_CLI OUT.json ARGS...``: the ``meanfield`` command with ARGS, every figure it
#: saves checked by ``axis_problems``; the paths and problems written to OUT.json (a test of a
#: command run in its own process: :func:`audited_command`).
AUDITED_CLI = """
import json, sys
sys.path.insert(0, TESTS)
from _figures import FigureAudit
import meanfield.cli
out, argv = sys.argv[1], sys.argv[2:]
sys.argv = ["meanfield", *argv]
with FigureAudit() as audit:
    try:
        code = meanfield.cli.main()
    finally:
        with open(out, "w") as f:
            json.dump({"saved": [str(p) for p in audit.saved], "problems": audit.problems}, f)
sys.exit(code)
""".replace("TESTS", repr(str(Path(__file__).resolve().parent)))


def audited_command(audit_json: Path, *args: str) -> list[str]:
    """The command line of ``meanfield ARGS`` in a fresh Python process under :class:`FigureAudit`,
    its record written to ``audit_json``."""
    import sys

    return [sys.executable, "-c", AUDITED_CLI, str(audit_json), *args]


def audit_record(audit_json: Path) -> dict[str, list[str]]:
    """What :func:`audited_command` recorded: ``saved`` (paths) and ``problems``."""
    import json

    return json.loads(Path(audit_json).read_text())
