r"""Fast phase-diagram sweeps of self-attention dynamics (clustering fraction over $(\beta, t)$).

For a grid of $\beta$ and many seeds, run the particle flow on $S^{d-1}$ with
$Q = K = V = I$ by projected Euler steps,

$$x_i \leftarrow \frac{x_i + h P_{x_i} F_i}{\|x_i + h P_{x_i} F_i\|}, \qquad W_{ij} = e^{\beta \langle x_i, x_j\rangle},$$

$$F_i = \frac{\sum_j W_{ij} x_j}{\sum_j W_{ij}} \ \text{(SA, normalised: normalized=True)}, \qquad F_i = \frac1n \sum_j W_{ij} x_j \ \text{(USA)},$$

and record at checkpoint times the clustering fraction

$$c(t) = \frac{\#\{(i, j): i \ne j,\ \langle x_i(t), x_j(t)\rangle > \text{threshold}\}}{n (n - 1)},$$

averaged over seeds. This is the phase diagram of Geshkovski, Letrouit,
Polyanskiy and Rigollet (SA: $dt = 0.1$ to $t = 10$; USA: the reference
code's beta-dependent step $0.1 / \max(\sqrt\beta\, e^{\beta - 1/2}, 1)$ to $t = 0.25$).

The published simulation code (github.com/borjanG/2023-transformers-rotf,
``phase-diagrams.py``, ``simu_xform.step_1``) steps without the tangent projection:

$$x_i \leftarrow \frac{x_i + h F_i}{\|x_i + h F_i\|} \qquad (\texttt{step="renormalize"}),$$

which is the projected step with the effective step $h / (1 + h \langle F_i, x_i\rangle)$: both are
consistent first-order discretisations of the same flow and differ by $O(h^2)$ per step, but
not by rounding (at $n = 32$, $d = 2$, 2048 seeds x 20 $\beta$ the two SA diagrams differ by
up to 0.08 in clustering fraction). ``step="renormalize"`` selects the published update and
``schedule="published"`` its time grid: the step is exactly ``dt`` (SA) or ``usa_step_size``
(USA), the time is accumulated step by step in float64 until it reaches ``t1``, and checkpoint
$k$ records the state after the first step whose accumulated time is $\ge t_k$ (never the
initial state; ``published_checkpoint_steps``). With both, the sweeps give the published
clustering fractions from the same initial particles (tests/test_published_step.py).

Random weights (rotf's ``--randomKQ`` / ``--randomV`` diagrams): ``sa_phase_diagram`` takes the
parameters of ``mf.models.SelfAttention`` with their names and meaning, ``weights`` (the ensemble
of $Q, K$), ``value`` (of $V$), ``heads`` and ``weight_seed`` (``mf.models.random_weights``), and
also ``mask`` (``mf.masks``), ``attention`` and ``sinkhorn_iters``. Each system $s$ of the batch
(seed index $s$) draws its own weights from ``jax.random.fold_in(jax.random.key(weight_seed), s)``
(``system_weights``), the same for every ``beta``, as its initial particles are: rotf's default
``--noanneal 0`` (one draw per system), with common draws across ``beta``; the weights are not
redrawn during a run (rotf's ``--regen_period`` is not implemented here; ``mf.simulate`` of a
``SelfAttention`` with ``regen_period`` is). System $s$ follows the flow of
``SelfAttention(beta, Q[s], K[s], V[s])`` with the step rule ``step`` (``"renormalize"``: the
published ``x + h F``, then normalise), and the clustering fraction counts
$\langle x_i, x_j\rangle > \text{threshold}$ as above. These sweeps step with the engine:
``mf.integrate.FixedStep``, the Euler step of ``mf.simulate`` of system $s$'s model, from $k h$
to $(k + 1) h$ at step $k$ (``backend="auto"`` picks it; ``"native"`` is a ``ValueError``);
identity weights (any number of equal heads), no mask and softmax keep the kernels below.
Conventions (tests/test_phase_diagram_weights.py): rotf's ``BF`` is $Q^\top K$ and its ``V`` acts
on the right of row vectors, so it is the transpose of the $V$ here; ``weights="gaussian"`` and
``"symmetric"`` are rotf's ``--randomKQ 1`` and ``3``; ``value="+qk"``/``"-qk"`` is
$V = \pm Q^\top K / \text{norm}$, rotf's ``--randomV 2``/``3`` for the symmetric ensembles only
(for ``"gaussian"`` rotf's $V$ acts as $\pm (Q^\top K)^\top / \text{norm}$). rotf's
``--randomKQ 2`` and ``--randomV 1`` ($G G^\top / \sqrt d$) have no ensemble here.

Layer-norm placements (``mf.normalization``: Pre-, Mix-, Peri-LN, nGPT, LN-scaling):
``sa_phase_diagram(normalization=, alpha=, switch_time=, r0=)`` steps with the same engine step
(``mf.integrate.FixedStep``: the vector field, solver step and post-step of ``mf.simulate``, not a
copy of their equations), so a scheme, attention kind or step rule registered outside meanfield
runs here too; for the schemes with a radius the state is $x = r\theta$ in $\mathbb R^d$ and the
clustering fraction counts the directions. The identity-weight Post-LN flow (softmax, no mask)
has two faster backends of the same step, the fused C kernel and the fused XLA kernel below
(``_run_one_beta``), whose only difference from the engine's step is the order of operations
(float64: the same fractions, states within 1e-12; tests/test_fixed_step.py); every backend
shares one loop over steps and checkpoints (``_checkpoint_loop``). ``usa_phase_diagram`` is
Post-LN only (its time-rescaled step is the fused backends').

Noise (``mf.noise``; issue 49): ``sa_phase_diagram(solver="rk2", noise="independent", sigma=[...],
noise_seed=0)`` is the diagram over $(\beta, \sigma)$. System $s$ runs ``mf.simulate``'s noisy run of
its model step by step (the Stratonovich Heun step along the grid Brownian path of
``fold_in(jax.random.key(noise_seed), s)``, built once for the run: ``mf.integrate.FixedStep.of(noise=,
key=, t1=)``), the same path for every $\beta$ and $\sigma$, so neighbouring cells differ by their
parameters, not their draws; ``sigma`` is traced (one compilation for the list) and a list returns
an ``xarray.Dataset`` over ``(sigma, beta, time)``. ``sigma = 0`` is the deterministic Heun diagram
(``solver="rk2"`` without noise), to rounding.

Why it is fast (measured in ``benchmarks/``, see BENCHMARKS.md):

* On the CPU (``backend="auto"``, float64 or float32) a sweep runs in a fused C kernel
  (``meanfield._native``, compiled with the system C compiler at first use and cached):
  each step is one pass over the pairs ``i <= j`` that forms ``<x_i, x_j>``, the
  ``n (n + 1) / 2`` exponentials (``W`` is symmetric before the SA row normalisation),
  the row sums, the field and the clustering count together; 8 seeds (float64) or 16
  (float32) sit in the SIMD lanes, the whole time loop of a block of seeds stays in L1
  cache (memory O(n d) per block), and OpenMP threads share the blocks. XLA:CPU splits the same step into several passes over the
  ``(seeds, n, n)`` weights, which at ``n = 32`` cost more than the exponentials. The
  full SA diagram in float64: 0.8-0.85 s native against 3.6-6.5 s for the XLA kernel below
  (0.36-0.37 s in float32); the USA diagram 4.4-4.8 s against 24-25 s (BENCHMARKS.md).
  Without a C compiler (or with ``MEANFIELD_NATIVE=0``), or on accelerators, the sweep
  uses the XLA kernel (``backend="xla"``), which the rest of this list describes.
* Seeds run in chunks (``seed_chunk``; default ``kernels.BATCH_BYTES`` = 8 MiB of
  weight matrices, 1024 seeds at ``n = 32`` in float64) and the whole time loop of a
  chunk runs inside one compiled call. Chunks of 512-1024 seeds let XLA:CPU spread a
  step over both cores of the reference machine (256 seeds ran on one: 34 ms vs 19 ms
  per 100 steps of 256 seeds); 2048 seeds at once spill to memory and run slower.
* The ``(beta, seed chunk)`` tasks are spread over the local devices of the input's
  platform (greedy by step count) and dispatched asynchronously: with one CPU device
  per core (``jax.config.update("jax_num_cpu_devices", 2)`` before first use) two
  256-seed USA tasks run at once (the full USA diagram: 24.4 s on one device, 17.5 s on
  two). One device runs them in order.
* On the CPU the kernel is compiled with ``CPU_COMPILER_OPTIONS``: XLA keeps the
  elementwise work (exp, row sums, metric) in its own fusions and calls YNNPACK for
  the matmuls only (the full SA sweep of BENCHMARKS.md: 2.0-2.5x faster than with the
  default fusion choices).
* ``packed=True``: ``W`` is symmetric before the SA row normalisation, so only
  the ``n (n + 1) / 2`` exponentials of the upper triangle are computed. They
  are stored in the rectangular full packed layout (LAPACK RFP): for ``n = 2k``
  the diagonal blocks ``W_11`` and ``W_22`` share one ``(k + 1) x k`` array
  (``W_11`` in its lower, ``W_22`` in its upper triangle) and ``W_12`` is a
  ``k x k`` block; unpacking is static slicing and selects, no gathers. On
  XLA:CPU at ``n = 32`` the extra passes cost more than the saved exponentials
  (the exponentials are about a third of a step; BENCHMARKS.md), so the default
  is the dense kernel.
* The clustering metric is counted on the weights the step computes anyway
  (``W_ij > e^{beta threshold}``, monotone in ``<x_i, x_j>``), inside the fusion that
  forms them: when (nearly) every step is a checkpoint it is evaluated at every step
  and written to a scratch row otherwise; with sparse checkpoints (USA) it runs under
  ``lax.cond`` at checkpoint steps only. One row of a ``(checkpoints, seeds)`` buffer
  per checkpoint, no per-step select over all checkpoints.
* Weights ``W_ij = exp(beta (<x_i, x_j> - 1)) <= 1`` on every backend: the shifted softmax for SA
  (the row normalisation cancels ``e^beta``, which overflows float32 past ``beta ~ 88``) and the
  time-rescaled formulation with step ``e^beta h`` (the same flow, no overflow) for USA. The
  clustering count masks the diagonal, so a fraction lies in ``[0, 1]`` by construction; a seed
  whose final state is not finite, or (schemes with a radius) one of whose tokens passed through
  the origin, is recorded as NaN (never as "no pair clustered").
* Inputs are checked before anything runs: ``x0`` (shape, a float dtype, finite, unit rows within
  ``_checks.sphere_atol``), the dtype (float32 or float64: the threshold 0.999 is within rounding
  of 1 in 16-bit floats), and the step count (at most ``MAX_STEPS``; for USA the count
  ``t1 / usa_step_size(beta)`` is computed in log space, so ``beta = 1000`` is a ``ValueError``,
  not an overflow).
* Every ``beta`` runs its own
  number of steps in a ``fori_loop`` with a traced trip count, so the large
  steps of small ``beta`` are not padded to the step count of the largest
  ``beta`` (vmapping over ``beta`` would run every point for the longest count).
* One compilation per shape ``(seeds, n, d, dtype, normalized, checkpoints)`` and metric
  mode (every step a checkpoint or not; a USA grid with few-step and many-step betas uses both):
  ``beta``, the step, the step count and the checkpoint indices are traced.

Example:
    >>> import jax
    >>> from meanfield import phase_diagram
    >>> frac = phase_diagram.sa_phase_diagram(
    ...     jax.random.key(0), [0.5, 4.0], n=8, d=2, seeds=4, t1=1.0, checkpoints=3)
    >>> frac.shape
    (2, 3)
"""

from __future__ import annotations

import functools
import inspect
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, ParamSpec, TypeVar, cast, overload

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from . import _native, sphere
from . import normalization as _normalization
from ._brownian import STORE_LIMIT
from ._checks import (
    RealScalarLike,
    check_choice,
    check_int,
    check_positive,
    sphere_atol,
    traced_positive,
)
from ._precision import matmul
from ._spelling import PAIR_WORDS, pair_problem, radius_problem
from .integrate import STEPS, FixedStep, check_r0
from .kernels._exp import BACKENDS, BackendUnavailable, _batch_bytes, check_backend
from .masks import Mask
from .models import SelfAttention, exp_reference_step, random_weights
from .steps import StepRule

if TYPE_CHECKING:  # a list of n returns labelled data; xarray itself is imported only then
    import xarray as xr

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Accepted ``schedule=`` values of the sweeps: ``"uniform"`` (``checkpoint_steps``) or
#: ``"published"`` (the published code's time grid, ``published_checkpoint_steps``).
SCHEDULES = ("uniform", "published")

__all__ = [
    "sa_phase_diagram",
    "usa_phase_diagram",
    "usa_step_size",
    "checkpoint_times",
    "checkpoint_steps",
    "clustering_fraction",
    "euler_step",
    "published_checkpoint_steps",
    "system_weights",
    "PhaseDiagram",
    "STEPS",
    "SCHEDULES",
    "MAX_PUBLISHED_STEPS",
    "MAX_STEPS",
    "BACKENDS",
    "CPU_COMPILER_OPTIONS",
]

#: number of times the sweep kernel has been traced, by shape (used by tests: compile-once proof)
_TRACES: Counter = Counter()


class PhaseDiagram(NamedTuple):
    """Result of a sweep with ``per_seed=True``: ``fraction = per_seed.mean(axis=1)``.

    Attributes:
        times: ``(C,)`` checkpoint times.
        fraction: ``(B, C)`` clustering fraction averaged over seeds.
        per_seed: ``(B, S, C)`` clustering fraction of every seed.
        steps: ``(B,)`` number of Euler steps run for each ``beta``.

    Example:
        >>> import jax
        >>> from meanfield import phase_diagram
        >>> r = phase_diagram.sa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=3, t1=0.5,
        ...                                    checkpoints=2, per_seed=True)
        >>> r.per_seed.shape, r.fraction.shape, r.steps.tolist()
        ((1, 3, 2), (1, 2), [5])
    """

    times: np.ndarray
    fraction: np.ndarray
    per_seed: np.ndarray
    steps: np.ndarray


# ----------------------------------------------------------------------------
# reference single-system formulas (plain, dense): the definitions
# ----------------------------------------------------------------------------


def clustering_fraction(
    x: Float[Array | np.ndarray, "n d"], threshold: RealScalarLike = 0.999
) -> Float[Array, ""]:
    r"""$c = \#\{(i, j): i \ne j,\ \langle x_i, x_j\rangle > \text{threshold}\} / (n (n - 1))$ (dense reference).

    Args:
        x: ``(n, d)`` points on the sphere; threshold: on ``<x_i, x_j>``.

    Returns:
        scalar ``()`` in ``[0, 1]``.

    Example:
        >>> import jax.numpy as jnp
        >>> from meanfield import phase_diagram
        >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
        >>> round(float(phase_diagram.clustering_fraction(x)), 4)  # 2 of 6 ordered pairs
        0.3333
    """
    n = x.shape[0]
    G = matmul(x, x.T)
    off = ~jnp.eye(n, dtype=bool)
    return jnp.sum((G > threshold) & off) / (n * (n - 1))


def euler_step(
    x: Float[Array | np.ndarray, "n d"],
    beta: RealScalarLike,
    h: RealScalarLike,
    *,
    normalized: bool = True,
    step: str | StepRule = "projected",
) -> Float[Array, "n d"]:
    r"""One Euler step $x \leftarrow \operatorname{normalize}(x + h P_x F(x))$ (dense reference, all $n^2$ exponentials).

    $F_i = \sum_j e^{\beta \langle x_i, x_j\rangle} x_j / \sum_j e^{\beta \langle x_i, x_j\rangle}$ (SA) or
    $\frac1n \sum_j e^{\beta \langle x_i, x_j\rangle} x_j$ (USA); $P_x v = v - \langle v, x\rangle x$ per row.
    ``step="renormalize"``: the published code's $x \leftarrow \operatorname{normalize}(x + h F(x))$
    (no projection; the projected step of length $h / (1 + h \langle F_i, x_i\rangle)$ per row).

    Args:
        x: ``(n, d)`` points on ``S^{d-1}``; beta: inverse temperature; h: step.
        normalized: SA (``True``) or USA field.
        step: ``"projected"`` (default) or ``"renormalize"`` (``STEPS``).

    Returns:
        ``(n, d)`` points on ``S^{d-1}``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from meanfield import phase_diagram, sphere
        >>> x = sphere.uniform(jax.random.key(0), 5, 3)
        >>> y = phase_diagram.euler_step(x, 1.0, 0.1)
        >>> y.shape, bool(jnp.allclose(jnp.linalg.norm(y, axis=1), 1.0, atol=1e-5))
        ((5, 3), True)
    """
    tangent = StepRule.coerce(step).tangent
    W = jnp.exp(beta * matmul(x, x.T))
    F = matmul(W, x)
    F = F / jnp.sum(W, axis=1, keepdims=True) if normalized else F / x.shape[0]
    v = F - jnp.sum(F * x, axis=1, keepdims=True) * x if tangent else F
    return sphere.normalize(x + h * v)


def _draw_systems(
    seed: Array, systems: Array, *, d: int, heads: int, weights: str, value: str, dtype: np.dtype
) -> tuple[Array, Array, Array]:
    """``random_weights(fold_in(key(seed), s), ...)`` for every ``s`` of ``systems`` (one program)."""
    key = jax.random.key(seed)

    def draw(s: Array) -> tuple[Array, Array, Array]:
        return random_weights(
            jax.random.fold_in(key, s), d, heads=heads, ensemble=weights, value=value, dtype=dtype
        )

    return jax.vmap(draw)(systems)


_draw_systems_jit = jax.jit(
    _draw_systems, static_argnames=("d", "heads", "weights", "value", "dtype")
)


def system_weights(
    systems: ArrayLike | Sequence[int],
    d: int,
    *,
    heads: int = 1,
    weights: str = "gaussian",
    value: str = "identity",
    weight_seed: int = 0,
    dtype: Any = None,
) -> tuple[Array | None, Array | None, Array | None]:
    r"""The random weights of systems ``systems`` of ``sa_phase_diagram(weights=, value=, ...)``.

    System $s$ (its index among the seeds, ``0 .. seeds - 1``) draws its own weights,
    ``mf.models.random_weights(jax.random.fold_in(jax.random.key(weight_seed), s), d, heads=heads,
    ensemble=weights, value=value)``, the same for every ``beta``. As ``SelfAttention`` uses them
    (``weight_stacks``): ``None`` for an identity factor (``weights="identity"``: $Q$ and $K$;
    ``value="identity"``: $V$), one head as ``(d, d)`` matrices; so system $s$ of the diagram is
    the flow of ``mf.models.SelfAttention(beta, Q[s], K[s], V[s])``.

    Args:
        systems: ``(S,)`` system indices (non-negative integers).
        d: the dimension.
        heads, weights, value, weight_seed: as ``mf.models.SelfAttention`` (``weights`` is
            ``random_weights``' ``ensemble``).
        dtype: float dtype (default: JAX's default float).

    Returns:
        ``(Q, K, V)``, each ``(S, heads, d, d)`` (``(S, d, d)`` for one head) or ``None``.

    Example:
        >>> from meanfield import phase_diagram
        >>> Q, K, V = phase_diagram.system_weights([0, 1, 2], 3, weights="gaussian", value="-qk")
        >>> Q.shape, V.shape
        ((3, 3, 3), (3, 3, 3))
    """
    model = SelfAttention(1.0, heads=heads, weights=weights, value=value, weight_seed=weight_seed)
    systems = np.asarray(systems)
    if systems.ndim != 1 or (
        systems.size and (systems.dtype.kind not in "iu" or systems.min() < 0)
    ):
        raise ValueError(f"systems must be a 1-d array of non-negative integers, got {systems!r}")
    if not model.random:
        return None, None, None
    check_int("d", d, minimum=2)
    dtype = np.dtype(jnp.result_type(float) if dtype is None else dtype)
    Q, K, V = _draw_systems_jit(
        jnp.asarray(weight_seed, jnp.uint32),
        jnp.asarray(systems, jnp.uint32),
        d=d,
        heads=heads,
        weights=weights,
        value=value,
        dtype=dtype,
    )
    qkv = (
        None if weights == "identity" else Q,
        None if weights == "identity" else K,
        None if value == "identity" else V,
    )
    return tuple(M if M is None or heads > 1 else M[:, 0] for M in qkv)  # type: ignore[return-value]


# ----------------------------------------------------------------------------
# step grid
# ----------------------------------------------------------------------------


def usa_step_size(
    beta: ArrayLike | Sequence[float], base_dt: RealScalarLike = 0.1
) -> Array | np.ndarray | np.floating:
    r"""Reference code's USA step $h(\beta) = \text{base\_dt} / \max(\sqrt\beta\, e^{\beta - 1/2}, 1)$.

    Also the sweep engine's ``time.step_rule = "reference"`` (``meanfield.sweep``): the exp kernels'
    ``mf.models.exp_reference_step`` (``mf.kernels.USA(beta).reference_step(base_dt)``). Evaluated as
    $\text{base\_dt}\, e^{-\max(\log(\beta) / 2 + \beta - 1/2,\ 0)}$ (no overflow of $e^\beta$; the
    step underflows to 0 past $\beta \approx 700$ in float64, where no run can reach a positive time).

    Args:
        beta: scalar or array of inverse temperatures ``> 0``; base_dt: step for small ``beta``, ``> 0``.

    Returns:
        NumPy float64 array of the shape of ``beta``; a JAX array (same dtype) when
        ``beta`` is one (e.g. a traced, vmapped ``beta``; a traced ``beta <= 0`` stops the
        program with an error, ``equinox.error_if``).

    Raises:
        ValueError: a concrete ``beta`` or ``base_dt`` that is not ``> 0`` and finite.

    Example:
        >>> from meanfield import phase_diagram
        >>> [round(float(h), 5) for h in phase_diagram.usa_step_size([0.25, 2.0])]
        [0.1, 0.01578]
    """
    check_positive("beta", beta)
    check_positive("base_dt", base_dt)
    if isinstance(beta, jax.Array):
        h = exp_reference_step(beta, base_dt)
        return traced_positive(traced_positive(h, "beta", beta), "base_dt", base_dt)
    return exp_reference_step(np.asarray(beta, dtype=np.float64), float(base_dt))


def checkpoint_times(t1: RealScalarLike, checkpoints: int) -> np.ndarray:
    r"""``checkpoints`` equally spaced times $t_k = k\, t_1 / (\text{checkpoints} - 1)$ (``linspace(0, t1, checkpoints)``).

    Args:
        t1: final time; checkpoints: number of times.

    Returns:
        ``(checkpoints,)`` NumPy array.

    Example:
        >>> from meanfield import phase_diagram
        >>> phase_diagram.checkpoint_times(1.0, 3).tolist()
        [0.0, 0.5, 1.0]
    """
    return np.linspace(0.0, float(t1), int(checkpoints))


#: Most Euler steps of one sweep run (``checkpoint_steps``, ``published_checkpoint_steps``): the step
#: count is a 32-bit trip count in the kernels, and 1e8 steps of a single seed at ``n = 32`` already
#: take minutes; a larger ``t1 / dt`` (e.g. ``t1 = 1e12``, ``dt = 1e-3``) is a ``ValueError``.
MAX_STEPS = 10**8


def checkpoint_steps(
    t1: RealScalarLike, dt: RealScalarLike, checkpoints: int
) -> tuple[int, float, np.ndarray]:
    r"""Step grid of a run to ``t1`` with steps of at most ``dt``.

    Returns ``(N, h, idx)``: $N = \lceil t_1 / dt \rceil$ steps of the uniform step
    $h = t_1 / N$ ($= dt$ when $dt$ divides $t_1$), and for each checkpoint
    time $t_k$ the step index $\operatorname{round}(t_k / h)$ whose state is recorded.

    Args:
        t1: final time; dt: largest allowed step; checkpoints: number of checkpoint times.

    Raises:
        ValueError: ``t1`` or ``dt`` not ``> 0``, or ``t1 / dt > MAX_STEPS``.

    Example:
        >>> from meanfield import phase_diagram
        >>> N, h, idx = phase_diagram.checkpoint_steps(1.0, 0.3, 3)
        >>> N, h, idx.tolist()
        (4, 0.25, [0, 2, 4])
    """
    check_positive("t1", t1)
    check_positive("dt", dt)
    ratio = float(t1) / float(dt)
    if not ratio <= MAX_STEPS:
        raise ValueError(
            f"t1 / dt = {float(t1):g} / {float(dt):g} = {ratio:.3g} steps is more than MAX_STEPS = {MAX_STEPS}: "
            "use a larger dt or a smaller t1"
        )
    N = max(int(np.ceil(ratio - 1e-9)), 1)
    h = float(t1) / N
    idx = np.rint(checkpoint_times(t1, checkpoints) / h).astype(np.int64)
    return N, h, np.clip(idx, 0, N)


#: Most steps ``published_checkpoint_steps`` walks (a guard against a step far below ``t1``): ``MAX_STEPS``.
MAX_PUBLISHED_STEPS = MAX_STEPS


def published_checkpoint_steps(
    t1: RealScalarLike, dt: RealScalarLike, checkpoints: int
) -> tuple[int, float, np.ndarray]:
    r"""Step grid of the published code (``do_single_beta``): steps of exactly ``dt``.

    The time is accumulated in float64, $\tau_j = \operatorname{fl}(\tau_{j-1} + dt)$, $\tau_0 = 0$;
    the run stops after the first step with $\tau_N \ge t_1$, and checkpoint $k$ (times
    ``checkpoint_times(t1, checkpoints)``) records the state after the first step $j \ge 1$ with
    $\tau_j \ge t_k$. Rounding makes $N$ one more than $t_1 / dt$ when the accumulated sum falls
    short (``dt = 0.1``, ``t1 = 10``: $\tau_{100} = 9.99999999999998$, $N = 101$). The published code
    takes its times from ``torch.linspace``, which can differ from NumPy's ``linspace`` in the last
    bit: a checkpoint can then move by one step only where an accumulated time $\tau_j$ lies within
    that bit of $t_k$ (at ``dt = 0.1``, ``t1 = 10``, 200 checkpoints only $t_0$ and $t_{199}$
    are multiples of ``dt``, and both are exact in either).

    Args:
        t1: final time; dt: the step; checkpoints: number of checkpoint times.

    Returns:
        ``(N, dt, idx)`` as ``checkpoint_steps``: step count, step, ``(checkpoints,)`` step indices
        (all ``>= 1``).

    Example:
        >>> from meanfield import phase_diagram
        >>> N, h, idx = phase_diagram.published_checkpoint_steps(10.0, 0.1, 5)
        >>> N, h, idx.tolist()
        (101, 0.1, [1, 25, 51, 76, 101])
    """
    check_positive("t1", t1)
    check_positive("dt", dt)
    check_int("checkpoints", checkpoints, minimum=1)
    t1, dt = float(t1), float(dt)
    if t1 / dt > MAX_PUBLISHED_STEPS:
        raise ValueError(
            f"t1 / dt = {t1 / dt:.3g} steps is more than {MAX_PUBLISHED_STEPS}: use a larger dt or smaller t1"
        )
    times = checkpoint_times(t1, checkpoints)
    idx = np.empty(len(times), np.int64)
    tau, j, k = 0.0, 0, 0
    while True:
        tau += dt  # the published loop: cur_time = s.step_1(cur_time) returns time + eta
        j += 1
        while k < len(times) and tau >= times[k]:
            idx[k] = j
            k += 1
        if tau >= t1:
            break
    return j, dt, idx


# ----------------------------------------------------------------------------
# packed symmetric kernel (RFP layout)
# ----------------------------------------------------------------------------


def _masks(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.arange(k + 1)[:, None]
    c = np.arange(k)[None, :]
    upper = c >= r  # (k+1, k): upper triangle holds W_22, strictly-below holds W_11
    # diagonal entries of W_11 (r == c + 1) and W_22 (r == c) inside the packed array
    diag = (r == c) | (r == c + 1)
    tril = np.tril(np.ones((k, k), bool))
    return upper, diag, tril


def _packed_gram(x: Float[Array, "n d"], k: int) -> tuple[Array, Array]:
    """``T`` ((k+1) x k, RFP of the two diagonal Gram blocks) and ``G12`` (k x k)."""
    upper, _, _ = _masks(k)
    x1, x2 = x[:k], x[k:]
    z = jnp.zeros((1, x.shape[1]), x.dtype)
    a = jnp.concatenate([z, x1])  # row r >= 1 of the lower part pairs x1[r-1] with x1[c]
    b = jnp.concatenate([x2, z])  # row r < k of the upper part pairs x2[r] with x2[c]
    T = jnp.where(upper, matmul(b, x2.T), matmul(a, x1.T))
    return T, matmul(x1, x2.T)


def _packed_count(T: Array, G12: Array, threshold: Array | float, k: int) -> Array:
    """Ordered pairs ``i != j`` with ``<x_i, x_j> > threshold`` (twice the packed strict triangle)."""
    _, diag, _ = _masks(k)
    return 2 * (jnp.sum((T > threshold) & ~diag) + jnp.sum(G12 > threshold))


def _packed_field(
    x: Float[Array, "n d"],
    T: Array,
    G12: Array,
    beta: Array | float,
    shift: Array | float,
    k: int,
    normalized: bool,
) -> Float[Array, "n d"]:
    """Unprojected field from the packed Gram: ``n (n + 1) / 2`` exponentials."""
    _, _, tril = _masks(k)
    E = jnp.exp(beta * T - shift)
    E12 = jnp.exp(beta * G12 - shift)
    B = E[1:]  # lower triangle incl. diagonal: W_11
    C = E[:k]  # upper triangle incl. diagonal: W_22
    W11 = jnp.where(tril, B, B.T)
    W22 = jnp.where(tril.T, C, C.T)
    xo = jnp.concatenate(
        [x, jnp.ones((x.shape[0], 1), x.dtype)], axis=1
    )  # [x | 1]: field and row sums
    xo1, xo2 = xo[:k], xo[k:]
    Fz = jnp.concatenate(
        [matmul(W11, xo1) + matmul(E12, xo2), matmul(E12.T, xo1) + matmul(W22, xo2)]
    )
    F, Z = Fz[:, :-1], Fz[:, -1:]
    return F / Z if normalized else F / x.shape[0]


def _dense_gram(x: Float[Array, "n d"]) -> Float[Array, "n n"]:
    # a matmul: measured faster (CPU time) than a fused sum of d outer products even at d = 2
    return matmul(x, x.T)


def _dense_weights(
    G: Float[Array, "n n"], beta: Array | float, shift: Array | float
) -> Float[Array, "n n"]:
    return jnp.exp(beta * G - shift)


def _weight_count(
    W: Float[Array, "n n"], beta: Array | float, shift: Array | float, threshold: Array | float
) -> Float[Array, ""]:
    """Ordered pairs ``i != j`` with ``<x_i, x_j> > threshold``, counted on the weights
    ``W_ij = exp(beta G_ij - shift) > exp(beta threshold - shift)`` (the same monotone
    rounding chain as ``W``; a pair can differ from ``G_ij > threshold`` only when
    ``beta G_ij`` and ``beta threshold`` round to the same exponential). Reading ``W``
    keeps the count in the fusion that forms the weights (a separate pass over ``G``
    measured 60% of a whole Euler step at ``n = 32``). The diagonal is masked out."""
    c = jnp.exp(beta * threshold - shift)
    # the diagonal is masked, not subtracted: the count lies in [0, n (n - 1)] by construction,
    # whatever the weights (a NaN or an overflowed diagonal used to give a negative fraction)
    off = ~np.eye(W.shape[0], dtype=bool)
    return jnp.sum(jnp.where((W > c) & off, 1.0, 0.0).astype(W.dtype))


def _dense_field_w(
    x: Float[Array, "n d"], W: Float[Array, "n n"], normalized: bool
) -> Float[Array, "n d"]:
    F = matmul(W, x)
    if normalized:
        return F / jnp.sum(W, axis=1)[:, None]
    return F / x.shape[0]


# ----------------------------------------------------------------------------
# the sweep: one beta, a batch of seeds, a traced number of steps
# ----------------------------------------------------------------------------


def _checkpoint_loop(
    state0: Any,
    nsteps: Array,
    ckpt_steps: Array,
    ckpt_pos: Array,
    *,
    systems: int,
    dtype: Any,
    every_step: bool,
    prepare: Callable[[Any], Any],
    fraction: Callable[[Any], Array],
    advance: Callable[[Array, Any, Any], Any],
    split: tuple[Array, Callable[[Array, Any, Any], Any]] | None = None,
) -> tuple[Float[Array, "S C"], Any]:
    """The loop of every sweep: ``nsteps`` steps of a batch of ``systems``, the clustering fraction
    recorded at the checkpoint steps; the backends differ only in their step.

    ``prepare(state)``: what the fraction and the step share (the fused kernel: the weights);
    ``fraction(shared)``: the ``(S,)`` fractions; ``advance(i, state, shared)``: step ``i``.
    ``ckpt_steps``: the distinct checkpoint step indices, sorted, padded with a sentinel to length
    ``C``; ``ckpt_pos``: for each checkpoint its position in ``ckpt_steps``. ``every_step``: nearly
    every step is a checkpoint (the SA setting: 200 checkpoints, 100 steps), so the fraction is
    evaluated unconditionally (fused with what computes it) and written to row ``C``, a scratch
    row, when the step is not a checkpoint; otherwise it runs under ``lax.cond`` at checkpoint
    steps only. ``split = (k, advance_k)``: step ``k`` (a traced int, ``-1``: none) is
    ``advance_k`` (Mix-LN's step over its switch time, ``FixedStep.split``); the loop runs in two
    parts around it, so no step pays for a ``lax.cond``. Returns the ``(S, C)`` fractions and the
    final state.
    """
    C = ckpt_steps.shape[0]

    def record(buf: Array, i: ArrayLike, shared: Any) -> Array:
        slot = jnp.minimum(jnp.searchsorted(ckpt_steps, i), C - 1)
        hit = ckpt_steps[slot] == i
        if every_step:
            return jax.lax.dynamic_update_index_in_dim(
                buf, fraction(shared), jnp.where(hit, slot, C), 0
            )

        def write(b: Array) -> Array:
            return jax.lax.dynamic_update_index_in_dim(b, fraction(shared), slot, 0)

        return jax.lax.cond(hit, write, lambda b: b, buf)

    def stepping(
        advance: Callable[[Array, Any, Any], Any],
    ) -> Callable[[Array, tuple[Any, Array]], tuple[Any, Array]]:
        def body(i: Array, carry: tuple[Any, Array]) -> tuple[Any, Array]:
            state, buf = carry
            shared = prepare(state)
            buf = record(buf, i, shared)
            return advance(i, state, shared), buf

        return body

    body = stepping(advance)
    carry = (state0, jnp.zeros((C + 1, systems), dtype))
    if split is None:
        state, buf = jax.lax.fori_loop(0, nsteps, body, carry)
    else:  # steps [0, k), step k, steps (k, nsteps); k = nsteps when no step is split
        k = jnp.asarray(split[0], jnp.asarray(nsteps).dtype)
        k = jnp.where((k >= 0) & (k < nsteps), k, nsteps)
        carry = jax.lax.fori_loop(0, k, body, carry)
        carry = jax.lax.cond(k < nsteps, lambda c: stepping(split[1])(k, c), lambda c: c, carry)
        state, buf = jax.lax.fori_loop(k + 1, nsteps, body, carry)
    buf = record(buf, nsteps, prepare(state))
    return buf[ckpt_pos].T, state


def _run_one_beta(
    x0: Float[Array, "S n d"],
    beta: Array,
    step: Array,
    nsteps: Array,
    ckpt_steps: Array,
    ckpt_pos: Array,
    threshold: Array,
    *,
    normalized: bool,
    packed: bool,
    every_step: bool,
    project: bool = True,
) -> tuple[Float[Array, "S C"], Float[Array, "S n d"]]:
    """The fused XLA backend of the identity-weight Post-LN step: Euler to ``nsteps`` for every
    seed of ``x0`` (``(S, n, d)``), the fraction at checkpoints (``_checkpoint_loop``) counted on
    the weights the step computes anyway.

    ``step`` is the step in the (time-rescaled, for USA) formulation. Returns the ``(S, C)``
    fractions and the ``(S, n, d)`` final states. ``project``: the tangent projection before the
    step (``step="projected"``); ``False``: the published ``x + h F`` (``step="renormalize"``).
    """
    every_step = every_step and not packed
    _TRACES[
        ("run", x0.shape, str(x0.dtype), normalized, packed, every_step, project, ckpt_pos.shape)
    ] += 1
    S, n, d = x0.shape
    k = n // 2
    dtype = x0.dtype
    # W = exp(beta (G - 1)) <= 1: the shifted softmax for SA (the row normalisation cancels the
    # factor e^beta, which overflows float32 past beta ~ 88), the time-rescaled form for USA
    shift = beta

    def prepare(x: Array) -> Any:
        """What the metric and the field share: the Gram matrix (packed) or ``W`` (dense)."""
        if packed:
            return jax.vmap(lambda xs: _packed_gram(xs, k))(x)
        return jax.vmap(lambda xs: _dense_weights(_dense_gram(xs), beta, shift))(x)

    def count(w: Any) -> Array:
        if packed:
            T, G12 = w
            return _packed_count(T, G12, threshold, k)
        return _weight_count(w, beta, shift, threshold)

    def fieldf(x: Array, w: Any) -> Array:
        if packed:
            T, G12 = w
            return _packed_field(x, T, G12, beta, shift, k, normalized)
        return _dense_field_w(x, w, normalized)

    def fraction(w: Any) -> Array:
        return jax.vmap(count)(w).astype(dtype) / (n * (n - 1))

    def advance(i: Array, x: Array, w: Any) -> Array:
        F = jax.vmap(fieldf)(x, w)
        v = F - jnp.sum(F * x, axis=-1, keepdims=True) * x if project else F
        x = x + step * v
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True))

    return _checkpoint_loop(
        x0,
        nsteps,
        ckpt_steps,
        ckpt_pos,
        systems=S,
        dtype=dtype,
        every_step=every_step,
        prepare=prepare,
        fraction=fraction,
        advance=advance,
    )


class _Systems(eqx.Module):
    """The self-attention of a sweep off the identity fast path: the model every system runs
    (``SelfAttention``'s attention kind, mask, scheme and ``normalized``; its ``beta`` and weights
    are the task's) and the per-system weight stacks (``system_weights``: ``(S, ...)`` arrays or
    ``None``)."""

    model: SelfAttention
    Q: Array | None = None
    K: Array | None = None
    V: Array | None = None
    # the step's solver ("euler", the published step, or "rk2": Heun) and, for noisy diagrams, the
    # noise (its sigma traced), each system's path key (S,), and the grid (t1, h, N) of the path
    solver: str = eqx.field(static=True, default="euler")
    noise: Any = None
    noise_keys: Array | None = None
    grid: tuple[float, float, int] | None = eqx.field(static=True, default=None)

    def system(
        self, beta: Array, Q: Array | None, K: Array | None, V: Array | None
    ) -> SelfAttention:
        """The model of one system: ``self.model`` with inverse temperature ``beta`` and its weights."""
        m = self.model
        return SelfAttention(
            beta,
            Q,
            K,
            V,
            normalized=m.normalized,
            attention=m.attention,
            mask=m.mask,
            normalization=m.normalization,
        )


def _traced_floats(tree: Any, dtype: Any) -> Any:
    """The Python floats of ``tree`` (a scheme's alpha, switch time) as arrays: traced, so that
    one compilation serves every value (an int stays static: a scheme of another package may
    declare one that shapes its program)."""
    return jax.tree.map(
        lambda leaf: jnp.asarray(leaf, dtype) if isinstance(leaf, float) else leaf, tree
    )


@eqx.filter_jit
def _run_one_beta_engine(
    x0: Float[Array, "S n d"],
    systems: _Systems,
    beta: Array,
    step: Array,
    nsteps: Array,
    ckpt_steps: Array,
    ckpt_pos: Array,
    threshold: Array,
    *,
    every_step: bool,
    rule: StepRule,
) -> tuple[Float[Array, "S C"], Float[Array, "S n d"]]:
    r"""The engine's step for every system: ``mf.simulate``'s Euler step (``mf.integrate.FixedStep``)
    of system ``s``'s model ``SelfAttention(beta, Q_s, K_s, V_s, ...)`` (``_Systems``), from
    ``k h`` to ``(k + 1) h`` at step ``k`` (Mix-LN: the step over its switch time is two, as
    simulate steps), the clustering count on the Gram matrix of the directions
    ``<theta_i, theta_j> > threshold`` (the attention weights are not monotone in it). Returns the
    ``(S, C)`` fractions and the ``(S, n, d)`` final directions, NaN for a system that failed (a
    token through or near the origin, a non-finite state: simulate's failures)."""
    _TRACES[
        (
            "attn",
            x0.shape,
            str(x0.dtype),
            type(systems.model.attention).__name__,
            type(systems.model.normalization).__name__,
            type(rule).__name__,
            systems.solver,
            type(systems.noise).__name__,
            systems.grid,
            every_step,
            ckpt_pos.shape,
            tuple(None if M is None else M.shape for M in (systems.Q, systems.K, systems.V)),
        )
    ] += 1
    S, n, _ = x0.shape
    dtype = x0.dtype
    off = ~np.eye(n, dtype=bool)

    weights = (systems.Q, systems.K, systems.V)
    axes = tuple(None if M is None else 0 for M in weights)

    def stepper(
        Q: Array | None, K: Array | None, V: Array | None, key: Array | None = None
    ) -> FixedStep:
        model = systems.system(beta, Q, K, V)
        if systems.noise is None:
            return FixedStep.of(model, x0[0], solver=systems.solver, step=rule, h=step)
        assert systems.grid is not None
        t_end, h, N = systems.grid  # concrete: the noise's grid path of N steps (mf.simulate's)
        # the chunk's paths stored together only when all of them fit (else each step descends its
        # levels: the same numbers, no (S, N, n, d) array)
        numbers = S * N * math.prod(systems.noise.control_shape(*x0.shape[1:]))
        return FixedStep.of(
            model, x0[0], solver=systems.solver, step=rule, h=h, noise=systems.noise, key=key,
            t1=t_end, store=numbers <= STORE_LIMIT,
        )  # fmt: skip

    keys0 = None if systems.noise_keys is None else systems.noise_keys[0]
    q0, k0, v0 = (None if M is None else M[0] for M in weights)
    template = stepper(q0, k0, v0, keys0)  # the static facts

    def fraction(y: Any) -> Array:
        x = jax.vmap(template.directions)(y)
        G = matmul(x, jnp.swapaxes(x, 1, 2))
        count = jnp.sum(jnp.where((G > threshold) & off, 1.0, 0.0).astype(dtype), axis=(1, 2))
        return count / (n * (n - 1))

    steppers = None
    if systems.noise is not None:  # every system's step built once: its Brownian path drawn once
        steppers = eqx.filter_vmap(stepper, in_axes=(*axes, 0))(*weights, systems.noise_keys)

    def advancing(how: Callable[[FixedStep, Array, Any], Any]) -> Callable[[Array, Any, Any], Any]:
        """The step ``i`` of every system, ``how(stepper, i, state)``."""
        if steppers is not None:
            return lambda i, y, _: eqx.filter_vmap(lambda st, ys: how(st, i, ys))(steppers, y)

        def advance(i: Array, y: Any, _: Any) -> Any:
            def one(Q: Array | None, K: Array | None, V: Array | None, ys: Any) -> Any:
                return how(stepper(Q, K, V), i, ys)

            return jax.vmap(one, in_axes=(*axes, 0))(*weights, y)

        return advance

    # Mix-LN: the step over the switch time is two steps (FixedStep.grid), run apart from the loop
    k_split = template.split_index(dtype)
    advance = advancing(FixedStep.whole)
    split = None if k_split is None else (k_split, advancing(FixedStep.split))

    fr, y = _checkpoint_loop(
        jax.vmap(template.init)(x0),
        nsteps,
        ckpt_steps,
        ckpt_pos,
        systems=S,
        dtype=dtype,
        every_step=every_step,
        prepare=lambda y: y,
        fraction=fraction,
        advance=advance,
        split=split,
    )
    failed = jax.vmap(template.failed)(y)
    # a failed system's final state is NaN: _flag_failed records its fractions as NaN
    return fr, jnp.where(failed[:, None, None], jnp.nan, jax.vmap(template.directions)(y))


def _checkpoint_slots(idx: ArrayLike | Sequence[int], C: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct sorted checkpoint steps padded to ``C`` with a sentinel, and each checkpoint's slot."""
    u, pos = np.unique(np.asarray(idx), return_inverse=True)
    pad = np.full(C, np.iinfo(np.int32).max, np.int64)
    pad[: u.size] = u
    return pad, pos


#: XLA:CPU compiler options of the sweep kernel: hand only the matmuls to the YNNPACK
#: library and let XLA fuse the elementwise work (exp, row sums, metric) itself. Measured
#: on the 2-core reference machine (n = 32, d = 2, float64, 1024 seeds x 100 steps):
#: 15.6 ms per 256 seeds with the option, 21 ms with the default fusions; the full SA sweep
#: 3.6 s vs 7.3 s (BENCHMARKS.md).
#: Numbers are unchanged (same operations, same order). Ignored off the CPU, and dropped
#: (once, for the process) if this jaxlib does not know the option.
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}

_STATIC = ("normalized", "packed", "every_step", "project")
_run_one_beta_jit = jax.jit(_run_one_beta, static_argnames=_STATIC)
_run_one_beta_cpu: dict[str, Any] = {
    "fn": jax.jit(_run_one_beta, static_argnames=_STATIC, compiler_options=CPU_COMPILER_OPTIONS)
}


def _run_kernel(x0: Array, /, *args: Any, **static: bool) -> tuple[Array, Array]:
    """The sweep kernel, compiled with ``CPU_COMPILER_OPTIONS`` when ``x0`` lives on a CPU."""
    fn = _run_one_beta_cpu["fn"]
    if fn is None or {d.platform for d in x0.devices()} != {"cpu"}:
        return _run_one_beta_jit(x0, *args, **static)
    try:
        return fn(x0, *args, **static)
    except jax.errors.JaxRuntimeError as e:  # an unknown option in another jaxlib version
        if "xla_cpu_experimental_ynn_fusion_type" not in str(e):
            raise
        _run_one_beta_cpu["fn"] = None
        return _run_one_beta_jit(x0, *args, **static)


def _auto_chunk(n: int, dtype: Any) -> int:
    """Seeds per chunk: ``kernels.BATCH_BYTES`` of weight matrices (1024 at ``n = 32``, float64;
    ``kernels.ACCELERATOR_BATCH_BYTES`` on a GPU/TPU backend)."""
    return max(1, _batch_bytes() // (n * n * np.dtype(dtype).itemsize))


@overload
def _sweep(
    x0: Float[Array | np.ndarray, "S n d"],
    betas: Sequence[float] | np.ndarray,
    steps_h: Sequence[float],
    steps_n: Sequence[int],
    ckpt: Sequence[Any],
    threshold: RealScalarLike,
    normalized: bool,
    packed: bool,
    seed_chunk: int | None,
    states: Literal[False] = False,
    backend: str = "auto",
    step: str | StepRule = "projected",
    systems: _Systems | None = None,
) -> np.ndarray: ...


@overload
def _sweep(
    x0: Float[Array | np.ndarray, "S n d"],
    betas: Sequence[float] | np.ndarray,
    steps_h: Sequence[float],
    steps_n: Sequence[int],
    ckpt: Sequence[Any],
    threshold: RealScalarLike,
    normalized: bool,
    packed: bool,
    seed_chunk: int | None,
    states: Literal[True],
    backend: str = "auto",
    step: str | StepRule = "projected",
    systems: _Systems | None = None,
) -> tuple[np.ndarray, np.ndarray]: ...


def _sweep(
    x0: Float[Array | np.ndarray, "S n d"],
    betas: Sequence[float] | np.ndarray,
    steps_h: Sequence[float],
    steps_n: Sequence[int],
    ckpt: Sequence[Any],
    threshold: RealScalarLike,
    normalized: bool,
    packed: bool,
    seed_chunk: int | None,
    states: bool = False,
    backend: str = "auto",
    step: str | StepRule = "projected",
    systems: _Systems | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Run every ``(beta, seed chunk)`` task; tasks are spread over the local devices of
    ``x0``'s platform (greedy by cost ``N x chunk``, largest first) and dispatched
    asynchronously, so that several devices (e.g. ``jax_num_cpu_devices = 2``: one per
    core) run concurrently; one device runs them in order. The step of every system is the
    engine's (``systems``: the ``SelfAttention`` model of every system, ``_run_one_beta_engine``),
    or, for identity weights, Post-LN, softmax and no mask (``systems=None``), one of its two
    backends: the fused XLA kernel (``_run_one_beta``), or with ``backend`` "native" (resolved
    by ``_resolve_backend``) the fused C kernel (threads over blocks of seeds); ``step``: the
    step rule (``mf.steps``). The caller has refused ``backend="native"`` and ``packed`` with
    ``systems``."""
    x0 = jnp.asarray(x0)
    rule = StepRule.coerce(step)
    project = rule.tangent
    if systems is None and _resolve_backend(backend, x0, packed, project) == "native":
        return _sweep_native(x0, betas, steps_h, steps_n, ckpt, threshold, normalized, states)
    S = x0.shape[0]
    auto = _auto_chunk(x0.shape[1], x0.dtype)
    if systems is not None:  # one (n, n) weight matrix per head
        weights = (systems.Q, systems.K, systems.V)
        heads = max([1] + [M.shape[1] for M in weights if M is not None and M.ndim == 4])
        auto = max(1, auto // heads)
    chunk = min(auto if seed_chunk is None else int(seed_chunk), S)
    dtype = x0.dtype
    platform = next(iter(x0.devices())).platform
    devices = [d for d in jax.local_devices() if d.platform == platform]
    tasks = [(bi, s0) for bi in range(len(betas)) for s0 in range(0, S, chunk)]
    load = {d: 0 for d in devices}
    where = {}
    for t in sorted(tasks, key=lambda t: -int(steps_n[t[0]])):
        dev = min(devices, key=lambda d: load[d])
        where[t] = dev
        load[dev] += int(steps_n[t[0]]) + 1
    out = {}
    for bi, s0 in tasks:
        b, h, N, idx = betas[bi], steps_h[bi], steps_n[bi], ckpt[bi]
        # time-rescaled formulation for USA: exp(beta (G - 1)) with step e^beta h
        h_run = h if normalized or systems is not None else h * float(np.exp(b))
        slots, pos = _checkpoint_slots(idx, len(idx))
        every_step = 2 * np.unique(idx).size > N + 1  # nearly every step is a checkpoint
        xs = x0[s0 : s0 + chunk]
        if xs.shape[0] < chunk:  # keep one shape: pad the last chunk with its first rows
            xs = jnp.concatenate([xs, x0[: chunk - xs.shape[0]]])
        if len(devices) > 1:
            xs = jax.device_put(xs, where[(bi, s0)])
        if systems is not None:
            out[(bi, s0)] = _run_attn_task(
                systems, xs, s0, chunk, b, h_run, N, slots, pos, threshold, every_step, rule
            )
            continue
        out[(bi, s0)] = _run_kernel(
            xs,
            jnp.asarray(b, dtype),
            jnp.asarray(h_run, dtype),
            jnp.asarray(N, jnp.int32),
            jnp.asarray(slots, jnp.int32),
            jnp.asarray(pos, jnp.int32),
            jnp.asarray(threshold, dtype),
            normalized=normalized,
            packed=packed,
            every_step=bool(every_step),
            project=bool(project),
        )
    # gather on the host only after every task is dispatched
    per_seed = np.stack(
        [
            np.concatenate(
                [np.asarray(out[(bi, s0)][0])[: min(chunk, S - s0)] for s0 in range(0, S, chunk)]
            )
            for bi in range(len(betas))
        ]
    )
    finals = np.stack(
        [
            np.concatenate(
                [np.asarray(out[(bi, s0)][1])[: min(chunk, S - s0)] for s0 in range(0, S, chunk)]
            )
            for bi in range(len(betas))
        ]
    )
    per_seed = _flag_failed(per_seed, finals)
    return (per_seed, finals) if states else per_seed


def _run_attn_task(
    systems: _Systems,
    xs: Array,
    s0: int,
    chunk: int,
    beta: float,
    step: float,
    nsteps: int,
    slots: np.ndarray,
    pos: np.ndarray,
    threshold: RealScalarLike,
    every_step: bool,
    rule: StepRule,
) -> tuple[Array, Array]:
    """One ``(beta, seed chunk)`` task of ``_sweep`` with the engine's step: the weights of systems
    ``s0 .. s0 + chunk`` (the last chunk padded with the first systems, as ``xs``)."""
    dtype = xs.dtype
    device = next(iter(xs.devices()))

    def rows(M: Array | None) -> Array | None:
        if M is None:
            return None
        part = M[s0 : s0 + chunk]
        if part.shape[0] < chunk:
            part = jnp.concatenate([part, M[: chunk - part.shape[0]]])
        return jax.device_put(part.astype(dtype), device)

    model = eqx.tree_at(
        lambda m: m.normalization,
        systems.model,
        _traced_floats(systems.model.normalization, dtype),
    )
    keys = systems.noise_keys
    if keys is not None:  # the systems' path keys, padded as the states
        part = keys[s0 : s0 + chunk]
        if part.shape[0] < chunk:
            part = jnp.concatenate([part, keys[: chunk - part.shape[0]]])
        keys = jax.device_put(part, device)
    return _run_one_beta_engine(
        xs,
        _Systems(
            model,
            rows(systems.Q),
            rows(systems.K),
            rows(systems.V),
            solver=systems.solver,
            noise=None if systems.noise is None else _traced_floats(systems.noise, dtype),
            noise_keys=keys,
            grid=systems.grid,
        ),
        jnp.asarray(beta, dtype),
        jnp.asarray(step, dtype),
        jnp.asarray(nsteps, jnp.int32),
        jnp.asarray(slots, jnp.int32),
        jnp.asarray(pos, jnp.int32),
        jnp.asarray(threshold, dtype),
        every_step=bool(every_step),
        rule=rule,
    )


def _flag_failed(per_seed: np.ndarray, finals: np.ndarray) -> np.ndarray:
    """NaN fractions for the seeds whose final state is not finite (a failed run is recorded,
    never counted as 'no pair clustered'): ``per_seed`` ``(B, S, C)``, ``finals`` ``(B, S, n, d)``."""
    bad = ~np.all(np.isfinite(finals), axis=(2, 3))
    if np.any(bad):
        per_seed = np.array(per_seed, copy=True)
        per_seed[bad] = np.nan
    return per_seed


def _sweep_native(
    x0: Float[Array | np.ndarray, "S n d"],
    betas: Sequence[float] | np.ndarray,
    steps_h: Sequence[float],
    steps_n: Sequence[int],
    ckpt: Sequence[Any],
    threshold: RealScalarLike,
    normalized: bool,
    states: bool,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``_sweep`` with the fused C kernel (``meanfield._native``), on the host, in ``x0``'s dtype."""
    xs = np.asarray(x0)
    per_seed = np.empty((len(betas), xs.shape[0], len(ckpt[0])), dtype=xs.dtype)
    finals = []
    for bi, (b, h, N, idx) in enumerate(zip(betas, steps_h, steps_n, ckpt)):
        step = h if normalized else h * float(np.exp(b))  # rescaled time for USA, as the XLA kernel
        shift = float(b)  # weights exp(beta (g - 1)) <= 1, as the XLA kernel
        u, pos = np.unique(np.asarray(idx), return_inverse=True)
        fr, xf = _native.phase_run(
            xs, float(b), shift, float(step), int(N), u, float(threshold), normalized
        )
        per_seed[bi] = fr[:, pos]
        finals.append(xf)
    per_seed = _flag_failed(per_seed, np.stack(finals))
    return (per_seed, np.stack(finals)) if states else per_seed


def _xla_sweep(
    x0: Float[np.ndarray, "S n d"], beta: float, step: float, nsteps: int, threshold: float
) -> Callable[[], object]:
    """One run of the XLA sweep kernel (SA, the fraction at every step, as ``sa_phase_diagram``)
    on ``x0``, as a call that waits for it: what ``_native.phase_crossover`` times the fused
    kernel against."""
    xs = jnp.asarray(x0)
    slots, pos = _checkpoint_slots(np.arange(nsteps + 1), nsteps + 1)
    args = (
        xs,
        jnp.asarray(beta, xs.dtype),
        jnp.asarray(step, xs.dtype),
        jnp.asarray(nsteps, jnp.int32),
        jnp.asarray(slots, jnp.int32),
        jnp.asarray(pos, jnp.int32),
        jnp.asarray(threshold, xs.dtype),
    )
    static = dict(normalized=True, packed=False, every_step=True, project=True)
    return lambda: jax.block_until_ready(_run_kernel(*args, **static))


def _phase_crossover(dtype: np.dtype | str) -> _native.Crossover | None:
    """Where the fused kernel was measured faster than the XLA sweep kernel on this machine, in
    ``dtype`` (``_native.phase_crossover``: read beside the library, else measured once and
    recorded); ``None`` when the kernel is not available."""
    return _native.phase_crossover(np.dtype(dtype).name, _xla_sweep)


def _resolve_backend(
    backend: str, x0: Float[Array, "S n d"], packed: bool, project: bool = True
) -> str:
    """``"native"`` or ``"xla"`` for ``backend`` in ``BACKENDS`` (``mf.kernels.BACKENDS``, the
    option of every entry point; see ``sa_phase_diagram``). ``"auto"``: the fused kernel where it
    takes the states (float32 or float64 on the CPU, ``d <= _native.MAX_D``, not packed, the
    projected step) and was measured faster than the XLA sweep kernel at the states' ``(n, d)``
    on this machine (``_phase_crossover``, ``meanfield info``), else XLA."""
    check_backend(backend)
    if backend == "xla":
        return "xla"
    dtype = np.dtype(x0.dtype)
    on_cpu = {dev.platform for dev in x0.devices()} == {"cpu"}
    fits = dtype.name in _native.DTYPES and not packed and x0.shape[2] <= _native.MAX_D and project
    if backend == "auto":
        if not (on_cpu and fits and _native.phase_library().available):
            return "xla"
        crossover = _phase_crossover(dtype)
        faster = crossover is not None and crossover.prefers_native(x0.shape[1], x0.shape[2])
        return "native" if faster else "xla"
    if not project:
        raise ValueError(
            "backend='native' runs step='projected' only; step='renormalize' (the published "
            "update) runs on backend='xla' (or 'auto', which picks it)"
        )
    if dtype.name not in _native.DTYPES:
        raise ValueError(
            f"backend='native' runs float32 and float64, got dtype {dtype}: use backend='xla'"
        )
    if packed:
        raise ValueError(
            "backend='native' already computes half the exponentials; packed=True is an "
            "XLA layout: use backend='xla' with packed=True"
        )
    if x0.shape[2] > _native.MAX_D:
        raise ValueError(f"backend='native' supports d <= {_native.MAX_D}, got d = {x0.shape[2]}")
    lib = _native.phase_library()
    if not lib.available:
        raise BackendUnavailable(
            f"backend='native': the fused C kernel is not available ({lib.reason}); "
            "use backend='xla' or 'auto'"
        )
    return "native"


def _check_common(
    betas: ArrayLike | Sequence[Any],
    n: int | Sequence[int] | np.ndarray,  # an int here: a list of n is one call per n (_over_n)
    d: int,
    seeds: int,
    threshold: RealScalarLike,
    checkpoints: int,
    x0: ArrayLike | None,
    seed_chunk: int | None = None,
    backend: str = "auto",
    step: str | StepRule = "projected",
    schedule: str = "uniform",
) -> tuple[np.ndarray, int, int, int]:
    StepRule.coerce(step).check(solver="euler")  # the sweeps step with Euler
    check_choice("schedule", schedule, SCHEDULES)
    try:
        betas = np.atleast_1d(np.asarray(betas, dtype=np.float64))
    except (TypeError, ValueError):
        raise TypeError(
            f"betas must be real numbers (a 1-d array of floats), got {betas!r}"
        ) from None
    if betas.ndim != 1 or betas.size == 0:
        raise ValueError(f"betas must be a non-empty 1-d array, got shape {betas.shape}")
    check_positive("betas", betas)
    check_int("checkpoints", checkpoints, minimum=1)
    if seed_chunk is not None:
        check_int("seed_chunk", seed_chunk, minimum=1)
    check_backend(backend)
    if not (-1.0 < float(threshold) < 1.0):
        raise ValueError(f"threshold must lie in (-1, 1), got {threshold!r}")
    if x0 is not None:
        shape = np.shape(x0)
        if len(shape) != 3 or shape[1] < 2 or shape[2] < 2:
            raise ValueError(f"x0 must have shape (seeds, n, d) with n, d >= 2, got {shape}")
        return betas, shape[1], shape[2], shape[0]
    check_int("n", n, minimum=2)
    check_int("d", d, minimum=2)
    check_int("seeds", seeds, minimum=1)
    return betas, cast(int, n), d, seeds


def _state_dtype(dtype: Any, x0: ArrayLike | None) -> np.dtype:
    """The float dtype of the states: ``dtype``, else ``x0``'s, else JAX's default float.

    float16/bfloat16 are refused: the clustering threshold (0.999) lies within a few units of
    rounding of 1 there (spacing 4.9e-4 below 1), so pairs flip in and out of the count by rounding
    alone (the XLA kernel gave fractions of -0.036 at beta = 2)."""
    if dtype is None:
        if x0 is None:
            return np.dtype(jnp.result_type(float))
        dt = getattr(x0, "dtype", None)
        if dt is None:
            dt = np.asarray(x0).dtype
        if np.dtype(dt).kind not in "f" and np.dtype(dt) != jnp.bfloat16:
            raise TypeError(
                f"x0 must be a floating-point (seeds, n, d) array (float32 or float64), got dtype {np.dtype(dt)}; "
                "pass dtype= to convert it"
            )
        out = np.dtype(dt)
    else:
        try:
            out = np.dtype(jnp.dtype(dtype))
        except TypeError:
            raise TypeError(
                f"dtype must be a float dtype (float32 or float64), got {dtype!r}"
            ) from None
    if out.kind != "f" and out != jnp.bfloat16:
        raise TypeError(f"dtype must be a float dtype (float32 or float64), got {out}")
    if out.itemsize < 4:
        raise ValueError(
            f"phase diagrams run in float32 and float64, got dtype {out}: the clustering threshold "
            "is within rounding of 1 in a 16-bit float"
        )
    return out


def _check_x0(x0: ArrayLike, dtype: Any) -> None:
    """Finite unit rows (``_checks.sphere_atol`` of ``dtype``): one ``ValueError`` naming the worst row."""
    own = getattr(x0, "dtype", None)
    own = np.dtype(own) if own is not None else np.asarray(x0).dtype
    if own.kind not in "iuf" and own != jnp.bfloat16:
        raise TypeError(f"x0 must be a real (seeds, n, d) array, got dtype {own}")
    arr = np.asarray(x0, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(
            f"x0 must be finite, got {int(np.sum(~np.isfinite(arr)))} NaN or inf entries"
        )
    atol = sphere_atol(dtype)
    dev = np.abs(np.linalg.norm(arr, axis=-1) - 1.0)
    if dev.size and float(dev.max()) > atol:
        worst = float(np.linalg.norm(arr, axis=-1).ravel()[int(np.argmax(dev))])
        raise ValueError(
            f"x0 must have unit rows (| ||x_i|| - 1 | <= {atol:g} in {np.dtype(dtype).name}), got a row of norm "
            f"{worst:.6g}; normalise it (mf.sphere.normalize)"
        )


def _initial(
    key: Array | None, seeds: int, n: int, d: int, dtype: Any, x0: ArrayLike | None
) -> Float[Array, "S n d"]:
    state_dtype = _state_dtype(dtype, x0)
    if x0 is not None:
        _check_x0(x0, state_dtype)
        return jnp.asarray(x0, dtype) if dtype is not None else jnp.asarray(x0)
    dtype = jnp.result_type(float) if dtype is None else dtype
    if key is None:
        raise ValueError("pass a PRNG key (or the initial states x0)")
    keys = jax.random.split(key, seeds)
    return jax.vmap(lambda k: sphere.uniform(k, n, d, dtype))(keys)


def _check_usa_steps(betas: ArrayLike, t1: RealScalarLike, base_dt: RealScalarLike) -> None:
    """Refuse a ``beta`` whose USA step count ``t1 / usa_step_size(beta)`` exceeds ``MAX_STEPS``
    (computed in log space: the step underflows to 0 in float64 past ``beta ~ 700``)."""
    for b in np.asarray(betas, np.float64):
        log_steps = np.log(float(t1)) - np.log(float(base_dt)) + max(0.5 * np.log(b) + b - 0.5, 0.0)
        if log_steps > np.log(MAX_STEPS):
            raise ValueError(
                f"beta = {b:g} needs t1 / usa_step_size(beta) = 10^{log_steps / np.log(10):.1f} Euler steps (the "
                f"step shrinks like e^-beta), more than MAX_STEPS = {MAX_STEPS}: use a smaller beta or t1"
            )


def _finish(
    times: np.ndarray, per_seed: np.ndarray, steps: Sequence[int], return_per_seed: bool
) -> np.ndarray | PhaseDiagram:
    frac = per_seed.mean(axis=1)
    if return_per_seed:
        return PhaseDiagram(times, frac, per_seed, np.asarray(steps))
    return frac


def _over_sigma(function: Callable[..., Any], sigma: Any, kwargs: dict[str, Any]) -> Any:
    """``function(**kwargs, sigma=s)`` for each ``s`` of the list ``sigma`` (one compilation: sigma
    is traced), labelled over ``(sigma, beta, time)`` (``meanfield._labelled.phase_diagram_dataset``)."""
    from ._labelled import labelled_over

    values = [v for v in np.asarray(sigma, dtype=object).ravel()]
    if not values:
        raise ValueError("sigma must be a number or a non-empty list of numbers, got []")
    return labelled_over(
        function, "sigma", values, kwargs, checkpoint_times(kwargs["t1"], kwargs["checkpoints"])
    )


def _over_n(function: Callable[_P, _R]) -> Callable[_P, _R | xr.Dataset]:
    """The sweep ``function`` taking ``n`` as an int (its result, unchanged) or a list of ints:
    one sweep per ``n`` (the same ``key``, betas and settings), labelled as an ``xarray.Dataset``
    over ``(n, beta, time)`` (``meanfield._labelled.over_n``; xarray imported only then)."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def sweep(*args: _P.args, **kwargs: _P.kwargs) -> _R | xr.Dataset:
        n = kwargs.get("n")
        if not isinstance(n, list | tuple | range | np.ndarray):
            return function(*args, **kwargs)
        from ._labelled import over_n

        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        return over_n(function, n, dict(a), checkpoint_times(a["t1"], a["checkpoints"]))

    return sweep


@_over_n
def sa_phase_diagram(
    key: Array | None,
    betas: ArrayLike | Sequence[Any],
    *,
    n: int | Sequence[int] | np.ndarray = 32,
    d: int = 2,
    seeds: int = 2048,
    dt: RealScalarLike = 0.1,
    t1: RealScalarLike = 10.0,
    checkpoints: int = 200,
    threshold: RealScalarLike = 0.999,
    normalized: bool = True,
    x0: ArrayLike | None = None,
    dtype: Any = None,
    per_seed: bool = False,
    seed_chunk: int | None = None,
    packed: bool = False,
    backend: str = "auto",
    step: str | StepRule = "projected",
    schedule: str = "uniform",
    weights: str = "identity",
    value: str = "identity",
    heads: int = 1,
    weight_seed: int = 0,
    mask: Mask | None = None,
    attention: Any = "softmax",
    sinkhorn_iters: int | None = None,
    normalization: Any = "post",
    alpha: RealScalarLike | None = None,
    switch_time: RealScalarLike | None = None,
    r0: RealScalarLike | None = None,
    solver: str = "euler",
    noise: Any = None,
    sigma: RealScalarLike | Sequence[Any] | np.ndarray | None = None,
    noise_seed: int = 0,
) -> np.ndarray | PhaseDiagram | xr.Dataset:
    r"""Clustering fraction $c(\beta, t_k)$ of the Euler-discretised SA flow, averaged over seeds.

    $x \leftarrow \operatorname{normalize}(x + h P_x F)$, $F_i = \sum_j \operatorname{softmax}_j(\beta \langle x_i, x_j\rangle)\, x_j$
    (``normalized=True``; $\frac1n \sum_j e^{\beta \langle x_i, x_j\rangle} x_j$ otherwise), with
    $N = \lceil t_1 / dt \rceil$ steps of $h = t_1 / N$, and
    $c = \#\{i \ne j: \langle x_i, x_j\rangle > \text{threshold}\} / (n (n - 1))$ at the checkpoint
    times ``linspace(0, t1, checkpoints)`` (state of step $\operatorname{round}(t_k / h)$).
    ``step="renormalize"`` with ``schedule="published"``: the published code's loop (module docstring).

    Args:
        key: PRNG key for the initial states (i.i.d. uniform on ``S^{d-1}``, the
            same for every ``beta``); ignored when ``x0`` is given.
        betas: ``(B,)`` inverse temperatures (``> 0``); traced (one compilation for all).
        n, d, seeds: particles, dimension, number of seeds (ignored when ``x0`` is given).
            ``n`` may be a list of ints: one sweep per ``n`` (the same ``key`` and settings;
            each equal to the call with that ``n``), returned as labelled data (Returns).
        dt, t1, checkpoints, threshold: step bound, final time, number of checkpoints,
            clustering threshold on ``<x_i, x_j>``.
        normalized: SA (softmax rows) or USA (``1/n``) field.
        x0: optional ``(seeds, n, d)`` initial states.
        dtype: float dtype (default: JAX's default float; use float64 under x64).
        per_seed: also return per-seed values (a ``PhaseDiagram``).
        seed_chunk: XLA backend: run the seeds in chunks of this size (one compilation;
            ``None``: automatic, ``kernels.BATCH_BYTES`` of weight matrices per chunk: 1024
            seeds at ``n = 32`` in float64). The native backend runs blocks of 8 (float64)
            or 16 (float32) seeds and ignores it.
        packed: XLA backend: symmetric half-exponential kernel (``n`` even); same iterates
            to rounding.
        backend: ``mf.kernels.BACKENDS``, the option of every entry point. ``"auto"``
            (default): the fused C kernel (``"native"``) where it runs (float64 or float32 states
            on the CPU, ``d <= 64``, ``packed`` off, ``step="projected"``, the kernel built:
            ``meanfield._native.phase_library()``, the system C compiler at first use), which
            is the faster path at every shape measured (BENCHMARKS.md), else ``"xla"``.
            ``"native"``: one pass over the pairs ``i < j`` per step (half the
            exponentials), seeds in SIMD lanes, threads over blocks of seeds (4.5-7.8x the
            XLA kernel on the full SA diagram, 5.3-5.5x on the USA one; BENCHMARKS.md); same iterates as
            ``"xla"`` to rounding (float64: states within ~1e-12 after 100 steps).
            ``"xla"``: the jit-compiled JAX kernel (any dtype and device). ``step="renormalize"``
            runs on ``"xla"`` (``"auto"`` picks it; ``"native"`` is an error).
        step: ``"projected"`` (default, $x + h P_x F$ then normalise) or ``"renormalize"`` (the
            published update $x + h F$ then normalise; ``STEPS``).
        schedule: ``"uniform"`` (default: ``checkpoint_steps``) or ``"published"`` (steps of
            exactly ``dt`` until the float64-accumulated time reaches ``t1``, checkpoint $k$ after
            the first step at or past $t_k$: ``published_checkpoint_steps``; ``SCHEDULES``).
        weights, value, heads, weight_seed: random weights, the names and meaning of
            ``mf.models.SelfAttention`` (``weights``: the ensemble of $Q, K$, ``value``: of $V$,
            ``mf.models.random_weights``); each system (seed index $s$) draws its own, from
            ``fold_in(jax.random.key(weight_seed), s)``, the same for every ``beta``
            (``system_weights``; rotf's ``--noanneal 0``). The field is then
            $F_i = \frac1H \sum_h \sum_j A^h_{ij} V_h x_j$ with
            $A^h_{ij} = \operatorname{softmax}_j(\beta \langle Q_h x_i, K_h x_j\rangle)$ (or
            $\frac1n e^{\beta \langle Q_h x_i, K_h x_j\rangle}$ with ``normalized=False``, not
            time-rescaled), and the clustering fraction counts $\langle x_i, x_j\rangle$ as above.
            ``heads > 1`` with identity ensembles is the identity flow (equal heads).
        mask, attention, sinkhorn_iters: a positional mask (``mf.masks``) and the normalisation
            of the logits, as ``mf.models.SelfAttention`` (``attention="sinkhorn"`` or
            ``"hardmax"`` needs ``normalized=True``): a name or an attention kind
            (``mf.models.Sinkhorn(5)``); ``sinkhorn_iters`` None is the kind's own (21).
            Random weights, a mask or another attention than softmax step with the engine
            (``mf.integrate.FixedStep``, ``SelfAttention``'s field; ``backend="auto"`` picks it;
            ``"native"`` and ``packed`` are a ``ValueError``); identity weights keep the fast
            backends above.
        normalization, alpha, switch_time: the layer-norm placement of
            ``mf.models.SelfAttention`` (``mf.normalization``: ``"post"``, the default and the
            flow above, ``"pre"``, ``"mix"``, ``"peri"``, ``"ngpt"``, ``"scaling"``, or a scheme
            object, ``mf.normalization.NGPT(0.3)``), nGPT's ``alpha`` and Mix-LN's
            ``switch_time`` (None: the scheme's own, 0.2 and 1). Another scheme than ``"post"`` steps
            with the engine (``mf.integrate.FixedStep``), each Euler step being ``mf.simulate``'s
            (``solver="euler"``) of that scheme from $k h$ to $(k + 1) h$ at step $k$: for the schemes
            with a radius (``"pre"``, ``"mix"``, ``"peri"``) the state is $x = r \theta$ in
            $\mathbb R^d$, $x \leftarrow x + h\,$``radial_velocity`` (Mix-LN switches at
            ``switch_time``: the step over it is two, Post-LN up to it and Pre-LN after, the steps
            of ``mf.simulate``, which puts the switch time among its step points), the attention
            and the clustering fraction are computed on the directions $\theta$; a system one of
            whose tokens passes through or near the origin (a step at least as long as the
            token's closest approach to the origin, ``mf.simulate``'s failure ``"token through
            the origin"``) is a failed seed: NaN fractions at every checkpoint. For ``"ngpt"``
            and ``"scaling"`` the projected step of their field, times $1 / \sqrt{t + 1}$ for
            LN-scaling. ``step="renormalize"`` is refused for the schemes with a radius.
        r0: the initial radius of every token (default 1) for the schemes with a radius, as
            ``mf.simulate(r0=)``: finite and within ``mf.integrate.r0_range`` of the states'
            dtype (float32: ``[3.1e-16, 6.4e15]``), else ``ValueError``; refused for the others.
        solver: the step, ``"euler"`` (default: the flow above) or ``"rk2"`` (Heun's step of
            ``mf.simulate``), each the engine's (``mf.integrate.FixedStep``) for ``"rk2"``.
        noise, sigma, noise_seed: noise on the tokens (``mf.noise``): a name (``"independent"``,
            ``"common"``) with its amplitude ``sigma``, or a noise object (its own ``sigma``). System
            $s$ then runs ``mf.simulate(SelfAttention(beta, Q_s, K_s, V_s, ...), x0[s], t1=N h,
            dt=h, solver="rk2", noise=noise, key=fold_in(jax.random.key(noise_seed), s))`` step by
            step (the Stratonovich Heun step along the run's grid Brownian path: the same path for
            every ``beta`` and ``sigma``, so the diagram's differences are the parameters', not the
            draws'); ``solver="rk2"`` is required (``Noise.check``: the Euler step converges to
            another flow), and the noise's refusals apply (schemes with a radius,
            ``step="renormalize"``). ``sigma`` is traced: a list of values is one compilation, and
            returns labelled data over ``(sigma, beta, time)`` (Returns).

    Returns:
        ``(B, checkpoints)`` numpy array (or ``PhaseDiagram`` when ``per_seed``). For a list of
        ``n``: an ``xarray.Dataset`` with coordinates ``n``, ``beta``, ``time`` (the checkpoint
        times) and variable ``fraction`` over ``(n, beta, time)``; with ``per_seed`` also
        ``per_seed`` over ``(n, beta, seed, time)`` and ``steps`` over ``(n, beta)``; the
        settings and versions as attributes (``ds.fraction.sel(n=16)`` is the ``n=16`` call's
        array). ``x0`` fixes ``n`` and takes an int ``n`` only. For a list of ``sigma``: the same
        over ``(sigma, beta, time)`` (``ds.fraction.sel(sigma=0.5)`` is the call with
        ``sigma=0.5``); with a list of ``n`` too, over ``(n, sigma, beta, time)``.

    Example:
        >>> import jax
        >>> from meanfield import phase_diagram
        >>> frac = phase_diagram.sa_phase_diagram(jax.random.key(0), [0.5, 4.0], n=8, seeds=4,
        ...                                       t1=1.0, checkpoints=3)
        >>> frac.shape, float(frac[0, 0])  # i.i.d. uniform start: no pair within threshold
        ((2, 3), 0.0)
        >>> ds = phase_diagram.sa_phase_diagram(jax.random.key(0), [0.5, 4.0], n=[8, 16], seeds=4,
        ...                                     t1=1.0, checkpoints=3)
        >>> dict(ds.fraction.sizes), bool((ds.fraction.sel(n=8).values == frac).all())
        ({'n': 2, 'beta': 2, 'time': 3}, True)
    """
    if isinstance(sigma, list | tuple | range | np.ndarray):
        return _over_sigma(
            sa_phase_diagram,
            sigma,
            {k: v for k, v in locals().items() if k in _SA_ARGUMENTS},
        )
    betas, n, d, seeds = _check_common(
        betas, n, d, seeds, threshold, checkpoints, x0, seed_chunk, backend, step, schedule
    )
    check_positive("dt", dt)
    check_positive("t1", t1)
    check_choice("solver", solver, ("euler", "rk2"))
    from .noise import Noise

    given = isinstance(noise, Noise)  # an instance carries its amplitude (Noise.coerce: not twice)
    problem = pair_problem(
        "noise",
        noise.name if given else noise,
        Noise.names(),
        "sigma",
        noise.sigma if given else sigma,
        is_what=PAIR_WORDS["noise"][1],
        whose=PAIR_WORDS["noise"][2],
        bound=PAIR_WORDS["noise"][3],
        listable=True,
    )
    if problem is not None:
        raise ValueError(problem)
    if noise is not None:
        check_int("noise_seed", noise_seed)
        if not 0 <= int(noise_seed) < 2**32:
            raise ValueError(f"noise_seed must be in [0, 2^32 - 1], got {noise_seed!r}")
    model = SelfAttention(
        1.0,
        normalized=normalized,
        attention=attention,
        sinkhorn_iters=sinkhorn_iters,
        heads=heads,
        weights=weights,
        value=value,
        weight_seed=weight_seed,
        mask=mask,
        normalization=normalization,
        alpha=alpha,
        switch_time=switch_time,
    )  # the checks of SelfAttention's parameters, one behaviour per name
    scheme = model.normalization  # a mf.normalization.Scheme, whatever spelling was given
    radial = scheme.radial
    StepRule.coerce(step).check(scheme=scheme)
    if r0 is not None and not radial:
        raise ValueError(radius_problem(scheme.name, _normalization.radial_names(), ""))
    if r0 is not None:
        check_positive("r0", r0)
    noisy = None
    if noise is not None:  # the noise's own rules (mf.noise.Noise.coerce, .check), as mf.simulate's
        noisy = Noise.coerce(noise, sigma=sigma)
        noisy.check(solver=solver, scheme=scheme, step=StepRule.coerce(step))
    general = (
        model.random
        or mask is not None
        or not model.attention.softmax
        or not scheme.post_ln
        or solver != "euler"
        or noisy is not None
    )
    if general and (backend == "native" or packed):
        what = [
            text
            for text, plain in (
                (f"weights={weights!r}, value={value!r}", not model.random),
                (f"mask={type(mask).__name__}", mask is None),
                (f"attention={model.attention.name!r}", model.attention.softmax),
                (f"normalization={scheme.name!r}", scheme.post_ln),
                (f"solver={solver!r}", solver == "euler"),
                (f"noise={getattr(noisy, 'name', None)!r}", noisy is None),
            )
            if not plain
        ]
        raise ValueError(
            f"{', '.join(what)} run(s) the engine's XLA step (the fused kernels are identity-weight "
            f"Post-LN softmax Euler without mask or noise): use backend='xla' (or 'auto', which "
            f"picks it) and packed=False, got backend={backend!r}, packed={packed}"
        )
    grid = published_checkpoint_steps if schedule == "published" else checkpoint_steps
    N, h, idx = grid(t1, dt, checkpoints)
    x0 = _initial(key, seeds, n, d, dtype, x0)
    if r0 is not None:  # a radius the states' dtype carries (mf.integrate.r0_range)
        check_r0(r0, x0.dtype)
    if packed and n % 2:
        raise ValueError(f"packed=True needs an even n, got n = {n}")
    systems = None
    if general:  # the engine's step, each system its own model
        qkv = system_weights(
            np.arange(x0.shape[0]),
            d,
            heads=heads,
            weights=weights,
            value=value,
            weight_seed=weight_seed,
            dtype=x0.dtype,
        )
        keys = None
        if noisy is not None:  # system s's path: fold_in(key(noise_seed), s)
            root = jax.random.key(int(noise_seed))
            keys = jax.vmap(lambda i: jax.random.fold_in(root, i))(jnp.arange(x0.shape[0]))
        systems = _Systems(
            model,
            *qkv,
            solver=solver,
            noise=None if noisy is None else _traced_floats(noisy, x0.dtype),
            noise_keys=keys,
            grid=None if noisy is None else (float(N * h), float(h), int(N)),
        )
        if r0 is not None:
            x0 = x0 * jnp.asarray(r0, x0.dtype)
    B = len(betas)
    per = _sweep(
        x0,
        betas,
        [h] * B,
        [N] * B,
        [idx] * B,
        threshold,
        normalized,
        packed,
        seed_chunk,
        backend=backend,
        step=step,
        systems=systems,
    )
    return _finish(checkpoint_times(t1, checkpoints), per, [N] * B, per_seed)


#: sa_phase_diagram's parameter names (its arguments as a sigma list's calls pass them on)
_SA_ARGUMENTS = frozenset(inspect.signature(sa_phase_diagram).parameters)


@_over_n
def usa_phase_diagram(
    key: Array | None,
    betas: ArrayLike | Sequence[Any],
    *,
    n: int | Sequence[int] | np.ndarray = 32,
    d: int = 2,
    seeds: int = 256,
    t1: RealScalarLike = 0.25,
    base_dt: RealScalarLike = 0.1,
    checkpoints: int = 200,
    threshold: RealScalarLike = 0.999,
    x0: ArrayLike | None = None,
    dtype: Any = None,
    per_seed: bool = False,
    seed_chunk: int | None = None,
    packed: bool = False,
    backend: str = "auto",
    step: str | StepRule = "projected",
    schedule: str = "uniform",
) -> np.ndarray | PhaseDiagram:
    r"""Clustering fraction of the Euler-discretised USA flow with the beta-dependent step.

    $x \leftarrow \operatorname{normalize}(x + h_\beta P_x F)$, $F_i = \frac1n \sum_j e^{\beta \langle x_i, x_j\rangle} x_j$,
    $h_\beta \le \text{base\_dt} / \max(\sqrt\beta\, e^{\beta - 1/2}, 1)$ (``usa_step_size``): each
    $\beta$ runs its own $N_\beta = \lceil t_1 / h_\beta \rceil$ steps (bucketed by step count, no
    padding to the largest $N$), in the time-rescaled form $e^{\beta (\langle x_i, x_j\rangle - 1)}$
    with step $e^\beta h_\beta$ (the same iterates, no overflow). Checkpoints and
    metric as in ``sa_phase_diagram``; the arguments ``key``, ``betas``, ``n``, ``d``, ``seeds``,
    ``checkpoints``, ``threshold``, ``x0``, ``dtype``, ``per_seed``, ``seed_chunk``, ``packed``,
    ``backend``, ``step`` and ``schedule`` too (``schedule="published"``: steps of exactly
    $h_\beta$ until the accumulated time reaches $t_1$; ``step="renormalize"``: $x + h_\beta F$
    then normalise, the published update, in the rescaled form $x + e^\beta h_\beta F e^{-\beta}$,
    equal to rounding).

    Args:
        t1: final time (default 0.25).
        base_dt: the step for $\beta$ with $\sqrt\beta\, e^{\beta - 1/2} \le 1$ (default 0.1).

    Returns:
        ``(B, checkpoints)`` numpy array (or ``PhaseDiagram`` when ``per_seed``, whose
        ``steps`` holds ``N_beta``); for a list of ``n`` an ``xarray.Dataset`` over
        ``(n, beta, time)``, as ``sa_phase_diagram``.

    Example:
        >>> import jax
        >>> from meanfield import phase_diagram
        >>> phase_diagram.usa_phase_diagram(jax.random.key(0), [0.5, 2.0], n=8, seeds=4,
        ...                                 checkpoints=5).shape
        (2, 5)
    """
    betas, n, d, seeds = _check_common(
        betas, n, d, seeds, threshold, checkpoints, x0, seed_chunk, backend, step, schedule
    )
    check_positive("t1", t1)
    check_positive("base_dt", base_dt)
    _check_usa_steps(betas, t1, base_dt)
    x0 = _initial(key, seeds, n, d, dtype, x0)
    if packed and n % 2:
        raise ValueError(f"packed=True needs an even n, got n = {n}")
    grid = published_checkpoint_steps if schedule == "published" else checkpoint_steps
    grids = [grid(t1, float(usa_step_size(b, base_dt)), checkpoints) for b in betas]
    Ns, hs, idxs = zip(*grids)
    per = _sweep(
        x0,
        betas,
        hs,
        Ns,
        idxs,
        threshold,
        False,
        packed,
        seed_chunk,
        backend=backend,
        step=step,
    )
    return _finish(checkpoint_times(t1, checkpoints), per, Ns, per_seed)
