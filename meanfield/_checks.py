"""Input validation shared by the package: one clear error, raised before compilation.

Each check only inspects *concrete* values; traced values (inside ``jit`` or
``vmap``) pass through untouched, so the same constructors work under
transformations. Messages name the value received and what is accepted.
"""

from __future__ import annotations

import numbers

import jax
import numpy as np


def is_concrete(value) -> bool:
    """True when ``value`` holds no tracer (it can be inspected in Python)."""
    leaves = jax.tree_util.tree_leaves(value)
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)


def _as_float_array(name: str, value):
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number or array of numbers, got {value!r}") from None


def check_positive(name: str, value) -> None:
    """``value > 0`` (every entry, if an array), finite."""
    if not is_concrete(value):
        return
    arr = _as_float_array(name, value)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be > 0 and finite, got {_show(value)}")


def check_nonnegative(name: str, value) -> None:
    """``value >= 0`` (every entry, if an array), finite."""
    if not is_concrete(value):
        return
    arr = _as_float_array(name, value)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0 and finite, got {_show(value)}")


def check_finite(name: str, value) -> None:
    if not is_concrete(value):
        return
    arr = _as_float_array(name, value)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {_show(value)}")


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """A Python integer (not bool) with an optional lower bound."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, np.ndarray) and value.shape == () and np.issubdtype(value.dtype, np.integer):
            value = int(value)
        else:
            raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_plane(plane, d: int) -> tuple[int, int]:
    """A pair of distinct coordinate indices in ``range(d)``."""
    try:
        a, b = (int(i) for i in plane)
    except (TypeError, ValueError):
        raise TypeError(f"plane must be a pair of ints (a, b), got {plane!r}") from None
    if not (0 <= a < d and 0 <= b < d) or a == b:
        raise ValueError(f"plane must be two distinct indices in [0, {d - 1}] for d = {d}, got {plane!r}")
    return a, b


def check_choice(name: str, value, accepted) -> None:
    if value not in accepted:
        raise ValueError(f"unknown {name} {value!r}; accepted: {', '.join(map(repr, accepted))}")


def check_orthogonal(name: str, Q, atol: float = 1e-4) -> None:
    """Every trailing ``(d, d)`` matrix of ``Q`` satisfies ``Q^T Q = I`` within ``atol``."""
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


def _show(value) -> str:
    arr = np.asarray(value)
    if arr.size == 1:
        return repr(arr.item())
    return np.array2string(arr, threshold=6)
