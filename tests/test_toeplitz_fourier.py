"""Toeplitz kernels with arbitrary Fourier coefficients (USA-AV Prop. 10, App. G) and the helpers of the
remaining USA-AV claims (Prop. 4 Dobrushin rate, Thm. 4 (iii) nonatomic prompts), against independent
NumPy/SciPy computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import meanfield as mf
from meanfield.integrate import simulate
from meanfield.reproduce import usa_av as U

K = mf.kernels


def _profile_np(c_hat, delta):
    m = np.arange(len(c_hat))
    w = np.where(m == 0, 1.0, 2.0) * np.asarray(c_hat, np.float64)
    return np.sum(w * np.cos(2 * np.pi * m * np.asarray(delta)[..., None]), axis=-1)


@pytest.mark.parametrize(
    "c_hat", [[0.1, -0.2, 0.4, 0.3], [0.0, 0.5], [-0.7], [0.3, 0.0, -0.1, 0.2, 0.05]]
)
def test_field_and_energy_match_an_independent_numpy_sum(c_hat):
    n, d = 24, 3
    x = mf.sphere.uniform(jax.random.key(1), n, d)
    s = mf.positions(n)
    k = K.ToeplitzSeries(c_hat)
    C = _profile_np(c_hat, np.asarray(s)[None, :] - np.asarray(s)[:, None])  # C_ij = c(s_j - s_i)
    X = np.asarray(x, np.float64)
    np.testing.assert_allclose(np.asarray(k.field(x, s)), C @ X / n, atol=2e-6)
    np.testing.assert_allclose(
        float(k.energy(x, s)), np.sum(C * (X @ X.T)) / (2 * n * n), atol=2e-7
    )
    np.testing.assert_allclose(
        np.asarray(k.field(x, s)), np.asarray(K.pairwise_field(k, x, s)), atol=2e-6
    )
    # gradient flow: grad_x E = F / n (symmetric kernel)
    g = jax.grad(lambda y: k.energy(y, s))(x)
    np.testing.assert_allclose(np.asarray(g) * n, C @ X / n, atol=2e-6)


def test_single_mode_series_is_the_toeplitz_kernel():
    x = mf.sphere.uniform(jax.random.key(2), 16, 3)
    s = mf.positions(16)
    for m in (1, 2, 3):
        a, b = K.Toeplitz(m), K.ToeplitzSeries([0.0] * m + [0.5])
        np.testing.assert_allclose(np.asarray(a.field(x, s)), np.asarray(b.field(x, s)), atol=1e-6)
        assert float(b.max_energy()) == pytest.approx(float(mf.theory.great_circle_energy(m)))


@pytest.mark.parametrize("n", [1, 2, 5, 7, 16])
@pytest.mark.parametrize(
    "c_hat", [[0.1, -0.2, 0.4, 0.3], [-1.0, -0.2], [0.5, 0.2, 0.1, 0.05], [0.0, 0.1, -0.3, 0.25]]
)
def test_max_energy_is_the_top_eigenvalue_of_the_circulant(n, c_hat):
    # Independent: E = tr(X^T C X) / (2 n^2) with unit rows is at most lambda_max(C) / (2 n), the bound is
    # attained by a circle of the top eigenvector's frequency (d >= 2): the circulant eigenvalues are n c_n(k).
    s = np.arange(1, n + 1) / n
    C = _profile_np(c_hat, s[None, :] - s[:, None])
    lam = np.linalg.eigvalsh(C).max()
    k = K.ToeplitzSeries(c_hat)
    assert float(k.max_energy(n)) == pytest.approx(lam / (2 * n), abs=1e-6)
    x = k.maximiser(n, 3)
    assert float(k.energy(x, mf.positions(n))) == pytest.approx(lam / (2 * n), abs=1e-6)
    # random configurations never exceed it (NumPy energies)
    xs = np.random.default_rng(n).standard_normal((500, n, 3))
    xs /= np.linalg.norm(xs, axis=2, keepdims=True)
    E = np.einsum("ij,bik,bjk->b", C, xs, xs) / (2 * n * n)
    assert E.max() <= lam / (2 * n) + 1e-12


def test_continuum_max_energy_and_dominant_mode():
    k = K.ToeplitzSeries([0.1, -0.2, 0.4, 0.3])
    assert k.dominant_mode() == 2 and float(k.max_energy()) == pytest.approx(0.2)
    assert (
        K.ToeplitzSeries([0.5, 0.2]).dominant_mode() == 0
    )  # c_hat(0) = 0.5 > c_hat(1) = 0.2: a Dirac
    neg = K.ToeplitzSeries([-1.0, -0.2, -0.1])
    assert (
        neg.dominant_mode() == 3 and float(neg.max_energy()) == 0.0
    )  # modes above M have c_hat = 0
    # large n without aliasing: the finite-n value is the continuum one
    assert float(k.max_energy(64)) == pytest.approx(float(k.max_energy()))
    # aliasing: n = 5 folds mode 3 onto mode 2
    assert float(k.max_energy(5)) == pytest.approx(0.35) and k.dominant_mode(5) == 2


def test_coefficients_are_traced_leaves():
    x = mf.sphere.uniform(jax.random.key(3), 12, 3)
    s = mf.positions(12)
    C = jnp.array([[0.0, 0.5, 0.0], [0.1, 0.2, 0.3], [-0.3, 0.0, 0.4]])
    E = jax.jit(jax.vmap(lambda c: K.ToeplitzSeries(c).energy(x, s)))(C)
    for c, e in zip(C, E):
        assert float(e) == pytest.approx(
            float(K.ToeplitzSeries(np.asarray(c)).energy(x, s)), abs=1e-7
        )
    M = jax.vmap(lambda c: K.ToeplitzSeries(c).max_energy(12))(C)
    np.testing.assert_allclose(np.asarray(M), [0.25, 0.15, 0.2], atol=1e-7)


@pytest.mark.parametrize(
    ("bad", "err"),
    [
        ("a", TypeError),
        (None, TypeError),
        ([True, False], TypeError),
        ([1 + 2j], TypeError),
        ([[1], [1, 2]], TypeError),
        (1.0, ValueError),
        ([[0.5]], ValueError),
        ([], ValueError),
        ([0.5, float("nan")], ValueError),
        ([float("inf")], ValueError),
    ],
)
def test_bad_coefficients_raise_one_clear_error(bad, err):
    with pytest.raises(err, match="c_hat"):
        K.ToeplitzSeries(bad)


def test_maximiser_and_dominant_mode_need_concrete_values():
    with pytest.raises(ValueError, match="n must be"):
        K.ToeplitzSeries([0.0, 0.5]).maximiser(0)
    with pytest.raises(ValueError, match="concrete"):
        jax.jit(lambda c: K.ToeplitzSeries(c).dominant_mode())(jnp.array([0.0, 0.5]))


@pytest.mark.parametrize(
    ("c_hat", "m"),
    [([0.0, 0.5, 0.2, 0.1], 1), ([0.0, 0.1, 0.2, 0.45], 3), ([-0.4, -0.2, 0.35, -0.3], 2)],
)
def test_flow_follows_the_dominant_mode(c_hat, m):
    n = 48
    k = K.ToeplitzSeries(c_hat)
    tr = simulate(k, mf.sphere.uniform(jax.random.key(7), n, 3), t1=40.0, dt=2e-2, solver="rk2")
    x = np.asarray(tr.xs[-1])
    assert float(tr.energy[-1]) == pytest.approx(float(k.max_energy(n)), rel=1e-3)
    assert U.winding_number(x) == m == k.dominant_mode(n)


# ---------------------------------------------------------------- helpers of usa_av


def test_winding_number_of_known_paths():
    s = np.arange(1, 41) / 40
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.standard_normal((4, 4)))[0]
    for m in range(0, 5):
        x = np.stack([np.cos(2 * np.pi * m * s), np.sin(2 * np.pi * m * s), 0 * s, 0 * s], 1) @ Q.T
        assert U.winding_number(x) == m
        assert U.winding_number(x[::-1]) == m  # orientation does not matter
    # a latitude circle (not through the plane's origin) still winds once
    lat = np.stack([0.6 * np.cos(2 * np.pi * s), 0.6 * np.sin(2 * np.pi * s), 0.8 + 0 * s], 1)
    assert U.winding_number(lat) == 1
    # a Dirac mass up to float32 noise: a point, winding 0
    dirac = np.array([0.0, 0.0, 1.0]) + 1e-6 * rng.standard_normal((40, 3))
    assert U.winding_number(dirac) == 0
    with pytest.raises(ValueError, match="x must be"):
        U.winding_number(np.zeros(3))


def test_dobrushin_rate_constants_bound_sampled_derivatives():
    # Independent check of M_h, L_x, L_mu for h = e^{beta <x,y>}/beta: sampled norms of grad, Hessian and
    # mixed derivative (autodiff) stay below the constants and come within 2% of them (sup at x = y).
    beta = 1.5
    g = lambda x, y: jnp.exp(beta * jnp.dot(x, y)) * y  # noqa: E731
    xs = np.asarray(mf.sphere.uniform(jax.random.key(0), 400, 3))
    ys = np.concatenate([xs[:200], np.asarray(mf.sphere.uniform(jax.random.key(1), 200, 3))])
    Jx = jax.vmap(jax.jacfwd(g, 0))(xs, ys)
    Jy = jax.vmap(jax.jacfwd(g, 1))(xs, ys)
    M = np.linalg.norm(np.asarray(jax.vmap(g)(xs, ys)), axis=1).max()
    Lx = np.linalg.norm(np.asarray(Jx), ord=2, axis=(1, 2)).max()
    Lmu = np.linalg.norm(np.asarray(Jy), ord=2, axis=(1, 2)).max()
    e = np.exp(beta)
    for sampled, bound in ((M, e), (Lx, beta * e), (Lmu, (1 + beta) * e)):
        assert bound * 0.98 <= sampled <= bound * (1 + 1e-5)
    assert U.dobrushin_rate(beta) == pytest.approx(2 * e + beta * e + (1 + beta) * e)
    with pytest.raises(ValueError, match="beta"):
        U.dobrushin_rate(0.0)


def test_w1_empirical_against_brute_force_permutations():
    import itertools

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    brute = min(
        np.mean(np.linalg.norm(x - y[list(p)], axis=1)) for p in itertools.permutations(range(6))
    )
    assert U.w1_empirical(x, y) == pytest.approx(brute, rel=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        U.w1_empirical(x, y[:5])


def test_digit_split_is_measure_preserving():
    z = np.random.default_rng(4).random(200_000)
    u1, u2 = U._split_digits(z)
    for u in (u1, u2):
        assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(u1, u2)[0, 1]) < 0.01  # 4.5 standard errors of a null correlation
    # a 2-d cell count (independence): chi-square over a 8 x 8 grid
    H, _, _ = np.histogram2d(u1, u2, bins=8, range=[[0, 1], [0, 1]])
    assert stats.chisquare(H.ravel()).pvalue > 1e-3


def test_vmf_prompt_map_pushes_lebesgue_to_von_mises_fisher():
    kappa = 2.0
    x = U.vmf_prompt_map(np.random.default_rng(5).random(100_000), kappa)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-12)
    cdf = lambda w: (np.exp(kappa * w) - np.exp(-kappa)) / (np.exp(kappa) - np.exp(-kappa))  # noqa: E731
    assert stats.kstest(x[:, 2], cdf).pvalue > 1e-3
    assert (
        stats.kstest(
            np.mod(np.arctan2(x[:, 1], x[:, 0]), 2 * np.pi) / (2 * np.pi), "uniform"
        ).pvalue
        > 1e-3
    )
    with pytest.raises(ValueError, match="z must lie"):
        U.vmf_prompt_map(np.array([1.0]), kappa)
    with pytest.raises(ValueError, match="kappa"):
        U.vmf_prompt_map(np.array([0.5]), -1.0)


def test_householder_gauges_map_u_to_the_targets():
    g = U.vmf_prompt_map(np.random.default_rng(6).random(50), 1.0)
    u = np.array([0.0, 0.0, 1.0])
    g[0] = u  # the identity case
    H = U.householder_gauges(g, u)
    np.testing.assert_allclose(np.einsum("nji,j->ni", H, u), g, atol=1e-12)
    np.testing.assert_allclose(
        np.einsum("nij,nkj->nik", H, H), np.broadcast_to(np.eye(3), H.shape), atol=1e-12
    )
    # the prompt kernel with these gauges has the target configuration as a maximiser
    k = K.Prompt(1.0, jnp.asarray(H, jnp.float32))
    E = float(mf.energy(k, jnp.asarray(g, jnp.float32), jnp.arange(50)))
    assert E == pytest.approx(float(np.e / 2), rel=1e-6)


def test_vmf_mmd_against_monte_carlo_and_quadrature():
    kappa, gamma = 2.0, 4.0
    rng = np.random.default_rng(7)
    y = U.vmf_prompt_map(rng.random(400_000), kappa)
    # (K nu)(x) at a few points against a Monte Carlo average over nu (s.e. ~ 1e-3 relative)
    pts = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.6, -0.8]])
    for p in pts:
        mc = np.exp(gamma * (y @ p - 1.0))
        got = float(U._vmf_kernel_mean(p[None], kappa, gamma)[0])
        assert got == pytest.approx(mc.mean(), abs=4 * mc.std() / np.sqrt(mc.size))
    # kbar against a Monte Carlo double integral over independent pairs
    a, b = y[:200_000], y[200_000:]
    kk = np.exp(gamma * (np.sum(a * b, axis=1) - 1.0))
    assert 1.0 - U.vmf_mmd_constant(kappa, gamma) == pytest.approx(
        kk.mean(), abs=4 * kk.std() / np.sqrt(kk.size)
    )
    # MMD^2 of a uniform sample (the wrong law) stays away from 0, that of a vMF sample is ~ (1 - kbar) / n
    n = 1500
    unif = np.asarray(mf.sphere.uniform(jax.random.key(8), n, 3), np.float64)
    assert n * U.mmd2_to_vmf(unif, kappa, gamma) > 20 * U.vmf_mmd_constant(kappa, gamma)
    assert n * U.mmd2_to_vmf(y[:n], kappa, gamma) < 5 * U.vmf_mmd_constant(kappa, gamma)
