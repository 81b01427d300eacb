r"""Step rules: how a fixed step of the flow on the sphere ends (``mf.simulate(step=)``).

A ``StepRule`` holds what the engine needs to know about a rule: whether the solver integrates
the tangent field $P_x F$ (``tangent``), the solvers the rule is defined for (``solvers``), and
what it refuses (``check``). Two rules are built in:

- ``Projected()`` (``"projected"``, the default): every solver integrates the tangent field,
  and each fixed step ends with the radial projection, $x \leftarrow \operatorname{normalize}(x +
  h P_x F(x))$ for Euler; tokens with a radius (``mf.normalization.RADIAL``) and tokens in
  $\mathbb R^d$ (``mf.geometry.Euclidean``) integrate their own field, unprojected where it has no
  sphere.
- ``Renormalize()`` (``"renormalize"``): the published simulation code's Euler update
  (github.com/borjanG/2023-transformers-rotf), $x \leftarrow \operatorname{normalize}(x + h F(x))$
  with the unprojected field: the projected step of length $h / (1 + h \langle F_i, x_i\rangle)$
  per particle, the same flow to first order, not the same numbers (docs/math/particles.md). It
  puts every token back on the unit sphere, so a scheme whose tokens carry a radius and tokens in
  $\mathbb R^d$ refuse it.

The names stay accepted everywhere (``step="renormalize"``, ``--step renormalize``, a sweep's
``time.step``), converted once by ``StepRule.coerce``. A rule's refusals are one text with the
setting spelled as the caller's surface spells it (``say``: ``step='renormalize'`` from Python,
``time.step = 'renormalize'`` in a sweep spec, ``--step renormalize`` on the command line).

Example:
    >>> import meanfield as mf
    >>> rule = mf.steps.StepRule.coerce("renormalize")
    >>> rule, rule.tangent, rule.solvers
    (Renormalize(), False, ('euler',))
    >>> try:
    ...     rule.check(solver="rk2")
    ... except ValueError as e:
    ...     print(e)
    step='renormalize' needs solver='euler', not solver='rk2' (its update: x + h F(x), then normalise)
"""

from __future__ import annotations

from typing import Any, ClassVar

from ._declare import Variant
from ._spelling import Say, say_python, solver_refusal

__all__ = ["StepRule", "Projected", "Renormalize", "STEPS", "step_solvers"]


class StepRule(Variant):
    """How a fixed step ends: the base of ``Projected`` and ``Renormalize`` (``mf.simulate(step=)``).

    Example:
        >>> import meanfield as mf
        >>> [mf.steps.StepRule.coerce(s).tangent for s in mf.steps.STEPS]
        [True, False]
    """

    flat_name: ClassVar[str | None] = "step"
    what: ClassVar[str] = "step rule"
    #: The solver integrates the tangent field $P_x F$ (True); False: the unprojected field $F$, and
    #: each step ends on the unit sphere (so tokens with a radius or in R^d cannot take the rule).
    tangent: ClassVar[bool] = True
    #: The solvers the rule is defined for (names of ``mf.integrate.SOLVERS``); None: every one.
    solvers: ClassVar[tuple[str, ...] | None] = None
    #: The update in words, for messages.
    update: ClassVar[str] = "x + h P_x F(x), then normalise"

    def check(
        self,
        *,
        solver: str | None = None,
        scheme: Any = None,
        geometry: Any = None,
        say: Say = say_python,
    ) -> None:
        """``ValueError`` (one line) when the rule cannot run with ``solver`` (a name), ``scheme``
        (a ``mf.normalization.Scheme``) or ``geometry`` (a ``mf.geometry.Geometry``); ``say(key,
        value)`` spells a setting as the caller's surface does (``meanfield._spelling``).

        Example:
            >>> import meanfield as mf
            >>> try:
            ...     mf.steps.Renormalize().check(scheme=mf.normalization.Pre())
            ... except ValueError as e:
            ...     print(e)
            step='renormalize' renormalises to the sphere; normalization='pre' has a radius: use step='projected'
        """
        name = say("step", self.name)
        if solver is not None and self.solvers is not None:
            problem = solver_refusal(self.name, self.solvers, solver, self.update, say)  # type: ignore[arg-type]
            if problem is not None:
                raise ValueError(problem)
        if self.tangent:
            return
        use = " or ".join(say("step", s) for s in _tangent_names())
        if scheme is not None and scheme.radial:
            raise ValueError(
                f"{name} renormalises to the sphere; {say('normalization', scheme.name)} has a "
                f"radius: use {use}"
            )
        if geometry is not None and not geometry.on_sphere:
            raise ValueError(
                f"{name} renormalises to the sphere; {say('geometry', geometry.name)} has no "
                f"sphere: use {use}"
            )


@StepRule.builtin
class Projected(StepRule):
    r"""Every solver integrates the tangent field $P_x F$; fixed steps end with $x / \|x\|$ (the default)."""

    name: ClassVar[str | None] = "projected"


@StepRule.builtin
class Renormalize(StepRule):
    r"""The published Euler update $x \leftarrow \operatorname{normalize}(x + h F(x))$ (Euler only)."""

    name: ClassVar[str | None] = "renormalize"
    tangent: ClassVar[bool] = False
    solvers: ClassVar[tuple[str, ...] | None] = ("euler",)
    update: ClassVar[str] = "x + h F(x), then normalise"


def _tangent_names() -> tuple[str, ...]:
    return tuple(n for n in StepRule.names() if StepRule.lookup(n).tangent)


#: The built-in step rules' names (``StepRule.names()`` adds registered ones).
STEPS = StepRule.names()


def step_solvers(builtin: bool = False) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """``((rule name, solvers, update), ...)`` for the rules defined for some solvers only: the
    command line's copy (``meanfield._cli_schema.STEP_SOLVERS``) refuses ``--step`` with a
    ``--solver`` it does not take before JAX is imported, in the rule's words; ``builtin``:
    meanfield's own rules only.

    Example:
        >>> step_solvers()
        (('renormalize', ('euler',), 'x + h F(x), then normalise'),)
    """
    names = StepRule.builtin_names() if builtin else StepRule.names()
    rules = [StepRule.lookup(n) for n in names]
    return tuple((r.name, tuple(r.solvers), r.update) for r in rules if r.solvers is not None)  # type: ignore[misc]
