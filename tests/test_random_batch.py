"""Random-batch integrator and mean-field convergence (meanfield.random_batch)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import random_batch as rb


@pytest.mark.parametrize(
    "mode,p,which",
    [("batch", 4, "usa"), ("batch", 4, "prompt"), ("batch", 6, "toeplitz"), ("sample", 3, "usa")],
)
def test_random_batch_field_is_unbiased(mode, p, which):
    n, d, draws = 12, 3, 3000
    kernel = {
        "usa": mf.kernels.USA(1.5),
        "prompt": mf.kernels.make("prompt", beta=1.0),
        "toeplitz": mf.kernels.Toeplitz(1),
    }[which]
    x = mf.sphere.uniform(jax.random.key(0), n, d)
    aux = kernel.default_aux(n)
    F = np.asarray(mf.field(kernel, x, aux), np.float64)
    keys = jax.random.split(jax.random.key(1), draws)
    Fh = np.asarray(
        jax.vmap(lambda k: rb.random_batch_field(kernel, x, aux, key=k, p=p, mode=mode))(keys),
        np.float64,
    )
    se = Fh.std(0, ddof=1) / np.sqrt(draws)
    z = (Fh.mean(0) - F) / np.maximum(se, 1e-12)
    # 36 entries: all within 4.5 standard errors (the chance of a false alarm is < 1e-3)
    assert np.max(np.abs(z)) < 4.5
    # a biased estimator is caught: dropping the self term shifts the mean by many SE
    assert np.max(np.abs((Fh.mean(0) - F - 0.2 * F) / np.maximum(se, 1e-12))) > 4.5


def test_full_batch_is_the_exact_field():
    x = mf.sphere.uniform(jax.random.key(0), 16, 3)
    k = mf.kernels.USA(2.0)
    Fh = rb.random_batch_field(k, x, key=jax.random.key(3), p=16)
    assert np.allclose(Fh, mf.field(k, x), atol=1e-5)


def test_field_error_decays_like_p_to_the_minus_half():
    n = 512
    x = mf.sphere.normalize(mf.sphere.uniform(jax.random.key(0), n, 3) + jnp.array([0.0, 0.0, 1.0]))
    ps = [2, 8, 32, 128]
    err = rb.field_errors(
        mf.kernels.USA(1.0), x, key=jax.random.key(1), ps=ps, num_draws=8, mode="sample"
    )
    slope, se = rb.fit_rate(ps, err.mean(1))
    assert abs(slope + 0.5) < 0.1
    assert np.all(np.diff(err.mean(1)) < 0)


def test_random_batch_with_p_equal_n_is_projected_heun():
    n = 32
    x0 = mf.sphere.uniform(jax.random.key(0), n, 3)
    k = mf.kernels.USA(1.0)
    run = rb.simulate_random_batch(k, x0, key=jax.random.key(1), p=n, t1=2.0, dt=0.1, num_saves=5)
    tr = mf.simulate(k, x0, t1=2.0, dt=0.1, ts=np.linspace(0, 2, 5))
    assert np.allclose(run.collapse_gap, tr.collapse_gap, atol=1e-5)
    assert np.allclose(run.x_final, tr.xs[-1], atol=1e-5)
    assert np.allclose(run.ts, np.linspace(0, 2, 5), atol=1e-6)


def test_collapse_gap_handles_large_n():
    """n(n-1) past int32 (n = 70000): the metric stays finite and exact on a Dirac."""
    big = jnp.tile(jnp.array([[0.0, 0.0, 1.0]]), (70000, 1))
    assert abs(float(mf.metrics.collapse_gap(big))) < 1e-6


def test_bad_input():
    x = mf.sphere.uniform(jax.random.key(0), 10, 3)
    k = mf.kernels.USA(1.0)
    with pytest.raises(ValueError, match="dividing"):
        rb.random_batch_field(k, x, key=jax.random.key(0), p=3)
    with pytest.raises(ValueError, match="mode"):
        rb.random_batch_field(k, x, key=jax.random.key(0), p=2, mode="bogus")
    with pytest.raises(ValueError, match="multiple"):
        rb.simulate_random_batch(k, x, key=jax.random.key(0), p=2, t1=1.0, dt=0.3, num_saves=3)


def test_meanfield_distance_at_time_zero_matches_the_closed_form():
    # uniform initial law on S^2, Gaussian kernel of bandwidth b:
    # E MMD^2(mu_n, mu_2n) = (3 / 2n) (1 - E k(x, x')),  E k(x, x') = (b^2 / 2)(1 - e^{-2/b^2})
    b, n, reps = 0.5, 24, 64
    D = rb.meanfield_distances(
        mf.kernels.USA(1.0),
        lambda k, m: mf.sphere.uniform(k, m, 3),
        [n],
        key=jax.random.key(0),
        ts=[0.0, 0.1],
        repeats=reps,
        dt=0.1,
        bandwidth=b,
    )
    assert D.shape == (1, 2, reps)
    m2 = D[0, 0] ** 2
    theory = 1.5 / n * (1 - 0.5 * b**2 * (1 - np.exp(-2 / b**2)))
    assert abs(m2.mean() - theory) < 4 * m2.std(ddof=1) / np.sqrt(reps)
    slope, _ = rb.fit_rate([10, 20, 40], [1.0, 1 / np.sqrt(2), 0.5])
    assert np.isclose(slope, -0.5)
