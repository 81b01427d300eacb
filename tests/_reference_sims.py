"""NumPy (float64) transcriptions of the public simulators that issue 28 is matched against.

Each function is a transcription of one routine of a public repository (same update rule, same
indexing, same normalisation), named in its docstring as ``repo:path:lines`` of the mirrored
snapshot. They are references for equality tests of meanfield, so nothing here uses the engine; simuformer's
step is the package's own NumPy transcription (``meanfield/reproduce/_simuformer.py``, re-exported
here), which ``meanfield reproduce dynamics`` checks against.
Row-vector convention throughout, as in the sources: ``x`` has shape ``(..., n, d)`` with one
token per row. The map to meanfield's conventions is stated in each docstring.

Sources (commit of the mirrored snapshot):

- simuformer: ``nikitus20/simuformer`` ``simuxform.py`` (1959a8a)
- lost in the middle: ``borjanG/2026-lost-in-the-middle``
  ``generate_alibi_particle_circle_dynamics.py``, ``generate_u_shape_numerology_data.py`` (c7e12ba)
- rotf: ``borjanG/2023-transformers-rotf`` ``phase-diagrams.py``, ``curve.ipynb`` (538ba83)
- Sinkformers: ``michaelsdr/sinkformers``
  ``nlp-tutorial/text-classification-transformer/sinkhorn.py`` and ``model.py`` (045d933)
"""

from __future__ import annotations

import math

import numpy as np

# simuformer (nikitus20/simuformer simuxform.py): one transcription, the package's, which
# ``meanfield reproduce dynamics`` checks against (meanfield/reproduce/_simuformer.py; NumPy only,
# it does not use the engine)
from meanfield.reproduce._simuformer import (  # noqa: F401 (re-exported for the tests)
    SIMUFORMER_NORMS,
    simuformer_attention,
    simuformer_eta,
    simuformer_field,
    simuformer_regenerates,
    simuformer_step,
)


def _normalize_rows(x):
    # torch.nn.functional.normalize(x, dim=-1): x / max(|x|, 1e-12)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# --------------------------------------------------------------------------------------------
# rotf (borjanG/2023-transformers-rotf phase-diagrams.py, curve.ipynb)
# --------------------------------------------------------------------------------------------


def rotf_step_1(x, BF, V, beta, eta, *, use_softmax=True, randomKQ=1, randomV=1):
    """``simu_xform.step_1`` of rotf's phase-diagrams.py:220-273 (one head).

    ``SM = x BF x^T`` (``x x^T`` when ``randomKQ == 0``), times beta; softmax over the last axis,
    or ``exp(SM) / n`` without softmax (:252-254, unlike simuformer's plain ``exp``);
    ``x <- normalize(x + eta (SM x) V)`` (``V`` applied only when ``randomV > 0``, :263-266).
    """
    x = np.asarray(x, dtype=np.float64)
    y = x @ np.asarray(BF, dtype=np.float64) if randomKQ > 0 else x
    sm = beta * (y @ np.swapaxes(x, -1, -2))
    if use_softmax:
        sm = np.exp(sm - np.max(sm, axis=-1, keepdims=True))
        sm = sm / np.sum(sm, axis=-1, keepdims=True)
    else:
        sm = np.exp(sm) / x.shape[-2]
    m2 = eta * (sm @ x)
    if randomV > 0:
        m2 = m2 @ np.asarray(V, dtype=np.float64)
    return _normalize_rows(m2 + x)


def rotf_equiangular_rhs(rho, beta, n):
    """Right-hand side of the equiangular ODE of rotf's curve.ipynb (cell 1, ``ode_func``).

    ``rho' = 2 (1 - rho) ((n - 1) rho + 1) / (exp(beta (1 - rho)) + n - 1)``: the common inner
    product of n tokens of SA with ``Q = K = V = I`` (softmax, projected field) from an
    equiangular start.
    """
    rho = np.asarray(rho, dtype=np.float64)
    return (2.0 * (1.0 - rho) * ((n - 1) * rho + 1.0)) / (np.exp(beta * (1.0 - rho)) + (n - 1))


# --------------------------------------------------------------------------------------------
# lost in the middle (borjanG/2026-lost-in-the-middle)
# --------------------------------------------------------------------------------------------


def lim_build_causal_weights(n_tokens, lam):
    """``build_causal_weights`` (generate_alibi_particle_circle_dynamics.py:36-42).

    ``w_jk = exp(-(lam/n)(j - k)) / sum_{k' < j} exp(-(lam/n)(j - k'))`` for ``k < j``, zero
    otherwise: strictly causal (no self term), rows ``j >= 1`` sum to 1, row 0 is zero.
    """
    weights = np.zeros((n_tokens, n_tokens), dtype=np.float64)
    for j in range(1, n_tokens):
        k = np.arange(j)
        coeffs = np.exp(-(lam / n_tokens) * (j - k))
        weights[j, :j] = coeffs / coeffs.sum()
    return weights


def lim_force(theta, beta, weights):
    """``force`` (generate_alibi_particle_circle_dynamics.py:45-52).

    ``theta_j' = sum_{k<j} w_jk (-beta sin(theta_j - theta_k) exp(beta cos(theta_j - theta_k)))``;
    token 0 has zero force.
    """
    theta = np.asarray(theta, dtype=np.float64)
    out = np.zeros_like(theta)
    for j in range(1, theta.size):
        diff = theta[j] - theta[:j]
        interaction = -beta * np.sin(diff) * np.exp(beta * np.cos(diff))
        out[j] = np.dot(weights[j, :j], interaction)
    return out


def lim_rk4_step(theta, dt, beta, weights):
    """``rk4_step`` (generate_alibi_particle_circle_dynamics.py:55-60): classical RK4 of
    ``lim_force``."""
    k1 = lim_force(theta, beta, weights)
    k2 = lim_force(theta + 0.5 * dt * k1, beta, weights)
    k3 = lim_force(theta + 0.5 * dt * k2, beta, weights)
    k4 = lim_force(theta + dt * k3, beta, weights)
    return theta + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def lim_simulate(theta0, beta, lam, t_max, dt):
    """``simulate`` (generate_alibi_particle_circle_dynamics.py:84-105) from a given start.

    ``round(t_max / dt)`` RK4 steps; returns the history ``(n_steps + 1, n)``.
    """
    theta = np.asarray(theta0, dtype=np.float64)
    weights = lim_build_causal_weights(theta.size, lam)
    n_steps = int(round(t_max / dt))
    history = np.empty((n_steps + 1, theta.size))
    history[0] = theta
    for step in range(1, n_steps + 1):
        theta = lim_rk4_step(theta, dt, beta, weights)
        history[step] = theta
    return history


def lim_bessel_i(n, x):
    """Modified Bessel ``I_n(x)``, integer ``n >= 0``, by its series
    (generate_u_shape_numerology_data.py:32-41)."""
    term = (x / 2.0) ** n / math.factorial(n)
    total = term
    for k in range(10000):
        term *= (x * x / 4.0) / ((k + 1) * (k + n + 1))
        total += term
        if abs(term) <= 1e-15 * max(1.0, abs(total)):
            break
    return total


def lim_psi(c, y):
    """``psi_c(y) = sum_{k>=0} c^{k+1} y^k / (k! (k+1)!)`` by its series
    (generate_u_shape_numerology_data.py:44-53). Equals ``sqrt(c/y) I_1(2 sqrt(c y))``."""
    term = c
    total = term
    for k in range(10000):
        term *= c * y / ((k + 1) * (k + 2))
        total += term
        if abs(term) <= 1e-15 * max(1.0, abs(total)):
            break
    return total


def lim_y_lambda(s, lam):
    """``Y_lambda(s) = log((e^lam - 1) / (e^(lam s) - 1))``, ``log(1/s)`` at ``lam = 0``
    (generate_u_shape_numerology_data.py:56-59)."""
    if lam == 0.0:
        return math.log(1.0 / s)
    return math.log(math.expm1(lam) / math.expm1(lam * s))


def lim_omega(n, M):
    """``omega_{n,M} = exp(-pi^2 n^2 / (2 M^2))`` (generate_u_shape_numerology_data.py:62-63)."""
    return math.exp(-0.5 * (math.pi * n / M) ** 2)


def lim_green(s, a, t, lam):
    """``g_a(t, 1; s) = lam e^(lam s) / (e^lam - 1) * psi_{a t}(Y_lambda(s))``
    (generate_u_shape_numerology_data.py:66-76 inner term; coefficient 1 at ``lam = 0``)."""
    coeff = 1.0 if lam == 0.0 else lam * math.exp(lam * s) / math.expm1(lam)
    return coeff * lim_psi(a * t, lim_y_lambda(s, lam))


def lim_profile_value(s, beta, t, lam, M, n_max):
    """The truncated soft-accuracy profile ``S_t^[n_max](s)`` at relative position ``s``
    (``profile_value``, generate_u_shape_numerology_data.py:66-77):
    ``sum_{n=1}^{n_max} omega_{n,M} g_{a_n}(t, 1; s)`` with ``a_n = n^2 I_n(beta)``."""
    return sum(
        lim_omega(n, M) * lim_green(s, n**2 * lim_bessel_i(n, beta), t, lam)
        for n in range(1, n_max + 1)
    )


def lim_t_crit(beta, lam, M, n_max):
    """``t_crit = 2 (1 - e^-lam) S1 / S2``, ``S1 = sum omega_n a_n``, ``S2 = sum omega_n a_n^2``:
    the time where the slope of the profile at ``s = 1`` changes sign
    (generate_u_shape_numerology_data.py:93-102)."""
    s1 = s2 = 0.0
    for n in range(1, n_max + 1):
        b = n**2 * lim_bessel_i(n, beta)
        w = lim_omega(n, M)
        s1 += w * b
        s2 += w * b * b
    return 2.0 * (1.0 - math.exp(-lam)) * s1 / s2


def _expm(a):
    # scaling and squaring with a Taylor series: plain NumPy, enough for the small matrices here
    norm = np.linalg.norm(a, ord=1)
    squarings = max(0, int(math.ceil(math.log2(norm))) + 1) if norm > 0 else 0
    b = a / 2.0**squarings
    out = np.eye(a.shape[0])
    term = np.eye(a.shape[0])
    for k in range(1, 30):
        term = term @ b / k
        out = out + term
    for _ in range(squarings):
        out = out @ out
    return out


def lim_linear_response_profile(n_tokens, beta, t, lam, M, n_max):
    """Finite-n analogue of ``S_t(s)`` (ours, not in the repository).

    The ALiBi circle dynamics linearised about the uniform state: Fourier mode m of the
    per-position density obeys ``u' = a_m W u`` with ``W = lim_build_causal_weights(n, lam)``
    and ``a_m = m^2 I_m(beta)``. The response of the last token to token k,
    ``n [exp(a_m t W)]_{n-1, k}``, weighted by ``omega_{m,M}`` and summed over m, tends to
    ``lim_profile_value((k + 1/2)/n, ...)`` as n grows (error O(1/n)). Returns the profile at
    ``k = 0..n-2`` and the positions ``s_k = (k + 1/2)/n``.
    """
    w = lim_build_causal_weights(n_tokens, lam)
    prof = np.zeros(n_tokens - 1)
    for m in range(1, n_max + 1):
        a = m**2 * lim_bessel_i(m, beta)
        prof += lim_omega(m, M) * n_tokens * _expm(a * t * w)[-1, :-1]
    return prof, (np.arange(n_tokens - 1) + 0.5) / n_tokens


# --------------------------------------------------------------------------------------------
# Sinkformers (michaelsdr/sinkformers nlp-tutorial/text-classification-transformer)
# --------------------------------------------------------------------------------------------


def _logsumexp(a, axis):
    m = np.max(a, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(a - m), axis=axis))


def sinkformers_sinkhorn_potentials(logits, n_iters, eps=1.0):
    """``SinkhornDistance.forward`` (sinkhorn.py:18-64) on ``c = logits`` (shape ``(..., q, k)``).

    Log domain, uniform marginals ``mu = 1/q``, ``nu = 1/k``; half-steps alternate and are
    counted one by one, rows first: iteration ``i`` even updates
    ``u <- eps (log mu - logsumexp_j((c + u + v)/eps)) + u`` (:44-47), odd updates ``v`` the same
    way over the columns and zeroes entries ``v > 9e8`` (:48-52). Stops early when the mean
    (over the batch) of ``sum_i |u_new - u_old|`` of the last row step is below 1e-12 (:40, 54).
    Returns ``(pi, u, v)`` with ``pi = exp((c + u + v)/eps)`` (total mass 1).
    """
    c = np.asarray(logits, dtype=np.float64)
    q, k = c.shape[-2], c.shape[-1]
    u = np.zeros(c.shape[:-1])
    v = np.zeros(c.shape[:-2] + (k,))
    err = np.inf
    for i in range(n_iters):
        mod = (c + u[..., :, None] + v[..., None, :]) / eps
        if i % 2 == 0:
            u_old = u
            u = eps * (np.log(1.0 / q) - _logsumexp(mod, axis=-1)) + u
            err = float(np.mean(np.sum(np.abs(u - u_old), axis=-1)))
        else:
            v = eps * (np.log(1.0 / k) - _logsumexp(mod, axis=-2)) + v
            v = np.where(v > 9e8, 0.0, v)
        if err < 1e-12:
            break
    return np.exp((c + u[..., :, None] + v[..., None, :]) / eps), u, v


def sinkformers_sinkhorn(logits, n_iters):
    """Sinkformers attention weights (model.py:15-24): ``k * pi`` with ``pi`` from
    ``sinkformers_sinkhorn_potentials(logits, n_iters, eps=1)``.

    ``n_iters = 1`` is one row step, i.e. the softmax over the last axis; an odd count ends on a
    row step, so the result is exactly row-stochastic and approximately column-stochastic
    (columns sum to ``k/q`` at convergence). In model.py the logits are
    ``q k^T / sqrt(d_k)`` with masked entries set to -1e9 (:15-16).
    """
    pi, _, _ = sinkformers_sinkhorn_potentials(logits, n_iters, eps=1.0)
    return pi * pi.shape[-1]


def sinkhorn_self_ot(logits, n_iters):
    """Entropic OT of the empirical measure with itself (ours, not in the repository).

    ``OT(mu, mu) = min_pi <C, pi> + KL(pi | mu x mu)``, cost ``C = -logits``, evaluated by the
    dual objective at the Sinkhorn potentials: with ``f = u + log q``, ``g = v + log k``,
    ``D = mean(f) + mean(g) - (sum(pi) - 1)``. For ``logits = beta x_i^T W x_j`` with symmetric
    ``W``, ``grad_{x_i} OT = -(2 beta / n) sum_j P_ij W x_j`` with ``P = n pi`` (envelope
    theorem): the Sinkhorn field with value ``V = W`` is ``-(n / 2 beta) grad OT``.
    """
    pi, u, v = sinkformers_sinkhorn_potentials(logits, n_iters, eps=1.0)
    q, k = pi.shape[-2], pi.shape[-1]
    f = u + math.log(q)
    g = v + math.log(k)
    return np.mean(f, axis=-1) + np.mean(g, axis=-1) - (np.sum(pi, axis=(-2, -1)) - 1.0)
