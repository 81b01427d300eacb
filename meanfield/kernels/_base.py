"""The abstract pair kernel, its pairwise reference evaluation, and the time change of ``rescaled``."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ..masks import Mask, check_mask, energy_problem, masked_mean
from ..models import Model

__all__ = [
    "Kernel",
    "pairwise_field",
    "pairwise_energy",
    "masked_pairwise_field",
    "original_time",
    "rescaled_time",
]


class _HasEnergy:
    """``has_energy`` of a kernel: True on the class; on an instance, True unless its mask has no
    pair energy (``mf.masks.energy_problem``: meanfield defines none for any mask)."""

    def __get__(self, obj: Any, owner: type | None = None) -> bool:
        return True if obj is None else energy_problem(obj.mask) is None


def original_time(s: ArrayLike, beta: ArrayLike) -> Array:
    r"""Original time $t = e^{-\beta} s$ of rescaled time ``s`` (``rescaled=True`` kernels).

    Args:
        s: rescaled time (scalar or array).
        beta: inverse temperature of the kernel.

    Returns:
        $t$, broadcast shape of ``s`` and ``beta``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.original_time(1.0, 2.0)), 4)   # e^{-2}
        0.1353
    """
    return jnp.exp(-jnp.asarray(beta)) * s


def rescaled_time(t: ArrayLike, beta: ArrayLike) -> Array:
    r"""Rescaled time $s = e^\beta t$ of original time ``t`` (inverse of ``original_time``).

    Args:
        t: original time (scalar or array).
        beta: inverse temperature of the kernel.

    Returns:
        $s$, broadcast shape of ``t`` and ``beta``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.rescaled_time(1.0, 2.0)), 4)   # e^{2}
        7.3891
    """
    return jnp.exp(jnp.asarray(beta)) * t


class Kernel(Model):
    r"""Abstract base of the pair kernels: a symmetric interaction $h((x, \xi), (y, \zeta))$.

    Subclasses define ``__call__`` (one pair: ``x, y`` of shape ``(d,)``, scalar labels,
    scalar result; ``abc.abstractmethod``). ``grad_x`` defaults to autodiff of ``__call__``;
    ``field`` ($F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$, ``(n, d)``) and ``energy``
    ($E = \frac{1}{2 n^2} \sum_{i,j} h(z_i, z_j)$, scalar) default to the pairwise reference
    ($O(n^2)$ pairs through ``vmap``), overridden by structured evaluations. A kernel is a
    ``mf.models.Model`` with a pair energy (``has_energy``).

    Every kernel takes ``mask=`` (keyword; ``mf.masks``: ``Causal``, ``ALiBi``, ``Window``): the
    field becomes $F_i = \sum_j m_{ij} \nabla_x h(z_i, z_j)$ with $m$ = ``mask.pair_weights(n)``
    ($w_{ij}/n$, or row-normalised), evaluated pairwise (``masked_pairwise_field``); a masked kernel
    has no pair energy (``has_energy`` is False on the instance, ``energy`` raises ``TypeError``).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> class Linear(mf.kernels.Kernel):     # h = <x, y>: a new kernel is one method
        ...     def __call__(self, x, xi, y, zeta):
        ...         return jnp.dot(x, y)
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> bool(jnp.allclose(mf.field(Linear(), x), jnp.mean(x, axis=0) * jnp.ones((8, 1)), atol=1e-6))
        True
    """

    has_energy: ClassVar[bool] = _HasEnergy()  # type: ignore[assignment]
    takes_mask: ClassVar[bool] = True

    mask: Mask | None = eqx.field(default=None, kw_only=True)

    def __check_init__(self) -> None:
        super().__check_init__()
        check_mask(self.mask)

    def refuse_masked_energy(self) -> None:
        """``TypeError`` when the kernel is masked: no pair energy (``has_energy``)."""
        problem = energy_problem(self.mask)
        if problem is not None:
            raise TypeError(
                f"{type(self).__name__} with mask={type(self.mask).__name__}: {problem}; use the "
                "kernel without a mask"
            )

    @abc.abstractmethod
    def __call__(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, ""]:
        r"""$h((x, \xi), (y, \zeta))$ of one pair (scalar)."""

    def grad_x(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, " d"]:
        r"""$\nabla_x h((x, \xi), (y, \zeta))$ (Euclidean gradient in $\mathbb R^d$, shape ``(d,)``).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> e = jnp.array([1.0, 0.0, 0.0])
            >>> mf.kernels.Toeplitz(1).grad_x(e, 0.0, e, 0.0).tolist()   # cos(0) y
            [1.0, 0.0, 0.0]
        """
        return jax.grad(self.__call__, argnums=0)(x, xi, y, zeta)

    # structured evaluations (overridden) --------------------------------
    def field(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, "n d"]:
        r"""$F_i = \frac1n \sum_j \nabla_x h(z_i, z_j)$ for all $i$ (unprojected), ``(n, d)``.

        Args:
            x: ``(n, d)`` unit rows.
            aux: ``(n,)`` labels.
            block_size: row-tile size of the tiled evaluations (``None``: automatic).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0]])
            >>> mf.kernels.Toeplitz(1).field(x, jnp.array([0.0, 1.0])).tolist()   # cos(2 pi) = 1
            [[1.0, 0.0], [1.0, 0.0]]
        """
        aux = self.default_aux(x.shape[0]) if aux is None else aux
        if self.mask is not None:
            return masked_pairwise_field(self, x, aux)
        return pairwise_field(self, x, aux)

    def energy(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, ""]:
        r"""$E = \frac{1}{2 n^2} \sum_{i,j} h(z_i, z_j)$ (scalar).

        Args:
            x: ``(n, d)`` unit rows.
            aux: ``(n,)`` labels.
            block_size: row-tile size of the tiled evaluations (``None``: automatic).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0]])
            >>> float(mf.kernels.Toeplitz(1).energy(x, jnp.array([0.0, 1.0])))   # 1/2 * mean of 1
            0.5
        """
        self.refuse_masked_energy()
        return pairwise_energy(self, x, self.default_aux(x.shape[0]) if aux is None else aux)

    def check_traced_energy(self, x: Array, aux: ArrayLike | None) -> Array:
        """``x`` with the in-program checks of ``mf.energy`` (and ``mf.field``, ``mf.velocity``) attached
        (``equinox.error_if``) for traced parameters whose energy or field would not be finite; no-op by
        default (``_ExpKernel``: overflow).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.eye(3)
            >>> bool(jnp.all(mf.kernels.USA(1.0).check_traced_energy(x, mf.positions(3)) == x))
            True
        """
        return x


def pairwise_field(kernel: Kernel, x: Float[Array, "n d"], aux: ArrayLike) -> Float[Array, "n d"]:
    r"""Reference $F_i = \frac1n \sum_j \nabla_x h((x_i, \xi_i), (x_j, \xi_j))$ (``kernel.grad_x``) by two vmaps.

    Args:
        kernel: a ``Kernel``.
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels.

    Returns:
        ``(n, d)`` unprojected field.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> k, x, s = mf.kernels.Toeplitz(1), mf.sphere.uniform(jax.random.key(0), 8, 3), mf.positions(8)
        >>> bool(jnp.allclose(mf.kernels.pairwise_field(k, x, s), k.field(x, s), atol=1e-5))
        True
    """
    row = jax.vmap(kernel.grad_x, in_axes=(None, None, 0, 0))
    return jax.vmap(lambda xi, ai: jnp.mean(row(xi, ai, x, aux), axis=0))(x, aux)


def pairwise_energy(kernel: Kernel, x: Float[Array, "n d"], aux: ArrayLike) -> Float[Array, ""]:
    r"""Reference $E = \frac{1}{2 n^2} \sum_{i,j} h((x_i, \xi_i), (x_j, \xi_j))$ (``kernel``) by two vmaps.

    Args:
        kernel: a ``Kernel``.
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels.

    Returns:
        scalar energy.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> k, x, s = mf.kernels.USA(1.0), mf.sphere.uniform(jax.random.key(0), 8, 3), mf.positions(8)
        >>> bool(jnp.allclose(mf.kernels.pairwise_energy(k, x, s), k.energy(x, s), rtol=1e-5))
        True
    """
    row = jax.vmap(kernel, in_axes=(None, None, 0, 0))
    H = jax.vmap(lambda xi, ai: row(xi, ai, x, aux))(x, aux)
    return 0.5 * jnp.mean(H)


def masked_pairwise_field(
    kernel: Kernel, x: Float[Array, "n d"], aux: ArrayLike | None
) -> Float[Array, "n d"]:
    r"""The masked field $F_i = \sum_j m_{ij} \nabla_x h(z_i, z_j)$, $m$ = ``kernel.mask.pair_weights(n)``
    ($w_{ij} / n$, or the row-normalised mask: ``mf.masks``), by two vmaps over the pairs.

    Args:
        kernel: a ``Kernel`` with a mask.
        x: ``(n, d)`` unit rows.
        aux: ``(n,)`` labels (``None``: the kernel's default).

    Returns:
        ``(n, d)`` unprojected field; zero on rows the mask admits nothing in.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 6, 3)
        >>> F = mf.field(mf.kernels.USA(1.0, mask=mf.masks.Causal(include_self=False)), x)
        >>> F[0].tolist()                      # the first token admits nothing
        [0.0, 0.0, 0.0]
    """
    if kernel.mask is None:
        raise ValueError("masked_pairwise_field needs a kernel with a mask (mask=mf.masks....)")
    n = x.shape[0]
    aux = kernel.default_aux(n) if aux is None else aux
    row = jax.vmap(kernel.grad_x, in_axes=(None, None, 0, 0))
    grads = jax.vmap(lambda xi, ai: row(xi, ai, x, aux))(x, aux)  # (n, n, d): grad_x h(z_i, z_j)
    return masked_mean(kernel.mask.pair_weights(n, x.dtype), grads)
