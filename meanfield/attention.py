r"""Fixed-query long-context attention (paper: long-context attention scaling limits; docs/math/attention.md).

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

Beyond i.i.d. keys (paper Sec. 2 and App. F): a key process
(``AbstractKeyProcess``) draws a context whose keys depend on each other or on
their positions, chunk by chunk, and plugs into the same ``sampler``
arguments: ``GaussianARKeys`` (stationary, mixing, anti-clustered: the i.i.d.
limits persist), ``StickyKeys`` (clustered: they do not) and ``RoPEKeys``
(rotary position encoding, ``rope_rotate``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeAlias

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from . import sphere
from ._checks import RealScalarLike, check_finite, check_int, check_nonnegative
from ._precision import matmul

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
    "AbstractKeyProcess",
    "GaussianARKeys",
    "StickyKeys",
    "RoPEKeys",
    "rope_frequencies",
    "rope_rotate",
]

#: Arrays, numbers or (nested) lists of numbers.
_ArrayLike: TypeAlias = ArrayLike | Sequence[Any]

#: A key sampler ``(key, m) -> (m, d)`` of i.i.d. keys.
_Sampler: TypeAlias = Callable[[Array, int], Array]


# --------------------------------------------------------------------------
# validation (concrete values only; traced values pass through)
# --------------------------------------------------------------------------


def _check_query_keys(q: ArrayLike, keys: ArrayLike) -> tuple[Array, Array]:
    q = jnp.asarray(q)
    keys = jnp.asarray(keys)
    if q.ndim != 1:
        raise ValueError(
            f"q must be one query of shape (d,), got shape {q.shape}; vmap over queries"
        )
    if keys.ndim != 2 or keys.shape[1] != q.shape[0]:
        raise ValueError(
            f"keys must have shape (n, d) with d = {q.shape[0]} (the query's dimension), "
            f"got shape {keys.shape}; vmap over contexts"
        )
    if keys.shape[0] < 1:
        raise ValueError("keys must hold at least one key, got n = 0")
    return q, keys


def _check_V(V: ArrayLike | None, d: int) -> Array | None:
    if V is None:
        return None
    V = jnp.asarray(V)
    if V.shape != (d, d):
        raise ValueError(
            f"V must be a (d, d) = ({d}, {d}) value matrix or None, got shape {V.shape}"
        )
    return V


def _shifted_logits(
    q: Float[Array, " d"], keys: Float[Array, "n d"], beta: RealScalarLike
) -> Float[Array, " n"]:
    # -beta (T_j - T_(1)) = beta (<q, x_j> - max_l <q, x_l>) <= 0: the max is 0,
    # so exp never overflows and the top weight never underflows (beta up to 1e6).
    s = matmul(keys, q)
    return (s - jnp.max(s)) * beta


# --------------------------------------------------------------------------
# dense functions
# --------------------------------------------------------------------------


def weights(q: ArrayLike, keys: ArrayLike, beta: RealScalarLike) -> Float[Array, " n"]:
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


def ordered_weights(q: ArrayLike, keys: ArrayLike, beta: RealScalarLike) -> Float[Array, " n"]:
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


def top_weights(q: ArrayLike, keys: ArrayLike, beta: RealScalarLike, k: int) -> Float[Array, " k"]:
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


def log_partition(q: ArrayLike, keys: ArrayLike, beta: RealScalarLike) -> Float[Array, ""]:
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
    T = 1.0 - matmul(keys, q)
    return jax.nn.logsumexp(-beta * T)


def displacement(
    q: ArrayLike, keys: ArrayLike, beta: RealScalarLike, V: ArrayLike | None = None
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
    Y = matmul(A, keys - q)
    return Y if V is None else matmul(V, Y)


def residual_update(
    q: ArrayLike,
    keys: ArrayLike,
    beta: RealScalarLike,
    gamma: RealScalarLike,
    V: ArrayLike | None = None,
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


def _init_state(q: Float[Array, " d"], k: int) -> _State:
    dt = q.dtype
    # T <= 2 on the sphere; 4 is a finite "no key yet" value (its weight is 0 * exp(.) = 0).
    return _State(
        jnp.asarray(4.0, dt), jnp.zeros((), dt), jnp.zeros_like(q), jnp.full((k,), jnp.inf, dt)
    )


def _absorb(
    state: _State,
    q: Float[Array, " d"],
    xs: Float[Array, "c d"] | None,
    valid: Array,
    beta: Array,
    k: int,
    T: Float[Array, " c"] | None = None,
) -> _State:
    """Add a chunk (rows where ``valid``) to the running sums (online log-sum-exp).

    Either keys ``xs`` (then ``T = 1 - xs q``) or, with ``xs=None``, the distances
    ``T`` alone (the displacement sum then stays 0).
    """
    if T is None:
        assert xs is not None  # keys or distances, never neither
        T = 1.0 - matmul(xs, q)
    T = jnp.where(valid, T, jnp.inf)
    new_min = jnp.minimum(state.tmin, jnp.min(T))
    rescale = jnp.exp(-beta * (state.tmin - new_min))  # <= 1
    e = jnp.where(valid, jnp.exp(-beta * (T - new_min)), 0.0)
    S = state.S * rescale + jnp.sum(e)
    B = state.B * rescale if xs is None else state.B * rescale + matmul(e, xs - q)
    top = jnp.sort(jnp.concatenate([state.top, _smallest(T, k)]))[:k]
    return _State(new_min, S, B, top)


def _smallest(T: Float[Array, " c"], k: int) -> Float[Array, " k"]:
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


def _finish(state: _State, beta: Array) -> ContextStats:
    return ContextStats(
        log_partition=jnp.log(state.S) - beta * state.tmin,
        top_distances=state.top,
        top_weights=jnp.exp(-beta * (state.top - state.tmin)) / state.S,
        displacement=state.B / state.S,
    )


def _check_chunk(chunk: Any) -> int:
    return check_int("chunk", chunk, minimum=1)


def context_stats(
    q: ArrayLike, keys: ArrayLike, beta: RealScalarLike, *, k: int = 1, chunk: int = 65_536
) -> ContextStats:
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

    def body(i: Array, state: _State) -> _State:
        start = i * chunk
        # dynamic_slice clamps the last chunk to [n - chunk, n); rows already seen are masked.
        clamped = jnp.minimum(start, n - chunk)
        xs = jax.lax.dynamic_slice(keys, (clamped, 0), (chunk, d))
        valid = clamped + jnp.arange(chunk) >= start
        return _absorb(state, q, xs, valid, beta, k)

    state = jax.lax.fori_loop(0, num_chunks, body, _init_state(q, k))
    return _finish(state, beta)


def sampled_context_stats(
    key: PRNGKeyArray,
    q: ArrayLike,
    beta: RealScalarLike,
    n: Any,  # an int, checked with its own message
    sampler: Any = None,  # a sampler, a key process or None, checked with its own message
    *,
    k: int = 1,
    chunk: int = 65_536,
) -> ContextStats:
    """``context_stats`` of a context drawn chunk by chunk, never materialised.

    Chunk ``i`` holds ``sampler(fold_in(key, i), chunk)`` (the last chunk's
    rows past ``n`` are masked), so memory is ``O(chunk d)`` for any ``n`` and
    the keys are i.i.d. from the sampler's law. A key process
    (``AbstractKeyProcess``) instead draws a dependent or position-dependent
    sequence, carrying its state from chunk to chunk (``process.draw(key, n,
    chunk=chunk)`` is the same context, materialised). The context depends on ``key``
    and ``chunk`` (not on ``beta``): vmapping over ``beta`` evaluates every
    beta on the same keys and draws them once.

    Args:
        key: a ``jax.random`` key (one context).
        q: query ``(d,)``.
        beta: inverse temperature ``>= 0``.
        n: context length (static int).
        sampler: ``(key, m) -> (m, d)`` i.i.d. keys; default uniform on ``S^{d-1}``
            (e.g. ``lambda k, m: mf.sphere.sample_density(k, m, d, f, log_bound=b)``);
            or an ``AbstractKeyProcess`` (dependent or positional keys, e.g.
            ``GaussianARKeys``, ``RoPEKeys``), whose state is carried from chunk to chunk.
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
    _check_sampler(sampler, q.shape[0])
    chunk = min(_check_chunk(chunk), n)
    return _stream(key, q, beta, n, sampler, k, max(chunk, k))


def _stream(
    key: PRNGKeyArray,
    q: Float[Array, " d"],
    beta: RealScalarLike,
    n: int | Array,
    sampler: _Sampler | AbstractKeyProcess | None,
    k: int,
    chunk: int,
) -> ContextStats:
    # n may be traced (one compilation for every context length); chunk, k static.
    if isinstance(sampler, AbstractKeyProcess):
        return _stream_process(key, q, beta, n, sampler, k, chunk)
    if sampler is None:
        d = q.shape[0]

        def sampler(kk: PRNGKeyArray, m: int) -> Float[Array, "m d"]:
            return sphere.uniform(kk, m, d, q.dtype)

    num_chunks = (n + chunk - 1) // chunk
    beta = jnp.asarray(beta, q.dtype)

    def body(i: Array, state: _State) -> _State:
        xs = sampler(jax.random.fold_in(key, i), chunk).astype(q.dtype)
        valid = i * chunk + jnp.arange(chunk) < n
        return _absorb(state, q, xs, valid, beta, k)

    state = jax.lax.fori_loop(0, num_chunks, body, _init_state(q, k))
    return _finish(state, beta)


# --------------------------------------------------------------------------
# key processes: dependent and position-dependent contexts, drawn chunk by chunk
# --------------------------------------------------------------------------


class AbstractKeyProcess(eqx.Module):
    r"""A context $x_0, x_1, \dots$ drawn chunk by chunk, with a state carried between chunks.

    The plain ``sampler`` of ``sampled_context_stats`` draws every chunk
    independently, so the keys are i.i.d.; a process also sees the state left
    by the previous chunk and the position ``start`` of the chunk's first key,
    which is what a dependent sequence (``GaussianARKeys``) or a positional
    encoding (``RoPEKeys``) needs. Chunk ``i`` of a context drawn from ``key``
    is ``sample(state, fold_in(k_steps, i), i * chunk, chunk)`` with
    ``k_init, k_steps = split(key)`` and ``state = init(k_init)`` before the first
    chunk; ``draw`` materialises the same keys.

    A subclass defines ``d`` (a static field), ``init`` and ``sample``; its
    parameters are array leaves, so a sweep over them compiles once. Pass an
    instance as ``sampler`` to ``sampled_context_stats``, ``sample_top_weights``
    and ``mean_top_weight_grid``.
    """

    d: eqx.AbstractVar[int]

    @abc.abstractmethod
    def init(self, key: PRNGKeyArray, dtype: DTypeLike) -> Any:
        """The state before position 0 (a PyTree), drawn from ``key``."""

    @abc.abstractmethod
    def sample(
        self, state: Any, key: PRNGKeyArray, start: int | Array, m: int, dtype: DTypeLike
    ) -> tuple[Any, Array]:
        """``(new_state, keys)``: the ``(m, d)`` keys at positions ``start, ..., start + m - 1``."""

    def draw(
        self, key: PRNGKeyArray, n: int, *, chunk: int = 65_536, dtype: DTypeLike = jnp.float32
    ) -> Float[Array, "n d"]:
        r"""The first $n$ keys, ``(n, d)``: exactly the context the streaming functions see for ``key`` and ``chunk``.

        Args:
            key: PRNG key (one context); n: number of keys ``>= 1``.
            chunk: keys per chunk (clipped to ``n``), as in ``sampled_context_stats``.
            dtype: floating dtype.

        Returns:
            ``(n, d)`` unit rows.

        Example:
            >>> import jax, meanfield as mf
            >>> mf.attention.GaussianARKeys(3, 0.9).draw(jax.random.key(0), 10).shape
            (10, 3)
        """
        n = check_int("n", n, minimum=1)
        chunk = min(_check_chunk(chunk), n)
        k_init, k_steps = jax.random.split(key)
        state = self.init(k_init, dtype)
        out = []
        for i in range(-(-n // chunk)):
            state, xs = self.sample(state, jax.random.fold_in(k_steps, i), i * chunk, chunk, dtype)
            out.append(xs)
        return jnp.concatenate(out)[:n]


def _check_dim(d: Any) -> int:
    return check_int("d", d, minimum=2)


class GaussianARKeys(AbstractKeyProcess):
    r"""Stationary dependent keys: directions of a Gaussian AR(1) process, $x_j = g_j / \|g_j\|$.

    $$g_j = \phi\, g_{j-1} + \sqrt{1 - \phi^2}\, \varepsilon_j, \qquad \varepsilon_j \sim N(0, I_d) \text{ i.i.d.}, \quad g_{-1} \sim N(0, I_d).$$

    Every $g_j$ is $N(0, I_d)$, so every key is exactly uniform on $S^{d-1}$ and the
    sequence is stationary. $(g_j)$ is a Gaussian Markov chain, geometrically
    ($\beta$-)mixing at rate $|\phi|^l$ at lag $l$, and
    $\operatorname{Cov}(g_j, g_{j+l}) = \phi^l I_d$, so
    $E\langle x_j, x_{j+l}\rangle = \frac{2}{d} \frac{\Gamma((d+1)/2)^2}{\Gamma(d/2)^2}\, r\, {}_2F_1(\tfrac12, \tfrac12; \tfrac d2 + 1; r^2)$,
    $r = \phi^l$. For $|\phi| < 1$ the pair $(x_j, x_{j+l})$ has a bounded joint
    density on $S^{d-1} \times S^{d-1}$, so two keys fall within distance $t$ of the
    query with probability $O(t^{2/\alpha})$: the anti-clustering condition $D'$
    holds and the extremal index is 1 (paper Sec. 2: the same exponent and Poisson
    limit as for i.i.d. keys). ``phi = 0`` gives i.i.d. uniform keys.

    A chunk is one ``lax.scan`` of the recursion; the state carried between
    chunks is the last $g$.

    Attributes:
        d: dimension (static).
        phi: AR coefficient, $|\phi| < 1$ (array leaf: sweeps compile once).

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.attention.GaussianARKeys(5, 0.9).draw(jax.random.key(0), 20_000)
        >>> c = float((x[1:] * x[:-1]).sum(1).mean())  # lag-1 correlation, about 0.877
        >>> bool(abs(c - 0.877) < 0.02)
        True
    """

    d: int = eqx.field(static=True)
    phi: Array

    def __init__(self, d: int, phi: RealScalarLike) -> None:
        self.d = _check_dim(d)
        if isinstance(phi, bool) or np.ndim(phi) != 0:
            raise TypeError(f"phi must be a real scalar in (-1, 1), got {phi!r}")
        if not -1.0 < float(phi) < 1.0:
            raise ValueError(f"phi must be in (-1, 1) (a stationary AR(1) process), got {phi!r}")
        self.phi = jnp.asarray(phi, jnp.result_type(float))

    def init(self, key: PRNGKeyArray, dtype: DTypeLike) -> Float[Array, " d"]:
        return jax.random.normal(key, (self.d,), sphere.DRAW_DTYPE).astype(dtype)

    def sample(
        self,
        state: Float[Array, " d"],
        key: PRNGKeyArray,
        start: int | Array,
        m: int,
        dtype: DTypeLike,
    ) -> tuple[Float[Array, " d"], Float[Array, "m d"]]:
        phi = self.phi.astype(dtype)
        b = jnp.sqrt(1.0 - phi**2) * jax.random.normal(key, (m, self.d), sphere.DRAW_DTYPE).astype(
            dtype
        )

        def step(g: Array, b_j: Array) -> tuple[Array, Array]:
            g = phi * g + b_j
            return g, g

        # a sequential scan: batched over contexts (vmap) it costs about as much as drawing the
        # normals; an associative_scan was 2-3x slower on CPU
        last, g = jax.lax.scan(step, state.astype(dtype), b)
        return last, sphere.normalize(g)


class StickyKeys(AbstractKeyProcess):
    r"""Clustered stationary keys (anti-clustering fails): $x_j = x_{j-1}$ with probability ``stay``, else a fresh uniform key.

    A stationary Markov chain with uniform marginal on $S^{d-1}$, geometrically
    mixing (the chain forgets its past at the first refresh, rate ``stay``$^l$),
    but every key is repeated a Geometric$(1 - \text{stay})$ number of times
    (mean $1/(1 - \text{stay})$): the extremal index is $1 - \text{stay}$ and the
    near-query points form a compound Poisson process (clusters of identical
    weights) instead of a Poisson one. The counterexample to the dependent
    extension of the critical limit: condition $D'$ is what rules it out.

    Attributes:
        d: dimension (static).
        stay: repeat probability in ``[0, 1)`` (array leaf).

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.attention.StickyKeys(3, 0.5).draw(jax.random.key(0), 10_000)
        >>> bool(abs(float((x[1:] == x[:-1]).all(1).mean()) - 0.5) < 0.03)  # repeats at rate stay
        True
    """

    d: int = eqx.field(static=True)
    stay: Array

    def __init__(self, d: int, stay: RealScalarLike) -> None:
        self.d = _check_dim(d)
        if isinstance(stay, bool) or np.ndim(stay) != 0:
            raise TypeError(f"stay must be a real scalar in [0, 1), got {stay!r}")
        if not 0.0 <= float(stay) < 1.0:
            raise ValueError(
                f"stay must be in [0, 1) (the probability of repeating the previous key), got {stay!r}"
            )
        self.stay = jnp.asarray(stay, jnp.result_type(float))

    def init(self, key: PRNGKeyArray, dtype: DTypeLike) -> Float[Array, " d"]:
        return sphere.uniform(key, 1, self.d, dtype)[0]

    def sample(
        self,
        state: Float[Array, " d"],
        key: PRNGKeyArray,
        start: int | Array,
        m: int,
        dtype: DTypeLike,
    ) -> tuple[Float[Array, " d"], Float[Array, "m d"]]:
        k_fresh, k_stay = jax.random.split(key)
        fresh = sphere.uniform(k_fresh, m, self.d, dtype)
        refresh = jax.random.uniform(k_stay, (m,)) >= self.stay
        # index of the last refresh at or before j (-1: none in this chunk, keep the carried key)
        last = jax.lax.cummax(jnp.where(refresh, jnp.arange(m), -1))
        xs = jnp.where((last >= 0)[:, None], fresh[jnp.maximum(last, 0)], state)
        return xs[-1], xs


def rope_frequencies(d: int, base: RealScalarLike = 10_000.0) -> Float[Array, " p"]:
    r"""RoPE angular frequencies $\theta_i = b^{-2i/(2p)}$, $i = 0, \dots, p - 1$, $p = \lfloor d/2 \rfloor$.

    The RoFormer schedule (Su et al. 2024): the coordinate plane $(2i, 2i+1)$ turns by
    $\theta_i$ per position (for odd $d$ the last coordinate is not rotated).

    Args:
        d: dimension ``>= 2``; base: $b > 1$ (10000 in RoFormer).

    Returns:
        ``(d // 2,)`` frequencies, the first equal to 1.

    Example:
        >>> import meanfield as mf
        >>> [round(float(t), 4) for t in mf.attention.rope_frequencies(5)]
        [1.0, 0.01]
    """
    d = _check_dim(d)
    check_finite("base", base)
    if float(base) <= 1.0:
        raise ValueError(f"base must be > 1, got {base!r}")
    p = d // 2
    return jnp.asarray(float(base) ** (-2.0 * np.arange(p) / (2 * p)), jnp.result_type(float))


def rope_rotate(
    keys: Float[Array, "m d"], positions: _ArrayLike, thetas: _ArrayLike
) -> Float[Array, "m d"]:
    r"""Rotary position encoding $x_j \mapsto R(\theta\, p_j)\, x_j$: plane $(2i, 2i+1)$ turned by $\theta_i p_j$.

    $$(x_{2i}, x_{2i+1}) \mapsto (\cos\phi\, x_{2i} - \sin\phi\, x_{2i+1},\ \sin\phi\, x_{2i} + \cos\phi\, x_{2i+1}), \quad \phi = \theta_i p_j$$

    (``sphere.rotation``'s convention); an odd last coordinate is left alone. An
    orthogonal map per key: norms are preserved. With a query at position $p_q$
    rotated the same way, $\langle R(\theta p_q) q, R(\theta p_j) x_j\rangle
    = \langle q, R(\theta (p_j - p_q)) x_j\rangle$: a fixed query sees the keys
    rotated by their relative positions.

    Args:
        keys: ``(m, d)`` keys.
        positions: ``(m,)`` positions (integers or floats).
        thetas: ``(d // 2,)`` frequencies (e.g. ``rope_frequencies(d)``).

    Returns:
        ``(m, d)`` rotated keys.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = mf.attention.rope_rotate(jnp.array([[1.0, 0.0, 0.0]]), jnp.array([jnp.pi / 2]), jnp.array([1.0]))
        >>> [round(abs(float(v)), 6) for v in x[0]]
        [0.0, 1.0, 0.0]
    """
    keys = jnp.asarray(keys)
    thetas = jnp.asarray(thetas)
    if keys.ndim != 2:
        raise ValueError(f"keys must have shape (m, d), got shape {keys.shape}")
    m, d = keys.shape
    p = d // 2
    if thetas.shape != (p,):
        raise ValueError(f"thetas must have shape (d // 2,) = ({p},), got shape {thetas.shape}")
    positions = jnp.asarray(positions)
    if positions.shape != (m,):
        raise ValueError(f"positions must have shape (m,) = ({m},), got shape {positions.shape}")
    phase = positions[:, None].astype(keys.dtype) * thetas[None, :].astype(keys.dtype)  # (m, p)
    c, s = jnp.cos(phase), jnp.sin(phase)
    even, odd = keys[:, 0 : 2 * p : 2], keys[:, 1 : 2 * p : 2]
    pairs = jnp.stack([c * even - s * odd, s * even + c * odd], axis=-1).reshape(m, 2 * p)
    return jnp.concatenate([pairs, keys[:, 2 * p :]], axis=1)


class RoPEKeys(AbstractKeyProcess):
    r"""RoPE-rotated keys $x_j = R(\theta\,(j + \text{offset}))\, k_j$ of a base context $k_0, k_1, \dots$ (``rope_rotate``).

    The base is a key process or a plain sampler ``(key, m) -> (m, d)`` (i.i.d.
    keys; default uniform on $S^{d-1}$). For uniform base keys the rotation changes
    nothing in law. For a base density $\rho$ the rotated keys are independent but
    not identically distributed: key $j$ has density $\rho(R(\theta j)^\top x)$, so
    $P(T_j < t) \sim C_j t^{1/\alpha}$ with $C_j$ the tail constant of
    $\rho(R(\theta j)^\top q)$. The count of near-query keys then has mean
    $t^{1/\alpha} \sum_j C_j$, and the critical limit is the i.i.d. one with the
    orbit-averaged density $\bar\rho(q) = \frac1n \sum_j \rho(R(\theta j)^\top q)$, which
    tends to the Haar average over the closure of $\{R(\theta j)\}$ (Weyl
    equidistribution; $\theta_i / 2\pi$ irrational). Reconstruction of the
    paper's App. F, whose text is not in our copy.

    Attributes:
        base: the unrotated keys: an ``AbstractKeyProcess``, a callable sampler, or None (uniform).
        thetas: ``(d // 2,)`` frequencies (default ``rope_frequencies(d)``).
        offset: position of the first key relative to the query (static int).
        d: dimension (static).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> x = mf.attention.RoPEKeys(5).draw(jax.random.key(0), 100)
        >>> bool(jnp.allclose(jnp.linalg.norm(x, axis=1), 1.0, atol=1e-5))
        True
    """

    base: Any
    thetas: Array
    d: int = eqx.field(static=True)
    offset: int = eqx.field(static=True)

    def __init__(
        self,
        d: int,
        base: Any = None,  # a key process, a sampler or None, checked with its own message
        thetas: _ArrayLike | None = None,
        *,
        offset: int = 0,
    ) -> None:
        self.d = _check_dim(d)
        if isinstance(base, AbstractKeyProcess):
            if base.d != self.d:
                raise ValueError(f"base process has d = {base.d}, expected d = {self.d}")
        elif base is not None and not callable(base):
            raise TypeError(
                f"base must be a key process, a callable (key, m) -> (m, d) keys or None, got {base!r}"
            )
        self.base = base
        th = (
            rope_frequencies(self.d)
            if thetas is None
            else jnp.asarray(thetas, jnp.result_type(float))
        )
        if th.shape != (self.d // 2,):
            raise ValueError(
                f"thetas must have shape (d // 2,) = ({self.d // 2},), got shape {th.shape}"
            )
        check_finite("thetas", th)
        self.thetas = th
        self.offset = check_int("offset", offset)

    def init(self, key: PRNGKeyArray, dtype: DTypeLike) -> Any:
        return self.base.init(key, dtype) if isinstance(self.base, AbstractKeyProcess) else ()

    def sample(
        self, state: Any, key: PRNGKeyArray, start: int | Array, m: int, dtype: DTypeLike
    ) -> tuple[Any, Float[Array, "m d"]]:
        if isinstance(self.base, AbstractKeyProcess):
            state, ks = self.base.sample(state, key, start, m, dtype)
        elif self.base is None:
            ks = sphere.uniform(key, m, self.d, dtype)
        else:
            ks = jnp.asarray(self.base(key, m)).astype(dtype)
        positions = start + self.offset + jnp.arange(m)
        return state, rope_rotate(ks, positions, self.thetas)


def _stream_process(
    key: PRNGKeyArray,
    q: Float[Array, " d"],
    beta: RealScalarLike,
    n: int | Array,
    process: AbstractKeyProcess,
    k: int,
    chunk: int,
) -> ContextStats:
    # the process state rides in the loop carry next to the running sums (see AbstractKeyProcess)
    num_chunks = (n + chunk - 1) // chunk
    beta = jnp.asarray(beta, q.dtype)
    k_init, k_steps = jax.random.split(key)

    def body(i: Array, carry: tuple[_State, Any]) -> tuple[_State, Any]:
        state, pstate = carry
        pstate, xs = process.sample(
            pstate, jax.random.fold_in(k_steps, i), i * chunk, chunk, q.dtype
        )
        valid = i * chunk + jnp.arange(chunk) < n
        return _absorb(state, q, xs.astype(q.dtype), valid, beta, k), pstate

    state, _ = jax.lax.fori_loop(
        0, num_chunks, body, (_init_state(q, k), process.init(k_init, q.dtype))
    )
    return _finish(state, beta)


def _check_sampler(sampler: Any, d: int) -> None:
    if isinstance(sampler, AbstractKeyProcess):
        if sampler.d != d:
            raise ValueError(
                f"sampler is a key process in dimension d = {sampler.d}, but the query has d = {d}"
            )
    elif sampler is not None and not callable(sampler):
        raise TypeError(
            f"sampler must be a callable (key, m) -> (m, d) keys, an AbstractKeyProcess or None, got {sampler!r}"
        )


def _default_query(d: int, dtype: DTypeLike) -> Float[Array, " d"]:
    return jnp.zeros((d,), dtype).at[0].set(1.0)


def uniform_distances(
    key: PRNGKeyArray, m: int, d: int, dtype: DTypeLike = jnp.float32
) -> Float[Array, " m"]:
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


def sampled_distance_stats(
    key: PRNGKeyArray,
    beta: RealScalarLike,
    n: int,
    d: int,
    *,
    k: int = 1,
    chunk: int = 65_536,
) -> ContextStats:
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


def _stream_distances(
    key: PRNGKeyArray,
    beta: RealScalarLike,
    n: int | Array,
    d: int,
    k: int,
    chunk: int,
    dtype: DTypeLike,
) -> ContextStats:
    # the law of (Z_n, A_(1..k)) for uniform keys: stream D2Qs only (no keys drawn).
    beta = jnp.asarray(beta, dtype)
    q = _default_query(d, dtype)

    def body(i: Array, state: _State) -> _State:
        T = uniform_distances(jax.random.fold_in(key, i), chunk, d, dtype)
        valid = i * chunk + jnp.arange(chunk) < n
        return _absorb(state, q, None, valid, beta, k, T=T)

    state = jax.lax.fori_loop(0, (n + chunk - 1) // chunk, body, _init_state(q, k))
    return _finish(state, beta)


def sample_top_weights(
    key: PRNGKeyArray,
    n: int,
    betas: _ArrayLike,
    d: int,
    trials: int,
    *,
    k: int = 1,
    q: _ArrayLike | None = None,
    sampler: Callable[[Array, int], Array] | AbstractKeyProcess | None = None,
    chunk: int | None = None,
    batch_size: int | None = None,
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
        sampler: key sampler ``(key, m) -> (m, d)`` or an ``AbstractKeyProcess``
            (as in ``sampled_context_stats``).
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
    _check_sampler(sampler, d)
    chunk, batch_size = _sizes(n, betas.shape[0], d, trials, k, chunk, batch_size, memory)
    return _top_weights_jit(
        key, betas, jnp.asarray(n), q, sampler, trials, k, chunk, batch_size, distances
    )


def _sizes(
    n: int,
    nb: int,
    d: int,
    trials: int,
    k: int,
    chunk: int | None,
    batch_size: int | None,
    memory: int,
) -> tuple[int, int]:
    """Chunk and trial-batch sizes keeping about ``memory`` floats live."""
    if batch_size is None:
        batch_size = int(max(1, min(trials, memory // max(1, nb * min(n, 4096) * 4))))
    if chunk is None:
        chunk = int(min(n, memory // max(1, batch_size * (nb + d + 2))))
    chunk = max(_check_chunk(chunk), k)
    return chunk, min(check_int("batch_size", batch_size, minimum=1), trials)


@eqx.filter_jit
def _top_weights_jit(
    key: PRNGKeyArray,
    betas: Float[Array, " b"],
    n: Array,
    q: Float[Array, " d"],
    sampler: _Sampler | AbstractKeyProcess | None,
    trials: int,
    k: int,
    chunk: int,
    batch_size: int,
    distances: bool,
) -> Float[Array, "trials b k"]:
    def one_trial(trial_key: PRNGKeyArray) -> Float[Array, "b k"]:
        def one_beta(beta: Array) -> Float[Array, " k"]:
            if distances:
                return _stream_distances(
                    trial_key, beta, n, q.shape[0], k, chunk, q.dtype
                ).top_weights
            return _stream(trial_key, q, beta, n, sampler, k, chunk).top_weights

        return jax.vmap(one_beta)(betas)

    keys = jax.random.split(key, trials)
    return jax.lax.map(one_trial, keys, batch_size=batch_size)


def mean_top_weight_grid(
    key: PRNGKeyArray,
    ns: Iterable[int],
    betas: _ArrayLike,
    d: int,
    trials: int,
    *,
    q: _ArrayLike | None = None,
    sampler: Callable[[Array, int], Array] | AbstractKeyProcess | None = None,
    memory: int = 2**24,
    progress: Callable | None = None,
    samples: bool = False,
) -> tuple[np.ndarray, ...]:
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
        samples: also return the ``(len(ns), trials, b)`` array of the $A_{(1)}$ samples
            (e.g. for the law of $A_{(1)}$ in some cells; no extra draws).

    Returns:
        ``(mean, stderr)`` NumPy arrays of shape ``(len(ns), b)``; ``(mean, stderr, A1)``
        with ``samples=True``.

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
        raise ValueError(
            f"betas must have shape (b,) or (len(ns), b) = ({len(ns)}, b), got {betas.shape}"
        )
    means = np.zeros(betas.shape)
    errs = np.zeros(betas.shape)
    trials = check_int("trials", trials, minimum=1)
    draws = np.zeros((len(ns), trials, betas.shape[1])) if samples else None
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
        if draws is not None:
            draws[i] = a1
        if progress is not None:
            progress(1)
    return (means, errs) if draws is None else (means, errs, draws)
