r"""Where the tokens live: on the sphere (the projected flow) or in $\mathbb R^d$ (no projection).

``mf.models.SelfAttention(geometry=)`` takes a ``Geometry``: ``Sphere()`` (the default: unit tokens,
the velocity $P_{x_i} F_i$, the layer-norm schemes of ``mf.normalization``) or ``Euclidean()``
(Geshkovski, Letrouit, Polyanskiy, Rigollet 2023: tokens in $\mathbb R^d$, $\dot x_i = F_i(x)$, no
projection, no layer norm). The names ``"sphere"`` and ``"euclidean"`` stay accepted everywhere
(``geometry="euclidean"``, ``--geometry euclidean``, a sweep's ``model.geometry``). A geometry
holds its facts: ``on_sphere`` (unit tokens, a projected velocity, an energy on the sphere) and
what it refuses (``check_scheme``; a step rule that ends on the unit sphere refuses a geometry
without one: ``mf.steps.StepRule.check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ._declare import Variant
from ._spelling import Spelling, say_python

__all__ = ["Geometry", "Sphere", "Euclidean", "GEOMETRIES", "SPHERE_OBSERVABLES", "geometry_of"]

#: Observables defined for tokens on the sphere only: the pair energy (and its plateaus), the cluster
#: counts (``mf.metrics.num_clusters`` at a chordal threshold between unit tokens, the first merge,
#: the final count) and the order parameter ``|(1/n) sum_i x_i|`` of unit tokens. A geometry without
#: unit tokens refuses them (``Geometry.observables_problem``).
SPHERE_OBSERVABLES = (
    "energy",
    "num_plateaus",
    "clusters",
    "first_merge_time",
    "final_clusters",
    "order_parameter",
)


class Geometry(Variant):
    """The space of the tokens: the base of ``Sphere`` and ``Euclidean`` (a model's ``geometry``).

    Example:
        >>> import meanfield as mf
        >>> mf.models.SelfAttention(1.0, geometry="euclidean").geometry
        Euclidean()
    """

    flat_name: ClassVar[str | None] = "geometry"
    what: ClassVar[str] = "geometry"
    #: Unit tokens, the velocity projected on the tangent space, an energy on the sphere.
    on_sphere: ClassVar[bool] = True

    def check_scheme(self, scheme: Any) -> None:
        """``ValueError`` for a layer-norm scheme (``mf.normalization.Scheme``) the geometry cannot run."""

    @classmethod
    def observables_problem(cls, names: Sequence[str], say: Spelling = say_python) -> str | None:
        """Why this geometry has no value of the first of the observables ``names``, or None: a
        geometry without unit tokens (``on_sphere`` False) has none of ``SPHERE_OBSERVABLES``. The
        text of a sweep spec's refusal of ``output.observables`` (``say``: its spelling); the
        command line records none of them for such a geometry (it asks ``on_sphere``).

        Example:
            >>> import meanfield as mf
            >>> print(mf.geometry.Euclidean.observables_problem(["collapse_gap", "clusters"]))
            'clusters' is an observable of tokens on the sphere; geometry='euclidean' (tokens in R^d) records collapse_gap (of the directions x / |x|) and the attention observables, not energy, num_plateaus, clusters, first_merge_time, final_clusters, order_parameter
        """
        bad = [o for o in names if o in SPHERE_OBSERVABLES]
        if cls.on_sphere or not bad:
            return None
        return (
            f"{bad[0]!r} is an observable of tokens on the sphere; {say('geometry', cls.name)} "
            "(tokens in R^d) records collapse_gap (of the directions x / |x|) and the attention "
            f"observables, not {', '.join(SPHERE_OBSERVABLES)}"
        )

    def check_step(self, step: Any) -> None:
        """``ValueError`` for a step rule of ``mf.simulate`` (a ``mf.steps.StepRule`` or its name)
        the geometry cannot run: a rule that ends each step on the unit sphere needs one (the
        rule's own check, ``StepRule.check(geometry=)``)."""
        from .steps import StepRule

        StepRule.coerce(step).check(geometry=self)


@Geometry.builtin
class Sphere(Geometry):
    """Tokens on the unit sphere $S^{d-1}$: the projected flow (the default)."""

    name: ClassVar[str | None] = "sphere"


@Geometry.builtin
class Euclidean(Geometry):
    r"""Tokens in $\mathbb R^d$: $\dot x_i = F_i(x)$, no projection, no layer norm (Post-LN only)."""

    name: ClassVar[str | None] = "euclidean"
    on_sphere: ClassVar[bool] = False

    def check_scheme(self, scheme: Any) -> None:
        """Only the Post-LN flow (``scheme.post_ln``): R^d has no layer norm."""
        if not scheme.post_ln:
            raise ValueError(
                f"geometry='euclidean' has no layer norm: normalization={scheme.name!r} needs "
                f"geometry='sphere' (normalization='post' is the default)"
            )


#: The built-in geometries' names (``Geometry.names()`` adds registered ones).
GEOMETRIES = Geometry.names()

_SPHERE = Sphere()


def geometry_of(model: Any) -> Geometry:
    """The geometry of ``model``: its ``geometry`` field, the sphere for a model without one.

    Example:
        >>> import meanfield as mf
        >>> geometry_of(mf.kernels.USA(1.0)).on_sphere
        True
    """
    geometry = getattr(model, "geometry", None)
    if geometry is None:
        return _SPHERE
    return Geometry.coerce(geometry, type(model).__name__)  # a name: a model of another package
