"""The suite's run-time type checks (tests/_typecheck.py): the same annotations checked at the same
calls as under ``jaxtyping.jaxtyped(typechecker=beartype)``, with beartype alone where a function has no
jaxtyping annotation."""

from __future__ import annotations

import inspect

import jax.numpy as jnp
import pytest
from _typecheck import jaxtyped
from beartype import beartype
from jaxtyping import Array, Float, TypeCheckError

import meanfield


def _plain(x: int, scale: float = 2.0, *, label: str = "a") -> float:
    return x * scale


def _bad_return(x: int) -> str:
    return x  # type: ignore[return-value]


def _shaped(x: Float[Array, " n"], y: Float[Array, " n"]) -> Float[Array, " n"]:
    return x + y


def test_plain_functions_are_checked_by_beartype_alone():
    f = jaxtyped(_plain, typechecker=beartype)
    assert f(3) == 6.0 and f(3, 0.5, label="b") == 1.5
    assert f.__wrapped__ is _plain and inspect.signature(f) == inspect.signature(_plain)
    with pytest.raises(TypeCheckError, match="_plain"):  # a TypeError, as jaxtyped raises
        f("3")
    with pytest.raises(TypeCheckError):
        f(3, label=1)
    with pytest.raises(TypeCheckError):
        jaxtyped(_bad_return, typechecker=beartype)(1)
    with pytest.raises(TypeError):  # a binding error stays Python's
        f(1, 2.0, 3)


def test_functions_with_array_annotations_keep_jaxtyped_shape_checks():
    f = jaxtyped(_shaped, typechecker=beartype)
    assert jnp.allclose(f(jnp.ones(3), jnp.ones(3)), 2.0)
    with pytest.raises(TypeCheckError):  # n bound to 2 by x, then 3 by y
        f(jnp.ones(2), jnp.ones(3))
    with pytest.raises(TypeCheckError):
        f(jnp.ones((2, 2)), jnp.ones((2, 2)))


def test_the_package_is_imported_under_the_hook():
    """conftest.py imports meanfield under the hook: a plain-annotated function of the package
    rejects a wrong type at the call; an array-annotated one rejects mismatched shapes."""
    from meanfield import _machine, sphere

    assert _machine.format_bytes(2048) == _machine.format_bytes(2048.0)
    with pytest.raises(TypeCheckError, match="format_bytes"):  # int | float: a str is refused
        _machine.format_bytes("2048")  # type: ignore[arg-type]
    x = jnp.ones((4, 3))
    assert sphere.normalize(x).shape == (4, 3)
    assert meanfield.sphere is sphere
