"""Input validation shared by the package: one clear error, raised before compilation.

The ``check_*`` functions inspect *concrete* values and raise ``ValueError``/``TypeError``
before tracing; traced values (inside ``jit`` or ``vmap``) pass through them (except
``check_scalar``, which reads the shape, known at trace time). Bools are not numbers here
(``True`` is not a ``beta``), nor are strings, complex numbers or object arrays. The
``traced_*`` functions are their in-program counterparts: for a traced value they attach
the check to the program with ``equinox.error_if`` (which works under ``jit`` and ``vmap``)
and return the array they were given, to be used downstream so that the check runs.
Messages name the value received and what is accepted.

Annotations of checked parameters (the test suite checks every annotation at run time under
jaxtyping's import hook) state what reaches the check, so that a bad value gets the function's
own message: arrays are ``jaxtyping.ArrayLike`` (``Array | np.ndarray`` where the body reads an
array attribute first), real scalars ``RealScalarLike``; ints, flags and callables whose type the
function tests itself (``check_int``, ``isinstance``, ``callable``) are ``object`` (``Any`` where
the body hands them on before the test).
"""

from __future__ import annotations

import numbers
from collections.abc import Collection
from typing import Any, TypeAlias, TypeVar, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, DTypeLike

from . import _params

__all__ = [
    "RealScalarLike",
    "is_concrete",
    "check_positive",
    "check_nonnegative",
    "check_finite",
    "check_scalar",
    "check_flag",
    "check_int",
    "check_plane",
    "check_choice",
    "check_orthogonal",
    "SPHERE_ATOL",
    "sphere_atol",
    "traced_positive",
    "traced_nonnegative",
    "traced_states",
    "traced_finite",
    "check_fits_dtype",
    "POSITIVE_PARAMS",
    "traced_labels",
]

#: A real scalar as a parameter accepts it before its check: a Python or NumPy number (not
#: complex), a NumPy array or a JAX array, traced or not (``float | Array`` widened to what
#: ``float()`` and ``jnp.asarray`` take; an array of the wrong shape reaches the check).
RealScalarLike: TypeAlias = int | float | np.integer | np.floating | jax.Array | np.ndarray

# the value a ``traced_*`` function returns: the one it was given, of the same type
_X = TypeVar("_X", bound=ArrayLike)
_States = TypeVar("_States", bound=jax.Array | np.ndarray)  # states: arrays with a dtype


def is_concrete(value: Any) -> bool:
    """True when ``value`` holds no tracer (it can be inspected in Python)."""
    leaves = jax.tree_util.tree_leaves(value)
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)


def _as_float_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a float64 NumPy array; ``TypeError`` for strings, bools, complex and objects."""
    if isinstance(value, (str, bytes, bool, np.bool_, complex, np.complexfloating)) or (
        isinstance(value, (np.ndarray, jax.Array)) and np.dtype(value.dtype).kind in "USObc"
    ):
        raise TypeError(f"{name} must be a real number or array of numbers, got {value!r}")
    try:
        return np.asarray(value, dtype=np.float64)
    except OverflowError:
        raise ValueError(
            f"{name} must be finite, got an integer too large for a float: {value!r}"
        ) from None
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a real number or array of numbers, got {value!r}"
        ) from None


def check_positive(name: str, value: Any) -> None:
    """``value > 0`` (every entry, if an array), finite."""
    if not is_concrete(value):
        return
    arr = _as_float_array(name, value)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be > 0 and finite, got {_show(value)}")


def check_nonnegative(name: str, value: Any) -> None:
    """``value >= 0`` (every entry, if an array), finite."""
    if not is_concrete(value):
        return
    arr = _as_float_array(name, value)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0 and finite, got {_show(value)}")


def check_finite(name: str, value: Any) -> None:
    if not is_concrete(value):
        return
    arr = _as_float_array(name, value)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {_show(value)}")


def check_scalar(name: str, value: Any) -> None:
    """A real scalar: a number or a 0-d array, concrete or traced (``TypeError``/``ValueError``).

    A model holds one value per parameter; a tracer's shape is known at trace time, so a
    vector under ``vmap`` (a scalar per example) passes and a vector leaf does not.
    """
    if (
        isinstance(value, (str, bytes, bool, np.bool_, complex, np.complexfloating))
        or value is None
    ):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    shape = np.shape(value) if is_concrete(value) else jnp.shape(value)
    if shape != ():
        raise ValueError(
            f"{name} must be a scalar (one value per model), got shape {shape}; to sweep it, "
            f"jax.vmap a function that builds the model from a scalar {name}"
        )
    dtype = getattr(value, "dtype", None)
    if dtype is not None and np.dtype(dtype).kind not in "iuf":
        raise TypeError(f"{name} must be a real number, got {value!r} of dtype {dtype}")


def check_flag(name: str, value: object) -> bool:
    """A bool (Python or NumPy), returned as a Python bool; ``TypeError`` otherwise (``1`` or
    ``"yes"`` are not flags)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"{name} must be True or False, got {value!r} of type {type(value).__name__}"
        )
    return bool(value)


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """A Python integer (not bool) with an optional lower bound (``meanfield._params.check_int``:
    the one rule and message of integers)."""
    return _params.check_int(name, value, minimum)


def check_plane(plane: Any, d: int | None) -> tuple[int, int]:
    """A pair of distinct coordinate indices in ``range(d)`` (``d=None``: any ``>= 0``)."""
    try:
        items = tuple(plane)
    except TypeError:
        items = ()
    if len(items) != 2 or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, (bool, np.bool_)) for i in items
    ):
        raise TypeError(f"plane must be a pair of ints (a, b), got {plane!r}")
    a, b = int(items[0]), int(items[1])
    if d is None:
        if a < 0 or b < 0 or a == b:
            raise ValueError(f"plane must be two distinct indices >= 0, got {plane!r}")
        return a, b
    if not (0 <= a < d and 0 <= b < d) or a == b:
        raise ValueError(
            f"plane must be two distinct indices in [0, {d - 1}] for d = {d}, got {plane!r}"
        )
    return a, b


def check_choice(name: str, value: object, accepted: Collection[Any]) -> None:
    if value not in accepted:
        raise ValueError(f"unknown {name} {value!r}; accepted: {', '.join(map(repr, accepted))}")


def check_orthogonal(name: str, Q: Any, atol: float = 1e-4) -> None:
    r"""Every trailing ``(d, d)`` matrix of ``Q`` satisfies $Q^\top Q = I$ within ``atol``."""
    if not is_concrete(Q):
        return
    arr = np.asarray(Q, dtype=np.float64)
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"{name} must be square (..., d, d) matrices, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    eye = np.eye(arr.shape[-1])
    err = np.max(np.abs(np.swapaxes(arr, -1, -2) @ arr - eye))
    if err > atol:
        raise ValueError(
            f"{name} must be orthogonal (Q^T Q = I within {atol}), got max |Q^T Q - I| = {err:.3g}"
        )


def _show(value: Any) -> str:
    arr = np.asarray(value)
    if arr.size == 1:
        return repr(arr.item())
    return np.array2string(arr, threshold=6)


#: Largest accepted ``| ||x_i|| - 1 |`` of states on the unit sphere, by dtype item size:
#: float16/bfloat16 1e-2, float32 and float64 1e-3 (a state off the sphere by more is not a
#: rounding error: ``2 x`` gives an energy 10x off, docs/math/particles.md assumes unit rows).
SPHERE_ATOL = {2: 1e-2, 4: 1e-3, 8: 1e-3}


def sphere_atol(dtype: DTypeLike) -> float:
    """Tolerance on row norms for states of ``dtype`` (``SPHERE_ATOL``)."""
    return SPHERE_ATOL.get(np.dtype(dtype).itemsize, 1e-3)


def _error_if(x: _X, bad: ArrayLike, message: str) -> _X:
    """``equinox.error_if(x, bad, message)``; inside ``shard_map`` (``x`` varying over manual
    mesh axes) the check rides on a zero added to ``x``, whose branches have matching types."""
    typeof = getattr(jax, "typeof", None)
    mat = getattr(typeof(x), "mat", None) if typeof is not None else None
    if not getattr(mat, "varying", ()):
        return eqx.error_if(x, bad, message)
    token = eqx.error_if(jnp.zeros((), jnp.asarray(x).dtype), bad, message)
    # x varies over mesh axes: a JAX array, and the sum one of the same type
    return cast(_X, x + token)


def traced_positive(x: _X, name: str, value: Any) -> _X:
    """``x``, with ``value > 0`` and finite checked in the program when ``value`` is traced."""
    if is_concrete(value):
        return x
    v = jnp.asarray(value)
    bad = ~jnp.all(jnp.isfinite(v) & (v > 0))
    return _error_if(x, bad, f"{name} must be > 0 and finite; a traced {name} was not")


def traced_nonnegative(x: _X, name: str, value: Any) -> _X:
    """``x``, with ``value >= 0`` and finite checked in the program when ``value`` is traced."""
    if is_concrete(value):
        return x
    v = jnp.asarray(value)
    bad = ~jnp.all(jnp.isfinite(v) & (v >= 0))
    return _error_if(x, bad, f"{name} must be >= 0 and finite; a traced {name} was not")


def traced_finite(x: _X, name: str, value: Any) -> _X:
    """``x``, with every entry of ``value`` finite checked in the program when ``value`` is traced."""
    if is_concrete(value):
        return x
    bad = ~jnp.all(jnp.isfinite(jnp.asarray(value)))
    return _error_if(x, bad, f"{name} must be finite; a traced {name} was not")


#: Parameters whose contract is ``> 0``: one that rounds to 0 in the dtype of the states is
#: an error (``beta = 1e-300`` is 0 in float32, and the energy ``e^beta / (2 beta)`` infinite).
POSITIVE_PARAMS = ("beta", "m")


def check_fits_dtype(tree: Any, dtype: DTypeLike) -> None:
    """Every concrete real leaf of ``tree`` (a model's parameters) is representable in ``dtype``.

    ``ValueError`` naming the leaf (its path, e.g. ``phase.omega``) when ``|value|`` exceeds
    the largest finite number of ``dtype`` (it would become inf: ``lam = 1e300`` in float32
    gives ``inf * 0 = NaN`` on the diagonal), or when a positive parameter (``POSITIVE_PARAMS``)
    is below the smallest normal number (it would become 0). Traced leaves are not inspected.
    """
    info = jnp.finfo(dtype)
    big, tiny = float(info.max), float(info.tiny)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, (bool, np.bool_)) or not is_concrete(leaf):
            continue
        if not isinstance(leaf, (int, float, np.number, np.ndarray, jax.Array)):
            continue
        if (
            np.dtype(leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype).kind
            not in "iuf"
        ):
            continue
        name = jax.tree_util.keystr(path).lstrip(".") or "parameter"
        arr = _as_float_array(name, leaf)
        finite = arr[np.isfinite(arr)]
        if finite.size and np.max(np.abs(finite)) > big:
            raise ValueError(
                f"{name} = {_show(leaf)} is not representable in {np.dtype(dtype).name} (largest "
                f"finite value {big:.4g}); use a smaller value or float64 states"
            )
        if (
            name.rsplit(".", 1)[-1] in POSITIVE_PARAMS
            and finite.size
            and np.min(np.abs(finite)) < tiny
        ):
            raise ValueError(
                f"{name} = {_show(leaf)} rounds to 0 in {np.dtype(dtype).name} (smallest normal "
                f"value {tiny:.4g}); use a larger value or float64 states"
            )


def traced_states(x: _States, name: str = "x") -> _States:
    """``x``, with finite unit rows (``sphere_atol``) checked in the program when traced."""
    if is_concrete(x):
        return x
    atol = sphere_atol(x.dtype)
    norms = jnp.sqrt(jnp.sum(x * x, axis=-1))
    bad = ~jnp.all(jnp.isfinite(x)) | jnp.any(jnp.abs(norms - 1) > atol)
    return _error_if(
        x,
        bad,
        f"{name} must be finite with unit rows (| ||x_i|| - 1 | <= {atol:g}); a traced {name} was not",
    )


def traced_labels(x: _X, aux: Any, num: int, name: str = "Prompt labels") -> _X:
    """``x``, with integer labels ``aux`` in ``[0, num - 1]`` checked in the program when traced."""
    if is_concrete(aux):
        return x
    bad = jnp.any((aux < 0) | (aux >= num))
    return _error_if(x, bad, f"{name} must lie in [0, {num - 1}]; a traced label was out of range")
