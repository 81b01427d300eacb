r"""Noise on the tokens: stochastic attention dynamics (``mf.simulate(noise=, key=)``; docs/math/noise.md).

A ``Noise`` is the diffusion part of a run, added to the model's field as a Stratonovich SDE and
integrated by diffrax's SDE machinery (a Brownian path of the run's key: on a uniform step grid one
normal a step by a Lévy construction over the grid, ``meanfield._brownian``, else a
``diffrax.VirtualBrownianTree``; the Stratonovich Heun step; the radial projection after each step
as for the deterministic flow):

- ``Independent(sigma)``: every token its own Brownian motion $W_i$ in $\mathbb R^d$,
  $dx_i = F_i\,dt + \sigma P_{x_i} \circ dW_i$ on the sphere (generator of the noise: $\frac{\sigma^2}{2}$
  times the Laplace--Beltrami operator of $S^{d-1}$, so a free token's
  $E \langle x(t), x(0)\rangle = e^{-(d - 1) \sigma^2 t / 2}$), $dx_i = F_i\,dt + \sigma\,dW_i$ for
  tokens in $\mathbb R^d$ (``geometry="euclidean"``).
- ``Common(sigma)``: one $d \times d$ matrix Brownian motion $B$ (independent standard entries) shared
  by all tokens, $dx_i = F_i\,dt + \sigma P_{x_i} \circ (dB\, x_i)$ ($\sigma\, dB\, x_i$ in $\mathbb R^d$):
  every token is moved by the same random linear map, so the noise keeps their configuration's
  structure and acts on it as a whole.

``sigma`` is a traced parameter (vmap and grad over it: one compilation); ``sigma = 0`` is the
deterministic flow driven by a zero path. A run with noise needs ``key`` (a ``jax.random`` key): the
same key gives the same path, bit for bit, also under ``vmap`` over keys. What a noise refuses is its
own declaration (``Noise.check``): tokens with a radius (the schemes of ``mf.normalization.RADIAL``:
their noise model is not defined here), solvers other than ``"rk2"`` and ``"heun"`` (the Heun step on
fixed or adaptive steps, which converges
to the Stratonovich solution in any geometry; the projected Euler--Maruyama step reaches it on the
sphere only through its normalisation, and for the common noise in $\mathbb R^d$ it converges to
the Ito equation, another flow: refused, conservatively) and the step rule ``"renormalize"``.

``Noise.diffusion`` is the noise's term in the density equation of the mean-field limit
(``mf.continuum``'s ``noise=``): $D = \sigma^2 / 2$ in $+D \Delta_S \rho$ for ``Independent``;
``Common`` has no deterministic density equation (refused).

Example:
    >>> import jax, meanfield as mf
    >>> x0 = mf.sphere.uniform(jax.random.key(0), 16, 3)
    >>> traj = mf.simulate(mf.kernels.USA(1.0), x0, t1=1.0, dt=0.05,
    ...                    noise=mf.noise.Independent(0.5), key=jax.random.key(1))
    >>> traj.xs.shape, bool(traj.failed)
    ((2, 16, 3), False)
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
from jaxtyping import Array, Float

from . import sphere
from ._declare import Variant, param
from ._precision import matmul
from ._spelling import Say, early_stop_problem, say_python

__all__ = ["Noise", "Independent", "Common", "NOISES", "NOISE_SOLVERS"]

#: The solvers a noisy run takes: the Stratonovich Heun step on fixed steps (``mf.simulate``'s
#: ``"rk2"``) or with adaptive steps (``"heun"``: Euler's step its error estimate, rejected step times
#: revisited, a Brownian tree of resolution ``t1 2^-20``).
NOISE_SOLVERS = ("rk2", "heun")


class Noise(Variant):
    r"""The diffusion of a run: the base of ``Independent`` and ``Common`` (``mf.simulate(noise=)``).

    A member defines ``control_shape`` (the shape of its Brownian motion) and ``increment`` (the
    state's increment for a Brownian increment, tangent on the sphere).

    Example:
        >>> import meanfield as mf
        >>> mf.noise.Noise.coerce("common", sigma=0.3)
        Common(sigma=0.3)
    """

    flat_name: ClassVar[str | None] = "noise"
    what: ClassVar[str] = "noise"
    sigma: Any = param(kind="float>=0", doc="noise amplitude sigma (>= 0)")

    def control_shape(self, n: int, d: int) -> tuple[int, ...]:
        """The shape of the Brownian motion that drives ``n`` tokens in dimension ``d``."""
        raise NotImplementedError

    def raw_increment(self, x: Float[Array, "n d"], dW: Array) -> Float[Array, "n d"]:
        """The increment before the projection: ``sigma`` times the Brownian increment's action on ``x``."""
        raise NotImplementedError

    def increment(self, x: Float[Array, "n d"], dW: Array, on_sphere: bool = True) -> Array:
        r"""The increment of the states ``x`` (unit rows on the sphere; tokens in $\mathbb R^d$ when
        ``on_sphere`` is False) for the Brownian increment ``dW``: projected on the tangent spaces
        on the sphere."""
        v = self.raw_increment(x, dW)
        return sphere.project(x, v) if on_sphere else v

    def diffusion(self) -> Any:
        r"""The diffusion coefficient $D$ of the density equation (``mf.continuum``, ``noise=``): in
        the mean-field limit the density gains $+D \Delta_S \rho$ (a forward heat flow), in the
        original time $t$ of the run. Only a noise whose density obeys a deterministic Fokker-Planck
        equation has one; this base raises ``ValueError`` (one line), and so does ``Common``.

        Example:
            >>> import meanfield as mf
            >>> mf.noise.Independent(0.5).diffusion()     # sigma^2 / 2
            0.125
        """
        raise ValueError(
            f"{say_python('noise', self.name)} has no deterministic density equation here (no "
            "Fokker-Planck equation is defined for it); the density equation takes noise=None or "
            "mf.noise.Independent(sigma)"
        )

    def check(
        self,
        *,
        solver: str | None = None,
        scheme: Any = None,
        step: Any = None,
        early_stop: Any = None,
        say: Say = say_python,
    ) -> None:
        """``ValueError`` (one line) for what the noise cannot run with: a ``solver`` other than the
        Stratonovich Heun step, a ``scheme`` whose tokens carry a radius, a step rule that does not
        integrate the tangent field, an energy-plateau stop ``early_stop`` (a noisy run's energy is
        not stationary: ``meanfield._spelling.early_stop_problem``); ``say`` spells the settings as
        the caller's surface does.

        Example:
            >>> import meanfield as mf
            >>> try:
            ...     mf.noise.Independent(0.1).check(solver="euler")
            ... except ValueError as e:
            ...     print(e)
            noise='independent' needs solver='rk2' or solver='heun' (the Stratonovich Heun step, fixed or adaptive), not solver='euler'
        """
        name = say("noise", self.name)
        if solver is not None and solver not in NOISE_SOLVERS:
            raise ValueError(
                f"{name} needs {say('solver', NOISE_SOLVERS[0])} or {say('solver', NOISE_SOLVERS[1])} "
                f"(the Stratonovich Heun step, fixed or adaptive), not {say('solver', solver)}"
            )
        if scheme is not None and scheme.radial:
            raise ValueError(
                f"{name} acts on tokens on the sphere or in R^d; {say('normalization', scheme.name)} "
                f"carries a radius (no noise model for it here)"
            )
        if step is not None and not step.tangent:
            raise ValueError(
                f"{name} is integrated with the tangent field; {say('step', step.name)} is not"
            )
        problem = early_stop_problem(name, early_stop, say)
        if problem is not None:
            raise ValueError(problem)


@Noise.builtin
class Independent(Noise):
    r"""Every token its own Brownian motion: $dx_i = F_i\,dt + \sigma P_{x_i} \circ dW_i$.

    Example:
        >>> import meanfield as mf
        >>> mf.noise.Independent(0.2).control_shape(5, 3)
        (5, 3)
    """

    name: ClassVar[str | None] = "independent"

    def control_shape(self, n: int, d: int) -> tuple[int, ...]:
        return (n, d)

    def raw_increment(self, x: Float[Array, "n d"], dW: Array) -> Float[Array, "n d"]:
        return self.sigma * dW

    def diffusion(self) -> Any:
        r"""$D = \sigma^2 / 2$: the generator of each token's noise is $\frac{\sigma^2}{2} \Delta_S$
        (docs/math/noise.md, Independent noise), so the density gains $+\frac{\sigma^2}{2} \Delta_S \rho$
        (``sigma`` concrete or traced)."""
        return self.sigma**2 / 2


@Noise.builtin
class Common(Noise):
    r"""One matrix Brownian motion for all tokens: $dx_i = F_i\,dt + \sigma P_{x_i} \circ (dB\, x_i)$.

    Example:
        >>> import meanfield as mf
        >>> mf.noise.Common(0.2).control_shape(5, 3)
        (3, 3)
    """

    name: ClassVar[str | None] = "common"

    def control_shape(self, n: int, d: int) -> tuple[int, ...]:
        return (d, d)

    def raw_increment(self, x: Float[Array, "n d"], dW: Array) -> Float[Array, "n d"]:
        return self.sigma * matmul(x, jnp.swapaxes(dW, -1, -2))  # row i: (dB x_i)^T

    def diffusion(self) -> Any:
        r"""Refused (``ValueError``): one Brownian motion moves every token, so the density conditional
        on it solves a stochastic PDE (a random transport by $\sigma P_x \circ (dB\, x)$), not a
        deterministic Fokker-Planck equation; each token's marginal law alone diffuses as with
        ``Independent``, but the interaction sees the joint law.

        Example:
            >>> import meanfield as mf
            >>> try:
            ...     mf.noise.Common(0.2).diffusion()
            ... except ValueError as e:
            ...     print(str(e).split(": ")[0])
            noise='common' moves every token by one Brownian motion
        """
        raise ValueError(
            f"{say_python('noise', self.name)} moves every token by one Brownian motion: the density "
            "conditional on it solves a stochastic PDE (a random transport), and there is no "
            "deterministic Fokker-Planck equation for it here; the density equation takes noise=None "
            "or mf.noise.Independent(sigma)"
        )


#: The built-in noises' names (``Noise.names()`` adds registered ones).
NOISES = Noise.names()
