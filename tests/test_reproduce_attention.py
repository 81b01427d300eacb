"""The output-limit stages of ``meanfield reproduce attention`` (paper Sec. 4: Thm 4.1-4.3).

The whole quick experiment runs end to end in tests/test_attention.py; here the new helpers are
checked against independent computations and the three stages run at small sizes.
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
    assert rep._ks_one_sample(x, stats.expon.cdf) == pytest.approx(stats.kstest(x, "expon").statistic, abs=1e-12)
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


@pytest.mark.slow
def test_output_stages_at_small_sizes(tmp_path):
    st = rep._settings(True)
    st.update(
        super_n=4000, super_queries=32, super_contexts=16,
        crit_out_n=4000, crit_out_gammas=[1.0, 4.0], crit_out_contexts=40, crit_out_limit_samples=4000,
        regime_ns=[4000, 16_000], regime_taus=[1 / 8, 1.0, 8.0], regime_queries=32, regime_contexts=16,
    )
    checks: list[dict] = []
    key = jax.random.key(3)
    sup = rep._supercritical_output(jax.random.fold_in(key, 0), st, checks)
    cro = rep._critical_output(jax.random.fold_in(key, 1), st, checks)
    reg = rep._output_regimes(jax.random.fold_in(key, 2), st, checks)
    by = {c["name"]: c for c in checks}
    assert list(by) == [
        "supercritical_output", "supercritical_output_mark", "critical_output",
        "critical_output_second_moment", "fluctuation_covariance", "output_regimes", "drift_fluctuation_ratio",
    ]
    for c in checks:
        assert set(c) == {"name", "theory", "measured", "tolerance", "pass", "note"} and c["note"]
    # own bounds, independent of the rows' tolerances
    assert by["supercritical_output"]["measured"] < 2.0 / math.sqrt(32 * 16)
    assert by["supercritical_output_mark"]["measured"] < stats.chi2.ppf(0.9999, 4)
    assert by["critical_output"]["measured"] < 0.12
    assert by["critical_output_second_moment"]["measured"] == pytest.approx(
        by["critical_output_second_moment"]["theory"], rel=0.15
    )
    assert by["fluctuation_covariance"]["theory"] == pytest.approx(1 / (8 * math.pi))
    assert by["fluctuation_covariance"]["measured"] == pytest.approx(1 / (8 * math.pi), rel=0.2)
    assert by["output_regimes"]["measured"] == pytest.approx(-0.5, abs=0.08)
    assert by["drift_fluctuation_ratio"]["measured"] == pytest.approx(by["drift_fluctuation_ratio"]["theory"], rel=0.2)
    # the ratio depends on (n, beta) through tau only: the two n agree cell by cell within noise + finite-size offsets
    R, R_se = reg["R"], reg["R_se"]
    assert np.all(np.abs(np.log(R[0] / R[1])) < 4 * np.hypot(R_se[0] / R[0], R_se[1] / R[1]) + 0.2)
    assert (tmp_path / rep._plot_output_limits(tmp_path, sup, cro)).stat().st_size > 10_000
    assert (tmp_path / rep._plot_output_regimes(tmp_path, reg)).stat().st_size > 10_000


def test_settings_full_is_larger():
    q, f = rep._settings(True), rep._settings(False)
    assert f["super_contexts"] > q["super_contexts"]
    assert f["crit_out_n"] > q["crit_out_n"] and f["crit_out_contexts"] > q["crit_out_contexts"]
    assert max(f["regime_ns"]) > max(q["regime_ns"]) and len(f["regime_taus"]) > len(q["regime_taus"])
    # the tau = 1 column (the drift/fluctuation transition) is on both grids
    for s in (q, f):
        assert np.min(np.abs(np.log(s["regime_taus"]))) < 1e-9
