"""Stability of critical points: the Riemannian Hessian of the energy on ``(S^{d-1})^n``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from . import sphere
from .energy import energy as _energy
from .energy import resolve_aux
from .kernels import Kernel

__all__ = ["tangent_hessian", "tangent_frame", "classify"]


def tangent_frame(x: Float[Array, "n d"]) -> Float[Array, "n d d-1"]:
    """Orthonormal tangent bases ``B_i`` (columns span ``x_i^perp``), one per particle."""
    return jax.vmap(sphere.tangent_basis)(x)


def tangent_hessian(kernel, x: Float[Array, "n d"], aux=None) -> Float[Array, "m m"]:
    """Riemannian Hessian of ``E = mf.energy(kernel, x, aux)`` on ``(S^{d-1})^n`` at ``x``.

    In the orthonormal tangent basis ``B = diag(B_1, .., B_n)`` (``m = n (d - 1)``)::

        H = B^T (nabla^2 E) B - diag_i(<x_i, nabla_{x_i} E> I_{d-1})

    the Euclidean Hessian projected on the tangent space plus the curvature (Weingarten)
    term of the sphere constraint. Symmetric. At a collapsed USA state the prediction is
    ``d - 1`` zero modes (the global rotations moving the collapse point) and the eigenvalue
    ``-e^beta / n`` with multiplicity ``(n - 1)(d - 1)``: from
    ``<x_i, x_j> = 1 - ||xi_i - xi_j||^2 / 2 + O(3)`` the quadratic form is
    ``-(e^beta / (2n)) sum_i ||xi_i - mean xi||^2``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.tile(jnp.array([[0.0, 0.0, 1.0]]), (4, 1))
        >>> H = mf.analysis.tangent_hessian(mf.kernels.USA(1.0), x)
        >>> H.shape
        (8, 8)
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"tangent_hessian needs a kernel with an energy (mf.kernels), got {type(kernel).__name__}")
    aux = resolve_aux(kernel, x, aux)
    x = jnp.asarray(x)
    n, d = x.shape
    f = lambda y: _energy(kernel, y, aux)  # noqa: E731
    g = jax.grad(f)(x)
    Hess = jax.hessian(f)(x).reshape(n * d, n * d)
    B = tangent_frame(x)  # (n, d, d-1)
    Bfull = jax.scipy.linalg.block_diag(*[B[i] for i in range(n)])  # (n d, n (d-1))
    H = Bfull.T @ Hess @ Bfull
    radial = jnp.sum(x * g, axis=-1)  # <x_i, grad_i E>
    H = H - jnp.diag(jnp.repeat(radial, d - 1))
    return 0.5 * (H + H.T)


def classify(H: Float[Array, "m m"], *, num_zero_modes: int, rtol: float = 1e-6) -> dict:
    """Classify a critical point from its tangent Hessian.

    Eigenvalues within ``rtol * max|lambda|`` of 0 are zero modes. A local maximiser has
    no positive eigenvalue and exactly the ``num_zero_modes`` symmetry zero modes;
    a saddle has positive ones. Returns the counts and the extreme eigenvalues.
    """
    lam = jnp.linalg.eigvalsh(H)
    scale = jnp.max(jnp.abs(lam))
    zero = jnp.abs(lam) <= rtol * scale
    pos = int(jnp.sum((lam > 0) & ~zero))
    nz = int(jnp.sum(zero))
    kind = "saddle" if pos > 0 else ("maximiser" if nz == num_zero_modes else "degenerate")
    return {"kind": kind, "positive": pos, "zero": nz, "negative": int(lam.size - pos - nz),
            "largest": float(lam[-1]), "smallest": float(lam[0])}
