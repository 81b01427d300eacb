r"""Fixed-query long-context attention (paper: long-context attention scaling limits; MATH.md Sec. 2).

One query $q \in S^{d-1}$, a context of keys $x_1, \dots, x_n$ (rows of ``keys``),
distances to the query $T_j = 1 - \langle q, x_j\rangle$ and weights

$$A_j = \frac{e^{-\beta T_j}}{Z_n}, \qquad Z_n = \sum_j e^{-\beta T_j}$$

(the softmax of $\beta \langle q, x_j\rangle$). Every public function acts on ONE query and
ONE context; trials, queries and grid cells are ``jax.vmap`` axes.

Dense functions (``weights``, ``ordered_weights``, ``displacement``,
``residual_update``, ``log_partition``, ``top_weights``) hold the whole
``(n,)`` weight vector. For huge contexts ($n \sim 10^6$ and beyond, or many
contexts vmapped at once) the streaming functions make one pass over the keys
in chunks with an online log-sum-exp (running minimum distance, rescaled
partial sums, running top-k): ``context_stats`` reads the keys from an array,
``sampled_context_stats`` draws each chunk on the fly from a sampler so that a
context is never materialised. ``sample_top_weights`` and
``mean_top_weight_grid`` lift them over trials and an ``(n, beta)`` grid.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from . import sphere
from ._checks import check_finite, check_int, check_nonnegative

__all__ = [
    "weights",
    "ordered_weights",
    "top_weights",
    "log_partition",
    "displacement",
    "residual_update",
    "ContextStats",
    "context_stats",
    "sampled_context_stats",
    "uniform_distances",
    "sampled_distance_stats",
    "sample_top_weights",
    "mean_top_weight_grid",
]


# --------------------------------------------------------------------------
# validation (concrete values only; traced values pass through)
# --------------------------------------------------------------------------


def _check_query_keys(q, keys) -> tuple[Array, Array]:
    q = jnp.asarray(q)
    keys = jnp.asarray(keys)
    if q.ndim != 1:
        raise ValueError(f"q must be one query of shape (d,), got shape {q.shape}; vmap over queries")
    if keys.ndim != 2 or keys.shape[1] != q.shape[0]:
        raise ValueError(
            f"keys must have shape (n, d) with d = {q.shape[0]} (the query's dimension), "
            f"got shape {keys.shape}; vmap over contexts"
        )
    if keys.shape[0] < 1:
        raise ValueError("keys must hold at least one key, got n = 0")
    return q, keys


def _check_V(V, d) -> Array | None:
    if V is None:
        return None
    V = jnp.asarray(V)
    if V.shape != (d, d):
        raise ValueError(f"V must be a (d, d) = ({d}, {d}) value matrix or None, got shape {V.shape}")
    return V


def _shifted_logits(q, keys, beta):
    # -beta (T_j - T_(1)) = beta (<q, x_j> - max_l <q, x_l>) <= 0: the max is 0,
    # so exp never overflows and the top weight never underflows (beta up to 1e6).
    s = keys @ q
    return beta * (s - jnp.max(s))


# --------------------------------------------------------------------------
# dense functions
# --------------------------------------------------------------------------


def weights(q: ArrayLike, keys: ArrayLike, beta) -> Float[Array, " n"]:
    r"""Attention weights $A_j = e^{-\beta T_j} / \sum_l e^{-\beta T_l}$, $T_j = 1 - \langle q, x_j\rangle$.

    Shift-stabilised ($T_j - T_{(1)}$ in the exponent): finite for $\beta$ up to
    $10^6$ and beyond, sums to one.

    Args:
        q: query, shape ``(d,)`` (a unit vector in the paper's model).
        keys: context, shape ``(n, d)``.
        beta: inverse temperature ``>= 0`` (traceable scalar).

    Returns:
        ``(n,)`` weights in the order of ``keys``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> keys = jnp.array([[1.0, 0.0], [0.0, 1.0]])
        >>> mf.attention.weights(jnp.array([1.0, 0.0]), keys, 1e6).tolist()
        [1.0, 0.0]
    """
    q, keys = _check_query_keys(q, keys)
    check_nonnegative("beta", beta)
    return jax.nn.softmax(_shifted_logits(q, keys, beta))


def ordered_weights(q: ArrayLike, keys: ArrayLike, beta) -> Float[Array, " n"]:
    r"""Ordered weights $A_{(1)} \ge A_{(2)} \ge \dots \ge A_{(n)}$ (``weights`` sorted decreasingly).

    Args:
        q: query ``(d,)``; keys: ``(n, d)``; beta: inverse temperature ``>= 0``.

    Returns:
        ``(n,)`` weights, decreasing, summing to 1.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> keys = jnp.array([[0.0, 1.0], [1.0, 0.0]])
        >>> w = mf.attention.ordered_weights(jnp.array([1.0, 0.0]), keys, 1.0)
        >>> bool(w[0] > w[1])
        True
    """
    return jnp.sort(weights(q, keys, beta))[::-1]


def top_weights(q: ArrayLike, keys: ArrayLike, beta, k) -> Float[Array, " k"]:
    r"""The $k$ largest weights $A_{(1)}, \dots, A_{(k)}$ (``lax.top_k``; no full sort).

    Args:
        q: query ``(d,)``; keys: ``(n, d)``; beta: inverse temperature ``>= 0``.
        k: number of weights kept, ``1 <= k <= n``.

    Returns:
        ``(k,)`` weights, decreasing.

    Example:
        >>> import jax, meanfield as mf
        >>> keys = mf.sphere.uniform(jax.random.key(0), 50, 3)
        >>> mf.attention.top_weights(keys[0], keys, 2.0, 3).shape
        (3,)
    """
    q, keys = _check_query_keys(q, keys)
    k = check_int("k", k, minimum=1)
    if k > keys.shape[0]:
        raise ValueError(f"k must be <= n = {keys.shape[0]}, got {k}")
    return jax.lax.top_k(weights(q, keys, beta), k)[0]


def log_partition(q: ArrayLike, keys: ArrayLike, beta) -> Float[Array, ""]:
    r"""$\log Z_n = \log \sum_j e^{-\beta T_j}$ (log-sum-exp; finite for any $\beta$).

    $T_j = 1 - \langle q, x_j\rangle$ is the distance of key $j$ to the query.

    Args:
        q: query ``(d,)``; keys: ``(n, d)``; beta: inverse temperature ``>= 0``.

    Returns:
        scalar ``()``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> q = jnp.array([1.0, 0.0])
        >>> float(mf.attention.log_partition(q, jnp.stack([q, q]), 3.0))  # log 2
        0.6931471824645996
    """
    q, keys = _check_query_keys(q, keys)
    check_nonnegative("beta", beta)
    T = 1.0 - keys @ q
    return jax.nn.logsumexp(-beta * T)


def displacement(
    q: ArrayLike, keys: ArrayLike, beta, V: ArrayLike | None = None
) -> Float[Array, " d"]:
    r"""Output displacement $Y_n(q) = V \sum_j A_j (x_j - q)$ (attention output minus $V q$).

    Summed as $\sum_j A_j (x_j - q)$ (not $\sum_j A_j x_j - q$) so that small
    displacements (large $\beta$) keep their relative precision.

    Args:
        q: query ``(d,)``; keys: ``(n, d)``; beta: ``>= 0``.
        V: optional ``(d, d)`` value matrix (identity if None).

    Returns:
        ``(d,)`` displacement. Limits (V = I): ``beta Y_n(q) -> grad_S log rho(q)
        - (d-1)/2 q`` in the drift-dominated subcritical regime.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> q = jnp.array([1.0, 0.0])
        >>> mf.attention.displacement(q, jnp.array([[0.0, 1.0]]), 1.0).tolist()
        [-1.0, 1.0]
    """
    q, keys = _check_query_keys(q, keys)
    V = _check_V(V, q.shape[0])
    A = weights(q, keys, beta)
    Y = A @ (keys - q)
    return Y if V is None else V @ Y


def residual_update(
    q: ArrayLike, keys: ArrayLike, beta, gamma, V: ArrayLike | None = None
) -> Float[Array, " d"]:
    r"""One residual attention step $q' = (q + \gamma Y_n(q)) / \|q + \gamma Y_n(q)\|$.

    In the drift-dominated regime $q' \approx q + (\gamma / \beta) \nabla_S \log \rho(q)$:
    iterating moves queries up the key density (backward heat flow, paper Prop. 4.4).

    Args:
        q, keys, beta, V: as in ``displacement``.
        gamma: residual step size (finite, traceable scalar).

    Returns:
        ``(d,)`` unit vector.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> q = jnp.array([1.0, 0.0])
        >>> mf.attention.residual_update(q, jnp.array([[0.0, 1.0]]), 1.0, 1.0).tolist()
        [0.0, 1.0]
    """
    check_finite("gamma", gamma)
    u = q + gamma * displacement(q, keys, beta, V)
    return u / jnp.linalg.norm(u)


# --------------------------------------------------------------------------
# streaming (chunked) statistics of one context
# --------------------------------------------------------------------------


class ContextStats(NamedTuple):
    r"""One pass over a context: the partition function, the top weights, the output.

    Attributes:
        log_partition: $\log Z_n = \log \sum_j e^{-\beta T_j}$, shape ``()``.
        top_distances: $T_{(1)} \le \dots \le T_{(k)}$, shape ``(k,)``.
        top_weights: $A_{(1)} \ge \dots \ge A_{(k)}$, shape ``(k,)``.
        displacement: $Y_n(q) = \sum_j A_j (x_j - q)$ ($V = I$), shape ``(d,)``.

    Returned by ``context_stats``, ``sampled_context_stats`` and
    ``sampled_distance_stats``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> q = jnp.array([1.0, 0.0])
        >>> st = mf.attention.context_stats(q, jnp.stack([q, q]), 3.0, k=2)
        >>> round(float(st.log_partition), 4), [round(float(a), 4) for a in st.top_weights]  # log 2; 1/2 each
        (0.6931, [0.5, 0.5])
    """

    log_partition: Array
    top_distances: Array
    top_weights: Array
    displacement: Array


class _State(NamedTuple):
    tmin: Array  # running T_(1)
    S: Array  # sum_j exp(-beta (T_j - tmin))
    B: Array  # sum_j exp(-beta (T_j - tmin)) (x_j - q), (d,)
    top: Array  # running k smallest T, sorted increasingly


def _init_state(q, k):
    dt = q.dtype
    # T <= 2 on the sphere; 4 is a finite "no key yet" value (its weight is 0 * exp(.) = 0).
    return _State(jnp.asarray(4.0, dt), jnp.zeros((), dt), jnp.zeros_like(q), jnp.full((k,), jnp.inf, dt))


def _absorb(state: _State, q, xs, valid, beta, k, T=None) -> _State:
    """Add a chunk (rows where ``valid``) to the running sums (online log-sum-exp).

    Either keys ``xs`` (then ``T = 1 - xs q``) or, with ``xs=None``, the distances
    ``T`` alone (the displacement sum then stays 0).
    """
    if T is None:
        T = 1.0 - xs @ q
    T = jnp.where(valid, T, jnp.inf)
    new_min = jnp.minimum(state.tmin, jnp.min(T))
    rescale = jnp.exp(-beta * (state.tmin - new_min))  # <= 1
    e = jnp.where(valid, jnp.exp(-beta * (T - new_min)), 0.0)
    S = state.S * rescale + jnp.sum(e)
    B = state.B * rescale if xs is None else state.B * rescale + e @ (xs - q)
    top = jnp.sort(jnp.concatenate([state.top, _smallest(T, k)]))[:k]
    return _State(new_min, S, B, top)


def _smallest(T, k):
    """The ``k`` smallest entries of ``T`` (any order): ``k`` passes of ``min`` for small ``k``.

    XLA's CPU ``top_k`` sorts the whole chunk; ``k`` linear passes are cheaper for ``k <= 8``.
    """
    if k > 8:
        return -jax.lax.top_k(-T, k)[0]
    out = []
    for _ in range(k):
        i = jnp.argmin(T)
        out.append(T[i])
        T = T.at[i].set(jnp.inf)
    return jnp.stack(out)


def _finish(state: _State, beta) -> ContextStats:
    return ContextStats(
        log_partition=jnp.log(state.S) - beta * state.tmin,
        top_distances=state.top,
        top_weights=jnp.exp(-beta * (state.top - state.tmin)) / state.S,
        displacement=state.B / state.S,
    )


def _check_chunk(chunk):
    return check_int("chunk", chunk, minimum=1)


def context_stats(q: ArrayLike, keys: ArrayLike, beta, *, k=1, chunk=65_536) -> ContextStats:
    r"""Streaming $\log Z_n$, $A_{(1..k)}$, $Y_n(q)$ over ``keys`` in chunks of ``chunk`` rows.

    Same numbers as the dense functions (to rounding) with memory ``O(chunk d)``
    instead of ``O(n)`` per beta/query: keys are read with ``dynamic_slice`` in
    a ``lax.fori_loop`` and merged with an online log-sum-exp (running
    $T_{(1)}$; partial sums rescaled by $e^{-\beta (T_{\text{old}} - T_{\text{new}})}$) and a
    running top-k of the distances. vmap over ``beta`` or queries is cheap: the
    keys are not copied per batch element.

    Args:
        q: query ``(d,)``; keys: ``(n, d)``; beta: ``>= 0`` (traceable).
        k: number of top weights kept, ``1 <= k <= n``.
        chunk: rows per chunk (clipped to ``n``).

    Returns:
        ``ContextStats``.

    Example:
        >>> import jax, meanfield as mf
        >>> keys = mf.sphere.uniform(jax.random.key(0), 1000, 3)
        >>> st = mf.attention.context_stats(keys[0], keys, 5.0, k=2, chunk=128)
        >>> bool(abs(st.top_weights[0] - mf.attention.ordered_weights(keys[0], keys, 5.0)[0]) < 1e-6)
        True
    """
    q, keys = _check_query_keys(q, keys)
    check_nonnegative("beta", beta)
    n, d = keys.shape
    k = check_int("k", k, minimum=1)
    if k > n:
        raise ValueError(f"k must be <= n = {n}, got {k}")
    chunk = min(_check_chunk(chunk), n)
    num_chunks = -(-n // chunk)
    beta = jnp.asarray(beta, q.dtype)

    def body(i, state):
        start = i * chunk
        # dynamic_slice clamps the last chunk to [n - chunk, n); rows already seen are masked.
        clamped = jnp.minimum(start, n - chunk)
        xs = jax.lax.dynamic_slice(keys, (clamped, 0), (chunk, d))
        valid = clamped + jnp.arange(chunk) >= start
        return _absorb(state, q, xs, valid, beta, k)

    state = jax.lax.fori_loop(0, num_chunks, body, _init_state(q, k))
    return _finish(state, beta)


def sampled_context_stats(
    key,
    q: ArrayLike,
    beta,
    n,
    sampler=None,
    *,
    k=1,
    chunk=65_536,
) -> ContextStats:
    """``context_stats`` of a context drawn chunk by chunk, never materialised.

    Chunk ``i`` holds ``sampler(fold_in(key, i), chunk)`` (the last chunk's
    rows past ``n`` are masked), so memory is ``O(chunk d)`` for any ``n`` and
    the keys are i.i.d. from the sampler's law. The context depends on ``key``
    and ``chunk`` (not on ``beta``): vmapping over ``beta`` evaluates every
    beta on the same keys and draws them once.

    Args:
        key: a ``jax.random`` key (one context).
        q: query ``(d,)``.
        beta: inverse temperature ``>= 0``.
        n: context length (static int).
        sampler: ``(key, m) -> (m, d)`` i.i.d. keys; default uniform on ``S^{d-1}``
            (e.g. ``lambda k, m: mf.sphere.sample_density(k, m, d, f, log_bound=b)``).
        k, chunk: as in ``context_stats``.

    Returns:
        ``ContextStats`` of the drawn context.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> q = jnp.array([1.0, 0.0, 0.0, 0.0, 0.0])
        >>> st = mf.attention.sampled_context_stats(jax.random.key(0), q, 100.0, 10**4, k=2)
        >>> st.top_weights.shape
        (2,)
    """
    q = jnp.asarray(q)
    if q.ndim != 1:
        raise ValueError(f"q must be one query of shape (d,), got shape {q.shape}")
    n = check_int("n", n, minimum=1)
    k = check_int("k", k, minimum=1)
    if k > n:
        raise ValueError(f"k must be <= n = {n}, got {k}")
    check_nonnegative("beta", beta)
    if sampler is not None and not callable(sampler):
        raise TypeError(f"sampler must be a callable (key, m) -> (m, d) keys or None, got {sampler!r}")
    chunk = min(_check_chunk(chunk), n)
    return _stream(key, q, beta, n, sampler, k, max(chunk, k))


def _stream(key, q, beta, n, sampler, k, chunk) -> ContextStats:
    # n may be traced (one compilation for every context length); chunk, k static.
    if sampler is None:
        d = q.shape[0]

        def sampler(kk, m):
            return sphere.uniform(kk, m, d, q.dtype)

    num_chunks = (n + chunk - 1) // chunk
    beta = jnp.asarray(beta, q.dtype)

    def body(i, state):
        xs = sampler(jax.random.fold_in(key, i), chunk).astype(q.dtype)
        valid = i * chunk + jnp.arange(chunk) < n
        return _absorb(state, q, xs, valid, beta, k)

    state = jax.lax.fori_loop(0, num_chunks, body, _init_state(q, k))
    return _finish(state, beta)


def _default_query(d, dtype):
    return jnp.zeros((d,), dtype).at[0].set(1.0)


def uniform_distances(key, m, d, dtype=jnp.float32) -> Float[Array, " m"]:
    r"""$m$ i.i.d. distances $T = 1 - \langle q, x\rangle$ of keys $x$ uniform on $S^{d-1}$ (any fixed $q$).

    $\langle q, x\rangle$ has density $\propto (1 - u^2)^{(d-3)/2}$, i.e. $T / 2 \sim \mathrm{Beta}(a, a)$,
    $a = (d - 1)/2$. Sampled by inversion where the CDF inverts in closed form
    ($d = 3$: $T = 2 U$; $d = 5$: the Beta(2, 2) quantile
    $\frac12 - \sin(\arcsin(1 - 2U)/3)$), else with ``jax.random.beta``. One uniform
    per key instead of $d$ normals: the weights' law only needs $T$.

    Args:
        key: PRNG key; m: number of distances; d: sphere dimension ``>= 2``; dtype: float dtype.

    Returns:
        ``(m,)`` distances in ``[0, 2]`` (mean 1).

    Example:
        >>> import jax, meanfield as mf
        >>> T = mf.attention.uniform_distances(jax.random.key(0), 100_000, 5)
        >>> bool(abs(T.mean() - 1.0) < 0.01)
        True
    """
    m = check_int("m", m, minimum=1)
    d = check_int("d", d, minimum=2)
    if d == 3:
        return 2.0 * jax.random.uniform(key, (m,), dtype)
    if d == 5:
        u = jax.random.uniform(key, (m,), dtype)
        return 2.0 * (0.5 - jnp.sin(jnp.arcsin(1.0 - 2.0 * u) / 3.0))
    a = 0.5 * (d - 1)
    return 2.0 * jax.random.beta(key, a, a, (m,), dtype)


def sampled_distance_stats(key, beta, n, d, *, k=1, chunk=65_536) -> ContextStats:
    r"""``sampled_context_stats`` for uniform keys, drawing only the distances $T_j$.

    $\log Z_n$, $T_{(1..k)}$ and $A_{(1..k)}$ have the same law as for a uniform
    context on $S^{d-1}$ (they depend on the keys only through ``T``), at a
    fraction of the cost; ``displacement`` is not available (returned as zeros).

    Args:
        key: PRNG key (one context); beta: inverse temperature ``>= 0``.
        n: context length; d: sphere dimension ``>= 2``.
        k, chunk: as in ``context_stats``.

    Returns:
        ``ContextStats`` (``displacement``: zeros of shape ``(d,)``).

    Example:
        >>> import jax, meanfield as mf
        >>> st = mf.attention.sampled_distance_stats(jax.random.key(0), 10.0, 10**5, 5)
        >>> bool(abs(st.log_partition - 7.3) < 0.2)  # log(1.5e5/100 * (1 - 1/10))
        True
    """
    n = check_int("n", n, minimum=1)
    d = check_int("d", d, minimum=2)
    k = check_int("k", k, minimum=1)
    if k > n:
        raise ValueError(f"k must be <= n = {n}, got {k}")
    check_nonnegative("beta", beta)
    chunk = max(min(_check_chunk(chunk), n), k)
    return _stream_distances(key, beta, n, d, k, chunk, jnp.result_type(float))


def _stream_distances(key, beta, n, d, k, chunk, dtype):
    # the law of (Z_n, A_(1..k)) for uniform keys: stream D2Qs only (no keys drawn).
    beta = jnp.asarray(beta, dtype)
    q = _default_query(d, dtype)

    def body(i, state):
        T = uniform_distances(jax.random.fold_in(key, i), chunk, d, dtype)
        valid = i * chunk + jnp.arange(chunk) < n
        return _absorb(state, q, None, valid, beta, k, T=T)

    state = jax.lax.fori_loop(0, (n + chunk - 1) // chunk, body, _init_state(q, k))
    return _finish(state, beta)


def sample_top_weights(
    key,
    n,
    betas,
    d,
    trials,
    *,
    k=1,
    q=None,
    sampler: Callable[[Array, int], Array] | None = None,
    chunk=None,
    batch_size=None,
    memory: int = 2**24,
) -> Float[Array, "trials b k"]:
    r"""$A_{(1..k)}$ for ``trials`` independent contexts of $n$ keys and every $\beta$ in ``betas``.

    Trial ``t`` uses the context ``sampled_context_stats(split(key, trials)[t], ...)``
    (uniform keys on ``S^{d-1}`` unless ``sampler``); all betas see the same
    keys. With ``sampler=None`` and ``q=None`` (uniform keys) only the distances
    $T_j$ are drawn (``uniform_distances``; same law of the weights, several
    times faster), so a context is a stream of ``T``'s rather than keys. Trials
    run through ``lax.map`` in batches of ``batch_size``, each batch
    vmapped over trials and betas with keys streamed in chunks, so that at most
    about ``memory`` floats are live (default $2^{24}$: 64 MB in float32).

    Args:
        key: a ``jax.random`` key.
        n: context length (static int).
        betas: ``(b,)`` inverse temperatures (or a scalar).
        d: ambient dimension.
        trials: number of independent contexts.
        k: number of ordered weights kept.
        q: query (default ``e_1``).
        sampler: key sampler ``(key, m) -> (m, d)``.
        chunk, batch_size: override the automatic chunk/batch sizes.
        memory: float budget used to pick them.

    ``n`` is traced: calls differing only in ``n`` (same sizes) share one compilation.

    Returns:
        ``(trials, b, k)`` array (``b = 1`` for a scalar beta).

    Example:
        >>> import jax, meanfield as mf
        >>> A = mf.attention.sample_top_weights(jax.random.key(0), 1000, [1.0, 1e3], 5, 8)
        >>> A.shape, bool((A[:, 1, 0] > A[:, 0, 0]).all())
        ((8, 2, 1), True)
    """
    n = check_int("n", n, minimum=1)
    d = check_int("d", d, minimum=2)
    trials = check_int("trials", trials, minimum=1)
    k = check_int("k", k, minimum=1)
    distances = sampler is None and q is None
    betas = jnp.atleast_1d(jnp.asarray(betas, jnp.result_type(float)))
    if betas.ndim != 1:
        raise ValueError(f"betas must be a scalar or a 1-d array, got shape {betas.shape}")
    check_nonnegative("betas", betas)
    q = _default_query(d, betas.dtype) if q is None else jnp.asarray(q, betas.dtype)
    if q.shape != (d,):
        raise ValueError(f"q must have shape (d,) = ({d},), got {q.shape}")
    chunk, batch_size = _sizes(n, betas.shape[0], d, trials, k, chunk, batch_size, memory)
    return _top_weights_jit(key, betas, jnp.asarray(n), q, sampler, trials, k, chunk, batch_size, distances)


def _sizes(n, nb, d, trials, k, chunk, batch_size, memory):
    """Chunk and trial-batch sizes keeping about ``memory`` floats live."""
    if batch_size is None:
        batch_size = int(max(1, min(trials, memory // max(1, nb * min(n, 4096) * 4))))
    if chunk is None:
        chunk = int(min(n, memory // max(1, batch_size * (nb + d + 2))))
    chunk = max(_check_chunk(chunk), k)
    return chunk, min(check_int("batch_size", batch_size, minimum=1), trials)


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7, 8, 9))
def _top_weights_jit(key, betas, n, q, sampler, trials, k, chunk, batch_size, distances):
    def one_trial(trial_key):
        def one_beta(beta):
            if distances:
                return _stream_distances(trial_key, beta, n, q.shape[0], k, chunk, q.dtype).top_weights
            return _stream(trial_key, q, beta, n, sampler, k, chunk).top_weights

        return jax.vmap(one_beta)(betas)

    keys = jax.random.split(key, trials)
    return jax.lax.map(one_trial, keys, batch_size=batch_size)


def mean_top_weight_grid(
    key,
    ns: Iterable[int],
    betas,
    d,
    trials,
    *,
    q=None,
    sampler: Callable[[Array, int], Array] | None = None,
    memory: int = 2**24,
    progress: Callable | None = None,
):
    r"""Mean and standard error of $A_{(1)}$ over an $(n, \beta)$ grid, ``trials`` contexts per cell.

    ``betas`` is either a ``(b,)`` array shared by all ``n`` or a ``(len(ns), b)``
    array (one beta row per ``n``, e.g. a grid in $\beta / n^\alpha$). Each ``n``
    compiles once (shape-static); cells of one ``n`` share the contexts
    (common random numbers across beta). Context ``i`` of row ``n`` is drawn
    from ``fold_in(key, n)``.

    $\text{mean} = \frac{1}{\text{trials}} \sum_i A_{(1)}^{(i)}$, $\text{stderr} = \operatorname{std}(A_{(1)}) / \sqrt{\text{trials}}$ per cell.

    Args:
        key: PRNG key; ns: context lengths; betas: ``(b,)`` or ``(len(ns), b)``.
        d: sphere dimension; trials: contexts per cell.
        q: query ``(d,)`` (default ``e_1``); sampler: as in ``sampled_context_stats``.
        memory: element budget that sets the chunk and batch sizes.
        progress: optional callback, called with ``1`` after each ``n``.

    Returns:
        ``(mean, stderr)`` NumPy arrays of shape ``(len(ns), b)``.

    Example:
        >>> import jax, meanfield as mf
        >>> m, se = mf.attention.mean_top_weight_grid(jax.random.key(0), [10, 100], [1.0, 10.0], 5, 16)
        >>> m.shape
        (2, 2)
    """
    ns = [check_int("n", int(n) if isinstance(n, np.integer) else n, minimum=1) for n in ns]
    betas = np.asarray(betas, dtype=np.float64)
    if betas.ndim == 1:
        betas = np.broadcast_to(betas, (len(ns), betas.shape[0]))
    if betas.ndim != 2 or betas.shape[0] != len(ns):
        raise ValueError(f"betas must have shape (b,) or (len(ns), b) = ({len(ns)}, b), got {betas.shape}")
    means = np.zeros(betas.shape)
    errs = np.zeros(betas.shape)
    # n is traced, so one chunk size for every row means one compilation; chunk ~ max(n)/64
    # keeps the draws wasted on small n (one partly masked chunk) small next to the large n.
    cap, batch_size = _sizes(max(ns), betas.shape[1], d, trials, 1, None, None, memory)
    chunk = int(min(cap, max(256, (1 << (max(ns) - 1).bit_length()) // 64)))
    for i, n in enumerate(ns):
        A1 = sample_top_weights(
            jax.random.fold_in(key, n),
            n,
            betas[i],
            d,
            trials,
            q=q,
            sampler=sampler,
            chunk=chunk,
            batch_size=batch_size,
        )[..., 0]
        a1 = np.asarray(A1, dtype=np.float64)
        means[i] = a1.mean(axis=0)
        errs[i] = a1.std(axis=0, ddof=1) / np.sqrt(trials) if trials > 1 else np.nan
        if progress is not None:
            progress(1)
    return means, errs
