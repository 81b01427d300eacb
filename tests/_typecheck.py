"""jaxtyping's import hook with beartype, at a twentieth of the cost on functions without array annotations.

The test suite imports meanfield under ``jaxtyping.install_import_hook(..., "beartype.beartype")``
(tests/conftest.py): every function and class of the package is decorated with
``jaxtyping.jaxtyped(typechecker=beartype)``, so every annotation is checked at every call. jaxtyping's
wrapper binds the call's arguments to the signature (``inspect.Signature.bind``), opens a scope for the
named dimensions, and runs beartype twice (parameters, then parameters and return value): about 25 us a
call. Most of the package's calls in Python loops (the sweep planner, the cost model, argument
checks) are to functions whose annotations hold no array type, for which the scope binds nothing: the
checks that remain are beartype's on the same annotations.

:func:`install_import_hook` is jaxtyping's hook with one change, made through the name the hook's
decorator looks up (``jaxtyping.jaxtyped``): a plain function whose annotations (resolved as jaxtyping
resolves them when it decorates, unresolvable ones as ``Any``) contain nothing from jaxtyping is checked
by beartype alone on those annotations, its violations raised as jaxtyping's ``TypeCheckError`` (a
``TypeError``) as before; every other function and every class goes through ``jaxtyped`` unchanged. The
same annotations are checked at the same calls with the same exception type (tests/test_typecheck.py).
Of the package's 1,467 decorated functions and classes, 932 take the short path. Measured alone on the
2-core box: tests/test_sweep_limits.py (the suite's most Python-bound file) 43 s -> 7 s,
tests/test_registry.py 67 s -> 63 s (docs/testing.md).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from typing import Any

import jaxtyping
from beartype.roar import BeartypeCallHintViolation
from jaxtyping import TypeCheckError
from jaxtyping._decorator import _destring_annotation  # the resolution jaxtyped itself uses

__all__ = ["install_import_hook", "jaxtyped"]

_jaxtyped = jaxtyping.jaxtyped
_MISSING = object()


def _from_jaxtyping(ann: Any, seen: set[int] | None = None) -> bool:
    """Whether an annotation holds anything defined by jaxtyping (array types, PyTree, ...)."""
    seen = set() if seen is None else seen
    if id(ann) in seen:
        return False
    seen.add(id(ann))
    if isinstance(ann, str):  # left unresolved: be conservative
        return True
    mod = getattr(ann, "__module__", "") or ""
    if mod.startswith("jaxtyping"):
        return True
    origin = typing.get_origin(ann)
    if origin is not None and _from_jaxtyping(origin, seen):
        return True
    return any(_from_jaxtyping(a, seen) for a in typing.get_args(ann))


def _plain(fn: Any, typechecker: Any) -> Any | None:
    """The beartype-only wrapper of ``fn``, or None where ``jaxtyped`` is needed."""
    if not isinstance(fn, types.FunctionType) or not callable(typechecker):
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    anns = {
        name: _destring_annotation(p.annotation, fn.__globals__)
        for name, p in sig.parameters.items()
        if p.annotation is not inspect.Parameter.empty
    }
    if sig.return_annotation is not inspect.Signature.empty:
        anns["return"] = _destring_annotation(sig.return_annotation, fn.__globals__)
    if any(_from_jaxtyping(a) for a in anns.values()):
        return None
    # the same code, with the annotations as jaxtyped resolved them (never re-resolved later)
    copy = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__module__ = fn.__module__
    copy.__annotations__ = anns
    try:
        checked = typechecker(copy)
    except Exception:
        return None

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        try:
            return checked(*args, **kwargs)
        except BeartypeCallHintViolation as e:
            raise TypeCheckError(f"{fn.__module__}.{fn.__qualname__}: {e}") from e

    return wrapped


def jaxtyped(fn: Any = _MISSING, *, typechecker: Any = _MISSING) -> Any:
    """``jaxtyping.jaxtyped``, with beartype alone on functions without jaxtyping annotations."""
    if fn is _MISSING:
        return functools.partial(jaxtyped, typechecker=typechecker)
    if typechecker is not _MISSING:
        fast = _plain(fn, typechecker)
        if fast is not None:
            return fast
        return _jaxtyped(fn, typechecker=typechecker)
    return _jaxtyped(fn)


def install_import_hook(modules: Any, typechecker: Any) -> Any:
    """``jaxtyping.install_import_hook``; its decorators are :func:`jaxtyped` (the name they look up,
    ``jaxtyping.jaxtyped``, is this function while the hook's modules are imported)."""
    from contextlib import contextmanager

    @contextmanager
    def hook() -> Any:
        jaxtyping.jaxtyped = jaxtyped
        try:
            with jaxtyping.install_import_hook(modules, typechecker):
                yield
        finally:
            jaxtyping.jaxtyped = _jaxtyped

    return hook()
