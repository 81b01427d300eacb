"""The model registry: one table of model names (CLI, sweeps, reproductions, Python)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import sphere, theory
from .._checks import (
    check_int,
)
from ..models import Model, SelfAttention
from ._exp import USA, DistanceBias
from ._gauge import FourierPhase, Gauge, PhaseField, Prompt, RoPE, WavyGauge, random_gauges
from ._toeplitz import Toeplitz

__all__ = ['PARAM_KINDS', 'Param', 'ModelEntry', 'MODELS', 'MODEL_NAMES', 'model_entry', 'build', 'make']

# ----------------------------------------------------------------------------
# the registry: one table of model names (CLI, sweeps, reproductions, Python)
# ----------------------------------------------------------------------------

#: Kinds of parameter values: the accepted range of each.
PARAM_KINDS = ("float>0", "float>=0", "float", "int>=1", "int>=0", "bool", "plane", "choice")


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a registered model.

    ``traced`` parameters are leaves of the model's PyTree (a sweep makes them grid axes of
    one compilation); static ones change the program. ``kind`` is the accepted range
    (``PARAM_KINDS``), ``choices`` the accepted values of a ``"choice"``.

    Example:
        >>> import meanfield as mf
        >>> p = mf.kernels.MODELS["rope"].param("omega")
        >>> p.traced, p.kind, round(p.default, 4)
        (True, 'float', 6.2832)
    """

    name: str
    default: Any
    traced: bool
    kind: str
    doc: str
    choices: tuple = ()

    def validate(self, value, where: str = ""):
        """The value, checked against ``kind`` (``ValueError``/``TypeError`` naming it);
        traced values (tracers, arrays) of traced parameters pass to the model's own checks.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.MODELS["usa"].param("beta").validate(2)
            2.0
        """
        name = where or self.name
        if self.traced and isinstance(value, (jax.Array, np.ndarray)):
            return value  # an array or a tracer: the model's constructor and in-program checks
        if self.kind.startswith("float"):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"{name} must be a number, got {value!r}")
            v = float(value)
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {value!r}")
            if self.kind == "float>0" and not v > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
            if self.kind == "float>=0" and not v >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
            return v
        if self.kind.startswith("int"):
            return check_int(name, value, minimum=int(self.kind[-1]))
        if self.kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be true or false, got {value!r}")
            return bool(value)
        if self.kind == "plane":
            ok = isinstance(value, (list, tuple)) and len(value) == 2
            if not ok or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
                raise TypeError(f"{name} must be a pair of coordinate indices like (0, 1), got {value!r}")
            if value[0] == value[1] or min(value) < 0:
                raise ValueError(f"{name} must be two distinct indices >= 0, got {value!r}")
            return tuple(int(i) for i in value)
        if value not in self.choices:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        return value


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered model: its name, one-line doc, parameters and constructor.

    ``build(params, d, dtype)`` makes the model from a full parameter dict (``None`` for
    ``attention``, which has no dynamics and is swept only); ``d`` is the required dimension
    where there is one (``gauge``: 3); ``max_energy(params)`` the theory's largest energy, or
    ``None``.

    Example:
        >>> import meanfield as mf
        >>> [p.name for p in mf.kernels.MODELS["distance-bias"].params]
        ['beta', 'lam', 'rescaled']
    """

    name: str
    doc: str
    params: tuple[Param, ...]
    build: Callable | None
    d: int | None = None
    max_energy: Callable | None = None

    @property
    def simulated(self) -> bool:
        """Whether the model has dynamics (everything but ``attention``)."""
        return self.build is not None

    @property
    def has_energy(self) -> bool:
        """Whether the model is a pair kernel (``mf.energy`` defined)."""
        return self.simulated and self.name != "sa"

    def param(self, name: str) -> Param:
        """The parameter ``name`` (``ValueError`` listing the accepted ones)."""
        for p in self.params:
            if p.name == name:
                return p
        raise ValueError(
            f"{name!r} is not a parameter of model {self.name!r}; its parameters: "
            f"{', '.join(p.name for p in self.params) or 'none'}"
        )

    def defaults(self) -> dict:
        """``{name: default}`` of every parameter."""
        return {p.name: p.default for p in self.params}

    def resolve(self, params: Mapping[str, Any], *, where: str = "") -> dict:
        """Defaults filled in and every given value validated (unknown names: ``ValueError``)."""
        out = self.defaults()
        for name, value in params.items():
            out[name] = self.param(name).validate(value, f"{where}{name}")
        return out


_BETA = Param("beta", 1.0, True, "float>0", "inverse temperature")
_RESCALED = Param("rescaled", False, False, "bool", "multiply by e^(-beta): time t = e^(-beta) s (beta > 88 in float32)")
_PLANE = Param("plane", (0, 1), False, "plane", "rotation plane (a, b)")
_OMEGA = Param("omega", 2 * math.pi, True, "float", "rotation frequency of the positions (phase: linear rate)")


def _exp_max_energy(P: dict):
    return float(theory.max_energy(P["beta"], rescaled=P["rescaled"]))


def _toeplitz_max_energy(P: dict):
    """``1/4`` (the great circle traversed ``m`` times) for an integer ``m``; none otherwise."""
    m = P["m"]
    return float(theory.great_circle_energy(int(m))) if float(m).is_integer() else None


def _build_prompt(P: dict, d: int, dtype):
    K = P["prompts"]
    if P["gauges"] == "rotation":  # Psi_k = rotation by 2 pi k / K in `plane`
        G = jnp.stack([sphere.rotation(2 * np.pi * k / K, d, P["plane"]) for k in range(K)]).astype(dtype)
    else:  # Haar-random from key(gauge_seed), drawn in float32 whatever the dtype (same gauges)
        G = random_gauges(jax.random.key(P["gauge_seed"]), K, d, jnp.float32).astype(dtype)
        if jnp.dtype(dtype).itemsize > 4:  # orthogonal to the dtype's rounding: one QR, signs kept
            q, r = jnp.linalg.qr(G)
            G = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
    return Prompt(P["beta"], G, rescaled=P["rescaled"])


def _entry(name, doc, params, build, **kw) -> ModelEntry:
    return ModelEntry(name, doc, tuple(params), build, **kw)


#: The model registry: every name ``meanfield simulate --kernel``, a sweep's ``model.kind``,
#: the reproductions and ``make`` accept, with its parameters.
MODELS: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        _entry("usa", "unbiased self-attention exp(beta <x, y>) / beta: collapses to a point",
               [_BETA, _RESCALED], lambda P, d, dt: USA(P["beta"], rescaled=P["rescaled"]),
               max_energy=_exp_max_energy),
        _entry("distance-bias", "exp(-lam |s - t|) exp(beta <x, y>) / beta: still collapses (Prop. 11)",
               [_BETA, Param("lam", 1.0, True, "float>=0", "distance-bias rate"), _RESCALED],
               lambda P, d, dt: DistanceBias(P["beta"], P["lam"], rescaled=P["rescaled"])),
        _entry("toeplitz", "cos(2 pi m (t - s)) <x, y>: the great circle traversed m times",
               [Param("m", 1.0, True, "float>0", "Toeplitz frequency (an integer for a closed circle)")],
               lambda P, d, dt: Toeplitz(P["m"]),
               max_energy=_toeplitz_max_energy),
        _entry("rope", "rotary positions exp(beta <x, R_omega(t - s) y>) / beta: a latitude circle",
               [_BETA, _OMEGA, _PLANE, _RESCALED],
               lambda P, d, dt: RoPE(P["beta"], P["omega"], P["plane"], rescaled=P["rescaled"]),
               max_energy=_exp_max_energy),
        _entry("phase-field", "phase field phi(s) = omega s + amplitude sin(2 pi frequency s) (FourierPhase)",
               [_BETA, _OMEGA, Param("amplitude", 1.0, True, "float", "sine amplitude of the phase"),
                Param("frequency", 1, False, "int>=1", "sine frequency of the phase"), _PLANE, _RESCALED],
               lambda P, d, dt: PhaseField(P["beta"], FourierPhase(P["omega"], P["amplitude"], P["frequency"]),
                                           P["plane"], rescaled=P["rescaled"]),
               max_energy=_exp_max_energy),
        _entry("gauge", "wavy generalised RoPE R12(2 pi s) R23(amplitude sin(2 pi k s)) (WavyGauge, d = 3)",
               [_BETA, Param("amplitude", 0.6, True, "float", "wave amplitude of the gauge (radians)"),
                Param("k", 3, False, "int>=1", "waves per turn of the gauge"), _RESCALED],
               lambda P, d, dt: Gauge(P["beta"], WavyGauge(P["amplitude"], P["k"]), rescaled=P["rescaled"]),
               d=3, max_energy=_exp_max_energy),
        _entry("prompt", "prompt gauges Psi_k on K contiguous blocks: K Dirac masses",
               [_BETA, Param("prompts", 3, False, "int>=1", "number of prompts K"),
                Param("gauges", "random", False, "choice", "prompt gauges: Haar-random (from gauge_seed) "
                      "or rotations by 2 pi k / K in plane", ("random", "rotation")),
                Param("gauge_seed", 0, False, "int>=0", "PRNG seed of the random prompt gauges"),
                _PLANE, _RESCALED],
               _build_prompt, max_energy=_exp_max_energy),
        _entry("sa", "self-attention, softmax-normalised (no pair energy)",
               [_BETA, Param("normalized", True, False, "bool", "softmax rows (SA) or the 1/n average"), _RESCALED],
               lambda P, d, dt: SelfAttention(P["beta"], normalized=P["normalized"], rescaled=P["rescaled"])),
        _entry("attention", "one fixed query against n uniform keys (sweeps only: no dynamics)",
               [_BETA], None),
    )
}

#: Names of the models with dynamics (``meanfield simulate --kernel``, ``make``).
MODEL_NAMES = tuple(name for name, e in MODELS.items() if e.simulated)


def model_entry(name) -> ModelEntry:
    """The registry entry of ``name`` (``ValueError`` listing the accepted names).

    Example:
        >>> import meanfield as mf
        >>> mf.kernels.model_entry("gauge").d
        3
    """
    if not isinstance(name, str) or name not in MODELS:
        raise ValueError(f"unknown model {name!r}; accepted: {', '.join(MODELS)}")
    return MODELS[name]


def build(name, params, *, d, dtype=None) -> Model:
    """The model ``name`` from a dict of its parameters (defaults for the missing ones).

    What ``make`` does with keywords; the sweep engine calls it with traced values.

    Example:
        >>> import meanfield as mf
        >>> type(mf.kernels.build("phase-field", {"amplitude": 0.5}, d=3).phase).__name__
        'FourierPhase'
    """
    entry = model_entry(name)
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of parameter values, got {params!r}")
    if entry.build is None:
        raise ValueError(f"model {name!r} has no dynamics (it is swept only); accepted: {', '.join(MODEL_NAMES)}")
    d = check_int("d", d, minimum=2)
    if entry.d is not None and d != entry.d:
        raise ValueError(f"model {name!r} needs d = {entry.d}, got d = {d}")
    P = entry.resolve(params)
    if "plane" in P and max(P["plane"]) >= d:
        raise ValueError(f"plane {P['plane']} needs indices < d = {d}")
    return entry.build(P, d, jnp.dtype(dtype) if dtype is not None else jnp.result_type(float))


def make(name, *, d=3, dtype=None, **params) -> Model:
    """Build a registered model by name with its parameters as keywords (``MODELS``).

    ``usa``, ``distance-bias`` (``lam``), ``toeplitz`` (``m``), ``rope`` (``omega``, ``plane``),
    ``phase-field`` (``omega``, ``amplitude``, ``frequency``: ``FourierPhase``), ``gauge``
    (``amplitude``, ``k``: ``WavyGauge``, d = 3), ``prompt`` (``prompts``, ``gauges``,
    ``gauge_seed``, ``plane``), ``sa`` (``normalized``); all but ``toeplitz`` take ``beta``,
    the exp kernels ``rescaled``. The same name and parameters give the same model as
    ``meanfield simulate --kernel NAME`` and a sweep of ``kind = NAME``.

    Args:
        name: one of ``MODEL_NAMES``.
        d: dimension (``gauge`` needs 3; ``prompt`` gauges are ``(d, d)``).
        dtype: floating dtype of array parameters (prompt gauges); default JAX's.
        **params: the model's parameters (``MODELS[name].params``); unknown ones raise.

    Returns:
        a ``Kernel`` (``mf.models.SelfAttention`` for ``sa``).

    Example:
        >>> import meanfield as mf
        >>> type(mf.kernels.make("rope", beta=2.0)).__name__
        'RoPE'
    """
    return build(name, params, d=d, dtype=dtype)

