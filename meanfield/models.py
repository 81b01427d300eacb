"""Self-attention dynamics without a pair energy (Geshkovski, Letrouit, Polyanskiy, Rigollet).

``SelfAttention`` is usable with ``mf.velocity`` and ``mf.simulate`` exactly like a
kernel; ``mf.energy`` raises ``TypeError`` for it (the normalised dynamics is not a
gradient flow of a pair energy in general).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._checks import check_positive, is_concrete
from .kernels import positions

__all__ = ["SelfAttention"]


class SelfAttention(eqx.Module):
    """Self-attention particle dynamics on the sphere.

    Normalised (``normalized=True``, the SA model)::

        dx_i/dt = P_{x_i} sum_j softmax_j(beta <Q x_i, K x_j>) V x_j

    Unnormalised (``normalized=False``)::

        dx_i/dt = P_{x_i} (1/n) sum_j exp(beta <Q x_i, K x_j>) V x_j

    ``Q, K, V`` are ``(d, d)`` matrices, identity when ``None``. With ``Q = K = V = I``
    the unnormalised model is the USA flow. ``rescaled=True`` multiplies the
    unnormalised field by ``e^{-beta ||Q|| ||K||}``-free factor ``e^{-beta}`` (time
    change, as for the kernels); the normalised field is shift-invariant already.

    Args:
        beta: inverse temperature (traced).
        Q, K, V: ``(d, d)`` query, key and value matrices (``None``: identity).
        normalized: softmax (``True``, SA) or the unnormalised ``1/n`` average (static).
        rescaled: multiply the unnormalised field by ``e^{-beta}`` (static).

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> mf.velocity(mf.models.SelfAttention(1.0), x).shape
        (8, 3)
    """

    beta: Array | float
    Q: Array | None = None
    K: Array | None = None
    V: Array | None = None
    normalized: bool = eqx.field(static=True, default=True)
    rescaled: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        check_positive("beta", self.beta)
        for name in ("Q", "K", "V"):
            M = getattr(self, name)
            if M is not None and (np.ndim(M) != 2 or np.shape(M)[0] != np.shape(M)[1]):
                raise ValueError(f"{name} must be a square (d, d) matrix, got shape {np.shape(M)}")

    integer_labels = False

    def default_aux(self, n: int):
        return positions(n)

    def _apply(self, M, x):
        return x if M is None else x @ jnp.asarray(M, x.dtype).T

    def field(self, x: Float[Array, "n d"], aux=None, *, block_size=None) -> Float[Array, "n d"]:
        """Unprojected field ``F_i = sum_j A_ij V x_j`` (rows of ``A`` softmax-normalised or ``exp/n``), ``(n, d)``.

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
