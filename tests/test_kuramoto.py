"""Issue 49, item 2: the registry model ``kuramoto`` (the Lohe model on $S^{d-1}$, Kuramoto in
$d = 2$) and the natural-frequency laws of ``mf.frequencies``, against the angle equations,
Kuramoto's threshold and the stationary order parameter (Ott-Antonsen for the Lorentzian, the
self-consistency by quadrature for the Gaussian); docs/math/noise.md."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.stats

import meanfield as mf


def _circle(th):
    return jnp.stack([jnp.cos(th), jnp.sin(th)], 1)


def test_field_is_the_kuramoto_sine_coupling_and_the_mean_token(x64):
    K, n = 1.7, 9
    th = jax.random.uniform(jax.random.key(0), (n,), jnp.float64, 0, 2 * np.pi)
    x = _circle(th)
    model = mf.kernels.make("kuramoto", coupling=K, d=2)
    assert isinstance(model, mf.kernels.Kuramoto)
    dth = (K / n) * jnp.sum(jnp.sin(th[None, :] - th[:, None]), axis=1)
    tangent = jnp.stack([-jnp.sin(th), jnp.cos(th)], 1)
    np.testing.assert_allclose(mf.velocity(model, x), dth[:, None] * tangent, atol=1e-15)
    # the rank-one field and the energy against the pairwise reference, in d = 4
    y = mf.sphere.uniform(jax.random.key(1), 7, 4, jnp.float64)
    aux = mf.positions(7)
    model4 = mf.kernels.Kuramoto(K)
    np.testing.assert_allclose(
        model4.field(y, aux), mf.kernels.pairwise_field(model4, y, aux), atol=1e-15
    )
    m = np.asarray(y).mean(0)
    np.testing.assert_allclose(mf.energy(model4, y), K * m @ m / 2, rtol=1e-14)
    np.testing.assert_allclose(
        mf.energy(model4, y), mf.kernels.pairwise_energy(model4, y, aux), rtol=1e-14
    )
    assert float(model4.max_energy()) == K / 2
    assert mf.kernels.MODELS["kuramoto"].max_energy({"coupling": K}) == K / 2
    assert float(model4.interaction_rate()) == K


def test_collapse_reaches_the_maximum_energy(x64):
    x0 = mf.sphere.uniform(jax.random.key(2), 32, 3, jnp.float64)
    traj = mf.simulate(mf.kernels.Kuramoto(2.0), x0, t1=12.0, dt=0.05)
    assert abs(float(traj.energy[-1]) - 1.0) < 1e-6  # K/2 at |m| = 1
    assert np.all(np.diff(np.asarray(traj.energy)) >= -1e-12)  # a gradient flow ascends


def test_simulate_with_frequencies_solves_the_angle_equations(x64):
    n, K, t1 = 12, 1.3, 3.0
    w = mf.frequencies.Lorentzian(0.4).sample(n, dtype=jnp.float64)
    th0 = jax.random.uniform(jax.random.key(3), (n,), jnp.float64, 0, 2 * np.pi)
    traj = mf.simulate(
        mf.kernels.Kuramoto(K), _circle(th0), t1=t1, dt=0.005, solver="rk4", frequencies=w
    )
    ws = np.asarray(w)

    def rhs(t, th):
        return ws + (K / n) * np.sin(th[None, :] - th[:, None]).sum(1)

    ref = scipy.integrate.solve_ivp(rhs, (0, t1), np.asarray(th0), rtol=1e-12, atol=1e-12)
    # rk4 at dt = 0.005: global error about 2e-9 here (1.6e-8 at dt = 0.01, the 1/16 of order 4)
    np.testing.assert_allclose(traj.xs[-1], _circle(jnp.asarray(ref.y[:, -1])), rtol=0, atol=1e-8)


@pytest.mark.parametrize("d", [2, 3, 5])
def test_dispersion_relation_of_the_linear_kernel(d, x64):
    """mu_1 = K |S^{d-1}| / d is the only non-zero eigenvalue: lambda_1 = K (d - 1) / d."""
    K = 1.25
    rates = mf.continuum.growth_rates(K, d, [1, 2, 3, 4], model="kuramoto")
    np.testing.assert_allclose(rates, [K * (d - 1) / d, 0, 0, 0], atol=1e-13)


def test_frequency_laws_quantiles_draws_and_theory(x64):
    lor, gau = mf.frequencies.Lorentzian(0.5), mf.frequencies.Gaussian(2.0)
    q = np.asarray(lor.sample(8, dtype=jnp.float64))
    np.testing.assert_array_equal(q, -q[::-1])  # exactly symmetric
    u = (np.arange(8) + 0.5) / 8
    np.testing.assert_allclose(q, scipy.stats.cauchy.ppf(u, scale=0.5), rtol=1e-12)
    np.testing.assert_allclose(
        gau.sample(8, dtype=jnp.float64), scipy.stats.norm.ppf(u, scale=2.0), rtol=1e-12
    )
    draws = np.asarray(gau.sample(4000, key=jax.random.key(4), dtype=jnp.float64))
    assert scipy.stats.kstest(draws, scipy.stats.norm(scale=2.0).cdf).pvalue > 1e-3
    np.testing.assert_array_equal(draws, gau.sample(4000, key=jax.random.key(4), dtype=jnp.float64))
    # spread is traced: one program over a batch of widths
    ws = jax.vmap(lambda s: mf.frequencies.Lorentzian(s).sample(4))(jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(ws[1], 2 * ws[0], rtol=1e-6)
    # theory: K_c = 2 / (pi g(0)); the quadrature self-consistency equals Ott-Antonsen's closed form
    assert lor.critical_coupling() == pytest.approx(1.0, rel=1e-15)
    assert gau.critical_coupling() == pytest.approx(2.0 * np.sqrt(8 / np.pi), rel=1e-15)
    for K in (1.2, 2.0, 5.0):
        closed = lor.order_parameter(K)
        assert closed == pytest.approx(np.sqrt(1 - 1.0 / K), rel=1e-14)
        assert mf.frequencies.Distribution.order_parameter(lor, K) == pytest.approx(
            closed, abs=1e-11
        )
    assert lor.order_parameter(0.9) == 0.0 and gau.order_parameter(3.0) == 0.0
    with pytest.raises(ValueError, match="spread"):
        mf.frequencies.Gaussian(-1.0)
    with pytest.raises(ValueError, match="coupling"):
        lor.order_parameter(0.0)


@pytest.mark.parametrize(
    ("law", "K"), [(mf.frequencies.Lorentzian(0.5), 2.0), (mf.frequencies.Gaussian(1.0), 3.0)]
)
def test_particles_reach_the_stationary_order_parameter(law, K, x64):
    r"""n = 2000 tokens with the quantile frequencies from a uniform start: the time-averaged
    $|m|$ over $t \in [40, 60]$ against the $n \to \infty$ order parameter; the finite-$n$ error of
    $r$ is $O(n^{-1/2})$ (the drifting tokens' fluctuation), the tolerance $n^{-1/2}$."""
    n = 2000
    w = law.sample(n, dtype=jnp.float64)
    th = jax.random.uniform(jax.random.key(5), (n,), jnp.float64, 0, 2 * np.pi)
    traj = mf.simulate(
        mf.kernels.Kuramoto(K),
        _circle(th),
        t1=60.0,
        dt=0.05,
        ts=jnp.linspace(40.0, 60.0, 21),
        frequencies=w,
    )
    r = float(jnp.linalg.norm(traj.xs.mean(1), axis=-1).mean())
    assert abs(r - law.order_parameter(K)) < n**-0.5


def test_command_line_runs_the_kuramoto_model(tmp_path):
    from meanfield import cli

    out = tmp_path / "run"
    argv = ["simulate", "--kernel", "kuramoto", "--coupling", "2", "--n", "24", "--d", "3",
            "--t1", "8", "--no-plots", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kernel"] == "kuramoto" and summary["coupling"] == 2.0
    assert summary["theory_max_energy"] == 1.0
    assert abs(summary["final_energy"] - 1.0) < 1e-3 and summary["final_clusters"] == 1
    assert "final_order_parameter" not in summary  # reported with noise or frequencies only


def test_command_line_frequencies_are_the_laws_quantiles_or_draws(tmp_path, capsys):
    """``meanfield simulate --frequencies LAW --spread S [--frequency-seed K]``: the run of
    ``mf.simulate(frequencies=law.sample(n[, key]))``, recorded with the measured and the theory's
    order parameter; the flags' refusals are one line on stderr, exit 2."""
    from meanfield import cli, sweep

    argv = ["simulate", "--kernel", "kuramoto", "--coupling", "2", "--n", "16", "--d", "2",
            "--t1", "0.5", "--dt", "0.05", "--saves", "3", "--seed", "2", "--no-plots"]  # fmt: skip
    law = mf.frequencies.Lorentzian(0.5)
    x0 = mf.sphere.uniform(jax.random.key(2), 16, 2)
    for extra, w in (
        ([], law.sample(16)),
        (["--frequency-seed", "7"], law.sample(16, key=jax.random.key(7))),
    ):
        out = tmp_path / f"run{len(extra)}"
        flags = ["--frequencies", "lorentzian", "--spread", "0.5", *extra, "--out", str(out)]
        assert cli.main(argv + flags) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["frequencies"] == "lorentzian" and summary["spread"] == 0.5
        assert summary["theory_order_parameter"] == pytest.approx(np.sqrt(0.5), rel=1e-14)
        traj = mf.simulate(
            mf.kernels.Kuramoto(2.0), x0, t1=0.5, dt=0.05, ts=np.linspace(0, 0.5, 3), frequencies=w
        )
        ds = sweep.load(out)
        np.testing.assert_allclose(ds["x"].values[-1], traj.xs[-1], rtol=0, atol=1e-5)
        assert summary["final_order_parameter"] == pytest.approx(
            float(mf.metrics.order_parameter(traj.xs[-1])), abs=1e-5
        )
    capsys.readouterr()
    for flags, message in (
        (
            ["--frequencies", "gaussian"],
            "--frequencies gaussian needs --spread, the law's scale (a number > 0)",
        ),
        (
            ["--spread", "0.5"],
            "--spread 0.5 is the scale of a frequency law: it applies with --frequencies "
            "lorentzian or --frequencies gaussian",
        ),
        (["--frequency-seed", "1"], "--frequency-seed draws the frequencies of --frequencies"),
        (["--frequencies", "gaussian", "--spread", "1", "--d", "3"], "it needs --d 2, got --d 3"),
    ):
        assert cli.main(argv + flags + ["--out", str(tmp_path / "bad")]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and message in err[0], err
