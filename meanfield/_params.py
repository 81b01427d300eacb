"""The one validation layer of parameter values: one rule per kind of value, without JAX.

Every place a value enters meanfield checks it here, with the same message: the model
constructors (``mf.kernels.make``, ``build``, and ``__check_init__`` of every registered
model, through ``mf.models.Model``), the command line (``meanfield simulate --beta ...``,
whose text goes through ``parse_text``) and the sweep spec (``[model]``, ``[grid]``,
``[time]`` values). A message names the value and what is accepted, e.g.
``beta must be > 0, got -1`` (Python, sweeps: the name is the parameter or the dotted key)
or ``argument --beta: must be > 0, got -1`` (the command line, where argparse names the flag).
Values known only inside a program (tracers) are checked there with ``equinox.error_if``
(``meanfield._checks``). This module imports no JAX: the command line's parser uses it before
JAX is loaded.

The kinds (``PARAM_KINDS``): ``"float>0"``, ``"float>=0"``, ``"float"`` (finite reals),
``"int>=1"``, ``"int>=0"`` (integers, not bools, not floats), ``"bool"``, ``"plane"`` (two
distinct coordinate indices ``>= 0``) and ``"choice"`` (one of the declared values).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Collection, Iterable
from typing import Any, NoReturn

from ._spelling import Spelling, applies_problem, show_value

__all__ = [
    "PARAM_KINDS",
    "RESERVED_NAMES",
    "Param",
    "check_value",
    "check_float",
    "check_int",
    "parse_text",
    "is_number",
    "check_keys",
    "applies_rules",
    "check_applies",
    "INT32_MAX",
    "KEY_SEED_MAX",
]

#: Kinds of parameter values: the accepted range of each.
PARAM_KINDS = ("float>0", "float>=0", "float", "int>=1", "int>=0", "bool", "plane", "choice")


#: Names a model parameter may not take: the command line's own ``meanfield simulate`` flags
#: and the sweep spec's ``[model]`` keys (``kind``, ``backend``; ``noise`` and ``sigma``: the
#: run's noise, ``--noise`` and ``--sigma``, a sweep's ``model.noise`` and ``model.sigma``; ``frequencies``, ``spread``, ``frequency_seed``: the
#: natural frequencies, ``--frequencies``, ``--spread``, ``--frequency-seed``).
RESERVED_NAMES = (
    "n",
    "d",
    "kernel",
    "kind",
    "solver",
    "step",
    "t1",
    "dt",
    "rtol",
    "atol",
    "saves",
    "early_stop",
    "seed",
    "out",
    "movie",
    "force",
    "quiet",
    "no_plots",
    "backend",
    "dtype",
    "help",
    "r0",
    "noise",
    "sigma",
    "frequencies",
    "spread",
    "frequency_seed",
)


#: The largest integer a traced integer parameter may hold: an int32 of the compiled program
#: (``weight_seed``; declared as its ``maximum``, ``mf.models.param``).
INT32_MAX = 2**31 - 1
#: The largest seed ``jax.random.key`` tells apart without x64 (it keeps the low 32 bits: ``2**32``
#: is the key of 0): the ``maximum`` of a static seed (``Prompt``'s ``gauge_seed``).
KEY_SEED_MAX = 2**32 - 1


def applies_rules(params: Iterable[Any] = ()) -> dict[str, tuple[tuple[str, tuple[Any, ...]], ...]]:
    """The rules the parameters ``params`` declare (``Param.applies``) as one table of
    ``name -> ((switch, values), ...)``: each parameter says what it acts with, no central table.

    Example:
        >>> import meanfield as mf
        >>> applies_rules(mf.kernels.MODELS["usa"].params)["slope"]
        (('mask', ('alibi',)),)
    """
    return {p.name: tuple(p.applies) for p in params if getattr(p, "applies", ())}


def check_applies(values: Any, defaults: Any, where: str = "", params: Iterable[Any] = ()) -> None:
    """Refuse a value that would change nothing (the rules ``params`` declare, ``applies_rules``):
    ``values[name]`` set away from ``defaults[name]`` while no ``values[switch]`` is one of the
    values it applies with.

    Example:
        >>> import meanfield as mf
        >>> P = mf.kernels.MODELS["usa"].params
        >>> check_applies({"mask": "none", "slope": 2.0}, {"mask": "none", "slope": 1.0}, "model.", P)
        Traceback (most recent call last):
        ...
        ValueError: model.slope = 2.0 applies with model.mask = 'alibi', not 'none'
    """
    say = Spelling(lambda key: f"{where}{key}", lambda key, v: f"{where}{key} = {v!r}")
    for name, rules in applies_rules(params).items():
        if name not in values:
            continue
        problem = applies_problem(name, values[name], rules, values, say=say)
        if problem is not None and _differs(values[name], defaults.get(name, values[name])):
            raise ValueError(problem)


def _differs(value: Any, default: Any) -> bool:
    """Whether ``value`` (a number, a list of a sweep axis, a plane as a list, an array) differs
    from ``default``."""
    if isinstance(default, (tuple, list)):  # a plane: (0, 1) and [0, 1] are one value
        return not isinstance(value, (tuple, list)) or tuple(value) != tuple(default)
    if isinstance(value, list):
        return any(_differs(v, default) for v in value)
    try:
        return bool(value != default)
    except (TypeError, ValueError):  # an array: any entry
        import numpy as np

        return bool(np.any(np.asarray(value) != default))


def is_number(v: object) -> bool:
    """A real number that is not a bool (Python or NumPy scalar, or a 0-d real array).

    Example:
        >>> is_number(2), is_number(2.5), is_number(True), is_number("2")
        (True, True, False, False)
    """
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return False
    if isinstance(v, numbers.Real):
        return True
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    return shape == () and dtype is not None and getattr(dtype, "kind", "") in "iuf"


def _fail(exc: type[Exception], name: str, rule: str) -> NoReturn:
    raise exc(f"{name} {rule}" if name else rule)


def check_float(name: str, value: Any, kind: str = "float", *, shown: str | None = None) -> float:
    """A finite real as a Python float, ``> 0`` (``kind="float>0"``), ``>= 0`` (``"float>=0"``) or any
    (``"float"``); ``TypeError``/``ValueError`` naming ``name`` and the value (``shown``: how to
    write the value in the message, e.g. the command line's text).

    Example:
        >>> check_float("beta", 2)
        2.0
        >>> try:
        ...     check_float("beta", -1, "float>0")
        ... except ValueError as e:
        ...     print(e)
        beta must be > 0, got -1
    """
    got = show_value(value) if shown is None else shown
    if not is_number(value):
        _fail(TypeError, name, f"must be a number, got {got}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond the float range
        v = math.inf if value > 0 else -math.inf
    if not math.isfinite(v):
        _fail(ValueError, name, f"must be finite, got {got}")
    if kind == "float>0" and not v > 0:
        _fail(ValueError, name, f"must be > 0, got {got}")
    if kind == "float>=0" and not v >= 0:
        _fail(ValueError, name, f"must be >= 0, got {got}")
    return v


def check_int(
    name: str,
    value: Any,
    minimum: int | None = None,
    maximum: int | None = None,
    *,
    shown: str | None = None,
) -> int:
    """An integer (not a bool, not a float: ``2.0`` is refused with a hint) as a Python int, within
    ``[minimum, maximum]`` where given; ``TypeError``/``ValueError`` naming ``name`` and the value.

    Example:
        >>> check_int("k", 3, minimum=1)
        3
        >>> try:
        ...     check_int("k", 2.0)
        ... except TypeError as e:
        ...     print(e)
        k must be an integer (write it without a decimal point or exponent), got 2.0
    """
    got = show_value(value) if shown is None else shown
    integral = isinstance(value, numbers.Integral) or (
        getattr(value, "shape", None) == ()
        and getattr(getattr(value, "dtype", None), "kind", "") in "iu"
    )
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not integral:
        hint = ""
        if isinstance(value, float) and value.is_integer():
            hint = " (write it without a decimal point or exponent)"
        _fail(TypeError, name, f"must be an integer{hint}, got {got}")
    v = int(value)
    if minimum is not None and v < minimum:
        _fail(ValueError, name, f"must be >= {minimum}, got {got}")
    if maximum is not None and v > maximum:
        _fail(ValueError, name, f"must be <= {maximum}, got {got}")
    return v


def check_keys(table: str, got: Iterable[Any], accepted: Collection[str]) -> None:
    """``ValueError`` naming the keys of ``got`` that are not ``accepted`` (a sweep spec's
    ``[table]``; ``table=""``: the top level).

    Example:
        >>> try:
        ...     check_keys("time", {"t1": 1, "tl": 2}, ("t1", "dt"))
        ... except ValueError as e:
        ...     print(e)
        unknown key 'tl' in [time]; accepted keys: t1, dt
    """
    bad = sorted(set(got) - set(accepted))
    if bad:
        where = f"[{table}]" if table else "top level"
        raise ValueError(
            f"unknown key{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} in {where}; "
            f"accepted keys: {', '.join(accepted)}"
        )


def check_value(
    name: str,
    kind: str,
    value: Any,
    choices: tuple = (),
    *,
    shown: str | None = None,
    maximum: int | None = None,
) -> Any:
    """``value`` checked against ``kind`` (``PARAM_KINDS``) and returned normalised (a float, an
    int, a bool, a plane as a tuple, or the choice); ``TypeError``/``ValueError`` naming ``name``.
    ``maximum``: the largest accepted integer of an integer kind (``Param.maximum``).

    Example:
        >>> check_value("plane", "plane", [0, 2])
        (0, 2)
        >>> try:
        ...     check_value("gauges", "choice", "haar", ("random", "rotation"))
        ... except ValueError as e:
        ...     print(e)
        gauges must be one of 'random', 'rotation', got 'haar'
    """
    got = show_value(value) if shown is None else shown
    if kind.startswith("float"):
        return check_float(name, value, kind, shown=shown)
    if kind in ("int>=1", "int>=0"):
        return check_int(name, value, minimum=int(kind[-1]), maximum=maximum, shown=shown)
    if kind == "bool":
        if not (isinstance(value, bool) or type(value).__name__ == "bool_"):
            _fail(TypeError, name, f"must be true or false, got {got}")
        return bool(value)
    if kind == "plane":
        ok = isinstance(value, (list, tuple)) and len(value) == 2
        if not ok or not all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in value
        ):
            _fail(TypeError, name, f"must be a pair of coordinate indices like (0, 1), got {got}")
        if value[0] == value[1] or min(value) < 0:
            _fail(ValueError, name, f"must be two distinct indices >= 0, got {got}")
        return tuple(int(i) for i in value)
    if kind == "choice":
        if value not in choices:
            _fail(ValueError, name, f"must be one of {', '.join(map(repr, choices))}, got {got}")
        return value
    raise ValueError(f"unknown parameter kind {kind!r}; accepted: {', '.join(PARAM_KINDS)}")


def parse_text(
    kind: str,
    text: str,
    choices: tuple = (),
    *,
    name: str = "",
    minimum: int | None = None,
    maximum: int | None = None,
) -> Any:
    """The value of a command-line word of ``kind``, checked by ``check_value`` (the same rule
    and message; ``name`` empty: argparse prefixes the flag). Integers may be written as integral
    floats (``1e5``); a plane as ``0,1``; a bool as ``true``/``false``. ``kind="int"`` with
    ``minimum``/``maximum`` is an integer in that range (the command line's own counts and seeds).

    Example:
        >>> parse_text("float>0", "2.5"), parse_text("int>=1", "1e3"), parse_text("plane", "0, 2")
        (2.5, 1000, (0, 2))
        >>> try:
        ...     parse_text("float>0", "-1")
        ... except ValueError as e:
        ...     print(e)
        must be > 0, got -1
    """
    t = text.strip()
    if kind.startswith("float"):
        try:
            value: Any = float(t)
        except ValueError:
            _fail(TypeError, name, f"must be a number, got {text!r}")
        return check_float(name, value, kind, shown=text)
    if kind.startswith("int"):
        try:
            value = int(t)
        except ValueError:
            try:
                f = float(t)
            except ValueError:
                f = math.nan
            if not (math.isfinite(f) and f.is_integer()):
                _fail(TypeError, name, f"must be an integer, got {text!r}")
            value = int(f)
        low = int(kind[-1]) if kind in ("int>=1", "int>=0") else None
        if minimum is not None:
            low = minimum if low is None else max(low, minimum)
        return check_int(name, value, minimum=low, maximum=maximum, shown=text)
    if kind == "bool":
        word = t.lower()
        if word not in ("true", "false", "1", "0", "yes", "no"):
            _fail(TypeError, name, f"must be true or false, got {text!r}")
        return word in ("true", "1", "yes")
    if kind == "plane":
        try:
            a, b = (int(w) for w in t.replace(" ", "").split(","))
        except ValueError:
            _fail(TypeError, name, f"must be a pair of coordinate indices like 0,1, got {text!r}")
        return check_value(name, kind, (a, b), shown=text)
    return check_value(name, kind, t, choices, shown=repr(text))


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a registered model, derived from its declaration (``mf.models.param``).

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
    #: An option added after stores were written (masks, attention variants): a sweep spec records
    #: it only when it differs from ``default``, so specs without it keep their hash.
    optional: bool = False
    #: The largest accepted value of an integer kind, or None: a seed's range (``INT32_MAX`` for a
    #: traced one, an int32 of the program; ``KEY_SEED_MAX`` for a static one). Declared once
    #: (``mf.models.param``), checked by the model's constructor, carried by the command line's
    #: schema (``meanfield._cli_schema``).
    maximum: int | None = None
    #: The switches this parameter acts with: ``((switch, values), ...)``; a value away from the
    #: default while no ``switch`` takes one of its ``values`` changes nothing and is refused
    #: (``check_applies``). Declared with the parameter (a variant's parameter: the members that
    #: declare it, ``meanfield._declare.Variant``).
    applies: tuple = ()

    def validate(self, value: Any, where: str = "") -> Any:
        """The value, checked against ``kind`` (``check_value``: ``ValueError``/``TypeError``
        naming it); arrays and tracers of traced parameters pass to the model's own checks.

        Example:
            >>> import meanfield as mf
            >>> mf.kernels.MODELS["usa"].param("beta").validate(2)
            2.0
        """
        name = where or self.name
        if self.traced and hasattr(value, "shape") and not isinstance(value, numbers.Number):
            return value  # an array (NumPy, JAX) or a tracer: the model's constructor and in-program checks
        # a traced one's ``maximum`` is the constructor's check (a sweep spec words its own for an axis)
        maximum = None if self.traced else self.maximum
        return check_value(name, self.kind, value, self.choices, maximum=maximum)
