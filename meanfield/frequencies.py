r"""Distributions of natural frequencies for ``mf.simulate(frequencies=)``
(docs/math/noise.md, Frequency laws).

A ``Distribution`` is a law $g$ of angular velocities on the circle, symmetric and unimodal about
0, with a scale ``spread``: ``Lorentzian(spread)`` (Cauchy, half-width $\gamma$) and
``Gaussian(spread)`` (standard deviation $s$). ``sample(n)`` gives ``n`` frequencies, the
deterministic midpoint quantiles $\omega_i = G^{-1}((i - 1/2) / n)$ (no key: the same numbers on
every machine, the law's shape without sampling noise) or independent draws (``key=``). The theory of
the Kuramoto model ($d = 2$, coupling $K$, no noise) with these frequencies, for $n \to \infty$:

- ``critical_coupling()``: Kuramoto's threshold $K_c = 2 / (\pi g(0))$ of the incoherent state
  ($2 \gamma$ for the Lorentzian, $\sqrt{8 / \pi}\, s$ for the Gaussian);
- ``order_parameter(K)``: the stationary order parameter $r$ of the partially locked state, the
  largest root of $1 = K \int_{-\pi/2}^{\pi/2} \cos^2\theta\, g(K r \sin\theta)\, d\theta$ (0 below
  $K_c$); Ott and Antonsen's closed form $r = \sqrt{1 - 2 \gamma / K}$ for the Lorentzian, the root by
  quadrature and bisection (``scipy``) for the Gaussian.

Example:
    >>> import meanfield as mf
    >>> law = mf.frequencies.Lorentzian(0.5)
    >>> [round(float(w), 4) for w in law.sample(4)]
    [-1.2071, -0.2071, 0.2071, 1.2071]
    >>> law.critical_coupling(), round(law.order_parameter(2.0), 4)
    (1.0, 0.7071)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import scipy.integrate
import scipy.optimize
from jaxtyping import Array, Float

from ._checks import check_int, check_positive
from ._declare import Variant, param
from ._spelling import Say, early_stop_problem, say_python

__all__ = ["Distribution", "Lorentzian", "Gaussian", "DISTRIBUTIONS", "check_run"]


class Distribution(Variant):
    r"""A law of natural frequencies with the scale ``spread`` (the base of ``Lorentzian`` and
    ``Gaussian``). A member defines ``quantile(u)`` (of the law of scale 1), ``draw(key, n)``,
    ``density0()`` ($g(0)$ at scale 1) and ``locked_integral(a)``.

    Example:
        >>> import meanfield as mf
        >>> mf.frequencies.Distribution.coerce("gaussian", spread=0.3)
        Gaussian(spread=0.3)
    """

    flat_name: ClassVar[str | None] = "frequencies"
    what: ClassVar[str] = "frequency distribution"
    spread: Any = param(
        kind="float>0", doc="scale of the frequencies: a Lorentzian's half-width, a Gaussian's sd"
    )

    def quantile(self, c: Float[Array, " n"]) -> Float[Array, " n"]:
        """The quantile function of the law of scale 1 at ``1/2 + c``, ``c`` in (-1/2, 1/2) (odd in ``c``)."""
        raise NotImplementedError

    def draw(self, key: Any, n: int, dtype: Any) -> Float[Array, " n"]:
        """``n`` independent draws of the law of scale 1."""
        raise NotImplementedError

    def density0(self) -> float:
        """The density of the law of scale 1 at 0."""
        raise NotImplementedError

    def sample(self, n: int, *, key: Any = None, dtype: Any = None) -> Float[Array, " n"]:
        r"""``n`` natural frequencies: the midpoint quantiles $\text{spread} \cdot G^{-1}((i - 1/2)/n)$,
        ``i = 1..n`` (``key=None``: deterministic, symmetric about 0), or ``n`` independent draws from
        the ``jax.random`` key ``key``. ``spread`` may be traced.

        Example:
            >>> import jax, meanfield as mf
            >>> mf.frequencies.Gaussian(1.0).sample(3).tolist()
            [-0.967421..., 0.0, 0.967421...]
        """
        n = check_int("n", n, minimum=1)
        dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
        if key is None:
            c = (jnp.arange(n, dtype=dtype) - (n - 1) / 2) / n  # exactly symmetric about 0
            base = self.quantile(c)
        else:
            if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
                key = jnp.asarray(key)
                if key.shape != (2,) or key.dtype != jnp.uint32:
                    raise TypeError(f"key must be a jax.random key, got {key!r}")
            base = self.draw(key, n, dtype)
        return jnp.asarray(self.spread, dtype) * base

    def critical_coupling(self) -> float:
        r"""Kuramoto's threshold $K_c = 2 / (\pi g(0))$ of the incoherent state ($n \to \infty$, no
        noise), for a concrete ``spread``."""
        return 2.0 * self._spread() / (math.pi * self.density0())

    def locked_integral(self, a: float) -> float:
        r"""$\int_{-\pi/2}^{\pi/2} \cos^2\theta\, g_1(a \sin\theta)\, d\theta$ with $g_1$ the law of
        scale 1 (the self-consistency of the locked tokens, ``order_parameter``)."""
        return float(
            scipy.integrate.quad(
                lambda th: math.cos(th) ** 2 * self._pdf1(a * math.sin(th)),
                -math.pi / 2,
                math.pi / 2,
                epsabs=1e-13,
                epsrel=1e-12,
            )[0]
        )

    def _pdf1(self, w: float) -> float:
        raise NotImplementedError

    def order_parameter(self, coupling: float) -> float:
        r"""The stationary order parameter $r$ of the Kuramoto model ($d = 2$, $n \to \infty$, no
        noise) with these frequencies: 0 for $K \le K_c$, else the root of
        $1 = K \int \cos^2\theta\, g(K r \sin\theta)\, d\theta$ (the locked tokens' self-consistency;
        the drifting ones add nothing for a symmetric law).

        Example:
            >>> import meanfield as mf
            >>> round(mf.frequencies.Gaussian(1.0).order_parameter(3.0), 4)
            0.9252
        """
        check_positive("coupling", coupling)
        K = float(coupling)
        s = self._spread()
        if K <= self.critical_coupling():
            return 0.0

        def excess(r: float) -> float:  # at scale 1: g(w) = g1(w / s) / s
            return (K / s) * self.locked_integral(K * r / s) - 1.0

        return float(scipy.optimize.brentq(excess, 1e-12, 1.0, xtol=1e-14, rtol=1e-13))

    def _spread(self) -> float:
        try:
            s = float(np.asarray(self.spread))
        except (TypeError, jax.errors.ConcretizationTypeError):
            raise TypeError(
                "the theory of a frequency distribution needs a concrete spread, got a traced value"
            ) from None
        return s


@Distribution.builtin
class Lorentzian(Distribution):
    r"""The Lorentzian (Cauchy) law of half-width $\gamma$ = ``spread``:
    $g(\omega) = \gamma / (\pi (\omega^2 + \gamma^2))$. Ott and Antonsen's reduction makes the
    Kuramoto order parameter exact: $r = \sqrt{1 - 2\gamma / K}$ above $K_c = 2 \gamma$.

    Example:
        >>> import meanfield as mf
        >>> round(mf.frequencies.Lorentzian(1.0).order_parameter(8.0), 6)   # sqrt(3/4)
        0.866025
    """

    name: ClassVar[str | None] = "lorentzian"

    def quantile(self, c: Float[Array, " n"]) -> Float[Array, " n"]:
        return jnp.tan(jnp.pi * c)

    def draw(self, key: Any, n: int, dtype: Any) -> Float[Array, " n"]:
        return jax.random.cauchy(key, (n,), dtype)

    def density0(self) -> float:
        return 1.0 / math.pi

    def _pdf1(self, w: float) -> float:
        return 1.0 / (math.pi * (1.0 + w * w))

    def order_parameter(self, coupling: float) -> float:
        check_positive("coupling", coupling)
        K = float(coupling)
        return math.sqrt(max(0.0, 1.0 - 2.0 * self._spread() / K))


@Distribution.builtin
class Gaussian(Distribution):
    r"""The Gaussian law of standard deviation $s$ = ``spread``: $K_c = \sqrt{8/\pi}\, s$.

    Example:
        >>> import meanfield as mf
        >>> round(mf.frequencies.Gaussian(1.0).critical_coupling(), 6)
        1.595769
    """

    name: ClassVar[str | None] = "gaussian"

    def quantile(self, c: Float[Array, " n"]) -> Float[Array, " n"]:
        return jnp.sqrt(2.0) * jax.scipy.special.erfinv(2 * c)

    def draw(self, key: Any, n: int, dtype: Any) -> Float[Array, " n"]:
        return jax.random.normal(key, (n,), dtype)

    def density0(self) -> float:
        return 1.0 / math.sqrt(2 * math.pi)

    def _pdf1(self, w: float) -> float:
        return math.exp(-0.5 * w * w) / math.sqrt(2 * math.pi)


#: The built-in distributions' names (``Distribution.names()`` adds registered ones).
DISTRIBUTIONS = Distribution.names()


def check_run(
    *,
    law: str | None = None,
    d: int | None = None,
    scheme: Any = None,
    early_stop: Any = None,
    say: Say = say_python,
) -> None:
    """What a run with natural frequencies refuses, one rule for ``mf.simulate(frequencies=)``, the
    command line's ``--frequencies`` and a sweep's ``model.frequencies`` (``say`` spells the settings
    as the caller's surface does): with a frequency ``law`` (its name), a dimension ``d`` other than 2
    (the law's samples are angular velocities on the circle); a normalisation ``scheme`` whose
    tokens carry a radius (``Scheme.radial``); an ``early_stop`` (the energy of a run with frequencies
    is not increased by the flow: ``meanfield._spelling.early_stop_problem``). ``ValueError``, one
    line.

    Example:
        >>> import meanfield as mf
        >>> from meanfield._spelling import say_cli
        >>> try:
        ...     mf.frequencies.check_run(law="gaussian", d=3, say=say_cli)
        ... except ValueError as e:
        ...     print(e)
        --frequencies gaussian gives angular velocities on the circle: it needs --d 2, got --d 3
    """
    what = f"{say.name('frequencies')}=..." if law is None else say("frequencies", law)
    if law is not None and d is not None and d != 2:
        raise ValueError(
            f"{what} gives angular velocities on the circle: it needs {say('d', 2)}, got "
            f"{say('d', d)}"
        )
    if scheme is not None and scheme.radial:
        raise ValueError(
            f"{what}: natural frequencies rotate tokens on the sphere or in R^d; "
            f"{say('normalization', scheme.name)} carries a radius (it takes no frequencies)"
        )
    problem = early_stop_problem(what, early_stop, say)
    if problem is not None:
        raise ValueError(problem)
