r"""Energy and velocity of the particle system (docs/math/particles.md).

$E = \frac{1}{2 n^2} \sum_{i,j} h(z_i, z_j)$ and
$v_i = P_{x_i} F_i$, $F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$.
Because $h$ is symmetric, $\nabla_{x_i} E = F_i / n$: the velocity is
$n P_{x_i} \nabla_{x_i} E$ (tested against ``jax.grad``).

The entry points validate what they are given, exactly as ``mf.simulate`` does
(``check_states``): concrete states must be finite floating ``(n, d)`` arrays of unit rows,
labels finite, the model's parameters representable in the states' dtype (``ValueError``;
``TypeError`` for an integer, bool or complex array), ``block_size`` an int ``>= 1`` whatever
the ``method``; traced states, labels, a traced ``beta`` and traced prompt labels are checked
inside the program (``equinox.error_if``), so a bad value stops a jitted or vmapped call with
an error naming it instead of returning a number.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from . import normalization, sphere
from ._checks import (
    check_choice,
    check_int,
)
from .kernels import (
    Kernel,
    masked_pairwise_field,
    pairwise_energy,
    pairwise_field,
)
from .kernels._exp import _entry_backend, _scope_backend
from .models import Model, _check_model, check_states, resolve_aux

__all__ = ["energy", "velocity", "field", "resolve_aux", "check_states", "METHODS"]

#: Accepted ``method=`` values: the structured evaluation or the single-pair reference.
METHODS = ("auto", "pairwise")


def field(
    model: Any,
    x: ArrayLike,
    aux: Any = None,
    *,
    method: str = "auto",
    block_size: Any = None,
    backend: str | None = None,
) -> Float[Array, "n d"]:
    r"""Unprojected mean field $F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$, ``(n, d)``.

    Args:
        model: a kernel (``mf.kernels``) or model (``mf.models``).
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels (default ``model.default_aux(n)``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (reference, kernels only).
        block_size: row-tile size of the tiled exp evaluation (default automatic).
        backend: the exp-kernel evaluation (``mf.kernels.BACKENDS``): ``"auto"`` (the fused C
            kernel where it was measured faster on this machine, ``meanfield info``), ``"native"``
            (the fused C kernel on the CPU; an error where it cannot run) or ``"xla"``; ``None``
            (default): the enclosing ``mf.kernels.use_backend``, else ``"auto"``. Part of what
            JAX traces; kernels without an exp evaluation ignore it.

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
    backend = _entry_backend(backend)
    block_size = _block(block_size)
    if method == "pairwise" and isinstance(model, Model) and not isinstance(model, Kernel):
        raise TypeError(f"method='pairwise' needs a pair kernel, got {type(model).__name__}")
    x, aux = check_states(model, x, aux)
    if isinstance(
        model, Kernel
    ):  # a traced beta past the overflow bound stops here, as in ``energy``
        x = model.check_traced_energy(x, aux)
    with _scope_backend(backend):
        if method == "pairwise":  # the kernel's F, then its scheme's normalisation (as ``field``)
            F = (masked_pairwise_field if model.mask is not None else pairwise_field)(model, x, aux)
            return normalization.scheme_of(model).output(F)
        return model.field(x, aux, block_size=block_size)


def velocity(
    model: Any,
    x: ArrayLike,
    aux: Any = None,
    *,
    method: str = "auto",
    block_size: Any = None,
    backend: str | None = None,
) -> Float[Array, "n d"]:
    r"""Velocity of the particle flow $v_i = P_{x_i} F_i$, shape ``(n, d)``.

    For the layer-norm schemes of ``mf.normalization``, $F$ is the model's ``field`` (nGPT's
    $\alpha A / \|A\|$, Peri-LN's $A / \|A\|$): $v$ is $\dot\theta$ at radius 1 and time 0 (the
    speed $1 / r_i$ of Pre-, Mix-, Peri-LN and $1/\sqrt{t + 1}$ of LN-scaling are ``mf.simulate``'s).

    Args:
        model: a kernel (``mf.kernels``) or model (``mf.models``).
        x: ``(n, d)`` states (unit rows).
        aux: ``(n,)`` labels; ``None`` means ``mf.positions(n)`` (prompt blocks for ``Prompt``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (single-pair reference).
        block_size: row-tile size for large ``n`` (``None``: dense up to $2^{24}$ pairs, else tiles).
        backend: ``"auto"``, ``"native"``, ``"xla"`` or ``None``, as for ``field``.

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
    model: Any,
    x: ArrayLike,
    aux: Any = None,
    *,
    method: str = "auto",
    block_size: Any = None,
    backend: str | None = None,
) -> Float[Array, ""]:
    r"""Interaction energy $E = \frac{1}{2 n^2} \sum_{i,j} h(z_i, z_j)$ (scalar).

    Raises ``TypeError`` for models without a pair energy (``mf.models.SelfAttention``).

    Args:
        model: a kernel from ``mf.kernels`` (or ``mf.design.Anchored``).
        x: ``(n, d)`` states (unit rows).
        aux: ``(n,)`` labels (default ``model.default_aux(n)``).
        method: ``"auto"`` (structured evaluation) or ``"pairwise"`` (single-pair reference).
        block_size: row-tile size for large ``n`` (default automatic).
        backend: ``"auto"``, ``"native"``, ``"xla"`` or ``None``, as for ``field``.

    Returns:
        scalar energy.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.tile(jnp.array([[0.0, 0.0, 1.0]]), (4, 1))     # collapsed
        >>> float(mf.energy(mf.kernels.USA(2.0), x)) == float(mf.theory.max_energy(2.0))
        True
    """
    check_choice("method", method, METHODS)
    backend = _entry_backend(backend)
    block_size = _block(block_size)
    _check_model(model)
    if not isinstance(model, Kernel):
        raise TypeError(
            f"{type(model).__name__} has no pair energy; energy is defined for the kernels in "
            f"mf.kernels (USA, DistanceBias, Toeplitz, RoPE, PhaseField, Gauge, Prompt)"
        )
    model.refuse_masked_energy()
    x, aux = check_states(model, x, aux)
    x = model.check_traced_energy(x, aux)
    with _scope_backend(backend):
        if method == "pairwise":
            return pairwise_energy(model, x, aux)
        return model.energy(x, aux, block_size=block_size)


def _block(block_size: Any) -> int | None:
    """``block_size`` checked: ``None`` or an int ``>= 1``."""
    return None if block_size is None else check_int("block_size", block_size, minimum=1)
