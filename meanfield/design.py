"""Inverse design: gauges and phase fields whose maximisers realise a target law (USA-AV Thms. 2 and 4).

For a gauge kernel ``h = exp(beta <Psi(xi) x, Psi(zeta) y>) / beta`` every configuration
``x(xi) = Psi(xi)^T u`` attains the maximal energy ``e^beta / (2 beta)`` (MATH.md). Choosing
``Psi`` so that ``Psi(xi)^T u`` is a prescribed point per label realises any target law.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

__all__ = ["rotation_to", "prompt_gauges"]


def rotation_to(t: Float[Array, " d"], u: Float[Array, " d"]) -> Float[Array, "d d"]:
    """The rotation ``R`` (``det R = 1``) in the plane ``span(t, u)`` with ``R t = u``.

    With ``c = <t, u>``, ``v = u - c t``, ``s = ||v||``, ``e = v / s``::

        R = I + (c - 1)(t t^T + e e^T) + s (e t^T - t e^T)

    identity on ``span(t, u)^perp``. ``t = u`` gives ``I``; ``t = -u`` a half-turn in a
    plane containing ``t``. ``t`` and ``u`` are unit vectors.
    """
    t = jnp.asarray(t)
    u = jnp.asarray(u, t.dtype)
    d = t.shape[-1]
    c = jnp.dot(t, u)
    v = u - c * t
    s = jnp.linalg.norm(v)
    # a unit vector orthogonal to t, for the antipodal case
    k = jnp.argmin(jnp.abs(t))
    ek = jnp.zeros_like(t).at[k].set(1.0)
    w = ek - jnp.dot(ek, t) * t
    w = w / jnp.linalg.norm(w)
    tiny = jnp.sqrt(jnp.finfo(t.dtype).eps)
    e = jnp.where(s > tiny, v / jnp.where(s > tiny, s, 1.0), w)
    s_eff = jnp.where(s > tiny, s, 0.0)
    c_eff = jnp.where(s > tiny, c, jnp.sign(c))
    I = jnp.eye(d, dtype=t.dtype)
    R = I + (c_eff - 1.0) * (jnp.outer(t, t) + jnp.outer(e, e)) + s_eff * (jnp.outer(e, t) - jnp.outer(t, e))
    return R


def prompt_gauges(targets: Float[Array, "K d"], u: Float[Array, " d"]) -> Float[Array, "K d d"]:
    """Gauges ``Psi_k`` (orthogonal, ``det = 1``) with ``Psi_k @ targets[k] == u``.

    For ``mf.kernels.Prompt(beta, prompt_gauges(targets, u))`` the configuration
    ``x(z) = Psi_z^T u = targets[z]`` is a global maximiser (energy ``e^beta / (2 beta)``):
    the prompt-conditional laws are Diracs at the targets, so the marginal is the target
    law ``sum_k w_k delta_{targets[k]}`` (``w_k`` the label frequencies).

    Args:
        targets: ``(K, d)`` unit vectors.
        u: ``(d,)`` unit vector (the common point of the gauge frame).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> T = jnp.eye(3)
        >>> P = mf.design.prompt_gauges(T, jnp.array([0.0, 0.0, 1.0]))
        >>> bool(jnp.allclose(jnp.einsum("kij,kj->ki", P, T), jnp.array([0.0, 0.0, 1.0]), atol=1e-6))
        True
    """
    T = jnp.asarray(targets)
    if T.ndim != 2:
        raise ValueError(f"targets must have shape (K, d), got {T.shape}")
    uu = jnp.asarray(u, T.dtype if jnp.issubdtype(T.dtype, jnp.floating) else jnp.float32)
    if uu.shape != (T.shape[1],):
        raise ValueError(f"u must have shape ({T.shape[1]},) to match targets (K, d) = {T.shape}, got {uu.shape}")
    for name, a in (("targets", T), ("u", uu)):
        if not isinstance(a, jax.core.Tracer):
            norms = np.linalg.norm(np.asarray(a, np.float64), axis=-1)
            if not np.all(np.isfinite(norms)) or np.max(np.abs(norms - 1.0)) > 1e-3:
                raise ValueError(f"{name} must be unit vectors (norm 1 within 1e-3), got norms {norms}")
    return jax.vmap(rotation_to, in_axes=(0, None))(T.astype(uu.dtype), uu)
