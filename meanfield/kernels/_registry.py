"""The model registry: one table of model names (CLI, sweeps, reproductions, Python), derived
from the model classes (``mf.models.Model``: ``name``, ``params()``, ``from_params``).

A model is registered by ``register(cls)``: the built-in models below, and models of installed
packages that declare their class (or a list of classes) in the entry-point group
``meanfield.models``, loaded when ``meanfield.kernels`` is first imported
(``load_entry_points``). A registered model works, with no edit to meanfield, in ``make``,
``meanfield simulate --kernel NAME --PARAM value`` (and its ``--help``), a sweep spec's
``kind = NAME``, the run's cost estimate and the dt warning (its ``interaction_rate``).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from .._checks import check_int
from .._params import PARAM_KINDS, RESERVED_NAMES, Param, check_applies
from ..models import Model, SelfAttention
from ._exp import USA, DistanceBias
from ._gauge import Gauge, PhaseField, Prompt, RoPE
from ._toeplitz import Toeplitz

__all__ = [
    "PARAM_KINDS",
    "Param",
    "ModelEntry",
    "MODELS",
    "MODEL_NAMES",
    "ENTRY_POINT_GROUP",
    "register",
    "unregister",
    "load_entry_points",
    "model_entry",
    "build",
    "make",
]

#: The entry-point group in which installed packages declare their models.
ENTRY_POINT_GROUP = "meanfield.models"


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered model: its name, one-line doc, parameters and constructor, derived from its
    class (``cls``: ``name``, ``summary``, ``params()``, ``from_params``, ``required_dimension()``,
    ``has_energy``, ``max_energy()``).

    ``build(params, d, dtype)`` makes the model from a full parameter dict; ``d`` is the required
    dimension where there is one (``gauge``: 3); ``max_energy(params)`` the theory's largest
    energy (None where it gives none).

    Example:
        >>> import meanfield as mf
        >>> [p.name for p in mf.kernels.MODELS["distance-bias"].params][:3]
        ['beta', 'lam', 'rescaled']
    """

    name: str
    doc: str
    params: tuple[Param, ...]
    build: Callable
    d: int | None = None
    cls: type[Model] | None = None
    #: One of meanfield's own models (not registered by another package or a user).
    builtin: bool = False

    @classmethod
    def of(cls, model: type[Model], *, builtin: bool = False) -> ModelEntry:
        """The entry of a model class (``register`` checks it first)."""
        doc = model.summary or (inspect.getdoc(model) or model.__name__).strip().splitlines()[0]
        return cls(
            str(model.name),
            doc,
            tuple(model.params()),
            model.from_params,
            model.required_dimension(),
            model,
            builtin,
        )

    @property
    def has_energy(self) -> bool:
        """Whether the model is a gradient flow of a pair energy (``mf.energy`` defined): the class's ``has_energy``."""
        return self.cls is not None and bool(self.cls.has_energy)

    def max_energy(self, params: Mapping) -> float | None:
        """The theory's largest energy of the model with ``params`` (defaults filled in), or None."""
        if self.cls is None:
            return None
        P = self.resolve(params)
        e = self.cls.from_params(P, self.d or 3, None).max_energy()
        return None if e is None else float(np.asarray(e))

    def over_grid(self, params: Mapping, d: int, **values: np.ndarray) -> Model:
        """The model with ``params`` (defaults filled in) whose traced top-level parameters named in
        ``values`` hold NumPy arrays of values instead of scalars (no constructor checks): for the
        elementwise facts of a whole grid at once, ``interaction_rate()`` and ``reference_step()``
        (the sweep plan's dt warning and step bound).

        Example:
            >>> import numpy as np, meanfield as mf
            >>> m = mf.kernels.MODELS["usa"].over_grid({}, 3, beta=np.array([1.0, 4.0]))
            >>> np.round(m.interaction_rate(), 3).tolist()
            [1.649, 66.231]
        """
        if self.cls is None:
            raise ValueError(f"model {self.name!r} has no dynamics: no rates")
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}
        first = {
            k: float(a.ravel()[0]) if a.size else self.param(k).default for k, a in arrays.items()
        }
        model = self.cls.from_params(self.resolve({**params, **first}), self.d or d, None)
        for k, a in arrays.items():
            if not self.param(k).traced or not hasattr(model, k):
                raise ValueError(
                    f"{k!r} is not a traced top-level parameter of model {self.name!r}"
                )
            model = eqx.tree_at(_field_of(k), model, a)
        return model

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

    def resolve(self, params: Mapping, *, where: str = "") -> dict:
        """Defaults filled in and every given value validated (unknown names: ``ValueError``)."""
        out = self.defaults()
        for name, value in params.items():
            out[name] = self.param(name).validate(value, f"{where}{name}")
        check_applies(out, self.defaults(), where)
        return out


def _field_of(name: str) -> Callable:
    """``m -> m.<name>`` (the ``where`` of ``equinox.tree_at``)."""
    return lambda m: getattr(m, name)


#: The model registry: every name ``meanfield simulate --kernel``, a sweep's ``model.kind``,
#: the reproductions and ``make`` accept, with its parameters (``register`` adds to it).
MODELS: dict[str, ModelEntry] = {}

#: Names of the models with dynamics (``meanfield simulate --kernel``, ``make``).
MODEL_NAMES: tuple[str, ...] = ()

_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def _refresh_names() -> None:
    global MODEL_NAMES
    MODEL_NAMES = tuple(MODELS)
    package = sys.modules.get(__package__ or "")
    if package is not None and hasattr(package, "MODEL_NAMES"):
        package.MODEL_NAMES = MODEL_NAMES  # type: ignore[attr-defined]


def register(cls: type, *, _builtin: bool = False) -> type:
    """Register a model class under its ``name`` class attribute; returns ``cls`` (a decorator).

    ``cls`` is a concrete subclass of ``mf.models.Model`` (``mf.kernels.Kernel`` for a pair
    kernel) whose parameters are declared with ``mf.kernels.param``. Its name (lower case, words
    joined by ``-``) must be new, or already ``cls``'s; its parameter names must not be the
    command line's own flags (``n``, ``d``, ``dt``, ...: ``meanfield._params.RESERVED_NAMES``).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> @mf.kernels.register
        ... class Linear(mf.kernels.Kernel):
        ...     name = "linear-doc"
        ...     scale: float = mf.kernels.param(1.0, kind="float>0", doc="interaction strength")
        ...     def __call__(self, x, xi, y, zeta):
        ...         return self.scale * jnp.dot(x, y)
        >>> type(mf.kernels.make("linear-doc", scale=2.0)).__name__, mf.kernels.MODELS["linear-doc"].has_energy
        ('Linear', True)
        >>> mf.kernels.unregister("linear-doc")
    """
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise TypeError(f"register takes a subclass of meanfield.models.Model, got {cls!r}")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise TypeError(
            f"{cls.__name__} is abstract (it does not define {missing}): it cannot be registered"
        )
    name = cls.name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"{cls.__name__}.name must be a lower-case name like 'my-kernel' (letters, digits, '-'), got {name!r}"
        )
    old = MODELS.get(name)
    if old is not None and old.builtin and old.cls is not cls:
        raise ValueError(f"{name!r} is one of meanfield's own models; choose another name")
    redefined = (
        old is not None
        and old.cls is not None
        and (old.cls.__module__, old.cls.__qualname__) == (cls.__module__, cls.__qualname__)
    )  # the same class defined again (a notebook cell run twice)
    if old is not None and old.cls is not cls and not redefined:
        raise ValueError(
            f"a model named {name!r} is already registered ({old.cls.__name__ if old.cls else name}); "
            f"choose another name"
        )
    params = cls.params()
    names = [p.name for p in params]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{cls.__name__} declares parameter(s) {', '.join(dup)} twice")
    reserved = sorted(set(names) & set(RESERVED_NAMES))
    if reserved:
        raise ValueError(
            f"{cls.__name__}'s parameter(s) {', '.join(reserved)} clash with the command line's own "
            f"flags; rename them (reserved: {', '.join(RESERVED_NAMES)})"
        )
    MODELS[name] = ModelEntry.of(cls, builtin=_builtin)
    _refresh_names()
    return cls


def unregister(name: str) -> None:
    """Remove the model ``name`` registered by ``register`` (not one of meanfield's own models).

    Example:
        >>> import meanfield as mf
        >>> try:
        ...     mf.kernels.unregister("usa")
        ... except ValueError as e:
        ...     print(e)
        'usa' is one of meanfield's own models: it cannot be unregistered
    """
    entry = model_entry(name)
    if entry.builtin:
        raise ValueError(f"{name!r} is one of meanfield's own models: it cannot be unregistered")
    del MODELS[name]
    _refresh_names()


def load_entry_points() -> list[str]:
    """Register the models that installed packages declare in the entry-point group
    ``meanfield.models`` (an entry point names a model class or a list of them); returns the
    names registered. One that fails to load or to register is skipped with a warning naming it.

    Example:
        >>> import meanfield as mf
        >>> isinstance(mf.kernels.load_entry_points(), list)
        True
    """
    from importlib.metadata import entry_points

    done = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            for cls in obj if isinstance(obj, (list, tuple)) else [obj]:
                register(cls)
                done.append(str(cls.name))
        except Exception as e:  # a broken plugin must not break meanfield
            warnings.warn(
                f"meanfield: the model entry point {ep.name!r} ({ep.value}) was not registered: "
                f"{type(e).__name__}: {e}",
                stacklevel=2,
            )
    return done


for _cls in (USA, DistanceBias, Toeplitz, RoPE, PhaseField, Gauge, Prompt, SelfAttention):
    register(_cls, _builtin=True)


def model_entry(name: object) -> ModelEntry:
    """The registry entry of ``name`` (``ValueError`` listing the accepted names).

    Example:
        >>> import meanfield as mf
        >>> mf.kernels.model_entry("gauge").d
        3
    """
    if not isinstance(name, str) or name not in MODELS:
        raise ValueError(f"unknown model {name!r}; accepted: {', '.join(MODELS)}")
    return MODELS[name]


def build(name: object, params: object, *, d: object, dtype: DTypeLike | None = None) -> Model:
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
    d = check_int("d", d, minimum=2)
    if entry.d is not None and d != entry.d:
        raise ValueError(f"model {name!r} needs d = {entry.d}, got d = {d}")
    P = entry.resolve(params)
    if "plane" in P and max(P["plane"]) >= d:
        raise ValueError(f"plane {P['plane']} needs indices < d = {d}")
    return entry.build(P, d, jnp.dtype(dtype) if dtype is not None else jnp.result_type(float))


def make(name: object, *, d: object = 3, dtype: DTypeLike | None = None, **params: Any) -> Model:
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
