"""meanfield.theory, Section 2 (long-context attention): each function against its formula (MATH.md Sec. 2)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special

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
    assert p_exact == pytest.approx(theory.tail_constant(d) * t ** a, rel=t)


def test_window_size_and_partition_function_formulas():
    # m_n = C n beta^{-1/alpha}; E[Z_n] ~ m_n Gamma(1/alpha + 1)
    assert float(theory.window_size(1000, 4.0, 5)) == pytest.approx(0.75 * 1000 / 16, rel=1e-6)
    # d = 3, rho(q) = 1: C = omega_2 * 2 = 2 pi
    assert float(theory.window_size(1000, 4.0, 3, 1.0)) == pytest.approx(2 * math.pi * 1000 / 4, rel=1e-6)
    assert float(theory.partition_function(1000, 10.0, 5)) == pytest.approx(0.75 * 1000 / 100 * 2, rel=1e-6)
    assert float(theory.partition_function(500, 2.0, 3)) == pytest.approx(0.5 * 500 / 2 * 1, rel=1e-6)


@pytest.mark.parametrize("d", [3, 4, 5, 7])
@pytest.mark.parametrize("beta", [0.5, 5.0, 80.0])
def test_partition_function_uniform_matches_quadrature(d, beta):
    # E[exp(-beta T)] = int_0^2 e^{-beta s} (s (2 - s))^{(d-3)/2} ds / normaliser
    w = lambda s: (s * (2 - s)) ** ((d - 3) / 2)  # noqa: E731
    num = integrate.quad(lambda s: np.exp(-beta * s) * w(s), 0, 2, points=[min(1.0, 5 / beta)], limit=200)[0]
    den = integrate.quad(w, 0, 2)[0]
    assert float(theory.partition_function_uniform(7, beta, d)) == pytest.approx(7 * num / den, rel=1e-7)


def test_partition_function_uniform_closed_forms():
    beta = np.array([0.0, 0.3, 3.0, 300.0])
    # d = 3: T uniform on [0, 2] -> (1 - e^{-2 beta}) / (2 beta); d = 5: (3/4) int s (2-s) e^{-beta s}
    b = beta[1:]
    np.testing.assert_allclose(theory.partition_function_uniform(1, b, 3), -np.expm1(-2 * b) / (2 * b), rtol=1e-10)
    assert theory.partition_function_uniform(1, 0.0, 3) == 1.0
    d5 = 1.5 / b**2 * (1 - 1 / b) + np.exp(-2 * b) * 1.5 / b**2 * (1 + 1 / b)
    np.testing.assert_allclose(theory.partition_function_uniform(1, b, 5), d5, rtol=1e-9)
    # the asymptotic prediction is the beta -> infinity limit (relative error 1/beta for d = 5)
    ratio = theory.partition_function_uniform(10, 1e4, 5) / float(theory.partition_function(10, 1e4, 5))
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
    # MATH.md Sec. 2 (quoted to 3 decimals); gamma = 1/16: small-gamma expansion
    # E[W_1] ~ (1 - E[sqrt(E)] / sqrt(c)) / (c Gamma(3)), c = 0.75 * 16^2, = 0.00244 (MATH.md: "about 0.003")
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
