"""Issue 49, item 2 (its first half): natural frequencies, ``mf.simulate(frequencies=)``: the field
gains $\\Omega_i x_i$ (docs/math/noise.md). Checked against closed forms: free rotation, the matrix
exponential, and the co-rotating frame of a rotation-equivariant model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import meanfield as mf


def _free(d, **kw):
    return mf.models.SelfAttention(1.0, V=jnp.zeros((d, d)), **kw)


def test_angular_velocities_rotate_free_tokens_on_the_circle(x64):
    n, t1 = 6, 1.5
    x0 = mf.sphere.uniform(jax.random.key(0), n, 2, jnp.float64)
    w = jnp.linspace(-1.0, 2.0, n)
    traj = mf.simulate(_free(2), x0, t1=t1, dt=0.01, solver="rk4", frequencies=w)
    th = np.arctan2(x0[:, 1], x0[:, 0]) + t1 * np.asarray(w)
    np.testing.assert_allclose(traj.xs[-1], np.stack([np.cos(th), np.sin(th)], 1), atol=1e-8)


@pytest.mark.parametrize("geometry", ["sphere", "euclidean"])
def test_skew_matrices_are_the_matrix_exponential(geometry, x64):
    n, d, t1 = 4, 3, 1.0
    A = jax.random.normal(jax.random.key(1), (n, d, d), jnp.float64)
    omega = A - jnp.swapaxes(A, 1, 2)
    x0 = mf.sphere.uniform(jax.random.key(2), n, d, jnp.float64)
    if geometry == "euclidean":
        x0 = 1.7 * x0
    traj = mf.simulate(
        _free(d, geometry=geometry), x0, t1=t1, dt=0.005, solver="rk4", frequencies=omega
    )
    want = np.stack(
        [scipy.linalg.expm(t1 * np.asarray(o)) @ np.asarray(x) for o, x in zip(omega, x0)]
    )
    np.testing.assert_allclose(traj.xs[-1], want, atol=1e-8)


def test_a_common_frequency_is_the_co_rotating_frame(x64):
    r"""USA is rotation-equivariant ($F(R x) = R F(x)$): with one $\Omega$ for every token the run is
    $x_i(t) = e^{t \Omega} y_i(t)$, $y$ the run without frequencies."""
    n, d, t1 = 8, 3, 1.0
    A = jax.random.normal(jax.random.key(3), (d, d), jnp.float64)
    omega = A - A.T
    x0 = mf.sphere.uniform(jax.random.key(4), n, d, jnp.float64)
    model = mf.kernels.USA(2.0)
    run = mf.simulate(
        model, x0, t1=t1, dt=0.005, solver="rk4", frequencies=jnp.broadcast_to(omega, (n, d, d))
    )
    still = mf.simulate(model, x0, t1=t1, dt=0.005, solver="rk4")
    R = scipy.linalg.expm(t1 * np.asarray(omega))
    np.testing.assert_allclose(run.xs[-1], np.asarray(still.xs[-1]) @ R.T, atol=1e-8)
    assert np.abs(np.asarray(still.xs[-1]) - np.asarray(x0)).max() > 0.05  # the tokens interacted


def test_frequencies_are_traced(x64):
    x0 = mf.sphere.uniform(jax.random.key(0), 5, 2, jnp.float64)
    model = mf.kernels.USA(1.0)

    def final(w):
        return mf.simulate(model, x0, t1=0.5, dt=0.05, frequencies=w).xs[-1]

    ws = jax.random.normal(jax.random.key(1), (3, 5), jnp.float64)
    batched = jax.vmap(final)(ws)
    for i in range(3):
        np.testing.assert_allclose(batched[i], final(ws[i]), rtol=0, atol=1e-13)


def test_frequencies_with_noise_run():
    x0 = mf.sphere.uniform(jax.random.key(0), 16, 2)
    traj = mf.simulate(
        mf.kernels.USA(1.0),
        x0,
        t1=1.0,
        dt=0.05,
        frequencies=jnp.linspace(-1, 1, 16),
        noise=mf.noise.Independent(0.2),
        key=jax.random.key(5),
    )
    assert not bool(traj.failed) and np.all(np.isfinite(np.asarray(traj.xs)))


def test_refusals():
    x2 = mf.sphere.uniform(jax.random.key(0), 4, 2)
    x3 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    model = mf.kernels.USA(1.0)
    with pytest.raises(ValueError, match=r"angular velocities in d = 2; in d = 3 give"):
        mf.simulate(model, x3, t1=1.0, frequencies=jnp.ones(4))
    with pytest.raises(ValueError, match=r"must have shape \(4,\) \(d = 2\) or \(4, 2, 2\)"):
        mf.simulate(model, x2, t1=1.0, frequencies=jnp.ones(3))
    with pytest.raises(ValueError, match="skew-symmetric"):
        mf.simulate(model, x3, t1=1.0, frequencies=jnp.ones((4, 3, 3)))
    with pytest.raises(ValueError, match="normalization='pre' carries a radius"):
        mf.simulate(
            mf.models.SelfAttention(1.0, normalization="pre"), x2, t1=1.0, frequencies=jnp.ones(4)
        )
    with pytest.raises(ValueError, match="early_stop"):
        mf.simulate(model, x2, t1=1.0, frequencies=jnp.ones(4), early_stop=1e-3)


def test_non_finite_frequencies_are_refused_as_such():
    x2 = mf.sphere.uniform(jax.random.key(0), 4, 2)
    with pytest.raises(ValueError, match="frequencies must be finite"):
        mf.simulate(mf.kernels.USA(1.0), x2, t1=1.0, frequencies=jnp.array([0.0, jnp.nan, 1, 2]))
