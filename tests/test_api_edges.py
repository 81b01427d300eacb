"""API edges (issue 27, item 9): a traced beta that overflows the USA energy, a traced NaN in the
Toeplitz-series coefficients, and a Toeplitz series too large for memory get a clear error instead
of inf, NaN or an XLA out-of-memory crash. (``usa_step_size``: tests/test_phase_diagram_edges.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import _machine, _resources

K = mf.kernels
X = mf.sphere.uniform(jax.random.key(0), 8, 3)


def test_traced_usa_energy_past_overflow_is_an_error():
    energy = jax.jit(lambda b: mf.energy(K.USA(b), X))
    np.testing.assert_allclose(energy(jnp.float32(2.0)), mf.energy(K.USA(2.0), X), rtol=1e-6)
    with pytest.raises(
        (RuntimeError, ValueError),
        match=r"beta overflows exp\(beta <x, y>\) in float32 .* rescaled=True",
    ):
        jax.block_until_ready(energy(jnp.float32(200.0)))  # was inf
    with pytest.raises(ValueError, match="beta = 200 overflows"):  # the concrete value, as before
        mf.energy(K.USA(200.0), X)
    rescaled = jax.jit(lambda b: mf.energy(K.USA(b, rescaled=True), X))
    np.testing.assert_allclose(
        rescaled(jnp.float32(200.0)), mf.energy(K.USA(200.0, rescaled=True), X), rtol=1e-6
    )
    assert np.isfinite(float(rescaled(jnp.float32(200.0))))


def test_traced_usa_overflow_in_simulate_is_still_a_failed_run():
    # simulate records the overflow (Trajectory.failed) instead of stopping: a sweep keeps its other points
    run = jax.jit(lambda b: mf.simulate(K.USA(b), X, t1=0.2, dt=0.1, ts=[0.0, 0.2]))
    assert bool(run(jnp.float32(200.0)).failed)


def test_traced_nan_toeplitz_series_coefficients_are_an_error():
    s = mf.positions(8)
    energy = jax.jit(lambda c: mf.energy(K.ToeplitzSeries(c), X, s))
    c = jnp.array([0.1, 0.3, -0.2])
    np.testing.assert_allclose(energy(c), mf.energy(K.ToeplitzSeries(c), X, s), rtol=1e-6)
    with pytest.raises(
        (RuntimeError, ValueError), match="c_hat must be finite; a traced c_hat was not"
    ):
        jax.block_until_ready(energy(c.at[1].set(jnp.nan)))  # was NaN
    field = jax.jit(lambda c: mf.field(K.ToeplitzSeries(c), X, s))
    with pytest.raises((RuntimeError, ValueError), match="c_hat must be finite"):
        jax.block_until_ready(field(c.at[0].set(jnp.inf)))
    with pytest.raises(ValueError, match="c_hat must be finite"):  # concrete, as before
        K.ToeplitzSeries([0.0, np.nan])


def test_toeplitz_series_past_memory_refused(monkeypatch):
    # M = 1e7 at n = 256 died with an XLA out-of-memory traceback (4 (n, M + 1) tables: ~38 GiB in float32)
    monkeypatch.setattr(_machine, "machine_memory", lambda total=False: 16 * 2**30)
    x = mf.sphere.uniform(jax.random.key(1), 256, 3)
    k = K.ToeplitzSeries(jnp.zeros(10**7 + 1, jnp.float32))
    for f in (mf.energy, mf.field):
        with pytest.raises(
            _resources.ResourceLimitError,
            match=r"ToeplitzSeries with M \+ 1 = 10000001 coefficients at n = 256 needs ~38.1 GiB",
        ):
            f(k, x)
    # what fits runs: 4 * 256 * 1001 * 4 bytes
    small = K.ToeplitzSeries(jnp.zeros(1001).at[1].set(0.5))
    np.testing.assert_allclose(mf.energy(small, x), mf.energy(K.Toeplitz(1), x), rtol=1e-5)


def test_traced_usa_field_and_velocity_past_overflow_are_errors():
    """``mf.field``/``mf.velocity`` under ``jit`` at an overflowing traced beta returned inf / NaN
    while the concrete value is refused: the same in-program check as ``mf.energy`` now."""
    for f in (mf.field, mf.velocity):
        run = jax.jit(lambda b, f=f: f(K.USA(b), X))
        np.testing.assert_allclose(run(jnp.float32(2.0)), f(K.USA(2.0), X), rtol=1e-5, atol=1e-6)
        with pytest.raises(
            (RuntimeError, ValueError), match=r"beta overflows exp\(beta <x, y>\) in float32"
        ):
            jax.block_until_ready(run(jnp.float32(200.0)))
        with pytest.raises(ValueError, match="beta = 200 overflows"):
            f(K.USA(200.0), X)
        rescaled = jax.jit(lambda b, f=f: f(K.USA(b, rescaled=True), X))
        assert bool(jnp.all(jnp.isfinite(rescaled(jnp.float32(200.0)))))
