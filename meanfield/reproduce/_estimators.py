"""Estimators shared by the long-context experiments (``reproduce.attention`` and
``reproduce.attention_keys``): the same numbers for i.i.d., dependent and RoPE-rotated keys."""

from __future__ import annotations

import math

import numpy as np
from jaxtyping import ArrayLike, Float

__all__: list[str] = []


def _crossing(
    logb: Float[np.ndarray, " k"], mean: Float[np.ndarray, " k"], se: Float[np.ndarray, " k"]
) -> tuple[float, float]:
    """``log beta`` where ``mean`` (increasing in beta) crosses 1/2, and its delta-method SE."""
    above = np.nonzero(mean >= 0.5)[0]
    if above.size == 0 or above[0] == 0:
        return float("nan"), float("nan")
    j = above[0]
    x0, x1, y0, y1 = logb[j - 1], logb[j], mean[j - 1], mean[j]
    t = (0.5 - y0) / (y1 - y0)
    root = x0 + t * (x1 - x0)
    slope = (y1 - y0) / (x1 - x0)
    s = (1 - t) * se[j - 1] + t * se[j]
    return float(root), float(s / slope)


def _weighted_line(
    x: Float[np.ndarray, " k"], y: Float[np.ndarray, " k"], s: Float[np.ndarray, " k"]
) -> tuple[float, float, float]:
    """Weighted least squares ``y = a + b x`` (weights ``1/s^2``): ``(b, a, se(b))``."""
    ok = np.isfinite(y) & np.isfinite(s) & (s > 0)
    x, y, s = x[ok], y[ok], s[ok]
    w = 1.0 / s**2
    X = np.stack([np.ones_like(x), x], 1)
    cov = np.linalg.inv(X.T @ (w[:, None] * X))
    a, b = cov @ (X.T @ (w * y))
    return float(b), float(a), float(math.sqrt(cov[1, 1]))


def _ks_distance(a: Float[ArrayLike, " m"], b: Float[ArrayLike, " k"]) -> float:
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(
        np.max(
            np.abs(
                np.searchsorted(a, grid, "right") / a.size
                - np.searchsorted(b, grid, "right") / b.size
            )
        )
    )


def _reduced_limit_note(
    note: str,
    n_finite: int,
    n_limit: int,
    was: int,
    margin: float,
    ratio: str = "|measured - theory| / tolerance",
) -> str:
    """``note`` (a check's note) with the sentence it gains where the quick run draws ``n_limit``
    samples of a limit law instead of ``was`` (issue 32, "quick means quick"), against ``n_finite``
    finite-n samples.

    A two-sample mean or KS comparison has standard error (and KS critical value) proportional to
    ``sqrt(1/n_finite + 1/n_limit)``: with ``n_limit >> n_finite`` the limit sample adds little, so
    the smaller size keeps the tolerance derivation (``k`` standard errors, or the KS critical value)
    and the tolerance grows only by the factor stated. ``margin``: the value of ``ratio`` at
    ``n_limit`` (a contrast names its own: its statistic over the critical value).

    >>> _reduced_limit_note("tolerance 4 SE", 1000, 10_000, 20_000, 0.65)[:59]
    'tolerance 4 SE. Quick size: 10000 limit samples (was 20000,'
    """
    grow = math.sqrt((1 / n_finite + 1 / n_limit) / (1 / n_finite + 1 / was))
    return (
        f"{note.rstrip().rstrip('.')}. Quick size: {n_limit} limit samples (was {was}, "
        f"{n_limit / n_finite:g}x the {n_finite} finite-n samples): the two-sample SE and KS critical "
        f"value, proportional to sqrt(1/{n_finite} + 1/{n_limit}), are {grow:.3f}x those at {was}; "
        f"{ratio} = {margin:.2f} at {n_limit}"
    )
