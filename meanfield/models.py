"""Particle models on the sphere: the abstract base ``Model`` and self-attention dynamics.

``Model`` is the base of everything ``mf.velocity`` and ``mf.simulate`` accept: the pair
kernels of ``mf.kernels`` (``mf.kernels.Kernel``, which add a pair energy) and
``SelfAttention`` (Geshkovski, Letrouit, Polyanskiy, Rigollet), whose normalised dynamics
is not a gradient flow of a pair energy in general, so ``mf.energy`` raises ``TypeError``
for it. Entry points dispatch on these types.

A model class is the single source of its facts. Its parameters are its fields, declared with
``param`` (kind, i.e. the accepted range, doc, default, traced or static); its registry name is
the class attribute ``name``; ``interaction_rate()``, ``has_energy`` and ``max_energy()`` are
on the class. The registry (``mf.kernels.MODELS``, ``mf.kernels.register``), the command
line's flags and help, the sweep spec's keys and the validation of every value derive from
these declarations (``Model.params``, ``Model.from_params``).
"""

from __future__ import annotations

import abc
import dataclasses
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NoReturn, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from . import geometry as _geometry
from . import normalization as _norm
from . import sphere
from ._attention_weights import (
    ATTENTIONS,
    ENSEMBLES,
    VALUES,
    AttentionKind,
    Hardmax,
    Sinkhorn,
    Softmax,
    random_weights,
)
from ._checks import (
    RealScalarLike,
    _as_float_array,
    _error_if,
    check_fits_dtype,
    check_int,
    is_concrete,
    sphere_atol,
    traced_finite,
    traced_positive,
    traced_states,
)
from ._declare import (
    _DECLARATION,
    Declared,
    Variant,
    _build_declared,
    _declared_fields,
    declared_params,
    param,
)
from ._params import INT32_MAX, Param, applies_rules
from ._precision import einsum, matmul
from ._resources import Footprint, as_float
from ._spelling import applies_problem
from .geometry import Geometry, Sphere, geometry_of
from .masks import Mask, check_mask

#: Accepted values of ``SelfAttention``'s ``geometry``: tokens on the sphere (the projected flow, the
#: default) or in $\mathbb R^d$ (the unprojected flow of Geshkovski et al. 2023, no layer norm).
GEOMETRIES = _geometry.GEOMETRIES

#: Accepted values of ``normalization`` (``SelfAttention`` and the exp kernels; ``mf.normalization``).
NORMALIZATIONS = _norm.NORMALIZATIONS

_T = TypeVar("_T")

if TYPE_CHECKING:  # a field holds the variant, its constructor takes a registered name too

    class _VariantField(Generic[_T]):
        def __get__(self, obj: Any, owner: Any) -> _T: ...
        def __set__(self, obj: Any, value: _T | str) -> None: ...

    _SchemeArg = _VariantField[_norm.Scheme]
    _AttentionArg = _VariantField[AttentionKind]
    _GeometryArg = _VariantField[Geometry]
else:  # what the constructors take too: a registered name, converted once (``__post_init__``)
    _SchemeArg = _norm.Scheme | str
    _AttentionArg = AttentionKind | str
    _GeometryArg = Geometry | str

__all__ = [
    "Model",
    "SelfAttention",
    "attention_matrix",
    "check_states",
    "resolve_aux",
    "random_weights",
    "ATTENTIONS",
    "AttentionKind",
    "Softmax",
    "Sinkhorn",
    "Hardmax",
    "ENSEMBLES",
    "NORMALIZATIONS",
    "GEOMETRIES",
    "VALUES",
    "Declared",
    "positions",
    "param",
    "declared_params",
    "exp_interaction_rate",
    "exp_reference_step",
    "Profile",
    "ExpProfile",
    "BETA_DOC",
    "RESCALED_DOC",
]

#: The doc of the inverse temperature ``beta`` of every model that has one.
BETA_DOC = "inverse temperature"
#: The doc of ``rescaled`` (exp kernels, unnormalised self-attention).
RESCALED_DOC = "multiply by e^(-beta): time t = e^(-beta) s (beta > 88 in float32)"


def _namespace(value: object) -> ModuleType:
    """``jax.numpy`` for JAX values (tracers included), else ``numpy``."""
    return jnp if isinstance(value, jax.Array) else np


def exp_interaction_rate(
    beta: ArrayLike, rescaled: bool = False
) -> Array | np.ndarray | np.floating:
    r"""$\sqrt\beta\, e^{\beta - 1/2}$ ($\sqrt\beta\, e^{-1/2}$ when ``rescaled``): the rate of the exp
    kernels $e^{\beta \langle x, y\rangle} / \beta$, the reference code's step rule
    $\mathrm{dt} \le 0.1 / \max(\text{rate}, 1)$. NumPy in, NumPy out (overflow to ``inf``); JAX in, JAX out.

    Example:
        >>> round(float(exp_interaction_rate(1.0)), 4), round(float(exp_interaction_rate(4.0, True)), 4)
        (1.6487, 1.2131)
    """
    xp = _namespace(beta)
    b = xp.asarray(beta, dtype=None if xp is jnp else np.float64)
    with np.errstate(over="ignore"):
        return xp.sqrt(b) * xp.exp((0.0 if rescaled else b) - 0.5)


def exp_reference_step(
    beta: ArrayLike, base_dt: ArrayLike, rescaled: bool = False
) -> Array | np.ndarray | np.floating:
    r"""The reference code's step for the exp kernels, $\text{base\_dt} / \max(\text{rate}, 1)$ with
    ``exp_interaction_rate``, evaluated as $\text{base\_dt}\, e^{-\max(\log(\beta) / 2 + \beta - 1/2,\ 0)}$
    ($\beta$ replaced by 0 in the exponent when ``rescaled``): no overflow of $e^\beta$. NumPy in,
    NumPy out; JAX in, JAX out.

    Example:
        >>> [round(float(h), 5) for h in exp_reference_step(np.array([0.25, 2.0]), 0.1)]
        [0.1, 0.01578]
    """
    xp = _namespace(beta)
    b = xp.asarray(beta, dtype=None if xp is jnp else np.float64)
    return base_dt * xp.exp(-xp.maximum(0.5 * xp.log(b) + (0.0 if rescaled else b) - 0.5, 0.0))


class Profile(eqx.Module):
    r"""The profile $h$ of a zonal kernel, one that depends on $\langle x, y\rangle$ alone:
    $k(x, y) = h(\langle x, y\rangle)$ (``Model.zonal_profile``). What ``mf.continuum`` (the density
    equation, its dispersion relation) and the phase diagrams know of a model.

    The mean field of a density $\rho$ on $S^{d-1}$ is, with $(K * \rho)(x) = \int h(\langle x,
    y\rangle)\, \rho(y)\, d\sigma(y)$,

    $$X[\rho] = \nabla_S (K * \rho) \quad (\texttt{normalized=False}), \qquad X[\rho] = \frac{\nabla_S \log (K * \rho)}{\beta} \quad (\texttt{normalized=True}: \text{the softmax-normalised field of } h = e^{\beta t}).$$

    Subclasses define ``values`` (``abc.abstractmethod``); ``overflow_limit`` bounds ``beta`` where
    ``values`` overflows; ``rescalable`` says whether the model has a rescaled form (a change of
    time, ``rescaled=True``). The Funk-Hecke eigenvalues $\mu_l[h]$ and growth rates are computed
    by quadrature (``mf.continuum``) unless the profile is an ``ExpProfile`` (Bessel closed forms).

    Attributes:
        normalized: the field is $\nabla_S \log(K * \rho) / \beta$ (softmax-normalised).
        rescaled: the profile of the rescaled model (time $s = e^\beta t$).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> class Quadratic(mf.kernels.Profile):       # h(t) = beta t^2
        ...     def values(self, t, beta):
        ...         return beta * t**2
        >>> float(Quadratic().values(jnp.asarray(0.5), 2.0))
        0.5
    """

    normalized: bool = eqx.field(default=False, static=True)
    rescaled: bool = eqx.field(default=False, static=True)

    @property
    def rescalable(self) -> bool:
        """Whether the model has a rescaled form (``rescaled=True`` accepted by ``mf.continuum``);
        the base class: no."""
        return False

    @abc.abstractmethod
    def values(self, t: ArrayLike, beta: ArrayLike) -> Float[Array, "..."]:
        r"""$h(t)$ at ``t`` in $[-1, 1]$ for the inverse temperature ``beta`` (broadcast; traceable)."""

    def overflow_limit(self, dtype: Any) -> float | None:
        """The ``beta`` from which ``values`` overflows ``dtype`` (refused when concrete, an error in
        the program when traced), or None (never)."""
        return None


class ExpProfile(Profile):
    r"""The exp profile: $h(t) = e^{\beta t} / \beta$ (unnormalised, ``mf.kernels.USA``), times
    $e^{-\beta}$ when ``rescaled``; $h(t) = e^{\beta (t - 1)}$ when ``normalized``
    (``mf.models.SelfAttention``: the field does not depend on the constant factor).

    Its Funk-Hecke eigenvalues are Bessel functions, $\mu_l[e^{\beta t}] = (2 \pi)^{d/2} \beta^{1 -
    d/2} I_{l + d/2 - 1}(\beta)$: ``mf.continuum.growth_rates`` and ``most_unstable_mode`` use these
    closed forms (any ``d``, any degree) instead of quadrature.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.kernels.ExpProfile().values(1.0, 2.0)), 4)    # e^2 / 2
        3.6945
    """

    @property
    def rescalable(self) -> bool:
        """Unnormalised only: the normalised field is invariant under a rescaling of the kernel."""
        return not self.normalized

    def values(self, t: ArrayLike, beta: ArrayLike) -> Float[Array, "..."]:
        """``e^{beta t} / beta`` (``e^{beta (t - 1)} / beta`` rescaled); ``e^{beta (t - 1)}`` normalised."""
        t, beta = jnp.asarray(t), jnp.asarray(beta)
        if self.normalized:
            return jnp.exp(beta * (t - 1))
        return jnp.exp(beta * (t - 1) if self.rescaled else beta * t) / beta

    def overflow_limit(self, dtype: Any) -> float | None:
        r"""Unnormalised and not rescaled: ``log(finfo(dtype).max) - 1`` (about 87.7 in float32: the
        $e^\beta$ of the rates and of the kernel on the diagonal); None otherwise."""
        if self.normalized or self.rescaled:
            return None
        return float(np.log(np.finfo(dtype).max)) - 1.0


def positions(n: int) -> Float[Array, " n"]:
    r"""Default positional labels $s_i = i / n$, $i = 1, \dots, n$ (docs/math/index.md, Notation).

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


class Model(Declared):
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
    #: The registry name (``mf.kernels.register``; ``meanfield simulate --kernel NAME``, a sweep's
    #: ``kind = NAME``); None for a class that is not registered.
    name: ClassVar[str | None] = None
    #: One line for the registry, ``--help`` and the docs (default: the docstring's first line).
    summary: ClassVar[str | None] = None
    #: True for models that take a positional mask (``mask=``, a field; ``mf.masks``): pair
    #: kernels and ``SelfAttention``. Their parameters end with ``mf.masks.MASK_PARAMS``.
    takes_mask: ClassVar[bool] = False

    @classmethod
    def params(cls) -> tuple[Param, ...]:
        """The model's parameters, from its field declarations (``param``): what the registry,
        the command line's flags, a sweep's ``[model]`` keys and ``from_params`` accept (then the
        mask's, ``mf.masks.MASK_PARAMS``, for a model that ``takes_mask``).

        Example:
            >>> import meanfield as mf
            >>> [p.name for p in mf.kernels.PhaseField.params()][:6]
            ['beta', 'omega', 'amplitude', 'frequency', 'plane', 'rescaled']
            >>> [p.name for p in mf.kernels.PhaseField.params()][6:9]   # mf.normalization's
            ['normalization', 'alpha', 'switch_time']
            >>> [p.name for p in mf.kernels.PhaseField.params()][9:]   # the mask's (mf.masks.MASK_PARAMS)
            ['mask', 'slope', 'width', 'window_causal', 'include_self', 'mask_normalized']
        """
        from .masks import MASK_PARAMS

        return declared_params(cls) + (MASK_PARAMS if cls.takes_mask else ())

    @classmethod
    def from_params(cls, P: dict[str, Any], d: int | None, dtype: Any) -> Model:
        """The model from the full dict ``P`` of its parameters (``params()``, validated) for states
        of dimension ``d`` and floating ``dtype`` (what ``mf.kernels.build`` calls; traced values
        allowed). Overridden where a parameter is not a field (``Prompt``'s ``prompts``).

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.RoPE.from_params({"beta": 2.0, "omega": 1.0, "plane": (0, 2), "rescaled": False}, 3, None).plane
            (0, 2)
        """
        return _build_declared(cls, P, **cls._mask_kwargs(P))

    @classmethod
    def _mask_kwargs(cls, P: dict[str, Any]) -> dict[str, Any]:
        """``{"mask": ...}`` from the mask's values in ``P`` (``mf.masks.from_params``) for a model that
        ``takes_mask`` (and a mask is asked), else ``{}``."""
        from . import masks

        mask = masks.from_params(P) if cls.takes_mask else None
        return {} if mask is None else {"mask": mask}

    def at_time(self, t: ArrayLike) -> Model:
        """The model that acts at time ``t`` of a run (``mf.simulate`` evaluates
        ``model.at_time(t).field``): ``self`` for autonomous models (the base class); weights redrawn
        every ``regen_period`` for ``SelfAttention``.

        Example:
            >>> import meanfield as mf
            >>> m = mf.kernels.USA(1.0)
            >>> m.at_time(3.0) is m
            True
        """
        return self

    @classmethod
    def required_dimension(cls) -> int | None:
        """The dimension ``d`` the model needs (``Gauge`` with its ``WavyGauge``: 3), or None.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.Gauge.required_dimension(), mf.kernels.USA.required_dimension()
            (3, None)
        """
        if cls.required_d is not None:
            return cls.required_d
        for f in _declared_fields(cls):
            kind = f.metadata[_DECLARATION].kind
            required = getattr(kind, "required_d", None) if isinstance(kind, type) else None
            if required is not None:
                return int(required)
        return None

    @classmethod
    def zonal_profile(cls, rescaled: bool = False) -> Profile | None:
        """The ``Profile`` of the model's kernel when it depends on ``<x, y>`` alone (a zonal
        kernel: what ``mf.continuum`` solves and the phase diagrams use), for the model with
        ``rescaled`` (where it has one: ``Profile.rescalable``); None for the others (labels,
        gauges, biases). The base class: None.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.USA.zonal_profile(), mf.kernels.RoPE.zonal_profile()
            (ExpProfile(), None)
        """
        return None

    def interaction_rate(self) -> ArrayLike:
        r"""The rate of the interaction (an inverse time): the fixed step ``dt`` of an explicit
        solver should stay below ``1 / rate``. It drives the dt warnings of ``meanfield simulate``
        and of the sweep plan, and the sweep's ``time.step_rule = "reference"``
        ($\mathrm{dt} / \max(\text{rate}, 1)$). Elementwise in the parameters (NumPy or JAX values,
        traced included). The base class knows no rate: 0 (no warning); subclasses override.

        Example:
            >>> import meanfield as mf
            >>> round(float(mf.kernels.USA(1.0).interaction_rate()), 4)   # sqrt(beta) e^(beta - 1/2)
            1.6487
        """
        return 0.0

    def reference_step(self, base_dt: ArrayLike) -> ArrayLike:
        r"""The reference code's step rule $\text{base\_dt} / \max(\text{rate}, 1)$ with this model's
        ``interaction_rate()`` (the sweep's ``time.step_rule = "reference"``); elementwise, traceable.

        Example:
            >>> import meanfield as mf
            >>> round(float(mf.models.SelfAttention(4.0).reference_step(0.1)), 4)   # 0.1 / beta
            0.025
        """
        rate = self.interaction_rate()
        xp = _namespace(rate)
        return base_dt / xp.maximum(xp.asarray(rate), 1.0)

    def footprint(self, n: int, d: int, *, block_size: int | None = None) -> Footprint:
        """The working set and pair count of one field evaluation of ``n`` particles in dimension ``d``
        (``Footprint``): what the cost estimate of ``meanfield simulate`` and of a sweep's plan and
        chunks is built on. The base class assumes the pairwise reference (``(n, n, d)`` gradients
        through two vmaps); subclasses with structured evaluations override it with their rule.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.USA(1.0).footprint(8192, 3)       # tiles of 512 x 1024, 2.5 of them
            Footprint(entries=1310720.0, pairs=67108864.0)
        """
        return Footprint(entries=as_float(n) ** 2 * (as_float(d) + 2), pairs=as_float(n) ** 2)

    def overflows(self, dtype: Any) -> ArrayLike:
        """Whether the field overflows in ``dtype`` (elementwise in the parameters, e.g. over a sweep's
        betas: ``ModelEntry.over_grid``): the plan's warning before a run records such points as failed.
        The base class: never.

        Example:
            >>> import numpy as np, meanfield as mf
            >>> mf.kernels.MODELS["usa"].over_grid({}, 3, beta=np.array([10.0, 100.0])).overflows("float32").tolist()
            [False, True]
        """
        return False

    def stationary_order_parameter(
        self, d: int, *, noise: Any = None, frequencies: Any = None
    ) -> float | None:
        r"""The order parameter $|\frac1n \sum_i x_i|$ of the stationary state that the theory gives
        for this model in dimension ``d`` as $n \to \infty$, with the run's ``noise``
        (``mf.noise``) and natural ``frequencies`` law (``mf.frequencies``), or None where it gives
        none (the base class: none; ``mf.kernels.Kuramoto``: the noisy and the frequency laws).

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.USA(1.0).stationary_order_parameter(3, noise=mf.noise.Independent(0.5)) is None
            True
        """
        return None

    def max_energy(self) -> ArrayLike | None:
        """The largest energy the theory gives for this model, or None where it gives none.

        Example:
            >>> import meanfield as mf
            >>> round(float(mf.kernels.USA(1.0).max_energy()), 4), mf.models.SelfAttention(1.0).max_energy()
            (1.3591, None)
        """
        return None

    @abc.abstractmethod
    def field(
        self,
        x: Float[Array, "n d"],
        aux: ArrayLike | None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, "n d"]:
        """Unprojected mean field $F_i$, ``(n, d)``, of unit rows ``x`` with labels ``aux``."""

    def default_aux(self, n: int) -> Array:
        """Labels used when ``aux=None``: the positions $s_i = i / n$, shape ``(n,)``.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.USA(1.0).default_aux(2).tolist()
            [0.5, 1.0]
        """
        return positions(n)

    def check_config(self, x: ArrayLike, aux: ArrayLike | None) -> None:
        """Concrete-value checks that need the state (overflow, gauges); no-op by default.

        Raises ``ValueError``/``TypeError`` naming the bad value; returns ``None``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> mf.kernels.USA(1.0).check_config(jnp.eye(3), mf.positions(3)) is None
            True
        """

    def check_traced(self, x: Array, aux: ArrayLike | None) -> Array:
        """``x`` with in-program checks of the traced parameters attached (``equinox.error_if``).

        Under ``jit``/``vmap`` a bad traced value stops the program with an error naming it: every
        declared float parameter (``traced_params``) out of its kind's range (``beta <= 0``,
        ``lam < 0``, a non-finite ``omega``; one bad value in a vmapped batch suffices), a declared
        integer below its kind's minimum (a negative ``weight_seed``), the mask's parameters
        (``mf.masks.Mask.check_traced``: a negative or non-finite ALiBi ``slope``), prompt labels
        out of range (``Prompt``); concrete values were checked before (``__check_init__``,
        ``check_config``). Returns ``x``.

        Example:
            >>> import jax, jax.numpy as jnp, meanfield as mf
            >>> x = jnp.eye(3)
            >>> bool(jnp.all(mf.kernels.USA(1.0).check_traced(x, mf.positions(3)) == x))
            True
        """
        checks = list(self.traced_params())
        beta = getattr(self, "beta", None)
        if beta is not None and not any(name == "beta" for name, _, _ in checks):
            checks.append(("beta", "float>0", beta))  # a model whose beta is not declared
        for name, kind, value in checks:
            if kind == "float>0":
                x = traced_positive(x, name, value)
            elif kind == "float>=0":
                v = jnp.asarray(value)
                bad = ~jnp.all(jnp.isfinite(v) & (v >= 0))
                x = _error_if(x, bad, f"{name} must be >= 0 and finite; a traced {name} was not")
            else:
                x = traced_finite(x, name, value)
        for f in _declared_fields(type(self)):  # traced integers (a sweep over weight_seed)
            kind = f.metadata[_DECLARATION].kind
            value = getattr(self, f.name)
            if isinstance(kind, str) and kind.startswith("int") and not is_concrete(value):
                v = jnp.asarray(value)
                low = int(kind[-1])
                bad = ~jnp.all(v >= low)
                x = _error_if(
                    x,
                    bad,
                    f"{f.name} must be >= {low}; a traced {f.name} was {'negative' if low == 0 else 'not'}",
                )
        mask = getattr(self, "mask", None)
        if mask is not None:
            x = mask.check_traced(x)  # the mask's own traced parameters (ALiBi's slope)
        return x


def _normalization_param(name: str) -> Any:
    """The declaration of ``normalization`` (a ``mf.normalization.Scheme``; its flat parameters
    ``normalization``, ``alpha``, ``switch_time``), or of the flat ``alpha`` / ``switch_time`` a
    constructor still takes (``dataclasses.InitVar``: folded into the scheme by ``_fold_scheme``),
    shared by every model that takes them (``SelfAttention``, the exp kernels): one definition."""
    if name == "normalization":
        return param(
            _norm.Post(),
            kind=_norm.Scheme,
            static=False,
            optional=True,
            kw_only=True,
            doc="layer-norm placement (mf.normalization): post, pre, mix, peri, ngpt or scaling",
        )
    return eqx.field(default=None, kw_only=True)


def _fold_scheme(model: Any, **given: Any) -> None:
    """In a constructor: ``model.normalization`` as a scheme object (``mf.normalization.Scheme``)
    with the flat ``alpha`` / ``switch_time`` given (None: not given) folded in; one refusal for a
    parameter of another scheme (``Scheme.coerce``)."""
    model.normalization = _norm.Scheme.coerce(model.normalization, type(model).__name__, **given)


class _FoldScheme:
    """The ``__post_init__`` of a model whose dataclass ``__init__`` takes the flat ``alpha`` and
    ``switch_time`` (``dataclasses.InitVar``): folds them into the scheme (``_fold_scheme``). A
    subclass with an ``__init__`` of its own (``own_init = True``; it calls ``_fold_scheme``
    itself) does not see it, so equinox does not warn that it would not run."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None and getattr(owner, "own_init", False):
            raise AttributeError("__post_init__")
        if obj is None:
            return _post_init_fold
        return _post_init_fold.__get__(obj, owner)


def _post_init_fold(self: Any, alpha: Any, switch_time: Any) -> None:
    _fold_scheme(self, alpha=alpha, switch_time=switch_time)


def _scheme_attribute(name: str, field: str, family: Any) -> property:
    """``model.alpha``, ``model.sinkhorn_iters``, ...: the variant's own (``model.<field>.<name>``);
    None for a variant that has none (not a default that the model does not use: ``None`` is
    also what the constructor reads as "not given", so ``dataclasses.replace`` round-trips)."""

    def get(self: Any) -> Any:
        return getattr(getattr(self, field), name, None)

    return property(
        get, doc=f"The ``{name}`` of ``{field}`` (``{field}.{name}``), None where it has none."
    )


def _with_scheme_attributes(cls: Any) -> Any:
    """Class decorator: the flat parameters of the model's variants (``alpha``, ``switch_time`` of
    its scheme; ``sinkhorn_iters``, ``tie_tol`` of its attention kind) read from the variant
    (``_scheme_attribute``) on a model whose constructor takes them flat (``dataclasses.InitVar``)."""
    for f in _declared_fields(cls):
        kind = f.metadata[_DECLARATION].kind
        if isinstance(kind, type) and issubclass(kind, Variant) and kind.family() is not None:
            for name in kind.member_params():
                setattr(cls, name, _scheme_attribute(name, f.name, kind))
    return cls


def _check_normalization(model: Any) -> None:
    """``ValueError`` for a declared field set away from its default while the switch it acts with
    (its declaration's ``applies``, among the model's own fields) is elsewhere: ``rescaled`` of
    normalised attention, ``weight_seed`` and ``regen_period`` without drawn weights (a variant's
    parameters, ``alpha`` without ``normalization="ngpt"``, ..., are refused by the variant:
    ``meanfield._declare.Variant.coerce``). A value that would change nothing is refused by the
    constructor, so ``make``, the command line and a sweep refuse it alike; traced values are not
    inspected."""
    fields = {f.name: f for f in _declared_fields(type(model))}
    current = {name: getattr(model, name) for name in fields}
    for name, rules in applies_rules(declared_params(type(model))).items():
        if name not in fields:
            continue
        value, default = current[name], fields[name].default
        problem = applies_problem(name, value, rules, current, owner=type(model).__name__)
        if problem is None or not is_concrete(value) or not np.any(np.asarray(value) != default):
            continue
        raise ValueError(problem)


#: What the random weights' ``weight_seed`` and ``regen_period`` act with: drawn weights.
_DRAWN = (("weights", ENSEMBLES[1:]), ("value", VALUES[1:]))


@_with_scheme_attributes
class SelfAttention(Model):
    r"""Self-attention particle dynamics on the sphere: heads, weights, masks, normalisations, and tokens in R^d.

    With $H$ heads (``Q``, ``K``, ``V`` stacks of shape ``(H, d, d)``; one ``(d, d)`` matrix is one
    head) and logits $L^h_{ij} = \beta \langle Q_h x_i, K_h x_j\rangle$:

    $$\frac{d x_i}{dt} = P_{x_i} F_i, \qquad F_i = \frac1H \sum_h \sum_j A^h_{ij}\, V_h x_j,$$

    where $A^h$ is, by ``attention`` (and ``normalized``):

    * ``"softmax"``, ``normalized=True`` (the SA model): $A^h_{ij} = \operatorname{softmax}_j(L^h_{ij} + \log w_{ij})$;
    * ``"softmax"``, ``normalized=False``: $A^h_{ij} = m_{ij} e^{L^h_{ij}}$ with $m_{ij} = 1/n$ (or
      the mask's ``pair_weights``); with $Q = K = V = I$ this is the USA flow; ``rescaled=True``
      multiplies it by $e^{-\beta}$ (a change of time);
    * ``"sinkhorn"``: ``sinkhorn_iters`` half-steps of row and column scaling of $e^{L^h + \log w}$ in
      the log domain, rows first (Sinkformers' ``n_it``: 1 is the softmax), towards the doubly
      stochastic matrix of Sinkhorn's theorem. At a finite count it is not doubly stochastic: odd
      counts end on rows, which sum to one to rounding, while the columns sum to one only
      approximately; with the default 21 they are off by up to a few $10^{-2}$ for sharp logits
      (measured: $1.2 \cdot 10^{-2}$ at $\beta = 9$, $n = 32$ uniform tokens on $S^2$; up to
      $4 \cdot 10^{-2}$ in the audit of issue 47) and converge as ``sinkhorn_iters`` grows, more
      slowly the larger $\beta$ (``mf.models.attention_matrix`` shows them);
    * ``"hardmax"``: the $\beta \to \infty$ limit, $A^h_{ij} = 1/|C_i|$ on the maximisers
      $C_i = \{j : s_{ij} \ge \max_k s_{ik} - \text{tie\_tol}\}$ of the scores
      $s_{ij} = \langle Q_h x_i, K_h x_j\rangle$: ``tie_tol`` is an absolute tolerance on the scores
      (not on the logits $\beta s$), so with the default $10^{-6}$ two scores $5 \cdot 10^{-7}$
      apart are averaged (unit tokens: scores in $[-1, 1]$, where $10^{-6}$ is about 8 float32 ulps
      of 1); ``tie_tol = 0`` averages exact ties only; $\beta$ plays no role.

    $w$ is the positional mask (``mask=``, ``mf.masks``): its log is added to the logits
    ($-\infty$ above the diagonal for ``Causal``); a token that admits nothing has zero field.

    Weights: explicit ``Q``, ``K``, ``V`` (``None``: identity), or drawn from the ensembles of
    ``random_weights`` (``weights`` for $Q, K$, ``value`` for $V$, ``heads``) with the key
    ``jax.random.key(weight_seed)`` (traced: a sweep over seeds compiles once), redrawn every
    ``regen_period`` units of time inside ``mf.simulate`` when ``regen_period > 0`` (rotf's and
    simuformer's ``randomKQ``). With one head and identity weights the original fast path runs.

    ``normalization`` places the layer norm (Karagodin, Ge, Polyanskiy, Rigollet, "Normalization in
    attention dynamics", arXiv 2510.22026, which writes each scheme as a speed regulation of the
    same interaction):

    * ``"post"`` (Post-LN, default): $\dot x_i = P_{x_i} F_i$ as above;
    * ``"ngpt"`` (nGPT, Loshchilov et al. 2024: $x \leftarrow \operatorname{Norm}(x + \alpha
      (\operatorname{Norm}(F) - x))$ per layer): $\dot x_i = \alpha\, P_{x_i} F_i / \|F_i\|$
      (unit speed before the projection; a token with $F_i = 0$ stays). The unprojected field is
      $\alpha F_i / \|F_i\|$, so ``step="renormalize"`` with step ``h`` is simuformer's nGPT
      update $x \leftarrow \operatorname{normalize}(x + h \alpha F / \|F\|)$ (``--norm ngpt``,
      ``alpha = 0.2``; simuformer adds ``1e-9`` to $\|F\|$).
    * ``"pre"``, ``"mix"``, ``"peri"``, ``"scaling"``: Pre-LN ($\dot x_i = F_i$: a radius,
      $\dot\theta_i = P_{\theta_i} F_i / r_i$), Mix-LN (Post-LN up to ``switch_time``, Pre-LN
      after), Peri-LN (the field $F_i / \|F_i\|$, $\dot x_i$ = field), LN-scaling (speed
      $1 / \sqrt{t + 1}$): the table of ``mf.normalization`` (``simulate(r0=)``, ``Trajectory.radius``).

    ``geometry="euclidean"`` (Geshkovski, Letrouit, Polyanskiy, Rigollet 2023): the tokens live in
    $\mathbb R^d$, $\dot x_i = F_i(x)$ without projection (``normalization`` must be ``"post"``);
    ``rescaled_states`` gives $z_i = e^{-tV} x_i$.

    The dynamics is not the gradient flow of a pair energy in general: ``mf.energy`` raises
    ``TypeError`` (``has_energy`` is False).

    Args:
        beta: inverse temperature (traced).
        Q, K, V: ``(d, d)`` or ``(H, d, d)`` query, key and value weights (``None``: identity).
        normalized: softmax rows (``True``, SA) or the unnormalised ``1/n`` average (static).
        rescaled: multiply the unnormalised field by $e^{-\beta}$ (static).
        attention: ``"softmax"``, ``"sinkhorn"`` or ``"hardmax"`` (static).
        sinkhorn_iters: Sinkhorn half-steps, ``>= 1`` (static; default 21: rows exact, columns
            approximate, see ``"sinkhorn"`` above).
        tie_tol: hardmax's absolute tie tolerance on the scores, ``>= 0`` (static; default 1e-6).
        heads, weights, value, weight_seed, regen_period: the random weights (``random_weights``).
        mask: a positional mask (``mf.masks``) or None.
        normalization: one of ``NORMALIZATIONS`` (static; ``mf.normalization``; default ``"post"``).
        alpha: nGPT's step factor, ``> 0`` (traced; ``normalization="ngpt"`` only).
        switch_time: Mix-LN's switch time, ``> 0`` (traced; ``normalization="mix"`` only).
        geometry: ``"sphere"`` (default) or ``"euclidean"`` (static; ``GEOMETRIES``).

    Example:
        >>> import jax, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 8, 3)
        >>> mf.velocity(mf.models.SelfAttention(1.0), x).shape
        (8, 3)
        >>> Q, K, V = mf.models.random_weights(jax.random.key(1), 3, heads=4)
        >>> mf.models.attention_matrix(mf.models.SelfAttention(1.0, Q, K, V, mask=mf.masks.Causal()), x).shape
        (4, 8, 8)
    """

    name = "sa"
    summary = "self-attention, softmax-normalised (no pair energy)"
    takes_mask = True

    beta: RealScalarLike = param(1.0, kind="float>0", doc=BETA_DOC)
    Q: ArrayLike | None = None
    K: ArrayLike | None = None
    V: ArrayLike | None = None
    normalized: bool = param(
        True, kind="bool", static=True, doc="softmax rows (SA) or the 1/n average"
    )
    rescaled: bool = param(
        False,
        kind="bool",
        static=True,
        doc=RESCALED_DOC,
        applies=(("normalized", (False,)),),  # a softmax row is invariant under e^(-beta)
    )
    attention: _AttentionArg = param(
        Softmax(),
        kind=AttentionKind,
        optional=True,
        kw_only=True,
        doc="normalisation of the logits: softmax, sinkhorn (rows, then columns: sinkhorn_iters) or hardmax",
    )
    # the flat parameters of the attention kinds, folded into ``attention`` (``__post_init__``)
    sinkhorn_iters: dataclasses.InitVar[int | None] = eqx.field(default=None, kw_only=True)
    tie_tol: dataclasses.InitVar[float | None] = eqx.field(default=None, kw_only=True)
    heads: int = param(
        1, kind="int>=1", static=True, optional=True, kw_only=True, doc="attention heads"
    )
    weights: str = param(
        "identity",
        kind="choice",
        choices=ENSEMBLES,
        static=True,
        optional=True,
        kw_only=True,
        doc="ensemble of Q, K (mf.models.random_weights)",
    )
    value: str = param(
        "identity",
        kind="choice",
        choices=VALUES,
        static=True,
        optional=True,
        kw_only=True,
        doc="ensemble of V (mf.models.random_weights)",
    )
    weight_seed: Any = param(
        0,
        kind="int>=0",
        maximum=INT32_MAX,
        optional=True,
        kw_only=True,
        doc="seed of the random weights (traced)",
        applies=_DRAWN,
    )
    regen_period: float = param(
        0.0,
        kind="float>=0",
        static=True,
        optional=True,
        kw_only=True,
        doc="redraw the random weights every this much time (0: never)",
        applies=_DRAWN,
    )
    normalization: _SchemeArg = _normalization_param("normalization")
    alpha: dataclasses.InitVar[RealScalarLike | None] = _normalization_param("alpha")
    switch_time: dataclasses.InitVar[RealScalarLike | None] = _normalization_param("switch_time")
    geometry: _GeometryArg = param(
        Sphere(),
        kind=Geometry,
        optional=True,
        kw_only=True,
        doc="tokens on the sphere (projected flow) or in R^d (euclidean: no projection, no layer norm)",
    )
    epoch: Any = eqx.field(default=0, kw_only=True)  # the weights' draw (``at_time``)
    mask: Mask | None = eqx.field(default=None, kw_only=True)

    @classmethod
    def zonal_profile(cls, rescaled: bool = False) -> Profile | None:
        """The normalised exp profile ``ExpProfile(normalized=True)`` (the class's default,
        ``normalized=True``; ``Q = K = V = I``): invariant under a rescaling of the kernel, so
        ``rescaled`` changes nothing (``Profile.rescalable`` is False for it).

        Example:
            >>> import meanfield as mf
            >>> mf.models.SelfAttention.zonal_profile().normalized
            True
        """
        return ExpProfile(normalized=True)

    # -- the weights -------------------------------------------------------------------------
    @property
    def explicit(self) -> bool:
        """Whether ``Q``, ``K`` or ``V`` was given (else the ensembles ``weights``/``value``)."""
        return any(M is not None for M in (self.Q, self.K, self.V))

    @property
    def random(self) -> bool:
        """Whether the weights are drawn (``weights``/``value`` other than identity)."""
        return not self.explicit and (self.weights != "identity" or self.value != "identity")

    def num_heads(self) -> int:
        """The number of heads: the leading size of the weight stacks, or ``heads``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> mf.models.SelfAttention(1.0, V=jnp.stack([jnp.eye(3)] * 2)).num_heads()
            2
        """
        sizes = [
            jnp.shape(M)[0] for M in (self.Q, self.K, self.V) if M is not None and jnp.ndim(M) == 3
        ]
        return max(sizes) if sizes else (1 if self.explicit else self.heads)

    def weight_stacks(self, d: int, dtype: Any = None) -> tuple[Any, Any, Any]:
        """``(Q, K, V)`` as they act: the explicit matrices, or the draw of ``random_weights``
        (``(heads, d, d)``; one head as ``(d, d)``), ``None`` for an identity.

        Example:
            >>> import meanfield as mf
            >>> [None if M is None else M.shape for M in mf.models.SelfAttention(1.0, weights="gaussian").weight_stacks(3)]
            [(3, 3), (3, 3), None]
        """
        if not self.random:
            return self.Q, self.K, self.V
        self.check_weight_memory(d, dtype)
        key = jax.random.key(jnp.asarray(self.weight_seed).astype(jnp.uint32))
        if self.regen_period > 0:
            key = jax.random.fold_in(key, jnp.asarray(self.epoch).astype(jnp.uint32))
        Q, K, V = random_weights(
            key, d, heads=self.heads, ensemble=self.weights, value=self.value, dtype=dtype
        )
        qkv = (
            None if self.weights == "identity" else Q,
            None if self.weights == "identity" else K,
            None if self.value == "identity" else V,
        )
        return tuple(M if M is None or self.heads > 1 else M[0] for M in qkv)  # type: ignore[return-value]

    #: Weight-sized ``(heads, d, d)`` arrays a draw of ``random_weights`` holds at once (``Q``,
    #: ``K``, ``V``, and one normal draw or product in flight).
    weight_arrays: ClassVar[int] = 4

    def weight_bytes(self, d: int, dtype: Any = None) -> int:
        """Bytes of the drawn weights in dimension ``d`` (``weight_arrays`` stacks of ``heads x d x
        d`` entries of ``dtype``); 0 when no weights are drawn (identity or explicit ``Q, K, V``).

        Example:
            >>> import meanfield as mf
            >>> mf.models.SelfAttention(1.0, weights="gaussian", heads=2).weight_bytes(3, "float32")
            288
        """
        if not self.random:
            return 0
        itemsize = np.dtype(dtype or jnp.result_type(float)).itemsize
        return self.weight_arrays * int(self.heads) * int(d) * int(d) * itemsize

    def check_weight_memory(self, d: int, dtype: Any = None) -> None:
        """Refuse drawn weights that do not fit in this machine's memory
        (``meanfield._machine.machine_memory``): a ``ResourceLimitError`` (a ``ValueError``, one
        line) naming the estimate, before anything is allocated (``weight_stacks``, ``check_config``).

        Example:
            >>> import meanfield as mf
            >>> try:
            ...     mf.models.SelfAttention(1.0, weights="gaussian", heads=10**12).check_weight_memory(3)
            ... except ValueError as e:
            ...     print(str(e)[:50])
            heads = 1000000000000 random weights of 3 x 3 need
        """
        from ._machine import ResourceLimitError, format_bytes, machine_memory

        need = self.weight_bytes(d, dtype)
        if need == 0:
            return
        avail = machine_memory()
        if need > avail:
            raise ResourceLimitError(
                f"heads = {self.heads} random weights of {d} x {d} need ~{format_bytes(need)} "
                f"({self.weight_arrays} stacks of heads x d x d), more than the {format_bytes(avail)} "
                f"available; use fewer heads"
            )

    def at_time(self, t: ArrayLike) -> SelfAttention:
        """With ``regen_period > 0`` and drawn weights: the model whose weights are the draw of epoch
        ``floor(t / regen_period)`` (``jax.random.fold_in`` of the seed's key); else ``self``.

        Example:
            >>> import meanfield as mf
            >>> m = mf.models.SelfAttention(1.0, weights="gaussian", regen_period=5.0)
            >>> int(m.at_time(12.0).epoch)
            2
        """
        if self.regen_period <= 0 or not self.random:
            return self
        epoch = jnp.floor(jnp.asarray(t) / self.regen_period).astype(jnp.int32)
        return eqx.tree_at(lambda m: m.epoch, self, epoch)

    # -- facts -----------------------------------------------------------------------------
    def interaction_rate(self) -> ArrayLike:
        r"""$\beta$ (normalised: softmax weights sum to one; 1 for hardmax, which has no $\beta$);
        unnormalised, the exp kernels' rate $\sqrt\beta\, e^{\beta - 1/2}$ ($\sqrt\beta\, e^{-1/2}$ rescaled).

        Example:
            >>> import meanfield as mf
            >>> float(mf.models.SelfAttention(3.0).interaction_rate())
            3.0
        """
        xp = _namespace(self.beta)
        if self.attention.beta_free:
            rate = xp.ones_like(xp.asarray(self.beta, dtype=None if xp is jnp else np.float64))
        elif self.normalized:
            rate = xp.asarray(self.beta)
        else:
            rate = exp_interaction_rate(self.beta, self.rescaled)
        return self.normalization.scale_rate(rate)  # nGPT: the output at unit norm, times alpha

    def overflows(self, dtype: Any) -> ArrayLike:
        """Unnormalised and not rescaled: ``beta >= log(finfo(dtype).max)`` (with ``Q = K = None``)."""
        if self.normalized or self.rescaled:
            return False
        return np.asarray(self.beta) >= np.log(np.finfo(dtype).max)

    def footprint(self, n: int, d: int, *, block_size: int | None = None) -> Footprint:
        """The ``(n, n)`` logits and weights as XLA:CPU holds them (``compiled.memory_analysis()``,
        tests/test_cost_model.py): about two arrays up to ``n = 1024``, one while ``n^2 < 2^24``;
        beyond, XLA's own buffers are ``O(n)`` (the small-``d`` products are fused into loops) but
        the CPU runtime allocates the ``(n, n)`` product of the logits outside them (measured: the
        resident memory grows by ``4 n^2`` bytes in float32 at ``n = 8192`` and ``20000``), so one
        array and a quarter; with a margin above, whatever ``block_size``. Several heads, a mask or another normalisation than softmax: ``H + 2``
        arrays (one more for Sinkhorn's iterates), an upper bound of the forward pass, which
        evaluates one head at a time (``jax.lax.map``), and what reverse mode keeps of the heads."""
        nf = as_float(n)
        if self.num_heads() > 1 or self.mask is not None or not self.attention.softmax:
            extra = self.attention.extra_arrays
            return Footprint(
                entries=(self.num_heads() + 2.0 + extra) * nf**2, pairs=self.num_heads() * nf**2
            )
        if nf <= 1024:
            entries = 2.5 * nf**2
        elif nf**2 < 2.0**24:
            entries = 1.5 * nf**2
        else:
            entries = 1.25 * nf**2
        return Footprint(entries=entries, pairs=nf**2)

    def reference_step(self, base_dt: ArrayLike) -> ArrayLike:
        """``Model.reference_step``; unnormalised, the exp kernels' overflow-free form (``exp_reference_step``)."""
        if self.normalized:
            return super().reference_step(base_dt)
        return exp_reference_step(self.beta, base_dt, self.rescaled)

    def __post_init__(  # type: ignore[override]
        self, sinkhorn_iters: Any, tie_tol: Any, alpha: Any, switch_time: Any
    ) -> None:
        self.attention = AttentionKind.coerce(
            self.attention, type(self).__name__, sinkhorn_iters=sinkhorn_iters, tie_tol=tie_tol
        )
        _fold_scheme(self, alpha=alpha, switch_time=switch_time)
        self.geometry = Geometry.coerce(self.geometry, type(self).__name__)

    def __check_init__(self) -> None:
        super().__check_init__()
        check_mask(self.mask)
        sizes = set()
        for name in ("Q", "K", "V"):
            M = getattr(self, name)
            if M is None:
                continue
            shape = (
                tuple(jnp.shape(M)) if not is_concrete(M) else np.shape(_as_float_array(name, M))
            )
            if len(shape) not in (2, 3) or shape[-1] != shape[-2]:
                raise ValueError(
                    f"{name} must be a square (d, d) matrix or an (H, d, d) stack of heads, got shape {shape}"
                )
            if len(shape) == 3:
                if shape[0] < 1:
                    raise ValueError(
                        f"{name} is a stack of {shape[0]} heads (shape {shape}); a stack needs "
                        f"H >= 1 heads, (H, d, d)"
                    )
                sizes.add(shape[0])
            if is_concrete(M) and not np.all(np.isfinite(_as_float_array(name, M))):
                raise ValueError(f"{name} contains NaN or inf; every entry must be finite")
        if len(sizes) > 1:
            raise ValueError(
                f"the weight stacks have different numbers of heads {sorted(sizes)}; give Q, K and V "
                f"the same leading size H (or a (d, d) matrix, shared by every head)"
            )
        if self.explicit:
            if self.weights != "identity" or self.value != "identity":
                raise ValueError(
                    f"give either Q, K, V or the ensembles weights={self.weights!r}, value={self.value!r}, not both"
                )
            if self.heads != 1 and sizes and self.heads not in sizes:
                raise ValueError(
                    f"heads = {self.heads} does not match the weight stacks of {sizes.pop()} heads"
                )
            if self.heads != 1 and not sizes:
                raise ValueError(
                    f"heads = {self.heads} needs (H, d, d) weight stacks; got (d, d) matrices (one head)"
                )
        _check_normalization(self)
        self.geometry.check_scheme(self.normalization)
        if not self.normalized and not self.attention.softmax:
            raise ValueError(
                f"attention={self.attention.name!r} is a normalisation of its own: use normalized=True "
                f"(normalized=False is the unnormalised softmax kernel)"
            )
        if self.normalized and self.mask is not None and self.mask.normalized:
            raise ValueError(
                f"a row-normalised mask (mask_normalized=True) changes nothing in normalised attention "
                f"({self.attention.name} rows take log w_ij, not w_ij / n); it applies with normalized=False"
            )

    # -- evaluation ------------------------------------------------------------------------
    def _project(self, M: Any, x: Array) -> Array:
        if M is None:
            return x
        M = jnp.asarray(M, x.dtype)
        return matmul(x, M.T) if M.ndim == 2 else einsum("hij,nj->hni", M, x)

    def _projections(self, x: Array) -> tuple[Array, Array, Array, bool]:
        r"""``(qx, kx, vx, multi)``: $Q_h x_j$, $K_h x_j$, $V_h x_j$ (``(n, d)``, or ``(H, n, d)``
        for several heads: all three then have the head axis), and whether there is one."""
        Q, K, V = self.weight_stacks(x.shape[-1], x.dtype)
        qx, kx, vx = self._project(Q, x), self._project(K, x), self._project(V, x)
        multi = max(qx.ndim, kx.ndim, vx.ndim) == 3
        if multi:
            H = max(a.shape[0] for a in (qx, kx, vx) if a.ndim == 3)
            qx, kx, vx = (jnp.broadcast_to(a, (H, *x.shape)) for a in (qx, kx, vx))
        return qx, kx, vx, multi

    def _weights(self, scores: Array) -> Array:
        """The attention weights $A$ (``attention``, ``normalized``, mask) of the scores."""
        n, dtype = scores.shape[-1], scores.dtype
        beta = jnp.asarray(self.beta, dtype)
        mask = self.mask
        if self.normalized or not self.attention.softmax:
            return self.attention.weights(scores, beta, mask)
        logits = beta * scores
        shift = beta if self.rescaled else 0.0
        W = jnp.full((n, n), 1.0 / n, dtype) if mask is None else mask.pair_weights(n, dtype)
        return W * jnp.exp(logits - shift)

    def attention_weights(self, x: Float[Array, "n d"]) -> Float[Array, "..."]:
        r"""The attention weights $A$ of unit rows ``x``: ``(n, n)``, or ``(H, n, n)`` for several
        heads (``mf.models.attention_matrix`` validates ``x`` first).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> mf.models.SelfAttention(1.0).attention_weights(jnp.array([[1.0, 0.0], [1.0, 0.0]])).tolist()
            [[0.5, 0.5], [0.5, 0.5]]
        """
        qx, kx, _, _ = self._projections(jnp.asarray(x))
        return self._weights(matmul(qx, jnp.swapaxes(kx, -1, -2)))

    def rescaled_states(self, x: Float[Array, "n d"], t: ArrayLike) -> Float[Array, "n d"]:
        r"""$z_i = e^{-t V} x_i$: tokens in $\mathbb R^d$ (``geometry="euclidean"``) with the value
        matrix's growth removed (Geshkovski et al. 2023, Sec. 3: for $V = I$ the $z_i$ converge to
        points of the boundary of a polytope, e.g. the vertices of the hull of the start). One head
        only (``ValueError`` otherwise); ``V = None`` is the identity ($z = e^{-t} x$). As an
        observable of ``mf.simulate``: ``lambda x, t: model.rescaled_states(x, t)``.

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> m = mf.models.SelfAttention(1.0, geometry="euclidean")
            >>> m.rescaled_states(jnp.array([[2.0, 0.0], [0.0, 2.0]]), jnp.log(2.0)).tolist()
            [[1.0, 0.0], [0.0, 1.0]]
        """
        x = jnp.asarray(x)
        if self.num_heads() > 1:
            raise ValueError(
                f"rescaled_states needs one value matrix; this model has {self.num_heads()} heads"
            )
        V = self.weight_stacks(x.shape[-1], x.dtype)[2]
        t = jnp.asarray(t, x.dtype)
        if V is None:
            return jnp.exp(-t) * x
        E = jax.scipy.linalg.expm(-t * jnp.asarray(V, x.dtype))
        return matmul(x, E.T)

    def field(
        self,
        x: Float[Array | np.ndarray, "n d"],
        aux: ArrayLike | None = None,
        *,
        block_size: int | None = None,
    ) -> Float[Array, "n d"]:
        r"""Unprojected field $F_i = \frac1H \sum_h \sum_j A^h_{ij} V_h x_j$, ``(n, d)``
        ($\alpha F_i / \|F_i\|$ for ``normalization="ngpt"``).

        Example:
            >>> import jax.numpy as jnp, meanfield as mf
            >>> x = jnp.array([[1.0, 0.0], [1.0, 0.0]])
            >>> mf.models.SelfAttention(1.0).field(x).tolist()   # softmax average of equal tokens
            [[1.0, 0.0], [1.0, 0.0]]
        """
        x = jnp.asarray(x)
        qx, kx, vx, multi = self._projections(x)
        if (
            multi
        ):  # one head at a time: (n, n) weights, not (H, n, n) (lax.map: a loop in the program)
            out = jnp.mean(jax.lax.map(lambda a: self._head_field(*a), (qx, kx, vx)), axis=0)
        else:
            out = self._head_field(qx, kx, vx)
        return self.normalization.output(out)

    def _head_field(self, qx: Array, kx: Array, vx: Array) -> Array:
        r"""One head's $\sum_j A_{ij} v_j$ from its projections ``(n, d)``."""
        scores = matmul(qx, kx.T)
        if self.attention.softmax and not self.normalized:
            n = qx.shape[0]
            beta = jnp.asarray(self.beta, qx.dtype)
            logits = beta * scores
            shift = beta if self.rescaled else 0.0
            if self.mask is None:
                # factor the row maximum out of the exponentials (no overflow in the sum of n terms)
                m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
                return (matmul(jnp.exp(logits - m), vx) / n) * jnp.exp(m - shift)
            admitted = jnp.asarray(self.mask.admitted(n))
            m = jnp.max(jnp.where(admitted, logits, -jnp.inf), axis=-1, keepdims=True)
            m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
            W = self.mask.pair_weights(n, qx.dtype)
            return matmul(W * jnp.exp(logits - m), vx) * jnp.exp(m - shift)
        return matmul(self._weights(scores), vx)

    def energy(
        self, x: ArrayLike, aux: ArrayLike | None = None, *, block_size: int | None = None
    ) -> NoReturn:
        raise TypeError(
            "SelfAttention has no pair energy (the normalised/Q,K,V dynamics is not a gradient "
            "flow of E = 1/(2n^2) sum h); use a kernel from mf.kernels (e.g. USA) for energies"
        )

    def check_config(self, x: ArrayLike, aux: ArrayLike | None) -> None:
        d = np.shape(x)[-1]
        self.check_weight_memory(d, jnp.asarray(x).dtype)
        for name in ("Q", "K", "V"):
            M = getattr(self, name)
            if M is not None and tuple(jnp.shape(M))[-2:] != (d, d):
                raise ValueError(
                    f"{name} is {jnp.shape(M)[-2]}x{jnp.shape(M)[-1]} but the states have d = {d}; pass ({d}, {d}) matrices"
                )
        if self.normalized or self.rescaled or not is_concrete(self.beta):
            return
        dtype = jnp.asarray(x).dtype
        limit = float(np.log(np.finfo(dtype).max))
        # |<Q x, K y>| <= ||Q||_2 ||K||_2 on unit vectors: the largest exponent of the field
        qk = 1.0
        for M in (self.Q, self.K):
            if M is not None and is_concrete(M):
                arr = np.asarray(M, dtype=np.float64)
                norms = np.linalg.norm(arr.reshape(-1, d, d), 2, axis=(1, 2))
                qk *= float(np.max(norms))
        exponent = float(np.max(np.asarray(self.beta))) * qk
        if exponent >= limit:
            raise ValueError(
                f"beta ||Q|| ||K|| = {exponent:g} overflows the unnormalised field in "
                f"{np.dtype(dtype).name} (limit about {limit:.1f}); use rescaled=True "
                f"(field times e^(-beta), time t = e^(-beta) s)"
            )


def resolve_aux(model: Any, x: Any, aux: Any) -> Real[Array, " n"]:
    """Validate the shape of ``x`` (``(n, d)``, ``n >= 2``, ``d >= 2``) and return the labels.

    ``aux=None`` gives ``model.default_aux(n)`` (positions $i/n$; prompt blocks
    for ``Prompt``). A given ``aux`` must be a real ``(n,)`` array; concrete labels must be
    finite (``ValueError``), traced ones are checked in the program (``equinox.error_if``,
    attached by ``check_states``).

    Args:
        model: a ``mf.models.Model`` (a kernel or ``SelfAttention``).
        x: ``(n, d)`` states.
        aux: ``(n,)`` labels or ``None``.

    Returns:
        ``(n,)`` labels.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> from meanfield.energy import resolve_aux
        >>> resolve_aux(mf.kernels.USA(1.0), jnp.zeros((4, 3)), None).tolist()
        [0.25, 0.5, 0.75, 1.0]
    """
    _check_model(model)
    shape = np.shape(x) if is_concrete(x) else jnp.shape(x)
    if len(shape) != 2:
        raise ValueError(f"x must have shape (n, d), got shape {shape}")
    n, d = shape
    check_int("n", n, minimum=2)
    check_int("d", d, minimum=2)
    if aux is None:
        return model.default_aux(n)
    _check_real_array("aux", aux)
    if np.ndim(aux) != 1 or np.shape(aux)[0] != n:
        raise ValueError(
            f"aux must be a 1-d array of length n = {n} (one label per particle), got shape {np.shape(aux)}"
        )
    if is_concrete(aux) and not np.all(np.isfinite(np.asarray(aux, dtype=np.float64))):
        raise ValueError("aux contains NaN or inf; every label must be finite")
    return jnp.asarray(aux)


def _check_model(model: object) -> None:
    if isinstance(model, type) and issubclass(model, Model):
        raise TypeError(
            f"got the class {model.__name__}; pass an instance, e.g. {model.__name__}(1.0)"
        )
    if not isinstance(model, Model):
        raise TypeError(
            f"expected a kernel from mf.kernels or a model from mf.models (an mf.models.Model), "
            f"got {type(model).__name__}"
        )


def _check_real_array(name: str, value: object) -> None:
    """``TypeError`` unless ``value`` is an array (or nested list) of real numbers."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be an array of real numbers, got {value!r}")
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(value).dtype
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be an array of real numbers, got {value!r}") from None
    if np.dtype(dtype).kind not in "iuf":
        raise TypeError(f"{name} must be an array of real numbers, got dtype {dtype}")


def _check_euclidean_states(x: Any, name: str) -> None:
    """A concrete ``(n, d)`` array of finite tokens, ``n >= 2``, ``d >= 2`` (any norms: ``geometry="euclidean"``)."""
    if not is_concrete(x):
        return
    a = np.asarray(x)
    if a.ndim != 2 or a.shape[0] < 2 or a.shape[1] < 2:
        raise ValueError(f"{name} must have shape (n, d) with n >= 2 and d >= 2, got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf; every token must be finite")


def check_states(model: Any, x: Any, aux: Any = None, name: str = "x") -> tuple[Array, Array]:
    """``(x, aux)`` validated as every entry point needs them (``field``, ``velocity``,
    ``energy``, ``mf.simulate``): one clear error before any compilation.

    * ``x``: a floating ``(n, d)`` array (float16/bfloat16, float32, float64; a nested list
      of numbers becomes JAX's default float dtype), ``n >= 2``, ``d >= 2``, finite, unit rows
      within ``sphere_atol`` (1e-3 for float32/float64). Integer, bool or complex arrays are a
      ``TypeError``; the rest a ``ValueError`` naming the bad value.
    * ``aux``: ``None`` or a real ``(n,)`` array of finite labels.
    * the model: its concrete checks (``check_config``: overflow, gauges, prompt labels) and
      every concrete parameter representable in the dtype of ``x`` (``beta = 1e-300`` is 0 in
      float32: ``ValueError``).

    Traced states, labels and parameters are checked inside the program (``equinox.error_if``):
    a bad value stops a jitted or vmapped call with an error naming it.

    Args:
        model: a kernel (``mf.kernels``) or model (``mf.models``).
        x: ``(n, d)`` states.
        aux: ``(n,)`` labels or ``None`` (``model.default_aux(n)``).
        name: the name of ``x`` in messages.

    Returns:
        ``(x, aux)`` as JAX arrays, with the in-program checks attached to ``x``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> from meanfield.energy import check_states
        >>> x, aux = check_states(mf.kernels.USA(1.0), jnp.eye(3))
        >>> x.shape, aux.shape
        ((3, 3), (3,))
        >>> check_states(mf.kernels.USA(1.0), 2 * jnp.eye(3))
        Traceback (most recent call last):
            ...
        ValueError: rows of x must have unit norm within 0.001, got a row of norm 2; ...
    """
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be a floating-point (n, d) array, got {x!r}")
    dtype = getattr(x, "dtype", None)
    if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"{name} must be a floating-point array (float32 or float64; got dtype {dtype}); "
            f"convert with jnp.asarray({name}, jnp.float32)"
        )
    if dtype is None:
        _check_real_array(name, x)
    aux = resolve_aux(model, x, aux)
    euclidean = not geometry_of(model).on_sphere
    if euclidean:
        _check_euclidean_states(x, name)
    else:
        sphere.check_on_sphere(
            x, name, atol=sphere_atol(dtype if dtype is not None else jnp.result_type(float))
        )
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    check_fits_dtype(model, x.dtype)
    model.check_config(x, aux)
    x = traced_finite(x, name, x) if euclidean else traced_states(x, name)
    if not is_concrete(aux) and jnp.issubdtype(aux.dtype, jnp.floating):
        x = traced_finite(x, "aux", aux)
    x = model.check_traced(x, aux)
    return x, aux


def attention_matrix(model: Any, x: ArrayLike, aux: Any = None) -> Float[Array, "..."]:
    r"""The attention weights $A$ of an attention model at unit rows ``x``, masks and
    normalisations included: ``(n, n)``, or ``(H, n, n)`` for several heads.

    ``SelfAttention``: the weights its field averages with ($F_i = \frac1H \sum_h \sum_j A^h_{ij} V_h x_j$:
    softmax, Sinkhorn or hardmax rows, or $m_{ij} e^{L_{ij}}$ unnormalised). A pair kernel with an
    attention form (``mf.kernels.USA``): $m_{ij} e^{\beta \langle x_i, x_j\rangle}$ ($m_{ij} = 1/n$ or the
    mask's ``pair_weights``; times $e^{-\beta}$ when ``rescaled``). Other models: ``TypeError``.

    Args:
        model: ``mf.models.SelfAttention`` or ``mf.kernels.USA``.
        x: ``(n, d)`` unit rows (validated as ``mf.field`` does).
        aux: labels (unused by these models; validated).

    Example:
        >>> import jax, jax.numpy as jnp, meanfield as mf
        >>> x = mf.sphere.uniform(jax.random.key(0), 5, 3)
        >>> A = mf.models.attention_matrix(mf.models.SelfAttention(2.0, mask=mf.masks.Causal()), x)
        >>> bool(jnp.allclose(A.sum(-1), 1.0)), float(A[0, 1])
        (True, 0.0)
    """
    method = getattr(model, "attention_weights", None)
    if method is None:
        raise TypeError(
            f"attention_matrix needs an attention model (mf.models.SelfAttention or mf.kernels.USA), "
            f"got {type(model).__name__}"
        )
    xs, _ = check_states(model, x, aux)
    return method(xs)
