r"""The Brownian path of a noisy run on a uniform step grid (``mf.simulate(noise=, key=)``; docs/math/noise.md,
"The Brownian path").

A run of ``N`` steps of ``h = t_1 / N`` needs the path's increments over ``[k h, (k + 1) h]`` and nothing
else. ``GridBrownianPath`` defines them by a Lévy construction over the grid itself: write
``N = q 2^j`` with ``q`` odd; level 0 is ``q`` independent increments over the intervals of length
``t_1 / q``, and each of the ``j`` levels below splits every interval of the level above (length
``L``, increment ``D``) at its midpoint into ``D / 2 + (sqrt(L) / 2) z`` and ``D / 2 - (sqrt(L) / 2) z``,
``z`` a standard normal of its own. Every normal is drawn from ``fold_in(fold_in(key, level),
index)``, so a value is a function of ``(key, t_1, level, index)`` alone:

- the halves are independent ``N(0, L / 2)`` (the Brownian bridge at the midpoint), so the ``N``
  increments are independent ``N(0, h)``: Brownian motion at the grid points, exactly;
- the runs of one key with ``N`` and ``2 N`` steps (the same ``q``) read one path, the finer one
  splitting the coarser one's steps: what a strong-order fit needs;
- one normal of the noise's shape per step (``N`` in all), where the virtual Brownian tree draws
  about ``2 log2(4 t_1 / h)`` per step (both ends of a step, every level to its quarter-step leaf).

The increments are computed once, level by level, as one array of ``N`` increments when it holds at
most ``STORE_LIMIT`` numbers; above it, each step descends its ``j + 1`` levels (the same
arithmetic, the same numbers). A grid with a save time off the multiples of ``h``, or a traced step,
keeps ``diffrax.VirtualBrownianTree`` (``mf.integrate`` decides: ``grid_steps``).
"""

from __future__ import annotations

from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, PRNGKeyArray

__all__ = ["GridBrownianPath", "STORE_LIMIT", "grid_steps", "index_limit", "odd_and_levels"]

#: The most numbers (steps x the noise's shape) a path stores as one array of increments; a larger
#: path descends its levels at each step instead (same values). Per path: under ``vmap`` over B keys
#: the stored arrays are B times this (a sweep's chunks count them: ``_resources.run_cost(noise=)``).
STORE_LIMIT = 1 << 20


def odd_and_levels(steps: int) -> tuple[int, int]:
    """``(q, j)`` with ``steps = q 2^j``, ``q`` odd: the path's top intervals and its levels.

    >>> odd_and_levels(200), odd_and_levels(128), odd_and_levels(7)
    ((25, 3), (1, 7), (7, 0))
    """
    steps = int(steps)
    if steps < 1:
        raise ValueError(f"a Brownian grid path needs at least one step, got steps={steps}")
    j = (steps & -steps).bit_length() - 1
    return steps >> j, j


def index_limit(dtype: Any) -> int:
    """The most steps a grid path of times in ``dtype`` indexes exactly: ``round(t / h)`` of a step
    time ``t = k h`` is ``k`` while ``k eps`` stays well below 1/2 (float32: 2^20 steps)."""
    return 1 << (np.finfo(np.dtype(dtype)).nmant - 3)


def grid_steps(t1: float, dt: float, grid: np.ndarray, dtype: Any = np.float64) -> int | None:
    """The step count ``N`` when the step points of a run (``grid``: ``0, .., t1``, unpadded) are
    exactly ``k t_1 / N`` to rounding (``t_1 / dt`` an integer, every save time on the grid) and ``N``
    is within ``index_limit(dtype)`` (times in ``dtype`` name their step), else ``None`` (the run
    keeps the virtual Brownian tree).

    >>> grid_steps(1.0, 0.25, np.linspace(0, 1, 5)), grid_steps(1.0, 0.25, np.array([0, .1, .25, .5, .75, 1]))
    (4, None)
    """
    steps = int(round(float(t1) / float(dt)))
    g = np.asarray(grid, np.float64)
    if steps < 1 or abs(steps * float(dt) - float(t1)) > 1e-9 * max(1.0, abs(float(t1))):
        return None
    if steps > index_limit(dtype):
        return None
    if g.shape[0] != steps + 1:
        return None
    if np.max(np.abs(g - np.arange(steps + 1) * (float(t1) / steps))) > 1e-6 * float(dt):
        return None
    return steps


def _normal(key: PRNGKeyArray, level: int, index: Any, shape: jax.ShapeDtypeStruct) -> Array:
    return jr.normal(jr.fold_in(jr.fold_in(key, level), index), shape.shape, shape.dtype)


def _scale(t1: Array, q: int, level: int, dtype: Any) -> Array:
    """``sqrt(L) / 2`` for the intervals of ``level - 1`` (length ``L = t_1 / (q 2^(level - 1))``)."""
    return jnp.sqrt(jnp.asarray(t1, dtype) / (q * 2.0 ** (level - 1))) / 2


class GridBrownianPath(diffrax.AbstractBrownianPath):
    r"""Brownian motion of shape ``shape`` on the grid ``k t_1 / N``, ``k = 0..N`` (the module's
    construction): ``evaluate(k h, (k + 1) h)`` is the ``k``-th increment, ``evaluate(t, t)`` zero,
    ``evaluate(t)`` the value at the grid point nearest ``t``. Only grid steps are defined: any other
    span is NaN (``mf.integrate`` uses the path only on its grid). ``store``: keep the ``N``
    increments as one array (default: when they are at most ``STORE_LIMIT`` numbers), else descend.

    >>> import jax
    >>> p = GridBrownianPath(jax.random.key(0), 1.0, 8, jax.ShapeDtypeStruct((2,), jax.numpy.float32))
    >>> fine = GridBrownianPath(jax.random.key(0), 1.0, 16, p.shape)
    >>> bool(jax.numpy.allclose(p.evaluate(0.25, 0.375), fine.evaluate(0.25, 0.3125) + fine.evaluate(0.3125, 0.375)))
    True
    """

    key: PRNGKeyArray
    t_end: Array
    steps: int = eqx.field(static=True)
    shape: jax.ShapeDtypeStruct = eqx.field(static=True)
    levy_area: type[diffrax.BrownianIncrement] = eqx.field(static=True)
    stored: Array | None

    def __init__(
        self,
        key: PRNGKeyArray,
        t1: Any,
        steps: int,
        shape: jax.ShapeDtypeStruct,
        store: bool | None = None,
    ):
        self.key = key
        self.t_end = jnp.asarray(t1, shape.dtype)
        self.steps = int(steps)
        self.shape = shape
        self.levy_area = diffrax.BrownianIncrement
        if store is None:
            store = self.steps * int(np.prod(shape.shape, dtype=np.int64)) <= STORE_LIMIT
        self.stored = self._all() if store else None

    @property
    def t0(self) -> Array:  # type: ignore[override]
        return jnp.zeros((), self.shape.dtype)

    @property
    def t1(self) -> Array:  # type: ignore[override]
        return self.t_end

    def _all(self) -> Array:
        """The ``N`` increments, level by level (``N`` normals of the noise's shape in all)."""
        q, j = odd_and_levels(self.steps)
        dtype = self.shape.dtype
        top = jnp.sqrt(self.t_end / q)
        inc = jax.vmap(lambda i: _normal(self.key, 0, i, self.shape))(jnp.arange(q)) * top
        for level in range(1, j + 1):
            z = jax.vmap(lambda p, lv=level: _normal(self.key, lv, p, self.shape))(
                jnp.arange(inc.shape[0])
            )
            s = _scale(self.t_end, q, level, dtype) * z
            half = inc / 2
            inc = jnp.stack([half + s, half + (-s)], axis=1).reshape((-1,) + self.shape.shape)
        return inc

    def increment(self, k: Any) -> Array:
        """The ``k``-th increment (``k`` a traced integer in ``0..N-1``), from the stored array or by
        descent through the levels (the same arithmetic)."""
        k = jnp.clip(jnp.asarray(k, jnp.int32), 0, self.steps - 1)
        if self.stored is not None:
            return self.stored[k]
        q, j = odd_and_levels(self.steps)
        inc = _normal(self.key, 0, k >> j, self.shape) * jnp.sqrt(self.t_end / q)
        for level in range(1, j + 1):
            parent = k >> (j - level + 1)
            right = ((k >> (j - level)) & 1) == 1
            s = _scale(self.t_end, q, level, self.shape.dtype) * _normal(
                self.key, level, parent, self.shape
            )
            inc = inc / 2 + jnp.where(right, -s, s)
        return inc

    def _index(self, t: Any) -> Array:
        h = self.t_end / self.steps
        return jnp.round(jnp.asarray(t, self.shape.dtype) / h).astype(jnp.int32)

    def _increment_over(self, t0: Any, t1: Any) -> Array:
        """The increment over ``[t0, t1]``: one grid step's, zero for ``t0 = t1``; NaN for any
        other span (the path defines grid steps only: never a silent full-step increment)."""
        k0, k1 = self._index(t0), self._index(t1)
        inc = self.increment(k0)
        return jnp.where(
            k1 == k0 + 1, inc, jnp.where(k1 == k0, jnp.zeros_like(inc), jnp.full_like(inc, jnp.nan))
        )

    def evaluate(self, t0: Any, t1: Any = None, left: bool = True, use_levy: bool = False) -> Any:
        del left
        if t1 is None:  # the value at the grid point of t0: the sum of the increments before it
            k = self._index(t0)
            steps = jnp.arange(self.steps)
            incs = self.stored if self.stored is not None else jax.vmap(self.increment)(steps)
            mask = (steps < k).reshape((-1,) + (1,) * len(self.shape.shape))
            w = jnp.sum(jnp.where(mask, incs, 0), axis=0)
            dt = jnp.asarray(t0, self.shape.dtype)
        else:
            w = self._increment_over(t0, t1)
            dt = jnp.asarray(t1, self.shape.dtype) - jnp.asarray(t0, self.shape.dtype)
        w = jax.lax.stop_gradient(w)
        if use_levy:
            return diffrax.BrownianIncrement(dt=dt, W=w)
        return w
