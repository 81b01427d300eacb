"""Shared pieces of the ``meanfield reproduce`` experiments: the summary schema.

Every experiment writes ``DIR/<experiment>/summary.json``::

    {"experiment": "usa-av", "quick": true, "settings": {...},
     "checks": [{"name": ..., "theory": <number or null>, "measured": <number>,
                 "tolerance": <number>, "pass": <bool>, "note": "..."}, ...],
     "timings": {...}}
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._checks import RealScalarLike

__all__ = ["BAR_POSITION", "check", "progress", "write_summary", "Timer"]

#: The line of this process's progress bars when ``run_experiments`` runs experiments in several
#: processes (set in each worker; None: tqdm's own placement).
BAR_POSITION: int | None = None


def progress(*args, **kwargs):
    """``tqdm.auto.tqdm(*args, **kwargs)``, on this process's own line (``BAR_POSITION``) when
    experiments run concurrently."""
    from tqdm.auto import tqdm

    if BAR_POSITION is not None:
        kwargs.setdefault("position", BAR_POSITION)
    return tqdm(*args, **kwargs)


def check(
    name: str,
    measured,
    theory=None,
    tolerance: RealScalarLike = 0.0,
    note: str = "",
    *,
    relative: bool = False,
    passed: bool | Callable[[float], bool] | None = None,
) -> dict[str, Any]:
    """One row of a summary's ``checks``.

    ``pass`` is ``|measured - theory| <= tolerance`` (times ``|theory|`` when
    ``relative``) when ``theory`` is a number; when ``theory`` is ``None`` the
    caller supplies ``passed`` (a bool, or a predicate on ``measured``) that
    states the paper's qualitative prediction (e.g. ``> 0``), and says it in
    ``note``.
    """
    m = _num(measured)
    t = None if theory is None else _num(theory)
    if passed is not None:
        ok = bool(passed(m)) if callable(passed) else bool(passed)
    elif t is None:
        raise ValueError(f"check {name!r}: theory is None, so pass a predicate `passed`")
    else:
        scale = abs(t) if relative else 1.0
        ok = bool(math.isfinite(m) and abs(m - t) <= tolerance * scale)
    return {
        "name": name,
        "theory": t,
        "measured": m,
        "tolerance": float(tolerance),
        "pass": ok,
        "note": note,
    }


def _num(x) -> float:
    return float(np.asarray(x, dtype=np.float64))


def write_summary(
    out_dir: Path | str,
    experiment: str,
    *,
    quick: bool,
    settings: dict,
    checks: list[dict],
    timings: dict | None = None,
    figures: list[str] | None = None,
) -> dict:
    """Write ``out_dir/summary.json`` and return the summary dict."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {
        "experiment": experiment,
        "quick": bool(quick),
        "settings": _jsonable(settings),
        "checks": checks,
        "timings": _jsonable(timings or {}),
        "figures": figures or [],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    return summary


class Timer:
    """Context manager recording wall time into a dict under a name."""

    def __init__(self, store: dict, name: str):
        self.store, self.name = store, name

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.store[self.name] = round(time.perf_counter() - self.t0, 3)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array__"):
        arr = np.asarray(obj)
        return arr.tolist() if arr.ndim else arr.item()
    if isinstance(obj, (np.generic,)):
        return obj.item()
    return obj
