"""The declaration of parameters, and of variants: what a model's fields say about themselves.

``param`` declares a field of a Module (a model, a part of a model, a variant): its accepted range,
doc, default, traced or static. ``Declared`` is the base of every Module declared this way (checked
on construction). ``Variant`` is the base of the interchangeable parts of a model that used to be
strings (``mf.normalization.Scheme``: Post-, Pre-, Mix-, Peri-LN, nGPT, LN-scaling;
``mf.attention_kinds``... ): a family is an abstract subclass naming its flat parameter
(``flat_name = "normalization"``); its members are registered under a ``name`` and hold their own
parameters (nGPT's ``alpha``) and facts (methods). A model field declared with a family as its kind
(``param(Post(), kind=Scheme, ...)``) shows to the registry, the command line and a sweep as flat
parameters: the member's name (a choice among the registered names) and the union of the members'
parameters, each declaring the members it applies with (``meanfield._params.Param.applies``).

This module knows no model: ``meanfield.models`` and the variant modules import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar, TypeVar

import equinox as eqx
import numpy as np

from ._checks import check_scalar, is_concrete
from ._params import PARAM_KINDS, Param, check_float, check_value
from ._spelling import applies_problem

__all__ = [
    "FAMILIES",
    "builtin_view",
    "param",
    "declared_params",
    "Declared",
    "Variant",
]

_DECLARATION = "meanfield.param"


@dataclasses.dataclass(frozen=True)
class _Declaration:
    kind: Any  # a PARAM_KINDS name, or an equinox.Module class whose parameters are this field's
    doc: str
    choices: tuple
    optional: bool = False
    maximum: int | None = None
    applies: tuple = ()


def param(
    default: Any = dataclasses.MISSING,
    *,
    kind: Any,
    doc: str,
    static: bool = False,
    choices: Iterable[Any] = (),
    optional: bool = False,
    maximum: int | None = None,
    applies: tuple = (),
    **field_kwargs: Any,
) -> Any:
    """Declare a model parameter as a field: its accepted range ``kind``, ``doc``, ``default`` and
    whether it is ``static`` (part of the compiled program) or traced (a PyTree leaf, a sweep axis).

    ``kind`` is one of ``meanfield._params.PARAM_KINDS`` (``"float>0"``, ``"float>=0"``, ``"float"``,
    ``"int>=1"``, ``"int>=0"``, ``"bool"``, ``"plane"``, ``"choice"`` with ``choices``), or an
    ``equinox.Module`` class whose own declared parameters become this model's (``PhaseField``'s
    ``phase`` is a ``FourierPhase``: its ``omega``, ``amplitude``, ``frequency``). Everything the
    registry, the command line, the sweep spec and the constructors' checks know about the
    parameter comes from here. ``optional`` marks an option added after sweep stores were written:
    a sweep spec records it only when it differs from its default (``Param.optional``). ``maximum``
    bounds an integer kind from above (``Param.maximum``: a seed, ``meanfield._params.INT32_MAX`` when
    traced), checked on construction. ``applies``: the switches the parameter acts with, ``((switch,
    values), ...)`` (``Param.applies``: a value away from the default while no switch takes one of
    its values is refused, by the constructor, the command line and a sweep alike).
    ``field_kwargs`` go to ``equinox.field`` (``kw_only=True``, ...).

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> class Cosine(mf.kernels.Kernel):     # h = cos(beta <x, y>): a new kernel is one class
        ...     name = "cosine-doc"
        ...     beta: float = mf.kernels.param(1.0, kind="float>0", doc="frequency")
        ...     def __call__(self, x, xi, y, zeta):
        ...         return jnp.cos(self.beta * jnp.dot(x, y))
        >>> [(p.name, p.kind, p.default, p.traced) for p in Cosine.params()][0]   # then the mask's
        ('beta', 'float>0', 1.0, True)
    """
    if not (kind in PARAM_KINDS or (isinstance(kind, type) and issubclass(kind, eqx.Module))):
        raise ValueError(
            f"kind must be one of {', '.join(PARAM_KINDS)} or an equinox.Module class, got {kind!r}"
        )
    if kind == "choice" and not choices:
        raise ValueError("a parameter of kind 'choice' needs its choices")
    if not isinstance(doc, str) or not doc:
        raise TypeError(f"doc must be a non-empty string, got {doc!r}")
    if maximum is not None and not (isinstance(kind, str) and kind.startswith("int")):
        raise ValueError(f"maximum bounds an integer kind, not {kind!r}")
    metadata = {
        _DECLARATION: _Declaration(
            kind, doc, tuple(choices), bool(optional), maximum, tuple(applies)
        )
    }
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
        if _is_family(decl.kind):
            out.extend(decl.kind.flat_params(f, decl))
            continue
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
                decl.optional,
                decl.maximum,
                decl.applies,
            )
        )
    return tuple(out)


def _build_declared(cls: type, P: dict[str, Any], **extra: Any) -> Any:
    """``cls`` from the values ``P`` of its declared parameters (nested Modules built likewise)."""
    kwargs = dict(extra)
    for f in _declared_fields(cls):
        decl = f.metadata[_DECLARATION]
        if _is_family(decl.kind):
            if f.name in P or not decl.optional:  # else the field's default member
                kwargs[f.name] = decl.kind.from_params(P, f.name)
        elif isinstance(decl.kind, type):
            kwargs[f.name] = _build_declared(decl.kind, P)
        elif f.name in P or not decl.optional:
            kwargs[f.name] = P[f.name]
        # an optional parameter left out of P keeps its default (added after P's writer)
    return cls(**kwargs)


def _check_declared(module: eqx.Module) -> None:
    """Concrete values of the declared parameters of ``module`` checked against their kind
    (``meanfield._params``: one message everywhere); traced values are the program's to check."""
    for f in _declared_fields(type(module)):
        decl = f.metadata[_DECLARATION]
        if _is_family(decl.kind):
            decl.kind.check_member(getattr(module, f.name), f.name)
            continue  # a variant checks its own parameters
        if isinstance(decl.kind, type):
            continue  # a nested Module checks its own
        v = getattr(module, f.name)
        if decl.kind.startswith("int") and not is_concrete(v):
            continue  # a traced integer (a sweep over ``weight_seed``): the program's to check
        if decl.kind.startswith("float"):
            check_scalar(f.name, v)
            if is_concrete(v):
                value = v if isinstance(v, (int, float)) else float(np.asarray(v))
                check_float(f.name, value, decl.kind)
        elif decl.kind == "plane":
            check_value(f.name, "plane", tuple(v) if isinstance(v, (list, tuple)) else v)
        else:
            check_value(f.name, decl.kind, v, decl.choices, maximum=decl.maximum)


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


_V = TypeVar("_V", bound="Variant")

#: The variant families by their flat parameter's name (``"normalization"``: ``mf.normalization.Scheme``).
FAMILIES: dict[str, type[Variant]] = {}


def builtin_view(params: tuple[Param, ...]) -> tuple[Param, ...]:
    """``params`` as meanfield's own variants make them (the command line's generated schema): the
    choice of each family among its built-in members, the parameters of registered ones left out."""
    out = []
    for p in params:
        family = FAMILIES.get(p.name)
        if family is not None and p.kind == "choice":
            out.append(dataclasses.replace(p, choices=family.builtin_names()))
            continue
        if p.applies and p.applies[0][0] in FAMILIES:
            switch, members = p.applies[0]
            own = tuple(m for m in members if m in FAMILIES[switch].builtin_names())
            if not own:
                continue
            p = dataclasses.replace(p, applies=((switch, own),))
        out.append(p)
    return tuple(out)


def _is_family(kind: Any) -> bool:
    """Whether a declared kind is a variant family (``Variant`` subclass naming a ``flat_name``)."""
    return isinstance(kind, type) and issubclass(kind, Variant) and kind.family() is not None


class Variant(Declared):
    """An interchangeable part of a model, registered by name in its family: a normalisation scheme
    (``mf.normalization.Scheme``), an attention kind (``mf.models.AttentionKind``), a geometry.

    A *family* is a subclass that sets ``flat_name`` (the name of the model's field and of the flat
    parameter the command line and a sweep know it by: ``"normalization"``); it keeps its own
    registry. A *member* is a concrete subclass registered with ``Family.register`` under its class
    attribute ``name``; its parameters are its fields, declared with ``param`` (nGPT's ``alpha``),
    and its facts are its methods. A member defined outside meanfield and registered runs wherever
    the built-in ones do (``mf.simulate``, a sweep, the command line, a phase diagram).

    The flat parameters of a model field declared with a family as its kind (``Family.flat_params``):
    the choice ``flat_name`` among the registered names, then every member parameter (sorted by
    name), each with the members it applies with (``Param.applies``): a value away from its default
    for a member that does not declare it is refused with one message (``Family.coerce``).

    Example:
        >>> import meanfield as mf
        >>> mf.normalization.Scheme.names()[:3], mf.normalization.Scheme.coerce("ngpt", alpha=0.5)
        (('post', 'pre', 'mix'), NGPT(alpha=0.5))
    """

    #: The registry name of a member (``"ngpt"``); None on a family.
    name: ClassVar[str | None] = None
    #: The name of the family's flat parameter (``"normalization"``); set on the family class only.
    flat_name: ClassVar[str | None] = None
    #: What the members of the family are, in messages ("normalisation scheme").
    what: ClassVar[str] = "variant"
    _registry: ClassVar[dict[str, type[Variant]]]
    _builtin: ClassVar[set[str]]
    #: Called with the family after each ``register``/``unregister`` (the model registry
    #: re-derives the flat parameters of the models that take the family: ``mf.kernels``).
    listeners: ClassVar[list[Any]] = []

    #: Class facts a subclass does not inherit (set to False unless it sets them itself): the
    #: flags that let a fast path skip the member's methods (``Scheme.post_ln``, ``AttentionKind.softmax``).
    own_facts: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for fact in cls.own_facts:
            if fact not in cls.__dict__:
                setattr(cls, fact, False)
        if "flat_name" in cls.__dict__:
            cls._registry = {}
            cls._builtin = set()
            FAMILIES[cls.flat_name] = cls  # type: ignore[index]

    @classmethod
    def family(cls) -> type[Variant] | None:
        """The family class of ``cls`` (itself for a family), or None for ``Variant`` itself."""
        for klass in cls.__mro__:
            if "flat_name" in klass.__dict__ and klass is not Variant:
                return klass  # type: ignore[return-value]
        return None

    @classmethod
    def register(cls, member: type[Variant], *, _builtin: bool = False) -> type[Variant]:
        """Register ``member`` (a subclass of this family with a ``name``) under its name; returns it,
        so that it serves as a class decorator. A name taken by another class is refused.

        Example:
            >>> import meanfield as mf
            >>> @mf.normalization.Scheme.register
            ... class Half(mf.normalization.Post):      # Post-LN at half speed
            ...     name = "half-doc"
            ...     def speed(self, t, dtype=None):
            ...         return 0.5
            >>> "half-doc" in mf.normalization.Scheme.names()
            True
            >>> mf.normalization.Scheme.unregister("half-doc")
        """
        family = cls.family()
        if family is None or not (isinstance(member, type) and issubclass(member, family)):
            raise TypeError(f"register a subclass of {cls.__name__}, got {member!r}")
        name = member.__dict__.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{member.__name__} needs a class attribute name (a non-empty string)")
        taken = family._registry.get(name)
        if taken is not None and (taken.__module__, taken.__qualname__) != (
            member.__module__,
            member.__qualname__,
        ):
            raise ValueError(
                f"{family.flat_name} {name!r} is registered already ({taken.__module__}.{taken.__qualname__})"
            )
        table = family.member_params()
        for p in declared_params(member):
            known = table.get(p.name)
            if known is not None and name not in known[1]:
                q = known[0]
                if (q.kind, q.traced, q.default) != (p.kind, p.traced, p.default):
                    raise ValueError(
                        f"{member.__name__}.{p.name} (kind {p.kind!r}, default {p.default!r}) clashes "
                        f"with {p.name} of {family.flat_name} {known[1][0]!r} (kind {q.kind!r}, "
                        f"default {q.default!r}): one flat name, one meaning; rename it"
                    )
        family._registry[name] = member
        if _builtin:
            family._builtin.add(name)
        for listener in list(Variant.listeners):
            listener(family)
        return member

    @classmethod
    def builtin(cls, member: type[_V]) -> type[_V]:
        """Register ``member`` as one of meanfield's own (it stays registered, and the command
        line's generated schema lists it): the class decorator of the built-in members."""
        cls.register(member, _builtin=True)
        return member

    @classmethod
    def unregister(cls, name: str) -> None:
        """Remove the member registered as ``name`` (not one of meanfield's own)."""
        family = cls.family()
        assert family is not None
        if name in family._builtin:
            raise ValueError(
                f"{family.flat_name} {name!r} is one of meanfield's own: it stays registered"
            )
        if family._registry.pop(name, None) is not None:
            for listener in list(Variant.listeners):
                listener(family)

    @classmethod
    def builtin_names(cls) -> tuple[str, ...]:
        """The names of meanfield's own members (what the command line's generated schema holds)."""
        family = cls.family()
        return tuple(n for n in family._registry if n in family._builtin)  # type: ignore[union-attr]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The registered names of the family, in registration order."""
        family = cls.family()
        return tuple(family._registry) if family is not None else ()

    @classmethod
    def lookup(cls: type[_V], name: Any) -> type[_V]:
        """The member class registered as ``name``; ``ValueError`` naming the accepted names."""
        family = cls.family()
        assert family is not None
        if not isinstance(name, str) or name not in family._registry:
            raise ValueError(
                f"{family.flat_name} must be one of {', '.join(map(repr, family.names()))}, got {name!r}"
            )
        return family._registry[name]  # type: ignore[return-value]

    @classmethod
    def member_params(cls) -> dict[str, tuple[Param, tuple[str, ...]]]:
        """``name -> (Param, members declaring it)`` over the registered members, sorted by name."""
        found: dict[str, tuple[Param, list[str]]] = {}
        for member_name, member in cls.family()._registry.items():  # type: ignore[union-attr]
            for p in declared_params(member):
                if p.name in found:
                    found[p.name][1].append(member_name)
                else:
                    found[p.name] = (p, [member_name])
        return {k: (found[k][0], tuple(found[k][1])) for k in sorted(found)}

    @classmethod
    def flat_params(cls, f: Any = None, decl: Any = None) -> tuple[Param, ...]:
        """The flat parameters of a model field of this family (``f``, its declaration ``decl``):
        the choice of member, then the members' parameters with ``applies``."""
        family = cls.family()
        assert family is not None
        default = f.default if f is not None and f.default is not dataclasses.MISSING else None
        doc = decl.doc if decl is not None else f"the {family.what}"
        choice = Param(
            family.flat_name,  # type: ignore[arg-type]
            default.name if isinstance(default, Variant) else default,
            False,
            "choice",
            doc,
            family.names(),
            bool(decl.optional) if decl is not None else True,
        )
        out = [choice]
        for p, members in family.member_params().values():
            out.append(
                dataclasses.replace(p, optional=True, applies=((family.flat_name, members),))
            )
        return tuple(out)

    @classmethod
    def from_params(cls, P: dict[str, Any], field_name: str | None = None) -> Variant:
        """The member named by ``P[flat_name]`` built from its own parameters in ``P`` (the others'
        are the caller's to refuse: ``meanfield._params.check_applies``)."""
        family = cls.family()
        assert family is not None
        key = field_name or family.flat_name
        member = family.lookup(P.get(key, P.get(family.flat_name)))  # type: ignore[arg-type]
        own = {p.name for p in declared_params(member)}
        others = {k: P[k] for k in family.member_params() if k in P and k not in own}
        _refuse_unused(family, member, others, "")
        return member(**{k: P[k] for k in own if k in P})

    @classmethod
    def coerce(cls: type[_V], value: Any, owner: str = "", **given: Any) -> _V:
        """``value`` (a member, or a registered name) as a member of the family, with the flat
        parameters ``given`` (None: not given) folded in: ``coerce("ngpt", alpha=0.5)`` is
        ``NGPT(alpha=0.5)``. A parameter given for a member that does not declare it is refused
        when it differs from its default (it would change nothing); a parameter given beside a
        member object that holds its own is refused (one value, one place). ``owner``: the model's
        class name, for the message.

        Example:
            >>> import meanfield as mf
            >>> try:
            ...     mf.normalization.Scheme.coerce("post", "SelfAttention", alpha=0.5)
            ... except ValueError as e:
            ...     print(e)
            alpha = 0.5 applies with normalization = 'ngpt', not 'post' (SelfAttention would not use it)
        """
        family = cls.family()
        assert family is not None
        given = {k: v for k, v in given.items() if v is not None}
        if isinstance(value, family):
            member: type[Variant] = type(value)
            own = {p.name for p in declared_params(member)}
            both = sorted(k for k in set(given) & own if not _same(given[k], getattr(value, k)))
            if both:
                raise ValueError(
                    f"{both[0]} is given twice: in {family.flat_name}={value!r} and as {both[0]}=; "
                    f"give it in one place"
                )
            _refuse_unused(family, member, given, owner)
            return value  # type: ignore[return-value]
        if isinstance(value, type) and issubclass(value, family):
            value = value.name
        member = family.lookup(value)
        own = {p.name for p in declared_params(member)}
        _refuse_unused(family, member, given, owner)
        return member(**{k: v for k, v in given.items() if k in own})  # type: ignore[return-value]

    @classmethod
    def check_member(cls, value: Any, field_name: str) -> None:
        """``TypeError`` unless ``value`` is a member of the family (a model's field after ``coerce``)."""
        family = cls.family()
        if not isinstance(value, family):  # type: ignore[arg-type]
            raise TypeError(
                f"{field_name} must be a {family.what} ({family.__name__}) or one of "  # type: ignore[union-attr]
                f"{', '.join(map(repr, cls.names()))}, got {value!r}"
            )


def _same(a: Any, b: Any) -> bool:
    """``a`` is ``b``, or both concrete and equal (a value given again, ``dataclasses.replace``)."""
    if a is b:
        return True
    if not (is_concrete(a) and is_concrete(b)):
        return False
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except (TypeError, ValueError):
        return False


def _refuse_unused(
    family: type[Variant], member: type[Variant], given: dict[str, Any], owner: str
) -> None:
    """``ValueError`` for a flat parameter in ``given`` that ``member`` does not declare, set away
    from its default: it would change nothing."""
    own = {p.name for p in declared_params(member)}
    table = family.member_params()
    for name, value in given.items():
        if name in own:
            continue
        if name not in table:
            raise TypeError(f"{family.flat_name} takes no parameter {name!r}")
        p, members = table[name]
        if not is_concrete(value) or not np.any(np.asarray(value) != p.default):
            continue
        switch = str(family.flat_name)  # a family names its flat parameter
        problem = applies_problem(
            name, value, [(switch, members)], {switch: member.name}, owner=owner
        )
        if problem is not None:  # always: member does not declare it
            raise ValueError(problem)
