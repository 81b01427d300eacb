"""``meanfield reproduce noise``: every check passes with a derived tolerance, the figures are
readable images, and the experiment's closed forms and solvers are right on their own (the one-step
law of the projected Heun step against Monte Carlo, the Fokker-Planck modes against the linear rate
and the stationary von Mises law, the jackknife against the standard error of a mean)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.special
from _figures import FigureAudit
from PIL import Image

import meanfield as mf
from meanfield.reproduce import EXPERIMENTS, PAPERS, QUICK_COST_S
from meanfield.reproduce import noise as rn

CHECKS = {
    "brownian_decay_d2",
    "brownian_decay_d3",
    "heun_step_law",
    "weak_order",
    "strong_order_independent",
    "strong_order_common",
    "common_noise_contraction",
    "common_noise_sign_law",
    "kuramoto_threshold",
    "kuramoto_rate_below",
    "kuramoto_rate_above",
    "kuramoto_threshold_particles",
    "kuramoto_stationary_r",
    "frequencies_lorentzian",
    "frequencies_gaussian",
    "fokker_planck_w1_rate",
    "homogenized_rate",
    "homogenized_prefactor",
}


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    with FigureAudit() as figures:  # every figure it writes, checked as it is saved
        s = rn.run(out, quick=True, quiet=True)
    assert figures.saved and not figures.problems, "\n".join(figures.problems)
    return s, out


@pytest.mark.slow
@pytest.mark.xla_default
def test_all_checks_pass_with_derived_tolerances(summary):
    s, out = summary
    rows = {c["name"]: c for c in s["checks"]}
    assert set(rows) == CHECKS
    assert all(c["pass"] for c in s["checks"]), [c for c in s["checks"] if not c["pass"]]
    for c in s["checks"]:
        assert np.isfinite(c["measured"]) and c["theory"] is not None, c["name"]
        assert 0 < c["tolerance"] and "Tolerance" in c["note"], c["name"]
        assert abs(c["measured"] - c["theory"]) <= c["tolerance"], c["name"]
    # the theories are the closed forms (sigma = 1)
    assert rows["strong_order_independent"]["theory"] == 0.5
    assert rows["strong_order_common"]["theory"] == 0.5
    assert rows["common_noise_contraction"]["theory"] == 1.0  # lambda_1 - lambda_2 = sigma^2
    assert rows["kuramoto_threshold_particles"]["theory"] == 1.0  # K_c = d sigma^2 / 2, d = 2
    assert rows["kuramoto_threshold"]["measured"] < 1e-9
    assert rows["kuramoto_stationary_r"]["theory"] in (
        pytest.approx(mf.theory.kuramoto_order_parameter(2.0, 1.0)),
        pytest.approx(mf.theory.kuramoto_order_parameter(3.0, 1.0)),
    )
    assert rows["brownian_decay_d2"]["theory"] in [
        pytest.approx(math.exp(-t / 2)) for t in (0.25, 0.5, 1.0, 2.0)
    ]
    assert rows["fokker_planck_w1_rate"]["theory"] == -0.5
    assert rows["homogenized_rate"]["theory"] == 0.5
    fp = s["settings"]["results"]["fokker_planck"]
    # the step's bias is small against every distance
    assert fp["step_bias"] < 0.1 * min(fp["mean"])
    hz = s["settings"]["results"]["homogenized"]
    assert rows["homogenized_prefactor"]["theory"] == pytest.approx(hz["kappa"])
    assert 0 < hz["kappa"] < hz["kappa_common"]  # |m_i| < 1 for distinct tokens
    # the exact chain's weak order at the quick steps is pre-asymptotic, and tends to 1
    weak = s["settings"]["results"]["weak"]
    assert 0.6 < weak["chain_order"] < weak["chain_order_finer"][0] < weak["chain_order_finer"][1]
    assert abs(weak["chain_order_finer"][1] - 1) < 0.02
    # the tolerances say what they are
    assert "4 SE" in rows["brownian_decay_d3"]["rule"]
    assert "jackknife" in rows["strong_order_common"]["note"]
    on_disk = json.loads((out / "noise" / "summary.json").read_text())
    assert on_disk["checks"] == s["checks"]
    assert s["figures"] == ["noise.png", "kuramoto.png"]
    for name in s["figures"]:  # non-degenerate images: a size and more than one colour
        with Image.open(out / "noise" / name) as im:
            px = np.asarray(im.convert("L"), dtype=float)
        assert px.shape[0] > 300 and px.shape[1] > 600 and px.std() > 10, name


def test_heun_step_mean_is_the_step_it_describes():
    """The quadrature of one projected Heun step against a Monte Carlo of the same step."""
    rng = np.random.default_rng(0)
    for d in (2, 3):
        h, N = 0.125, 400_000
        x = np.zeros((N, d))
        x[:, 0] = 1.0
        a = math.sqrt(h) * rng.standard_normal((N, d))

        def P(u, v):
            return v - np.sum(u * v, axis=1, keepdims=True) * u

        xt = x + P(x, a)
        u = xt / np.linalg.norm(xt, axis=1, keepdims=True)
        xh = x + 0.5 * (P(x, a) + P(u, a))
        c = (xh / np.linalg.norm(xh, axis=1, keepdims=True))[:, 0]
        assert abs(rn.heun_step_mean(h, 1.0, d) - c.mean()) < 4 * c.std() / math.sqrt(N)
    # converged nodes; the continuous-time limit exp(-(d - 1) sigma^2 h / 2) to first order in h
    assert rn.heun_step_mean(0.1, 0.7, 3, nodes=40) == pytest.approx(
        rn.heun_step_mean(0.1, 0.7, 3, nodes=80), abs=1e-14
    )
    for d in (2, 3, 5):
        h = np.array([1e-3, 5e-4])
        bias = [math.log(rn.heun_step_mean(float(v), 1.0, d)) + (d - 1) * v / 2 for v in h]
        assert bias[0] / bias[1] == pytest.approx(4.0, rel=0.02)  # log c_h = -(d-1) h/2 + O(h^2)


def test_fokker_planck_circle_rates_and_stationary_law(x64):
    """Linear rate K/2 - sigma^2/2 (the continuum's degree-1 rate), and from a large amplitude the
    von Mises stationary order parameter of mf.theory."""
    ts = np.linspace(0.0, 1.0, 5)
    for K in (0.5, 1.0, 3.0):
        m = rn.fokker_planck_circle(K, 1.0, [1e-6] + [0.0] * 15, ts).real
        rate = math.log(m[-1] / m[0])
        lam = float(mf.continuum.growth_rates(K, 2, 1, model="kuramoto",
                                              noise=mf.noise.Independent(1.0)))  # fmt: skip
        assert rate == pytest.approx(K / 2 - 0.5, abs=1e-6)  # atol 1e-13 at amplitude 1e-6
        assert lam == pytest.approx(K / 2 - 0.5, abs=1e-12)
    m = rn.fokker_planck_circle(2.0, 1.0, [0.5] + [0.0] * 31, [0.0, 40.0])
    assert abs(m[-1]) == pytest.approx(mf.theory.kuramoto_order_parameter(2.0, 1.0), abs=1e-8)
    kappa = 4 * abs(m[-1])
    assert abs(m[-1]) == pytest.approx(scipy.special.ive(1, kappa) / scipy.special.ive(0, kappa))


def test_jackknife_of_a_mean_and_of_a_ratio():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(50)
    v, se = rn.jackknife(lambda m: float(m), x)
    assert v == pytest.approx(x.mean()) and se == pytest.approx(x.std(ddof=1) / math.sqrt(50))
    y = 2.0 + rng.standard_normal(50) * 0.1
    v, se = rn.jackknife(lambda a, b: float(a / b), x + 5, y)
    assert v == pytest.approx((x + 5).mean() / y.mean()) and 0 < se < 0.2


def test_the_gaussian_curve_is_kuramotos_self_consistency():
    """The figure's parametric curve r(K) against the law's own root finding."""
    law = mf.frequencies.Gaussian(0.5)
    Kc = float(law.critical_coupling())
    K, r = rn._theory_curve("gaussian", 0.5, Kc, 3.0)
    for i in (10, 100, len(K) - 1):
        assert r[i] == pytest.approx(law.order_parameter(float(K[i])), abs=1e-6)
    K, r = rn._theory_curve("lorentzian", 0.5, 1.0, 3.0)
    assert r[-1] == pytest.approx(math.sqrt(1 - 1 / 3.0))


def test_w1_fourier_bound_bounds_the_circles_w1(x64):
    """The Fourier bound of W1 against mf.continuum.w1_circle for a lattice of one density and
    another density (the lattice's own O(1/n) error added)."""
    g = mf.continuum.grid(2, 16)
    for ell, eps_a, eps_b in ((1, 0.3, 0.1), (2, 0.5, 0.45), (3, 0.2, -0.2)):
        x = mf.continuum.sample_perturbation(None, 20000, 2, ell, eps_a, lattice=True)
        w1 = float(mf.continuum.w1_circle(x, mf.continuum.mode_perturbation(g, ell, eps_b)))
        dc = np.zeros(ell, complex)
        dc[ell - 1] = (eps_a - eps_b) / 2  # c_ell = eps / 2 for (1 + eps cos(ell theta)) / (2 pi)
        bound = rn.w1_fourier_bound(dc)
        assert w1 <= bound + 1e-3 and w1 > 0.5 * bound  # tight within a factor for one mode


def test_homogenized_prefactor_is_the_drifts_variance_over_the_weights(x64):
    """kappa against a Monte Carlo over V of |P_x V m|^2 with V drawn by mf.models.random_weights."""
    import jax
    import jax.numpy as jnp

    d, beta = 3, 1.5
    x = np.asarray(mf.sphere.uniform(jax.random.key(0), 6, d, jnp.float64))
    kappa = rn.homogenized_prefactor(x, beta)
    draw = jax.vmap(lambda k: mf.models.random_weights(k, d, value="gaussian",
                                                       dtype=jnp.float64)[2][0])  # fmt: skip
    V = np.asarray(draw(jax.random.split(jax.random.key(1), 20000)))
    m = np.asarray(mf.models.SelfAttention(beta).field(jnp.asarray(x)))  # softmax means m_i
    Vm = np.einsum("skl,il->sik", V, m)
    tang = Vm - np.sum(Vm * x, axis=-1, keepdims=True) * x
    sq = np.sum(tang**2, axis=-1).mean(axis=1)  # per draw: the mean over tokens
    assert abs(sq.mean() - kappa) < 4 * sq.std() / math.sqrt(sq.size)
    # with one draw per epoch of V, the model's field is V m_i: the same m as the model's
    model = mf.models.SelfAttention(beta, weights="identity", value="gaussian", weight_seed=3)
    V3 = np.asarray(model.weight_stacks(d, jnp.float64)[2])
    np.testing.assert_allclose(np.asarray(model.field(jnp.asarray(x))), m @ V3.T, atol=1e-12)


def test_registered_in_the_default_report_with_a_cost():
    assert EXPERIMENTS["noise"] == "meanfield.reproduce.noise"
    assert "noise" in PAPERS and "noise" in QUICK_COST_S
    assert rn.EXPERIMENT.figures == ("noise.png", "kuramoto.png")
