"""Particle models on the sphere: the abstract base ``Model`` and self-attention dynamics.

``Model`` is the base of everything ``mf.velocity`` and ``mf.simulate`` accept: the pair
kernels of ``mf.kernels`` (``mf.kernels.Kernel``, which add a pair energy) and
``SelfAttention`` (Geshkovski, Letrouit, Polyanskiy, Rigollet), whose normalised dynamics
is not a gradient flow of a pair energy in general, so ``mf.energy`` raises ``TypeError``
for it. Entry points dispatch on these types.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._checks import (
    RealScalarLike,
    _as_float_array,
    check_flag,
    check_positive,
    check_scalar,
    is_concrete,
    traced_positive,
)

__all__ = ["Model", "SelfAttention", "positions"]


def positions(n: int) -> Float[Array, " n"]:
    r"""Default positional labels $s_i = i / n$, $i = 1, \dots, n$ (MATH.md notation).

    Args:
        n: number of tokens.

    Returns:
        ``(n,)`` float array $(1/n, 2/n, \dots, 1)$.

    Example:
        >>> import meanfield as mf
        >>> mf.kernels.positions(4).tolist()
        [0.25, 0.5, 0.75, 1.0]
    """
    return jnp.arange(1, n + 1, dtype=jnp.result_type(float)) / n


class Model(eqx.Module):
    """Abstract base of the particle models: a mean field $F_i$ on ``(n, d)`` states.

    Subclasses define ``field`` (the unprojected field $F_i$, ``(n, d)``); the velocity
    is $P_{x_i} F_i$. ``default_aux`` gives the labels used when ``aux=None``;
    ``check_config`` raises ``ValueError``/``TypeError`` on concrete values before tracing;
    ``check_traced`` attaches the same checks to the program (``equinox.error_if``) for
    values that are traced (inside ``jit``/``vmap``). ``has_energy`` tells whether the
    model is a gradient flow of a pair energy (``mf.kernels.Kernel``).

    Example:
        >>> import meanfield as mf
        >>> isinstance(mf.kernels.USA(1.0), mf.models.Model), isinstance(mf.models.SelfAttention(1.0), mf.models.Model)
        (True, True)
    """

    #: True when labels are integer ids (prompts) rather than positions.
    integer_labels: ClassVar[bool] = False
    #: True for pair kernels (``mf.energy`` is defined).
    has_energy: ClassVar[bool] = False

    @abc.abstractmethod
    def field(self, x, aux, *, block_size=None) -> Float[Array, "n d"]:
        """Unprojected mean field $F_i$, ``(n, d)``, of unit rows ``x`` with labels ``aux``."""

    def default_aux(self, n: int):
        """Labels used when ``aux=None``: the positions $s_i = i / n$, shape ``(n,)``.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.USA(1.0).default_aux(2).tolist()
            [0.5, 1.0]
        """
        return positions(n)

    def check_config(self, x, aux) -> None:
        """Concrete-value checks that need the state (overflow, gauges); no-op by default.

        Raises ``ValueError``/``TypeError`` naming the bad value; returns ``None``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> mf.kernels.USA(1.0).check_config(jnp.eye(3), mf.positions(3)) is None
            True
        """

    def check_traced(self, x, aux):
        """``x`` with in-program checks of the traced parameters attached (``equinox.error_if``).

        Under ``jit``/``vmap`` a bad traced value (``beta <= 0`` or non-finite, prompt labels
        out of range) stops the program with an error naming it; concrete values were
        checked before (``__check_init__``, ``check_config``). Returns ``x``.

        Example:
            >>> import jax, jax.numpy as jnp, meanfield as mf
            >>> x = jnp.eye(3)
            >>> bool(jnp.all(mf.kernels.USA(1.0).check_traced(x, mf.positions(3)) == x))
            True
        """
        beta = getattr(self, "beta", None)
        if beta is not None:
            x = traced_positive(x, "beta", beta)
        return x


class SelfAttention(Model):
    r"""Self-attention particle dynamics on the sphere.

    Normalised (``normalized=True``, the SA model):

    $$\frac{d x_i}{dt} = P_{x_i} \sum_j \operatorname{softmax}_j(\beta \langle Q x_i, K x_j\rangle)\, V x_j$$

    Unnormalised (``normalized=False``):

    $$\frac{d x_i}{dt} = P_{x_i} \frac1n \sum_j e^{\beta \langle Q x_i, K x_j\rangle}\, V x_j$$

    ``Q, K, V`` are ``(d, d)`` matrices, identity when ``None``. With $Q = K = V = I$
    the unnormalised model is the USA flow. ``rescaled=True`` multiplies the
    unnormalised field by the ($\|Q\| \|K\|$-free) factor $e^{-\beta}$ (time
    change, as for the kernels); the normalised field is shift-invariant already.

    Args:
        beta: inverse temperature (traced).
        Q, K, V: ``(d, d)`` query, key and value matrices (``None``: identity).
        normalized: softmax (``True``, SA) or the unnormalised ``1/n`` average (static).
        rescaled: multiply the unnormalised field by $e^{-\beta}$ (static).

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> mf.velocity(mf.models.SelfAttention(1.0), x).shape
        (8, 3)
    """

    beta: RealScalarLike
    Q: ArrayLike | None = None
    K: ArrayLike | None = None
    V: ArrayLike | None = None
    normalized: bool = eqx.field(static=True, default=True)
    rescaled: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        check_scalar("beta", self.beta)
        check_positive("beta", self.beta)
        check_flag("normalized", self.normalized)
        check_flag("rescaled", self.rescaled)
        for name in ("Q", "K", "V"):
            M = getattr(self, name)
            if M is None:
                continue
            if not is_concrete(M):
                if jnp.ndim(M) != 2 or jnp.shape(M)[0] != jnp.shape(M)[1]:
                    raise ValueError(f"{name} must be a square (d, d) matrix, got shape {jnp.shape(M)}")
                continue
            arr = _as_float_array(name, M)
            if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
                raise ValueError(f"{name} must be a square (d, d) matrix, got shape {arr.shape}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} contains NaN or inf; every entry must be finite")

    def _apply(self, M, x):
        return x if M is None else x @ jnp.asarray(M, x.dtype).T

    def field(
        self, x: Float[Array | np.ndarray, "n d"], aux=None, *, block_size=None
    ) -> Float[Array, "n d"]:
        r"""Unprojected field $F_i = \sum_j A_{ij} V x_j$ (rows of $A$ softmax-normalised or $e^{\cdots}/n$), ``(n, d)``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0]])
            >>> mf.models.SelfAttention(1.0).field(x).tolist()   # softmax average of equal tokens
            [[1.0, 0.0], [1.0, 0.0]]
        """
        beta = jnp.asarray(self.beta, x.dtype)
        logits = beta * (self._apply(self.Q, x) @ self._apply(self.K, x).T)
        vx = self._apply(self.V, x)
        if self.normalized:
            return jax.nn.softmax(logits, axis=-1) @ vx
        # factor the row maximum out of the exponentials (no overflow in the sum of n terms)
        m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
        shift = beta if self.rescaled else 0.0
        return (jnp.exp(logits - m) @ vx / x.shape[0]) * jnp.exp(m - shift)

    def energy(self, x, aux=None, *, block_size=None):
        raise TypeError(
            "SelfAttention has no pair energy (the normalised/Q,K,V dynamics is not a gradient "
            "flow of E = 1/(2n^2) sum h); use a kernel from mf.kernels (e.g. USA) for energies"
        )

    def check_config(self, x, aux) -> None:
        d = np.shape(x)[-1]
        for name in ("Q", "K", "V"):
            M = getattr(self, name)
            if M is not None and tuple(jnp.shape(M)) != (d, d):
                raise ValueError(f"{name} is {jnp.shape(M)[0]}x{jnp.shape(M)[1]} but the states have d = {d}; pass ({d}, {d}) matrices")
        if self.normalized or self.rescaled or not is_concrete(self.beta):
            return
        dtype = jnp.asarray(x).dtype
        limit = float(np.log(np.finfo(dtype).max))
        # |<Q x, K y>| <= ||Q||_2 ||K||_2 on unit vectors: the largest exponent of the field
        qk = 1.0
        for M in (self.Q, self.K):
            if M is not None and is_concrete(M):
                qk *= float(np.linalg.norm(np.asarray(M, dtype=np.float64), 2))
        exponent = float(np.max(np.asarray(self.beta))) * qk
        if exponent >= limit:
            raise ValueError(
                f"beta ||Q|| ||K|| = {exponent:g} overflows the unnormalised field in "
                f"{np.dtype(dtype).name} (limit about {limit:.1f}); use rescaled=True "
                f"(field times e^(-beta), time t = e^(-beta) s)"
            )
