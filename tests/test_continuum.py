"""The mean-field limit (docs/math/continuum.md): dispersion relation, density solver, particles against the limit."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.special

import meanfield as mf
from meanfield import continuum as C

# ----------------------------------------------------------------------------- dispersion relation


def _funk_hecke_rate(beta, d, ell, model):
    """lambda_l by numerical quadrature of the Funk-Hecke integral (t = cos theta)::

    mu_l[k] = |S^{d-2}| int_0^pi k(cos th) P_l^{(d)}(cos th) sin^{d-2} th dth,
    usa: rho_0 l (l+d-2) mu_l[e^{beta t}/beta];  sa: l (l+d-2) mu_l[e^{beta t}] / (beta mu_0[e^{beta t}]).
    """
    area_sm2 = 2 * math.pi ** ((d - 1) / 2) / math.gamma((d - 1) / 2)  # |S^{d-2}|
    if d == 2:
        P = lambda t: np.cos(ell * np.arccos(np.clip(t, -1, 1)))  # noqa: E731  Chebyshev T_l
    else:
        a = (d - 2) / 2

        def P(t):
            return scipy.special.eval_gegenbauer(ell, a, t) / scipy.special.eval_gegenbauer(
                ell, a, 1.0
            )

    def mu(k, l_poly):
        f = lambda th: k(np.cos(th)) * l_poly(np.cos(th)) * np.sin(th) ** (d - 2)  # noqa: E731
        return (
            area_sm2 * scipy.integrate.quad(f, 0, np.pi, epsabs=1e-15, epsrel=1e-12, limit=400)[0]
        )

    lap = ell * (ell + d - 2)
    e = lambda t: np.exp(beta * t)  # noqa: E731
    if model == "usa":
        rho0 = math.gamma(d / 2) / (2 * math.pi ** (d / 2))
        return rho0 * lap * mu(lambda t: e(t) / beta, P)
    return lap * mu(e, P) / (beta * mu(e, lambda t: np.ones_like(t)))


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("model", ["usa", "sa"])
@pytest.mark.parametrize("d", [2, 3, 4, 5, 8])
def test_growth_rates_match_funk_hecke_quadrature(x64, d, model):
    ells = np.arange(0, 8)
    for beta in (0.5, 3.0, 12.0):
        got = np.asarray(C.growth_rates(np.float64(beta), d, ells, model=model))
        want = np.array([_funk_hecke_rate(beta, d, int(l), model) for l in ells])
        np.testing.assert_allclose(
            got, want, rtol=1e-7
        )  # quadrature cancellation at high l, small beta
        assert got[0] == 0.0 and np.all(got[1:] > 0)


def test_growth_rates_reduce_to_the_closed_forms_of_math_md(x64):
    b = np.float64(4.0)
    k = np.arange(1, 9)
    np.testing.assert_allclose(
        C.growth_rates(b, 2, k), k**2 * scipy.special.iv(k, 4.0) / 4.0, rtol=1e-12
    )
    np.testing.assert_allclose(
        C.growth_rates(b, 3, k), k * (k + 1) * scipy.special.spherical_in(k, 4.0) / 4.0, rtol=1e-12
    )
    np.testing.assert_allclose(
        C.growth_rates(b, 2, k, model="sa"),
        k**2 * scipy.special.iv(k, 4.0) / (4.0 * scipy.special.iv(0, 4.0)),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        C.growth_rates(b, 3, k, model="sa"),
        k
        * (k + 1)
        * scipy.special.spherical_in(k, 4.0)
        / (4.0 * scipy.special.spherical_in(0, 4.0)),
        rtol=1e-12,
    )
    # sa = usa / Z_0, Z_0 = rho_0 int e^{beta <x, y>} dsigma(y) the uniform law's normaliser
    z0 = scipy.special.iv(0, 4.0)
    np.testing.assert_allclose(
        C.growth_rates(b, 2, k, model="sa") * z0, C.growth_rates(b, 2, k), rtol=1e-12
    )


def test_large_beta_rescaled_time_and_most_unstable_mode():
    k = jnp.arange(1, 7)
    np.testing.assert_allclose(
        C.growth_rates(5.0, 2, k, rescaled=True),
        np.exp(-5.0) * np.asarray(C.growth_rates(5.0, 2, k)),
        rtol=1e-5,
    )
    big = np.asarray(C.growth_rates(2000.0, 3, jnp.arange(1, 100), rescaled=True))
    assert np.all(np.isfinite(big)) and np.all(big > 0)
    with pytest.raises(ValueError, match="rescaled=True"):
        C.growth_rates(100.0, 2, 1)
    # k* ~ sqrt(2 beta) (docs/math/continuum.md, Fastest mode), and the exact argmax of the closed form
    for beta in (50.0, 200.0, 800.0):
        ks = int(C.most_unstable_mode(beta, 2))
        assert abs(ks - math.sqrt(2 * beta)) <= 1.0
        kk = np.arange(1, 200)
        assert ks == kk[np.argmax(kk**2 * scipy.special.ive(kk, beta))]
    assert [int(C.most_unstable_mode(b, 2)) for b in (1.0, 4.0, 9.0)] == [1, 3, 4]
    assert int(C.most_unstable_mode(4.0, 2, model="sa")) == 3


def test_growth_rates_jit_vmap_grad():
    f = jax.jit(lambda b: C.growth_rates(b, 3, jnp.arange(1, 5)))
    np.testing.assert_allclose(f(2.0), C.growth_rates(2.0, 3, jnp.arange(1, 5)), rtol=1e-6)
    v = jax.vmap(lambda b: C.growth_rates(b, 2, 3))(jnp.array([1.0, 4.0, 9.0]))
    np.testing.assert_allclose(v, [C.growth_rates(b, 2, 3) for b in (1.0, 4.0, 9.0)], rtol=1e-6)
    with jax.enable_x64(True):
        for model in ("usa", "sa"):
            g = lambda b, model=model: C.growth_rates(b, 3, 2, model=model)  # noqa: E731
            h = 1e-6
            fd = (g(4.0 + h) - g(4.0 - h)) / (2 * h)
            assert float(jax.grad(g)(4.0)) == pytest.approx(float(fd), rel=1e-7)
            assert float(jax.grad(jax.grad(g))(4.0)) == pytest.approx(
                float((jax.grad(g)(4.0 + h) - jax.grad(g)(4.0 - h)) / (2 * h)), rel=1e-6
            )


def test_solver_multipliers_are_the_funk_hecke_eigenvalues(x64):
    b = jnp.float64(6.0)
    L = 12
    l = np.arange(L)
    np.testing.assert_allclose(
        C._multipliers(b, 2, L, "usa", False, jnp.float64),
        2 * np.pi * scipy.special.iv(l, 6.0) / 6.0,
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        C._multipliers(b, 3, L, "usa", False, jnp.float64),
        4 * np.pi * scipy.special.spherical_in(l, 6.0) / 6.0,
        rtol=1e-12,
        atol=1e-11,  # quadrature: 1e-13 relative to mu_0
    )


# ----------------------------------------------------------------------------- solver


def _linear_rates(d, beta, ells, L, eps=1e-5):
    g = C.grid(d, L, dtype=jnp.float64)
    lam = np.asarray(C.growth_rates(jnp.float64(beta), d, jnp.asarray(ells)))
    out = []
    for ell, rate in zip(ells, lam):
        t1 = min(1.0 / rate, 2.0 / lam.max())
        sol = C.solve(beta, C.mode_perturbation(g, ell, eps), d=d, t1=t1)
        assert sol.status_name() == "ok"
        a0, a1 = (C.mode_amplitude(sol.densities[i], d, ell) for i in (0, 1))
        out.append(float(jnp.log(a1 / a0)) / t1)
    return np.array(out), lam


@pytest.mark.parametrize("d, L", [(2, 16), (3, 10)])
def test_linear_regime_rates_match_growth_rates(x64, d, L):
    ells = [1, 2, 3, 4, 5, 6] if d == 2 else [1, 2, 3, 4]
    got, want = _linear_rates(d, 4.0, ells, L)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_sa_linear_rates(x64):
    g = C.grid(2, 16, dtype=jnp.float64)
    lam = float(C.growth_rates(jnp.float64(4.0), 2, 3, model="sa"))
    sol = C.solve(4.0, C.mode_perturbation(g, 3, 1e-5), d=2, t1=1 / lam, model="sa")
    a = [C.mode_amplitude(sol.densities[i], 2, 3) for i in (0, 1)]
    assert float(jnp.log(a[1] / a[0])) * lam == pytest.approx(lam, rel=1e-4)


@pytest.mark.parametrize("d, L", [(2, 24), (3, 12)])
def test_mass_conserved_to_rounding(d, L):
    ts = np.linspace(0, 2.0, 41)
    with jax.enable_x64(True):
        g = C.grid(d, L, dtype=jnp.float64)
        sol = C.solve(4.0, C.mode_perturbation(g, 2, 0.2), d=d, t1=2.0, ts=ts)
        m = np.asarray(sol.mass)
        ok = np.isfinite(m)
        assert ok.sum() >= 3 and np.max(np.abs(m[ok] - 1)) < 1e-13
    g = C.grid(d, L)
    sol = C.solve(4.0, C.mode_perturbation(g, 2, 0.2), d=d, t1=2.0, ts=ts)
    m = np.asarray(sol.mass)
    ok = np.isfinite(m)
    assert (
        ok.sum() >= 3 and np.max(np.abs(m[ok] - 1)) < 2e-5
    )  # float32 quadrature of ~10^2 - 10^3 values
    assert np.all(np.asarray(sol.min_density)[ok] > 0)


def test_resolution_loss_stops_with_a_clear_status():
    ts = np.linspace(0.0, 0.02, 41)
    g = C.grid(2, 16)
    rho0 = C.mode_perturbation(g, 4, 0.1)
    low = C.solve(9.0, rho0, d=2, t1=0.02, ts=ts)
    assert low.status_name() == "resolution_lost" and int(low.status) == C.RESOLUTION_LOST
    t_stop = float(low.t_stop)
    assert 0 < t_stop < 0.02
    after = ts > t_stop
    before = np.isfinite(np.asarray(low.tail))
    assert before[0] and before.sum() >= 1 and not np.any(before & after)
    assert np.all(np.isnan(np.asarray(low.densities)[~before]))
    assert np.all(np.asarray(low.tail)[before] <= 1e-4)
    # a finer grid resolves the same run further, and agrees with the coarse one before t_stop
    gh = C.grid(2, 64)
    high = C.solve(9.0, C.mode_perturbation(gh, 4, 0.1), d=2, t1=0.02, ts=ts)
    assert float(high.t_stop) > t_stop
    idx = np.nonzero(before)[0][-1]
    coarse = C.mode_amplitude(low.densities[idx], 2, 4)
    fine = C.mode_amplitude(high.densities[idx], 2, 4)
    assert float(coarse) == pytest.approx(float(fine), rel=1e-3)
    # without the stop the coarse grid returns oscillating garbage: negative densities
    blind = C.solve(9.0, rho0, d=2, t1=0.02, ts=ts, tail_tol=1e30)
    assert float(np.nanmin(np.asarray(blind.min_density))) < 0 or int(blind.status) == C.FAILED


def test_vmap_over_beta_and_perturbation_compiles_once_and_agrees():
    g = C.grid(2, 16)

    def one(beta, eps):
        return C.solve(beta, C.mode_perturbation(g, 3, eps), d=2, t1=0.05).densities[-1]

    betas, epss = jnp.array([1.0, 2.0, 4.0]), jnp.array([1e-3, 1e-2, 1e-1])
    batched = jax.jit(jax.vmap(one))(betas, epss)
    for i in range(3):
        np.testing.assert_allclose(
            batched[i], one(float(betas[i]), float(epss[i])), rtol=2e-5, atol=1e-6
        )


def test_rescaled_solver_is_a_change_of_time():
    g = C.grid(2, 16)
    rho0 = C.mode_perturbation(g, 2, 0.05)
    beta, t = 3.0, 0.1
    a = C.solve(beta, rho0, d=2, t1=t)
    b = C.solve(beta, rho0, d=2, t1=float(mf.kernels.rescaled_time(t, beta)), rescaled=True)
    np.testing.assert_allclose(a.densities[-1], b.densities[-1], rtol=1e-4, atol=1e-6)
    big = C.solve(300.0, rho0, d=2, t1=0.01, rescaled=True)
    assert big.status_name() == "ok" and np.all(np.isfinite(np.asarray(big.densities)))


@pytest.mark.slow
def test_grad_wrt_beta_through_the_solver_matches_finite_differences():
    with jax.enable_x64(True):
        g = C.grid(2, 12, dtype=jnp.float64)
        rho0 = C.mode_perturbation(g, 2, 0.1)

        def f(beta):  # int rho(t1)^2: the final-time L2 norm (grows with clustering)
            sol = C.solve(beta, rho0, d=2, t1=0.3, dt=0.02)
            return jnp.sum(g.weights * sol.densities[-1] ** 2)

        h = 1e-5
        fd = (f(2.0 + h) - f(2.0 - h)) / (2 * h)
        assert float(jax.grad(f)(2.0)) == pytest.approx(float(fd), rel=1e-7)


@pytest.mark.slow
def test_grad_wrt_beta_on_the_sphere(x64):
    g = C.grid(3, 10, dtype=jnp.float64)
    rho0 = C.mode_perturbation(g, 2, 0.1)

    def f(beta):
        sol = C.solve(beta, rho0, d=3, t1=0.3, dt=0.02)
        return jnp.sum(g.weights * sol.densities[-1] ** 2)

    h = 1e-5
    fd = (f(2.0 + h) - f(2.0 - h)) / (2 * h)
    assert float(jax.grad(f)(2.0)) == pytest.approx(float(fd), rel=1e-6)


# ----------------------------------------------------------------------------- particles and distances


def test_sampling_of_mode_perturbations():
    eps = 0.3
    x = C.sample_perturbation(None, 20000, 2, 3, eps, lattice=True)
    th = np.arctan2(x[:, 1], x[:, 0])
    assert np.mean(np.cos(3 * th)) == pytest.approx(eps / 2, abs=1e-4)  # int cos^2 rho_0 = 1/2
    assert abs(np.mean(np.cos(2 * th))) < 1e-4
    xi = C.sample_perturbation(jax.random.key(0), 20000, 2, 3, eps)
    assert np.mean(np.cos(3 * np.arctan2(xi[:, 1], xi[:, 0]))) == pytest.approx(
        eps / 2, abs=4 / np.sqrt(20000)
    )
    for ell in (1, 2, 4):
        y = C.sample_perturbation(None, 20000, 3, ell, eps, lattice=True)
        np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-6)
        # E[P_l(z)] = eps int P_l^2 rho_0 = eps / (2 l + 1)
        assert np.mean(scipy.special.eval_legendre(ell, y[:, 2])) == pytest.approx(
            eps / (2 * ell + 1), abs=2e-4
        )


def test_w1_circle_closed_forms():
    n = 100
    g = C.grid(2, 8)
    unif = C.mode_perturbation(g, 1, 0.0)
    lat = C.sample_perturbation(None, n, 2, 1, 0.0, lattice=True)
    # n equispaced points against the uniform law: F - G is a sawtooth of height 1/n: W1 = pi / (2 n)
    assert float(C.w1_circle(lat, unif, points=2**14)) == pytest.approx(np.pi / (2 * n), rel=1e-3)
    # all mass at one point against the uniform law: int |theta/(2 pi) - 1/2| dtheta = pi / 2
    one = jnp.array([[1.0, 0.0]])
    assert float(C.w1_circle(one, unif, points=2**14)) == pytest.approx(np.pi / 2, rel=1e-3)
    # a perturbed lattice against its own density: O(1/n), far below the uniform density
    dens = C.mode_perturbation(g, 2, 0.5)
    xs = C.sample_perturbation(None, 4000, 2, 2, 0.5, lattice=True)
    assert float(C.w1_circle(xs, dens)) < 2e-3 < float(C.w1_circle(xs, unif))


def test_mmd_sphere_closed_form_and_decay():
    g = C.grid(3, 12)
    unif = C.mode_perturbation(g, 1, 0.0)
    beta = 1.0
    # one point against the uniform law: MMD^2 = k(x, x) - int k = 1/beta - e^{-beta} sinh(beta) / beta^2
    one = jnp.array([[0.0, 0.6, 0.8]])
    want = math.sqrt(1 / beta - math.exp(-beta) * math.sinh(beta) / beta**2)
    assert float(C.mmd_sphere(one, unif, g, beta=beta)) == pytest.approx(want, rel=1e-4)
    dens = C.mode_perturbation(g, 2, 0.5)
    m = [
        float(C.mmd_sphere(C.sample_perturbation(jax.random.key(1), n, 3, 2, 0.5), dens, g))
        for n in (100, 1600)
    ]
    assert m[1] < m[0] / 2.5  # ~ n^{-1/2}: a factor 4 expected


@pytest.mark.parametrize("d, L", [(2, 8), (3, 6)])
def test_project_particles_recovers_the_density(d, L):
    g = C.grid(d, L)
    x = C.sample_perturbation(None, 40000, d, 2, 0.4, lattice=True)
    proj = C.project_particles(x, g)
    np.testing.assert_allclose(proj, C.mode_perturbation(g, 2, 0.4), atol=2e-3)
    assert float(jnp.sum(g.weights * proj)) == pytest.approx(1.0, abs=1e-5)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda g, r: C.solve(1.0, r, d=4, t1=1.0), ValueError, "d = 2"),
        (lambda g, r: C.solve(1.0, r, d=2, t1=1.0, model="softmax"), ValueError, "model"),
        (lambda g, r: C.solve(-1.0, r, d=2, t1=1.0), ValueError, "beta"),
        (lambda g, r: C.solve(1.0, r, d=2, t1=0.0), ValueError, "t1"),
        (lambda g, r: C.solve(1.0, r[:-1], d=2, t1=1.0), ValueError, "shape"),
        (lambda g, r: C.solve(1.0, r, d=2, t1=1.0, resolution=9), ValueError, "shape"),
        (lambda g, r: C.solve(1.0, r * np.nan, d=2, t1=1.0), ValueError, "finite"),
        (
            lambda g, r: C.solve(1.0, r, d=2, t1=1.0, model="sa", rescaled=True),
            ValueError,
            "rescaled",
        ),
        (lambda g, r: C.solve(100.0, r, d=2, t1=1.0), ValueError, "rescaled=True"),
        (lambda g, r: C.solve(1.0, r, d=2, t1=1.0, ts=[0.5, 0.2]), ValueError, "increasing"),
        (lambda g, r: C.solve(1.0, "rho", d=2, t1=1.0), TypeError, "rho0"),
        (lambda g, r: C.growth_rates(1.0, 1, 2), ValueError, "d must be >= 2"),
        (lambda g, r: C.growth_rates(1.0, 2, -1), ValueError, "ell"),
        (lambda g, r: C.growth_rates(1.0, 2, 1.5), TypeError, "ell"),
        (lambda g, r: C.growth_rates("1", 2, 1), TypeError, "beta"),
        (lambda g, r: C.mode_perturbation(g, 8, 0.1), ValueError, "resolution"),
        (lambda g, r: C.sample_perturbation(None, 10, 2, 1, 0.1), ValueError, "key"),
        (lambda g, r: C.sample_perturbation(None, 10, 2, 1, 1.5, lattice=True), ValueError, "eps"),
        (lambda g, r: C.project_particles(jnp.ones((3, 3)), g), ValueError, "shape"),
    ],
)
def test_bad_input_raises_one_clear_error(call, err, match):
    g = C.grid(2, 8)
    rho = C.mode_perturbation(g, 1, 0.1)
    with pytest.raises(err, match=match):
        call(g, rho)
