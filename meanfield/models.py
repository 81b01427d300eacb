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
from collections.abc import Iterable
from types import ModuleType
from typing import Any, ClassVar, NoReturn

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._checks import (
    RealScalarLike,
    _as_float_array,
    _error_if,
    check_scalar,
    is_concrete,
    traced_finite,
    traced_positive,
)
from ._params import PARAM_KINDS, Param, check_float, check_value
from ._resources import Footprint, as_float

__all__ = [
    "Model",
    "SelfAttention",
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

_DECLARATION = "meanfield.param"


@dataclasses.dataclass(frozen=True)
class _Declaration:
    kind: Any  # a PARAM_KINDS name, or an equinox.Module class whose parameters are this field's
    doc: str
    choices: tuple


def param(
    default: Any = dataclasses.MISSING,
    *,
    kind: Any,
    doc: str,
    static: bool = False,
    choices: Iterable[Any] = (),
    **field_kwargs: Any,
) -> Any:
    """Declare a model parameter as a field: its accepted range ``kind``, ``doc``, ``default`` and
    whether it is ``static`` (part of the compiled program) or traced (a PyTree leaf, a sweep axis).

    ``kind`` is one of ``meanfield._params.PARAM_KINDS`` (``"float>0"``, ``"float>=0"``, ``"float"``,
    ``"int>=1"``, ``"int>=0"``, ``"bool"``, ``"plane"``, ``"choice"`` with ``choices``), or an
    ``equinox.Module`` class whose own declared parameters become this model's (``PhaseField``'s
    ``phase`` is a ``FourierPhase``: its ``omega``, ``amplitude``, ``frequency``). Everything the
    registry, the command line, the sweep spec and the constructors' checks know about the
    parameter comes from here. ``field_kwargs`` go to ``equinox.field`` (``kw_only=True``, ...).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> class Cosine(mf.kernels.Kernel):     # h = cos(beta <x, y>): a new kernel is one class
        ...     name = "cosine-doc"
        ...     beta: float = mf.kernels.param(1.0, kind="float>0", doc="frequency")
        ...     def __call__(self, x, xi, y, zeta):
        ...         return jnp.cos(self.beta * jnp.dot(x, y))
        >>> [(p.name, p.kind, p.default, p.traced) for p in Cosine.params()]
        [('beta', 'float>0', 1.0, True)]
    """
    if not (kind in PARAM_KINDS or (isinstance(kind, type) and issubclass(kind, eqx.Module))):
        raise ValueError(
            f"kind must be one of {', '.join(PARAM_KINDS)} or an equinox.Module class, got {kind!r}"
        )
    if kind == "choice" and not choices:
        raise ValueError("a parameter of kind 'choice' needs its choices")
    if not isinstance(doc, str) or not doc:
        raise TypeError(f"doc must be a non-empty string, got {doc!r}")
    metadata = {_DECLARATION: _Declaration(kind, doc, tuple(choices))}
    return eqx.field(default=default, static=static, metadata=metadata, **field_kwargs)


def _declared_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``cls`` declared with ``param``, keyword-only ones last (definition order)."""
    found = [f for f in dataclasses.fields(cls) if _DECLARATION in f.metadata]
    return [f for f in found if not f.kw_only] + [f for f in found if f.kw_only]


def declared_params(cls: type) -> tuple[Param, ...]:
    """The parameters of a Module class declared with ``param`` (nested Module kinds flattened).

    Example:
        >>> import meanfield as mf
        >>> [p.name for p in mf.models.declared_params(mf.kernels.FourierPhase)]
        ['omega', 'amplitude', 'frequency']
    """
    out: list[Param] = []
    for f in _declared_fields(cls):
        decl = f.metadata[_DECLARATION]
        if isinstance(decl.kind, type):
            out.extend(declared_params(decl.kind))
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        out.append(
            Param(
                f.name,
                default,
                not f.metadata.get("static", False),
                decl.kind,
                decl.doc,
                decl.choices,
            )
        )
    return tuple(out)


def _build_declared(cls: type, P: dict[str, Any], **extra: Any) -> Any:
    """``cls`` from the values ``P`` of its declared parameters (nested Modules built likewise)."""
    kwargs = dict(extra)
    for f in _declared_fields(cls):
        decl = f.metadata[_DECLARATION]
        kwargs[f.name] = _build_declared(decl.kind, P) if isinstance(decl.kind, type) else P[f.name]
    return cls(**kwargs)


def _check_declared(module: eqx.Module) -> None:
    """Concrete values of the declared parameters of ``module`` checked against their kind
    (``meanfield._params``: one message everywhere); traced values are the program's to check."""
    for f in _declared_fields(type(module)):
        decl = f.metadata[_DECLARATION]
        if isinstance(decl.kind, type):
            continue  # a nested Module checks its own
        v = getattr(module, f.name)
        if decl.kind.startswith("float"):
            check_scalar(f.name, v)
            if is_concrete(v):
                value = v if isinstance(v, (int, float)) else float(np.asarray(v))
                check_float(f.name, value, decl.kind)
        elif decl.kind == "plane":
            check_value(f.name, "plane", tuple(v) if isinstance(v, (list, tuple)) else v)
        else:
            check_value(f.name, decl.kind, v, decl.choices)


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


class Declared(eqx.Module):
    """A Module whose parameters are declared with ``param`` and checked on construction (the
    base of ``Model`` and of the parametrised parts of models: ``mf.kernels.FourierPhase``,
    ``mf.kernels.WavyGauge``).

    Example:
        >>> import meanfield as mf
        >>> try:
        ...     mf.kernels.WavyGauge(0.6, 0)
        ... except ValueError as e:
        ...     print(e)
        k must be >= 1, got 0
    """

    #: The dimension a model with this part needs (``WavyGauge``: 3), or None.
    required_d: ClassVar[int | None] = None

    def __check_init__(self) -> None:
        _check_declared(self)

    def traced_params(self) -> tuple[tuple[str, str, Any], ...]:
        """``(name, kind, value)`` of the declared float parameters (``param``, nested parts'
        included) whose value is traced: what ``Model.check_traced`` checks in the program.

        Example:
            >>> import jax, meanfield as mf
            >>> def names(lam):
            ...     print([name for name, _, _ in mf.kernels.DistanceBias(1.0, lam).traced_params()])
            ...     return lam
            >>> _ = jax.jit(names)(2.0)
            ['lam']
        """
        out: list[tuple[str, str, Any]] = []
        for f in _declared_fields(type(self)):
            kind = f.metadata[_DECLARATION].kind
            value = getattr(self, f.name)
            if isinstance(value, Declared):
                out.extend(value.traced_params())
            elif isinstance(kind, str) and kind.startswith("float") and not is_concrete(value):
                out.append((f.name, kind, value))
        return tuple(out)


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

    @classmethod
    def params(cls) -> tuple[Param, ...]:
        """The model's parameters, from its field declarations (``param``): what the registry,
        the command line's flags, a sweep's ``[model]`` keys and ``from_params`` accept.

        Example:
            >>> import meanfield as mf
            >>> [p.name for p in mf.kernels.PhaseField.params()]
            ['beta', 'omega', 'amplitude', 'frequency', 'plane', 'rescaled']
        """
        return declared_params(cls)

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
        return _build_declared(cls, P)

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
        ``lam < 0``, a non-finite ``omega``; one bad value in a vmapped batch suffices), prompt
        labels out of range (``Prompt``); concrete values were checked before (``__check_init__``,
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

    name = "sa"
    summary = "self-attention, softmax-normalised (no pair energy)"

    beta: RealScalarLike = param(1.0, kind="float>0", doc=BETA_DOC)
    Q: ArrayLike | None = None
    K: ArrayLike | None = None
    V: ArrayLike | None = None
    normalized: bool = param(
        True, kind="bool", static=True, doc="softmax rows (SA) or the 1/n average"
    )
    rescaled: bool = param(False, kind="bool", static=True, doc=RESCALED_DOC)

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

    def interaction_rate(self) -> ArrayLike:
        r"""$\beta$ (normalised: softmax weights sum to one); unnormalised, the exp kernels' rate
        $\sqrt\beta\, e^{\beta - 1/2}$ ($\sqrt\beta\, e^{-1/2}$ rescaled).

        Example:
            >>> import meanfield as mf
            >>> float(mf.models.SelfAttention(3.0).interaction_rate())
            3.0
        """
        if self.normalized:
            return _namespace(self.beta).asarray(self.beta)
        return exp_interaction_rate(self.beta, self.rescaled)

    def overflows(self, dtype: Any) -> ArrayLike:
        """Unnormalised and not rescaled: ``beta >= log(finfo(dtype).max)`` (with ``Q = K = None``)."""
        if self.normalized or self.rescaled:
            return False
        return np.asarray(self.beta) >= np.log(np.finfo(dtype).max)

    def footprint(self, n: int, d: int, *, block_size: int | None = None) -> Footprint:
        """The ``(n, n)`` logits and weights as XLA:CPU holds them (``compiled.memory_analysis()``,
        tests/test_cost_model.py): about two arrays up to ``n = 1024``, one while ``n^2 < 2^24``,
        none beyond (the small-``d`` products are fused into loops); with a margin above, whatever
        ``block_size``."""
        nf = as_float(n)
        if nf <= 1024:
            entries = 2.5 * nf**2
        elif nf**2 < 2.0**24:
            entries = 1.5 * nf**2
        else:
            entries = 3.0 * nf
        return Footprint(entries=entries, pairs=nf**2)

    def reference_step(self, base_dt: ArrayLike) -> ArrayLike:
        """``Model.reference_step``; unnormalised, the exp kernels' overflow-free form (``exp_reference_step``)."""
        if self.normalized:
            return super().reference_step(base_dt)
        return exp_reference_step(self.beta, base_dt, self.rescaled)

    def __check_init__(self) -> None:
        for name in ("Q", "K", "V"):
            M = getattr(self, name)
            if M is None:
                continue
            if not is_concrete(M):
                if jnp.ndim(M) != 2 or jnp.shape(M)[0] != jnp.shape(M)[1]:
                    raise ValueError(
                        f"{name} must be a square (d, d) matrix, got shape {jnp.shape(M)}"
                    )
                continue
            arr = _as_float_array(name, M)
            if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
                raise ValueError(f"{name} must be a square (d, d) matrix, got shape {arr.shape}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} contains NaN or inf; every entry must be finite")

    def _apply(self, M: ArrayLike | None, x: Array | np.ndarray) -> Array | np.ndarray:
        return x if M is None else x @ jnp.asarray(M, x.dtype).T

    def field(
        self,
        x: Float[Array | np.ndarray, "n d"],
        aux: ArrayLike | None = None,
        *,
        block_size: int | None = None,
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

    def energy(
        self, x: ArrayLike, aux: ArrayLike | None = None, *, block_size: int | None = None
    ) -> NoReturn:
        raise TypeError(
            "SelfAttention has no pair energy (the normalised/Q,K,V dynamics is not a gradient "
            "flow of E = 1/(2n^2) sum h); use a kernel from mf.kernels (e.g. USA) for energies"
        )

    def check_config(self, x: ArrayLike, aux: ArrayLike | None) -> None:
        d = np.shape(x)[-1]
        for name in ("Q", "K", "V"):
            M = getattr(self, name)
            if M is not None and tuple(jnp.shape(M)) != (d, d):
                raise ValueError(
                    f"{name} is {jnp.shape(M)[0]}x{jnp.shape(M)[1]} but the states have d = {d}; pass ({d}, {d}) matrices"
                )
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
