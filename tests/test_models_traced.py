"""Traced parameters are checked in the program against their declared kinds (``Model.check_traced``,
``Declared.traced_params``): a value out of range inside ``jit``/``vmap`` stops the call with an error
naming the parameter, as a concrete one is refused on construction."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import meanfield as mf

x0 = mf.sphere.uniform(jax.random.key(0), 6, 3)


def test_traced_params_lists_the_declared_floats_nested_parts_included():
    seen = {}

    def names(model_fn):
        def f(v):
            seen["names"] = [(name, kind) for name, kind, _ in model_fn(v).traced_params()]
            return v

        jax.jit(f)(1.0)
        return seen["names"]

    assert names(lambda lam: mf.kernels.DistanceBias(1.0, lam)) == [("lam", "float>=0")]
    assert names(lambda b: mf.kernels.DistanceBias(b, 1.0)) == [("beta", "float>0")]
    phase = lambda w: mf.kernels.PhaseField(1.0, mf.kernels.FourierPhase(w, 0.5, 2))  # noqa: E731
    assert names(phase) == [("omega", "float")]
    assert mf.kernels.DistanceBias(1.0, 2.0).traced_params() == ()


@pytest.mark.parametrize(
    "make, good, bad, message",
    [
        (lambda v: mf.kernels.DistanceBias(1.0, v), 1.0, -1.0, "lam must be >= 0 and finite"),
        (lambda v: mf.kernels.DistanceBias(1.0, v), 1.0, jnp.inf, "lam must be >= 0 and finite"),
        (
            lambda v: mf.kernels.USA(v),
            1.0,
            -1.0,
            "beta must be > 0 and finite; a traced beta was not",
        ),
        (
            lambda v: mf.kernels.PhaseField(1.0, mf.kernels.FourierPhase(v, 0.5, 2)),
            1.0,
            jnp.nan,
            "omega must be finite; a traced omega was not",
        ),
    ],
)
def test_a_traced_value_out_of_range_stops_the_program(make, good, bad, message):
    f = jax.jit(lambda v: mf.field(make(v), x0))
    assert bool(jnp.all(jnp.isfinite(f(good))))
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(f(bad))


def test_one_bad_value_in_a_vmapped_batch_stops_the_program():
    f = jax.jit(jax.vmap(lambda lam: mf.energy(mf.kernels.DistanceBias(1.0, lam), x0)))
    assert bool(jnp.all(jnp.isfinite(f(jnp.array([0.0, 0.5, 2.0])))))
    with pytest.raises(Exception, match="lam must be >= 0 and finite; a traced lam was not"):
        jax.block_until_ready(f(jnp.array([0.0, -0.5, 2.0])))
    velocity = jax.jit(jax.vmap(lambda lam: mf.velocity(mf.kernels.DistanceBias(1.0, lam), x0)))
    with pytest.raises(Exception, match="lam must be >= 0"):
        jax.block_until_ready(velocity(jnp.array([1.0, -1.0])))
