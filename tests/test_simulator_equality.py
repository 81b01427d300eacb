"""meanfield against the public simulators of issue 28, from the same particles and weights (float64).

The references are the NumPy transcriptions of tests/_reference_sims.py: simuformer's
``SimuXForm.step`` (postln and ngpt exactly; preln and periln with the paper's radial law, to
second order per step: simuformer's own law ``r * sum_k A_k`` is not the paper's), lost in the middle's ALiBi circle
dynamics (``rk4_step``) and rotf's equiangular ODE. The conventions that differ (research notes,
issue 28): simuformer's value matrix acts on the right of row vectors (meanfield's ``V`` is its
transpose) and its bilinear form is ``BF = Q^T K``; lost in the middle's force is ``beta`` times
the projected, masked, unnormalised attention, on angles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_sims import (
    lim_build_causal_weights,
    lim_rk4_step,
    rotf_equiangular_rhs,
    simuformer_field,
    simuformer_step,
)

import meanfield as mf

SA = mf.models.SelfAttention


def _simuformer_weights(seed, H, d):
    rng = np.random.default_rng(seed)
    BF = rng.normal(size=(H, d, d)) / np.sqrt(d)
    V = rng.normal(size=(H, d, d)) / np.sqrt(d)  # simuformer's randomV = 1 (row convention)
    return BF, V


def _meanfield_sa(beta, BF, V_sim, sequential, **options):
    """SA with Q = I, K = BF (so Q^T K = BF) and V = V_sim^T, causal when ``sequential``."""
    H, d, _ = BF.shape
    Q = np.broadcast_to(np.eye(d), (H, d, d))
    V = np.swapaxes(V_sim, 1, 2)
    return SA(beta, Q, BF, V, mask=mf.masks.Causal() if sequential else None, **options)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("sequential", [False, True])
def test_simuformer_postln_is_the_renormalised_euler_step(x64, heads, sequential):
    n, d, beta, eta, steps = 7, 4, 2.5, 0.1, 6
    x0 = mf.sphere.uniform(jax.random.key(heads + 10 * sequential), n, d, dtype=jnp.float64)
    BF, V_sim = _simuformer_weights(heads, heads, d)
    x = np.asarray(x0)
    for _ in range(steps):
        x, _ = simuformer_step(x, BF, V_sim, beta, eta, norm="postln", sequential=sequential)
    model = _meanfield_sa(beta, BF, V_sim, sequential)
    traj = mf.simulate(model, x0, t1=steps * eta, dt=eta, solver="euler", step="renormalize")
    np.testing.assert_allclose(traj.xs[-1], x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("sequential", [False, True])
def test_simuformer_ngpt_is_the_renormalised_euler_step_of_ngpt(x64, heads, sequential):
    # simuformer's ngpt: x <- normalize(x + eta 0.2 A / (|A| + 1e-9)); meanfield's
    # normalization="ngpt" has the unprojected field alpha A / |A| (no 1e-9)
    n, d, beta, eta, steps = 7, 4, 1.5, 0.2, 8
    x0 = mf.sphere.uniform(jax.random.key(3 + heads + 10 * sequential), n, d, dtype=jnp.float64)
    BF, V_sim = _simuformer_weights(7 + heads, heads, d)
    model = _meanfield_sa(beta, BF, V_sim, sequential, normalization="ngpt", alpha=0.2)
    traj = mf.simulate(model, x0, t1=steps * eta, dt=eta, solver="euler", step="renormalize")
    exact, published = np.asarray(x0), np.asarray(x0)
    smallest = np.inf
    for _ in range(steps):
        exact, _ = simuformer_step(
            exact, BF, V_sim, beta, eta, norm="ngpt", sequential=sequential, norm_eps=0.0
        )
        A = simuformer_field(published, BF, V_sim, beta, sequential=sequential)
        smallest = min(smallest, float(np.min(np.linalg.norm(A, axis=-1))))
        published, _ = simuformer_step(
            published, BF, V_sim, beta, eta, norm="ngpt", sequential=sequential
        )
    np.testing.assert_allclose(traj.xs[-1], exact, rtol=0, atol=1e-12)
    # the published 1e-9 moves each step by at most eta 0.2 1e-9 / |A| more (x 4: the flow's
    # Lipschitz growth over these steps and rounding)
    tol = 4 * steps * eta * 0.2 * 1e-9 / smallest
    np.testing.assert_allclose(traj.xs[-1], published, rtol=0, atol=tol)
    assert np.max(np.abs(traj.xs[-1] - published)) > 1e-14  # the 1e-9 is seen


def test_lost_in_the_middle_rk4_is_masked_usa_on_the_circle(x64):
    # lost in the middle: theta_j' = beta * (tangential component of
    # sum_{k<j} w_jk e^{beta <x_j, x_k>} x_k), w = ALiBi(lam, no self, row-normalised); meanfield's
    # masked USA field is sum_k w_jk e^{beta <x_j, x_k>} x_k, so its time is s = beta t.
    n, beta, lam, dt, steps = 9, 1.3, 1.0, 0.002, 5
    theta0 = np.random.default_rng(1).uniform(0.0, 2.0 * np.pi, size=n)
    W = lim_build_causal_weights(n, lam)
    theta = theta0.copy()
    for _ in range(steps):
        theta = lim_rk4_step(theta, dt, beta, W)
    x0 = jnp.asarray(np.stack([np.cos(theta0), np.sin(theta0)], axis=-1))
    model = mf.kernels.USA(beta, mask=mf.masks.ALiBi(lam, include_self=False, normalized=True))
    traj = mf.simulate(model, x0, t1=beta * dt * steps, dt=beta * dt, solver="rk4")
    x = np.asarray(traj.xs[-1])
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-13)
    expected = np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    # the same ODE, two RK4 discretisations (angles vs the projected field in R^2): their local
    # errors differ at O(dt^5), below 1e-12 at this step
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-12)
    assert np.abs(theta - theta0).max() > 1e-3  # the tokens moved
    np.testing.assert_array_equal(x[0], np.asarray(x0[0]))  # token 0 admits nothing


def test_rotf_equiangular_ode_is_sa_with_identity_weights(x64):
    from scipy.integrate import solve_ivp

    n, beta, rho0, T = 5, 2.0, 0.2, 3.0
    gram = (1.0 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    x0 = jnp.asarray(np.linalg.cholesky(gram))  # n unit vectors in R^n with <x_i, x_j> = rho0
    ts = np.linspace(0.0, T, 7)
    sol = solve_ivp(
        lambda t, r: rotf_equiangular_rhs(r, beta, n),
        (0.0, T),
        [rho0],
        method="DOP853",
        rtol=1e-13,
        atol=1e-14,
        t_eval=ts,
    )
    traj = mf.simulate(SA(beta), x0, t1=T, dt=0.005, solver="rk4", ts=jnp.asarray(ts))
    off = ~np.eye(n, dtype=bool)
    grams = np.einsum("tid,tjd->tij", np.asarray(traj.xs), np.asarray(traj.xs))[:, off]
    assert np.ptp(grams, axis=1).max() < 1e-12  # stays equiangular
    np.testing.assert_allclose(grams.mean(axis=1), sol.y[0], rtol=0, atol=1e-9)
    assert sol.y[0, -1] > rho0 + 0.1  # the tokens gathered


@pytest.mark.parametrize("norm, scheme", [("preln", "pre"), ("periln", "peri")])
def test_simuformer_pre_peri_with_the_papers_radial_law_agree_to_second_order(x64, norm, scheme):
    """simuformer's Pre-/Peri-LN radial law is r <- r + eta r sum_k A_k (r times the sum of the
    components of A), not the paper's r' = <theta, A> (Peri-LN: <theta, A>/|A|). With the paper's
    law (and its 1e-9s at 0) its semi-implicit, renormalised step and meanfield's Euler step in
    x = r theta (mf.simulate, solver="euler") are two first-order steps of the same ODE: one step
    from the same tokens and radii differs by O(h^2); with simuformer's own law by O(h)."""
    n, d, heads, beta = 6, 4, 2, 1.2
    x0 = mf.sphere.uniform(jax.random.key(21), n, d, dtype=jnp.float64)
    BF, V_sim = _simuformer_weights(5, heads, d)
    r0 = 1.0 + np.random.default_rng(2).uniform(size=n)
    model = _meanfield_sa(beta, BF, V_sim, False, normalization=scheme)
    hs = np.array([0.02, 0.01, 0.005])
    paper, own = [], []
    for h in hs:
        traj = mf.simulate(model, x0, t1=float(h), dt=float(h), solver="euler", r0=jnp.asarray(r0))
        x_mf = np.asarray(traj.radius[-1])[:, None] * np.asarray(traj.xs[-1])
        # meanfield's Euler step is x + h field(theta)
        G = np.asarray(model.field(x0))
        np.testing.assert_allclose(x_mf, r0[:, None] * np.asarray(x0) + h * G, rtol=0, atol=1e-14)
        for law, out in (("paper", paper), ("simuformer", own)):
            th, r = simuformer_step(
                np.asarray(x0),
                BF,
                V_sim,
                beta,
                float(h),
                norm=norm,
                r=r0,
                norm_eps=0.0,
                radius_eps=0.0,
                radial=law,
            )
            out.append(np.max(np.abs(r[:, None] * th - x_mf)))
    order_paper = np.polyfit(np.log(hs), np.log(paper), 1)[0]
    order_own = np.polyfit(np.log(hs), np.log(own), 1)[0]
    assert abs(order_paper - 2.0) < 0.05, (order_paper, paper)
    assert abs(order_own - 1.0) < 0.05, (order_own, own)


def test_simuformer_default_step_is_the_published_one():
    """The package transcription's defaults are simuformer's code: radial law r * sum_k A_k and
    1e-9 on r and |A| (the paper-law variant changes only the radius update)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 3))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    BF, V_sim = _simuformer_weights(9, 2, 3)
    r = 1.0 + rng.uniform(size=5)
    A = simuformer_field(x, BF, V_sim, 1.1)
    _, r_pub = simuformer_step(x, BF, V_sim, 1.1, 0.1, norm="preln", r=r)
    np.testing.assert_allclose(r_pub, r + 0.1 * r * A.sum(-1), rtol=1e-15)
    _, r_paper = simuformer_step(x, BF, V_sim, 1.1, 0.1, norm="preln", r=r, radial="paper")
    np.testing.assert_allclose(r_paper, r + 0.1 * np.sum(x * A, -1), rtol=1e-15)
    with pytest.raises(ValueError, match="radial must be"):
        simuformer_step(x, BF, V_sim, 1.1, 0.1, norm="preln", radial="torch")
