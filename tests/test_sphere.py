"""Sphere geometry: sampling, projections, rotations, tangent bases (docs/math/index.md, Notation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf


def test_uniform_shape_dtype_unit_rows_and_reproducible():
    key = jax.random.key(0)
    x = mf.sphere.uniform(key, 50, 4)
    assert x.shape == (50, 4) and x.dtype == jnp.float32
    np.testing.assert_allclose(np.linalg.norm(np.asarray(x, np.float64), axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(x, mf.sphere.uniform(key, 50, 4))
    assert not np.allclose(x, mf.sphere.uniform(jax.random.key(1), 50, 4))


def test_uniform_float64(x64):
    x = mf.sphere.uniform(jax.random.key(0), 10, 3, jnp.float64)
    assert x.dtype == jnp.float64
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-14)


def test_uniform_moments_within_monte_carlo_error():
    # Uniform on S^{d-1}: E[x] = 0, E[x x^T] = I / d, Var(x_k) = 1/d, Var(x_k^2) = 2(d-1)/(d^2 (d+2)).
    n, d = 20000, 3
    x = np.asarray(mf.sphere.uniform(jax.random.key(42), n, d), np.float64)
    se_mean = np.sqrt(1.0 / (d * n))
    assert np.all(np.abs(x.mean(0)) < 5 * se_mean)
    second = x.T @ x / n
    se_diag = np.sqrt(2.0 * (d - 1) / (d**2 * (d + 2)) / n)
    assert np.all(np.abs(np.diag(second) - 1.0 / d) < 5 * se_diag)
    # off-diagonal E[x_a x_b] = 0, Var = E[x_a^2 x_b^2] = 1/(d(d+2))
    se_off = np.sqrt(1.0 / (d * (d + 2)) / n)
    off = second[~np.eye(d, dtype=bool)]
    assert np.all(np.abs(off) < 5 * se_off)


def test_normalize_and_project():
    key = jax.random.key(1)
    v = jax.random.normal(key, (7, 5))
    x = mf.sphere.normalize(v)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(
        x * np.linalg.norm(v, axis=1, keepdims=True), v, rtol=1e-5, atol=1e-6
    )
    w = jax.random.normal(jax.random.key(2), (7, 5))
    p = mf.sphere.project(x, w)
    # tangent, idempotent, and equal to (I - x x^T) w
    np.testing.assert_allclose(np.sum(p * x, axis=1), 0.0, atol=1e-6)
    np.testing.assert_allclose(mf.sphere.project(x, p), p, atol=1e-6)
    direct = np.einsum("nij,nj->ni", np.eye(5) - np.einsum("ni,nj->nij", x, x), w)
    np.testing.assert_allclose(p, direct, atol=1e-6)
    # single vector
    np.testing.assert_allclose(mf.sphere.project(x[0], w[0]), p[0], atol=1e-7)


@pytest.mark.parametrize("plane", [(0, 1), (1, 2), (2, 0)])
def test_rotation_definition(plane):
    d, theta = 4, 0.7
    R = np.asarray(mf.sphere.rotation(theta, d, plane), np.float64)
    a, b = plane
    e = np.eye(d)
    np.testing.assert_allclose(R @ e[a], np.cos(theta) * e[a] + np.sin(theta) * e[b], atol=1e-6)
    np.testing.assert_allclose(R @ e[b], -np.sin(theta) * e[a] + np.cos(theta) * e[b], atol=1e-6)
    for k in set(range(d)) - {a, b}:
        np.testing.assert_allclose(R @ e[k], e[k], atol=0)
    np.testing.assert_allclose(R.T @ R, np.eye(d), atol=1e-6)
    assert abs(np.linalg.det(R) - 1.0) < 1e-6


def test_rotation_group_law_and_derivative(x64):
    a, b = 0.3, -1.1
    Ra, Rb = mf.sphere.rotation(a, 3), mf.sphere.rotation(b, 3)
    np.testing.assert_allclose(Ra @ Rb, mf.sphere.rotation(a + b, 3), atol=1e-15)
    np.testing.assert_allclose(mf.sphere.rotation(-a, 3), Ra.T, atol=0)
    # d/dtheta R = J R with J the generator of the plane (0, 1)
    dR = jax.jacfwd(lambda t: mf.sphere.rotation(t, 3))(a)
    J = np.zeros((3, 3))
    J[1, 0], J[0, 1] = 1.0, -1.0
    np.testing.assert_allclose(dR, J @ Ra, atol=1e-15)
    # works under vmap over angles
    Rs = jax.vmap(lambda t: mf.sphere.rotation(t, 3))(jnp.array([a, b]))
    np.testing.assert_allclose(Rs[1], Rb, atol=0)


def _assert_tangent_basis(x, atol):
    x = np.asarray(x)
    d = x.shape[0]
    B = np.asarray(mf.sphere.tangent_basis(jnp.asarray(x)), np.float64)
    assert B.shape == (d, d - 1)
    np.testing.assert_allclose(B.T @ B, np.eye(d - 1), atol=atol)
    np.testing.assert_allclose(x.astype(np.float64) @ B, 0.0, atol=atol)


@pytest.mark.parametrize("d", [2, 3, 6])
def test_tangent_basis_axes_and_generic_points(d):
    xs = np.asarray(mf.sphere.uniform(jax.random.key(d), 40, d))
    # away from the coordinate axes (|x_k| <= 0.9) and exactly on them
    xs = xs[np.max(np.abs(xs), axis=1) <= 0.9]
    xs = np.concatenate([xs, np.eye(d, dtype=np.float32), -np.eye(d, dtype=np.float32)])
    for x in xs:
        _assert_tangent_basis(x, 1e-5)


@pytest.mark.parametrize("eps", [1e-2, 1e-3, 1e-4])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_tangent_basis_near_an_axis(eps, sign):
    # x close to +-e_1: the Householder construction must not cancel (float32 rounding ~1e-7)
    x = mf.sphere.normalize(jnp.array([sign, eps, -0.5 * eps]))
    _assert_tangent_basis(x, 1e-6)


def test_check_on_sphere_accepts_unit_rows_and_rejects_others():
    x = mf.sphere.uniform(jax.random.key(0), 5, 3)
    mf.sphere.check_on_sphere(x)  # no error
    mf.sphere.check_on_sphere(np.asarray(x) * (1 + 5e-4))  # within 1e-3
    with pytest.raises(ValueError, match="normali"):
        mf.sphere.check_on_sphere(np.asarray(x) * 1.01)


def test_sample_density_von_mises_fisher_mean():
    # rho(x) propto exp(kappa x_3) on S^2: E[x_3] = coth(kappa) - 1/kappa,
    # Var(x_3) = 1 - 2 coth(kappa)/kappa + 2/kappa^2 - (E x_3)^2 ... bounded by 1/3 here; use the exact one.
    kappa, n = 3.0, 4000
    x = np.asarray(
        mf.sphere.sample_density(jax.random.key(5), n, 3, lambda y: kappa * y[2], log_bound=kappa),
        np.float64,
    )
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    mean = 1.0 / np.tanh(kappa) - 1.0 / kappa
    second = 1.0 - 2.0 * mean / kappa  # E[x_3^2] for the vMF law on S^2
    se = np.sqrt((second - mean**2) / n)
    assert abs(x[:, 2].mean() - mean) < 5 * se
    # symmetric in the orthogonal directions
    assert np.all(np.abs(x[:, :2].mean(0)) < 5 * np.sqrt(0.5 * (1 - second) / n))


@pytest.mark.parametrize("n, d", [(8, 3), (5000, 4)])
def test_uniform_same_particles_in_float32_and_float64(n, d):
    """Issue 17: the same seed gives the same particles in every precision (drawn in float32,
    cast, renormalised): float64 rows are the float32 ones to float32 rounding of the
    normalisation, and unit to float64 rounding; float32 draws do not depend on x64."""
    key = jax.random.key(11)
    x32 = np.asarray(mf.sphere.uniform(key, n, d))
    with jax.enable_x64(True):
        x64 = mf.sphere.uniform(key, n, d, jnp.float64)
        again32 = mf.sphere.uniform(key, n, d, jnp.float32)
    assert x64.dtype == jnp.float64
    x64 = np.asarray(x64)
    np.testing.assert_array_equal(np.asarray(again32), x32)
    # |x64 - x32| <= 2^-22 (two float32 ulps at 1): the float32 rounding of x / ||x|| only
    assert np.max(np.abs(x64 - x32.astype(np.float64))) <= 2.0**-22
    np.testing.assert_allclose(
        np.linalg.norm(x64, axis=1), 1.0, rtol=0, atol=4 * np.finfo(np.float64).eps
    )
    # lower precisions get the same particles too
    x16 = np.asarray(mf.sphere.uniform(key, n, d, jnp.bfloat16), np.float64)
    assert np.max(np.abs(x16 - x32)) <= 2.0**-7


def test_sample_density_same_points_in_float32_and_float64():
    f = lambda y: 2.0 * y[2]  # noqa: E731
    x32 = np.asarray(mf.sphere.sample_density(jax.random.key(2), 64, 3, f, log_bound=2.0))
    with jax.enable_x64(True):
        x64 = mf.sphere.sample_density(
            jax.random.key(2), 64, 3, f, log_bound=2.0, dtype=jnp.float64
        )
    assert x64.dtype == jnp.float64
    x64 = np.asarray(x64)
    assert np.max(np.abs(x64 - x32.astype(np.float64))) <= 2.0**-22
    np.testing.assert_allclose(
        np.linalg.norm(x64, axis=1), 1.0, rtol=0, atol=4 * np.finfo(np.float64).eps
    )


@pytest.mark.parametrize("bad", [jnp.int32, "int8", np.complex64, "no-such-dtype"])
def test_samplers_need_a_floating_dtype(bad):
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        mf.sphere.uniform(jax.random.key(0), 4, 3, bad)
    with pytest.raises(TypeError, match="dtype must be a floating dtype"):
        mf.sphere.sample_density(jax.random.key(0), 4, 3, lambda y: y[0], log_bound=1.0, dtype=bad)
