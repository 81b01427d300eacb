"""Energy and velocity of the particle system (MATH.md Sec. 1).

``E = 1/(2 n^2) sum_{i,j} h(z_i, z_j)`` and
``v_i = P_{x_i} F_i``, ``F_i = (1/n) sum_j grad_x h(z_i, z_j)``.
Because ``h`` is symmetric, ``grad_{x_i} E = F_i / n``: the velocity is
``n P_{x_i} grad_{x_i} E`` (tested against ``jax.grad``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from . import sphere
from ._checks import check_choice, check_int, is_concrete
from .kernels import Kernel, pairwise_energy, pairwise_field

__all__ = ["energy", "velocity", "field", "resolve_aux"]

METHODS = ("auto", "pairwise")


def resolve_aux(model, x, aux):
    """Validate ``x`` (shape ``(n, d)``, ``n >= 2``, ``d >= 2``) and return the labels.

    ``aux=None`` gives ``model.default_aux(n)`` (positions ``i/n``; prompt blocks
    for ``Prompt``). A given ``aux`` must have length ``n``.

    Args:
        model: a kernel or model with ``field``.
        x: ``(n, d)`` states.
        aux: ``(n,)`` labels or ``None``.

    Returns:
        ``(n,)`` labels.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> from meanfield.energy import resolve_aux
        >>> resolve_aux(mf.kernels.USA(1.0), jnp.zeros((4, 3)), None).tolist()
        [0.25, 0.5, 0.75, 1.0]
    """
    if not hasattr(model, "field"):
        raise TypeError(
            f"expected a kernel from mf.kernels or a model from mf.models, got {type(model).__name__}"
        )
    shape = np.shape(x)
    if len(shape) != 2:
        raise ValueError(f"x must have shape (n, d), got shape {shape}")
    n, d = shape
    check_int("n", n, minimum=2)
    check_int("d", d, minimum=2)
    if aux is None:
        return model.default_aux(n)
    if np.ndim(aux) != 1 or np.shape(aux)[0] != n:
        raise ValueError(f"aux must be a 1-d array of length n = {n} (one label per particle), got shape {np.shape(aux)}")
    return jnp.asarray(aux)


def field(model, x: Float[Array, "n d"], aux=None, *, method: str = "auto", block_size=None):
    """Unprojected mean field ``F_i = (1/n) sum_j grad_x h(z_i, z_j)``, ``(n, d)``.

    Args:
        model: a kernel (``mf.kernels``) or model (``mf.models``).
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels (default ``model.default_aux(n)``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (reference, kernels only).
        block_size: row-tile size of the tiled exp evaluation (default automatic).

    Returns:
        ``(n, d)`` field.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> F = mf.field(mf.kernels.USA(1.0), x)
        >>> F.shape, bool(jnp.allclose(F, mf.field(mf.kernels.USA(1.0), x, method="pairwise"), atol=1e-5))
        ((8, 3), True)
    """
    check_choice("method", method, METHODS)
    aux = resolve_aux(model, x, aux)
    x = jnp.asarray(x)
    if hasattr(model, "check_config"):
        model.check_config(x, aux)
    if method == "pairwise":
        if not isinstance(model, Kernel):
            raise TypeError(f"method='pairwise' needs a pair kernel, got {type(model).__name__}")
        return pairwise_field(model, x, aux)
    return model.field(x, aux, block_size=block_size)


def velocity(model, x: Float[Array, "n d"], aux=None, *, method: str = "auto", block_size=None):
    """Velocity of the particle flow ``v_i = P_{x_i} F_i``, shape ``(n, d)``.

    Args:
        model: a kernel (``mf.kernels``) or model (``mf.models``).
        x: ``(n, d)`` states (unit rows).
        aux: ``(n,)`` labels; ``None`` means ``mf.positions(n)`` (prompt blocks for ``Prompt``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (single-pair reference).
        block_size: row-tile size for large ``n`` (``None``: dense up to ``2^24`` pairs, else tiles).

    Returns:
        ``(n, d)`` tangent velocities.

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 16, 3)
        >>> v = mf.velocity(mf.kernels.USA(1.0), x)
        >>> bool(abs((v * x).sum(-1)).max() < 1e-5)   # tangent
        True
    """
    F = field(model, x, aux, method=method, block_size=block_size)
    return sphere.project(jnp.asarray(x), F)


def energy(model, x: Float[Array, "n d"], aux=None, *, method: str = "auto", block_size=None):
    """Interaction energy ``E = 1/(2 n^2) sum_{i,j} h(z_i, z_j)`` (scalar).

    Raises ``TypeError`` for models without a pair energy (``mf.models.SelfAttention``).

    Args:
        model: a kernel from ``mf.kernels`` (or ``mf.design.Anchored``).
        x: ``(n, d)`` states (unit rows).
        aux: ``(n,)`` labels (default ``model.default_aux(n)``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (single-pair reference).
        block_size: row-tile size for large ``n`` (default automatic).

    Returns:
        scalar energy.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.tile(jnp.array([[0.0, 0.0, 1.0]]), (4, 1))     # collapsed
        >>> float(mf.energy(mf.kernels.USA(2.0), x)) == float(mf.theory.max_energy(2.0))
        True
    """
    check_choice("method", method, METHODS)
    if not isinstance(model, Kernel):
        raise TypeError(
            f"{type(model).__name__} has no pair energy; energy is defined for the kernels in "
            f"mf.kernels (USA, DistanceBias, Toeplitz, RoPE, PhaseField, Gauge, Prompt)"
        )
    aux = resolve_aux(model, x, aux)
    x = jnp.asarray(x)
    model.check_config(x, aux)
    if method == "pairwise":
        return pairwise_energy(model, x, aux)
    return model.energy(x, aux, block_size=block_size)


def _is_concrete(x) -> bool:  # re-export for integrate
    return is_concrete(x)
