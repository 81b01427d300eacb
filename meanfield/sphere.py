"""Geometry of the unit sphere ``S^{d-1}``: sampling, tangent projections, rotations.

Everything acts on single arrays; batch with ``jax.vmap``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._checks import check_int, check_plane

__all__ = [
    "uniform",
    "rotation",
    "normalize",
    "project",
    "tangent_basis",
    "check_on_sphere",
]


def uniform(key, n: int, d: int, dtype=jnp.float32) -> Float[Array, "n d"]:
    """``n`` i.i.d. points uniform on ``S^{d-1}``.

    ``x_i = g_i / ||g_i||`` with ``g_i ~ N(0, I_d)`` (rotation invariance of the
    Gaussian).

    Args:
        key: a ``jax.random`` key.
        n: number of points, ``n >= 1``.
        d: ambient dimension, ``d >= 2``.
        dtype: floating dtype of the result.

    Returns:
        ``(n, d)`` array with unit rows.

    Example:
        >>> import jax, meanfield as mf
        >>> mf.sphere.uniform(jax.random.key(0), 4, 3).shape
        (4, 3)
    """
    check_int("n", n, minimum=1)
    check_int("d", d, minimum=2)
    g = jax.random.normal(key, (n, d), dtype=dtype)
    return normalize(g)


def normalize(x: Float[Array, "... d"]) -> Float[Array, "... d"]:
    """Radial projection ``x / ||x||`` of each row onto the sphere."""
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def project(x: Float[Array, "d"], v: Float[Array, "d"]) -> Float[Array, "d"]:
    """Tangent projection ``P_x v = v - <x, v> x`` (``x`` a unit vector).

    Works row-wise on ``(n, d)`` arrays as well.
    """
    return v - jnp.sum(x * v, axis=-1, keepdims=True) * x


def rotation(theta, d: int, plane: tuple[int, int] = (0, 1)) -> Float[Array, "d d"]:
    """Rotation ``R_theta`` by angle ``theta`` in ``span(e_a, e_b)``, identity elsewhere.

    ``R e_a = cos(theta) e_a + sin(theta) e_b``, ``R e_b = -sin(theta) e_a + cos(theta) e_b``.
    ``theta`` may be traced (the result is differentiable in it); ``d`` and
    ``plane`` are static.

    Example:
        >>> import meanfield as mf
        >>> R = mf.sphere.rotation(0.5, 3)
        >>> bool(abs(R[0, 0] - 0.8775826) < 1e-6)
        True
    """
    check_int("d", d, minimum=2)
    a, b = check_plane(plane, d)
    theta = jnp.asarray(theta)
    dtype = theta.dtype if jnp.issubdtype(theta.dtype, jnp.floating) else jnp.result_type(float)
    c, s = jnp.cos(theta).astype(dtype), jnp.sin(theta).astype(dtype)
    R = jnp.eye(d, dtype=dtype)
    R = R.at[a, a].set(c).at[b, b].set(c)
    R = R.at[b, a].set(s).at[a, b].set(-s)
    return R


def tangent_basis(x: Float[Array, "d"]) -> Float[Array, "d d-1"]:
    """An orthonormal basis of the tangent space ``x^perp`` (columns).

    Built from a Householder reflection mapping ``e_k`` to ``x`` (``k`` the
    coordinate where ``|x_k|`` is largest, for stability); the remaining
    columns span ``x^perp``.
    """
    d = x.shape[-1]
    k = jnp.argmax(jnp.abs(x))
    e = jnp.zeros_like(x).at[k].set(1.0)
    sgn = jnp.where(x[k] >= 0, 1.0, -1.0).astype(x.dtype)
    w = x - sgn * e
    w = w / jnp.maximum(jnp.linalg.norm(w), jnp.finfo(x.dtype).tiny)
    H = jnp.eye(d, dtype=x.dtype) - 2.0 * jnp.outer(w, w)
    # H maps e_k to sgn * x; the other columns are orthonormal and orthogonal to x.
    idx = jnp.arange(d - 1)
    idx = idx + (idx >= k)
    return H[:, idx]


def check_on_sphere(x, name: str = "x0", atol: float = 1e-3) -> None:
    """Raise ``ValueError`` unless ``x`` is a finite ``(n, d)`` array of unit rows.

    Only concrete arrays are checked (traced values pass through).
    """
    if isinstance(x, jax.core.Tracer):
        return
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf; every entry must be finite")
    norms = np.linalg.norm(arr.astype(np.float64), axis=-1)
    worst = float(np.max(np.abs(norms - 1.0)))
    if worst > atol:
        raise ValueError(
            f"rows of {name} must have unit norm within {atol}, got a row of norm "
            f"{norms[np.argmax(np.abs(norms - 1.0))]:.6g}; normalise with "
            f"mf.sphere.normalize({name}) (x / ||x|| row-wise)"
        )
