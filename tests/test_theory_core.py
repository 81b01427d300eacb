"""Closed forms of docs/math/kernels.md (mf.theory, USA-AV part) against direct evaluation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf

TWO_PI = 2.0 * np.pi


@pytest.mark.parametrize("beta", [0.1, 1.0, 4.0, 60.0])
def test_max_energy_formula_and_attainment(beta, x64):
    np.testing.assert_allclose(mf.theory.max_energy(beta), np.exp(beta) / (2 * beta), rtol=1e-15)
    np.testing.assert_allclose(
        mf.theory.max_energy(beta, rescaled=True), 1 / (2 * beta), rtol=1e-15
    )
    # attained by the RoPE maximiser x(s) = R_{-omega s} u, at any finite n
    n, omega = 13, 2.7
    u = mf.sphere.normalize(jnp.array([0.2, -0.5, 0.7]))
    s = mf.positions(n)
    x = jax.vmap(lambda t: mf.sphere.rotation(-omega * t, 3) @ u)(s)
    np.testing.assert_allclose(
        mf.energy(mf.kernels.RoPE(beta, omega), x), mf.theory.max_energy(beta), rtol=1e-13
    )
    np.testing.assert_allclose(
        mf.energy(mf.kernels.RoPE(beta, omega, rescaled=True), x),
        mf.theory.max_energy(beta, rescaled=True),
        rtol=1e-13,
    )


def test_max_energy_vmaps_over_beta():
    betas = jnp.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(
        jax.vmap(mf.theory.max_energy)(betas), np.exp(betas) / (2 * betas), rtol=1e-6
    )


@pytest.mark.parametrize("n", [2, 3, 10, 257])
def test_great_circle_gap(n, x64):
    assert mf.theory.great_circle_gap(n) == pytest.approx(1 + 1 / (n - 1), rel=1e-15)
    a = TWO_PI * np.arange(n) / n
    x = jnp.asarray(np.stack([np.cos(a), np.sin(a), np.zeros(n)], axis=1))
    np.testing.assert_allclose(
        mf.metrics.collapse_gap(x), mf.theory.great_circle_gap(n), rtol=1e-12
    )


@pytest.mark.parametrize("m", [1, 2, 3])
def test_great_circle_energy_is_the_toeplitz_maximum(m, x64):
    assert mf.theory.great_circle_energy(m) == 0.25
    n = 16
    s = np.asarray(mf.positions(n))
    a, b = np.array([0.0, 0.0, 1.0]), np.array([0.8, 0.6, 0.0])
    x = jnp.asarray(np.cos(TWO_PI * m * s)[:, None] * a + np.sin(TWO_PI * m * s)[:, None] * b)
    kernel = mf.kernels.Toeplitz(m=m)
    np.testing.assert_allclose(mf.energy(kernel, x), mf.theory.great_circle_energy(m), rtol=1e-13)
    # and it is an upper bound: random configurations stay below 1/4
    for seed in range(3):
        y = mf.sphere.uniform(jax.random.key(seed), n, 3, jnp.float64)
        assert float(mf.energy(kernel, y)) < 0.25


def test_latitude_height(x64):
    u = mf.sphere.normalize(jnp.array([0.3, -0.4, 0.5]))
    np.testing.assert_allclose(mf.theory.latitude_height(u), abs(float(u[2])), rtol=1e-15)
    np.testing.assert_allclose(mf.theory.latitude_height(u, (1, 2)), abs(float(u[0])), rtol=1e-15)
    np.testing.assert_allclose(mf.theory.latitude_height(u, (0, 2)), abs(float(u[1])), rtol=1e-15)
    # the RoPE maximiser R_{-omega s} u stays at that height for every s
    x = jax.vmap(lambda t: mf.sphere.rotation(-TWO_PI * t, 3) @ u)(mf.positions(9))
    np.testing.assert_allclose(np.abs(x[:, 2]), mf.theory.latitude_height(u), rtol=1e-14)
    # d = 4: the norm of the two coordinates outside the plane
    v = mf.sphere.normalize(jnp.array([1.0, 2.0, 2.0, 4.0]))
    np.testing.assert_allclose(mf.theory.latitude_height(v), np.sqrt(20.0 / 25.0), rtol=1e-14)
    # poles and equator
    assert float(mf.theory.latitude_height(jnp.array([0.0, 0.0, 1.0]))) == 1.0
    assert float(mf.theory.latitude_height(jnp.array([0.6, 0.8, 0.0]))) == 0.0
    # batched over points
    np.testing.assert_allclose(
        mf.theory.latitude_height(jnp.stack([u, -u])), [abs(float(u[2]))] * 2, rtol=1e-15
    )


def test_bad_inputs():
    with pytest.raises(ValueError, match="beta"):
        mf.theory.max_energy(0.0)
    with pytest.raises(ValueError, match="n must be >= 2, got 1"):
        mf.theory.great_circle_gap(1)
    with pytest.raises(ValueError, match="m must be >= 1, got 0"):
        mf.theory.great_circle_energy(0)


def test_latitude_height_rejects_bad_planes():
    u = jnp.array([0.6, 0.0, 0.8])
    with pytest.raises(ValueError, match="plane"):
        mf.theory.latitude_height(u, (0, 5))
    with pytest.raises(ValueError, match="plane"):
        mf.theory.latitude_height(u, (1, 1))
