"""Sanity checks of the NumPy reference simulators in ``tests/_reference_sims.py`` (issue 28).

These test the transcriptions themselves (identities, limits, conservation laws); the equality
tests of meanfield against them live with the models.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _reference_sims import (
    lim_bessel_i,
    lim_build_causal_weights,
    lim_force,
    lim_green,
    lim_linear_response_profile,
    lim_profile_value,
    lim_psi,
    lim_rk4_step,
    lim_simulate,
    lim_t_crit,
    rotf_equiangular_rhs,
    rotf_step_1,
    simuformer_attention,
    simuformer_eta,
    simuformer_field,
    simuformer_regenerates,
    simuformer_step,
    sinkformers_sinkhorn,
    sinkhorn_self_ot,
)
from scipy.linalg import expm
from scipy.special import iv


def _sphere(rng, shape):
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _rk4(f, y, h):
    k1 = f(y)
    k2 = f(y + 0.5 * h * k1)
    k3 = f(y + 0.5 * h * k2)
    k4 = f(y + h * k3)
    return y + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)


# ---------------------------------------------------------------------------------- simuformer


def test_simuformer_one_identity_head_is_published_sa_step():
    rng = np.random.default_rng(0)
    n, d, beta, eta = 7, 3, 2.5, 0.1
    x = _sphere(rng, (n, d))
    logits = beta * x @ x.T
    a = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    expected = x + eta * a @ x
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    got, r = simuformer_step(x, np.eye(d)[None], np.eye(d)[None], beta, eta, norm="postln")
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(r, np.ones(n))


def test_simuformer_heads_average_and_value_acts_on_the_right():
    rng = np.random.default_rng(1)
    n, d, H, beta = 5, 4, 3, 1.3
    x = _sphere(rng, (n, d))
    BF = rng.standard_normal((H, d, d))
    V = rng.standard_normal((H, d, d))
    field = simuformer_field(x, BF, V, beta)
    # column form: F_i = (1/H) sum_h sum_j A^h_ij V_h^T x_j, A^h_ij = softmax_j(beta x_i^T BF_h x_j)
    ref = np.zeros((n, d))
    for h in range(H):
        for i in range(n):
            w = np.array([math.exp(beta * x[i] @ BF[h] @ x[j]) for j in range(n)])
            w /= w.sum()
            ref[i] += sum(w[j] * V[h].T @ x[j] for j in range(n)) / H
    np.testing.assert_allclose(field, ref, rtol=0, atol=1e-13)


def test_simuformer_sequential_is_causal():
    rng = np.random.default_rng(2)
    x = _sphere(rng, (6, 3))
    a = simuformer_attention(x, np.eye(3), 4.0, sequential=True)
    np.testing.assert_array_equal(np.triu(a, k=1), 0.0)
    np.testing.assert_allclose(a.sum(1), 1.0, atol=1e-15)
    assert a[0, 0] == 1.0  # the first token attends only to itself: it never moves
    new, _ = simuformer_step(x, np.eye(3)[None], np.eye(3)[None], 4.0, 0.1, sequential=True)
    np.testing.assert_allclose(new[0], x[0], atol=1e-15)


@pytest.mark.parametrize("norm", ["postln", "preln", "periln", "ngpt"])
def test_simuformer_norms_stay_on_sphere_and_batch(norm):
    rng = np.random.default_rng(3)
    x = _sphere(rng, (2, 5, 3))
    BF = rng.standard_normal((2, 3, 3))
    V = rng.standard_normal((2, 3, 3))
    new, r = simuformer_step(x, BF, V, 1.0, 0.1, norm=norm)
    np.testing.assert_allclose(np.linalg.norm(new, axis=-1), 1.0, atol=1e-14)
    one, r0 = simuformer_step(x[1], BF, V, 1.0, 0.1, norm=norm)
    np.testing.assert_allclose(new[1], one, atol=1e-15)
    np.testing.assert_allclose(r[1], r0, atol=1e-15)
    assert (r == 1.0).all() == (norm in ("postln", "ngpt"))


def test_simuformer_ngpt_moves_by_fixed_angle():
    # |x + 0.2 eta a| with |a| = 1: the displacement before normalising has length 0.2 eta
    rng = np.random.default_rng(4)
    x = _sphere(rng, (4, 3))
    eye = np.eye(3)[None]
    A = simuformer_field(x, eye, eye, 2.0)
    a = A / (np.linalg.norm(A, axis=-1, keepdims=True) + 1e-9)
    new, _ = simuformer_step(x, eye, eye, 2.0, 0.5, norm="ngpt")
    raw = x + 0.5 * 0.2 * a
    np.testing.assert_allclose(new, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-15)


def test_simuformer_clock():
    assert simuformer_eta(0.1, 3.0) == 0.1
    assert simuformer_eta(0.1, 3.0, use_softmax=False) == pytest.approx(
        0.1 / (math.sqrt(3.0) * math.exp(2.5))
    )
    assert simuformer_regenerates(0.0, 0.1, -1) == (True, 0.1, 0)
    assert simuformer_regenerates(0.95, 0.1, 0)[0] is True
    assert simuformer_regenerates(0.5, 0.1, 0)[0] is False


# ---------------------------------------------------------------------------------------- rotf


def test_rotf_equiangular_ode_matches_sa_simulation():
    # n tokens with Gram (1 - rho) I + rho 11^T stay equiangular under SA (Q = K = V = I)
    n, beta, rho0, h = 6, 2.0, 0.1, 1e-2
    x = np.linalg.cholesky((1 - rho0) * np.eye(n) + rho0 * np.ones((n, n)))

    def field(y):
        a = np.exp(beta * y @ y.T)
        v = (a / a.sum(1, keepdims=True)) @ y
        return v - np.sum(v * y, axis=1, keepdims=True) * y

    rho = rho0
    for _ in range(200):
        x = _rk4(field, x, h)
        rho = _rk4(lambda r: rotf_equiangular_rhs(r, beta, n), rho, h)
    gram = x @ x.T
    off = gram[~np.eye(n, dtype=bool)]
    assert off.max() - off.min() < 1e-12
    assert abs(off.mean() - rho) < 1e-9
    assert 0.5 < rho < 1.0


def test_rotf_step_identity_matches_simuformer_postln():
    rng = np.random.default_rng(5)
    x = _sphere(rng, (6, 3))
    BF = rng.standard_normal((3, 3))
    V = rng.standard_normal((3, 3))
    a = rotf_step_1(x, BF, V, 1.5, 0.1)
    b, _ = simuformer_step(x, BF[None], V[None], 1.5, 0.1, norm="postln")
    np.testing.assert_allclose(a, b, atol=1e-15)


# ------------------------------------------------------------------------- lost in the middle


def test_lim_weights_rows():
    w = lim_build_causal_weights(9, 1.7)
    np.testing.assert_array_equal(w[0], 0.0)
    np.testing.assert_allclose(w[1:].sum(1), 1.0, atol=1e-15)
    np.testing.assert_array_equal(np.triu(w), 0.0)  # strictly causal, no self weight
    # ALiBi: geometric in the distance j - k within a row
    np.testing.assert_allclose(w[5, 3] / w[5, 4], math.exp(-1.7 / 9), rtol=1e-14)


def test_lim_force_is_projected_unnormalised_attention():
    # theta_j' = <tangent_j, sum_k w_jk grad_x exp(beta <x, x_k>)|_{x_j}> on the circle: beta
    # times the projected unnormalised attention with weights w
    rng = np.random.default_rng(6)
    n, beta = 7, 1.3
    theta = rng.uniform(0, 2 * np.pi, n)
    w = lim_build_causal_weights(n, 1.0)
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    tangent = np.stack([-np.sin(theta), np.cos(theta)], 1)
    field = beta * (w * np.exp(beta * x @ x.T)) @ x
    np.testing.assert_allclose(lim_force(theta, beta, w), np.sum(tangent * field, 1), atol=1e-14)


def test_lim_rk4_two_tokens():
    # token 0 never moves and token 1 follows the autonomous phi' = -beta sin(phi) e^{beta cos phi}
    # of the gap phi = theta_1 - theta_0: fourth order against a fine reference, invariance under
    # a common rotation, and the synchronised state is fixed
    beta, phi0, T = 1.5, 2.0, 1.0
    w = lim_build_causal_weights(2, 1.0)

    def run(dt):
        return lim_simulate(np.array([0.3, 0.3 + phi0]), beta, 1.0, T, dt)

    fine = run(1e-3)[-1]
    assert fine[0] == 0.3
    errs = [abs(run(dt)[-1][1] - fine[1]) for dt in (0.1, 0.05)]
    assert 12 < errs[0] / errs[1] < 20  # ~2^4
    np.testing.assert_array_equal(lim_rk4_step(np.array([0.3, 0.3]), 0.1, beta, w), [0.3, 0.3])
    shifted = lim_simulate(np.array([1.3, 1.3 + phi0]), beta, 1.0, T, 1e-3)[-1]
    np.testing.assert_allclose(shifted - 1.0, fine, atol=1e-13)


def test_lim_u_shape_identities():
    assert lim_bessel_i(3, 1.7) == pytest.approx(iv(3, 1.7), rel=1e-14)
    c, y = 0.8, 2.3
    z = math.sqrt(c * y)
    assert lim_psi(c, y) == pytest.approx(c * iv(1, 2 * z) / z, rel=1e-14)
    # t_crit: the slope of the profile at s = 1 changes sign there
    beta, lam, M, n_max = 1.0, 1.0, 8.0, 20
    tc = lim_t_crit(beta, lam, M, n_max)
    slope = [
        (
            lim_profile_value(1.0, beta, t, lam, M, n_max)
            - lim_profile_value(1 - 1e-6, beta, t, lam, M, n_max)
        )
        for t in (0.9 * tc, 1.1 * tc)
    ]
    assert slope[0] > 0 > slope[1]
    # U shape at t = 1 (the script's parameters): interior minimum below both ends
    s = np.linspace(0.02, 0.98, 97)
    prof = np.array([lim_profile_value(si, beta, 1.0, lam, M, n_max) for si in s])
    k = int(np.argmin(prof))
    assert 10 < k < 90 and prof[k] < prof[0] and prof[k] < prof[-1]


def test_lim_u_shape_is_the_large_n_linear_response():
    beta, lam, t, M, n_max = 1.0, 1.0, 1.0, 8.0, 6
    errs = []
    for n in (32, 128):
        prof, s = lim_linear_response_profile(n, beta, t, lam, M, n_max)
        cont = np.array([lim_profile_value(si, beta, t, lam, M, n_max) for si in s])
        errs.append(np.max(np.abs(prof - cont)[n // 10 :]))
    assert errs[1] < 0.02 and 3 < errs[0] / errs[1] < 5  # O(1/n)
    a = iv(1, beta)
    w = lim_build_causal_weights(32, lam)
    np.testing.assert_allclose(
        lim_linear_response_profile(32, beta, t, lam, 1e9, 1)[0],
        32 * expm(a * t * w)[-1, :-1],
        rtol=1e-12,
    )
    assert lim_green(0.5, a, 0.0, lam) == 0.0


# ------------------------------------------------------------------------------- Sinkformers


def test_sinkhorn_one_iteration_is_softmax_and_converges():
    rng = np.random.default_rng(7)
    logits = 2 * rng.standard_normal((3, 6, 6))
    soft = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(sinkformers_sinkhorn(logits, 1), soft, atol=1e-14)
    a = sinkformers_sinkhorn(logits, 201)
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-13)
    np.testing.assert_allclose(a.sum(-2), 1.0, atol=1e-9)


def test_sinkhorn_self_ot_is_the_energy_of_symmetric_sinkhorn_attention():
    rng = np.random.default_rng(8)
    n, d, beta = 5, 3, 1.2
    g = rng.standard_normal((d, d))
    W = (g + g.T) / 2

    def energy(x):
        return sinkhorn_self_ot(beta * x @ W @ x.T, 401)

    def field(x):  # Sinkhorn attention, value V = W
        return sinkformers_sinkhorn(beta * x @ W @ x.T, 401) @ x @ W

    x = rng.standard_normal((n, d))
    grad = np.zeros_like(x)
    for i in range(n):
        for k in range(d):
            e = np.zeros_like(x)
            e[i, k] = 1e-5
            grad[i, k] = (energy(x + e) - energy(x - e)) / 2e-5
    np.testing.assert_allclose(field(x), -(n / (2 * beta)) * grad, atol=1e-7)
    # on the sphere (projected, W = V = I) the energy is non-increasing
    W = np.eye(d)
    y = _sphere(rng, (n, d))
    values = []
    for _ in range(20):
        values.append(energy(y))
        v = field(y)
        y = y + 0.05 * (v - np.sum(v * y, 1, keepdims=True) * y)
        y /= np.linalg.norm(y, axis=1, keepdims=True)
    assert np.all(np.diff(values) < 0)
