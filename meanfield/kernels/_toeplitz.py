r"""Toeplitz kernels $c(t - s) \langle x, y\rangle$: low rank in the positions."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, DTypeLike, Float

from .. import theory
from .._checks import (
    RealScalarLike,
    check_finite,
    check_int,
    is_concrete,
    traced_finite,
)
from .._precision import dot, matmul
from .._resources import Footprint, as_float
from ..masks import Mask
from ..models import param, positions
from ._base import Kernel, masked_pairwise_field

__all__ = ["Toeplitz", "ToeplitzSeries"]


class Toeplitz(Kernel):
    r"""Toeplitz kernel $h = \cos(2 \pi m (t - s)) \langle x, y\rangle$.

    Maximiser: the uniform great circle traversed ``m`` times, $E_{\max} = 1/4$.
    Rank 2 in the positions ($\cos(a - b) = \cos a \cos b + \sin a \sin b$), so the
    field costs $O(n d)$: $F_i = \frac1n (c_i \sum_j c_j x_j + s_i \sum_j s_j x_j)$.

    Args:
        m: integer frequency, ``m >= 1``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> s = mf.positions(8)
        >>> x = jnp.stack([jnp.cos(2 * jnp.pi * s), jnp.sin(2 * jnp.pi * s), 0 * s], axis=1)
        >>> round(float(mf.energy(mf.kernels.Toeplitz(1), x, s)), 4)   # great circle: 1/4
        0.25
    """

    name = "toeplitz"
    summary = "cos(2 pi m (t - s)) <x, y>: the great circle traversed m times"

    m: RealScalarLike = param(
        1.0, kind="float>0", doc="Toeplitz frequency (an integer for a closed circle)"
    )

    def footprint(self, n: int, d: int, *, block_size: int | None = None) -> Footprint:
        """Rank 2 in the positions: ``cos``, ``sin`` and two ``(n,)`` products; ``n`` pair terms."""
        return Footprint(entries=4.0 * as_float(n), pairs=as_float(n))

    def max_energy(self) -> float | None:
        """``1/4`` (the great circle traversed ``m`` times) for a concrete integer ``m``; None otherwise.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.Toeplitz(2).max_energy(), mf.kernels.Toeplitz(1.5).max_energy()
            (0.25, None)
        """
        if self.mask is not None:
            return None  # a masked kernel has no energy
        if not is_concrete(self.m) or not float(np.asarray(self.m)).is_integer():
            return None
        return float(theory.great_circle_energy(int(np.asarray(self.m))))

    def __call__(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, ""]:
        # labels are numbers (mypy rejects ArrayLike's bool member minus a NumPy bool)
        return jnp.cos(2 * jnp.pi * self.m * (zeta - xi)) * dot(x, y)  # type: ignore[operator]

    def grad_x(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, " d"]:
        # labels are numbers (mypy rejects ArrayLike's bool member minus a NumPy bool)
        return jnp.cos(2 * jnp.pi * self.m * (zeta - xi)) * y  # type: ignore[operator]

    def _cs(
        self, x: Float[Array, "n d"], aux: ArrayLike | None
    ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        theta = 2 * jnp.pi * jnp.asarray(self.m, x.dtype) * jnp.asarray(aux, x.dtype)
        return jnp.cos(theta), jnp.sin(theta)

    def field(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, "n d"]:
        if self.mask is not None:
            return masked_pairwise_field(self, x, aux)
        c, s = self._cs(x, aux)
        n = x.shape[0]
        return (c[:, None] * matmul(c, x) + s[:, None] * matmul(s, x)) / n

    def energy(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, ""]:
        self.refuse_masked_energy()
        c, s = self._cs(x, aux)
        a, b = matmul(c, x), matmul(s, x)
        return (jnp.sum(a * a) + jnp.sum(b * b)) / (2.0 * x.shape[0] ** 2)


class ToeplitzSeries(Kernel):
    r"""Toeplitz kernel with a finite Fourier series (USA-AV Prop. 10, App. G): $h = c(t - s) \langle x, y\rangle$,

    $$c(\Delta) = \sum_{|m| \le M} \hat c(m) e^{2 \pi i m \Delta} = \hat c(0) + 2 \sum_{m=1}^{M} \hat c(m) \cos(2 \pi m \Delta),$$

    an even real profile ($\hat c(-m) = \hat c(m)$), any signs. ``Toeplitz(m)`` is the series with
    $\hat c(m) = 1/2$ alone. Rank $2M + 1$ in the positions, so the field costs $O(n M d)$.

    Maximiser (Prop. 10; its statement was lost in extraction, reconstructed here from the
    separated-kernel reduction of Sec. 3.2). Expand a path $x(s) = \sum_k \hat x(k) e^{2 \pi i k s}$:

    $$\mathcal E[\Gamma[x]] = \frac12 \iint c(t - s) \langle x(s), x(t)\rangle\, ds\, dt = \frac12 \sum_{k \in \mathbb Z} \hat c(k) |\hat x(k)|^2, \qquad \sum_k |\hat x(k)|^2 = \int |x(s)|^2 ds = 1$$

    (Parseval), so $\mathcal E \le \frac12 \max_k \hat c(k)$, with equality iff $\hat x$ lives on the
    maximising frequencies. For a unique dominant mode $m^* = \arg\max_{m \ge 0} \hat c(m)$ (modes
    $m > M$ have $\hat c = 0$) the maximiser is $x(s) = \cos(2 \pi m^* s) a + \sin(2 \pi m^* s) b$
    ($a \perp b$ unit vectors): a great circle traversed $m^*$ times (winding number $m^*$), or a Dirac
    mass if $m^* = 0$. The same holds exactly for $n$ particles at $s_i = i/n$ with the aliased
    coefficients $\hat c_n(k) = \sum_{l \equiv k \ (\mathrm{mod}\ n)} \hat c(l)$, $k = 0, \dots, n - 1$
    (discrete Parseval): $E_{\max} = \frac12 \max_k \hat c_n(k)$ (``max_energy(n)``).

    Args:
        c_hat: Fourier coefficients $\hat c(0), \dots, \hat c(M)$, shape ``(M + 1,)`` (traced).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k = mf.kernels.ToeplitzSeries([0.0, 0.1, 0.4])   # dominant mode m* = 2
        >>> k.dominant_mode(), round(float(k.max_energy()), 4)
        (2, 0.2)
        >>> x = k.maximiser(16)   # the great circle traversed twice
        >>> round(float(mf.energy(k, x, mf.positions(16))), 4)
        0.2
    """

    c_hat: Float[Array, " modes"]

    def __init__(self, c_hat: Any, *, mask: Mask | None = None) -> None:
        self.mask = mask
        if is_concrete(c_hat):
            try:
                arr = np.asarray(c_hat)
            except (TypeError, ValueError):
                raise TypeError(
                    f"c_hat must be a 1-d sequence of real Fourier coefficients, got {c_hat!r}"
                ) from None
            if arr.dtype.kind not in "iuf":
                raise TypeError(
                    f"c_hat must be real Fourier coefficients c_hat(0..M), got {c_hat!r}"
                )
            c_hat = jnp.asarray(
                arr if arr.dtype.kind == "f" else arr.astype(np.float64)
            )  # JAX's float width
        self.c_hat = c_hat

    def __check_init__(self) -> None:
        shape = jnp.shape(self.c_hat)
        if len(shape) != 1 or shape[0] < 1:
            raise ValueError(
                f"c_hat must be a 1-d array of the Fourier coefficients c_hat(0), ..., c_hat(M) (at least one), "
                f"got shape {shape}"
            )
        check_finite("c_hat", self.c_hat)

    def check_traced(self, x: Array, aux: ArrayLike | None) -> Array:
        """``x`` with finite traced coefficients ``c_hat`` checked in the program (``equinox.error_if``)."""
        return traced_finite(super().check_traced(x, aux), "c_hat", self.c_hat)

    def check_config(self, x: ArrayLike, aux: ArrayLike | None) -> None:
        """Refuse a field or energy whose ``(n, M + 1)`` mode tables do not fit in memory.

        The structured evaluation forms ``cos`` and ``sin`` of ``2 pi m s_i`` for every particle and
        mode (about four ``(n, M + 1)`` arrays at once); past ``_machine.machine_memory()`` that is a
        ``ResourceLimitError`` (a ``ValueError``) naming the estimate, not an out-of-memory crash.
        """
        from .._machine import ResourceLimitError, format_bytes, machine_memory

        n, modes = int(jnp.shape(x)[0]), int(jnp.shape(self.c_hat)[0])
        need = 4 * n * modes * np.dtype(jnp.asarray(x).dtype).itemsize
        avail = machine_memory()
        if need > avail:
            raise ResourceLimitError(
                f"ToeplitzSeries with M + 1 = {modes} coefficients at n = {n} needs ~{format_bytes(need)} of mode "
                f"tables (4 n (M + 1) floats), more than the {format_bytes(avail)} available; use fewer modes"
            )

    def footprint(self, n: int, d: int, *, block_size: int | None = None) -> Footprint:
        """The ``(n, M + 1)`` mode tables (``cos``, ``sin``, their products): rank ``2 M + 1``."""
        modes = float(jnp.shape(self.c_hat)[0])
        return Footprint(entries=4.0 * as_float(n) * modes, pairs=as_float(n) * modes)

    def profile(self, delta: ArrayLike) -> Float[Array, "..."]:
        r"""$c(\Delta) = \hat c(0) + 2 \sum_{m \ge 1} \hat c(m) \cos(2 \pi m \Delta)$ (any shape of ``delta``).

        Example:
            >>> import meanfield as mf
            >>> float(mf.kernels.ToeplitzSeries([0.0, 0.5]).profile(0.5))   # cos(pi)
            -1.0
        """
        delta = jnp.asarray(delta)
        c = jnp.asarray(self.c_hat)
        m = jnp.arange(c.shape[0], dtype=c.dtype)
        w = jnp.concatenate([c[:1], 2 * c[1:]])
        return jnp.sum(w * jnp.cos(2 * jnp.pi * m * delta[..., None]), axis=-1)

    def __call__(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, ""]:
        # labels are numbers (mypy rejects ArrayLike's bool member minus a NumPy bool)
        return self.profile(zeta - xi) * dot(x, y)  # type: ignore[operator]

    def grad_x(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, " d"]:
        # labels are numbers (mypy rejects ArrayLike's bool member minus a NumPy bool)
        return self.profile(zeta - xi) * y  # type: ignore[operator]

    def _modes(
        self, x: Float[Array, "n d"], aux: ArrayLike | None
    ) -> tuple[
        Float[Array, " modes"],
        Float[Array, "n modes"],
        Float[Array, "n modes"],
        Float[Array, "modes d"],
        Float[Array, "modes d"],
    ]:
        c = jnp.asarray(self.c_hat, x.dtype)
        m = jnp.arange(c.shape[0], dtype=x.dtype)
        theta = 2 * jnp.pi * jnp.asarray(aux, x.dtype)[:, None] * m[None, :]  # (n, M + 1)
        w = jnp.concatenate(
            [c[:1], 2 * c[1:]]
        )  # c(D) = sum_m w_m (cos a_m cos b_m + sin a_m sin b_m)
        C, S = jnp.cos(theta), jnp.sin(theta)
        return w, C, S, matmul(C.T, x), matmul(S.T, x)

    def field(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, "n d"]:
        if self.mask is not None:
            return masked_pairwise_field(self, x, aux)
        w, C, S, A, B = self._modes(x, aux)
        return (matmul(C, w[:, None] * A) + matmul(S, w[:, None] * B)) / x.shape[0]

    def energy(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, ""]:
        self.refuse_masked_energy()
        w, _, _, A, B = self._modes(x, aux)
        return jnp.sum(w * (jnp.sum(A * A, axis=1) + jnp.sum(B * B, axis=1))) / (
            2.0 * x.shape[0] ** 2
        )

    def _aliased(self, n: int | None) -> Float[Array, " k"]:
        """$\\hat c_n(k)$, $k = 0..n-1$ (``n=None``: $\\hat c(0..M)$ and one zero mode $M + 1$)."""
        c = jnp.asarray(self.c_hat)
        if n is None:
            return jnp.concatenate([c, jnp.zeros((1,), c.dtype)])
        n = check_int("n", n, minimum=1)
        m = np.arange(c.shape[0])
        return jnp.zeros((n,), c.dtype).at[m % n].add(c).at[(-m[1:]) % n].add(c[1:])

    def max_energy(self, n: int | None = None) -> Float[Array, ""]:
        r"""Largest energy, $\frac12 \max_{k \in \mathbb Z} \hat c(k)$ (mean-field limit, ``n=None``; modes
        $|k| > M$ count with $\hat c = 0$), or $\frac12 \max_k \hat c_n(k)$ for $n$ particles at $s_i = i/n$
        (aliased coefficients; the class docstring has the derivation). Traceable.

        Example:
            >>> import meanfield as mf
            >>> k = mf.kernels.ToeplitzSeries([-1.0, -0.2])   # every mode repels: E_max = 0
            >>> round(float(k.max_energy()), 4), round(float(k.max_energy(2)), 4)   # n = 2: c_2 = (-1, -0.4)
            (0.0, -0.2)
        """
        return 0.5 * jnp.max(self._aliased(n))

    def dominant_mode(self, n: int | None = None) -> int:
        r"""The smallest frequency $m^* \ge 0$ with the largest $\hat c(m^*)$ (or $\hat c_n$, folded to
        $\min(k, n - k)$); $M + 1$ when every $\hat c(m) < 0$ (``n=None``). Needs concrete coefficients.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.ToeplitzSeries([0.3, 0.1, 0.2]).dominant_mode()   # c_hat(0) wins: a Dirac
            0
        """
        if not is_concrete(self.c_hat):
            raise ValueError("dominant_mode needs concrete coefficients c_hat, got a traced array")
        k = int(np.argmax(np.asarray(self._aliased(n))))
        return k if n is None else min(k, n - k)

    def maximiser(self, n: int, d: int = 3, dtype: DTypeLike | None = None) -> Float[Array, "n d"]:
        r"""A maximiser at the positions $s_i = i/n$: $x_i = \cos(2 \pi m^* s_i) e_1 + \sin(2 \pi m^* s_i) e_2$,
        $m^*$ = ``dominant_mode(n)`` (a Dirac at $e_1$ if $m^* = 0$); its energy is ``max_energy(n)``.

        Example:
            >>> import meanfield as mf
            >>> k = mf.kernels.ToeplitzSeries([0.0, 0.1, -0.3, 0.25])   # m* = 3
            >>> x = k.maximiser(32)
            >>> round(float(mf.energy(k, x, mf.positions(32))), 4), round(float(k.max_energy(32)), 4)
            (0.125, 0.125)
        """
        n = check_int("n", n, minimum=1)
        d = check_int("d", d, minimum=2)
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(float)
        theta = 2 * np.pi * self.dominant_mode(n) * np.asarray(positions(n), np.float64)
        x = np.zeros((n, d))
        x[:, 0], x[:, 1] = np.cos(theta), np.sin(theta)
        return jnp.asarray(x, dtype)
