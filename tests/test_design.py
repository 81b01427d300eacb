"""Inverse design (meanfield.design): prompt gauges, the quantile phase field, the anchor, learned gauges."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _figures import FigureAudit

import meanfield as mf
from meanfield import design


def _targets(key, K, d, dtype):
    T = mf.sphere.uniform(key, K, d, dtype)
    u = mf.sphere.uniform(jax.random.fold_in(key, 1), 1, d, dtype)[0]
    # include the degenerate cases t = u and t = -u
    return T.at[0].set(u).at[1].set(-u), u


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-6), (jnp.float64, 1e-13)])
@pytest.mark.parametrize("d", [3, 5])
def test_prompt_gauges_orthogonal_and_map_targets_to_u(dtype, tol, d):
    with jax.enable_x64(dtype == jnp.float64):
        T, u = _targets(jax.random.key(d), 7, d, dtype)
        P = design.prompt_gauges(T, u)
        assert P.shape == (7, d, d) and P.dtype == dtype
        eye = jnp.eye(d, dtype=dtype)
        assert float(jnp.max(jnp.abs(jnp.einsum("kji,kjl->kil", P, P) - eye))) < 4 * tol
        assert float(jnp.max(jnp.abs(jnp.einsum("kij,kj->ki", P, T) - u))) < 4 * tol
        assert np.allclose(np.linalg.det(np.asarray(P, np.float64)), 1.0, atol=1e-5)


@pytest.mark.parametrize("dtype,rtol", [(jnp.float32, 2e-6), (jnp.float64, 1e-13)])
def test_designed_prompt_configuration_is_a_global_maximiser(dtype, rtol):
    with jax.enable_x64(dtype == jnp.float64):
        beta, n, K, d = 1.7, 24, 4, 3
        T, u = _targets(jax.random.key(0), K, d, dtype)
        kernel = mf.kernels.Prompt(beta, design.prompt_gauges(T, u))
        aux = kernel.default_aux(n)
        x = design.designed_configuration(kernel, u, aux)
        assert float(jnp.max(jnp.abs(x - T[aux]))) < 10 * rtol  # the marginal is the target law
        E = float(mf.energy(kernel, x, aux))
        assert abs(E - np.exp(beta) / (2 * beta)) <= 5 * rtol * np.exp(beta) / (2 * beta)
        v = mf.velocity(kernel, x, aux)
        assert float(jnp.max(jnp.linalg.norm(v, axis=-1))) < 20 * rtol * np.exp(beta)
        # a perturbed configuration has strictly less energy (the bound is attained only there)
        xp = mf.sphere.normalize(x + 0.05 * jax.random.normal(jax.random.key(1), x.shape, dtype))
        assert float(mf.energy(kernel, xp, aux)) < E - 1e-4


def test_prompt_gauges_rejects_bad_input():
    with pytest.raises(ValueError, match="unit vectors"):
        design.prompt_gauges(jnp.ones((2, 3)), jnp.array([0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        design.prompt_gauges(jnp.eye(3), jnp.array([0.0, 1.0]))


def _target_density(a):
    return jnp.exp(2 * jnp.cos(a - 1.0)) + 0.5 * jnp.exp(4 * jnp.cos(a - 4.0))


def _target_cdf(angles):
    grid = np.linspace(0, 2 * np.pi, 20001)
    mids = 0.5 * (grid[1:] + grid[:-1])
    rho = np.asarray(_target_density(jnp.asarray(mids)), np.float64)
    cdf = np.concatenate([[0.0], np.cumsum(rho)]) / rho.sum()
    return np.interp(angles, grid, cdf)


def _ks(angles, cdf):
    a = np.sort(np.asarray(angles, np.float64))
    n = a.size
    F = cdf(a)
    return max(np.max(np.arange(1, n + 1) / n - F), np.max(F - np.arange(n) / n))


@pytest.mark.parametrize("n", [64, 300])
def test_quantile_phase_field_realises_the_target_law_on_the_orbit(n):
    beta = 1.3
    phi = design.quantile_phase(design.quantile_from_density(_target_density))
    kernel = mf.kernels.PhaseField(beta, phi)
    s = mf.positions(n)
    u = mf.sphere.normalize(jnp.array([1.0, 0.5, 0.6]))
    x = design.designed_configuration(kernel, u, s)
    # on the orbit of u (the latitude circle of height u_3)
    assert float(jnp.max(jnp.abs(x[:, 2] - u[2]))) < 1e-6
    ang = design.orbit_angles(x, u)
    # inverse-CDF at the grid i/n: Kolmogorov distance at most 1/n (plus tabulation error)
    assert _ks(ang, _target_cdf) <= 1.0 / n + 1e-3
    # and it is a maximiser of the phase-field energy, with zero velocity
    assert abs(float(mf.energy(kernel, x, s)) - np.exp(beta) / (2 * beta)) < 1e-5 * np.exp(beta)
    assert float(jnp.max(jnp.abs(mf.velocity(kernel, x, s)))) < 1e-5
    # the test can fail: the undesigned phase 2 pi s (uniform law on the orbit) is far
    x_uniform = design.designed_configuration(
        mf.kernels.PhaseField(beta, lambda t: -2 * jnp.pi * t), u, s
    )
    assert _ks(design.orbit_angles(x_uniform, u), _target_cdf) > 0.1


def test_quantile_phase_from_samples_matches_their_law():
    rng = np.random.default_rng(0)
    samples = np.mod(rng.vonmises(2.0, 3.0, size=4000), 2 * np.pi)
    phi = design.quantile_phase(samples)
    n = 500
    u = jnp.array([0.0, 1.0, 0.0])
    x = design.designed_configuration(mf.kernels.PhaseField(1.0, phi), u, mf.positions(n))
    ang = np.asarray(design.orbit_angles(x, u))
    srt = np.sort(samples)
    ks = _ks(ang, lambda a: np.searchsorted(srt, a, side="right") / srt.size)
    assert ks <= 1.0 / n + 1.0 / samples.size + 1e-3
    with pytest.raises(ValueError, match="angle samples"):
        design.quantile_phase(np.array([np.nan, 1.0]))


def test_anchored_kernel_structure_matches_pair_reference_and_autodiff():
    with jax.enable_x64(True):
        n, d = 9, 3
        T, u = _targets(jax.random.key(3), 3, d, jnp.float64)
        # USA (identity frame) and a rescaled gauge kernel (the Prompt gauge path is covered by the landing
        # test and by the finite-difference Hessian test)
        for base in [mf.kernels.USA(1.5), mf.kernels.RoPE(0.8, 2 * np.pi, rescaled=True)]:
            k = design.Anchored(base, u, mass=0.7)
            x = mf.sphere.uniform(jax.random.key(4), n, d, jnp.float64)
            aux = k.default_aux(n)
            F = mf.field(k, x, aux)
            assert np.allclose(F, mf.field(k, x, aux, method="pairwise"), atol=1e-12)
            E = mf.energy(k, x, aux)
            assert np.allclose(E, mf.energy(k, x, aux, method="pairwise"), atol=1e-12)
            g = jax.grad(lambda y: k.energy(y, aux))(x)  # noqa: B023
            assert np.allclose(n * g, F, atol=1e-12)
            xd = design.designed_configuration(k, u, aux)
            assert np.allclose(mf.energy(k, xd, aux), k.max_energy(), rtol=1e-13)
            assert float(jnp.max(jnp.abs(mf.velocity(k, xd, aux)))) < 1e-12


def test_anchor_makes_random_initial_states_land_on_the_design():
    n, d, beta = 24, 3, 1.0
    u = jnp.array([0.0, 0.0, 1.0])
    T = design.vmf_mixture(jax.random.key(0), n, jnp.eye(3), 10.0)
    prompt = mf.kernels.Prompt(beta, design.prompt_gauges(T, u))
    aux = jnp.arange(n)
    x0s = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(1), 3))

    def final(model):
        return jax.vmap(lambda x0: mf.simulate(model, x0, aux, t1=15.0, dt=0.05).xs[-1])(x0s)

    anchored = final(design.Anchored(prompt, u, mass=1.0))
    free = final(prompt)
    err_anchor = np.max(np.abs(np.asarray(anchored) - np.asarray(T)[None]))
    err_free = np.min(np.max(np.abs(np.asarray(free) - np.asarray(T)[None]), axis=(1, 2)))
    assert err_anchor < 1e-3
    assert err_free > 0.1  # without the anchor the collapse point of the gauge frame is random


def test_anchored_rejects_bad_input():
    with pytest.raises(TypeError, match="USA or exp-gauge"):
        design.Anchored(mf.kernels.Toeplitz(1), jnp.array([0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="unit vector"):
        design.Anchored(mf.kernels.USA(1.0), jnp.array([0.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="mass"):
        design.Anchored(mf.kernels.USA(1.0), jnp.array([0.0, 0.0, 1.0]), mass=-1.0)


def test_vmf_mixture_moments():
    # one component: E <x, mu> = coth(kappa) - 1/kappa on S^2
    m = 20000
    for kappa in [0.5, 5.0]:
        x = design.vmf_mixture(
            jax.random.key(int(kappa * 10)), m, jnp.array([[0.0, 0.6, 0.8]]), kappa
        )
        assert np.allclose(np.linalg.norm(np.asarray(x), axis=1), 1.0, atol=1e-5)
        t = np.asarray(x) @ np.array([0.0, 0.6, 0.8])
        theory = 1 / np.tanh(kappa) - 1 / kappa
        assert abs(t.mean() - theory) < 5 * t.std() / np.sqrt(m)
    # mixture weights
    x = design.vmf_mixture(
        jax.random.key(9), m, jnp.eye(3)[:2], 50.0, weights=jnp.array([0.25, 0.75])
    )
    frac = float(np.mean(np.asarray(x)[:, 0] > np.asarray(x)[:, 1]))
    assert abs(frac - 0.25) < 5 * np.sqrt(0.25 * 0.75 / m)


def test_seam_curve_on_sphere():
    t = jnp.linspace(0, 2 * np.pi, 101)
    assert np.allclose(np.linalg.norm(np.asarray(design.seam_curve(t)), axis=1), 1.0, atol=1e-6)


def test_fit_curve_reduces_the_distance_and_gauges_realise_the_curve():
    target = design.seam_curve(jax.random.uniform(jax.random.key(0), (256,)) * 2 * np.pi)
    theta, losses = design.fit_curve(jax.random.key(1), target, num_modes=4, n=128, steps=150)
    assert losses.shape == (150,)
    assert float(jnp.mean(losses[-10:])) < 0.3 * float(losses[0])
    s = mf.positions(128)
    u = jnp.array([0.0, 0.0, 1.0])
    G = design.curve_gauges(theta, s, u)
    P = np.asarray(design.curve_points(theta, s))
    # the rotation taking p to u divides by 1 + p.u: float32 rounding grows as eps / (1 + p.u) near
    # -u (measured: at most 2.2 of it), so each point is checked to 8 eps / (1 + p.u)
    tol = 8 * np.finfo(np.float32).eps / (1.0 + P @ np.asarray(u))
    err = np.abs(np.einsum("nji,j->ni", G, u) - P).max(axis=1)
    assert np.all(err <= tol), (err / tol).max()
    psi = design.curve_gauge(theta, u)
    assert np.all(np.abs(np.asarray(psi(s[5]).T @ u) - P[5]) <= tol[5])
    # the designed Prompt kernel's maximiser is the fitted curve, with maximal energy
    k = mf.kernels.Prompt(1.0, G)
    x = design.designed_configuration(k, u, jnp.arange(128))
    assert abs(float(mf.energy(k, x, jnp.arange(128))) - np.exp(1.0) / 2) < 1e-5


@pytest.mark.slow
def test_reproduce_design_end_to_end(tmp_path):
    """``run(quick=True)`` with smaller sweeps (options) so the test stays short; numbers against theory."""
    import json

    from meanfield.reproduce import design as rep

    opts = dict(
        anchor_seeds=4,
        anchor_n=32,
        learned_steps=150,
        learned_n=128,
        learned_seeds=2,
        classify_seeds=2,
        classify_n=16,
        escape_betas=[1.0, 2.0, 3.0],
        rb_ps=[2, 8, 32, 128],
        rb_gap_ps=[4, 64],
        rb_n=512,
        large_n=10**5,
        large_t1=0.2,
        large_reference_n=1024,
        mf_ns=[32, 64, 128],
        mf_repeats=48,
        mf_times=[0.0, 1.0, 2.0],
    )
    with FigureAudit() as figures:  # every figure it writes, checked as it is saved
        summary = rep.run(tmp_path, quick=True, quiet=True, **opts)
    assert figures.saved and not figures.problems, "\n".join(figures.problems)
    out = tmp_path / "design"
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["checks"] == summary["checks"]
    for fig in summary["figures"]:
        assert (out / fig).stat().st_size > 1000
    c = {row["name"]: row for row in summary["checks"]}
    for name in [
        "designed_law_distance",
        "baseline_law_distance",
        "hessian_zero_modes",
        "meanfield_rate",
        "random_batch_error",
    ]:
        assert name in c
    assert c["designed_law_distance"]["measured"] < 1e-2
    assert c["baseline_law_distance"]["measured"] > 0.3
    assert c["hessian_zero_modes"]["measured"] == 2
    assert c["hessian_eigenvalue"]["measured"] == pytest.approx(-np.exp(1.0) / 16, rel=1e-8)
    assert c["saddle_eigenvalue"]["measured"] == pytest.approx(np.exp(-1.0) / 16, rel=1e-8)
    assert abs(c["meanfield_rate"]["measured"] + 0.5) < 0.2
    assert c["random_batch_error"]["measured"] < 0.2
    assert abs(c["random_batch_exponent"]["measured"] + 0.5) < 0.15
    assert abs(c["escape_time_exponent"]["measured"] - 1.0) < 0.15
    assert c["designed_max_energy"]["pass"] and c["quantile_ks"]["pass"]
    assert all(row["pass"] for row in summary["checks"]), [
        r["name"] for r in summary["checks"] if not r["pass"]
    ]
