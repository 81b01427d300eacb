"""Stability of critical points (meanfield.analysis): tangent Hessian closed forms, saddles, escape."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad

import meanfield as mf
from meanfield import analysis, design

# one compilation instead of eager op-by-op dispatch (same function)
hessian = eqx.filter_jit(analysis.tangent_hessian)


@pytest.mark.parametrize("beta,n,d", [(2.5, 5, 4)])
def test_collapsed_usa_spectrum_closed_form(x64, beta, n, d):
    x = analysis.cluster_state(n, 1, d, jnp.float64)
    lam = np.asarray(jnp.linalg.eigvalsh(hessian(mf.kernels.USA(beta), x)))
    pred = analysis.collapsed_spectrum(beta, n, d)
    assert lam.shape == (n * (d - 1),)
    assert np.allclose(lam[-(d - 1) :], 0.0, atol=1e-12)
    assert np.allclose(lam[: -(d - 1)], -np.exp(beta) / n, rtol=1e-12)
    assert pred["multiplicity"] == lam.size - (d - 1)
    c = analysis.classify(hessian(mf.kernels.USA(beta), x), num_zero_modes=d - 1)
    assert c["kind"] == "maximiser" and c["zero"] == d - 1 and c["positive"] == 0


def test_collapsed_spectrum_float32_and_rescaled():
    n, d, beta = 6, 3, 3.0
    x = analysis.cluster_state(n, 1, d)
    lam = np.asarray(jnp.linalg.eigvalsh(hessian(mf.kernels.USA(beta, rescaled=True), x)))
    # rescaled kernel: e^{-beta} times the original, so -1/n
    assert np.allclose(lam[: -(d - 1)], -1.0 / n, rtol=1e-5)
    assert np.allclose(lam[-(d - 1) :], 0.0, atol=1e-6)


def test_antipodal_two_cluster_state_is_a_saddle_with_the_predicted_spectrum(x64):
    beta, n, d = 1.5, 8, 3
    k = mf.kernels.USA(beta)
    x = analysis.cluster_state(n, 2, d, jnp.float64)
    lam = np.asarray(jnp.linalg.eigvalsh(hessian(k, x)))
    p = analysis.antipodal_spectrum(beta, n, d)
    assert np.allclose(lam[-p["num_positive"] :], p["positive"], rtol=1e-10)
    assert np.allclose(lam[: p["num_negative"]], p["negative"], rtol=1e-10)
    zeros = lam[p["num_negative"] : -p["num_positive"]]
    assert zeros.size == p["zero"] and np.allclose(zeros, 0.0, atol=1e-12)
    c = analysis.classify_state(k, x)
    assert c["kind"] == "saddle" and c["positive"] == d - 1 and c["clusters"] == 2
    assert np.isclose(c["rate"], np.exp(-beta), rtol=1e-10)


@eqx.filter_jit
def _riemannian_grad(kernel, x, aux):
    g = jax.grad(lambda y: mf.energy(kernel, y, aux))(x)
    return mf.sphere.project(x, g)


@pytest.mark.parametrize("which", ["prompt", "anchored-rope"])
def test_hessian_matches_finite_differences_of_the_riemannian_gradient(x64, which):
    n, d = 5, 3
    key = jax.random.key(0)
    if which == "usa":
        kernel = mf.kernels.USA(1.3)
    elif which == "prompt":
        kernel = mf.kernels.Prompt(0.9, mf.kernels.random_gauges(key, 2, d, jnp.float64))
    else:
        kernel = design.Anchored(mf.kernels.RoPE(1.1, 2.0), jnp.array([0.0, 0.6, 0.8]), mass=0.5)
    aux = kernel.default_aux(n)
    x = mf.sphere.uniform(jax.random.key(1), n, d, jnp.float64)  # generic, not critical
    H = np.asarray(hessian(kernel, x, aux))
    B = np.asarray(analysis.tangent_frame(x))  # (n, d, d-1)
    h = 1e-5
    cols = []
    for i in range(n):
        for a in range(d - 1):
            xi = np.zeros((n, d))
            xi[i] = B[i][:, a]
            gp = _riemannian_grad(kernel, mf.sphere.normalize(x + h * xi), aux)
            gm = _riemannian_grad(kernel, mf.sphere.normalize(x - h * xi), aux)
            dg = (np.asarray(gp) - np.asarray(gm)) / (2 * h)
            cols.append(np.einsum("nda,nd->na", B, dg).reshape(-1))
    H_fd = np.stack(cols, axis=1)
    assert np.allclose(H, H.T, atol=1e-14)
    assert np.max(np.abs(H - H_fd)) < 1e-8 * max(1.0, np.max(np.abs(H)))


def test_cluster_state_and_bad_input():
    x = analysis.cluster_state(6, 3, 3)
    assert int(mf.metrics.num_clusters(x)) == 3
    assert (
        float(jnp.max(jnp.abs(mf.velocity(mf.kernels.USA(2.0), x)))) < 1e-5
    )  # critical by symmetry
    with pytest.raises(ValueError, match="dividing"):
        analysis.cluster_state(7, 2)
    with pytest.raises(TypeError, match="kernel"):
        analysis.tangent_hessian(object(), x)


def test_escape_time_from_antipodal_pair_matches_the_exact_ode(x64):
    # n = 2: the angle obeys d theta/dt = -e^{beta cos theta} sin theta exactly
    beta, delta0 = 2.0, 1e-2
    theta0 = np.pi - delta0
    x0 = jnp.array([[1.0, 0.0, 0.0], [np.cos(theta0), np.sin(theta0), 0.0]])
    t = float(analysis.escape_time(mf.kernels.USA(beta), x0, dt=1e-3, t_max=1e4))
    g0 = 1 - np.cos(theta0)
    theta_f = np.arccos(1 - 0.5 * g0)
    exact, _ = quad(
        lambda th: 1.0 / (np.exp(beta * np.cos(th)) * np.sin(th)), theta_f, theta0, limit=200
    )
    assert abs(t - exact) < 2e-3 + 1e-3 * exact
    # linear theory: rate n lambda_max = e^{-beta}, t_esc = e^{beta} log(C / delta0)
    rate = 2 * float(
        jnp.linalg.eigvalsh(
            hessian(mf.kernels.USA(beta), analysis.cluster_state(2, 2, 3, jnp.float64))
        )[-1]
    )
    assert np.isclose(rate, np.exp(-beta), rtol=1e-10)
    assert t * rate == pytest.approx(np.log(1 / delta0), abs=1.5)
    # not escaped by t_max -> inf
    assert np.isinf(float(analysis.escape_time(mf.kernels.USA(beta), x0, dt=1e-2, t_max=1.0)))


def test_classify_state_of_a_converged_run_is_a_maximiser():
    x0 = mf.sphere.uniform(jax.random.key(2), 12, 3)
    xf = mf.simulate(mf.kernels.USA(1.0), x0, t1=40.0, dt=0.1).xs[-1]
    with jax.enable_x64(True):
        x = mf.sphere.normalize(jnp.asarray(np.asarray(xf, np.float64)))
        c = analysis.classify_state(mf.kernels.USA(1.0), x, rtol=1e-3)
    assert c["kind"] == "maximiser" and c["clusters"] == 1 and c["zero"] == 2


@pytest.mark.parametrize(
    "model",
    [
        mf.models.SelfAttention(1.0, normalization="pre"),
        mf.models.SelfAttention(1.0, normalization="peri"),
        mf.models.SelfAttention(1.0, attention="sinkhorn"),
        mf.models.SelfAttention(1.0, mask=mf.masks.Causal()),
        mf.models.SelfAttention(1.0, normalization="mix", switch_time=0.123),
        mf.models.SelfAttention(1.0, weights="gaussian", regen_period=0.5),
    ],
    ids=["pre", "peri", "sinkhorn", "causal", "mix-switch-inside-a-step", "weights-redrawn"],
)
def test_escape_time_steps_the_models_own_dynamics(model, x64):
    # escape_time steps with the engine (FixedStep, Heun): its time is the first grid time at
    # which mf.simulate(..., solver="rk2")'s directions have half the initial gap. (Before, it
    # ran the Post-LN flow of the bare field whatever the scheme: Pre-LN gave Post-LN's time.)
    x0 = jnp.asarray(mf.sphere.uniform(jax.random.key(3), 8, 3), jnp.float64)
    dt, t1 = 0.05, 8.0
    t = float(analysis.escape_time(model, x0, dt=dt, t_max=t1))
    traj = mf.simulate(model, x0, t1=t1, dt=dt, solver="rk2", ts=np.arange(161) * dt)
    xs = mf.sphere.normalize(traj.xs)
    gaps = np.array([float(mf.metrics.collapse_gap(x)) for x in xs])
    k = int(np.argmax(gaps <= 0.5 * gaps[0]))
    assert gaps[k] <= 0.5 * gaps[0] < gaps[k - 1]
    assert t == pytest.approx(k * dt, rel=1e-12)
    post = float(analysis.escape_time(mf.models.SelfAttention(1.0), x0, dt=dt, t_max=t1))
    assert t != pytest.approx(post, abs=dt / 2)


def test_escape_time_refuses_tokens_in_rd():
    x0 = mf.sphere.uniform(jax.random.key(3), 8, 3)
    with pytest.raises(ValueError, match="geometry='euclidean'"):
        analysis.escape_time(
            mf.models.SelfAttention(1.0, geometry="euclidean"), x0, dt=0.1, t_max=1.0
        )


def test_escape_time_under_jit_and_vmap_in_float32():
    # as reproduce/design.py calls it: a batch of starts in one program, the step count an int32
    # (t = k dt exact in the count), each time the separate call's
    x0s = jnp.stack([mf.sphere.uniform(jax.random.key(s), 8, 3) for s in (1, 2)])
    model = mf.kernels.USA(1.0)
    batch = jax.jit(jax.vmap(lambda x: analysis.escape_time(model, x, dt=0.05, t_max=20.0)))(x0s)
    assert batch.dtype == jnp.float32
    for x0, t in zip(x0s, np.asarray(batch)):
        assert t == float(analysis.escape_time(model, x0, dt=0.05, t_max=20.0))
        assert 0.0 < t < 20.0 and (t / 0.05) == pytest.approx(round(t / 0.05), abs=1e-4)
