r"""The exp-gauge kernels $e^{\beta \langle \Psi(\xi) x, \Psi(\zeta) y\rangle} / \beta$ (USA in a label-dependent
frame) and their gauge and phase families."""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, DTypeLike, Float, Int, PRNGKeyArray, Real

from .. import sphere
from .._checks import (
    RealScalarLike,
    check_int,
    check_orthogonal,
    check_plane,
    is_concrete,
    traced_labels,
)
from .._params import KEY_SEED_MAX, Param
from .._precision import dot, matmul
from .._resources import Footprint, as_float
from ..masks import Mask
from ..models import Declared, _fold_scheme, param
from ..normalization import Scheme
from ._base import masked_pairwise_field
from ._exp import USA, _apply_gauge, _apply_gauge_transpose, _ExpKernel, _tiled_exp

__all__ = [
    "GaugeKernel",
    "RoPE",
    "PhaseField",
    "Gauge",
    "Prompt",
    "FourierPhase",
    "WavyGauge",
    "random_gauges",
    "default_phase",
    "wavy_gauge",
    "OMEGA_DOC",
    "PLANE_DOC",
]

# ----------------------------------------------------------------------------
# exp-gauge kernels: h = exp(beta <Psi(xi) x, Psi(zeta) y>) / beta
# ----------------------------------------------------------------------------


#: The doc of the rotation frequency ``omega`` (RoPE; the phase field's linear rate).
OMEGA_DOC = "rotation frequency of the positions (phase: linear rate)"
#: The doc of the rotation plane.
PLANE_DOC = "rotation plane (a, b)"


def _plane(plane: Any) -> Any:
    """``plane`` as a tuple (a list from a spec or a user), other values as given (the declared
    check names them)."""
    return tuple(plane) if isinstance(plane, (list, tuple)) else plane


class GaugeKernel(_ExpKernel):
    r"""Abstract base of the exp-gauge kernels $h = e^{\beta \langle \Psi(\xi) x, \Psi(\zeta) y\rangle} / \beta$:
    USA in a label-dependent frame. Subclasses define ``gauge_matrix(label, d)``
    (``abc.abstractmethod``) and get the single-pair definition, the gauge-frame fast path
    (the fused C kernel on the CPU), the maximiser frame and the orthogonality check.

    Field and energy use the gauge frame (docs/math/kernels.md, Gauge equivalence):
    $y_i = \Psi_i x_i$, $F_i = \Psi_i^\top F^\text{USA}(y)_i$, $E = E^\text{USA}(y)$: $O(n^2 d)$.

    Args (of every subclass, besides its own fields):
        beta: inverse temperature, ``> 0`` (traced).
        rescaled: multiply by $e^{-\beta}$ (time change, keyword-only).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> class Flip(mf.kernels.GaugeKernel):          # Psi(s) = diag(+-1, 1, 1)
        ...     def gauge_matrix(self, label, d):
        ...         return jnp.diag(jnp.ones(d).at[0].set(jnp.where(label > 0.5, -1.0, 1.0)))
        >>> k, x = Flip(1.0), mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> bool(jnp.allclose(mf.energy(k, x), mf.energy(k, x, method="pairwise"), rtol=1e-5))
        True
    """

    @abc.abstractmethod
    def gauge_matrix(self, label: ArrayLike, d: int) -> Real[Array, "d d"]:
        r"""The gauge $\Psi(\text{label})$: a ``(d, d)`` orthogonal matrix (defined by each subclass).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> Q = mf.kernels.RoPE(1.0, 2 * jnp.pi).gauge_matrix(0.25, 3)   # R_{pi/2} in (e_1, e_2)
            >>> bool(jnp.allclose(Q @ jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 1.0, 0.0]), atol=1e-6))
            True
        """

    def gauge_matrices(self, aux: ArrayLike, d: int) -> Float[Array, "n d d"]:
        r"""$\Psi(\xi_i)$ for every label: ``(n, d, d)``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> mf.kernels.RoPE(1.0, 2 * jnp.pi).gauge_matrices(mf.positions(4), 3).shape
            (4, 3, 3)
        """
        return jax.vmap(lambda a: self.gauge_matrix(a, d))(aux)

    def to_gauge_frame(self, x: Float[Array, "n d"], aux: ArrayLike) -> Float[Array, "n d"]:
        r"""$y_i = \Psi(\xi_i) x_i$: the configuration in which the dynamics is USA, ``(n, d)``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> k = mf.kernels.RoPE(1.0, 2 * jnp.pi)
            >>> y = k.to_gauge_frame(jnp.array([[1.0, 0.0, 0.0]]), jnp.array([0.25]))   # R_{pi/2} e_1
            >>> bool(jnp.allclose(y, jnp.array([[0.0, 1.0, 0.0]]), atol=1e-6))
            True
        """
        return _apply_gauge(self.gauge_matrices(aux, x.shape[-1]).astype(x.dtype), x)

    def from_gauge_frame(self, y: Float[Array, "n d"], aux: ArrayLike) -> Float[Array, "n d"]:
        r"""$x_i = \Psi(\xi_i)^\top y_i$ (inverse of ``to_gauge_frame``), ``(n, d)``.

        Example:
            >>> import jax, jax.numpy as jnp, meanfield as mf
            >>> k, s = mf.kernels.RoPE(1.0, 2 * jnp.pi), mf.positions(4)
            >>> x = mf.sphere.uniform(jax.random.key(0), 4, 3)
            >>> bool(jnp.allclose(k.from_gauge_frame(k.to_gauge_frame(x, s), s), x, atol=1e-6))
            True
        """
        return _apply_gauge_transpose(self.gauge_matrices(aux, y.shape[-1]).astype(y.dtype), y)

    def usa(self) -> USA:
        r"""The USA kernel $e^{\beta \langle y, y'\rangle} / \beta$ this kernel is in its gauge frame.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> type(mf.kernels.RoPE(1.0, 2 * jnp.pi).usa()).__name__
            'USA'
        """
        return USA(self.beta, rescaled=self.rescaled)

    def __call__(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, ""]:
        d = x.shape[-1]
        a = matmul(self.gauge_matrix(xi, d).astype(x.dtype), x)
        b = matmul(self.gauge_matrix(zeta, d).astype(y.dtype), y)
        return self._exp(dot(a, b)) / self.beta

    def grad_x(
        self,
        x: Float[Array | np.ndarray, " d"],
        xi: ArrayLike,
        y: Float[Array | np.ndarray, " d"],
        zeta: ArrayLike,
    ) -> Float[Array, " d"]:
        d = x.shape[-1]
        A = self.gauge_matrix(xi, d).astype(x.dtype)
        B = self.gauge_matrix(zeta, d).astype(y.dtype)
        by = matmul(B, y)
        return self._exp(dot(matmul(A, x), by)) * matmul(A.T, by)

    def attention_field(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, "n d"]:
        if self.mask is not None:
            return masked_pairwise_field(self, x, aux)
        # Psi_i^T usa_field(Psi x)_i, the gauge transforms inside the native kernel or the chunked evaluation
        aux = self.default_aux(x.shape[0]) if aux is None else aux  # as Kernel.field
        P = self.gauge_matrices(aux, x.shape[-1]).astype(x.dtype)
        beta = jnp.asarray(self.beta, x.dtype)
        return _tiled_exp(x, None, beta, self._shift(x.dtype), block_size, gauge=P, parts="F")[0]

    def energy(
        self, x: Float[Array, "n d"], aux: ArrayLike | None, *, block_size: int | None = None
    ) -> Float[Array, ""]:
        self.refuse_masked_energy()
        # the USA energy of y = Psi x, through the same chunked evaluation as the field
        aux = self.default_aux(x.shape[0]) if aux is None else aux  # as Kernel.field
        P = self.gauge_matrices(aux, x.shape[-1]).astype(x.dtype)
        beta = jnp.asarray(self.beta, x.dtype)
        return _tiled_exp(x, None, beta, self._shift(x.dtype), block_size, gauge=P, parts="S")[
            1
        ] / (2.0 * beta)

    def footprint(self, n: int, d: int, *, block_size: int | None = None) -> Footprint:
        """The exp kernels' tiles (``_ExpKernel.footprint``), the ``(n, d, d)`` gauge matrices and the
        gauge-frame states (two of each: XLA:CPU's measured peak holds about that)."""
        f = super().footprint(n, d, block_size=block_size)
        nf, df = as_float(n), as_float(d)
        return Footprint(entries=f.entries + 2.0 * nf * df * df + 2.0 * nf * df, pairs=f.pairs)

    def check_config(self, x: ArrayLike, aux: ArrayLike | None) -> None:
        super().check_config(x, aux)
        if is_concrete(aux) and is_concrete(self):
            check_orthogonal(
                f"{type(self).__name__} gauge",
                self.gauge_matrices(jnp.asarray(aux), np.shape(x)[-1]),
            )


class RoPE(GaugeKernel):
    r"""Rotary positional kernel $h = e^{\beta \langle x, R_{\omega (t - s)} y\rangle} / \beta$.

    The gauge $\Psi(s) = R_{\omega s}$ in ``plane``. Maximiser $x(s) = R_{-\omega s} u$:
    for $\omega = 2 \pi m$ a latitude circle (height $\|P_{E^\perp} u\|$).

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        omega: rotation frequency (traced, finite).
        plane: the rotation plane ``(a, b)`` (static).
        rescaled: multiply by $e^{-\beta}$ (time change).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k = mf.kernels.RoPE(1.0, 2 * jnp.pi)
        >>> x = jnp.array([1.0, 0.0, 0.0])
        >>> round(float(k(x, 0.0, x, 0.0)), 4), round(float(k(x, 0.0, x, 0.25)), 4)   # e, then e^0
        (2.7183, 1.0)
    """

    name = "rope"
    summary = "rotary positions exp(beta <x, R_omega(t - s) y>) / beta: a latitude circle"

    omega: RealScalarLike = param(2 * math.pi, kind="float", doc=OMEGA_DOC)
    plane: tuple[int, int] = param((0, 1), kind="plane", static=True, doc=PLANE_DOC)

    own_init = True

    def __init__(
        self,
        beta: Any,
        omega: Any,
        plane: Any = (0, 1),
        *,
        rescaled: bool = False,
        mask: Mask | None = None,
        normalization: Any = "post",
        alpha: Any | None = None,
        switch_time: Any | None = None,
    ) -> None:
        self.beta, self.omega, self.plane, self.rescaled = beta, omega, _plane(plane), rescaled
        self.mask = mask
        self.normalization = normalization
        _fold_scheme(self, alpha=alpha, switch_time=switch_time)

    def gauge_matrix(self, label: ArrayLike, d: int) -> Float[Array, "d d"]:
        check_plane(self.plane, d)
        return sphere.rotation(self.omega * label, d, self.plane)


class _Callable(eqx.Module):
    """A plain callable held as a static field: a new callable object is a new compilation
    (prefer the Module families ``FourierPhase`` and ``WavyGauge``, whose parameters are traced)."""

    fn: Callable = eqx.field(static=True)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _as_module(fn: object, what: str) -> eqx.Module:
    if isinstance(fn, eqx.Module):
        return fn
    if not callable(fn):
        raise TypeError(f"{what}, got {fn!r}")
    return _Callable(fn)


class FourierPhase(Declared):
    r"""Phase $\varphi(s) = \omega s + \text{amplitude} \cdot \sin(2 \pi \cdot \text{frequency} \cdot s)$ with traced ``omega`` and
    ``amplitude`` (a PyTree: a jitted function of them compiles once for any values).

    ``FourierPhase()`` is ``default_phase``: $2 \pi s + \sin(2 \pi s)$; ``amplitude = 0`` gives
    RoPE's linear phase.

    Args:
        omega: the linear rate (traced, finite; default $2 \pi$).
        amplitude: the sine amplitude (traced, finite; default 1).
        frequency: the sine frequency, an int ``>= 1`` (static; default 1).

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.FourierPhase()(0.25)), 4)   # pi / 2 + 1
        2.5708
    """

    omega: RealScalarLike = param(2 * math.pi, kind="float", doc=OMEGA_DOC)
    amplitude: RealScalarLike = param(1.0, kind="float", doc="sine amplitude of the phase")
    frequency: int = param(1, kind="int>=1", static=True, doc="sine frequency of the phase")

    def __call__(self, s: ArrayLike) -> Float[Array, "..."]:
        # a JAX array: NumPy's stubs type ndarray + Array as ndarray (JAX's __array_priority__ wins)
        return self.omega * s + self.amplitude * jnp.sin(2 * jnp.pi * self.frequency * s)  # type: ignore[return-value]


class WavyGauge(Declared):
    r"""Generalised RoPE gauge $\Psi(s) = R_{12}(2 \pi s)\, R_{23}(a \sin(2 \pi k s))$ on $\mathbb R^3$
    (docs/math/kernels.md, Generalised RoPE), with traced amplitude ``a`` (a PyTree: one
    compilation for any ``a``).

    Its maximiser $x(s) = \Psi(s)^\top u$ is a wavy closed curve, which a single fixed-plane
    phase field cannot produce (those stay on a latitude circle).

    Args:
        amplitude: the wave amplitude ``a`` in radians (traced, finite; default 0.6).
        k: number of waves per turn, an int ``>= 1`` (static; default 3).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> Q = mf.kernels.WavyGauge(0.6, 3)(0.3)
        >>> Q.shape, bool(jnp.allclose(Q @ Q.T, jnp.eye(3), atol=1e-6))
        ((3, 3), True)
    """

    required_d = 3

    amplitude: RealScalarLike = param(
        0.6, kind="float", doc="wave amplitude of the gauge (radians)"
    )
    k: int = param(3, kind="int>=1", static=True, doc="waves per turn of the gauge")

    def __call__(self, s: ArrayLike) -> Float[Array, "3 3"]:
        R12 = sphere.rotation(2 * jnp.pi * s, 3, (0, 1))
        R23 = sphere.rotation(self.amplitude * jnp.sin(2 * jnp.pi * self.k * s), 3, (1, 2))
        return matmul(R12, R23)


class PhaseField(GaugeKernel):
    r"""Phase-field kernel $h = e^{\beta \langle x, R_{\varphi(t) - \varphi(s)} y\rangle} / \beta$.

    ``phase`` maps $s \mapsto$ angle $\varphi(s)$ (jax-traceable). Gauge $\Psi(s) = R_{\varphi(s)}$;
    maximiser $x(s) = R_{-\varphi(s)} u$. In a single fixed plane the maximiser stays
    on a latitude circle (only its parametrisation changes).

    A parametrised phase that is an ``equinox.Module`` (``FourierPhase``, or your own) is part
    of the PyTree: its parameters are traced, so a jitted function building
    ``PhaseField(beta, FourierPhase(omega, amplitude))`` compiles once for any values. A plain
    callable is held as a static field: each new callable object is a new compilation.

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        phase: $s \mapsto \varphi(s)$: an ``equinox.Module`` (traced leaves) or a plain callable.
        plane: the rotation plane ``(a, b)`` (static).
        rescaled: multiply by $e^{-\beta}$ (time change).

    Example:
        >>> import jax, meanfield as mf
        >>> k = mf.kernels.PhaseField(1.0, mf.kernels.FourierPhase(2.0, 0.5))
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> mf.field(k, x).shape
        (8, 3)
    """

    name = "phase-field"
    summary = "phase field phi(s) = omega s + amplitude sin(2 pi frequency s) (FourierPhase)"

    # the registry builds the phase from FourierPhase's parameters (omega, amplitude, frequency)
    phase: eqx.Module = param(FourierPhase(), kind=FourierPhase, doc="the phase s -> angle")
    plane: tuple[int, int] = param((0, 1), kind="plane", static=True, doc=PLANE_DOC)

    own_init = True

    def __init__(
        self,
        beta: Any,
        phase: Any,
        plane: Any = (0, 1),
        *,
        rescaled: bool = False,
        mask: Mask | None = None,
        normalization: Any = "post",
        alpha: Any | None = None,
        switch_time: Any | None = None,
    ) -> None:
        self.beta, self.plane, self.rescaled, self.mask = beta, _plane(plane), rescaled, mask
        self.normalization = normalization
        _fold_scheme(self, alpha=alpha, switch_time=switch_time)
        self.phase = _as_module(phase, "phase must be a callable s -> angle")

    def gauge_matrix(self, label: ArrayLike, d: int) -> Float[Array, "d d"]:
        check_plane(self.plane, d)
        # equinox types a Module as not callable; the phase is a callable one (_as_module)
        return sphere.rotation(self.phase(label), d, self.plane)  # type: ignore[operator]


class Gauge(GaugeKernel):
    r"""General gauge kernel $h = e^{\beta \langle \Psi(\xi) x, \Psi(\zeta) y\rangle} / \beta$.

    ``gauge`` maps ``label -> (d, d)`` orthogonal matrix (jax-traceable); its orthogonality
    is checked on the labels of a concrete run. Maximiser $x(\xi) = \Psi(\xi)^\top u$. As for
    ``PhaseField``, an ``equinox.Module`` gauge (``WavyGauge``) has traced parameters; a plain
    callable is static (a new callable object is a new compilation).

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        gauge: ``label -> (d, d)`` orthogonal matrix: an ``equinox.Module`` or a plain callable.
        rescaled: multiply by $e^{-\beta}$ (time change).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> k = mf.kernels.Gauge(1.0, mf.kernels.WavyGauge())
        >>> s = mf.positions(8)
        >>> x = k.from_gauge_frame(jnp.tile(jnp.array([0.0, 0.0, 1.0]), (8, 1)), s)   # the maximiser
        >>> round(float(mf.energy(k, x, s)), 4)   # e / 2
        1.3591
    """

    name = "gauge"
    summary = "wavy generalised RoPE R12(2 pi s) R23(amplitude sin(2 pi k s)) (WavyGauge, d = 3)"

    # the registry builds the gauge from WavyGauge's parameters (amplitude, k; d = 3)
    gauge: eqx.Module = param(
        WavyGauge(), kind=WavyGauge, doc="the gauge label -> (d, d) orthogonal matrix"
    )

    own_init = True

    def __init__(
        self,
        beta: Any,
        gauge: Any,
        *,
        rescaled: bool = False,
        mask: Mask | None = None,
        normalization: Any = "post",
        alpha: Any | None = None,
        switch_time: Any | None = None,
    ) -> None:
        self.beta, self.rescaled, self.mask = beta, rescaled, mask
        self.normalization = normalization
        _fold_scheme(self, alpha=alpha, switch_time=switch_time)
        self.gauge = _as_module(gauge, "gauge must be a callable label -> (d, d) orthogonal matrix")

    def gauge_matrix(self, label: ArrayLike, d: int) -> Real[Array, "d d"]:
        # equinox types a Module as not callable; the gauge is a callable one (_as_module)
        Q = jnp.asarray(self.gauge(label))  # type: ignore[operator]
        if Q.shape != (d, d):
            raise ValueError(f"gauge(label) must return a ({d}, {d}) matrix, got shape {Q.shape}")
        return Q


class Prompt(GaugeKernel):
    r"""Prompt kernel: the gauge kernel over integer prompt ids $\xi \in \{0, \dots, K-1\}$.

    $h = e^{\beta \langle \Psi_\xi x, \Psi_\zeta y\rangle} / \beta$ with ``gauges`` a ``(K, d, d)``
    array of orthogonal matrices (reconstruction of the paper's lost kernel (10),
    docs/math/kernels.md, Prompts). Maximiser: $K$ Dirac masses at $\Psi_k^\top u$. Default
    labels when ``aux=None``: contiguous prefix blocks, $\xi_i = \lfloor K i / n \rfloor$.

    Args:
        beta: inverse temperature, ``> 0`` (traced).
        gauges: ``(K, d, d)`` orthogonal matrices.
        rescaled: multiply by $e^{-\beta}$ (time change).
        normalization, alpha, switch_time: the layer-norm placement (``mf.normalization``), as
            every exp kernel takes it.

    Example:
        >>> import jax, meanfield as mf
        >>> k = mf.kernels.Prompt(1.0, mf.kernels.random_gauges(jax.random.key(0), 2, 3))
        >>> k.default_aux(4).tolist()
        [0, 0, 1, 1]
        >>> mf.field(k, mf.sphere.uniform(jax.random.key(1), 4, 3)).shape
        (4, 3)
    """

    name = "prompt"
    summary = "prompt gauges Psi_k on K contiguous blocks: K Dirac masses"

    gauges: Array = None  # type: ignore[assignment]  # set by __init__
    integer_labels: ClassVar[bool] = True
    #: The registry's construction of the gauges (``from_params``): parameters that are not fields.
    construction: ClassVar[tuple[Param, ...]] = (
        Param("prompts", 3, False, "int>=1", "number of prompts K"),
        Param(
            "gauges",
            "random",
            False,
            "choice",
            "prompt gauges: Haar-random (from gauge_seed) or rotations by 2 pi k / K in plane",
            ("random", "rotation"),
        ),
        Param(
            "gauge_seed",
            0,
            False,
            "int>=0",
            "PRNG seed of the random prompt gauges",
            maximum=KEY_SEED_MAX,
            applies=(("gauges", ("random",)),),
        ),
        Param("plane", (0, 1), False, "plane", PLANE_DOC, applies=(("gauges", ("rotation",)),)),
    )

    @classmethod
    def params(cls) -> tuple[Param, ...]:
        """``beta``, the construction of the gauges (``prompts``, ``gauges``, ``gauge_seed``,
        ``plane``: ``construction``), ``rescaled``, the layer-norm placement of every exp kernel
        (``normalization``, ``alpha``, ``switch_time``: ``from_params`` passes them on) and the mask's.

        Example:
            >>> import meanfield as mf
            >>> [p.name for p in mf.kernels.Prompt.params()][:6]
            ['beta', 'prompts', 'gauges', 'gauge_seed', 'plane', 'rescaled']
        """
        beta, *rest = super().params()
        return (beta, *cls.construction, *rest)

    @classmethod
    def from_params(cls, P: dict[str, Any], d: int | None, dtype: Any) -> Prompt:
        r"""``K = prompts`` gauges: rotations by $2 \pi k / K$ in ``plane`` (``gauges = "rotation"``)
        or Haar-random from ``jax.random.key(gauge_seed)``, drawn in float32 whatever the dtype (the
        same gauges), made orthogonal to the dtype's rounding for wider dtypes (one QR, signs kept);
        ``normalization``, ``alpha``, ``switch_time`` and the mask as given (``Model.from_params``).

        Example:
            >>> import meanfield as mf
            >>> P = {"beta": 1.0, "prompts": 2, "gauges": "rotation", "gauge_seed": 0, "plane": (0, 1), "rescaled": False}
            >>> mf.kernels.Prompt.from_params(P, 3, None).gauges.shape
            (2, 3, 3)
        """
        K = P["prompts"]
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(float)
        if P["gauges"] == "rotation":  # Psi_k = rotation by 2 pi k / K in `plane`
            G = jnp.stack(
                [sphere.rotation(2 * np.pi * k / K, d, P["plane"]) for k in range(K)]
            ).astype(dtype)
        else:
            G = random_gauges(jax.random.key(P["gauge_seed"]), K, d, jnp.float32).astype(dtype)
            if jnp.dtype(dtype).itemsize > 4:
                q, r = jnp.linalg.qr(G)
                G = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
        # the layer-norm placement as every exp kernel takes it (mf.normalization; optional keys:
        # a dict written before them keeps the defaults)
        scheme: dict[str, Any] = (
            {"normalization": Scheme.from_params(P)} if "normalization" in P else {}
        )
        return cls(P["beta"], G, rescaled=P["rescaled"], **scheme, **cls._mask_kwargs(P))

    own_init = True

    def __init__(
        self,
        beta: Any,
        gauges: Any,
        *,
        rescaled: bool = False,
        mask: Mask | None = None,
        normalization: Any = "post",
        alpha: Any | None = None,
        switch_time: Any | None = None,
    ) -> None:
        self.mask = mask
        self.normalization = normalization
        _fold_scheme(self, alpha=alpha, switch_time=switch_time)
        dtype = gauges.dtype if hasattr(gauges, "dtype") else np.asarray(gauges).dtype
        if isinstance(gauges, (str, bytes)) or np.dtype(dtype).kind not in "iuf":
            raise TypeError(
                f"gauges must be a real (K, d, d) array of orthogonal matrices, got {gauges!r}"
            )
        G = jnp.asarray(gauges)
        if G.ndim != 3 or G.shape[1] != G.shape[2] or G.shape[0] < 1:
            raise ValueError(f"gauges must have shape (K, d, d) with K >= 1, got {G.shape}")
        check_orthogonal("Prompt gauges", G)
        self.beta, self.gauges, self.rescaled = beta, G, rescaled

    @property
    def num_prompts(self) -> int:
        """Number of prompts $K$ = ``gauges.shape[0]``.

        Example:
            >>> import jax, meanfield as mf
            >>> mf.kernels.Prompt(1.0, mf.kernels.random_gauges(jax.random.key(0), 3, 2)).num_prompts
            3
        """
        return self.gauges.shape[0]

    def default_aux(self, n: int) -> Int[Array, " n"]:
        return (jnp.arange(n) * self.num_prompts) // n

    def gauge_matrix(self, label: ArrayLike, d: int) -> Real[Array, "d d"]:
        if self.gauges.shape[-1] != d:
            raise ValueError(
                f"Prompt gauges are {self.gauges.shape[-1]}x{self.gauges.shape[-1]}, states have d = {d}"
            )
        return self.gauges[label]

    def check_traced(self, x: Array, aux: ArrayLike | None) -> Array:
        return traced_labels(super().check_traced(x, aux), aux, self.num_prompts)

    def check_config(self, x: ArrayLike, aux: ArrayLike | None) -> None:
        _ExpKernel.check_config(self, x, aux)
        d = np.shape(x)[-1]
        if self.gauges.shape[-1] != d:
            raise ValueError(
                f"Prompt gauges are {self.gauges.shape[-1]}x{self.gauges.shape[-1]} matrices but the "
                f"states have d = {d}; pass gauges of shape (K, {d}, {d})"
            )
        if is_concrete(aux):
            a = np.asarray(aux)
            if not np.issubdtype(a.dtype, np.integer):
                raise TypeError(f"Prompt labels must be integer prompt ids, got dtype {a.dtype}")
            if a.size and (a.min() < 0 or a.max() >= self.num_prompts):
                raise ValueError(
                    f"Prompt labels must lie in [0, {self.num_prompts - 1}], got range [{a.min()}, {a.max()}]"
                )


# ----------------------------------------------------------------------------
# construction by name (CLI, sweeps, reproductions)
# ----------------------------------------------------------------------------


def random_gauges(
    key: PRNGKeyArray, K: int, d: Any, dtype: DTypeLike = jnp.float32
) -> Float[Array, "K d d"]:
    r"""``K`` Haar-random orthogonal ``(d, d)`` matrices: $Q R = G$, $G$ Gaussian, $Q \operatorname{diag}(\operatorname{sign}(\operatorname{diag} R))$.

    Args:
        key: a ``jax.random`` key.
        K: number of matrices.
        d: dimension.
        dtype: floating dtype.

    Returns:
        ``(K, d, d)`` orthogonal matrices.

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> G = mf.kernels.random_gauges(jax.random.key(0), 2, 3)
        >>> G.shape, bool(jnp.allclose(G[0] @ G[0].T, jnp.eye(3), atol=1e-5))
        ((2, 3, 3), True)
    """
    K = check_int("K", K, minimum=1)
    d = check_int("d", d, minimum=1)
    g = jax.random.normal(key, (K, d, d), dtype=dtype)
    q, r = jnp.linalg.qr(g)
    return q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]


def default_phase(s: ArrayLike) -> Float[Array, "..."]:
    r"""Default phase field $\varphi(s) = 2 \pi s + \sin(2 \pi s)$ (a non-uniform traversal):
    ``FourierPhase()`` as a plain function.

    Args:
        s: position(s), scalar or array.

    Returns:
        $\varphi(s)$, same shape as ``s``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.default_phase(0.25)), 4)   # pi / 2 + 1
        2.5708
    """
    return FourierPhase()(s)


def wavy_gauge(amplitude: RealScalarLike = 0.6, k: int = 3) -> WavyGauge:
    """The generalised RoPE gauge ``WavyGauge(amplitude, k)`` (for ``Gauge``).

    Args:
        amplitude: the wave amplitude ``a`` (radians).
        k: number of waves per turn.

    Returns:
        a ``WavyGauge``: ``s -> (3, 3)`` orthogonal matrix.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> Q = mf.kernels.wavy_gauge()(0.3)
        >>> Q.shape, bool(jnp.allclose(Q @ Q.T, jnp.eye(3), atol=1e-6))
        ((3, 3), True)
    """
    return WavyGauge(amplitude, k)
