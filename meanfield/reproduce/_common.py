"""Shared pieces of the ``meanfield reproduce`` experiments: how an experiment declares its options
and steps (``Experiment``, ``Option``), its progress and timings (``Steps``), and the summary schema.

Every experiment writes ``DIR/<experiment>/summary.json``::

    {"experiment": "usa-av", "quick": true, "settings": {...},
     "checks": [{"name": ..., "theory": <number or null>, "measured": <number>,
                 "tolerance": <number>, "pass": <bool>, "note": "...",
                 "tolerance_kind": "relative" | "absolute" | "bound" | "qualitative",
                 "rule": "<the pass rule in words>"}, ...],
     "timings": {...}}
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import functools
import json
import math
import numbers
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from jaxtyping import ArrayLike

from .. import _paths
from .._checks import RealScalarLike

__all__ = [
    "BAR_POSITION",
    "MODES",
    "TOLERANCE_KINDS",
    "Experiment",
    "Option",
    "Steps",
    "check",
    "first_sentence",
    "progress",
    "tolerance_rule",
    "write_summary",
]

#: The line of this process's progress bars when ``run_experiments`` runs experiments in several
#: processes (set in each worker; None: tqdm's own placement).
BAR_POSITION: int | None = None


def progress(*args: Any, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, on this process's own line (``BAR_POSITION``) when
    experiments run concurrently."""
    from tqdm.auto import tqdm

    if BAR_POSITION is not None:
        kwargs.setdefault("position", BAR_POSITION)
    return tqdm(*args, **kwargs)


#: The sizes a run can have: ``--quick``, neither flag, ``--full`` (``run(quick=..., full=...)``).
MODES: tuple[str, ...] = ("quick", "default", "full")

_SAME: Any = type("_Same", (), {"__repr__": lambda self: "<as default>"})()


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting of an experiment: its value in each of ``MODES``, and what it is.

    ``default`` is the value of a run with neither ``quick`` nor ``full``; ``quick`` and ``full``
    are the default's unless given (an experiment without the papers' full sizes runs its default
    ones under ``--full``). An override (``run(**options)``) must have the declared value's
    ``kind``: a bool, an int, a float (an int is accepted), a str, a list (or tuple, or NumPy array),
    a dict.

    >>> Option(100, quick=8, doc="seeds").value("quick"), Option(100, quick=8).value("full")
    (8, 100)
    """

    default: Any
    quick: Any = _SAME
    full: Any = _SAME
    doc: str = ""

    def __post_init__(self) -> None:
        for mode in ("quick", "full"):
            v = getattr(self, mode)
            if v is not _SAME and not _accepts(self.kind, v):
                raise TypeError(
                    f"option's {mode} value {v!r} is not of its default's kind {self.kind}"
                )

    @property
    def kind(self) -> str:
        """The kind of the declared default (and of any value that replaces it)."""
        return _kind(self.default)

    def value(self, mode: str) -> Any:
        """The value in ``mode`` (a copy: a run may change its settings freely)."""
        v = getattr(self, mode)
        return copy.deepcopy(self.default if v is _SAME else v)


def _kind(value: object) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, numbers.Integral):
        return "int"
    if isinstance(value, numbers.Real):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim >= 1):
        return "list"
    if isinstance(value, Mapping):
        return "dict"
    raise TypeError(f"an option's value must be a bool, number, str, list or dict, got {value!r}")


def _accepts(kind: str, value: object) -> bool:
    try:
        got = _kind(value)
    except TypeError:
        return False
    return got == kind or (kind == "float" and got == "int")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What one ``meanfield reproduce`` experiment is, declared once in its module (``EXPERIMENT``).

    ``options``: its settings by name, in the order of ``summary.json["settings"]``; ``steps``: the
    parts of a run in order, each one tick of its progress bar and one entry of ``timings``, named
    ``step + timings_suffix`` (``"_s"`` in the experiments that first wrote their seconds so), except
    the ``untimed`` steps (whose parts time themselves); ``figures``: the files (in ``out_dir/<name>/``)
    that a run writes and its section of the report shows, each a figure of what its checks check
    (a run at some settings may add more).

    >>> E = Experiment("toy", {"n": Option(512, quick=64)}, steps=("run",))
    >>> E.settings(E.mode(quick=True, full=False))
    {'n': 64}
    >>> E.settings("default", m=1)
    Traceback (most recent call last):
    ...
    ValueError: unknown option 'm' for reproduce toy; accepted: n
    """

    name: str
    options: Mapping[str, Option]
    steps: tuple[str, ...]
    timings_suffix: str = ""
    untimed: tuple[str, ...] = ()
    figures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(set(self.steps)) != len(self.steps) or not set(self.untimed) <= set(self.steps):
            raise ValueError(
                f"reproduce {self.name}: steps must be distinct and include the untimed ones"
            )

    @staticmethod
    def mode(*, quick: bool, full: bool) -> str:
        """The entry of ``MODES`` that ``run(quick=..., full=...)`` asks for."""
        if quick and full:
            raise ValueError("choose at most one of quick and full")
        return "quick" if quick else "full" if full else "default"

    def settings(self, mode: str = "default", **options: Any) -> dict[str, Any]:
        """Every option's value in ``mode``, the given ``options`` in place of theirs.

        Raises:
            ValueError: an option that is not declared (naming it, the experiment and the accepted
                options), or a mode not in ``MODES``.
            TypeError: an option's value of another kind than the declared one.
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        unknown = [k for k in options if k not in self.options]
        if unknown:
            raise ValueError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for reproduce "
                f"{self.name}; accepted: {', '.join(sorted(self.options))}"
            )
        for k, v in options.items():
            if not _accepts(self.options[k].kind, v):
                raise TypeError(
                    f"option {k!r} of reproduce {self.name} must be {self.options[k].kind}, got {v!r}"
                )
        return {k: options[k] if k in options else o.value(mode) for k, o in self.options.items()}

    def describe(self) -> str:
        """The options, one line each: name, ``doc``, the default value and the ``quick`` and
        ``full`` ones that differ from it.

        >>> E = Experiment("toy", {"n": Option(512, quick=64, doc="particles")}, steps=("run",))
        >>> print(E.describe())
        n: particles (default 512; quick 64)
        """
        lines = []
        for k, o in self.options.items():
            shown = [f"default {o.default!r}"] + [
                f"{m} {o.value(m)!r}"
                for m in ("quick", "full")
                if repr(o.value(m)) != repr(o.default)
            ]
            lines.append(f"{k}: {o.doc or '(undocumented)'} ({'; '.join(shown)})")
        return "\n".join(lines)

    def start(self, *, quiet: bool = False) -> Steps:
        """The progress of a run through ``steps`` (``Steps``)."""
        return Steps(self, quiet=quiet)


class Steps:
    """A run's way through its experiment's declared steps: ``with steps("name") as part:`` times the
    step into ``timings``, names it on the progress bar and ticks the bar when it ends; ``part.update()``
    and ``part.set_postfix_str(text)`` say how far the step itself is. Steps come in declared order
    (one may be left out); ``close()`` ends the bar."""

    def __init__(self, experiment: Experiment, *, quiet: bool = False) -> None:
        self.experiment = experiment
        self.timings: dict[str, float] = {}
        self._next = 0
        self._bar = progress(total=len(experiment.steps), desc=experiment.name, disable=quiet)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[_Part]:
        E = self.experiment
        if name not in E.steps[self._next :]:
            raise ValueError(
                f"step {name!r} of reproduce {E.name} is not one of its next steps {E.steps[self._next :]}"
            )
        self._next = E.steps.index(name, self._next) + 1
        self._bar.set_postfix_str(name)
        t0 = time.perf_counter()
        yield _Part(self._bar, name)
        if name not in E.untimed:
            self.timings[name + E.timings_suffix] = round(time.perf_counter() - t0, 3)
        self._bar.update()

    def close(self) -> None:
        self._bar.close()


@runtime_checkable
class _Progress(Protocol):
    """What a part of a run ticks as it goes (a ``_Part``, or a stand-in in tests)."""

    def update(self, n: int = 1) -> None: ...


class _Part:
    """Progress within one step: its name and a count (or a text) after it on the bar."""

    def __init__(self, bar: Any, name: str) -> None:
        self._bar, self._name, self._count = bar, name, 0

    def update(self, n: int = 1) -> None:
        self._count += n
        self._bar.set_postfix_str(f"{self._name} {self._count}")

    def set_postfix_str(self, text: str) -> None:
        self._bar.set_postfix_str(f"{self._name}: {text}")


#: The kinds of tolerance a check row states (``check``'s ``tolerance_kind``): ``relative``
#: (``|measured - theory| <= tolerance |theory|``), ``absolute`` (``<= tolerance``), ``bound`` (a
#: measured error or quantity on one side of a number: ``|measured| <= tolerance`` against a
#: theory of 0, or ``measured < 0.01``) and ``qualitative`` (a prediction in words: a sign, an order,
#: a shape), whose rule is the row's ``rule``.
TOLERANCE_KINDS: tuple[str, ...] = ("relative", "absolute", "bound", "qualitative")


def check(
    name: str,
    measured: ArrayLike,
    theory: ArrayLike | None = None,
    tolerance: RealScalarLike = 0.0,
    note: str = "",
    *,
    relative: bool = False,
    passed: bool | Callable[[float], bool] | None = None,
    rule: str | None = None,
) -> dict[str, Any]:
    """One row of a summary's ``checks``.

    ``pass`` is ``|measured - theory| <= tolerance`` (times ``|theory|`` when
    ``relative``) when ``theory`` is a number; when ``theory`` is ``None`` the
    caller supplies ``passed`` (a bool, or a predicate on ``measured``) that
    states the paper's qualitative prediction (e.g. ``> 0``), and says it in
    ``note``.

    The row also says what kind of tolerance it is (``tolerance_kind``, one of ``TOLERANCE_KINDS``)
    and its rule in words (``rule``), derived from the comparison: relative or absolute from
    ``relative``, a bound for a theory of 0 (a measured error) or a predicate ``measured < c``
    (``c != 0``), qualitative otherwise. A qualitative rule is ``rule`` when given, else the
    predicate's own text (``lambda v: v > 0`` reads ``measured > 0``, its other names replaced by
    their numbers), else the note's ``pass: ...`` phrase, else the note's first sentence.

    >>> r = check("gap", 0.4, None, note="the gap opens; pass: gap > 0", passed=0.4 > 0)
    >>> r["tolerance_kind"], r["rule"]
    ('qualitative', 'gap > 0')
    >>> check("rate", 2.1, 2.0, 0.1, relative=True)["rule"]
    'within 10% of theory'
    """
    m = _num(measured)
    t = None if theory is None else _num(theory)
    if passed is not None:
        ok = bool(passed(m)) if callable(passed) else bool(passed)
    elif t is None:
        raise ValueError(f"check {name!r}: theory is None, so pass a predicate `passed`")
    else:
        scale = abs(t) if relative else 1.0
        ok = bool(math.isfinite(m) and abs(m - t) <= tolerance * scale)
    kind, words = _tolerance_rule(t, float(tolerance), relative, passed, note)
    return {
        "name": name,
        "theory": t,
        "measured": m,
        "tolerance": float(tolerance),
        "pass": ok,
        "note": note,
        "tolerance_kind": kind,
        "rule": rule if rule is not None else words,
    }


def tolerance_rule(row: Mapping[str, Any]) -> tuple[str, str]:
    """``(tolerance_kind, rule)`` of a check row: its own fields, or for a row written before they
    existed, derived from its theory and tolerance (a relative one cannot be told from an absolute
    one there: it reads absolute) and its note."""
    if row.get("tolerance_kind") in TOLERANCE_KINDS and row.get("rule"):
        return row["tolerance_kind"], row["rule"]
    theory = row.get("theory")
    passed = None if theory is not None else bool(row.get("pass"))
    return _tolerance_rule(
        theory, float(row.get("tolerance") or 0.0), False, passed, row.get("note", "")
    )


def _tolerance_rule(
    theory: float | None,
    tolerance: float,
    relative: bool,
    passed: bool | Callable[[float], bool] | None,
    note: str,
) -> tuple[str, str]:
    if theory is not None:
        if relative:
            kind, words = "relative", f"within {100 * tolerance:.3g}% of theory"
        elif theory == 0.0:
            kind, words = "bound", f"|measured| <= {tolerance:.3g}"
        else:
            kind, words = "absolute", f"within {tolerance:.3g} of theory"
        if callable(passed):  # the caller's own comparison, one-sided: its text
            text, _ = _predicate_text(passed)
            if text is not None:
                return kind if kind == "relative" else "bound", text
        if passed is not None:  # the caller's own rule around the comparison (a band, s.e.)
            stated = _rule_in_note(note)
            if stated and _PASS_ALSO.search(note):
                words = f"{words} and {stated}"
            elif stated:
                words = stated
        return kind, words
    if callable(passed):
        text, threshold = _predicate_text(passed)
        if text is not None:  # a comparison with a number is a bound, with 0 a sign (qualitative)
            return ("bound" if threshold not in (None, 0.0) else "qualitative"), text
    return "qualitative", _rule_in_note(note) or first_sentence(note)[0] or "see the note"


_PASS_PHRASE = re.compile(r"\b[Pp]ass(?:\s*[:=]|\s+also\s+needs)\s*(.+?)(?:;\s|\.\s+[A-Z(]|\.?$)")
_PASS_ALSO = re.compile(r"\b[Pp]ass\s+also\s+needs\b")


def _rule_in_note(note: str) -> str | None:
    """The rule a note states as ``pass: ...`` or ``pass = ...`` (to the end of its sentence)."""
    m = _PASS_PHRASE.search(note)
    if not m:
        return None
    words, opened = m.group(1).strip(), []
    for i, ch in enumerate(words):
        if ch == "(":
            opened.append(i)
        elif ch == ")":
            if not opened:  # the note's own bracket around the phrase closes here
                return words[:i].rstrip()
            opened.pop()
    return words[: opened[0]].rstrip() if opened else words  # cut before a bracket left open


_SENTENCE_END = re.compile(r"(?<![a-z]\.[a-z])(?<!\be\.g)(?<!\bi\.e)(?<!\bcf)[.;]\s+(?=[A-Za-z(])")


def first_sentence(note: str, limit: int = 160) -> tuple[str, str]:
    """A note as ``(its first sentence, the rest)``: split at the first ``. `` or ``; `` before a
    word outside brackets, and at a space before ``limit`` characters when the sentence is longer (the
    cut marked with an ellipsis; the rest carries on from it).

    >>> first_sentence("max |x - y| over runs (n = 6; beta 4); run: seed 1. More.")
    ('max |x - y| over runs (n = 6; beta 4)', 'run: seed 1. More.')
    """
    note = " ".join(note.split())
    m = next(  # the first end outside brackets
        (m for m in _SENTENCE_END.finditer(note) if _depth(note[: m.start()]) == 0), None
    )
    head, rest = (note[: m.start()], note[m.end() :]) if m else (note, "")
    if len(head) > limit:
        cut = head.rfind(" ", 0, limit)
        cut = cut if cut > limit // 2 else limit
        head, rest = head[:cut].rstrip(" ,") + " …", "… " + note[cut:].lstrip()
    return head, rest


def _depth(text: str) -> int:
    return sum(text.count(o) - text.count(c) for o, c in ("()", "[]", "{}"))


def _predicate_text(fn: Callable[[float], bool]) -> tuple[str | None, float | None]:
    """A lambda predicate as words (``lambda v: v > tol["x"]`` -> ``"measured > 0.05"``), its names
    other than the argument replaced by their numbers, and the number it compares ``measured`` with
    when it is one comparison (else None). ``(None, None)`` when its source cannot be read."""
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__name__", "") != "<lambda>":
        return None, None
    try:
        tree = _module_ast(code.co_filename)
    except (OSError, SyntaxError):
        return None, None
    found = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Lambda)
        and n.lineno == code.co_firstlineno
        and [a.arg for a in n.args.args] == list(code.co_varnames[: code.co_argcount])
    ]
    if len(found) != 1 or not found[0].args.args:
        return None, None
    arg = found[0].args.args[0].arg
    env = dict(fn.__globals__)
    env.update(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    defaults = fn.__defaults__ or ()
    names = [a.arg for a in found[0].args.args]
    env.update(zip(names[len(names) - len(defaults) :], defaults))
    body = _numbers_for_names(copy.deepcopy(found[0].body), arg, env)  # the cached tree stays
    threshold = None
    if (
        isinstance(body, ast.Compare)
        and len(body.ops) == 1
        and isinstance(body.left, ast.Name)
        and body.left.id == arg
        and isinstance(body.comparators[0], ast.Constant)
        and isinstance(body.comparators[0].value, (int, float))
    ):
        threshold = float(body.comparators[0].value)
    text = ast.unparse(body)
    return re.sub(rf"\b{re.escape(arg)}\b", "measured", text), threshold


@functools.lru_cache(maxsize=32)
def _module_ast(filename: str) -> ast.Module:
    return ast.parse(Path(filename).read_text())


def _numbers_for_names(node: ast.expr, arg: str, env: Mapping[str, Any]) -> ast.expr:
    """``node`` with each largest part that does not use ``arg`` and is a number replaced by it."""
    uses_arg = any(isinstance(n, ast.Name) and n.id == arg for n in ast.walk(node))
    if not uses_arg and not isinstance(node, ast.Constant):
        try:
            value = eval(compile(ast.Expression(node), "<rule>", "eval"), dict(env))  # noqa: S307
        except Exception:  # noqa: BLE001 -- not a closed expression: kept as written
            value = None
        if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
            return ast.Constant(float(f"{float(value):.4g}"))
    for field, old in ast.iter_fields(node):
        if isinstance(old, ast.expr):
            setattr(node, field, _numbers_for_names(old, arg, env))
        elif isinstance(old, list):
            setattr(
                node,
                field,
                [_numbers_for_names(v, arg, env) if isinstance(v, ast.expr) else v for v in old],
            )
    return node


def _num(x: ArrayLike) -> float:
    return float(np.asarray(x, dtype=np.float64))


def write_summary(
    out_dir: Path | str,
    experiment: str,
    *,
    quick: bool,
    settings: Mapping[str, Any],
    checks: list[dict[str, Any]],
    timings: Mapping[str, Any] | None = None,
    figures: list[str] | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/summary.json`` and return the summary dict."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {
        "experiment": experiment,
        "quick": bool(quick),
        "settings": _jsonable(settings),
        "checks": checks,
        "timings": _jsonable(timings or {}),
        "figures": figures or [],
    }
    _paths.write_output(
        out_dir / "summary.json", json.dumps(summary, indent=2, allow_nan=True), "summary"
    )
    return summary


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array__"):
        arr = np.asarray(obj)
        return arr.tolist() if arr.ndim else arr.item()
    if isinstance(obj, (np.generic,)):
        return obj.item()
    return obj
