"""Closed forms and limit laws from the papers (MATH.md).

Section 1 (USA-AV particle dynamics) first; the long-context attention laws
(MATH.md Sec. 2) follow below.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._checks import check_int, check_positive

__all__ = [
    "max_energy",
    "great_circle_gap",
    "great_circle_energy",
    "latitude_height",
]


# --------------------------------------------------------------------------
# Section 1: USA-AV
# --------------------------------------------------------------------------


def max_energy(beta, *, rescaled: bool = False):
    """Maximal energy of every exp-gauge kernel (USA, RoPE, phase field, gauge, prompt).

    ``h <= e^beta / beta`` so ``E = 1/(2 n^2) sum h <= e^beta / (2 beta)``, attained
    by the maximisers (Dirac in the gauge frame), for any finite ``n``.
    With ``rescaled=True`` (the time-rescaled kernels, ``h e^{-beta}``) it is
    ``1 / (2 beta)``.
    """
    check_positive("beta", beta)
    beta = jnp.asarray(beta)
    if rescaled:
        return 1.0 / (2.0 * beta)
    return jnp.exp(beta) / (2.0 * beta)


def great_circle_gap(n: int):
    """``G_x`` of ``n`` equally spaced points on a great circle: ``1 + 1/(n-1)``.

    (``sum_{i,j} <x_i, x_j> = 0`` so ``G_x = 1 + n/(n(n-1))``.)
    """
    n = check_int("n", n, minimum=2)
    return 1.0 + 1.0 / (n - 1)


def great_circle_energy(m: int = 1):
    """Maximal energy of the Toeplitz kernel ``cos(2 pi m (t-s)) <x,y>``: 1/4.

    Attained by ``x(s) = cos(2 pi m s) a + sin(2 pi m s) b`` (uniform great circle
    traversed ``m`` times): ``E = 1/2 * mean_{s,t} cos^2(2 pi m (t-s)) = 1/4``.
    """
    check_int("m", m, minimum=1)
    return 0.25


def latitude_height(u, plane: tuple[int, int] = (0, 1)):
    """Height of the RoPE latitude circle ``x(s) = R_{-omega s} u``.

    A rotation in ``span(e_a, e_b)`` fixes the orthogonal complement, so the
    circle lies at ``||P_{E^perp} u||`` from the plane ``E``: the norm of the
    components of ``u`` outside ``plane``.
    """
    u = jnp.asarray(u)
    a, b = plane
    mask = jnp.ones(u.shape[-1], dtype=bool).at[a].set(False).at[b].set(False)
    return jnp.sqrt(jnp.sum(jnp.where(mask, u * u, 0.0), axis=-1))
