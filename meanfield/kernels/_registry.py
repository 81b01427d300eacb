"""The model registry: one table of model names (CLI, sweeps, reproductions, Python), derived
from the model classes (``mf.models.Model``: ``name``, ``params()``, ``from_params``).

A model is registered by ``register(cls)``: the built-in models below, and models of installed
packages that declare their class (or a list of classes) in the entry-point group
``meanfield.models``, loaded when ``meanfield.kernels`` is first imported
(``load_entry_points``). A registered model works, with no edit to meanfield, in ``make``,
``meanfield simulate --kernel NAME --PARAM value`` (and its ``--help``), a sweep spec's
``kind = NAME``, the run's cost estimate and the dt warning (its ``interaction_rate``).

Plugins load in isolation: an entry point whose import raises anything (``SystemExit`` of a
plugin that calls ``sys.exit`` or parses the command line at import included; only
``KeyboardInterrupt`` passes) or whose classes ``register`` refuses is skipped with ONE warning
line (``PluginWarning``) and recorded in ``PLUGIN_FAILURES`` (``meanfield info`` lists it); while
it is imported, ``sys.argv`` is ``[entry point name]``, ``sys.stdin`` is empty and what it
prints is not shown (a plugin cannot read or answer meanfield's own command line).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
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
from .._declare import Variant
from .._params import PARAM_KINDS, RESERVED_NAMES, Param, check_applies
from .._spelling import size_problem
from ..models import Model, SelfAttention
from ._exp import USA, DistanceBias
from ._gauge import Gauge, PhaseField, Prompt, RoPE
from ._kuramoto import Kuramoto
from ._toeplitz import Toeplitz

__all__ = [
    "PARAM_KINDS",
    "Param",
    "ModelEntry",
    "MODELS",
    "MODEL_NAMES",
    "ENTRY_POINT_GROUP",
    "RESERVED_MODEL_NAMES",
    "PLUGIN_FAILURES",
    "PluginWarning",
    "plugin_error",
    "register",
    "unregister",
    "load_entry_points",
    "model_entry",
    "build",
    "make",
]

#: The entry-point group in which installed packages declare their models.
ENTRY_POINT_GROUP = "meanfield.models"

#: Names no model may take: the sweep kinds of their own (``[model] kind = "attention"`` or
#: ``"continuum"`` in a sweep spec), which a model of that name would never reach.
RESERVED_MODEL_NAMES = ("attention", "continuum")

#: The entry points of ``ENTRY_POINT_GROUP`` that ``load_entry_points`` skipped: ``{name:
#: {"value": "module:attr", "error": "ExcType: message"}}`` (``meanfield info`` lists them).
PLUGIN_FAILURES: dict[str, dict[str, str]] = {}


class PluginWarning(UserWarning):
    """A model entry point (``meanfield.models``) that was not registered: the warning names it,
    its value and the error (one line)."""


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
        check_applies(out, self.defaults(), where, self.params)
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
    joined by ``-``) must be new, or already ``cls``'s, and not a sweep kind of its own
    (``RESERVED_MODEL_NAMES``: ``attention``, ``continuum``). Its parameters: names that are not
    the command line's own flags (``n``, ``d``, ``dt``, ...: ``meanfield._params.RESERVED_NAMES``;
    a bool's ``no_NAME`` counts); defaults of their own kind (``beta = -1`` declared
    ``"float>0"`` is refused); and, since ``meanfield simulate`` has one flag per name for every
    model, a name another model has must keep that model's kind and choices (a float named
    ``weights`` would be parsed as ``sa``'s choice of weights), and no name may be the
    ``--no-NAME`` of another's bool. Each refusal is one ``ValueError`` naming the class and
    the parameter (or name) and what is accepted.

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
    if name in RESERVED_MODEL_NAMES:
        raise ValueError(
            f"{cls.__name__}.name {name!r} is reserved (the sweep kinds of their own: "
            f"{', '.join(RESERVED_MODEL_NAMES)}); choose another name"
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
    flags = {f for p in params for f in _flag_names(p)}
    reserved = sorted(flags & set(RESERVED_NAMES))
    if reserved:
        raise ValueError(
            f"{cls.__name__}'s parameter(s) {', '.join(reserved)} clash with the command line's own "
            f"flags; rename them (reserved: {', '.join(RESERVED_NAMES)})"
        )
    for p in params:
        try:
            p.validate(p.default, f"{cls.__name__}.{p.name}'s default")
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"{e} (declared kind {p.kind}"
                + (f": {', '.join(map(repr, p.choices))}" if p.kind == "choice" else "")
                + "; a default must be one of its own values)"
            ) from None
    _check_shared_flags(cls, name, params)
    MODELS[name] = ModelEntry.of(cls, builtin=_builtin)
    _refresh_names()
    return cls


def _flag_names(p: Param) -> tuple[str, ...]:
    """The command-line names a parameter takes (``meanfield simulate --NAME``; a bool also
    ``--no-NAME``), with ``_`` for ``-``."""
    return (p.name, f"no_{p.name}") if p.kind == "bool" else (p.name,)


def _check_shared_flags(cls: type, name: str, params: tuple[Param, ...]) -> None:
    """``meanfield simulate`` has ONE flag per parameter name, shared by every model that has
    it, parsed by the rule (kind and choices) of the first: a parameter named like another
    model's must have its kind and choices (``sa``'s ``weights`` is a choice; a float of that
    name would be parsed as one), and no parameter may take the ``--no-NAME`` flag of another's
    bool. ``ValueError`` naming both models."""
    for other in MODELS.values():
        if other.name == name:
            continue
        theirs = {p.name: p for p in other.params}
        their_flags = {f: p for p in other.params for f in _flag_names(p)}
        for p in params:
            q = theirs.get(p.name)
            if q is not None and (q.kind, tuple(q.choices)) != (p.kind, tuple(p.choices)):
                what = (
                    f"a choice of {', '.join(map(repr, q.choices))}"
                    if q.kind == "choice"
                    else q.kind
                )
                raise ValueError(
                    f"{cls.__name__}'s parameter {p.name!r} ({p.kind}) would share the flag "
                    f"--{p.name.replace('_', '-')} with the parameter {p.name!r} of model "
                    f"{other.name!r} ({what}), parsed one way for every model: give it that kind, "
                    "or another name"
                )
            for f in _flag_names(p):
                q = their_flags.get(f)
                if q is not None and q.name != p.name:
                    raise ValueError(
                        f"{cls.__name__}'s parameter {p.name!r} takes the flag "
                        f"--{f.replace('_', '-')}, already model {other.name!r}'s parameter "
                        f"{q.name!r}; choose another name"
                    )


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
    names registered.

    Each entry point loads in isolation (``_isolated``): ``sys.argv`` is ``[its name]``,
    ``sys.stdin`` empty, and what it prints is held back (on a failure, its first line is in
    the message). One that raises anything while it loads (``SystemExit`` included: a plugin
    that calls ``sys.exit`` or runs argparse at import; ``KeyboardInterrupt`` still interrupts)
    or whose classes ``register`` refuses is skipped with one ``PluginWarning`` line naming it
    and recorded in ``PLUGIN_FAILURES``.

    Example:
        >>> import meanfield as mf
        >>> isinstance(mf.kernels.load_entry_points(), list)
        True
    """
    from importlib.metadata import entry_points

    try:
        found = list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as e:  # damaged distribution metadata: no plugin, one warning
        _warn_plugin(f"the {ENTRY_POINT_GROUP} entry points could not be read: {_describe(e)}")
        return []
    done = []
    for ep in found:
        printed = io.StringIO()
        try:
            with _isolated(ep.name, printed):
                obj = ep.load()
                classes = list(obj) if isinstance(obj, (list, tuple)) else [obj]
                for cls in classes:
                    register(cls)
                    done.append(str(cls.name))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # a broken plugin must not break (or end) meanfield
            error = _describe(e)
            shown = next((ln.strip() for ln in printed.getvalue().splitlines() if ln.strip()), "")
            if shown:
                error += f" (it printed: {shown[:200]})"
            PLUGIN_FAILURES[ep.name] = {"value": str(ep.value), "error": error}
            _warn_plugin(
                f"the model entry point {ep.name!r} ({ep.value}) was not registered: {error}"
            )
        else:
            PLUGIN_FAILURES.pop(ep.name, None)
    return done


def plugin_error(name: object, e: BaseException, flag: str = "model") -> ValueError | None:
    """The one-line error of an exception ``e`` raised while the model ``name`` ran, when that
    model is not one of meanfield's own (a plugin, or registered at run time) and the exception
    is its code's: raised with a frame of its class's package in the traceback (or one of the
    exceptions it came from), or of a type no user error has (not ``ValueError``, ``TypeError``,
    ``OverflowError``, ``OSError``). ``None`` otherwise (meanfield's own models, and meanfield's
    own refusals: raise ``e`` as it is). The command line prints it as its one line (exit
    status 2): ``"{flag} NAME (the model MODULE.CLASS, not one of meanfield's) failed: ExcType:
    message"``.

    Example:
        >>> plugin_error("usa", ZeroDivisionError("x")) is None  # meanfield's own: a bug, not a plugin's
        True
    """
    entry = MODELS.get(name) if isinstance(name, str) else None
    if entry is None or entry.builtin or entry.cls is None or isinstance(e, MemoryError):
        return None
    package = entry.cls.__module__.split(".")[0]
    if isinstance(e, (ValueError, TypeError, OverflowError, OSError)) and not _raised_in(
        e, package
    ):
        return None
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return ValueError(
        f"{flag} {entry.name} (the model {entry.cls.__module__}.{entry.cls.__qualname__}, not one "
        f"of meanfield's) failed: {type(e).__name__}" + (f": {line}" if line else "")
    )


def _raised_in(e: BaseException, package: str) -> bool:
    """Whether a frame of ``e``'s traceback (or of the exceptions it came from) runs code of
    ``package``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo and len(seen) < 32:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            module = str(tb.tb_frame.f_globals.get("__name__", ""))
            if module == package or module.startswith(package + "."):
                return True
            tb = tb.tb_next
        todo += [exc.__cause__, exc.__context__]
    return False


def _describe(e: BaseException) -> str:
    """``"ExcType: first line"`` (``SystemExit``: its code)."""
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}) at import"
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _warn_plugin(message: str) -> None:
    """One ``PluginWarning`` line: an explicit location with no source line to print under it."""
    warnings.warn_explicit(message, PluginWarning, ENTRY_POINT_GROUP, 0)


@contextlib.contextmanager
def _isolated(name: str, printed: io.StringIO) -> Any:
    """Run a plugin's import with ``sys.argv = [name]``, an empty ``sys.stdin`` and its output
    (``sys.stdout``, ``sys.stderr``) into ``printed``; everything restored after."""
    saved = sys.argv, sys.stdin, sys.stdout, sys.stderr
    sys.argv = [name]
    sys.stdin = io.StringIO()
    sys.stdout = sys.stderr = printed
    try:
        yield
    finally:
        sys.argv, sys.stdin, sys.stdout, sys.stderr = saved


for _cls in (USA, DistanceBias, Toeplitz, RoPE, PhaseField, Gauge, Prompt, SelfAttention, Kuramoto):
    register(_cls, _builtin=True)


def _rederive(family: Any) -> None:
    """A variant registered or removed (``mf.normalization.Scheme.register``, ...): the entries of
    the models that take its family derive their parameters again (its name among the choices)."""
    for name, entry in list(MODELS.items()):
        if entry.cls is not None and any(p.name == family.flat_name for p in entry.params):
            MODELS[name] = ModelEntry.of(entry.cls, builtin=entry.builtin)


Variant.listeners.append(_rederive)


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
    problem = size_problem({}, d=d, required_d=entry.d, model=entry.name)
    if problem is not None:
        raise ValueError(problem)
    P = entry.resolve(params)
    problem = size_problem(P, d=d)  # the rules the command line and a sweep spec check too
    if problem is not None:
        raise ValueError(problem)
    return entry.build(P, d, jnp.dtype(dtype) if dtype is not None else jnp.result_type(float))


def make(name: object, *, d: object = 3, dtype: DTypeLike | None = None, **params: Any) -> Model:
    """Build a registered model by name with its parameters as keywords (``MODELS``).

    ``usa``, ``distance-bias`` (``lam``), ``toeplitz`` (``m``), ``rope`` (``omega``, ``plane``),
    ``phase-field`` (``omega``, ``amplitude``, ``frequency``: ``FourierPhase``), ``gauge``
    (``amplitude``, ``k``: ``WavyGauge``, d = 3), ``prompt`` (``prompts``, ``gauges``,
    ``gauge_seed``, ``plane``), ``sa`` (``normalized``), ``kuramoto`` (``coupling``); all but
    ``toeplitz`` and ``kuramoto`` take ``beta``,
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
