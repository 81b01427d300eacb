r"""The Kuramoto model and its sphere version, the Lohe model: the linear kernel
$h = K \langle x, y\rangle$ (docs/math/noise.md, The Kuramoto model)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._checks import RealScalarLike, is_concrete
from .._precision import dot
from .._resources import Footprint, as_float
from ..models import Profile, param
from ._base import Kernel, masked_pairwise_field

__all__ = ["Kuramoto", "LinearProfile"]


class LinearProfile(Profile):
    r"""The linear profile $h(t) = K t$ of the Kuramoto / Lohe model (``mf.kernels.Kuramoto``); the
    parameter called ``beta`` by ``mf.continuum`` is the coupling $K$.

    Its only non-zero Funk-Hecke eigenvalue of positive degree is $\mu_1 = K |S^{d-1}| / d$, so the
    uniform law's degree-1 mode grows at $\lambda_1 = K (d - 1) / d$ ($K / 2$ on the circle) and the
    others not at all (docs/math/noise.md).

    Example:
        >>> import meanfield as mf
        >>> float(mf.kernels.LinearProfile().values(0.5, 2.0))
        1.0
    """

    def values(self, t: ArrayLike, beta: ArrayLike) -> Float[Array, "..."]:
        """``beta * t`` (``beta``: the coupling ``K``)."""
        return jnp.asarray(beta) * jnp.asarray(t)


class Kuramoto(Kernel):
    r"""The Kuramoto model on the circle, the Lohe model on $S^{d-1}$: $h = K \langle x, y\rangle$,

    $$\dot x_i = \frac{K}{n} \sum_j P_{x_i} x_j = K\, P_{x_i} m, \qquad m = \frac1n \sum_j x_j,$$

    in angles ($d = 2$) $\dot\theta_i = \frac{K}{n} \sum_j \sin(\theta_j - \theta_i)$. The field is
    rank one: $F_i = K m$ costs $O(n d)$. The energy $E = \frac{1}{2 n^2} \sum_{i,j} K \langle x_i,
    x_j\rangle = \frac{K}{2} |m|^2$ is half the coupling times the squared order parameter; its
    maximum $K / 2$ is reached at collapse. With natural frequencies (``mf.simulate(frequencies=)``)
    and noise (``mf.simulate(noise=)``) it is the classical noisy Kuramoto model; the uniform law
    loses stability at $K = \sigma^2$ on the circle, $K = d \sigma^2 / 2$ on $S^{d-1}$
    (docs/math/noise.md).

    Args:
        coupling: the coupling $K$, ``> 0`` (traced).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
        >>> mf.field(mf.kernels.Kuramoto(2.0), x).tolist()      # K m, m = (1/2, 1/2)
        [[1.0, 1.0], [1.0, 1.0]]
        >>> float(mf.energy(mf.kernels.Kuramoto(2.0), x))        # K |m|^2 / 2
        0.5
    """

    name = "kuramoto"
    summary = "Kuramoto / Lohe model K <x, y>: dx_i/dt = K P_x m, m the mean token"

    coupling: RealScalarLike = param(1.0, kind="float>0", doc="coupling K of the Kuramoto model")

    @classmethod
    def zonal_profile(cls, rescaled: bool = False) -> LinearProfile:
        """The linear profile ``K t`` (no rescaled form).

        Example:
            >>> import meanfield as mf
            >>> type(mf.kernels.Kuramoto.zonal_profile()).__name__
            'LinearProfile'
        """
        return LinearProfile()

    def interaction_rate(self) -> ArrayLike:
        """``K``: the field's size ``|K m| <= K``, and its linearisation's largest rate."""
        return self.coupling

    def footprint(self, n: int, d: int, *, block_size: int | None = None) -> Footprint:
        """Rank one: the mean token, ``n`` pair terms."""
        return Footprint(entries=as_float(d), pairs=as_float(n))

    def max_energy(self) -> ArrayLike | None:
        """``K / 2`` (collapse: ``|m| = 1``); None when masked (no energy).

        Example:
            >>> import meanfield as mf
            >>> float(mf.kernels.Kuramoto(3.0).max_energy())
            1.5
        """
        if self.mask is not None:
            return None
        return jnp.asarray(self.coupling) / 2

    def stationary_order_parameter(
        self, d: int, *, noise: Any = None, frequencies: Any = None
    ) -> float | None:
        r"""The $n \to \infty$ stationary order parameter (docs/math/noise.md, The Kuramoto model): with
        independent noise alone, the root of $r = A_d(2 K r / \sigma^2)$
        (``mf.theory.kuramoto_order_parameter``); with a frequency law alone on the circle, Kuramoto's
        (``mf.frequencies.Distribution.order_parameter``); None otherwise (both, common noise, a
        frequency law off the circle, a traced or masked model).

        Example:
            >>> import meanfield as mf
            >>> round(mf.kernels.Kuramoto(2.0).stationary_order_parameter(2, noise=mf.noise.Independent(1.0)), 4)
            0.8315
            >>> mf.kernels.Kuramoto(2.0).stationary_order_parameter(2, frequencies=mf.frequencies.Lorentzian(0.5))
            0.7071067811865476
        """
        from .. import theory
        from ..noise import Independent

        if self.mask is not None or not is_concrete(self.coupling):
            return None
        K = float(np.asarray(self.coupling))
        if frequencies is None and isinstance(noise, Independent) and is_concrete(noise.sigma):
            return theory.kuramoto_order_parameter(K, float(np.asarray(noise.sigma)), d)
        if noise is None and frequencies is not None and d == 2:
            return float(frequencies.order_parameter(K))
        return None

    def __call__(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, ""]:
        return jnp.asarray(self.coupling) * dot(x, y)

    def grad_x(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, " d"]:
        return jnp.asarray(self.coupling) * jnp.asarray(y)

    def field(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, "n d"]:
        if self.mask is not None:
            aux = self.default_aux(x.shape[0]) if aux is None else aux
            return masked_pairwise_field(self, x, aux)
        m = jnp.mean(x, axis=0)
        return jnp.broadcast_to(jnp.asarray(self.coupling, x.dtype) * m, x.shape)

    def energy(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, ""]:
        self.refuse_masked_energy()
        m = jnp.mean(x, axis=0)
        return jnp.asarray(self.coupling, x.dtype) * jnp.sum(m * m) / 2
