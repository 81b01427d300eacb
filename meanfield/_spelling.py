"""How each surface spells a setting in its messages (no JAX: the command line imports it).

A rule is defined once (a method of a model or a variant: ``mf.steps.StepRule.check``) and its
message names the settings through a ``Say``, ``say(key, value) -> str``: from Python
``step='renormalize'``, in a sweep spec ``time.step = 'renormalize'`` (the key under its table),
on the command line ``--step renormalize``. The text is the rule's; only the spelling differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Say", "say_python", "say_cli", "say_spec", "SPEC_TABLES", "solver_refusal"]

#: ``say(key, value)``: the setting ``key = value`` as a surface spells it.
Say = Callable[[str, Any], str]

#: The table of a sweep spec each run setting lives in (``[time]``; the model's are ``[model]``).
SPEC_TABLES: Mapping[str, str] = {"step": "time", "solver": "time"}


def say_python(key: str, value: Any) -> str:
    """``key=value!r``: a keyword argument (``step='renormalize'``)."""
    return f"{key}={value!r}"


def say_cli(key: str, value: Any) -> str:
    """``--key value``: a flag of ``meanfield simulate`` (``--step renormalize``)."""
    return f"--{key.replace('_', '-')} {value}"


def say_spec(key: str, value: Any) -> str:
    """``table.key = value!r``: a key of a sweep spec (``time.step = 'renormalize'``,
    ``model.normalization = 'pre'``)."""
    return f"{SPEC_TABLES.get(key, 'model')}.{key} = {value!r}"


def solver_refusal(
    step: str, solvers: tuple[str, ...], solver: str, update: str, say: Say = say_python
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
