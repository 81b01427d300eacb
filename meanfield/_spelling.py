"""How each surface spells a setting in its messages, and the rules several surfaces check (no
JAX: the command line checks its flags with them before it imports JAX).

A rule is defined once (a function here, or a method of a variant that calls one:
``mf.steps.StepRule.check``) and its message names the settings through a ``Spelling``: from
Python ``step='renormalize'`` and ``n``, in a sweep spec ``time.step = 'renormalize'`` and
``grid.n`` (the key under its table), on the command line ``--step renormalize`` and ``--n``. The
text is the rule's; only the spelling differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "Spelling",
    "Say",
    "say_python",
    "say_cli",
    "say_spec",
    "SPEC_TABLES",
    "SPEC_KEYS",
    "CLI_KEYS",
    "solver_refusal",
    "size_problem",
    "early_stop_problem",
    "radius_problem",
    "pair_problem",
    "PAIR_WORDS",
    "applies_problem",
    "show_value",
]


class Spelling:
    """A surface's spelling: ``name(key)`` (``"n"``, ``"grid.n"``, ``"--n"``) and, called,
    ``(key, value)`` as a setting (``"step='renormalize'"``, ``"time.step = 'renormalize'"``,
    ``"--step renormalize"``)."""

    def __init__(self, name: Callable[[str], str], setting: Callable[[str, Any], str]) -> None:
        self._name, self._setting = name, setting

    def name(self, key: str) -> str:
        """The setting ``key`` as this surface names it."""
        return self._name(key)

    def __call__(self, key: str, value: Any) -> str:
        return self._setting(key, value)


#: What the rules take: a ``Spelling``.
Say = Spelling

#: The table of a sweep spec each setting lives in (the model's parameters are ``[model]``'s).
SPEC_TABLES: Mapping[str, str] = {
    **dict.fromkeys(
        ("t1", "dt", "solver", "ts", "rtol", "atol", "early_stop", "max_steps"), "time"
    ),
    "step": "time",
    "n": "grid",
    "d": "grid",
}
#: Settings a surface names differently from Python's keyword (the save times: ``time.save`` in a
#: spec, whose list or count they are; ``--saves`` on the command line, their count).
SPEC_KEYS: Mapping[str, str] = {"ts": "save"}
CLI_KEYS: Mapping[str, str] = {"ts": "saves"}


def _flag(key: str) -> str:
    return "--" + CLI_KEYS.get(key, key).replace("_", "-")


def _spec_key(key: str) -> str:
    return f"{SPEC_TABLES.get(key, 'model')}.{SPEC_KEYS.get(key, key)}"


#: Python: ``key=value!r``, a keyword argument (``step='renormalize'``).
say_python = Spelling(lambda key: key, lambda key, value: f"{key}={value!r}")
#: The command line: ``--key value``, a flag of ``meanfield simulate`` (``--step renormalize``).
say_cli = Spelling(_flag, lambda key, value: f"{_flag(key)} {value}")
#: A sweep spec: ``table.key = value!r`` (``time.step = 'renormalize'``, ``model.normalization = 'pre'``).
say_spec = Spelling(_spec_key, lambda key, value: f"{_spec_key(key)} = {value!r}")


def solver_refusal(
    step: str, solvers: tuple[str, ...], solver: str, update: str, say: Spelling = say_python
) -> str | None:
    """The refusal of step rule ``step`` (defined for ``solvers`` only; ``update`` in words) with
    ``solver``, or None when it takes it: ``mf.steps.StepRule.check``'s text, which the command
    line gives from its JAX-free copy of the rules (``meanfield._cli_schema.STEP_SOLVERS``).

    Example:
        >>> print(solver_refusal("renormalize", ("euler",), "rk2", "x + h F(x), then normalise", say_cli))
        --step renormalize needs --solver euler, not --solver rk2 (its update: x + h F(x), then normalise)
    """
    if solver in solvers:
        return None
    allowed = " or ".join(say("solver", s) for s in solvers)
    return (
        f"{say('step', step)} needs {allowed}, not {say('solver', solver)} (its update: {update})"
    )


def size_problem(
    params: Mapping[str, Any],
    *,
    n: int | None = None,
    d: int | None = None,
    required_d: int | None = None,
    model: str = "",
    say: Spelling = say_python,
) -> str | None:
    """The first rule a model's parameters ``params`` break at ``n`` tokens in dimension ``d``
    (either None: not checked), or None: the dimension the model needs (``required_d``, the
    model's ``required_dimension()``; ``model`` its name), the ``plane`` of a rotation (indices
    ``< d``), and ``prompts`` (one block of particles per prompt: ``<= n``). The registry
    (``mf.kernels.make``), a sweep spec (at the smallest ``grid.n`` and ``grid.d``) and the command
    line (before JAX is imported) give these texts.

    Example:
        >>> size_problem({"prompts": 5}, n=4, say=say_cli)
        '--prompts must be <= --n = 4 (one block of particles per prompt), got 5'
        >>> size_problem({"plane": (0, 3)}, d=3, say=say_spec)
        'model.plane [0, 3] needs indices < grid.d = 3'
    """
    if d is not None and required_d is not None and d != required_d:
        return f"model {model!r} needs {say('d', required_d)}, got {say('d', d)}"
    plane: Sequence[int] | None = params.get("plane")
    if d is not None and plane is not None and max(plane) >= d:
        return f"{say.name('plane')} {list(plane)} needs indices < {say.name('d')} = {d}"
    prompts = params.get("prompts")
    if n is not None and prompts is not None and prompts > n:
        return (
            f"{say.name('prompts')} must be <= {say.name('n')} = {n} (one block of particles per "
            f"prompt), got {prompts}"
        )
    return None


def early_stop_problem(what: str, early_stop: Any, say: Spelling = say_python) -> str | None:
    """The refusal of an energy-plateau stop ``early_stop`` in a run with ``what`` (a setting as
    the surface spells it: ``noise='independent'``, ``--frequencies gaussian``), whose energy the
    flow no longer increases, or None without a stop: the one text of ``mf.noise.Noise.check`` and
    ``mf.frequencies.check_run``, from Python, a spec and the command line.

    Example:
        >>> print(early_stop_problem("--noise common", 1e-6, say_cli))
        --early-stop 1e-06 stops a run whose energy is stationary (the flow increases it): not with --noise common
    """
    if early_stop is None:
        return None
    return (
        f"{say('early_stop', early_stop)} stops a run whose energy is stationary (the flow "
        f"increases it): not with {what}"
    )


def radius_problem(
    scheme: str | None, radial: Sequence[str], model: str, say: Spelling = say_python
) -> str:
    """The refusal of an initial radius ``r0`` for a model whose tokens carry none: the model's
    normalisation ``scheme`` (its name; None: the model takes no normalisation, ``model`` names it
    as the surface does) is not among ``radial``, the schemes with a radius
    (``mf.normalization.radial_names()``; the caller decides by the scheme's own fact,
    ``Scheme.radial``). The one text of ``mf.simulate``, a phase diagram and ``meanfield simulate
    --r0``.

    Example:
        >>> print(radius_problem("post", ("pre", "mix", "peri"), "SelfAttention"))
        r0 is the initial radius of the schemes with one (normalization='pre', normalization='mix' or normalization='peri'), not normalization='post'
        >>> print(radius_problem(None, ("pre", "mix", "peri"), "--kernel toeplitz", say_cli))
        --r0 is the initial radius of the schemes with one (--normalization pre, --normalization mix or --normalization peri); --kernel toeplitz takes no --normalization
    """
    names = [say("normalization", r) for r in radial]
    alternatives = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    head = f"{say.name('r0')} is the initial radius of the schemes with one ({alternatives})"
    if scheme is None:
        return f"{head}; {model} takes no {say.name('normalization')}"
    return f"{head}, not {say('normalization', scheme)}"


#: The variant pairs' words (``pair_problem``): member key -> (scale key, ``is_what``, ``whose``,
#: ``bound``), the noise (``mf.noise``) and the frequency laws (``mf.frequencies``).
PAIR_WORDS: Mapping[str, tuple[str, str, str, str]] = {
    "noise": ("sigma", "the amplitude of a noise", "the noise's amplitude", ">= 0"),
    "frequencies": ("spread", "the scale of a frequency law", "the law's scale", "> 0"),
}


def pair_problem(
    choice_key: str,
    choice: Any,
    choices: Sequence[str],
    scale_key: str,
    scale: Any,
    *,
    is_what: str,
    whose: str,
    bound: str,
    listable: bool = False,
    say: Spelling = say_python,
) -> str | None:
    """The refusal of half of a variant family's pair, or None: a member ``choice`` (``noise``,
    ``frequencies``; one of ``choices``) given without its scale (``sigma``, ``spread``: a number
    ``bound``, e.g. ``">= 0"``; ``listable``: or a list, a grid axis), or the scale without a
    member. The one text of ``mf.phase_diagram.sa_phase_diagram``, a spec's ``[model]`` and
    ``meanfield simulate`` (``is_what``, ``whose`` word it: ``"the amplitude of a noise"``,
    ``"the noise's amplitude"``).

    Example:
        >>> kw = dict(is_what="the amplitude of a noise", whose="the noise's amplitude", bound=">= 0")
        >>> print(pair_problem("noise", None, ("independent", "common"), "sigma", 0.1, say=say_cli, **kw))
        --sigma 0.1 is the amplitude of a noise: it applies with --noise independent or --noise common
        >>> print(pair_problem("noise", "common", ("independent", "common"), "sigma", None, **kw))
        noise='common' needs sigma, the noise's amplitude (a number >= 0)
    """
    if (choice is None) == (scale is None):
        return None
    if choice is None:
        return f"{say(scale_key, scale)} is {is_what}: it applies with " + " or ".join(
            say(choice_key, c) for c in choices
        )
    return f"{say(choice_key, choice)} needs {say.name(scale_key)}, {whose} (a number {bound}" + (
        ", or a list: a grid axis)" if listable else ")"
    )


def show_value(value: Any) -> str:
    """``value`` as a message shows it: ``repr``, NumPy and 0-d array scalars as their Python value
    (``2.0``, not ``Array(2., dtype=float32)``); a traced value as its ``repr``."""
    if (
        not isinstance(value, (int, float, str))
        and getattr(value, "shape", None) == ()
        and hasattr(value, "item")
    ):
        try:
            return repr(value.item())
        except Exception:  # a tracer: no value
            return repr(value)
    return repr(value)


def applies_problem(
    key: str,
    value: Any,
    needs: Sequence[tuple[str, Sequence[Any]]],
    current: Mapping[str, Any],
    *,
    owner: str = "",
    axes: Sequence[str] = (),
    say: Spelling = say_python,
) -> str | None:
    """The refusal of a setting ``key = value`` that acts only with other settings' values, or
    None when it acts: ``needs`` the rules it declares (``(switch, values)`` pairs,
    ``meanfield._params.Param.applies``; nGPT's ``alpha`` with ``normalization = 'ngpt'``, ALiBi's
    ``slope`` with ``mask = 'alibi'``), ``current`` the switches' values (a switch missing from it
    is not checked; no switch known: None). Whether the setting was given (the command line: a
    flag given at all; a model, the registry and a spec: a value away from its default) is the
    caller's to decide. ``owner``: the model's class name, for the words "would not use it".
    ``axes``: the switches whose ``current`` value is a list of values (a sweep's static axis),
    none of which it acts with.
    The one text of a model's constructor (``mf.models.SelfAttention(alpha=0.5)``), a variant's
    (``mf.normalization.Scheme.coerce``), the registry (``mf.kernels.make``), a sweep spec's
    ``[model]`` and the command line's flags.

    Example:
        >>> print(applies_problem("slope", 2.0, [("mask", ("alibi",))], {"mask": "none"}, say=say_cli))
        --slope = 2.0 applies with --mask = 'alibi', not 'none'
        >>> print(applies_problem("alpha", 0.5, [("normalization", ("ngpt",))], {"normalization": "post"},
        ...                       owner="SelfAttention", say=say_spec))
        model.alpha = 0.5 applies with model.normalization = 'ngpt', not 'post' (SelfAttention would not use it)
    """
    known = [(switch, tuple(vs)) for switch, vs in needs if switch in current]
    lists = [s for s, _ in known if s in axes]
    if not known or any(current[s] in vs for s, vs in known if s not in lists):
        return None
    if any(v in vs for s, vs in known if s in lists for v in current[s]):
        return None
    rule = " or ".join(f"{say.name(s)} = " + " or ".join(repr(v) for v in vs) for s, vs in known)
    if lists:  # a static axis of a sweep: none of its values
        axis = " and ".join(f"{say.name(s)} = {current[s]!r}" for s in lists)
        return (
            f"{say.name(key)} = {show_value(value)} applies with {rule}; no value of {axis} is one"
        )
    now = (
        repr(current[known[0][0]])
        if len(known) == 1
        else " and ".join(f"{say.name(s)} = {current[s]!r}" for s, _ in known)
    )
    return f"{say.name(key)} = {show_value(value)} applies with {rule}, not {now}" + (
        f" ({owner} would not use it)" if owner else ""
    )
