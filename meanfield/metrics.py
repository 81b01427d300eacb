"""Collapse metrics and distances between empirical laws on the sphere.

All functions take one configuration; batch with ``jax.vmap``.
"""

from __future__ import annotations

import functools
from typing import TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ._checks import RealScalarLike, check_int, check_positive
from ._precision import matmul

__all__ = [
    "collapse_gap",
    "token_similarity",
    "order_parameter",
    "num_clusters",
    "mmd",
    "gram_rank",
    "boolean_distance",
    "CLUSTER_BLOCK",
]

#: Row tile of ``num_clusters`` (columns are twice as wide): the ``n x n`` adjacency is never formed.
CLUSTER_BLOCK = 512


def collapse_gap(x: Float[Array | np.ndarray, "n d"]) -> Float[Array, ""]:
    r"""Collapse gap (USA-AV Sec. 6.1).

    $G_x = 1 - \frac{1}{n(n-1)} \sum_{i \ne j} \langle x_i, x_j\rangle$. For unit rows
    $\sum_{i \ne j} (1 - \langle x_i, x_j\rangle) = n \sum_i \|x_i - \bar x\|^2$, so it is computed as
    $G_x = \sum_i \|x_i - \bar x\|^2 / (n - 1)$: $O(n d)$, $\ge 0$, and without the
    cancellation of $1 - (\text{mean of inner products})$ near collapse (relative accuracy
    is kept on the log scale of Fig. 2). $G_x = 0$ iff all particles coincide; a
    uniform great circle gives $1 + 1/(n-1)$; $G_x \le n/(n-1)$.

    Args:
        x: ``(n, d)`` unit rows, ``n >= 2``.

    Returns:
        scalar ``G_x``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> float(mf.metrics.collapse_gap(jnp.array([[1.0, 0.0], [1.0, 0.0]])))
        0.0
    """
    n = x.shape[0]
    xbar = jnp.mean(x, axis=0)
    return jnp.sum((x - xbar) ** 2) / (n - 1.0)


def token_similarity(X: Float[Array | np.ndarray, "n m"]) -> Float[Array, ""]:
    r"""Token similarity (docs/math/depth.md, Token similarity).

    $t_\text{sim}(X) = \|\Pi X\|_F^2 / \|X\|_F^2$ with $\Pi = \frac1n \mathbf 1 \mathbf 1^\top$: the
    energy of the mean row, $n \|\operatorname{mean}_i X_i\|^2$, over the total energy.
    Equal to 1 iff all rows are equal; invariant under scaling ``X`` and
    under right-multiplication by an orthogonal matrix.

    Args:
        X: ``(n, m)`` token matrix (not all zero).

    Returns:
        scalar in ``[0, 1]``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> round(float(mf.metrics.token_similarity(jnp.eye(4))), 4)   # orthogonal tokens: 1/n
        0.25
        >>> round(float(mf.metrics.token_similarity(jnp.ones((4, 3)))), 4)
        1.0
    """
    n = X.shape[0]
    mean = jnp.mean(X, axis=0)
    return n * jnp.sum(mean * mean) / jnp.sum(X * X)


def order_parameter(x: Float[Array | np.ndarray, "n d"]) -> Float[Array, ""]:
    r"""The order parameter $r = |\frac1n \sum_i x_i|$ of unit tokens (docs/math/noise.md): 1 at
    collapse, $O(n^{-1/2})$ for independent uniform tokens, Kuramoto's $r$ on the circle. On the
    sphere $r^2$ = ``token_similarity(x)``.

    Args:
        x: ``(n, d)`` tokens.

    Returns:
        scalar in ``[0, 1]`` for unit tokens.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> float(mf.metrics.order_parameter(jnp.array([[1.0, 0.0], [0.0, 1.0]])))   # |(1/2, 1/2)|
        0.7071067...
    """
    mean = jnp.mean(jnp.asarray(x), axis=0)
    return jnp.sqrt(jnp.sum(mean * mean))


def num_clusters(
    x: Float[Array | np.ndarray, "n d"],
    threshold: RealScalarLike = 0.1,
    *,
    block_size: int | None = None,
) -> Array:
    r"""Number of clusters: connected components of the graph joining particles
    at angular distance $\arccos \langle x_i, x_j\rangle <$ ``threshold`` (radians).

    Edges are ``clip(<x_i, x_j>, -1, 1) > cos(threshold)``. The $n \times n$ adjacency is never
    formed: the rows are sorted by their first coordinate and the pairs are visited in tiles of
    ``block_size x 2 block_size`` (default ``CLUSTER_BLOCK``), skipping a pair of tiles whose
    bounding boxes are farther apart than the largest chord of an edge,
    $\sqrt{2 \max_i \|x_i\|^2 - 2 \cos\theta}$ with $\theta$ = ``threshold``. Components are found by min-label propagation
    with hooking and pointer jumping: each round gives every particle the smallest label
    among its neighbours, hooks the root of its tree to it and compresses the trees, until
    nothing changes (a few rounds where the diameter of a component would take as many in
    plain propagation). Memory $O(n d + \text{block}^2)$; jit- and vmap-compatible (under ``vmap``
    the skipped tiles are computed and masked).

    Args:
        x: ``(n, d)`` unit rows.
        threshold: angular radius (radians) joining two particles.
        block_size: row tile of the pair visit (columns are twice as wide); ``None``:
            ``CLUSTER_BLOCK``.

    Returns:
        integer scalar, the number of components (``1..n``).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        >>> int(mf.metrics.num_clusters(x))
        3
    """
    check_positive("threshold", threshold)
    if block_size is not None:
        block_size = check_int("block_size", block_size, minimum=1)
    x = jnp.asarray(x)
    if x.shape[0] == 0:
        return jnp.sum(jnp.zeros((0,), bool))
    return _num_clusters(x, threshold, block_size=block_size)


# a tile of particles: rows, which rows are particles (not padding), their bounding box
_Tile: TypeAlias = tuple[
    Float[Array, "T d"], Bool[Array, " T"], Float[Array, " d"], Float[Array, " d"]
]
# component labels and whether the last pass changed them
_Labels: TypeAlias = tuple[Int[Array, " n"], Bool[Array, ""]]


@functools.partial(jax.jit, static_argnames="block_size")
def _num_clusters(
    x: Float[Array, "n d"], threshold: RealScalarLike, *, block_size: int | None
) -> Int[Array, ""]:
    labels = _component_labels(x, threshold, block_size=block_size)
    return jnp.sum(labels == jnp.arange(x.shape[0], dtype=labels.dtype))


def _component_labels(
    x: Float[Array, "n d"], threshold: RealScalarLike, *, block_size: int | None
) -> Int[Array, " n"]:
    """Component label of every particle: the smallest particle index in its component
    (so ``labels[i] == i`` exactly at one particle per component). Shared with
    ``mf.metastability.clusters``."""
    n, d = x.shape
    B = min(n, CLUSTER_BLOCK if block_size is None else block_size)
    C = min(n, 2 * B)
    cos_t = jnp.cos(threshold)
    # sort along the first coordinate: nearby particles share tiles, far tiles are skipped
    order = jnp.argsort(x[:, 0])
    y = x[order]
    R, K = -(-n // B) * B, -(-n // C) * C
    pad_rows = jnp.zeros((max(R, K) - n, d), y.dtype)
    yp = jnp.concatenate([y, pad_rows])
    valid = jnp.arange(max(R, K)) < n
    # bounding boxes of the tiles (padding excluded)
    big = jnp.asarray(jnp.inf, y.dtype)

    def boxes(T: int, m: int) -> tuple[Float[Array, "tiles d"], Float[Array, "tiles d"]]:
        t = yp[:m].reshape(m // T, T, d)
        ok = valid[:m].reshape(m // T, T, 1)
        return jnp.min(jnp.where(ok, t, big), axis=1), jnp.max(jnp.where(ok, t, -big), axis=1)

    rlo, rhi = boxes(B, R)
    clo, chi = boxes(C, K)
    # an edge has |x_i - x_j|^2 = |x_i|^2 + |x_j|^2 - 2 <x_i, x_j> < 2 max|x|^2 - 2 cos(threshold),
    # plus the rounding of the computed inner product (at most d eps |x_i| |x_j|): a margin
    eps = float(jnp.finfo(y.dtype).eps)
    r2 = jnp.max(jnp.sum(y * y, axis=1))
    reach = (
        jnp.sqrt(jnp.maximum(2.0 * r2 - 2.0 * cos_t, 0.0) + 8.0 * d * eps * r2) * (1.0 + 1e-3)
        + 4.0 * eps
    )
    row_tiles = (yp[:R].reshape(R // B, B, d), valid[:R].reshape(R // B, B), rlo, rhi)
    col_tiles = (yp[:K].reshape(K // C, C, d), valid[:K].reshape(K // C, C), clo, chi)
    sentinel = jnp.asarray(n, jnp.int32)

    def neighbour_min(L: Int[Array, " n"]) -> Int[Array, " n"]:
        r"""$m_i = \min_{j \sim i} L_j$ (``n`` where ``i`` has no neighbour), tile by tile."""
        Lc = jnp.concatenate([L, jnp.full((K - n,), n, L.dtype)]).reshape(K // C, C)

        def rows(args: _Tile) -> Int[Array, " B"]:
            yb, okb, lo, hi = args

            def body(
                acc: Int[Array, " B"],
                col: tuple[
                    Float[Array, "C d"],
                    Bool[Array, " C"],
                    Float[Array, " d"],
                    Float[Array, " d"],
                    Int[Array, " C"],
                ],
            ) -> tuple[Int[Array, " B"], None]:
                yc, okc, clo_, chi_, lc = col
                far = jnp.any((clo_ - hi > reach) | (lo - chi_ > reach))

                def visit(acc: Int[Array, " B"]) -> Int[Array, " B"]:
                    cos = jnp.clip(matmul(yb, yc.T), -1.0, 1.0)
                    adj = (cos > cos_t) & okc[None, :]
                    return jnp.minimum(acc, jnp.min(jnp.where(adj, lc[None, :], sentinel), axis=1))

                return jax.lax.cond(far, lambda a: a, visit, acc), None

            acc, _ = jax.lax.scan(body, jnp.full((B,), sentinel), (*col_tiles, Lc))
            return acc

        return jax.lax.map(rows, row_tiles).reshape(R)[:n]

    def compress(L: Int[Array, " n"]) -> Int[Array, " n"]:
        """Pointer jumping ``L <- L[L]`` to the roots."""

        def jump(s: _Labels) -> _Labels:
            L, _ = s
            L2 = L[L]
            return L2, jnp.any(L2 != L)

        return jax.lax.while_loop(lambda s: s[1], jump, (L, jnp.array(True)))[0]

    def round_(state: _Labels) -> _Labels:
        L, _ = state
        m = jnp.minimum(neighbour_min(L), L)
        new = L.at[L].min(m)  # hook the root of every tree to the smallest neighbouring label
        new = compress(jnp.minimum(new, m))
        return new, jnp.any(new != L)

    L0 = jnp.arange(n, dtype=jnp.int32)
    L, _ = jax.lax.while_loop(lambda s: s[1], round_, (L0, jnp.array(True)))
    # L holds roots in the sorted order: back to original indices, canonical = min index
    orig = order.astype(jnp.int32)
    canon = jax.ops.segment_min(orig, L, num_segments=n)
    return jnp.zeros((n,), jnp.int32).at[orig].set(canon[L])


def mmd(
    x: Float[Array | np.ndarray, "n d"],
    y: Float[Array | np.ndarray, "m d"],
    bandwidth: RealScalarLike = 0.5,
) -> Float[Array, ""]:
    r"""Maximum mean discrepancy between the empirical laws of ``x`` and ``y``.

    $\text{MMD}^2 = \operatorname{mean} k(x,x') + \operatorname{mean} k(y,y') - 2 \operatorname{mean} k(x,y)$
    (V-statistic) with the Gaussian kernel $k(a,b) = \exp(-\|a-b\|^2 / (2 \sigma^2))$, $\sigma$ =
    ``bandwidth``, which on the sphere is $\exp((\langle a,b\rangle - 1) / \sigma^2)$, characteristic.

    Args:
        x: ``(n, d)`` unit rows.
        y: ``(m, d)`` unit rows.
        bandwidth: the Gaussian kernel's width.

    Returns:
        scalar ``MMD`` (the square root, clipped at 0).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.array([[1.0, 0.0, 0.0]])
        >>> round(float(mf.metrics.mmd(x, -x)), 3)   # sqrt(2 - 2 e^{-8})
        1.414
    """
    check_positive("bandwidth", bandwidth)
    s = 1.0 / bandwidth**2

    def kmean(
        a: Float[Array | np.ndarray, "k d"], b: Float[Array | np.ndarray, "l d"]
    ) -> Float[Array, ""]:
        return jnp.mean(jnp.exp((matmul(a, b.T) - 1.0) * s))

    val = kmean(x, x) + kmean(y, y) - 2.0 * kmean(x, y)
    return jnp.sqrt(jnp.maximum(val, 0.0))


def gram_rank(x: Float[Array | np.ndarray, "n d"], rtol: float = 1e-3) -> Array:
    r"""Numerical rank of the configuration: $\#\{k : \sigma_k(x) > \text{rtol} \cdot \sigma_1(x)\}$
    (a great circle has rank 2, a Dirac rank 1).

    Args:
        x: ``(n, d)`` configuration.
        rtol: relative threshold on the singular values.

    Returns:
        integer scalar in ``[0, min(n, d)]``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> s = 2 * jnp.pi * jnp.arange(8) / 8
        >>> x = jnp.stack([jnp.cos(s), jnp.sin(s), 0 * s], axis=1)   # great circle
        >>> int(mf.metrics.gram_rank(x))
        2
    """
    s = jnp.linalg.svd(x, compute_uv=False)
    return jnp.sum(s > rtol * s[0])


def boolean_distance(A: Float[Array | np.ndarray, "... n m"]) -> Float[Array, "..."]:
    r"""Frobenius distance of a matrix to the nearest Boolean (0/1) matrix,
    $\| A - \mathbb 1[A > 1/2] \|_F$ (entrywise rounding is the nearest 0/1 matrix): 0 exactly
    for a Boolean matrix, e.g. the limit attention matrix of tokens in $\mathbb R^d$ (Geshkovski
    et al. 2023), whose numerical rank ``gram_rank`` measures. Leading axes are batch axes.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> float(mf.metrics.boolean_distance(jnp.array([[1.0, 0.0], [0.5, 0.5]])))
        0.7071067690849304
    """
    A = jnp.asarray(A)
    return jnp.sqrt(jnp.sum((A - (A > 0.5)) ** 2, axis=(-2, -1)))
