r"""What a run costs and what this machine allows: one definition for ``meanfield simulate``
and the sweep plan.

``run_cost`` estimates, in plain Python numbers and before anything is allocated, the step
count, the save count, the peak memory and the arithmetic of a simulation of ``n`` particles
in dimension ``d`` (optionally a batch of them run together), counted the way the engine
allocates (``meanfield.integrate.simulate`` and the field evaluations of
``meanfield.kernels``):

* the host step grid of a fixed-step run with a concrete ``dt`` (``integrate._step_grid``):
  $\lfloor t_1 / \mathrm{dt} \rfloor + \text{saves} + 1$ times, held as NumPy arrays and as the compiled
  program's argument (padded to a power of two), ``GRID_BYTES_PER_STEP`` bytes a step in all;
* per system: the ``(n, d)`` state and the Runge--Kutta stage copies ($2\, \text{stages} + 6$
  arrays, as the sweep plan counts them), the per-particle gauge matrices of the gauge
  kernels ($n d^2$), the saved trajectory ($\text{saves} \times n \times d$ states when they are saved,
  one number per scalar observable and save), and the pairwise working set of one field
  evaluation: three $n \times n$ arrays (logits, weights, a select) when the field is dense
  (``n <= kernels.DENSE_MAX`` or ``block_size >= n``; always for ``sa``), otherwise three
  $\text{block} \times 2\, \text{block}$ tiles (four with the distance bias), $O(n)$ for ``toeplitz``; the
  clusters observable adds its own tile (``metrics.num_clusters``).

Arithmetic is counted in floating-point operations: $4 d + 8$ a pair and a field
evaluation (the dot product, the exponential, the weighted sum), times ``stages`` a step,
plus one energy and one clusters pass ($n^2$ pairs) at every save, plus the loop's
overhead of ``STEP_OVERHEAD_FLOP`` a step.

Every quantity is computed with Python integers and floats so that absurd inputs
(``t1 = 1e300``, ``dt = 1e-300``, ``n = 1e20``) give absurd but finite-or-infinite numbers
and never ``OverflowError`` or ``MemoryError``.

``check_cost`` turns an estimate into a decision. The policy:

* more memory than the machine has in total (physical memory, or the cgroup limit when that
  is smaller): refused, and ``force`` does not help (the run would certainly fail);
* more memory than is available now (``MemAvailable``, or the given budget): refused unless
  ``force`` (other processes may free memory; swap may absorb it);
* more arithmetic than ``max_work`` (``WORK_LIMIT`` flop, hours on a laptop CPU): refused
  unless ``force``.

The messages are one line and carry the estimate (``Cost.describe``).

``step_warning`` is the rule "the fixed step is long for the interaction rate": an explicit
step much longer than the time scale of the interaction overshoots, and the energy, which the
exact flow never decreases, then falls along the run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, SupportsFloat, TypeAlias

import numpy as np

from ._machine import _HUGE, ResourceLimitError, format_bytes, machine_memory

__all__ = [
    "Cost",
    "Footprint",
    "POINT_OVERHEAD_BYTES",
    "as_float",
    "ResourceLimitError",
    "WORK_LIMIT",
    "GRID_BYTES_PER_STEP",
    "STEP_OVERHEAD_FLOP",
    "NORMAL_FLOP",
    "STEP_RATIO_LIMIT",
    "machine_memory",
    "run_cost",
    "check_cost",
    "format_bytes",
    "step_ratios",
    "step_warning",
    "step_warning_text",
]

#: Arithmetic bound (floating-point operations) past which a run is refused without ``force``:
#: about 3 hours at 1e11 flop/s (a laptop CPU), minutes on an accelerator.
WORK_LIMIT = 1e15

#: Host bytes per step of a fixed-step grid with a concrete ``dt``: the float64 grid and
#: ``np.union1d``'s copies, and the grid in the state's dtype padded to a power of two (the
#: compiled program's argument, issue 31). Measured: peak RSS grows by 33 bytes a step
#: (``simulate`` at n = 2, 1e6 and 3e6 steps, float32; 583 bytes when the grid was a static
#: tuple of Python floats folded into the program); 48 bounds float64 and a 2x padding.
GRID_BYTES_PER_STEP = 48

#: Arithmetic-equivalent cost of one step whatever ``n`` (the loop's overhead: 10 us a step
#: measured at n = 2 on a 2-core CPU, about 1e6 flop at 1e11 flop/s).
STEP_OVERHEAD_FLOP = 1e6

#: Bytes of one point beyond its arrays (scalars, bookkeeping).
POINT_OVERHEAD_BYTES = 256

#: Arithmetic-equivalent cost of one standard normal of a noise's Brownian path (threefry's bits and
#: the transform: about 25 ns a number measured on a 2-core CPU, whose field runs near 1e9 flop/s a core).
NORMAL_FLOP = 40.0

#: ``dt x rate`` above which ``step_warning`` warns (10x the reference code's rule
#: ``dt <= 0.1 / rate``).
STEP_RATIO_LIMIT = 1.0

_STAGES = {"euler": 1, "rk2": 2, "rk4": 4, "tsit5": 7, "dopri5": 7, "heun": 2}
_FIXED = ("euler", "rk2", "rk4")
_ADAPTIVE_STEPS = 100_000  # simulate's default max_steps for the adaptive solvers

# one number or many: a Python or NumPy number, a sequence of them, a NumPy or JAX array (read
# with ``np.asarray``; this module imports no JAX)
_Numbers: TypeAlias = Any


class Footprint(NamedTuple):
    """What one field evaluation of a model costs beyond its ``(n, d)`` state (``mf.models.Model.footprint``):
    the floats it holds at once (``entries``: weights, tiles, per-particle tables such as gauge
    matrices) and the pair interactions it evaluates (``pairs``; work ``pairs (4 d + 8)`` flop).
    The one input of the cost estimate (``meanfield._resources.run_cost``)."""

    entries: float
    pairs: float


def as_float(v: int | float | np.integer | np.floating) -> float:
    """``float(v)``, ``inf`` for an int beyond the float range (estimates of huge runs are huge, never
    an ``OverflowError``).

    Example:
        >>> as_float(3), as_float(10**400)
        (3.0, inf)
    """
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


@dataclasses.dataclass(frozen=True)
class Cost:
    """Estimated cost of a run (``run_cost``).

    Attributes:
        steps: solver steps (for adaptive solvers the ``max_steps`` bound).
        saves: saved time points.
        bytes: peak memory of the whole batch (host and device together).
        work: floating-point operations of the whole batch.
        batch: systems run together (``bytes`` and ``work`` cover all of them).
        point_bytes: memory of one system (its state, saved outputs and pairwise working set):
            what a sweep's chunks are sized by (``bytes`` adds the shared step grid and 1 MiB).
    """

    steps: int
    saves: int
    bytes: int
    work: float
    batch: int = 1
    point_bytes: int = 0

    def describe(self) -> str:
        """One line, e.g. ``"2e+11 steps, 3 saves, 745 GiB per point, 1.2e+16 flop"``."""
        per = "per point" if self.batch == 1 else f"for {self.batch} points"
        return (
            f"{_fmt_count(self.steps)} steps, {_fmt_count(self.saves)} saves, "
            f"{format_bytes(self.bytes)} {per}, {self.work:.2g} flop"
        )


def _fmt_count(k: int) -> str:
    return str(k) if k < 10**6 else f"{float(min(k, _HUGE)):.2g}"


def _num(name: str, value: object) -> float:
    """A finite-or-infinite real as a Python float (``ValueError`` for NaN and non-numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        v = math.inf
    if math.isnan(v) or v < 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return v


def _as_int(v: float) -> int:
    return int(min(v, _HUGE))


def run_cost(
    *,
    n: object,
    d: object,
    t1: object,
    dt: object,
    saves: object,
    itemsize: int,
    batch: object = 1,
    solver: str = "rk2",
    footprint: Footprint,
    save_states: bool = True,
    observables: int = 3,
    clusters: bool = True,
    step_grid: bool = True,
    max_steps: int | None = None,
    noise: int = 0,
) -> Cost:
    r"""Estimated steps, saves, peak bytes and flop of ``batch`` runs of ``n`` particles in $\mathbb R^d$.

    $\text{steps} = \lfloor t_1 / \mathrm{dt} \rfloor + \text{saves} + 1$ for the fixed-step solvers
    (the grid $k\, \mathrm{dt}$ merged with the save times), ``max_steps`` (default 100000) for the
    adaptive ones;

    $$\text{bytes} = \text{GRID\_BYTES\_PER\_STEP} \cdot \text{steps}\, [\text{step\_grid}]
    + \text{batch}\, \text{point\_bytes} + 1\,\text{MiB},$$

    $$\text{point\_bytes} = \text{itemsize}\, \big((2\, \text{stages} + 6)\, n d + \text{saves}\, (n d\, [\text{save\_states}]
    + \text{observables} + 1) + \max(\text{footprint}, 2.5\, B_c C_c\, [\text{clusters}]) + 3 n\, [\text{clusters}]\big) + 256,$$

    $$\text{work} = \text{batch}\, \big(\text{steps} \cdot \text{stages} \cdot \text{pairs}
    + \text{saves}\, (\text{pairs} + n^2\, [\text{clusters}])\big)\, (4 d + 8)
    + \text{STEP\_OVERHEAD\_FLOP} \cdot \text{steps}$$

    with $\text{pairs}$ and the pairwise working set (``footprint``) from the model's ``footprint``,
    $B_c = \min(n, \text{CLUSTER\_BLOCK})$ and $C_c = \min(n, 2 B_c)$ the tile of the clusters pass;
    $[\cdot]$ is 1 when the option is on, else 0. ``point_bytes`` is what a sweep's chunks are sized by.
    See the module docstring for what each term counts.

    Args:
        n, d: particles and dimension (``>= 0``; huge values give huge estimates).
        t1, dt: final time and step (``dt > 0``; the initial step of an adaptive solver).
        saves: number of save times.
        itemsize: bytes of the floating dtype (4 or 8).
        batch: systems run together (a sweep chunk); the step grid is shared.
        solver: a ``meanfield.integrate.SOLVERS`` name (its stage count).
        footprint: the model's ``footprint(n, d)`` (``mf.models.Model.footprint``): the working set
            and pair count of one field evaluation.
        save_states: whether the ``(saves, n, d)`` states are kept.
        observables: scalar observables per save (collapse gap, energy, clusters: 3).
        clusters: whether ``metrics.num_clusters`` runs at each save.
        step_grid: whether the host materialises the step grid (a concrete ``dt``: yes; a
            traced ``dt``, as in sweeps: no).
        max_steps: the step cap of the adaptive solvers (default 100000).
        noise: the numbers of the noise's Brownian motion at a step (``Noise.control_shape``'s
            size; 0 without noise): one normal each a step (``NORMAL_FLOP``), and a path of at most
            ``_brownian.STORE_LIMIT`` numbers stored whole (``itemsize * steps * noise`` bytes a point).

    Returns:
        ``Cost``; never raises ``OverflowError``/``MemoryError``.

    Example:
        >>> import meanfield as mf
        >>> c = run_cost(n=256, d=3, t1=20.0, dt=0.01, saves=101, itemsize=4, footprint=mf.kernels.USA(1.0).footprint(256, 3))
        >>> c.steps, c.saves, c.bytes < 2**30
        (2102, 101, True)
    """
    nf, df, bf = _num("n", n), _num("d", d), _num("batch", batch)
    t1f, dtf, sf = _num("t1", t1), _num("dt", dt), _num("saves", saves)
    if solver not in _STAGES:
        raise ValueError(f"solver must be one of {', '.join(_STAGES)}, got {solver!r}")
    stages = _STAGES[solver]
    if solver in _FIXED:
        ratio = t1f / dtf if dtf > 0 else math.inf
        steps_f = math.floor(min(ratio, _HUGE) + 1e-9) + sf + 1
    else:
        steps_f = float(max_steps or _ADAPTIVE_STEPS)
        step_grid = False
    steps = _as_int(steps_f)
    b = float(itemsize)
    nd = nf * df
    # pairwise working set of one field evaluation (entries)
    # pairwise working set of one field evaluation (entries) and its pair count: the model's
    pair_entries, pairs = float(footprint.entries), float(footprint.pairs)
    if clusters:  # num_clusters' tiles (CLUSTER_BLOCK rows, twice the columns), at saves: not with the field's
        from .metrics import CLUSTER_BLOCK

        rows = min(nf, float(CLUSTER_BLOCK))
        pair_entries = max(pair_entries, 2.5 * rows * min(nf, 2.0 * rows)) + 3.0 * nf
    state = (2.0 * stages + 6.0) * nd
    traj = sf * ((nd if save_states else 0.0) + observables + 1.0)
    path = 0.0
    if noise and solver in _FIXED and step_grid:  # the grid path's increments, stored when they fit
        from ._brownian import STORE_LIMIT

        grid_steps = math.floor(min(ratio, _HUGE) + 1e-9)  # the path's N (meanfield._brownian)
        path = grid_steps * float(noise) if grid_steps * float(noise) <= STORE_LIMIT else 0.0
    per_point = b * (state + traj + pair_entries + path) + POINT_OVERHEAD_BYTES
    grid = GRID_BYTES_PER_STEP * steps_f if step_grid else 0.0
    total = grid + bf * per_point + 2.0**20
    flop_pair = 4.0 * df + 8.0
    per_save = pairs + (nf * nf if clusters else 0.0)  # the energy, the clusters pass
    work = (
        bf * (steps_f * stages * pairs + sf * per_save) * flop_pair
        + bf * steps_f * float(noise) * NORMAL_FLOP
        + STEP_OVERHEAD_FLOP * steps_f
    )
    return Cost(
        steps=steps,
        saves=_as_int(sf),
        bytes=_as_int(total),
        work=work,
        batch=_as_int(bf),
        point_bytes=_as_int(per_point),
    )


def check_cost(
    cost: Cost,
    *,
    force: bool = False,
    what: str = "run",
    memory: int | None = None,
    total: int | None = None,
    max_work: float | None = None,
    force_hint: str | None = "--force",
) -> None:
    """Refuse a run whose estimate exceeds the limits (one-line ``ResourceLimitError``).

    Memory past ``total`` (default ``machine_memory(total=True)``) is refused even with
    ``force``; memory past ``memory`` (default ``machine_memory()``, what is available now)
    and work past ``max_work`` (default ``WORK_LIMIT``) are refused unless ``force``. Messages name the estimate and,
    where forcing is possible, ``force_hint``.

    Example:
        >>> c = run_cost(n=8, d=3, t1=1e9, dt=1e-2, saves=3, itemsize=4, footprint=Footprint(3 * 64, 64))
        >>> try:
        ...     check_cost(c, what="simulate", memory=2**30, total=2**31)
        ... except ResourceLimitError as e:
        ...     print(str(e)[:35])
        simulate needs ~4.37 TiB of memory
    """
    max_work = WORK_LIMIT if max_work is None else float(max_work)
    hard = machine_memory(total=True) if total is None else int(total)
    soft = machine_memory() if memory is None else int(memory)
    est = cost.describe()
    if cost.bytes > hard:
        raise ResourceLimitError(
            f"{what} needs ~{format_bytes(cost.bytes)} of memory ({est}), more than this machine's "
            f"{format_bytes(hard)} in total; reduce the size, the time span or the saves, or lengthen the step"
        )
    hint = f" (pass {force_hint} to run anyway)" if force_hint else ""
    if cost.bytes > soft and not force:
        raise ResourceLimitError(
            f"{what} needs ~{format_bytes(cost.bytes)} of memory ({est}), more than the "
            f"{format_bytes(soft)} available{hint}"
        )
    if not cost.work <= max_work and not force:
        raise ResourceLimitError(
            f"{what} needs ~{cost.work:.2g} flop ({est}), more than the limit {max_work:.2g} "
            f"(hours on a CPU){hint}"
        )


# ----------------------------------------------------------------------------
# the step rule
# ----------------------------------------------------------------------------


def step_ratios(rates: _Numbers, dt: SupportsFloat, *, solver: str = "rk2") -> np.ndarray:
    """``dt x rate`` for each interaction rate (``Model.interaction_rate()``; zeros for adaptive
    solvers, which choose their own steps).

    Example:
        >>> step_ratios([2.0, 10.0], 0.05).tolist(), step_ratios([10.0], 0.05, solver="tsit5").tolist()
        ([0.1, 0.5], [0.0])
    """
    r = np.asarray(rates, dtype=np.float64)
    if solver not in _FIXED:
        return np.zeros_like(r)
    return np.asarray(float(dt) * r)


def step_warning_text(
    ratios: _Numbers,
    dt: SupportsFloat,
    *,
    dt_name: str = "dt",
    rescaled_hint: str = "rescaled = true",
    what: str = "(shape, beta) pair(s)",
) -> str | None:
    """The warning line for the given ``dt x rate`` values, or ``None`` when none exceeds
    ``STEP_RATIO_LIMIT``.

    Example:
        >>> print(step_warning_text([0.5, 3.0], 0.05))
        warning: dt = 0.05 is long for 1 (shape, beta) pair(s) (dt x rate up to 3 > 1; rate sqrt(beta) e^(beta - 1/2) for exp kernels): fixed explicit steps may overshoot and lose energy; use dt <= 0.0167 or rescaled = true
    """
    r = np.asarray(ratios, dtype=np.float64).ravel()
    over = r > STEP_RATIO_LIMIT
    if not over.any():
        return None
    worst = float(np.max(r[over]))
    count = int(np.sum(over))
    scope = (
        f"for {count} {what}"
        if r.size > 1 or what != "the interaction rate"
        else "for the interaction rate"
    )
    fix = (
        f"{dt_name} <= {float(dt) / worst:.3g} or {rescaled_hint}"
        if math.isfinite(worst)
        else rescaled_hint
    )
    return (
        f"warning: {dt_name} = {float(dt):g} is long {scope} (dt x rate up to {worst:.3g} > "
        f"{STEP_RATIO_LIMIT:g}; rate sqrt(beta) e^(beta - 1/2) for exp kernels): fixed explicit "
        f"steps may overshoot and lose energy; use {fix}"
    )


def step_warning(
    rate: _Numbers,
    dt: SupportsFloat,
    *,
    solver: str = "rk2",
    dt_name: str = "dt",
    rescaled_hint: str = "rescaled = true",
) -> str | None:
    """One warning line when the fixed step ``dt`` is long for the interaction rate ``rate`` (the
    model's ``interaction_rate()``, one value or an array over a grid): ``dt x rate >
    STEP_RATIO_LIMIT``; else ``None``.

    Measured: projected RK2 at ``dt = 0.05``, ``beta = 4``, USA (``dt x rate = 3.3``) loses
    energy; ``simulate --n 32 --beta 10 --t1 0.2`` at ``dt = 0.01`` (``dt x rate = 422``) lets
    the energy fall in 8 of 20 intervals.

    Example:
        >>> import meanfield as mf
        >>> step_warning(mf.kernels.USA(1.0).interaction_rate(), 0.01) is None
        True
        >>> step_warning(mf.kernels.USA(10.0).interaction_rate(), 0.01, dt_name="--dt", rescaled_hint="--rescaled")[:50]
        'warning: --dt = 0.01 is long for the interaction r'
    """
    r = step_ratios(rate, dt, solver=solver)
    what = "the interaction rate" if r.size == 1 else "beta value(s)"
    return step_warning_text(r, dt, dt_name=dt_name, rescaled_hint=rescaled_hint, what=what)
