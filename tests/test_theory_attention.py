"""meanfield.theory, Section 2 (long-context attention): each function against its formula (docs/math/attention.md)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats

import meanfield as mf
from meanfield import theory

# ---------------------------------------------------------------- closed forms


@pytest.mark.parametrize("d", [2, 3, 5, 8])
def test_critical_beta_is_n_to_the_alpha(d):
    n = np.array([10.0, 1e3, 1e6])
    assert theory.attention_alpha(d) == pytest.approx(2 / (d - 1))
    np.testing.assert_allclose(theory.critical_beta(n, d), n ** (2 / (d - 1)), rtol=1e-6)
    assert float(theory.critical_beta(10_000, 5)) == pytest.approx(100.0, rel=1e-6)


def test_tail_constant_values():
    assert theory.tail_constant(5) == pytest.approx(0.75, abs=1e-12)
    # d = 3: T = 1 - <q, x> is uniform on [0, 2] for uniform keys, so P(T < t) = t / 2
    assert theory.tail_constant(3) == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize("d", range(2, 11))
def test_tail_constant_formula_and_density_option(d):
    # C = rho omega_{d-1} 2^{(d-1)/2}; uniform rho = Gamma(d/2) / (2 pi^{d/2})
    rho = math.gamma(d / 2) / (2 * math.pi ** (d / 2))
    ball = math.pi ** ((d - 1) / 2) / math.gamma((d + 1) / 2)
    expected = rho * ball * 2 ** ((d - 1) / 2)
    assert theory.tail_constant(d) == pytest.approx(expected, rel=1e-12)
    assert float(theory.tail_constant(d, rho)) == pytest.approx(expected, rel=1e-6)
    assert float(theory.tail_constant(d, 2 * rho)) == pytest.approx(2 * expected, rel=1e-6)
    # the same constant from the exact law T/2 ~ Beta(a, a), a = (d-1)/2: P(T < t) / t^{1/alpha} -> C
    a = (d - 1) / 2
    t = 1e-6
    assert special.betainc(a, a, t / 2) / t**a == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("d", [3, 5])
def test_tail_law_monte_carlo(d):
    # P(T < t) for uniform keys drawn with mf.sphere.uniform, against C t^{1/alpha} and the exact Beta CDF
    n, t = 200_000, 0.05
    x = mf.sphere.uniform(jax.random.key(d), n, d)
    T = 1.0 - np.asarray(x[:, 0], dtype=np.float64)
    p_hat = np.mean(T < t)
    a = (d - 1) / 2
    p_exact = special.betainc(a, a, t / 2)
    se = math.sqrt(p_exact * (1 - p_exact) / n)
    assert abs(p_hat - p_exact) < 4 * se
    # leading term: relative correction is O(t)
    assert p_exact == pytest.approx(theory.tail_constant(d) * t**a, rel=t)


def test_window_size_and_partition_function_formulas():
    # m_n = C n beta^{-1/alpha}; E[Z_n] ~ m_n Gamma(1/alpha + 1)
    assert float(theory.window_size(1000, 4.0, 5)) == pytest.approx(0.75 * 1000 / 16, rel=1e-6)
    # d = 3, rho(q) = 1: C = omega_2 * 2 = 2 pi
    assert float(theory.window_size(1000, 4.0, 3, 1.0)) == pytest.approx(
        2 * math.pi * 1000 / 4, rel=1e-6
    )
    assert float(theory.partition_function(1000, 10.0, 5)) == pytest.approx(
        0.75 * 1000 / 100 * 2, rel=1e-6
    )
    assert float(theory.partition_function(500, 2.0, 3)) == pytest.approx(
        0.5 * 500 / 2 * 1, rel=1e-6
    )


@pytest.mark.parametrize("d", [3, 4, 5, 7])
@pytest.mark.parametrize("beta", [0.5, 5.0, 80.0])
def test_partition_function_uniform_matches_quadrature(d, beta):
    # E[exp(-beta T)] = int_0^2 e^{-beta s} (s (2 - s))^{(d-3)/2} ds / normaliser
    w = lambda s: (s * (2 - s)) ** ((d - 3) / 2)  # noqa: E731
    num = integrate.quad(
        lambda s: np.exp(-beta * s) * w(s), 0, 2, points=[min(1.0, 5 / beta)], limit=200
    )[0]
    den = integrate.quad(w, 0, 2)[0]
    assert float(theory.partition_function_uniform(7, beta, d)) == pytest.approx(
        7 * num / den, rel=1e-7
    )


def test_partition_function_uniform_closed_forms():
    beta = np.array([0.0, 0.3, 3.0, 300.0])
    # d = 3: T uniform on [0, 2] -> (1 - e^{-2 beta}) / (2 beta); d = 5: (3/4) int s (2-s) e^{-beta s}
    b = beta[1:]
    np.testing.assert_allclose(
        theory.partition_function_uniform(1, b, 3), -np.expm1(-2 * b) / (2 * b), rtol=1e-10
    )
    assert theory.partition_function_uniform(1, 0.0, 3) == 1.0
    d5 = 1.5 / b**2 * (1 - 1 / b) + np.exp(-2 * b) * 1.5 / b**2 * (1 + 1 / b)
    np.testing.assert_allclose(theory.partition_function_uniform(1, b, 5), d5, rtol=1e-9)
    # the asymptotic prediction is the beta -> infinity limit (relative error 1/beta for d = 5)
    ratio = theory.partition_function_uniform(10, 1e4, 5) / float(
        theory.partition_function(10, 1e4, 5)
    )
    assert ratio == pytest.approx(1 - 1e-4, rel=1e-6)


def test_subcritical_profiles():
    x = np.array([0.0, 0.25, 1.0, 4.0])
    np.testing.assert_allclose(theory.subcritical_profile(x, 5), np.exp(-np.sqrt(x)), rtol=1e-6)
    np.testing.assert_allclose(theory.subcritical_profile(x, 3), np.exp(-x), rtol=1e-6)
    # cumulative = int_0^x exp(-y^alpha) dy / Gamma(1/alpha + 1) = P(1/alpha, x^alpha)
    np.testing.assert_allclose(theory.cumulative_profile(x, 3), 1 - np.exp(-x), atol=1e-6)
    for xi in [0.3, 1.0, 2.5]:
        integral = integrate.quad(lambda y: np.exp(-np.sqrt(y)), 0, xi)[0] / math.gamma(3)
        assert float(theory.cumulative_profile(xi, 5)) == pytest.approx(integral, abs=1e-6)


# ---------------------------------------------------------------- critical law


def test_critical_weights_shape_order_and_mass():
    W = np.asarray(theory.critical_weights(jax.random.key(0), 1.0, 5, 4, 500))
    assert W.shape == (500, 4)
    assert np.all(np.diff(W, axis=1) <= 1e-7)
    assert np.all(W.sum(1) <= 1 + 1e-6)
    assert np.all(W > 0)


@pytest.mark.parametrize(
    "gamma, expected",
    # docs/math/attention.md, Critical regime (quoted to 3 decimals); gamma = 1/16: small-gamma expansion
    # E[W_1] ~ (1 - E[sqrt(E)] / sqrt(c)) / (c Gamma(3)), c = 0.75 * 16^2, = 0.00244 (docs/math/attention.md: 0.0024)
    [(1 / 16, 0.00244), (1 / 4, 0.033), (1.0, 0.277), (4.0, 0.740), (16.0, 0.932)],
)
def test_critical_weights_mean_top_weight(gamma, expected):
    num = 10_000
    W1 = np.asarray(theory.critical_weights(jax.random.key(1), gamma, 5, 1, num))[:, 0]
    se = W1.std() / math.sqrt(num)
    assert abs(W1.mean() - expected) < 4 * se + 0.0015


def test_critical_weights_truncation_is_negligible():
    # the tail beyond `terms` points is replaced by its mean: 64 terms vs 2048 terms, same draws
    key = jax.random.key(2)
    a = np.asarray(theory.critical_weights(key, 1 / 4, 5, 2, 2000, terms=64))
    b = np.asarray(theory.critical_weights(key, 1 / 4, 5, 2, 2000, terms=2048))
    np.testing.assert_allclose(a.mean(0), b.mean(0), rtol=0.01)


def test_critical_weights_density_option_rescales_c():
    # c = C gamma^{-1/alpha}: doubling rho(q) equals gamma -> gamma 2^{-alpha}
    key = jax.random.key(3)
    rho_u = math.gamma(2.5) / (2 * math.pi**2.5)
    a = np.asarray(theory.critical_weights(key, 1.0, 5, 1, 300, density=2 * rho_u))
    b = np.asarray(theory.critical_weights(key, 2**-0.5, 5, 1, 300))
    np.testing.assert_allclose(a, b, rtol=1e-4)


def test_critical_weights_even_dimension_uses_gammaincc():
    W = np.asarray(theory.critical_weights(jax.random.key(4), 1.0, 4, 1, 2000))
    assert np.all(np.isfinite(W)) and 0.2 < W.mean() < 0.8


# ---------------------------------------------------------------- drift


def test_drift_formula_von_mises():
    # log rho = kappa x_3 on S^2: grad_S log rho(q) = kappa (e_3 - q_3 q); Y = that - q
    kappa = 2.5
    q = jnp.array([0.6, 0.0, 0.8])
    Y = np.asarray(theory.drift(q, lambda x: kappa * x[2]))
    e3 = np.array([0.0, 0.0, 1.0])
    expected = kappa * (e3 - 0.8 * np.asarray(q)) - np.asarray(q)
    np.testing.assert_allclose(Y, expected, atol=1e-6)


@pytest.mark.parametrize("d", [3, 6])
def test_drift_radial_part(d):
    q = mf.sphere.uniform(jax.random.key(d), 1, d)[0]
    Y = theory.drift(q, lambda x: jnp.sin(x[0]) * x[1] + x[-1] ** 3)
    assert float(jnp.dot(Y, q)) == pytest.approx(-(d - 1) / 2, abs=1e-5)


# ---------------------------------------------------------------- output limits (paper Sec. 4)


def _ks(x, cdf):
    return stats.kstest(np.asarray(x, np.float64), cdf).statistic


@pytest.mark.parametrize("d", [3, 5])
def test_supercritical_scale_formula(d):
    alpha = 2 / (d - 1)
    C = theory.tail_constant(d)
    assert float(theory.supercritical_scale(1e4, d)) == pytest.approx((C * 1e4) ** alpha, rel=1e-6)
    # a_n scales with rho(q)^alpha
    rho = 0.3
    C_rho = rho * math.pi ** ((d - 1) / 2) / math.gamma((d + 1) / 2) * 2 ** ((d - 1) / 2)
    assert float(theory.supercritical_scale(1e4, d, rho)) == pytest.approx(
        (C_rho * 1e4) ** alpha, rel=1e-6
    )
    assert float(theory.supercritical_scale(1e4, d, 2 * rho)) / float(
        theory.supercritical_scale(1e4, d, rho)
    ) == (pytest.approx(2**alpha, rel=1e-6))


@pytest.mark.parametrize("d", [3, 4, 5, 8])
def test_supercritical_radial_cdf_is_weibull(d):
    y = np.array([0.0, 0.1, 0.5, 1.0, 2.0, 4.0])
    expected = stats.weibull_min(c=(d - 1) / 2).cdf(y)
    np.testing.assert_allclose(theory.supercritical_radial_cdf(y, d), expected, atol=1e-6)


@pytest.mark.parametrize("d", [3, 5])
def test_nearest_distance_converges_to_the_radial_law(d):
    # independent: T_(1) of n uniform keys drawn exactly, T/2 ~ Beta(a, a): P(T_(1) > t) = (1 - F(t))^n,
    # so T_(1) = 2 I^{-1}_{a,a}(1 - U^{1/n}) (inverse regularised incomplete beta)
    n, num, a = 10**6, 20_000, (d - 1) / 2
    rng = np.random.default_rng(d)
    u = rng.random(num)
    t1 = 2 * special.betaincinv(a, a, -np.expm1(np.log(u) / n))
    R = float(theory.supercritical_scale(n, d)) * t1
    ks = _ks(R, lambda y: np.asarray(theory.supercritical_radial_cdf(y, d), np.float64))
    assert ks < 1.63 / math.sqrt(num)  # 1% critical value; the O(n^-alpha) correction is ~1e-3


@pytest.mark.parametrize("d", [3, 5])
def test_sample_supercritical_output_law(d):
    num = 20_000
    Phi = np.asarray(theory.sample_supercritical_output(jax.random.key(d), d, num), np.float64)
    assert Phi.shape == (num, d - 1)
    r2 = np.sum(Phi**2, 1)
    # |Phi|^2 / 2 = R_1 ~ Weibull((d-1)/2); |Phi| ~ Weibull(shape d - 1, scale sqrt 2)
    assert _ks(r2 / 2, stats.weibull_min(c=(d - 1) / 2).cdf) < 1.63 / math.sqrt(num)
    assert _ks(np.sqrt(r2), stats.weibull_min(c=d - 1, scale=math.sqrt(2)).cdf) < 1.63 / math.sqrt(
        num
    )
    # marks uniform on the unit sphere of R^{d-1}: mean 0, second moment I / (d - 1)
    theta = Phi / np.sqrt(r2)[:, None]
    np.testing.assert_allclose(theta.mean(0), 0.0, atol=4 / math.sqrt(num))
    np.testing.assert_allclose(
        theta.T @ theta / num, np.eye(d - 1) / (d - 1), atol=4 * math.sqrt(2 / num) / (d - 1)
    )


def _finite_outputs(key, n, d, betas, trials):
    """sqrt-free outputs Y_n(e_1) of ``trials`` uniform contexts (attention.displacement), (trials, b, d)."""
    q = jnp.zeros(d).at[0].set(1.0)

    @jax.jit
    def run(k):
        keys = mf.sphere.uniform(k, n, d)
        return jax.vmap(lambda b: mf.attention.displacement(q, keys, b))(jnp.asarray(betas))

    return np.asarray(jax.lax.map(run, jax.random.split(key, trials)), np.float64)


def test_supercritical_output_matches_finite_n():
    # uniform keys on S^3 (d = 4, alpha = 2/3, non-integer 1/alpha), beta = 1e4 n^alpha
    d, n, trials = 4, 5000, 400
    alpha = 2 / 3
    Y = _finite_outputs(jax.random.key(0), n, d, [1e4 * n**alpha], trials)[:, 0]
    a_n = float(theory.supercritical_scale(n, d))
    R = 0.5 * a_n * np.sum(Y[:, 1:] ** 2, 1)
    assert _ks(
        R, lambda y: np.asarray(theory.supercritical_radial_cdf(y, d), np.float64)
    ) < 1.63 / math.sqrt(trials)
    # the radial coordinate vanishes at the sqrt(a_n) scale: sqrt(a_n) <Y, q> = -sqrt(a_n) T* ~ a_n^{-1/2}
    assert np.max(np.abs(math.sqrt(a_n) * Y[:, 0])) < 20 / math.sqrt(a_n)


@pytest.mark.parametrize("d", [3, 4, 5])
@pytest.mark.xla_default
def test_sample_critical_output_small_gamma_is_the_subcritical_covariance(d):
    # gamma -> 0: Cov(Xi) -> 2^{-1/alpha - 1} / (c Gamma(1/alpha + 1)) I, c = C gamma^{-1/alpha}
    # (the subcritical beta Cov(Y_n) at beta = gamma n^alpha); the relative correction is O(1/c) (delta method)
    s = (d - 1) / 2
    gamma = 1 / 16
    c = theory.tail_constant(d) * gamma ** (-1 / (2 / (d - 1)))
    num = 20_000
    Xi = np.asarray(theory.sample_critical_output(jax.random.key(d), gamma, d, num), np.float64)
    assert Xi.shape == (num, d - 1)
    r2 = np.sum(Xi**2, 1) / (d - 1)
    expected = 2 ** (-s - 1) / (c * math.gamma(s + 1))
    kappa = (3 * 2**-s - 2 * (2 / 3) ** (s + 1)) / math.gamma(s + 1)
    se = r2.std() / math.sqrt(num)
    assert abs(r2.mean() - expected * (1 + kappa / c)) < 4 * se + 2 * abs(kappa / c) * expected
    np.testing.assert_allclose(Xi.mean(0), 0.0, atol=4 * math.sqrt(expected / num))


@pytest.mark.xla_default
def test_sample_critical_output_large_gamma_is_the_supercritical_law():
    # gamma -> infinity: sqrt(beta) Y = sqrt(gamma / C^alpha) sqrt(a_n) Y, so Xi sqrt(C^alpha / gamma) -> Phi
    d, gamma, num = 5, 1e4, 20_000
    alpha = 0.5
    Xi = np.asarray(theory.sample_critical_output(jax.random.key(1), gamma, d, num), np.float64)
    R = 0.5 * np.sum(Xi**2, 1) * theory.tail_constant(d) ** alpha / gamma
    assert _ks(
        R, lambda y: np.asarray(theory.supercritical_radial_cdf(y, d), np.float64)
    ) < 1.63 / math.sqrt(num)


@pytest.mark.slow
@pytest.mark.xla_default
def test_sample_critical_output_matches_finite_n():
    # independent: outputs of n uniform keys on S^4 at beta = gamma n^alpha, through attention.displacement
    d, n, trials = 5, 10_000, 600
    gammas = [0.25, 1.0, 4.0]
    Y = _finite_outputs(jax.random.key(2), n, d, [g * n**0.5 for g in gammas], trials)
    for i, g in enumerate(gammas):
        finite = math.sqrt(g * n**0.5) * np.linalg.norm(Y[:, i, 1:], axis=1)
        Xi = np.asarray(
            theory.sample_critical_output(jax.random.key(10 + i), g, d, 20_000), np.float64
        )
        limit = np.linalg.norm(Xi, axis=1)
        assert stats.ks_2samp(finite, limit).statistic < 1.8 * math.sqrt(
            1 / trials + 1 / limit.size
        )
        se = math.sqrt(np.var(finite**2) / trials + np.var(limit**2) / limit.size)
        assert abs(np.mean(finite**2) - np.mean(limit**2)) < 4 * se


@pytest.mark.xla_default
def test_sample_critical_output_truncation_is_negligible():
    # the points beyond `terms` enter through the mean (denominator) and a Gaussian of the exact variance
    # (numerator): 32 terms and 1024 terms give the same law
    num = 10_000
    a = np.asarray(
        theory.sample_critical_output(jax.random.key(3), 0.25, 5, num, terms=32), np.float64
    )
    b = np.asarray(
        theory.sample_critical_output(jax.random.key(4), 0.25, 5, num, terms=1024), np.float64
    )
    ra, rb = np.sum(a**2, 1), np.sum(b**2, 1)
    se = math.sqrt(ra.var() / num + rb.var() / num)
    assert abs(ra.mean() - rb.mean()) < 4 * se
    assert stats.ks_2samp(ra, rb).statistic < 1.63 * math.sqrt(2 / num)


def test_sample_critical_output_density_option_rescales_c():
    # c = C gamma^{-1/alpha}: doubling rho(q) equals gamma -> gamma 2^{-alpha} (same draws)
    rho_u = math.gamma(2.5) / (2 * math.pi**2.5)
    a = np.asarray(theory.sample_critical_output(jax.random.key(5), 1.0, 5, 300, density=2 * rho_u))
    b = np.asarray(theory.sample_critical_output(jax.random.key(5), 2**-0.5, 5, 300))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("d", [2, 3, 4, 5, 7])
def test_fluctuation_constant_from_the_exact_uniform_moments(d):
    # independent: for uniform keys T/2 ~ Beta(a, a) and |P_q (x - q)|^2 = T (2 - T); then
    # r_n^2 Cov(Y_n) ~ beta^{1 - 1/alpha} E[T(2-T) e^{-2 beta T}] / ((d-1) E[e^{-beta T}]^2) P_q -> c_d / rho P_q
    assert theory.fluctuation_constant(d) == pytest.approx(
        2.0**-d * math.pi ** (-(d - 1) / 2), rel=1e-12
    )
    a, s = (d - 1) / 2, (d - 1) / 2
    beta = 2e4
    dens = stats.beta(a, a).pdf
    m2 = integrate.quad(
        lambda t: t * (2 - t) * np.exp(-2 * beta * t) * dens(t / 2) / 2, 0, 60 / beta, limit=200
    )[0]
    m1 = integrate.quad(lambda t: np.exp(-beta * t) * dens(t / 2) / 2, 0, 60 / beta, limit=200)[0]
    value = beta ** (1 - s) * m2 / ((d - 1) * m1**2)
    rho = math.gamma(d / 2) / (2 * math.pi ** (d / 2))
    assert value == pytest.approx(theory.fluctuation_constant(d) / rho, rel=20 / beta)


def test_fluctuation_covariance_matrix():
    q = jnp.array([0.6, 0.0, 0.8])
    S = np.asarray(theory.fluctuation_covariance(q), np.float64)
    c3 = 1 / (8 * math.pi)
    P = np.eye(3) - np.outer(q, q)
    np.testing.assert_allclose(S, c3 * 4 * math.pi * P, atol=1e-6)  # uniform rho = 1 / (4 pi)
    np.testing.assert_allclose(
        np.asarray(theory.fluctuation_covariance(q, 0.5)), c3 / 0.5 * P, atol=1e-6
    )
    np.testing.assert_allclose(S @ np.asarray(q), 0.0, atol=1e-6)


def test_regime_scales_are_consistent():
    n, d = 1e5, 3
    b = float(theory.fluctuation_beta(n, d))
    assert b == pytest.approx(n**0.5, rel=1e-6)
    assert float(theory.drift_fluctuation_tau(n, b, d)) == pytest.approx(1.0, rel=1e-5)
    for d in [3, 5]:
        alpha = 2 / (d - 1)
        beta = 37.0
        tau = float(theory.drift_fluctuation_tau(n, beta, d))
        assert tau == pytest.approx(beta ** (1 + alpha) * n ** (-alpha), rel=1e-5)
        r_n = float(theory.fluctuation_scale(n, beta, d))
        assert r_n == pytest.approx(math.sqrt(n * beta ** (1 - 1 / alpha)), rel=1e-5)
        # the mixed-regime covariance tau^{1/alpha} Sigma of beta Y_n is Sigma of r_n Y_n: beta^2 / r_n^2 = tau^{1/alpha}
        assert beta**2 / r_n**2 == pytest.approx(tau ** (1 / alpha), rel=1e-4)


@pytest.mark.slow
def test_fluctuation_covariance_monte_carlo():
    # uniform keys on S^2, tau = beta^2 / n = 10 (fluctuation dominated), queries +-e_i (disjoint windows)
    d, n, contexts = 3, 20_000, 300
    beta = math.sqrt(10 * n)
    Q = jnp.concatenate([jnp.eye(d), -jnp.eye(d)])

    @jax.jit
    def run(k):
        keys = mf.sphere.uniform(k, n, d)
        return jax.vmap(lambda q: mf.attention.displacement(q, keys, beta))(Q)

    Y = np.asarray(
        jax.lax.map(run, jax.random.split(jax.random.key(6), contexts)), np.float64
    )  # (K, 6, 3)
    r_n = float(theory.fluctuation_scale(n, beta, d))
    covs = np.stack([np.cov(r_n * Y[:, i].T) for i in range(Q.shape[0])])
    Sigma = np.stack([np.asarray(theory.fluctuation_covariance(q), np.float64) for q in Q])
    m_n = float(theory.window_size(n, beta, d))
    bias = (1.5 - 2 * (2 / 3) ** 2) / m_n  # leading finite-window term (delta method), ~ +3%
    tr, tr_th = np.trace(covs, axis1=1, axis2=2), np.trace(Sigma, axis1=1, axis2=2)
    se = np.sqrt(2 / (2 * (contexts - 1) * Q.shape[0]))  # relative SE of the pooled variance
    assert abs(tr.mean() / tr_th.mean() - 1 - bias) < 4 * se
    # zero variance along q, no correlation across tangent directions beyond noise
    assert np.max(np.abs(covs - Sigma * (1 + bias))) < 8 * se * tr_th.mean() / 2


# ---------------------------------------------------------------- bad input


def test_bad_inputs():
    with pytest.raises(ValueError, match="d must be >= 2"):
        theory.tail_constant(1)
    with pytest.raises(TypeError, match="d must be an int"):
        theory.critical_beta(10, 5.0)
    with pytest.raises(ValueError, match="density must be > 0"):
        theory.tail_constant(5, -1.0)
    with pytest.raises(ValueError, match="beta must be > 0"):
        theory.window_size(10, 0.0, 5)
    with pytest.raises(ValueError, match="gamma must be > 0"):
        theory.critical_weights(jax.random.key(0), -1.0, 5, 1, 10)
    with pytest.raises(ValueError, match="terms must be >= 3"):
        theory.critical_weights(jax.random.key(0), 1.0, 5, 3, 10, terms=2)
    with pytest.raises(ValueError, match="x must be >= 0"):
        theory.subcritical_profile(-1.0, 5)
    with pytest.raises(TypeError, match="log_density must be a callable"):
        theory.drift(jnp.ones(3), 3.0)
    with pytest.raises(ValueError, match="q must be one query"):
        theory.drift(jnp.ones((2, 3)), lambda x: x[0])
    with pytest.raises(ValueError, match="gamma must be > 0"):
        theory.sample_critical_output(jax.random.key(0), 0.0, 5, 10)
    with pytest.raises(ValueError, match="num must be >= 1"):
        theory.sample_critical_output(jax.random.key(0), 1.0, 5, 0)
    with pytest.raises(ValueError, match="d must be >= 2"):
        theory.sample_supercritical_output(jax.random.key(0), 1, 10)
    with pytest.raises(ValueError, match="y must be >= 0"):
        theory.supercritical_radial_cdf(-1.0, 3)
    with pytest.raises(ValueError, match="density must be > 0"):
        theory.fluctuation_covariance(jnp.array([1.0, 0.0, 0.0]), -1.0)
    with pytest.raises(ValueError, match="q must be one query"):
        theory.fluctuation_covariance(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="beta must be > 0"):
        theory.drift_fluctuation_tau(10, 0.0, 3)
    with pytest.raises(ValueError, match="n must be > 0"):
        theory.supercritical_scale(0, 3)
