"""Dependent and RoPE-rotated keys (meanfield.attention key processes; reproduce/attention_keys.py).

Laws are checked against closed forms (uniform marginals, the AR(1) direction correlation
E<x_j, x_(j+l)> = (2/d) Gamma((d+1)/2)^2 / Gamma(d/2)^2 r 2F1(1/2, 1/2; d/2 + 1; r^2), r = phi^l) with
fixed seeds and tolerances of several Monte Carlo standard errors; consecutive keys are dependent,
so laws are taken over independent contexts at fixed positions.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as ss
from scipy.integrate import quad
from scipy.special import gamma as G
from scipy.special import hyp2f1

import meanfield as mf
from meanfield import attention
from meanfield.reproduce import attention_keys

D = 5


def _contexts(proc, num, n, chunk, seed=0):
    """``(num, n, d)``: ``num`` independent contexts of ``proc`` (float64 on the host)."""
    keys = jax.random.split(jax.random.key(seed), num)
    return np.asarray(jax.vmap(lambda k: proc.draw(k, n, chunk=chunk))(keys), dtype=np.float64)


def _ar_direction_correlation(r, d):
    return (2 / d) * (G((d + 1) / 2) / G(d / 2)) ** 2 * r * hyp2f1(0.5, 0.5, d / 2 + 1, r * r)


def _uniform_first_coordinate_pvalue(x1, d):
    # x_1 of a uniform point on S^(d-1): (1 + x_1)/2 ~ Beta((d-1)/2, (d-1)/2)
    a = (d - 1) / 2
    return ss.kstest((1 + x1) / 2, ss.beta(a, a).cdf).pvalue


# ------------------------------------------------------------------------------------------------
# Gaussian AR(1) directions
# ------------------------------------------------------------------------------------------------


def test_ar_keys_stationary_uniform_marginals_and_correlation_decay():
    phi, num, n, chunk = 0.8, 4000, 48, 16  # chunk < n: the state crosses two chunk boundaries
    X = _contexts(attention.GaussianARKeys(D, phi), num, n, chunk)
    assert np.allclose(np.linalg.norm(X, axis=-1), 1.0, atol=1e-5)
    for j in (
        0,
        15,
        16,
        47,
    ):  # first key, both sides of a chunk boundary, last key: same uniform law
        assert _uniform_first_coordinate_pvalue(X[:, j, 0], D) > 1e-3
        second = X[:, j].T @ X[:, j] / num  # E[x x^T] = I/d
        assert np.abs(second - np.eye(D) / D).max() < 6 * math.sqrt(3 / (D * (D + 2)) / num)
    for lag in (1, 2, 5, 12):
        for j in (3, 15):  # within a chunk, and across the boundary 15 | 16
            c = np.sum(X[:, j] * X[:, j + lag], axis=1)
            theory = _ar_direction_correlation(phi**lag, D)
            assert abs(c.mean() - theory) < 5 * c.std() / math.sqrt(num), (lag, j, c.mean(), theory)
    # decays geometrically: at lag 30 the correlation is phi^30 ~ 1e-3
    c = np.sum(X[:, 0] * X[:, 30], axis=1)
    assert abs(c.mean()) < 5 * c.std() / math.sqrt(num)


def test_ar_keys_phi_zero_is_iid_uniform():
    X = _contexts(attention.GaussianARKeys(D, 0.0), 3000, 4, 4)
    c = np.sum(X[:, 0] * X[:, 1], axis=1)
    assert abs(c.mean()) < 5 * c.std() / math.sqrt(c.size)
    assert _uniform_first_coordinate_pvalue(X[:, 1, 0], D) > 1e-3


@pytest.mark.xla_default
def test_stream_of_a_process_equals_its_materialised_context():
    # sampled_context_stats on a process == context_stats on process.draw(key, n, chunk) (same chunks)
    q = jnp.zeros(D).at[0].set(1.0)
    for proc in (
        attention.GaussianARKeys(D, 0.9),
        attention.RoPEKeys(D),
        attention.StickyKeys(D, 0.5),
    ):
        key, n, chunk = jax.random.key(7), 1000, 128
        keys = proc.draw(key, n, chunk=chunk)
        dense = attention.context_stats(q, keys, 30.0, k=3, chunk=n)
        stream = attention.sampled_context_stats(key, q, 30.0, n, proc, k=3, chunk=chunk)
        np.testing.assert_allclose(stream.top_weights, dense.top_weights, rtol=1e-5)
        np.testing.assert_allclose(stream.log_partition, dense.log_partition, rtol=1e-5)
        np.testing.assert_allclose(stream.displacement, dense.displacement, atol=1e-6)
        np.testing.assert_allclose(
            dense.top_weights, attention.top_weights(q, keys, 30.0, 3), rtol=1e-5
        )


# ------------------------------------------------------------------------------------------------
# RoPE
# ------------------------------------------------------------------------------------------------


def test_rope_rotate_preserves_norms_and_sees_relative_positions():
    keys = mf.sphere.uniform(jax.random.key(1), 50, 6) * 3.0
    thetas = attention.rope_frequencies(6)
    pos = jnp.arange(50) * 1.0
    out = attention.rope_rotate(keys, pos, thetas)
    np.testing.assert_allclose(
        jnp.linalg.norm(out, axis=1), jnp.linalg.norm(keys, axis=1), rtol=1e-5
    )
    # <R(p_q) q, R(p_j) x_j> = <q, R(p_j - p_q) x_j>
    q = mf.sphere.uniform(jax.random.key(2), 1, 6)
    pq = 17.0
    lhs = attention.rope_rotate(jnp.repeat(q, 50, 0), jnp.full(50, pq), thetas) @ out.T
    rhs = q @ attention.rope_rotate(keys, pos - pq, thetas).T
    np.testing.assert_allclose(jnp.diag(lhs), rhs[0], atol=1e-5)
    # plane (0, 1) turns by theta_0 p, in sphere.rotation's convention; odd last coordinate untouched
    x = jnp.array([[1.0, 0.0, 0.0, 0.0, 2.0]])
    R = mf.sphere.rotation(0.7, 5)
    np.testing.assert_allclose(
        attention.rope_rotate(x, jnp.array([0.7]), jnp.array([1.0, 0.0]))[0], R @ x[0], atol=1e-6
    )
    np.testing.assert_allclose(attention.rope_frequencies(5), [1.0, 0.01], rtol=1e-6)


def test_rope_keys_rotate_the_base_context_by_position():
    base = attention.GaussianARKeys(D, 0.5)
    proc = attention.RoPEKeys(D, base, offset=3)
    key = jax.random.key(3)
    np.testing.assert_allclose(
        proc.draw(key, 300, chunk=64),
        attention.rope_rotate(
            base.draw(key, 300, chunk=64), jnp.arange(300) + 3, attention.rope_frequencies(D)
        ),
        atol=1e-6,
    )


def test_rope_keys_uniform_base_keeps_the_uniform_law():
    X = _contexts(attention.RoPEKeys(D), 3000, 40, 16)
    np.testing.assert_allclose(np.linalg.norm(X, axis=-1), 1.0, atol=1e-5)
    for j in (0, 7, 39):  # rotation invariance: every position stays uniform
        assert _uniform_first_coordinate_pvalue(X[:, j, 0], D) > 1e-3
        assert _uniform_first_coordinate_pvalue(X[:, j, 3], D) > 1e-3


def test_rope_keys_over_a_peaked_law_have_the_orbit_averaged_density():
    # base rho propto (1 + x_1)^2: key j has x_1 = cos(j) k_1 - sin(j) k_2; its law follows from the base law
    base = attention_keys._cap_sampler
    k = np.asarray(base(jax.random.key(4), 200_000), dtype=np.float64)
    assert np.abs(np.linalg.norm(k, axis=1) - 1).max() < 1e-5
    assert ss.kstest((1 + k[:, 0]) / 2, ss.beta(4, 2).cdf).pvalue > 1e-3  # (1 + x_1)/2 ~ Beta(4, 2)
    # the orthogonal part is uniform on S^3: E[k_2^2] = (1 - E[k_1^2]) / 4
    assert abs(np.mean(k[:, 1] ** 2) - (1 - np.mean(k[:, 0] ** 2)) / 4) < 5 * np.std(
        k[:, 1] ** 2
    ) / math.sqrt(k.shape[0])
    # E[(1 + x_1)^2] under the base law = E_unif[(1 + x_1)^4] / E_unif[(1 + x_1)^2]
    # = (1 + 6/5 + 3/35) / (1 + 1/5) (uniform moments E x_1^2 = 1/5, E x_1^4 = 3/35 on S^4)
    m = np.mean((1 + k[:, 0]) ** 2)
    assert abs(m - (1 + 6 / 5 + 3 / 35) / 1.2) < 5 * np.std((1 + k[:, 0]) ** 2) / math.sqrt(
        k.shape[0]
    )
    finite, limit, unrotated = attention_keys.rope_density(10_000)
    Z = 2 * math.pi**2.5 / math.gamma(2.5) * 1.2
    assert limit == pytest.approx(1.5 / Z, rel=1e-12)
    assert unrotated == pytest.approx(4 / Z, rel=1e-12)
    assert finite == pytest.approx(limit, rel=1e-3)  # Weyl equidistribution of j mod 2 pi
    # near-query count of the rotated keys: sum_j P(T_j < t) = n P(T < t) under the orbit average
    # h(x) = (1 + (x_0^2 + x_1^2)/2) / Z; on the slice x_0 = 1 - s (radius^2 s(2 - s), surface element
    # s(2 - s) ds on S^4 times S^3), E[x_1^2] = s(2 - s)/4: an exact one-dimensional integral
    proc = attention.RoPEKeys(D, base)
    X = np.asarray(proc.draw(jax.random.key(5), 400_000, chunk=65_536), dtype=np.float64)
    t = 0.08
    count = np.sum(1 - X[:, 0] < t)
    integrand = lambda s: s * (2 - s) * (1 + ((1 - s) ** 2 + s * (2 - s) / 4) / 2)  # noqa: E731
    p = 2 * math.pi**2 * quad(integrand, 0.0, t)[0] / Z
    expected = X.shape[0] * p
    assert abs(count - expected) < 5 * math.sqrt(expected), (count, expected)
    # and against the unrotated base law the count is far off (2.7x the density at q)
    assert np.sum(1 - k[:, 0] < t) * 2 > 2.2 * expected


# ------------------------------------------------------------------------------------------------
# clustered keys and the compound Poisson limit
# ------------------------------------------------------------------------------------------------


def test_sticky_keys_repeat_rate_and_uniform_marginal():
    stay, num, n = 0.5, 3000, 40
    X = _contexts(attention.StickyKeys(D, stay), num, n, 16)
    same = np.all(X[:, 1:] == X[:, :-1], axis=-1)
    assert abs(same.mean() - stay) < 5 * math.sqrt(stay * (1 - stay) / same.size)
    assert abs(same[:, 15].mean() - stay) < 5 * math.sqrt(
        stay * (1 - stay) / num
    )  # across a chunk boundary
    for j in (0, 16, 39):
        assert _uniform_first_coordinate_pvalue(X[:, j, 0], D) > 1e-3


def test_clustered_limit_without_clusters_is_the_poisson_limit():
    rng = np.random.default_rng(0)
    w = attention_keys.clustered_critical_weights(rng, 1.0, D, 0.0, 20_000)
    W = np.asarray(mf.theory.critical_weights(jax.random.key(0), 1.0, D, 1, 20_000))[:, 0]
    se = math.sqrt(w.var() / w.size + W.var() / W.size)
    assert abs(w.mean() - W.mean()) < 4 * se
    assert ss.ks_2samp(w, W).statistic < 1.36 * math.sqrt(2 / 20_000) * 1.5
    # with clusters the top weight is smaller (each cluster splits its mass among identical keys)
    wc = attention_keys.clustered_critical_weights(rng, 1.0, D, 0.5, 20_000)
    assert wc.mean() < W.mean() - 10 * se
    assert np.all((wc > 0) & (wc <= 1))


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------


def test_bad_process_arguments_raise_one_clear_error():
    with pytest.raises(ValueError, match=r"phi must be in \(-1, 1\)"):
        attention.GaussianARKeys(D, 1.0)
    with pytest.raises(TypeError, match="phi must be a real scalar"):
        attention.GaussianARKeys(D, True)
    with pytest.raises(ValueError, match=r"stay must be in \[0, 1\)"):
        attention.StickyKeys(D, 1.0)
    with pytest.raises(ValueError, match="thetas must have shape"):
        attention.RoPEKeys(D, thetas=[1.0])
    with pytest.raises(ValueError, match="base process has d = 3"):
        attention.RoPEKeys(D, attention.GaussianARKeys(3, 0.5))
    with pytest.raises(TypeError, match="base must be a key process"):
        attention.RoPEKeys(D, base=3)
    with pytest.raises(ValueError, match="base must be > 1"):
        attention.rope_frequencies(4, base=1.0)
    with pytest.raises(ValueError, match="key process in dimension d = 3"):
        attention.sample_top_weights(
            jax.random.key(0), 10, [1.0], D, 2, sampler=attention.GaussianARKeys(3, 0.5)
        )
    with pytest.raises(TypeError, match="sampler must be a callable"):
        attention.sampled_context_stats(
            jax.random.key(0), jnp.ones(D) / math.sqrt(D), 1.0, 10, sampler=3
        )
    with pytest.raises(ValueError, match="positions must have shape"):
        attention.rope_rotate(jnp.ones((3, 4)), jnp.arange(2), jnp.ones(2))
    with pytest.raises(ValueError, match=r"stay must be in \[0, 1\)"):
        attention_keys.clustered_critical_weights(np.random.default_rng(0), 1.0, D, 1.5, 10)


# ------------------------------------------------------------------------------------------------
# the reproduction rows
# ------------------------------------------------------------------------------------------------


# The rows themselves (meanfield.reproduce.attention_keys._key_checks: dependent_tokens*, rope_keys*,
# well formed, named once, all passing, the figure and the timings) are checked in the quick
# reproduction, tests/test_attention.py::test_reproduce_attention_quick, which runs them at the quick
# sizes; a second run here at smaller sizes was merged into it (CI time, issue 31).


def test_mean_top_weight_grid_returns_its_samples():
    ar = attention.GaussianARKeys(D, 0.5)
    m, se, A1 = attention.mean_top_weight_grid(
        jax.random.key(0), [20, 50], [1.0, 30.0], D, 16, sampler=ar, samples=True
    )
    assert A1.shape == (2, 16, 2)
    np.testing.assert_allclose(A1.mean(axis=1), m, rtol=1e-12)
    np.testing.assert_allclose(A1.std(axis=1, ddof=1) / 4.0, se, rtol=1e-12)
    m2, se2 = attention.mean_top_weight_grid(
        jax.random.key(0), [20, 50], [1.0, 30.0], D, 16, sampler=ar
    )
    np.testing.assert_array_equal(m, m2)
