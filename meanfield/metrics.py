"""Collapse metrics and distances between empirical laws on the sphere.

All functions take one configuration; batch with ``jax.vmap``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._checks import RealScalarLike, check_positive

__all__ = ["collapse_gap", "token_similarity", "num_clusters", "mmd", "gram_rank"]


def collapse_gap(x: Float[Array | np.ndarray, "n d"]) -> Float[Array, ""]:
    """Collapse gap (USA-AV Sec. 6.1).

    ``G_x = 1 - 1/(n(n-1)) sum_{i != j} <x_i, x_j>``. For unit rows
    ``sum_{i != j} (1 - <x_i, x_j>) = n sum_i ||x_i - xbar||^2``, so it is computed as
    ``G_x = sum_i ||x_i - xbar||^2 / (n - 1)``: O(n d), ``>= 0``, and without the
    cancellation of ``1 - (mean of inner products)`` near collapse (relative accuracy
    is kept on the log scale of Fig. 2). ``G_x = 0`` iff all particles coincide; a
    uniform great circle gives ``1 + 1/(n-1)``; ``G_x <= n/(n-1)``.

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
    """Token similarity (post-norm rank collapse, MATH.md Sec. 3).

    ``t_sim(X) = ||Pi X||_F^2 / ||X||_F^2`` with ``Pi = (1/n) 1 1^T``: the
    energy of the mean row, ``n ||mean_i X_i||^2``, over the total energy.
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


def num_clusters(x: Float[Array | np.ndarray, "n d"], threshold: RealScalarLike = 0.1) -> Array:
    """Number of clusters: connected components of the graph joining particles
    at angular distance ``arccos <x_i, x_j> < threshold`` (radians).

    The components are found by iterating the boolean adjacency to a fixed point
    (label propagation, at most ``n`` rounds, jit- and vmap-compatible).

    Args:
        x: ``(n, d)`` unit rows.
        threshold: angular radius (radians) joining two particles.

    Returns:
        integer scalar, the number of components (``1..n``).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        >>> int(mf.metrics.num_clusters(x))
        3
    """
    check_positive("threshold", threshold)
    n = x.shape[0]
    cos = jnp.clip(x @ x.T, -1.0, 1.0)
    adj = cos > jnp.cos(threshold)
    labels0 = jnp.arange(n)

    def body(state):
        labels, _ = state
        # each node takes the smallest label among its neighbours
        new = jnp.min(jnp.where(adj, labels[None, :], n), axis=1)
        new = jnp.minimum(new, labels)
        return new, jnp.any(new != labels)

    labels, _ = jax.lax.while_loop(lambda s: s[1], body, (labels0, jnp.array(True)))
    return jnp.sum(labels == labels0)


def mmd(
    x: Float[Array | np.ndarray, "n d"],
    y: Float[Array | np.ndarray, "m d"],
    bandwidth: RealScalarLike = 0.5,
) -> Float[Array, ""]:
    """Maximum mean discrepancy between the empirical laws of ``x`` and ``y``.

    ``MMD^2 = mean k(x,x') + mean k(y,y') - 2 mean k(x,y)`` (V-statistic) with
    the Gaussian kernel ``k(a,b) = exp(-||a-b||^2 / (2 bandwidth^2))``, which
    on the sphere is ``exp((<a,b> - 1) / bandwidth^2)``, characteristic.

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

    def kmean(a, b):
        return jnp.mean(jnp.exp((a @ b.T - 1.0) * s))

    val = kmean(x, x) + kmean(y, y) - 2.0 * kmean(x, y)
    return jnp.sqrt(jnp.maximum(val, 0.0))


def gram_rank(x: Float[Array | np.ndarray, "n d"], rtol: float = 1e-3) -> Array:
    """Numerical rank of the configuration: ``#{k : sigma_k(x) > rtol * sigma_1(x)}``
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
