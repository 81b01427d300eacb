"""The grid Brownian path of noisy runs (meanfield/_brownian.py): its law (independent N(0, h)
increments, within Monte Carlo error), its refinement consistency (N and 2N steps read one path), the
stored and descended forms giving the same numbers, and which runs use it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield._brownian import GridBrownianPath, grid_steps, odd_and_levels
from meanfield.integrate import _noise_steps


def _incs(key, t1, steps, shape=(3,), dtype=jnp.float64, store=None):
    """The ``steps`` increments of the path of ``key`` (one compiled program)."""
    h = t1 / steps

    @jax.jit
    def incs(key):
        p = GridBrownianPath(key, t1, steps, jax.ShapeDtypeStruct(shape, dtype), store=store)
        return jax.vmap(lambda k: p.evaluate(k * h, (k + 1) * h))(jnp.arange(steps))

    with jax.enable_x64(True):
        return np.asarray(incs(key))


def test_odd_and_levels():
    for steps in (1, 2, 3, 12, 200, 1024, 999):
        q, j = odd_and_levels(steps)
        assert q % 2 == 1 and q * 2**j == steps
    with pytest.raises(ValueError, match="steps=0"):
        odd_and_levels(0)


def test_increments_are_independent_gaussians_of_variance_h():
    """4,000 keys x 24 steps (q = 3, three levels) x 3 components: every step's variance is h and
    the steps are uncorrelated, within 5 standard errors; the fourth moment is Gaussian (3 h^2)."""
    t1, steps, keys = 2.0, 24, 4000
    h = t1 / steps
    with jax.enable_x64(True):
        shape = jax.ShapeDtypeStruct((3,), jnp.float64)

        def path(key):
            p = GridBrownianPath(key, t1, steps, shape)
            return jax.vmap(lambda k: p.evaluate(k * h, (k + 1) * h))(jnp.arange(steps))

        w = np.asarray(jax.jit(jax.vmap(path))(jax.random.split(jax.random.key(3), keys)))
    z = w.reshape(keys, steps, 3) / np.sqrt(h)  # standard normals if the law is right
    m = keys * 3
    var = (z**2).mean(axis=(0, 2))
    assert np.max(np.abs(var - 1)) < 5 * np.sqrt(2 / m), var
    assert abs((z**4).mean() - 3) < 5 * np.sqrt(96 / (m * steps))
    c = np.einsum("ksd,ktd->st", z, z) / m
    off = c[~np.eye(steps, dtype=bool)]
    assert np.max(np.abs(off)) < 5 / np.sqrt(m), np.max(np.abs(off))
    assert abs(z.mean()) < 5 / np.sqrt(m * steps)


@pytest.mark.parametrize("steps", [12, 64, 50])
def test_refinement_reads_one_path(steps):
    """The run of 2N steps splits each step of the run of N steps: pairs sum to it (to rounding)."""
    key = jax.random.key(7)
    coarse = _incs(key, 1.5, steps)
    fine = _incs(key, 1.5, 2 * steps)
    np.testing.assert_allclose(fine[0::2] + fine[1::2], coarse, rtol=0, atol=1e-14)
    assert not np.allclose(fine[0::2], fine[1::2])


def test_stored_and_descended_forms_agree():
    key = jax.random.key(11)
    for steps in (1, 40, 96):
        a = _incs(key, 3.0, steps, shape=(4, 2), store=True)
        b = _incs(key, 3.0, steps, shape=(4, 2), store=False)
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    a32 = _incs(key, 3.0, 40, dtype=jnp.float32, store=True)
    b32 = _incs(key, 3.0, 40, dtype=jnp.float32, store=False)
    np.testing.assert_allclose(a32, b32, rtol=1e-6, atol=1e-7)


def test_values_are_sums_and_keys_vmap():
    """evaluate(t) is the sum of the increments before t; a vmap over keys gives each key's path."""
    keys = jax.random.split(jax.random.key(5), 3)
    with jax.enable_x64(True):
        shape = jax.ShapeDtypeStruct((2,), jnp.float64)
        p = GridBrownianPath(keys[1], 1.0, 8, shape)
        w = np.asarray(p.evaluate(0.625))
        batched = jax.vmap(lambda k: GridBrownianPath(k, 1.0, 8, shape).evaluate(0.25, 0.375))(keys)
    incs = _incs(keys[1], 1.0, 8, shape=(2,))
    np.testing.assert_allclose(w, incs[:5].sum(axis=0), atol=1e-14)
    # eager (op by op) against compiled: equal to the last bit or two
    np.testing.assert_allclose(np.asarray(batched[1]), incs[2], rtol=1e-15, atol=1e-16)


def test_only_grid_steps_are_defined():
    """A zero-length span is zero, a span of two steps NaN (never a silent one-step increment)."""
    with jax.enable_x64(True):
        p = GridBrownianPath(jax.random.key(2), 1.0, 8, jax.ShapeDtypeStruct((3,), jnp.float64))
        assert np.all(np.asarray(p.evaluate(0.25, 0.25)) == 0)
        assert np.all(np.isnan(np.asarray(p.evaluate(0.25, 0.5))))
        assert np.all(np.isfinite(np.asarray(p.evaluate(0.25, 0.375))))


def test_which_runs_use_the_grid_path():
    assert grid_steps(2.0, 0.01, np.arange(201) * 0.01) == 200
    # times in float32 name their step up to 2^20 steps: beyond, the tree (no misread increment)
    big = (1 << 20) + 2
    grid = np.arange(big + 1) / big
    assert grid_steps(1.0, 1.0 / big, grid, np.float64) == big
    assert grid_steps(1.0, 1.0 / big, grid, np.float32) is None
    assert _noise_steps(2.0, 0.01, np.array([0.0, 0.5, 2.0])) == 200
    assert _noise_steps(2.0, 0.01, np.array([0.0, 0.505, 2.0])) is None  # a save off the grid
    assert _noise_steps(1.0, 0.3, np.array([0.0, 1.0])) is None  # dt does not divide t1
    traced = jax.jit(lambda dt: jnp.asarray(_noise_steps(1.0, dt, np.array([0.0, 1.0])) is None))
    assert bool(traced(0.1))


def test_simulate_reads_the_grid_path():
    """A noisy run's first Heun step equals the one computed by hand from the path's first
    increment (free tokens: V = 0, so the step is the projected noise alone)."""
    with jax.enable_x64(True):
        x0 = mf.sphere.uniform(jax.random.key(0), 5, 3, jnp.float64)
        key = jax.random.key(9)
        model = mf.models.SelfAttention(beta=1.0, V=jnp.zeros((3, 3)))
        sigma, dt = 0.4, 0.125
        traj = mf.simulate(
            model, x0, t1=1.0, dt=dt, ts=[0.0, dt], noise=mf.noise.Independent(sigma), key=key
        )
        dw = GridBrownianPath(key, 1.0, 8, jax.ShapeDtypeStruct((5, 3), jnp.float64)).evaluate(
            0.0, dt
        )
        P = lambda x, v: v - jnp.sum(x * v, -1, keepdims=True) * x  # noqa: E731
        k1 = sigma * P(x0, dw)
        x1 = x0 + k1
        y = x0 + 0.5 * (k1 + sigma * P(x1 / jnp.linalg.norm(x1, axis=-1, keepdims=True), dw))
        y = y / jnp.linalg.norm(y, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(traj.xs[1]), np.asarray(y), atol=1e-12)


def test_run_cost_counts_the_stored_path():
    """run_cost's ``noise``: a stored path adds itemsize x N x its numbers to a point's bytes (N =
    t1 / dt, the path's steps), a path above STORE_LIMIT (descended, not stored) or an adaptive run's
    tree none; one normal a number a step of work."""
    from meanfield._brownian import STORE_LIMIT
    from meanfield._resources import NORMAL_FLOP, run_cost

    fp = mf.kernels.USA(1.0).footprint(256, 3)
    kw = dict(n=256, d=3, t1=2.0, dt=0.01, saves=2, itemsize=4, footprint=fp)
    base, noisy = run_cost(**kw), run_cost(**kw, noise=256 * 3)
    assert noisy.point_bytes - base.point_bytes == 4 * 200 * 256 * 3  # the path's N = t1 / dt
    assert noisy.work - base.work == base.steps * 256 * 3 * NORMAL_FLOP
    long = dict(kw, t1=2.0 * STORE_LIMIT / 768)  # steps x numbers past the limit
    assert run_cost(**long, noise=768).point_bytes == run_cost(**long).point_bytes
    adaptive = dict(kw, solver="heun")  # the tree: nothing stored
    assert run_cost(**adaptive, noise=768).point_bytes == run_cost(**adaptive).point_bytes
