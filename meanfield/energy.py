r"""Energy and velocity of the particle system (MATH.md Sec. 1).

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
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from . import sphere
from ._checks import (
    check_choice,
    check_fits_dtype,
    check_int,
    is_concrete,
    sphere_atol,
    traced_finite,
    traced_states,
)
from .kernels import (
    Kernel,
    masked_pairwise_field,
    pairwise_energy,
    pairwise_field,
    use_backend,
)
from .kernels._exp import _entry_backend
from .models import Model

__all__ = ["energy", "velocity", "field", "resolve_aux", "check_states", "METHODS"]

#: Accepted ``method=`` values: the structured evaluation or the single-pair reference.
METHODS = ("auto", "pairwise")


def resolve_aux(model: Any, x: Any, aux: Any) -> Real[Array, " n"]:
    """Validate the shape of ``x`` (``(n, d)``, ``n >= 2``, ``d >= 2``) and return the labels.

    ``aux=None`` gives ``model.default_aux(n)`` (positions $i/n$; prompt blocks
    for ``Prompt``). A given ``aux`` must be a real ``(n,)`` array; concrete labels must be
    finite (``ValueError``), traced ones are checked in the program (``equinox.error_if``,
    attached by ``check_states``).

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
    _check_model(model)
    shape = np.shape(x) if is_concrete(x) else jnp.shape(x)
    if len(shape) != 2:
        raise ValueError(f"x must have shape (n, d), got shape {shape}")
    n, d = shape
    check_int("n", n, minimum=2)
    check_int("d", d, minimum=2)
    if aux is None:
        return model.default_aux(n)
    _check_real_array("aux", aux)
    if np.ndim(aux) != 1 or np.shape(aux)[0] != n:
        raise ValueError(
            f"aux must be a 1-d array of length n = {n} (one label per particle), got shape {np.shape(aux)}"
        )
    if is_concrete(aux) and not np.all(np.isfinite(np.asarray(aux, dtype=np.float64))):
        raise ValueError("aux contains NaN or inf; every label must be finite")
    return jnp.asarray(aux)


def _check_model(model: object) -> None:
    if isinstance(model, type) and issubclass(model, Model):
        raise TypeError(
            f"got the class {model.__name__}; pass an instance, e.g. {model.__name__}(1.0)"
        )
    if not isinstance(model, Model):
        raise TypeError(
            f"expected a kernel from mf.kernels or a model from mf.models (an mf.models.Model), "
            f"got {type(model).__name__}"
        )


def _check_real_array(name: str, value: object) -> None:
    """``TypeError`` unless ``value`` is an array (or nested list) of real numbers."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be an array of real numbers, got {value!r}")
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(value).dtype
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be an array of real numbers, got {value!r}") from None
    if np.dtype(dtype).kind not in "iuf":
        raise TypeError(f"{name} must be an array of real numbers, got dtype {dtype}")


def check_states(model: Any, x: Any, aux: Any = None, name: str = "x") -> tuple[Array, Array]:
    """``(x, aux)`` validated as every entry point needs them (``field``, ``velocity``,
    ``energy``, ``mf.simulate``): one clear error before any compilation.

    * ``x``: a floating ``(n, d)`` array (float16/bfloat16, float32, float64; a nested list
      of numbers becomes JAX's default float dtype), ``n >= 2``, ``d >= 2``, finite, unit rows
      within ``sphere_atol`` (1e-3 for float32/float64). Integer, bool or complex arrays are a
      ``TypeError``; the rest a ``ValueError`` naming the bad value.
    * ``aux``: ``None`` or a real ``(n,)`` array of finite labels.
    * the model: its concrete checks (``check_config``: overflow, gauges, prompt labels) and
      every concrete parameter representable in the dtype of ``x`` (``beta = 1e-300`` is 0 in
      float32: ``ValueError``).

    Traced states, labels and parameters are checked inside the program (``equinox.error_if``):
    a bad value stops a jitted or vmapped call with an error naming it.

    Args:
        model: a kernel (``mf.kernels``) or model (``mf.models``).
        x: ``(n, d)`` states.
        aux: ``(n,)`` labels or ``None`` (``model.default_aux(n)``).
        name: the name of ``x`` in messages.

    Returns:
        ``(x, aux)`` as JAX arrays, with the in-program checks attached to ``x``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> from meanfield.energy import check_states
        >>> x, aux = check_states(mf.kernels.USA(1.0), jnp.eye(3))
        >>> x.shape, aux.shape
        ((3, 3), (3,))
        >>> check_states(mf.kernels.USA(1.0), 2 * jnp.eye(3))
        Traceback (most recent call last):
            ...
        ValueError: rows of x must have unit norm within 0.001, got a row of norm 2; ...
    """
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be a floating-point (n, d) array, got {x!r}")
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"{name} must be a floating-point array (float32 or float64; got dtype {dtype}); "
            f"convert with jnp.asarray({name}, jnp.float32)"
        )
    if dtype is None:
        _check_real_array(name, x)
    aux = resolve_aux(model, x, aux)
    sphere.check_on_sphere(
        x, name, atol=sphere_atol(dtype if dtype is not None else jnp.result_type(float))
    )
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    check_fits_dtype(model, x.dtype)
    model.check_config(x, aux)
    x = traced_states(x, name)
    if not is_concrete(aux) and jnp.issubdtype(aux.dtype, jnp.floating):
        x = traced_finite(x, "aux", aux)
    x = model.check_traced(x, aux)
    return x, aux


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
    with use_backend(backend):
        if method == "pairwise":
            if model.mask is not None:
                return masked_pairwise_field(model, x, aux)
            return pairwise_field(model, x, aux)
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
    """Velocity of the particle flow $v_i = P_{x_i} F_i$, shape ``(n, d)``.

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
    with use_backend(backend):
        if method == "pairwise":
            return pairwise_energy(model, x, aux)
        return model.energy(x, aux, block_size=block_size)


def _block(block_size: Any) -> int | None:
    """``block_size`` checked: ``None`` or an int ``>= 1``."""
    return None if block_size is None else check_int("block_size", block_size, minimum=1)
