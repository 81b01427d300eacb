r"""Past $O(n^2)$: the random-batch integrator (Jin, Li and Liu 2020) and the mean-field limit.

Random-batch field (``mode="batch"``, the RBM-1 of Jin--Li--Liu): every step the tokens are
split by a uniformly random permutation into $n / p$ batches of $p$ tokens and each token
only interacts inside its batch $B(i)$:

$$\hat F_i = \frac1n g(z_i, z_i) + \frac{n - 1}{n (p - 1)} \sum_{j \in B(i),\, j \ne i} g(z_i, z_j),$$

$g = \nabla_x h$. A given $j \ne i$ shares the batch of $i$ with probability
$(p - 1)/(n - 1)$, so $E \hat F_i = F_i$ (unbiased) and the cost is $O(n p d)$.
``mode="sample"``: $p$ partners drawn i.i.d. uniformly (with replacement, self included),
$\hat F_i = \frac1p \sum_k g(z_i, z_{J_{ik}})$, also unbiased; $p$ need not divide $n$.

The integrator is the engine's step (``mf.integrate.FixedStep``): projected Heun (``mf.simulate``'s
``rk2``) of the random-batch field with the batch frozen during a step (both stages use the same
batches), renormalised after each step.

Mean-field convergence (USA-AV Prop. 4, App. D.4, Dobrushin): ``meanfield_distances`` runs
$n$ and $2n$ tokens from independent samples of one initial law and measures the MMD of
their empirical laws at fixed times; ``fit_rate`` fits the exponent (theory $-1/2$).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from . import metrics, sphere
from ._checks import RealScalarLike, check_choice, check_int, check_positive
from ._machine import check_memory as _check_memory
from ._precision import einsum
from .energy import resolve_aux
from .integrate import FixedStep
from .kernels import USA, GaugeKernel, Kernel
from .normalization import require_post

__all__ = [
    "random_batch_field",
    "field_errors",
    "simulate_random_batch",
    "RandomBatchRun",
    "meanfield_distances",
    "fit_rate",
    "MODES",
]

#: Accepted ``mode=`` values: a random partition into batches or i.i.d. partners.
MODES = ("batch", "sample")


def _field_bytes(n: int, d: int, p: int, itemsize: int) -> float:
    """Peak bytes of one random-batch field: the ``(n, p)`` partners or batch weights and the
    ``(n, p, d)`` pair terms with their temporaries (about three copies)."""
    return 3.0 * float(n) * float(p) * (float(d) * itemsize + 8.0) + 8.0 * n * d * itemsize


def _check_p(n: int, p: Any, mode: str) -> int:
    check_choice("mode", mode, MODES)
    p = check_int("p", p, minimum=1 if mode == "sample" else 2)
    if mode == "batch":
        if p > n or n % p:
            raise ValueError(
                f"mode='batch' needs a batch size p in [2, n] dividing n = {n}, got p = {p}; "
                f"use mode='sample' for any p"
            )
    return p


# the USA frame of a kernel (``_frame``): the states in it, the map of a field back, the USA
_Frame: TypeAlias = (
    tuple[Float[Array, "n d"], Callable[[Float[Array, "n d"]], Float[Array, "n d"]], USA]
    | tuple[None, None, None]
)


def _frame(kernel: Kernel, x: Float[Array, "n d"], aux: Array) -> _Frame:
    """(y, back): the gauge frame of exp-gauge kernels (USA there), identity otherwise."""
    if isinstance(kernel, GaugeKernel):
        P = kernel.gauge_matrices(aux, x.shape[-1]).astype(x.dtype)
        y = einsum("nij,nj->ni", P, x)
        return y, lambda F: einsum("nji,nj->ni", P, F), kernel.usa()
    if isinstance(kernel, USA):
        return x, lambda F: F, kernel
    return None, None, None


def _pair_grads_exp(
    usa: USA, yi: Float[Array, "... d"], yj: Float[Array, "... d"]
) -> Float[Array, "... d"]:
    """``exp(beta <y_i, y_j>) y_j`` broadcast over leading axes (USA, shift included)."""
    dot = jnp.sum(yi * yj, axis=-1)
    return usa._exp(dot)[..., None] * yj


def random_batch_field(
    kernel: Kernel,
    x: ArrayLike,
    aux: Any = None,
    *,
    key: PRNGKeyArray,
    p: Any,
    mode: str = "batch",
) -> Float[Array, "n d"]:
    r"""Unbiased random-batch estimate $\hat F$ of the mean field $F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$.

    Args:
        kernel: a kernel from ``mf.kernels`` (USA and exp-gauge kernels use the gauge frame;
            others the single-pair ``grad_x``).
        x: ``(n, d)`` unit rows. aux: labels (default as ``mf.field``).
        key: PRNG key of this draw.
        p: batch size (``mode="batch"``: ``2 <= p <= n``, ``p | n``) or partners (``"sample"``).
        mode: ``"batch"`` (random partition, Jin--Li--Liu) or ``"sample"`` (i.i.d. partners).

    Returns:
        ``(n, d)``; ``E F^ = F``; cost ``O(n p d)`` (memory ``O(n p d)``: a ``p`` past the memory
        available is refused before allocating, ``ResourceLimitError``, a ``ValueError``).

    Example:
        >>> import jax, meanfield as mf
        >>> from meanfield.random_batch import random_batch_field
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> random_batch_field(mf.kernels.USA(1.0), x, key=jax.random.key(1), p=4).shape
        (8, 3)
    """
    require_post(kernel, "random_batch_field")
    aux = resolve_aux(kernel, x, aux)
    x = jnp.asarray(x)
    p = _check_p(x.shape[0], p, mode)
    kernel.check_config(x, aux)
    n, d = x.shape
    _check_memory(
        f"random_batch_field with p = {p} (n = {n}, d = {d})",
        _field_bytes(n, d, p, x.dtype.itemsize),
        "use a smaller p",
    )
    return _rb_field(kernel, x, aux, key, p, mode)


def _rb_field(
    kernel: Kernel,
    x: Float[Array, "n d"],
    aux: Array,
    key: PRNGKeyArray,
    p: int,
    mode: str,
) -> Float[Array, "n d"]:
    n, d = x.shape
    y, back, usa = _frame(kernel, x, aux)
    if mode == "sample":
        J = jax.random.randint(key, (n, p), 0, n)
        if usa is not None:
            assert y is not None and back is not None  # the frame of a USA
            g = _pair_grads_exp(usa, y[:, None, :], y[J])  # (n, p, d)
            return back(jnp.mean(g, axis=1))
        g = jax.vmap(
            lambda xi, ai, js: jax.vmap(kernel.grad_x, (None, None, 0, 0))(xi, ai, x[js], aux[js])
        )(x, aux, J)
        return jnp.mean(g, axis=1)
    perm = jax.random.permutation(key, n)
    G = n // p
    idx = perm.reshape(G, p)
    w_self = 1.0 / n
    w_other = (n - 1) / (n * (p - 1))
    off = 1.0 - jnp.eye(p, dtype=x.dtype)
    if usa is not None:
        assert y is not None and back is not None  # the frame of a USA
        yb = y[idx]  # (G, p, d)
        dots = einsum("gid,gjd->gij", yb, yb)
        W = usa._exp(dots)
        W = W * (w_other * off + w_self * jnp.eye(p, dtype=x.dtype))
        Fb = einsum("gij,gjd->gid", W, yb)
        F = jnp.zeros_like(y).at[idx.reshape(-1)].set(Fb.reshape(n, d))
        return back(F)
    xb, ab = x[idx], aux[idx]
    pair = jax.vmap(
        jax.vmap(kernel.grad_x, (None, None, 0, 0)), (0, 0, None, None)
    )  # (p, p, d) per batch
    g = jax.vmap(pair)(xb, ab, xb, ab)
    wts = w_other * off + w_self * jnp.eye(p, dtype=x.dtype)
    Fb = einsum("ij,gijd->gid", wts, g)
    return jnp.zeros_like(x).at[idx.reshape(-1)].set(Fb.reshape(n, d))


_rb_field_jit = jax.jit(_rb_field, static_argnames=("p", "mode"))


def field_errors(
    kernel: Kernel,
    x: ArrayLike,
    aux: Any = None,
    *,
    key: PRNGKeyArray,
    ps: object,
    num_draws: object = 8,
    mode: str = "batch",
) -> np.ndarray:
    r"""Relative field error $\|\hat F - F\|_F / \|F\|_F$ for each $p$ in ``ps`` and each draw.

    For ``mode="sample"`` the mean-square error is exactly $\operatorname{tr} \operatorname{Cov}(g(z_i, z_J)) / p$ per token,
    so the relative error decays like $p^{-1/2}$; for ``"batch"`` with the finite-population
    factor $(n - p) / (n - 1)$, also $\sim p^{-1/2}$ for $p \ll n$.

    Args:
        kernel: a ``Kernel``.
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels (default ``kernel.default_aux(n)``).
        key: a ``jax.random`` key.
        ps: batch sizes (each dividing ``n`` for ``mode="batch"``).
        num_draws: random batches per ``p`` (drawn together: ``num_draws`` fields of memory
            ``O(n p d)`` at once; past the memory available, ``ResourceLimitError``).
        mode: ``"batch"`` (random partition) or ``"sample"`` (with replacement).

    Returns:
        numpy array ``(len(ps), num_draws)``.

    Example:
        >>> import jax, meanfield as mf
        >>> from meanfield.random_batch import field_errors
        >>> x = mf.sphere.uniform(jax.random.key(0), 16, 3)
        >>> e = field_errors(mf.kernels.USA(1.0), x, key=jax.random.key(1), ps=[2, 8], num_draws=4)
        >>> e.shape, bool(e[1].mean() < e[0].mean())
        ((2, 4), True)
    """
    aux = resolve_aux(kernel, x, aux)
    x = jnp.asarray(x)
    num_draws = check_int("num_draws", num_draws, minimum=1)
    if isinstance(ps, (str, bytes)) or not isinstance(ps, Collection):
        raise TypeError(f"ps must be a list of batch sizes, got {ps!r:.80}")
    ps = [_check_p(x.shape[0], p, mode) for p in ps]
    if not ps:
        raise ValueError("ps must hold at least one batch size, got none")
    n, d = x.shape
    _check_memory(
        f"field_errors with num_draws = {num_draws} (n = {n}, d = {d}, p up to {max(ps)})",
        num_draws * _field_bytes(n, d, max(ps), x.dtype.itemsize),
        "use fewer draws or smaller batch sizes",
    )
    kernel.check_config(x, aux)
    F = kernel.field(x, aux)
    nrm = jnp.linalg.norm(F)
    out = np.zeros((len(ps), num_draws))
    for a, p in enumerate(ps):
        keys = jax.random.split(jax.random.fold_in(key, a), num_draws)
        Fh = jax.vmap(lambda k: _rb_field_jit(kernel, x, aux, k, p, mode))(keys)  # noqa: B023
        out[a] = np.asarray(jnp.linalg.norm(Fh - F[None], axis=(1, 2)) / nrm)
    return out


class RandomBatchRun(eqx.Module):
    """Result of ``simulate_random_batch``: save times, $G_x$ and observables there, final state.

    Attributes:
        ts: ``(T,)`` save times.
        collapse_gap: ``(T,)`` $G_x$ at ``ts``.
        observables: dict name -> ``(T, ...)`` values at ``ts``.
        x_final: ``(n, d)`` final state.

    Example:
        >>> import jax, meanfield as mf
        >>> from meanfield.random_batch import simulate_random_batch
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 16, 3)
        >>> run = simulate_random_batch(mf.kernels.USA(1.0), x0, key=jax.random.key(1), p=4, t1=0.4, dt=0.1, num_saves=3)
        >>> run.ts.shape, run.x_final.shape
        ((3,), (16, 3))
    """

    ts: Float[Array, " T"]
    collapse_gap: Float[Array, " T"]
    observables: dict
    x_final: Float[Array, "n d"]


def simulate_random_batch(
    kernel: Kernel,
    x0: ArrayLike,
    aux: Any = None,
    *,
    key: PRNGKeyArray,
    p: Any,
    t1: RealScalarLike,
    dt: RealScalarLike,
    num_saves: Any = 11,
    mode: str = "batch",
    observables: object = None,
) -> RandomBatchRun:
    """Random-batch projected Heun from ``x0`` to ``t1`` (``round(t1 / dt)`` steps, $O(n p d)$ each).

    A fresh random batch per step, shared by the two Heun stages; rows renormalised after each
    step. $G_x$ and ``observables`` (``f(x) -> array``) are recorded at ``num_saves`` equally
    spaced times ``0, .., t1`` (``round(t1/dt)`` must be a multiple of ``num_saves - 1``).

    Args:
        kernel: a ``Kernel``.
        x0: ``(n, d)`` initial unit rows.
        aux: ``(n,)`` labels (default ``kernel.default_aux(n)``).
        key: a ``jax.random`` key (batches).
        p: batch size (dividing ``n`` for ``mode="batch"``).
        t1: final time.
        dt: step.
        num_saves: number of save times.
        mode: ``"batch"`` (random partition) or ``"sample"`` (with replacement).
        observables: dict name -> ``f(x)`` recorded at the save times.

    Returns:
        a ``RandomBatchRun``. Memory: a key per step of a save interval, the saves and one
        field; an estimate past the memory available is refused before allocating
        (``ResourceLimitError``, a ``ValueError``, naming ``round(t1/dt)``, ``num_saves`` and ``p``).

    Example:
        >>> import jax, meanfield as mf
        >>> from meanfield.random_batch import simulate_random_batch
        >>> x0 = mf.sphere.uniform(jax.random.key(0), 64, 3)
        >>> run = simulate_random_batch(mf.kernels.USA(1.0), x0, key=jax.random.key(1), p=8, t1=1.0, dt=0.1)
        >>> run.collapse_gap.shape
        (11,)
    """
    require_post(kernel, "simulate_random_batch")
    aux = resolve_aux(kernel, x0, aux)
    sphere.check_on_sphere(x0, "x0")
    x0 = jnp.asarray(x0)
    p = _check_p(x0.shape[0], p, mode)
    kernel.check_config(x0, aux)
    check_positive("t1", t1)
    check_positive("dt", dt)
    num_saves = check_int("num_saves", num_saves, minimum=2)
    ratio = float(t1) / float(dt)
    # a key per step of a save interval: bounded below by round(t1/dt) / (num_saves - 1) keys
    _check_memory(
        f"simulate_random_batch with round(t1/dt) = {ratio:.3g} steps and num_saves = {num_saves}",
        8.0 * ratio / (num_saves - 1),
        "use a longer dt, a shorter t1 or more saves",
    )
    steps = int(round(ratio))
    if steps < 1 or steps % (num_saves - 1):
        raise ValueError(
            f"round(t1/dt) = {steps} steps must be a positive multiple of num_saves - 1 = {num_saves - 1}"
        )
    if observables is not None and not isinstance(observables, Mapping):
        raise TypeError(
            f"observables must be a dict name -> callable x -> array, got {type(observables).__name__}"
        )
    for name, fn in (observables or {}).items():
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(
                f"observables must map names to callables x -> array, got {name!r}: {fn!r}"
            )
    obs = tuple(sorted((observables or {}).items()))
    n, d = x0.shape
    item = x0.dtype.itemsize
    per_save = 1.0 + sum(
        float(np.prod(jax.eval_shape(fn, x0).shape)) for _, fn in obs
    )  # the gap and the observables
    # keys: one per step of a save interval (split at once) and one per save; the saved values
    # twice (the scan's stacked output and the concatenation)
    need = (
        8.0 * (steps // (num_saves - 1))
        + num_saves * (8.0 + 2.0 * item * per_save)
        + _field_bytes(n, d, p, item)
        + 12.0 * n * d * item
    )
    _check_memory(
        f"simulate_random_batch with round(t1/dt) = {steps} steps, num_saves = {num_saves}, "
        f"p = {p} (n = {n}, d = {d})",
        need,
        "use fewer saves, a longer dt or a smaller p",
    )
    return _rb_run(
        kernel,
        x0,
        aux,
        key,
        jnp.asarray(dt, x0.dtype),
        p,
        mode,
        steps // (num_saves - 1),
        num_saves,
        obs,
    )


class _OneBatch(eqx.Module):
    """The random-batch field of ``kernel`` with one step's batch (``key``): the model whose field
    the engine's step integrates (``mf.integrate.FixedStep``), both Heun stages with one batch."""

    kernel: Kernel
    key: PRNGKeyArray
    p: int = eqx.field(static=True)
    mode: str = eqx.field(static=True)

    def at_time(self, t: Any) -> _OneBatch:
        return self

    def default_aux(self, n: int) -> Array:
        return self.kernel.default_aux(n)

    def field(self, x: Float[Array, "n d"], aux: Array, block_size: Any = None) -> Array:
        return _rb_field(self.kernel, x, aux, self.key, self.p, self.mode)


# what a run records at a save: the collapse gap and the observables
_Record: TypeAlias = tuple[Float[Array, ""], dict[str, Array]]


@eqx.filter_jit
def _rb_run(
    kernel: Kernel,
    x0: Float[Array, "n d"],
    aux: Array,
    key: PRNGKeyArray,
    dt: Float[Array, ""],
    p: int,
    mode: str,
    inner: int,
    num_saves: int,
    obs: tuple[tuple[str, Callable[..., Any]], ...],
) -> RandomBatchRun:
    def step(x: Float[Array, "n d"], k: PRNGKeyArray) -> tuple[Float[Array, "n d"], None]:
        # the engine's projected Heun step (mf.simulate's "rk2") of the field with this step's batch
        stepper = FixedStep.of(_OneBatch(kernel, k, p, mode), x, aux, solver="rk2", h=dt)
        return stepper(0.0, dt, stepper.init(x))[0], None  # autonomous: the step's length is dt

    def record(x: Float[Array, "n d"]) -> _Record:
        return metrics.collapse_gap(x), {name: jnp.asarray(fn(x)) for name, fn in obs}

    def outer(x: Float[Array, "n d"], k: PRNGKeyArray) -> tuple[Float[Array, "n d"], _Record]:
        x, _ = jax.lax.scan(step, x, jax.random.split(k, inner))
        return x, record(x)

    xf, (gs, ob) = jax.lax.scan(outer, x0, jax.random.split(key, num_saves - 1))
    g0, o0 = record(x0)
    gs = jnp.concatenate([g0[None], gs])
    ob = {k: jnp.concatenate([o0[k][None], ob[k]]) for k in o0}
    ts = jnp.arange(num_saves, dtype=x0.dtype) * dt * inner
    return RandomBatchRun(ts=ts, collapse_gap=gs, observables=ob, x_final=xf)


# ----------------------------------------------------------------------------
# particle -> mean-field convergence
# ----------------------------------------------------------------------------


def meanfield_distances(
    kernel: Kernel,
    sample_init: object,
    ns: object,
    *,
    key: PRNGKeyArray,
    ts: npt.ArrayLike,
    repeats: object = 8,
    dt: RealScalarLike = 0.05,
    bandwidth: RealScalarLike = 0.5,
) -> np.ndarray:
    r"""$\mathrm{MMD}(\mu_n(t), \mu_{2n}(t))$ for each $n$ in ``ns``, save time and repeat: ``(len(ns), len(ts), repeats)``.

    $\mu_n$ and $\mu_{2n}$ are the empirical laws of two exact runs (``mf.simulate``,
    projected RK2, step ``dt``) from independent i.i.d. samples ``sample_init(key, m)`` of the
    same initial law. By propagation of chaos (Dobrushin, USA-AV Prop. 4) both are within
    $O(m^{-1/2})$ of the mean-field law, so the distance decays like $n^{-1/2}$ at fixed $t$
    (exactly so at $t = 0$, where $E\, \mathrm{MMD}^2 = \frac{3}{2n} (E\, k(x, x) - E\, k(x, x'))$).

    Args:
        kernel: a ``Kernel``.
        sample_init: callable ``(key, m) -> (m, d)`` initial sample.
        ns: particle numbers.
        key: a ``jax.random`` key.
        ts: save times (the runs end at ``ts[-1]``).
        repeats: independent repeats per ``n``.
        dt: step of the runs.
        bandwidth: MMD kernel width (``mf.metrics.mmd``).

    Returns:
        numpy array ``(len(ns), len(ts), repeats)``. The repeats run together (vmapped):
        an estimated memory (states, fields, the MMD's dense Gram matrices) past what is
        available is refused first (``ResourceLimitError``).

    Example:
        >>> import jax, meanfield as mf
        >>> from meanfield.random_batch import meanfield_distances
        >>> init = lambda k, m: mf.sphere.uniform(k, m, 3)
        >>> D = meanfield_distances(mf.kernels.USA(1.0), init, [4], key=jax.random.key(0), ts=[0.0, 0.1], repeats=2, dt=0.1)  # ~10 s: two diffrax compiles  # doctest: +SKIP
        >>> D.shape, bool((D >= 0).all())  # doctest: +SKIP
        ((1, 2, 2), True)
    """
    from .integrate import simulate

    if not callable(sample_init):
        raise TypeError(
            f"sample_init must be a callable (key, m) -> (m, d), got {sample_init!r:.80}"
        )
    if isinstance(ns, (str, bytes)) or not isinstance(ns, Collection) or not len(ns):
        raise TypeError(f"ns must be a non-empty list of particle numbers, got {ns!r:.80}")
    ns = [check_int("n", n, minimum=2) for n in ns]
    repeats = check_int("repeats", repeats, minimum=1)
    ts = _times("ts", ts)
    check_positive("dt", dt)
    check_positive("bandwidth", bandwidth)
    t1 = float(ts[-1])
    sample = jax.eval_shape(lambda k: sample_init(k, 2), key)  # its shape, nothing run
    d, item = int(sample.shape[-1]), np.dtype(sample.dtype).itemsize
    T = len(ts)
    for n in ns:
        # per repeat (the repeats run vmapped, together): both runs' saved states and stages
        # (3n particles), one field evaluation of each (the model's footprint), and the MMD's
        # dense Gram matrices at every save (n^2 + 4 n^2 + 2 n^2 entries)
        pair = sum(
            float(getattr(kernel, "footprint", lambda m, d: (3.0 * m * m,))(m, d)[0])
            for m in (n, 2 * n)
        )
        need = repeats * item * (3.0 * n * d * (T + 12.0) + pair + 7.0 * n * n * T)
        _check_memory(
            f"meanfield_distances with n = {n}, repeats = {repeats}, {T} save times",
            need,
            "use smaller n, fewer repeats or fewer save times",
        )
    out = np.zeros((len(ns), len(ts), repeats))
    for a, n in enumerate(ns):
        keys = jax.random.split(jax.random.fold_in(key, n), repeats)

        def one(k: PRNGKeyArray, n: int = n) -> Float[Array, " T"]:
            ka, kb = jax.random.split(k)
            xa = sample_init(ka, n)
            xb = sample_init(kb, 2 * n)
            ta = simulate(kernel, xa, t1=t1, dt=dt, ts=ts)
            tb = simulate(kernel, xb, t1=t1, dt=dt, ts=ts)
            return jax.vmap(lambda u, v: metrics.mmd(u, v, bandwidth))(ta.xs, tb.xs)

        out[a] = np.asarray(jax.vmap(one)(keys)).T
    return out


def fit_rate(ns: object, dist: object) -> tuple[float, float]:
    r"""Least-squares exponent $a$ of $\text{dist} \sim C n^a$: fit $\log \text{dist} = a \log n + \log C$.

    Args:
        ns: ``(k,)`` positive particle numbers (``k >= 2``, at least two distinct).
        dist: ``(k,)`` positive finite distances.

    Returns:
        ``(a, standard error of a)`` as floats.

    Example:
        >>> import numpy as np
        >>> from meanfield.random_batch import fit_rate
        >>> ns = np.array([10.0, 100.0, 1000.0])
        >>> a, se = fit_rate(ns, 3.0 * ns**-0.5)
        >>> round(a, 4), se < 1e-6
        (-0.5, True)
    """
    x, y = _positive("ns", ns), _positive("dist", dist)
    if x.ndim != 1 or x.size < 2 or y.shape != x.shape:
        raise ValueError(
            f"ns and dist must be 1-d arrays of one shape with at least 2 entries, got {x.shape} and {y.shape}"
        )
    if np.unique(x).size < 2:
        raise ValueError(f"ns must hold at least two distinct particle numbers, got {x.tolist()}")
    lx, ly = np.log(x), np.log(y)
    A = np.stack([lx, np.ones_like(lx)], 1)
    coef, res, *_ = np.linalg.lstsq(A, ly, rcond=None)
    dof = max(len(lx) - 2, 1)
    r = ly - A @ coef
    s2 = float(r @ r) / dof
    cov = s2 * np.linalg.inv(A.T @ A)
    return float(coef[0]), float(np.sqrt(cov[0, 0]))


def _is_real_dtype(dtype: Any) -> bool:
    """Integers and floats (bfloat16 and float8 included); not bools, complex or objects."""
    try:
        return bool(jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating))
    except TypeError:
        return False


def _real(name: str, value: Any) -> np.ndarray:
    """A concrete array of real numbers as float64 (``TypeError`` for strings, bools, complex)."""
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name} must be an array of real numbers, got {value!r:.80}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an array of real numbers, got {value!r:.80}") from None
    if not _is_real_dtype(arr.dtype):
        raise TypeError(f"{name} must be an array of real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def _positive(name: str, value: Any) -> np.ndarray:
    arr = _real(name, value)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be finite and > 0, got {arr.tolist()!r:.120}")
    return arr


def _times(name: str, value: Any) -> np.ndarray:
    """Save times: a non-empty 1-d array, finite, ``>= 0``, non-decreasing."""
    arr = _real(name, value)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-d array of save times, got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(np.diff(arr) < 0):
        raise ValueError(f"{name} must be finite, >= 0 and increasing, got {arr.tolist()!r:.120}")
    return arr
