"""The output-limit stages of ``meanfield reproduce attention`` (paper Sec. 4: Thm 4.1-4.3).

The whole quick experiment runs end to end in tests/test_attention.py; here the new helpers are
checked against independent computations (the three stages run end to end there).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import meanfield as mf
from meanfield import theory
from meanfield.reproduce import attention as rep


def test_query_outputs_equal_the_dense_displacement():
    # A @ keys - q (one matmul for all queries) against attention.displacement, query by query
    key = jax.random.key(0)
    Q = mf.sphere.uniform(jax.random.key(1), 4, 3)
    betas = jnp.asarray([3.0, 300.0])
    Y = np.asarray(rep._query_outputs(key, Q, betas, 500, 2, rep._density_keys), np.float64)
    assert Y.shape == (2, 4, 2, 3)
    for c, kc in enumerate(jax.random.split(key, 2)):
        keys = rep._density_keys(kc, 500)
        for i in range(4):
            for j in range(2):
                expected = np.asarray(mf.attention.displacement(Q[i], keys, betas[j]), np.float64)
                np.testing.assert_allclose(Y[c, i, j], expected, atol=2e-6, rtol=1e-4)


def test_ks_helpers_match_scipy():
    x = np.random.default_rng(0).exponential(size=500)
    assert rep._ks_one_sample(x, stats.expon.cdf) == pytest.approx(
        stats.kstest(x, "expon").statistic, abs=1e-12
    )
    assert rep._ks_critical(0.05) == pytest.approx(1.358, abs=1e-3)
    assert rep._ks_critical(0.01) == pytest.approx(1.628, abs=1e-3)


def test_regime_stats_on_gaussian_samples():
    # Z = beta P_q Y_n with known mean and covariance: ratio, drift, fluctuation and c_hat recovered
    rng = np.random.default_rng(1)
    K, Qn, d = 400, 50, 3
    taus = np.array([0.5, 2.0])
    alpha = 1.0
    c_d = theory.fluctuation_constant(d)
    rho = rng.uniform(0.05, 0.12, Qn)
    mean = rng.normal(size=(Qn, 2)) * 0.7
    sd = np.sqrt(taus[None, :] ** (1 / alpha) * c_d / rho[:, None])  # (Q, T)
    Z = mean[None, :, None, :] + sd[None, :, :, None] * rng.normal(size=(K, Qn, taus.size, 2))
    ratio, drift, fluct, chat = rep._regime_stats(Z, rho, taus, alpha, d)
    drift_th = math.sqrt(np.mean(np.sum(mean**2, 1)))
    fluct_th = np.sqrt(np.mean(2 * sd**2, 0))
    np.testing.assert_allclose(drift, drift_th, rtol=0.03)
    np.testing.assert_allclose(fluct, fluct_th, rtol=0.03)
    np.testing.assert_allclose(ratio, drift_th / fluct_th, rtol=0.05)
    np.testing.assert_allclose(chat, c_d, rtol=0.03)


# The three output stages (supercritical, critical, fluctuation regimes), their own bounds and their
# figures are checked on the quick reproduction's own run in
# tests/test_attention.py::test_reproduce_attention_quick; a second run at smaller sizes here was
# merged there to keep CI under 30 minutes.


def test_settings_full_is_larger():
    q, f = rep._settings(True), rep._settings(False)
    assert f["super_contexts"] > q["super_contexts"]
    assert f["crit_out_n"] > q["crit_out_n"] and f["crit_out_contexts"] > q["crit_out_contexts"]
    assert max(f["regime_ns"]) > max(q["regime_ns"]) and len(f["regime_taus"]) > len(
        q["regime_taus"]
    )
    # the tau = 1 column (the drift/fluctuation transition) is on both grids
    for s in (q, f):
        assert np.min(np.abs(np.log(s["regime_taus"]))) < 1e-9
