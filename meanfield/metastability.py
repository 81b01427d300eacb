r"""Metastability: clusters, merge events, energy plateaus and the staircase theory.

Geshkovski, Koubbi, Polyanskiy, Rigollet, "Dynamic metastability in the self-attention model"
(arXiv 2410.06833; code github.com/HugoKoubbi/2024-transformers-dotm, ``staircase.py``): at large
$\beta$ the particles of the USA flow gather in a few clusters within $O(1)$ time, sit there for
times exponential in $\beta$, then merge pairwise; the energy climbs a staircase.

Normalisation (docs/math/particles.md, Energy). meanfield's USA energy is
$E = \frac{1}{2 n^2} \sum_{i,j} e^{\beta \langle x_i, x_j\rangle} / \beta$ (times $e^{-\beta}$ for
``rescaled=True``). The papers plot

$$\tilde E = \frac{1}{n^2} \sum_{i,j} e^{\beta (\langle x_i, x_j\rangle - 1)}
= 2 \beta e^{-\beta} E \in (0, 1]$$

(``normalized_energy``; dotm's ``energy_softmax``). For $K$ point clusters of weights $w_k$
(fractions of the particles, $\sum_k w_k = 1$) at mutual angles $\theta_{kl}$,
$\tilde E = \sum_k w_k^2 + \sum_{k \ne l} w_k w_l e^{-\beta (1 - \cos\theta_{kl})}$, and the
cross terms vanish as $\beta \to \infty$ at fixed angles: a plateau sits at
$\sum_k w_k^2$, and merging clusters $a, b$ raises it by $(w_a + w_b)^2 - w_a^2 - w_b^2 = 2 w_a w_b$
(the staircase of the paper's last section; dotm's ``algo_traj_1/2``: level $1/n$ from $n$
singletons, jumps $2 w_a w_b / M^2$ with integer weights). ``staircase`` computes it.

Two point clusters (reduced ODE). In the rescaled USA flow
$\dot x_i = P_{x_i} \frac1n \sum_j e^{\beta(\langle x_i,x_j\rangle - 1)} x_j$, a particle of a point
cluster of weight $w_1$ is pulled by the other cluster (weight $w_2$, angle $\theta$) with speed
$w_2 \sin\theta\, e^{\beta(\cos\theta - 1)}$ (its own cluster contributes a vector parallel to
$x_i$, projected out), and symmetrically: the angle obeys
$\dot\theta = -(w_1 + w_2) \sin\theta\, e^{-\beta(1-\cos\theta)}$, and the weighted mean angle
is conserved. With $u = 1 - \cos\theta$ ($\sin^2\theta = u (2 - u)$) the time from $\theta_0$ to
the cluster threshold $\theta_c$ is

$$T = \frac{1}{w_1 + w_2} \int_{u_c}^{u_0} \frac{e^{\beta u}}{u (2 - u)}\, du
\;\sim\; \frac{e^{\beta u_0}}{(w_1 + w_2)\, \beta\, u_0 (2 - u_0)} \quad (\beta \to \infty),$$

so plateau lengths grow like $e^{\beta (1 - \cos\theta_0)}$ (``two_cluster_merge_time``).

Long runs (``simulate_long``): the plateaus last $e^{\beta(1-\cos\theta)}$ time units, far past
what fixed steps reach. The flow is integrated in the kernel's own time with an embedded
Bogacki--Shampine 3(2) pair on the tangent field, each step accepted when
$\max_{i,a} |x^{(3)}_{ia} - x^{(2)}_{ia}| \le$ ``atol`` $+$ ``rtol`` $|x^{(3)}_{ia}|$ (the stated error
control), so the step grows to the plateau's own time scale, landing on a logarithmic save grid;
the memory is that of the saves, not of the steps. Particles closer than ``merge_tol`` radians
are replaced by their (normalised) mean after every step: coincident particles stay coincident
under the flow, so this removes the stiff intra-cluster modes that would otherwise cap an
explicit step at $O(1)$ on a plateau of length $e^{\beta u}$, at the cost of a displacement at most
``merge_tol``; merged particles no longer pull on each other (their pull is radial, projected
out), so rounding differences between their copies cannot swamp the inter-cluster drift. The
arithmetic is scaled so that nothing overflows at $t \sim e^{1000}$: the field is
$e^{c} G$ with $c$ the largest pair exponent $-\beta |x_i - x_j|^2 / 2$ between clusters and
$G = O(1)$, the step is $e^{\eta}$ and the increment $e^{\eta + c} G$, and the time is carried as
$\log t$ (a compensated sum of $\log(1 + h/t)$); the save grid is in $\log t$ (``log_ts``,
``log_t1``), and ``observables["log_t"]`` returns it when $t$ itself overflows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int
from jaxtyping import ArrayLike as _JaxArrayLike

from . import metrics, sphere
from ._checks import (
    RealScalarLike,
    check_flag,
    check_int,
    check_positive,
    check_scalar,
    is_concrete,
)
from ._machine import check_memory as _check_memory
from .energy import check_states
from .integrate import Trajectory
from .kernels import Kernel
from .kernels._exp import _entry_backend, _scope_backend
from .masks import energy_problem
from .normalization import require_post

__all__ = [
    "Clusters",
    "clusters",
    "cluster_labels",
    "MergeEvent",
    "merge_events",
    "first_merge_time",
    "Plateaus",
    "plateaus",
    "num_plateaus",
    "Staircase",
    "staircase",
    "two_cluster_merge_time",
    "normalized_energy",
    "log_time_grid",
    "simulate_long",
]


#: Arrays, numbers or (nested) lists of numbers.
_ArrayLike: TypeAlias = _JaxArrayLike | Sequence[Any]

#: Row tile of ``simulate_long``'s pair sums (memory ``block x n x d``).
_LONG_BLOCK = 128


def _check_threshold(threshold: Any) -> None:
    check_scalar("threshold", threshold)
    if is_concrete(threshold):
        t = float(threshold)
        if not (0.0 < t < math.pi):
            raise ValueError(f"threshold must be an angle in (0, pi) radians, got {t!r}")


#: Host bytes per save of ``simulate_long``'s grid beyond the saved arrays: the float64 grids
#: (``linspace``, the concatenation, ``exp``) and their casts.
_LONG_GRID_BYTES = 48


def _is_real_dtype(dtype: Any) -> bool:
    """Integers and floats (bfloat16 and float8 included); not bools, complex or objects."""
    try:
        return bool(jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating))
    except TypeError:
        return False


def _real_np(name: str, value: Any, dtype: Any = np.float64) -> np.ndarray:
    """A concrete ``value`` as a NumPy array of ``dtype`` (``None``: its own; no float32 round
    trip through JAX); ``TypeError`` for strings, bools, complex, objects and ragged lists."""
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name} must be an array of real numbers, got {value!r:.80}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{name} must be an array of real numbers, got {value!r:.80}") from None
    if not _is_real_dtype(arr.dtype):
        raise TypeError(f"{name} must be an array of real numbers, got dtype {arr.dtype}")
    return arr if dtype is None else arr.astype(dtype)


def _real_array(name: str, value: Any) -> Array:
    """``value`` as a JAX array of real numbers (``_real_np``'s checks); traced values pass."""
    if not is_concrete(value):
        arr = jnp.asarray(value)
        if not _is_real_dtype(arr.dtype):
            raise TypeError(f"{name} must be an array of real numbers, got dtype {arr.dtype}")
        return arr
    if isinstance(value, (jax.Array, np.ndarray)):
        _real_np(name, value[:0] if value.ndim else value)  # the dtype, without a copy
        return jnp.asarray(value)
    _real_np(name, value)
    return jnp.asarray(value)


def _check_times(name: str, ts: Any, size: int) -> np.ndarray:
    """Concrete save times: ``(size,)``, strictly increasing, finite except a leading ``-inf``
    (``log t`` of ``t = 0``, as in ``simulate_long``'s ``observables["log_t"]``), as float64."""
    t = _real_np(name, ts)
    if t.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},) (one time per save), got {t.shape}")
    bad = np.isnan(t) | (t == np.inf) | ((t == -np.inf) & (np.arange(size) > 0))
    if np.any(bad):
        raise ValueError(
            f"{name} must be finite (or -inf at the first save, log t of t = 0), got "
            f"{float(t[np.flatnonzero(bad)[0]])!r} at save {int(np.flatnonzero(bad)[0])}"
        )
    if size > 1 and np.any(np.diff(t) <= 0):
        k = int(np.flatnonzero(np.diff(t) <= 0)[0])
        raise ValueError(
            f"{name} must be strictly increasing, got {float(t[k])!r} then {float(t[k + 1])!r} at saves {k}, {k + 1}"
        )
    return t


# --------------------------------------------------------------------------- clusters


class Clusters(eqx.Module):
    """Clusters of one state (``clusters``).

    Attributes:
        labels: ``(n,)`` int32, the smallest particle index of each particle's cluster
            (``labels[i] == i`` at exactly one particle per cluster).
        weights: ``(n,)`` the fraction of particles in the cluster labelled ``r`` at index ``r``,
            0 at indices that label no cluster (sums to 1).
    """

    labels: Int[Array, " n"]
    weights: Float[Array, " n"]

    @property
    def num(self) -> Array:
        """Number of clusters."""
        return jnp.sum(self.weights > 0)


def clusters(
    x: _ArrayLike,
    threshold: RealScalarLike = 0.1,
    *,
    block_size: object = None,
) -> Clusters:
    r"""Single-linkage clusters of a state at an angular threshold.

    Particles $i, j$ are joined when $\arccos\langle x_i, x_j\rangle <$ ``threshold``; clusters are
    the connected components (the graph of ``mf.metrics.num_clusters``: blocked, sorted tiles,
    memory $O(n d + \text{block}^2)$, never an $n \times n$ matrix). Weight of a cluster: its
    fraction of the particles. jit- and vmap-compatible.

    Args:
        x: ``(n, d)`` unit rows.
        threshold: angle in $(0, \pi)$ radians.
        block_size: row tile of the pair visit (``None``: ``mf.metrics.CLUSTER_BLOCK``).

    Returns:
        ``Clusters(labels, weights)``; ``.num`` is the count.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.array([[1.0, 0.0], [1.0, 0.01], [0.0, 1.0]])
        >>> c = mf.metastability.clusters(x, 0.1)
        >>> c.labels.tolist(), [round(w, 3) for w in c.weights.tolist()], int(c.num)
        ([0, 0, 2], [0.667, 0.0, 0.333], 2)
    """
    _check_threshold(threshold)
    if block_size is not None:
        block_size = check_int("block_size", block_size, minimum=1)
    x = _real_array("x", x)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"x must be a non-empty (n, d) array, got shape {x.shape}")
    if is_concrete(x) and not bool(jnp.all(jnp.isfinite(x))):
        raise ValueError("x must be finite (a failed run's state has no clusters)")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    return _clusters(x, threshold, block_size=block_size)


@eqx.filter_jit
def _clusters(
    x: Float[Array, "n d"], threshold: RealScalarLike, *, block_size: int | None
) -> Clusters:
    n = x.shape[0]
    labels = metrics._component_labels(x, jnp.asarray(threshold, x.dtype), block_size=block_size)
    w = jax.ops.segment_sum(jnp.ones((n,), x.dtype), labels, num_segments=n) / n
    return Clusters(labels=labels, weights=w)


def cluster_labels(
    threshold: RealScalarLike = 0.1, *, block_size: object = None
) -> Callable[[Array], Array]:
    """An observable ``x -> clusters(x, threshold).labels`` for ``simulate(observables=...)``.

    Saved inside a run under the name ``"cluster_labels"``, it lets ``merge_events`` work on a
    run with ``save_states=False`` (``n`` labels per save instead of ``n d`` coordinates).

    Example:
        >>> import jax, meanfield as mf
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> obs = {"cluster_labels": mf.metastability.cluster_labels(0.3)}
        >>> traj = mf.simulate(mf.kernels.USA(1.0), x0, t1=0.5, dt=0.1, observables=obs, save_states=False)
        >>> traj.observables["cluster_labels"].shape
        (2, 8)
    """
    _check_threshold(threshold)
    if block_size is not None:
        block_size = check_int("block_size", block_size, minimum=1)

    def labels(x: Float[Array, "n d"]) -> Int[Array, " n"]:
        return metrics._component_labels(x, jnp.asarray(threshold, x.dtype), block_size=block_size)

    return labels


# --------------------------------------------------------------------------- merges


@dataclasses.dataclass(frozen=True)
class MergeEvent:
    """One merge of two clusters (``merge_events``).

    Clusters are named by their smallest particle index. ``time`` is the first save at which
    the two are one cluster, ``time_before`` the last save at which they were apart (the merge
    happened in ``(time_before, time]``).
    """

    time: float
    time_before: float
    left: int
    right: int
    w_left: float
    w_right: float
    merged: int
    w_merged: float


@eqx.filter_jit
def _batch_labels(
    xs: Float[Array, "T n d"], threshold: Array, block_size: int | None
) -> Int[Array, "T n"]:
    """Component labels of every saved state (one compilation per shape, threshold traced)."""
    return jax.vmap(lambda x: metrics._component_labels(x, threshold, block_size=block_size))(xs)


def _traj_labels(
    traj: Trajectory | tuple[Any, Any], threshold: RealScalarLike, block_size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(ts, labels)`` from a Trajectory (states or a ``cluster_labels`` observable) or a pair."""
    if isinstance(traj, tuple) and len(traj) == 2:
        ts, xs = traj
        obs_labels = None
    else:
        ts = getattr(traj, "ts", None)
        xs = getattr(traj, "xs", None)
        obs_labels = (getattr(traj, "observables", None) or {}).get("cluster_labels")
        if ts is None:
            raise TypeError(
                f"traj must be a Trajectory or a pair (ts, xs), got {type(traj).__name__}"
            )
    ts = _real_np("ts", ts)
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(f"the trajectory is empty (no save times), got ts of shape {ts.shape}")
    fin = ts[np.isfinite(ts)]
    if np.any(np.diff(fin) <= 0):
        raise ValueError("ts must be strictly increasing (save times in order)")
    if xs is not None:
        xs = _real_np("xs", xs, None)
        if xs.ndim != 3 or xs.shape[0] != ts.size or xs.shape[1] == 0:
            raise ValueError(
                f"states must have shape (T, n, d) with T = {ts.size} save times, got {xs.shape}"
            )
        ok = np.isfinite(ts) & np.all(np.isfinite(xs), axis=(1, 2))
        ts, xs = ts[ok], xs[ok]
        if ts.size == 0:
            raise ValueError("the trajectory has no finite saved state")
        xs = jnp.asarray(xs)
        return ts, np.asarray(_batch_labels(xs, jnp.asarray(threshold, xs.dtype), block_size))
    if obs_labels is None:
        raise ValueError(
            "the trajectory has neither states (save_states=False) nor a 'cluster_labels' observable: "
            "pass observables={'cluster_labels': mf.metastability.cluster_labels(threshold)} to the run"
        )
    lab = _real_np("cluster_labels", obs_labels)
    if lab.ndim != 2 or lab.shape[0] != ts.size:
        raise ValueError(
            f"the 'cluster_labels' observable must have shape (T, n) with T = {ts.size} saves, got {lab.shape}"
        )
    ok = np.isfinite(ts) & np.all(np.isfinite(lab), axis=1)
    ts, lab = ts[ok], lab[ok]
    if ts.size == 0:
        raise ValueError("the trajectory has no finite saved labels")
    return ts, np.rint(lab).astype(np.int64)


def merge_events(
    traj: Trajectory | tuple[Any, Any],
    threshold: RealScalarLike = 0.1,
    *,
    block_size: object = None,
) -> list[MergeEvent]:
    r"""Every merge of clusters along a run, in time order.

    The clusters of each save (``clusters(x, threshold)``, or the ``"cluster_labels"`` observable
    saved inside a run with ``save_states=False``, whose own threshold then applies) are compared
    with those of the previous save: a cluster that contains particles of $m \ge 2$ earlier
    clusters gives $m - 1$ events, merging them in increasing label order (several merges between
    two saves are not ordered by the saves; refine the save grid to separate them). Weights are
    those of the earlier save's clusters. A cluster that splits (a pair drifting back over the
    threshold) is not an event.

    Args:
        traj: a ``Trajectory`` (``mf.simulate``, ``simulate_long``) or a pair ``(ts, xs)`` with
            ``xs`` of shape ``(T, n, d)``. Saves after a failure (non-finite) are dropped.
        threshold: angle in $(0, \pi)$ (ignored for saved labels).
        block_size: tile of the cluster search.

    Returns:
        list of ``MergeEvent(time, time_before, left, right, w_left, w_right, merged, w_merged)``.

    Example:
        >>> import numpy as np, meanfield as mf
        >>> xs = np.array([[[1, 0], [0, 1], [-1, 0]], [[1, 0], [1, 0], [-1, 0]]], float)
        >>> [(e.time, e.left, e.right, e.merged) for e in mf.metastability.merge_events(([0.0, 1.0], xs))]
        [(1.0, 0, 1, 0)]
    """
    _check_threshold(threshold)
    if block_size is not None:
        block_size = check_int("block_size", block_size, minimum=1)
    ts, lab = _traj_labels(traj, threshold, block_size)
    n = lab.shape[1]
    events: list[MergeEvent] = []
    for k in range(1, ts.size):
        prev, cur = lab[k - 1], lab[k]
        if np.array_equal(prev, cur):
            continue
        w_prev = np.bincount(prev, minlength=n) / n
        for c in np.unique(cur):
            parts = np.unique(prev[cur == c])
            if parts.size < 2:
                continue
            acc, w_acc = int(parts[0]), float(w_prev[parts[0]])
            for p in parts[1:]:
                wp = float(w_prev[p])
                merged = min(acc, int(p))
                events.append(
                    MergeEvent(
                        float(ts[k]), float(ts[k - 1]), acc, int(p), w_acc, wp, merged, w_acc + wp
                    )
                )
                acc, w_acc = merged, w_acc + wp
    events.sort(key=lambda e: (e.time, e.merged, e.right))
    return events


def first_merge_time(ts: _ArrayLike, num: _ArrayLike) -> Array:
    r"""First save time at which the cluster count drops below its value at the first save.

    ``num``: the cluster counts at ``ts`` (e.g. ``clusters(x).num`` saved as an observable).
    Returns ``inf`` when no merge happens. Array work: jit- and vmap-compatible (a sweep
    observable).

    Args:
        ts: ``(T,)`` save times, ``T >= 1``, strictly increasing, finite (a leading ``-inf``,
            ``log t`` of ``t = 0``, is accepted).
        num: ``(T,)`` cluster counts: finite integers ``>= 0`` (integer or float dtype).

    Concrete arguments are checked (shapes, dtypes, values: ``TypeError``/``ValueError``
    naming the argument); traced ones only by shape and dtype.

    Example:
        >>> import meanfield as mf
        >>> float(mf.metastability.first_merge_time([0.0, 1.0, 2.0, 3.0], [3, 3, 2, 1]))
        2.0
    """
    ts, num = _real_array("ts", ts), _real_array("num", num)
    if ts.ndim != 1 or ts.shape[0] == 0:
        raise ValueError(f"ts must be a non-empty 1-d array of save times, got shape {ts.shape}")
    if num.shape != ts.shape:
        raise ValueError(
            f"num must have the shape of ts {tuple(ts.shape)} (one count per save), got {num.shape}"
        )
    if is_concrete(ts):
        _check_times("ts", ts, ts.shape[0])
    if is_concrete(num):
        c = np.asarray(num, dtype=np.float64)
        bad = ~np.isfinite(c) | (c < 0) | (c != np.round(c))
        if np.any(bad):
            k = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"num must be cluster counts (finite integers >= 0), got {float(c[k])!r} at save {k}"
            )
    ts = ts.astype(jnp.result_type(ts.dtype, jnp.float32))
    merged = num < num[0]
    return jnp.where(jnp.any(merged), ts[jnp.argmax(merged)], jnp.inf)


# --------------------------------------------------------------------------- plateaus


@dataclasses.dataclass(frozen=True)
class Plateaus:
    """Energy plateaus (``plateaus``): ``start``, ``end``, ``level`` arrays of equal length.

    One entry per metastable stage: ``start`` and ``end`` its first and last save times,
    ``level`` the median energy of its saves (the rule: ``plateaus``; docs/math/metastability.md).
    """

    start: np.ndarray
    end: np.ndarray
    level: np.ndarray

    def __len__(self) -> int:
        return int(self.level.size)


def _check_plateau_args(
    energy: Any, rel_tol: Any, rate_tol: Any, min_points: Any
) -> tuple[Array, int]:
    for name, v in (("rel_tol", rel_tol), ("rate_tol", rate_tol)):
        check_scalar(name, v)
        check_positive(name, v)
        if is_concrete(v) and not float(v) < 1.0:
            raise ValueError(f"{name} must be a fraction in (0, 1), got {float(v)!r}")
    min_points = check_int("min_points", min_points, minimum=2)
    E = _real_array("energy", energy)
    if E.ndim != 1 or E.shape[0] == 0:
        raise ValueError(f"energy must be a non-empty 1-d array, got shape {E.shape}")
    if is_concrete(E) and not bool(jnp.all(jnp.isfinite(E))):
        raise ValueError("energy must be finite (drop the saves after a failed run)")
    return E, min_points


def _plateau_rule(E: Any, rel_tol: Any, rate_tol: Any, min_points: int, xp: Any) -> tuple[Any, Any]:
    """``(group, count)``: the plateau index of every save (-1 off a plateau) and the count.

    The rule of ``plateaus``, written once for NumPy (``xp = np``: ``plateaus``, no compilation
    per trace length) and JAX (``xp = jnp``: ``num_plateaus``, jit and vmap): a save interval is
    flat when its energy change is at most ``rate_tol`` times the largest change of one interval;
    maximal runs of saves joined by flat intervals, of at least ``min_points`` saves, are the
    candidates; a candidate that starts within ``rel_tol (max E - min E)`` of the energy at which
    the previous candidate ended continues it.
    """
    T = E.shape[0]
    inc = xp.abs(xp.diff(E))
    peak = xp.max(inc, initial=0.0)
    flat = inc <= rate_tol * peak
    brk = xp.concatenate([xp.ones((1,), bool), ~flat])  # save k starts a flat run
    seg = xp.cumsum(brk) - 1
    length: Any
    if xp is np:
        length = np.bincount(seg, minlength=T)
    else:
        length = jax.ops.segment_sum(jnp.ones((T,), jnp.int32), seg, num_segments=T)
    on = length[seg] >= min_points
    start = on & brk
    end = on & xp.concatenate([brk[1:], xp.ones((1,), bool)])
    idx = xp.arange(T)
    marks = xp.where(end, idx, -1)
    last_end = np.maximum.accumulate(marks) if xp is np else jax.lax.cummax(marks)
    prev_end = xp.concatenate([xp.full((1,), -1, last_end.dtype), last_end[:-1]])
    band = rel_tol * (xp.max(E) - xp.min(E))
    joined = start & (prev_end >= 0) & (xp.abs(E - E[xp.maximum(prev_end, 0)]) <= band)
    new = start & ~joined
    group = xp.where(on, xp.cumsum(new) - 1, -1)
    return group, xp.sum(new)


@eqx.filter_jit
def _plateau_core(
    E: Float[Array, " T"], rel_tol: RealScalarLike, rate_tol: RealScalarLike, min_points: int
) -> tuple[Int[Array, " T"], Int[Array, ""]]:
    """``_plateau_rule`` in JAX (``num_plateaus``)."""
    E = E.astype(jnp.result_type(E.dtype, jnp.float32))
    return _plateau_rule(E, rel_tol, rate_tol, min_points, jnp)


def plateaus(
    ts: _ArrayLike,
    energy: _ArrayLike,
    *,
    rel_tol: RealScalarLike = 0.02,
    rate_tol: RealScalarLike = 0.02,
    min_points: int = 3,
) -> Plateaus:
    r"""Plateaus of an energy curve: its distinct metastable stages.

    Rule (one definition, shared with ``num_plateaus``):

    1. an interval between consecutive saves is *flat* when the energy changes across it by at
       most ``rate_tol`` times the largest change across any one interval of the curve (the
       peak rate of a merge): a plateau is where the energy moves at most ``rate_tol`` times as
       fast as during the fastest jump, so a slow drift on a plateau (clusters approaching, at
       moderate $eta$) stays one plateau however far it accumulates;
    2. a maximal run of saves joined by flat intervals, of at least ``min_points`` saves, is a
       candidate (a jump resolved over several saves, its flanks included, is not, unless it
       dwells ``min_points`` saves at a flat rate);
    3. a candidate that starts within ``rel_tol`` $\cdot (\max E - \min E)$ of the energy at which
       the previous candidate ended continues it (the energy came back: a spike or a noisy
       excursion, not a new stage), so a jump smaller than that band is not resolved.

    A plateau runs from the first save of its first candidate to the last save of its last, at
    the median energy of its candidates' saves. The rule compares changes between saves, so it
    reads the save grid: on a logarithmic grid (``simulate_long``) the rate is per log-time
    interval and ``min_points`` a minimal duration in log time. A constant curve is one plateau;
    a curve rising at a constant rate has none. Noise up to ``rate_tol / 2`` of the largest jump
    leaves the count unchanged.

    Args:
        ts: ``(T,)`` save times, increasing.
        energy: ``(T,)`` finite energies (any normalisation; ``normalized_energy`` for the
            staircase).
        rel_tol: level band as a fraction of the energy range, in ``(0, 1)``.
        rate_tol: flat rate as a fraction of the largest change between consecutive saves,
            in ``(0, 1)``.
        min_points: fewest saves of a candidate, ``>= 2``.

    Returns:
        ``Plateaus(start, end, level)``.

    Example:
        >>> import numpy as np, meanfield as mf
        >>> E = np.array([0.2, 0.2, 0.2, 0.5, 0.6, 0.6, 0.6, 0.6])
        >>> p = mf.metastability.plateaus(np.arange(8.0), E)
        >>> p.start.tolist(), p.end.tolist(), p.level.tolist()
        ([0.0, 4.0], [2.0, 7.0], [0.2, 0.6])
    """
    E, min_points = _check_plateau_args(energy, rel_tol, rate_tol, min_points)
    t = _check_times("ts", ts, E.shape[0])
    En = np.asarray(energy, dtype=np.float64)
    # the dtype num_plateaus computes in (float32 at least), in NumPy: no compilation per length
    Ec = np.asarray(E).astype(np.result_type(np.asarray(E).dtype, np.float32))
    group, count = _plateau_rule(Ec, float(rel_tol), float(rate_tol), min_points, np)
    starts, ends, levels = [], [], []
    for g in range(int(count)):
        idx = np.flatnonzero(group == g)
        starts.append(t[idx[0]])
        ends.append(t[idx[-1]])
        levels.append(float(np.median(En[idx])))
    return Plateaus(np.asarray(starts), np.asarray(ends), np.asarray(levels))


def num_plateaus(
    energy: _ArrayLike,
    *,
    rel_tol: RealScalarLike = 0.02,
    rate_tol: RealScalarLike = 0.02,
    min_points: int = 3,
) -> Array:
    """Number of plateaus of ``plateaus`` (same rule); array work, jit- and vmap-compatible.

    Example:
        >>> import numpy as np, meanfield as mf
        >>> int(mf.metastability.num_plateaus(np.array([0.2, 0.2, 0.2, 0.5, 0.6, 0.6, 0.6, 0.6])))
        2
    """
    E, min_points = _check_plateau_args(energy, rel_tol, rate_tol, min_points)
    return _plateau_core(E, rel_tol, rate_tol, min_points)[1]


# --------------------------------------------------------------------------- theory


@dataclasses.dataclass(frozen=True)
class Staircase:
    r"""The staircase prediction (``staircase``).

    Attributes:
        levels: ``(K,)`` plateau levels of $\tilde E$: $\sum_k w_k^2$ before any merge, then after
            each merge, ending at 1.
        jumps: ``(K - 1,)`` $2 w_a w_b$ of each merge.
        pairs: ``(K - 1, 2)`` the merged clusters (indices into ``weights``; the merged cluster
            keeps the smaller index).
        gaps: ``(K - 1,)`` angle between the two clusters when they merge (radians).
        exponents: ``(K - 1,)`` $1 - \cos(\text{gap})$: the merge takes a time
            $\approx e^{\beta (1 - \cos\text{gap})}$ (leading order, ``two_cluster_merge_time``).
        rescaled_times: ``(K,)`` cumulative sums of ``exponents`` from 0: the time axis of dotm's
            ``algo_traj_2`` (its plot of the predicted staircase).
    """

    levels: np.ndarray
    jumps: np.ndarray
    pairs: np.ndarray
    gaps: np.ndarray
    exponents: np.ndarray
    rescaled_times: np.ndarray


def staircase(weights: _ArrayLike, positions: _ArrayLike | None = None) -> Staircase:
    r"""The staircase of energy levels predicted from cluster weights (module docstring).

    Levels: $\tilde E = \sum_k w_k^2$ on a plateau of point clusters with weights $w_k$ (normalised
    to sum 1); merging $a, b$ adds $2 w_a w_b$. Merge order: the closest pair first (the
    two-cluster merge time $e^{\beta (1-\cos\theta)}$ is increasing in $\theta$), the merged
    cluster sitting at the weighted geodesic mean (conserved by the reduced two-cluster ODE),
    as in dotm's ``algo_traj_1``. Without ``positions`` the clusters merge in index order
    (``gaps``, ``exponents`` are then NaN).

    Args:
        weights: ``(K,)`` nonnegative cluster weights (any positive total; normalised here).
        positions: ``(K,)`` angles on the circle, or ``(K, d)`` unit vectors, or ``None``.

    Returns:
        ``Staircase(levels, jumps, pairs, gaps, exponents, rescaled_times)``.

    Example:
        >>> import meanfield as mf
        >>> s = mf.metastability.staircase([1, 1, 2], positions=[0.0, 0.3, 2.0])
        >>> s.levels.tolist(), s.pairs.tolist()
        ([0.375, 0.5, 1.0], [[0, 1], [0, 2]])
    """
    w = _real_np("weights", weights)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights must be a non-empty 1-d array, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be finite, >= 0, with a positive sum, got {w.tolist()}")
    w = w / w.sum()
    K = w.size
    # the K x K angle matrix and its temporaries, once per merge (positions given)
    _check_memory(
        f"staircase of {K} clusters",
        0.0 if positions is None else 40.0 * K * K,
        "merge fewer clusters",
    )
    if positions is None:
        pos = None
    else:
        pos = _real_np("positions", positions)
        if pos.ndim == 1:
            pos = np.stack([np.cos(pos), np.sin(pos)], axis=1)
        if pos.ndim != 2 or pos.shape[0] != K or not np.all(np.isfinite(pos)):
            raise ValueError(
                f"positions must be {K} finite angles or a ({K}, d) array, got shape {np.shape(positions)}"
            )
        pos = pos / np.linalg.norm(pos, axis=1, keepdims=True)
    alive = list(range(K))
    wt = w.copy()
    levels = [float(np.sum(w * w))]
    jumps, pairs, gaps = [], [], []
    while len(alive) > 1:
        if pos is None:
            a, b, gap = alive[0], alive[1], math.nan
        else:
            P = pos[alive]
            ang = np.arccos(np.clip(P @ P.T, -1.0, 1.0)) + np.diag(np.full(len(alive), np.inf))
            i, j = np.unravel_index(np.argmin(ang), ang.shape)
            a, b = sorted((alive[i], alive[j]))
            gap = float(ang[i, j])
            # weighted geodesic mean: slerp from a towards b by w_b / (w_a + w_b)
            f = wt[b] / (wt[a] + wt[b])
            s = math.sin(gap)
            if s > 1e-12:
                m = (math.sin((1 - f) * gap) * pos[a] + math.sin(f * gap) * pos[b]) / s
            else:
                m = pos[a]
            pos[a] = m / np.linalg.norm(m)
        jumps.append(2.0 * wt[a] * wt[b])
        pairs.append((a, b))
        gaps.append(gap)
        wt[a] += wt[b]
        alive.remove(b)
        levels.append(levels[-1] + jumps[-1])
    gaps_a = np.asarray(gaps, dtype=np.float64)
    exps = 1.0 - np.cos(gaps_a)
    return Staircase(
        levels=np.asarray(levels),
        jumps=np.asarray(jumps, dtype=np.float64),
        pairs=np.asarray(pairs, dtype=np.int64).reshape(-1, 2),
        gaps=gaps_a,
        exponents=exps,
        rescaled_times=np.concatenate([[0.0], np.cumsum(exps)]),
    )


def two_cluster_merge_time(
    w1: RealScalarLike,
    w2: RealScalarLike,
    theta: RealScalarLike,
    beta: RealScalarLike,
    *,
    threshold: RealScalarLike = 0.1,
    rescaled: object = True,
    log: object = False,
) -> float:
    r"""Time for two point clusters at angle ``theta`` to come within ``threshold`` (module docstring).

    $T = \frac{1}{w_1 + w_2} \int_{u_c}^{u_0} \frac{e^{\beta u}}{u (2-u)} du$, $u = 1 - \cos\theta$,
    computed as $e^{\beta u_0}$ times an adaptive quadrature (``scipy.integrate.quad`` in
    $s = \log u$, relative tolerance 1e-10) of a bounded integrand, so that the value is
    exact to quadrature error whatever $\beta$ (``log=True`` returns $\log T$, finite where $T$
    overflows). The time is that of the ``rescaled=True`` USA kernel; ``rescaled=False``
    gives the original kernel's time $e^{-\beta} T$. Limit $\beta \to 0$:
    $\frac{1}{w_1 + w_2} \log\frac{\tan(\theta/2)}{\tan(\theta_c/2)}$.

    Args:
        w1, w2: cluster weights (fractions of all particles), ``> 0``.
        theta: initial angle, in ``(threshold, pi)``.
        beta: ``> 0``.
        threshold: the angle counted as merged (the ``clusters`` threshold), in ``(0, theta)``.
        rescaled: time of the rescaled kernel (default) or of the original one.
        log: return $\log T$.

    Example:
        >>> import math, meanfield as mf
        >>> t = mf.metastability.two_cluster_merge_time(0.5, 0.5, 1.0, 1e-9, threshold=0.1)
        >>> round(t, 6) == round(math.log(math.tan(0.5) / math.tan(0.05)), 6)
        True
    """
    from scipy import integrate

    for name, v in (("w1", w1), ("w2", w2), ("beta", beta)):
        check_scalar(name, v)
        check_positive(name, v)
    _check_threshold(threshold)
    rescaled, log = check_flag("rescaled", rescaled), check_flag("log", log)
    check_scalar("theta", theta)
    th, thc, b = float(theta), float(threshold), float(beta)
    if not (thc < th < math.pi):
        raise ValueError(f"theta must lie in (threshold, pi) = ({thc:g}, pi), got {th!r}")
    W = float(w1) + float(w2)
    u0, uc = 1.0 - math.cos(th), 1.0 - math.cos(thc)

    def f(s: float) -> float:
        u = math.exp(s)
        return math.exp(-b * (u0 - u)) / (2.0 - u)

    lo, hi = math.log(uc), math.log(u0)
    # the integrand peaks at the upper end over a width 1/(beta u0) in s: give quad that point
    brk = [max(lo, hi - k / max(b * u0, 1e-300)) for k in (1.0, 10.0, 100.0)]
    brk = sorted({p for p in brk if lo < p < hi})
    val, _ = integrate.quad(f, lo, hi, points=brk or None, epsabs=0.0, epsrel=1e-10, limit=500)
    logT = b * u0 + math.log(val) - math.log(W) - (0.0 if rescaled else b)
    return logT if log else math.exp(logT) if logT < 709.0 else math.inf


def normalized_energy(energy: _ArrayLike, beta: _ArrayLike, *, rescaled: object = True) -> Array:
    r"""$\tilde E = 2 \beta e^{-\beta} E$ of a USA energy (``2 beta E`` for a rescaled kernel),
    in $(0, 1]$: the normalisation of the staircase levels $\sum_k w_k^2$.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0]])
        >>> E = mf.energy(mf.kernels.USA(50.0, rescaled=True), x)
        >>> round(float(mf.metastability.normalized_energy(E, 50.0)), 6)
        1.0
    """
    E, beta = _real_array("energy", energy), _real_array("beta", beta)
    rescaled = check_flag("rescaled", rescaled)
    check_positive("beta", beta)
    return 2.0 * beta * E * (1.0 if rescaled else jnp.exp(-beta))


# --------------------------------------------------------------------------- long runs


def log_time_grid(
    t1: RealScalarLike, num: int = 200, *, t_min: RealScalarLike = 1e-2
) -> np.ndarray:
    """Save grid ``[0, t_min, ..., t1]``: ``0`` then ``num - 1`` log-spaced times (a ``num`` past
    the memory available: ``ResourceLimitError``).

    Example:
        >>> import meanfield as mf
        >>> mf.metastability.log_time_grid(100.0, 4, t_min=1.0).tolist()
        [0.0, 1.0, 10.0, 100.0]
    """
    check_scalar("t1", t1)
    check_positive("t1", t1)
    check_scalar("t_min", t_min)
    check_positive("t_min", t_min)
    num = check_int("num", num, minimum=2)
    if not float(t_min) < float(t1):
        raise ValueError(f"t_min must be < t1 = {float(t1):g}, got {float(t_min):g}")
    _check_memory(f"log_time_grid with num = {num}", 24.0 * num, "use fewer save times")
    return np.concatenate([[0.0], np.geomspace(float(t_min), float(t1), num - 1)])


def simulate_long(
    model: Kernel,
    x0: _ArrayLike,
    aux: _ArrayLike | None = None,
    *,
    rtol: RealScalarLike,
    atol: RealScalarLike,
    t1: RealScalarLike | None = None,
    log_t1: RealScalarLike | None = None,
    ts: _ArrayLike | None = None,
    log_ts: _ArrayLike | None = None,
    num_saves: int = 200,
    t_min: RealScalarLike = 1e-2,
    merge_tol: RealScalarLike | None = None,
    dt0: RealScalarLike = 1e-2,
    max_steps: int = 1_000_000,
    observables: object = None,
    save_states: object = True,
    block_size: object = None,
    backend: str | None = None,
) -> Trajectory:
    r"""Integrate the flow to very long times ($t \sim e^{\beta}$), saving on a logarithmic grid.

    Adaptive Bogacki--Shampine 3(2) steps on the tangent field (projected stages, normalised
    states) with the error control of the module docstring (``rtol``, ``atol`` required, no
    silent defaults), particles within ``merge_tol`` radians merged after each step, steps
    clipped to land on the save times. Memory: the saves (``(T, n, d)`` with ``save_states``,
    else the observables), independent of the number of steps; a save grid whose estimated
    memory exceeds what the machine has available (``num_saves``, ``ts``, ``log_ts``) is refused
    before anything is allocated (``ResourceLimitError``, a ``ValueError``, naming the argument,
    the estimate and the limit).

    Scaled arithmetic (why it reaches $e^{1000}$): the field is the kernel's
    (``USA.scaled_velocity``, the velocity of ``mf.velocity`` in scaled form), evaluated as
    $F = e^{c} G$ with $c = \max_{i \not\sim j} -\beta |x_i - x_j|^2 / 2$ over pairs of different
    merged clusters (so $G = O(1)$ and $F \approx e^{-\beta u}$ is never formed), the step as
    $h = e^{\eta}$, and the increment $h F = e^{\eta + c} G$; the time is carried as
    $\log t$ (compensated sum of $\log(1 + h/t)$). Pairs inside one merged cluster do not
    interact (their pull is radial, projected out): the rounding differences between the copies
    of a cluster would otherwise give a field $\sim 10^{-17}$ that swamps the inter-cluster
    drift $e^{-\beta u}$ once $\beta u \gtrsim 37$ (measured: the former unscaled, unmasked
    integrator stalled there). Time and step live in log space, the state in $[-1, 1]$; only the
    fields of clusters $e^{700}$ times slower than the fastest pair underflow, harmlessly.

    Times beyond the dtype's range ($t > 1.8 \cdot 10^{308}$ in float64, i.e.
    $\beta (1-\cos\theta) \gtrsim 709$; $3 \cdot 10^{38}$ in float32) are given as ``log_t1`` /
    ``log_ts``: ``traj.ts`` is then ``exp`` of them (``inf`` past the range) and the saved
    ``traj.observables["log_t"]`` carries $\log t$ of every save (always present); merges are
    found with ``merge_events((traj.observables["log_t"], traj.xs))`` (times then in log). Use
    ``rescaled=True`` kernels for large $\beta$: the saved energy of a ``rescaled=False`` kernel
    ($\propto e^{\beta}$) overflows past $\beta \approx 709$ in float64 (88 in float32) and the run
    is then flagged ``failed``.

    Validated (tests, ``meanfield reproduce metastability``): first merges of two point
    clusters against ``two_cluster_merge_time`` in $\log T$ for merge exponents
    $\beta (1 - \cos\theta)$ from 20 to 1000 (to within the save grid's log spacing), and a
    staircase of merges at $\beta = 200$ reaching $t \approx e^{\beta}$ with the predicted plateau
    levels; dotm's example ($n = 5$, $\beta = 500..4000$, four merges to $t \approx e^{180}$) in
    the reproduction. float32 states work with ``rtol``, ``atol`` $\gtrsim 10^{-6}$.

    Args:
        model: a kernel with a scaled velocity (``scaled_velocity``, the kernel's field in the
            scaled form above: ``mf.kernels.USA(beta, rescaled=True)``; a kernel without one is
            refused, a ``TypeError``), unmasked, Post-LN.
        x0: ``(n, d)`` unit rows.
        aux: labels (``None``: the model's default).
        rtol, atol: the step's error tolerances (``> 0``).
        t1: final time; or ``log_t1``: its logarithm (exactly one of the two).
        ts: save times in ``[0, t1]``, increasing; or ``log_ts``: their logarithms (``-inf`` for
            ``t = 0``); ``None``: ``log_time_grid(t1, num_saves, t_min=t_min)`` (in log space).
        num_saves, t_min: the default grid.
        merge_tol: merge radius (radians, ``>= 0``; 0 disables merging); ``None``:
            ``max(1e-4, 1000 atol)``. It must be well above ``atol``: an explicit step lets a
            decaying offset between two particles of a cluster hover at the edge of stability (up
            to about ``100 atol``), which caps the step at $O(1)$ unless they are merged.
        dt0: first step.
        max_steps: cap on attempted steps; a run that needs more ends with ``failed`` set and NaN
            saves after its last time.
        observables: dict name -> ``f(x)`` saved at ``ts`` (e.g. ``{"cluster_labels": cluster_labels(0.1)}``;
            ``"log_t"`` is reserved).
        save_states: store ``xs``.
        block_size: row tile of the pair sums (memory ``block x n x d``).
        backend: as in ``mf.simulate`` (applies to the saved energy; the field is the scaled
            pair sum above, evaluated in JAX).

    Returns:
        a ``Trajectory`` (``energy`` in the kernel's normalisation; ``num_steps`` = accepted
        steps; ``stop_time`` = ``exp`` of the final $\log t$; ``observables["log_t"]``).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> th = jnp.array([0.0, 0.0, 0.6])
        >>> x0 = jnp.stack([jnp.cos(th), jnp.sin(th)], 1)
        >>> traj = mf.metastability.simulate_long(mf.kernels.USA(20.0, rescaled=True), x0,
        ...     t1=1e6, rtol=1e-5, atol=1e-7, num_saves=30)
        >>> bool(traj.failed), len(mf.metastability.merge_events(traj, 0.1))
        (False, 1)
    """
    if not callable(getattr(model, "scaled_velocity", None)):
        raise TypeError(
            "simulate_long integrates a kernel that gives its velocity in scaled form (its field "
            f"at t ~ e^beta: mf.kernels.USA.scaled_velocity), got {type(model).__name__}"
        )
    if (t1 is None) == (log_t1 is None):
        raise TypeError(
            "simulate_long takes exactly one of t1 (final time) and log_t1 (its logarithm), "
            f"got t1={t1!r}, log_t1={log_t1!r}"
        )
    if t1 is not None:
        check_scalar("t1", t1)
        check_positive("t1", t1)
        lt1 = math.log(float(t1))
    else:
        check_scalar("log_t1", log_t1)
        lt1 = float(log_t1)  # type: ignore[arg-type]
        if not math.isfinite(lt1):
            raise ValueError(f"log_t1 must be finite, got {lt1!r}")
    for name, v in (("rtol", rtol), ("atol", atol), ("dt0", dt0)):
        check_scalar(name, v)
        check_positive(name, v)
    if merge_tol is None:
        merge_tol = max(1e-4, 1000.0 * float(atol))
    check_scalar("merge_tol", merge_tol)
    if not 0.0 <= float(merge_tol) < math.pi:
        raise ValueError(f"merge_tol must be in [0, pi) radians, got {merge_tol!r}")
    max_steps = check_int("max_steps", max_steps, minimum=1)
    if block_size is not None:
        block_size = check_int("block_size", block_size, minimum=1)
    if ts is not None and log_ts is not None:
        raise TypeError("simulate_long takes at most one of ts and log_ts")
    lmin = -math.inf
    if ts is None and log_ts is None:
        check_scalar("t_min", t_min)
        check_positive("t_min", t_min)
        num_saves = check_int("num_saves", num_saves, minimum=2)
        lmin = math.log(float(t_min))
        if not lmin < lt1:
            raise ValueError(f"t_min must be < t1 = e^{lt1:g}, got {float(t_min):g}")
        num_T, grid_name = num_saves, "num_saves"
    else:
        name = "ts" if ts is not None else "log_ts"
        arr = _real_np(name, ts if ts is not None else log_ts)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(
                f"{name} must be a non-empty 1-d array of save times, got shape {arr.shape}"
            )
        if ts is not None:
            if not np.all(np.isfinite(arr)) or arr.min() < 0:
                raise ValueError(f"ts must be finite and >= 0, got min {arr.min()!r}")
            with np.errstate(divide="ignore"):
                lts_np = np.log(arr)
            ts_out = arr
        else:
            if np.any(np.isnan(arr)) or np.any(arr == np.inf):
                raise ValueError("log_ts must be finite (or -inf for t = 0)")
            lts_np = arr
        if lts_np.max() > lt1 + 1e-12 * max(1.0, abs(lt1)):
            raise ValueError(f"{name} must lie in [0, t1] (t1 = e^{lt1:g}), got a time past t1")
        if np.any(np.diff(lts_np) <= 0):
            raise ValueError(f"{name} must be strictly increasing")
        num_T, grid_name = arr.size, name
    require_post(model, "simulate_long")
    mask = getattr(model, "mask", None)
    if mask is not None:
        raise ValueError(
            f"simulate_long integrates the unmasked flow, got mask={type(mask).__name__} "
            f"({type(model).__name__}.scaled_velocity applies no mask; "
            f"{energy_problem(mask)}); use mf.simulate"
        )
    x0, aux = check_states(model, x0, aux, "x0")
    save_states = check_flag("save_states", save_states)
    if observables is not None and not isinstance(observables, Mapping):
        raise TypeError(
            f"observables must be a dict name -> callable x -> array, got {type(observables).__name__}"
        )
    observables = dict(observables or {})
    for name, fn in observables.items():
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(
                f"observables must map names to callables x -> array, got {name!r}: {fn!r}"
            )
        if name == "log_t":
            raise ValueError("the observable name 'log_t' is reserved (the saved log times)")
    _check_long_memory(x0, observables, num_T, grid_name, bool(save_states), block_size)
    if ts is None and log_ts is None:  # the default grid, allocated once it is known to fit
        lts_np = np.concatenate([[-np.inf], np.linspace(lmin, lt1, num_saves - 1)])
    if ts is None:
        with np.errstate(over="ignore"):
            ts_out = np.exp(lts_np)
    dmax = float(np.finfo(np.dtype(x0.dtype)).max)
    if t1 is not None and (lt1 >= math.log(dmax) or float(t1) >= dmax):
        raise ValueError(
            f"t1 = {float(t1):g} overflows {np.dtype(x0.dtype).name}: use float64 "
            "(jax.enable_x64) or give log_t1"
        )
    model = jax.tree.map(
        lambda leaf: (
            jnp.asarray(leaf)
            if isinstance(leaf, (int, float)) and not isinstance(leaf, bool)
            else leaf
        ),
        model,
    )
    dtype = x0.dtype
    with np.errstate(over="ignore"):
        # saved times past the dtype's range are inf (the log times carry them)
        ts_cast = np.asarray(ts_out, np.float64).astype(np.dtype(dtype))
    backend = _entry_backend(backend)
    return _simulate_long(
        model,
        x0,
        aux,
        jnp.asarray(lts_np, dtype),
        jnp.asarray(ts_cast),
        jnp.asarray(rtol, dtype),
        jnp.asarray(atol, dtype),
        jnp.asarray(merge_tol, dtype),
        jnp.asarray(math.log(float(dt0)), dtype),
        merged=float(merge_tol) > 0,
        max_steps=max_steps,
        observables=tuple(sorted(observables.items())),
        save_states=bool(save_states),
        block_size=block_size,
        backend=backend,
    )


def _check_long_memory(
    x0: Array,
    observables: Mapping[str, Any],
    num_T: int,
    grid_name: str,
    save_states: bool,
    block_size: int | None,
) -> None:
    """Refuse a ``simulate_long`` whose saves do not fit in memory, before anything is allocated.

    Estimate: per save the host grids (``_LONG_GRID_BYTES``) and, twice (the loop's buffers and
    the returned copy), the saved entries (``n d`` states with ``save_states``, energy, collapse
    gap, ``log t``, the observables' sizes from ``jax.eval_shape``) and the two time arrays; plus
    the working set of a step (states and stages, the ``block x n x d`` pair tile).
    """
    n, d = x0.shape
    item = np.dtype(x0.dtype).itemsize
    obs = 0.0
    for fn in observables.values():
        shape = jax.eval_shape(fn, x0).shape
        obs += float(math.prod(shape))
    per_save = (n * d if save_states else 0) + 3.0 + obs
    B = min(n, _LONG_BLOCK if block_size is None else block_size)
    work = item * (12.0 * n * d + 3.0 * B * n * (d + 1))
    need = float(num_T) * (_LONG_GRID_BYTES + 2.0 * item * (per_save + 2.0)) + work
    what = (
        f"simulate_long with num_saves = {num_T}"
        if grid_name == "num_saves"
        else f"simulate_long with {num_T} {grid_name}"
    )
    _check_memory(
        f"{what} (n = {n}, d = {d}, {per_save:.0f} numbers a save)",
        need,
        f"use fewer saves{', save_states=False' if save_states else ''} or a smaller block_size",
    )


def _log_diff(a: Array, b: Array) -> Array:
    """$\\log(e^a - e^b)$ for $a \\ge b$ ($-\\infty$ when equal; ``b = -inf`` gives ``a``)."""
    d = jnp.where(jnp.isfinite(b), b - a, -jnp.inf)
    return a + jnp.log(-jnp.expm1(d))


@eqx.filter_jit
def _simulate_long(
    model: Any,  # a Kernel with scaled_velocity
    x0: Float[Array, "n d"],
    aux: Array | None,
    lts: Float[Array, " T"],
    ts: Float[Array, " T"],
    rtol: Array,
    atol: Array,
    merge_tol: Array,
    log_dt0: Array,
    *,
    merged: bool,
    max_steps: int,
    observables: tuple[tuple[str, Callable[..., Any]], ...],
    save_states: bool,
    block_size: int | None,
    backend: str,
) -> Trajectory:
    n, _ = x0.shape
    dtype = x0.dtype
    T = lts.shape[0]
    ninf = jnp.asarray(-jnp.inf, dtype)

    B = _LONG_BLOCK if block_size is None else block_size

    def f(x: Float[Array, "n d"], lab: Int[Array, " n"]) -> tuple[Array, Float[Array, "n d"]]:
        """``(c, G)`` with ``F = e^c G`` the velocity of the flow, pairs in one merged cluster
        (equal ``lab``) excluded: the kernel's own scaled form (``USA.scaled_velocity``)."""
        return model.scaled_velocity(x, lab, block_size=B)

    def labels_of(x: Float[Array, "n d"]) -> Int[Array, " n"]:
        if not merged:
            return jnp.arange(n)
        return metrics._component_labels(x, merge_tol, block_size=None)

    def snap(x: Float[Array, "n d"]) -> tuple[Float[Array, "n d"], Int[Array, " n"]]:
        """Merged particles replaced by their cluster's normalised mean, and the labels."""
        lab = labels_of(x)
        if not merged:
            return x, lab
        s = jax.ops.segment_sum(x, lab, num_segments=n)
        return sphere.normalize(s[lab]), lab

    def save(x: Float[Array, "n d"], lt: Array) -> dict[str, Array]:
        with _scope_backend(backend):  # a static argument of this program
            energy = model.energy(x, aux, block_size=block_size)
        out = {
            "collapse_gap": metrics.collapse_gap(x),
            "energy": energy,
            "obs:log_t": lt,
        }
        if save_states:
            out["xs"] = x
        for name, fn in observables:
            v = jnp.asarray(fn(x))
            out["obs:" + name] = v if jnp.issubdtype(v.dtype, jnp.inexact) else v.astype(dtype)
        return out

    shapes = jax.eval_shape(save, x0, lts[0])
    buf0 = jax.tree.map(lambda s: jnp.full((T,) + s.shape, jnp.nan, s.dtype), shapes)
    eta_max = lts[-1] + 5.0

    # log t is a compensated (Kahan) sum lt - c of log(1 + h / t): O(1) steps during a merge
    # at t ~ e^40 still add up
    def cond(s: tuple[Any, ...]) -> Array:
        x, lab, lt, c, eta, k, steps, acc, buf, failed = s
        return (k < T) & (steps < max_steps) & ~failed

    def body(s: tuple[Any, ...]) -> tuple[Any, ...]:
        x, lab, lt, c, eta, k, steps, acc, buf, failed = s
        target = lts[jnp.minimum(k, T - 1)]
        due = (lt - c) >= target

        def do_save(_: None) -> tuple[Any, ...]:
            new = save(x, target)
            return (
                x,
                lab,
                lt,
                c,
                eta,
                k + 1,
                steps,
                acc,
                jax.tree.map(lambda b, v: b.at[k].set(v), buf, new),
                failed,
            )

        def do_step(_: None) -> tuple[Any, ...]:
            lrem = _log_diff(target, lt - c)
            es = jnp.minimum(eta, lrem)
            clipped = es < eta
            # merged particles (``lab``: the labels of the last snap) move with their cluster's
            # representative and do not pull on each other: their copies stay bit-identical
            # through the stages

            def g(v: Float[Array, "n d"]) -> tuple[Array, Float[Array, "n d"]]:
                cv, G = f(v[lab] if merged else v, lab)
                return cv, G[lab] if merged else G

            def inc(terms: list[tuple[float, tuple[Array, Array]]]) -> Array | int:
                # h sum_i b_i F_i = sum_i b_i e^{eta + c_i} G_i
                return sum(b * jnp.exp(es + cv) * G for b, (cv, G) in terms)

            k1 = g(x)
            k2 = g(sphere.normalize(x + inc([(0.5, k1)])))
            k3 = g(sphere.normalize(x + inc([(0.75, k2)])))
            y = x + inc([(2.0 / 9.0, k1), (1.0 / 3.0, k2), (4.0 / 9.0, k3)])
            k4 = g(sphere.normalize(y))
            z = x + inc([(7.0 / 24.0, k1), (0.25, k2), (1.0 / 3.0, k3), (0.125, k4)])
            err = jnp.max(jnp.abs(y - z) / (atol + rtol * jnp.abs(y)))
            finite = jnp.all(jnp.isfinite(y)) & jnp.isfinite(err)
            ok = finite & (err <= 1.0)
            fac = jnp.clip(0.9 * jnp.where(err > 0, err, 1e-30) ** (-1.0 / 3.0), 0.2, 5.0)
            lfac = jnp.log(jnp.where(finite, fac, 0.2))
            eta_new = jnp.minimum(
                jnp.where(ok & clipped, jnp.maximum(eta, es + lfac), es + lfac), eta_max
            )
            x_snap, lab_snap = snap(sphere.normalize(y))
            x_new = jnp.where(ok, x_snap, x)
            lab_new = jnp.where(ok, lab_snap, lab)
            # log(t + h) = log t + log1p(h / t), compensated
            lcur = lt - c
            d = jnp.where(jnp.isfinite(lcur), es - lcur, 0.0)
            dl = jnp.maximum(d, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(d)))
            yk = dl - c
            tk = jnp.where(jnp.isfinite(lcur), lt + yk, es)
            ck = jnp.where(jnp.isfinite(lcur), (tk - lt) - yk, 0.0)
            lt_new = jnp.where(ok, jnp.where(clipped, target, tk), lt)
            c_new = jnp.where(ok, jnp.where(clipped, 0.0, ck), c)
            return (
                x_new,
                lab_new,
                lt_new,
                c_new,
                eta_new,
                k,
                steps + 1,
                acc + ok.astype(jnp.int32),
                buf,
                failed,
            )

        return jax.lax.cond(due, do_save, do_step, None)

    s0 = (
        x0,
        labels_of(x0),
        ninf,
        jnp.zeros((), dtype),
        log_dt0,
        jnp.zeros((), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.zeros((), jnp.int32),
        buf0,
        jnp.zeros((), bool),
    )
    x, lab, lt, c, eta, k, steps, acc, buf, failed = jax.lax.while_loop(cond, body, s0)
    failed = failed | (k < T)
    seen = jnp.arange(T) < k
    nonfinite = [
        ~jnp.all(jnp.isfinite(v) | ~seen.reshape((-1,) + (1,) * (v.ndim - 1)))
        for name, v in buf.items()
        if jnp.issubdtype(v.dtype, jnp.inexact) and name != "obs:log_t"
    ]
    for bad in nonfinite:
        failed = failed | bad
    log_t = jnp.where(seen, buf["obs:log_t"], jnp.nan)
    buf["obs:log_t"] = log_t
    return Trajectory(
        ts=ts,
        xs=buf.get("xs"),
        energy=buf["energy"],
        collapse_gap=buf["collapse_gap"],
        observables={name[4:]: v for name, v in buf.items() if name.startswith("obs:")},
        stop_time=jnp.exp(lt - c),
        stopped=jnp.zeros((), bool),
        failed=failed,
        num_steps=acc,
    )
