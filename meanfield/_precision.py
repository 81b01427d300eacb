"""The precision of the engine's matrix products: chosen, not inherited.

JAX's default float32 matmul precision depends on the device: on NVIDIA GPUs (Ampere and later)
it is TF32 (about 10 mantissa bits), on TPUs bfloat16 passes, on the CPU full float32. Every
``einsum``, ``matmul`` and ``dot`` of meanfield's engine on JAX arrays goes through the helpers
below, which state ``precision=current()``: ``lax.Precision.HIGHEST`` (float32 products at full
precision, the CPU's numbers to rounding on every device) unless the caller chose otherwise with
``mf.matmul_precision``.

``matmul_precision(p)`` enters two scopes for its block:

* ``_CHOSEN`` (a ``ScopedValue``: a context variable, and a ``jax.make_user_context``, part of
  ``jit``'s cache key and of the trace context, created at the first ``matmul_precision``, never
  at import: creating one changes every cache key of the process, so that every function a user
  had jitted would be traced again), set to ``p``: ``current()`` then returns ``None`` and the
  helpers state no precision of their own;
* ``jax.default_matmul_precision(p)`` (JAX's config, also in ``jit``'s cache key): the precision
  that the products traced in the block then take, and every other JAX product in it.

Both are in the cache key, so a program traced inside the block is traced again there and is
never reused outside it, whatever other precision settings the caller uses (JAX's own
``jax.default_matmul_precision`` alone does not change meanfield's products: they state
HIGHEST). On the CPU the precision does not change float32 results (XLA:CPU computes float32
products in float32 whatever the precision), only on accelerators.

Example:
    >>> import jax, jax.numpy as jnp, meanfield as mf
    >>> from meanfield import _precision
    >>> _precision.current() == jax.lax.Precision.HIGHEST
    True
    >>> with mf.matmul_precision("default"):
    ...     print(_precision.current())
    None
    >>> a = jnp.ones((2, 3))
    >>> "HIGHEST" in str(jax.make_jaxpr(lambda a: _precision.matmul(a, a.T))(a))
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

__all__ = [
    "PRECISIONS",
    "ScopedValue",
    "current",
    "dot",
    "einsum",
    "matmul",
    "matmul_precision",
    "third_party",
]

#: The precisions ``matmul_precision`` accepts (JAX's names): ``"default"`` (the device's
#: fastest: TF32 on NVIDIA GPUs, one bfloat16 pass on TPUs), ``"high"`` (bfloat16_3x on TPUs,
#: TF32 on GPUs), ``"highest"`` (full float32).
PRECISIONS = ("default", "high", "highest")


class ScopedValue:
    """A value scoped to a ``with`` block (a ``contextvars.ContextVar``), which a user's scope also
    puts in ``jit``'s cache key through a ``jax.make_user_context``.

    ``self(value)`` (a user's scope: ``mf.matmul_precision``, ``mf.kernels.use_backend``) sets
    the variable and enters the JAX user context, created at the first such scope: creating a
    JAX user context changes the trace context of the whole process, so every function jitted
    before it would be traced again at its next call; created lazily, a process that never
    enters a user's scope never creates one, and the engine's first call inside a user's
    ``jax.jit`` leaves that function's cache alone. ``self.internal(value)`` (the engine's own
    scope, set from a static argument of the program being traced) sets the variable only.
    ``value``: the innermost scope's value, the default outside any. (A JAX without
    ``make_user_context``: the variable alone.)

    Example:
        >>> from meanfield._precision import ScopedValue
        >>> v = ScopedValue("auto", "demo")
        >>> with v.internal("xla"):
        ...     print(v.value)
        xla
        >>> v.value, v.created
        ('auto', False)
    """

    def __init__(self, default: Any, name: str) -> None:
        self.default = default
        self._var: contextvars.ContextVar[Any] = contextvars.ContextVar(name, default=default)
        self._jax: Any = None
        self._lock = threading.Lock()

    @property
    def value(self) -> Any:
        return self._var.get()

    @property
    def created(self) -> bool:
        """Whether the JAX user context exists (a user's scope was entered in this process)."""
        return self._jax is not None

    @contextlib.contextmanager
    def internal(self, value: Any) -> Iterator[None]:
        token = self._var.set(value)
        try:
            yield
        finally:
            self._var.reset(token)

    @contextlib.contextmanager
    def __call__(self, value: Any) -> Iterator[None]:
        if self._jax is None and hasattr(jax, "make_user_context"):
            with self._lock:
                if self._jax is None:
                    self._jax = jax.make_user_context(self.default)
        with self._jax(value) if self._jax is not None else contextlib.nullcontext():
            with self.internal(value):
                yield


#: The precision chosen by the enclosing ``matmul_precision`` (``None`` outside any).
_CHOSEN = ScopedValue(None, "meanfield_matmul_precision")


def current() -> lax.Precision | None:
    """The ``precision=`` that the engine's products state now: ``lax.Precision.HIGHEST``, or
    ``None`` (JAX's ``default_matmul_precision``, which it sets) inside ``matmul_precision``."""
    return lax.Precision.HIGHEST if _CHOSEN.value is None else None


def einsum(subscripts: str, /, *operands: ArrayLike, **kwargs: Any) -> jax.Array:
    """``jnp.einsum`` with ``precision=current()``."""
    return jnp.einsum(subscripts, *operands, precision=current(), **kwargs)


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` with ``precision=current()``: ``jnp.matmul`` when either is a JAX array (a
    tracer too), NumPy's product, as ``@``, when both are NumPy arrays."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a @ b
    return jnp.matmul(a, b, precision=current())


def dot(a: ArrayLike, b: ArrayLike) -> jax.Array:
    """``jnp.dot(a, b)`` with ``precision=current()``."""
    return jnp.dot(a, b, precision=current())


def third_party() -> contextlib.AbstractContextManager[Any]:
    """Context manager for code that meanfield calls but does not own and whose products state no
    precision (``s2fft``'s transforms, ``jax.scipy.special.sph_harm_y``): JAX's
    ``default_matmul_precision`` is ``"highest"`` in it, unless ``matmul_precision`` chose one
    (then it stays as chosen)."""
    if _CHOSEN.value is None:
        return jax.default_matmul_precision("highest")
    return contextlib.nullcontext()


def matmul_precision(precision: object) -> contextlib.AbstractContextManager[None]:
    """Context manager: meanfield's matrix products traced inside it take JAX's ``precision``
    (``"default"``, ``"high"`` or ``"highest"``) instead of the full float32 precision they state
    everywhere else (``lax.Precision.HIGHEST``).

    On an NVIDIA GPU ``"default"`` runs float32 products in TF32 (faster, about three
    significant digits), on a TPU in one bfloat16 pass; on the CPU nothing changes. The block
    also sets ``jax.default_matmul_precision(precision)`` for your own JAX code in it. Programs
    traced inside the block are compiled for it (the choice is part of ``jit``'s cache key);
    programs compiled outside keep full precision, and are used again after the block.

    Raises:
        ValueError: ``precision`` is not one of ``PRECISIONS``.

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> with mf.matmul_precision("default"):
        ...     v = mf.velocity(mf.models.SelfAttention(1.0), x)
        >>> v.shape
        (8, 3)
        >>> mf.matmul_precision("tf32")
        Traceback (most recent call last):
        ...
        ValueError: matmul_precision: precision must be one of 'default', 'high', 'highest', got 'tf32'
    """
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(
            "matmul_precision: precision must be one of "
            f"{', '.join(map(repr, PRECISIONS))}, got {precision!r}"
        )
    return _scope(precision)


@contextlib.contextmanager
def _scope(precision: str) -> Iterator[None]:
    with _CHOSEN(precision), jax.default_matmul_precision(precision):
        yield


matmul_precision.__module__ = "meanfield"  # its public home: ``mf.matmul_precision``
