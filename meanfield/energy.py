"""Energy and velocity of the particle system (MATH.md Sec. 1).

``E = 1/(2 n^2) sum_{i,j} h(z_i, z_j)`` and
``v_i = P_{x_i} F_i``, ``F_i = (1/n) sum_j grad_x h(z_i, z_j)``.
Because ``h`` is symmetric, ``grad_{x_i} E = F_i / n``: the velocity is
``n P_{x_i} grad_{x_i} E`` (tested against ``jax.grad``).

The entry points validate what they are given: concrete states must be finite ``(n, d)``
arrays of unit rows (``ValueError`` otherwise); traced states, a traced ``beta`` and traced
prompt labels are checked inside the program (``equinox.error_if``), so a bad value stops a
jitted or vmapped call with an error naming it instead of returning a number.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from . import sphere
from ._checks import check_choice, check_int, traced_states
from .kernels import Kernel, backend_scope, pairwise_energy, pairwise_field
from .models import Model

__all__ = ["energy", "velocity", "field", "resolve_aux", "METHODS"]

#: Accepted ``method=`` values: the structured evaluation or the single-pair reference.
METHODS = ("auto", "pairwise")


def resolve_aux(model, x, aux):
    """Validate ``x`` (shape ``(n, d)``, ``n >= 2``, ``d >= 2``) and return the labels.

    ``aux=None`` gives ``model.default_aux(n)`` (positions ``i/n``; prompt blocks
    for ``Prompt``). A given ``aux`` must have length ``n``.

    Args:
        model: a ``mf.models.Model`` (a kernel or ``SelfAttention``).
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
    if not isinstance(model, Model):
        raise TypeError(
            f"expected a kernel from mf.kernels or a model from mf.models (an mf.models.Model), "
            f"got {type(model).__name__}"
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


def _states(model, x, aux, name: str = "x"):
    """``(x, aux)`` checked: shape and labels, unit rows (concrete: ``ValueError``; traced: in
    the program), the model's concrete and traced checks."""
    aux = resolve_aux(model, x, aux)
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array (float32 or float64), got dtype {dtype}")
    sphere.check_on_sphere(x, name)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    model.check_config(x, aux)
    x = model.check_traced(traced_states(x, name), aux)
    return x, aux


def field(
    model, x: ArrayLike, aux=None, *, method: str = "auto", block_size=None, backend=None
) -> Float[Array, "n d"]:
    """Unprojected mean field ``F_i = (1/n) sum_j grad_x h(z_i, z_j)``, ``(n, d)``.

    Args:
        model: a kernel (``mf.kernels``) or model (``mf.models``).
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels (default ``model.default_aux(n)``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (reference, kernels only).
        block_size: row-tile size of the tiled exp evaluation (default automatic).
        backend: ``"native"`` (the fused C kernel on the CPU where built), ``"xla"``, or
            ``None`` (the ``mf.kernels.set_native`` setting). Part of what JAX traces.

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
    if method == "pairwise" and isinstance(model, Model) and not isinstance(model, Kernel):
        raise TypeError(f"method='pairwise' needs a pair kernel, got {type(model).__name__}")
    x, aux = _states(model, x, aux)
    with backend_scope(backend):
        if method == "pairwise":
            return pairwise_field(model, x, aux)
        return model.field(x, aux, block_size=_block(block_size))


def velocity(
    model, x: ArrayLike, aux=None, *, method: str = "auto", block_size=None, backend=None
) -> Float[Array, "n d"]:
    """Velocity of the particle flow ``v_i = P_{x_i} F_i``, shape ``(n, d)``.

    Args:
        model: a kernel (``mf.kernels``) or model (``mf.models``).
        x: ``(n, d)`` states (unit rows).
        aux: ``(n,)`` labels; ``None`` means ``mf.positions(n)`` (prompt blocks for ``Prompt``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (single-pair reference).
        block_size: row-tile size for large ``n`` (``None``: dense up to ``2^24`` pairs, else tiles).
        backend: ``"native"``, ``"xla"`` or ``None`` (the setting), as for ``field``.

    Returns:
        ``(n, d)`` tangent velocities.

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 16, 3)
        >>> v = mf.velocity(mf.kernels.USA(1.0), x)
        >>> bool(abs((v * x).sum(-1)).max() < 1e-5)   # tangent
        True
    """
    F = field(model, x, aux, method=method, block_size=block_size, backend=backend)
    return sphere.project(jnp.asarray(x), F)


def energy(
    model, x: ArrayLike, aux=None, *, method: str = "auto", block_size=None, backend=None
) -> Float[Array, ""]:
    """Interaction energy ``E = 1/(2 n^2) sum_{i,j} h(z_i, z_j)`` (scalar).

    Raises ``TypeError`` for models without a pair energy (``mf.models.SelfAttention``).

    Args:
        model: a kernel from ``mf.kernels`` (or ``mf.design.Anchored``).
        x: ``(n, d)`` states (unit rows).
        aux: ``(n,)`` labels (default ``model.default_aux(n)``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (single-pair reference).
        block_size: row-tile size for large ``n`` (default automatic).
        backend: ``"native"``, ``"xla"`` or ``None`` (the setting), as for ``field``.

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
    x, aux = _states(model, x, aux)
    with backend_scope(backend):
        if method == "pairwise":
            return pairwise_energy(model, x, aux)
        return model.energy(x, aux, block_size=_block(block_size))


def _block(block_size):
    """``block_size`` checked: ``None`` or an int ``>= 1``."""
    return None if block_size is None else check_int("block_size", block_size, minimum=1)
