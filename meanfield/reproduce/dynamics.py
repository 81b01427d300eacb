r"""Attention variants as dynamics (``meanfield reproduce dynamics``): issue 28's papers, one check each.

Checks (``summary.json``, the common schema), all in float64:

* ``equiangular_ode``: SA with $Q = K = V = I$ from an equiangular start (Gram matrix
  $(1 - \rho_0) I + \rho_0 \mathbf 1 \mathbf 1^\top$, $n \le d + 1$): the common inner product follows
  $\rho' = 2 (1 - \rho)(1 + (n - 1)\rho) / (e^{\beta (1 - \rho)} + n - 1)$ (rotf's ``curve.ipynb``);
  ``mf.simulate`` (RK4) against ``scipy.integrate.solve_ivp``.
* ``ngpt_equiangular_ode``: the same with ``normalization="ngpt"`` (each token at speed $\alpha$
  along its normalised attention output): $\rho'$ times $\alpha / \|F\|$ (``equiangular_rhs``).
* ``normalization_equiangular_<scheme>`` for the six schemes of ``mf.normalization`` (Karagodin,
  Ge, Polyanskiy, Rigollet, arXiv 2510.22026): from an equiangular start with a common radius the
  common inner product and radius follow ``equiangular_system``; ``mf.simulate`` (RK4) against
  ``solve_ivp``, the tolerance from the Richardson estimate of RK4's error (a second run at $2h$).
* ``normalization_initial_velocity`` and ``peri_early_speedup``: $\rho'(0)$ at the orthogonal start
  against the column of the paper's Theorem 4.1 (Peri-LN's $2/(r_0\sqrt{e^{2\beta} + n - 1})$ against
  Post-LN's $2/(e^\beta + n - 1)$).
* ``normalization_rate_<scheme>``: from random starts every scheme collapses to one cluster; the tail
  of $1 - \rho_{\min}$ against Theorem 4.1's rates: slope $-2$ in $t$ (Post-LN), $-2\alpha$ (nGPT),
  $-4$ in $\sqrt{t + 1}$ (LN-scaling), $-2$ in $\log t$ (Pre-, Mix-, Peri-LN, $r \sim t$).
* ``simuformer_postln``, ``simuformer_ngpt``: simuformer's step (``_simuformer.py``, NumPy) against
  ``mf.simulate(solver="euler", step="renormalize")`` from the same tokens and weights, to 1e-12;
  ``simuformer_preln_paper``, ``simuformer_periln_paper``: simuformer's Pre-/Peri-LN step with the
  paper's radial law (its own, $r \mathbf 1^\top A$, is not the paper's: the note says what differs)
  against meanfield's Euler step in $x = r\theta$, the same to $O(h^2)$ per step (fitted order).
* ``causal_first_token_fixed`` and ``causal_converge_to_first``: causal SA (``mf.masks.Causal()``,
  $V = I$; Karagodin, Polyanskiy, Rigollet, arXiv 2411.04990): the first token never moves, and
  every token converges to it; the unmasked run from the same start is reported beside.
* ``lim_response_vs_expm``, ``lim_profile_closed_form``, ``lim_u_shape``, ``lim_monotone_late``: lost
  in the middle (Duerinckx, Geshkovski, Rossi, arXiv 2605.09213): the ALiBi causal circle dynamics
  ($d = 2$, ``USA`` with ``ALiBi(lam, include_self=False, normalized=True)``, meanfield time
  $\beta t$) linearised about the uniform state (``replicas`` evenly spaced tokens at each of the
  $n$ positions, the ALiBi weights over positions shared evenly by a position's tokens: the
  mean-field density of each position) by ``jax.vjp`` of ``mf.simulate``, against the
  finite-$n$ matrix exponential of the same weights and the closed form $S_t(s)$ (``lim_profile``):
  U-shaped at $t = 1$, monotone after ``lim_t_crit``.
* ``sinkhorn_marginals``, ``sinkhorn_energy_v_qk``, ``sinkhorn_energy_identity``: Sinkhorn attention
  (Sander et al. 2022) is doubly stochastic; the entropic self-transport cost ``sinkhorn_self_ot``
  decreases along ``mf.simulate`` for a symmetric $W = Q^\top K$ with $V = W$ and for
  $Q = K = V = I$ (gradient flows); with $V = I$ and $W \ne I$ the run is measured and reported in
  the note of ``sinkhorn_energy_v_qk``, not checked (no gradient-flow structure is known on the
  sphere; the cost increases on some intervals of the quick run).
* ``hardmax_identity_static``, ``hardmax_leaders_fixed``, ``hardmax_equilibrium``: hardmax attention
  (Alcalde, Fantuzzi, Zuazua 2024, stated in $\mathbb R^d$ with $A = Q^\top K$ positive definite:
  the tokens cluster at the leaders): on the sphere with $Q = K = I$ every token is its own
  maximiser (nothing moves); with a positive definite diagonal $A \ne I$ the leaders (tokens that
  are their own maximiser at $t = 0$) stay put and the run ends at rest, a clustered equilibrium
  whose clusters are counted against the leaders (a follower may stop on the way on the sphere:
  that count is reported, not checked).
* ``rd_*`` (``_euclidean.py``): tokens in $\mathbb R^d$ (``SelfAttention(geometry="euclidean")``;
  Geshkovski, Letrouit, Polyanskiy, Rigollet, arXiv 2305.05465): with $V = I$ the hull of the
  rescaled tokens $z = e^{-tV} x$ does not grow, they end on the boundary of the limit polytope
  and the attention matrix becomes Boolean with the rank of the clusters; a good triple ($V$ with a
  simple positive top eigenvalue) gives at most three hyperplanes; in $d = 1$ the attention rows
  become leaders' basis rows (rank at most 2).

Figure: ``lost_in_the_middle.png`` (the profile at each time, measured and closed form); data:
``dynamics_data.npz``. In ``PAPERS``: part of ``meanfield reproduce`` without a name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import ArrayLike, Bool, Float

from .. import kernels, masks, models, sphere
from .._declare import declared_params
from ..integrate import Trajectory, simulate
from ..normalization import NGPT, NORMALIZATIONS, Peri, Post, Pre, Scheme, as_scheme
from ._common import Experiment, Option, check, write_summary
from ._euclidean import checks as _euclidean_checks

__all__ = [
    "EXPERIMENT",
    "equiangular_rhs",
    "equiangular_system",
    "lim_profile",
    "lim_t_crit",
    "run",
    "sinkhorn_self_ot",
]

_NAME = "dynamics"


#: The experiment's options and steps.
EXPERIMENT = Experiment(
    _NAME,
    {
        "equiangular": Option(
            {"n": 6, "d": 8, "beta": 2.0, "rho0": 0.1, "t1": 8.0, "dt": 0.02, "alpha": 0.2},
            doc="equiangular runs: tokens n <= d + 1, beta, start inner product rho0, RK4 t1 and dt, "
            "nGPT's alpha",
        ),
        "normalization": Option(
            {
                "beta": 2.0,
                "r0": 0.5,
                "r0_equiangular": 2.0,
                "alpha": 0.5,
                "switch_time": 1.0,
                "seeds": 2,
                "seed": 0,
                "t_exp": 40.0,
                "t_scaling": 100.0,
                "t_poly": [8.0, 1000.0, 10000.0],
            },
            doc="the six normalisation schemes (tokens n, d, equiangular t1 and RK4 dt, rho0 of the general "
            "equiangular start: from equiangular): beta, r0 of the orthogonal start, r0 of the rho0 start, "
            "nGPT's alpha, Mix-LN's switch time, random starts and their seed, the rate runs' horizons (400 "
            "RK4 steps each; Pre/Mix/Peri-LN: legs, the last one fitted)",
        ),
        "simuformer": Option(
            {
                "n": 7,
                "d": 4,
                "heads": 3,
                "beta": 1.5,
                "eta": 0.1,
                "steps": 8,
                "seed": 0,
                "h": [0.02, 0.01, 0.005],
            },
            doc="simuformer's step against meanfield: tokens, dimension, heads, beta, step eta and steps of the "
            "Post-LN and nGPT runs, seed of the start and weights, the steps h of the Pre-/Peri-LN one-step fit",
        ),
        "causal": Option(
            {"n": 16, "d": 3, "beta": 1.0, "t1": 30.0, "dt": 0.05, "seed": 0},
            quick={"n": 12, "d": 3, "beta": 1.0, "t1": 30.0, "dt": 0.1, "seed": 0},
            doc="causal SA run: tokens, dimension, beta, RK4 t1 and dt, seed of the uniform start",
        ),
        "lim": Option(
            {
                "n": 64,
                "replicas": 16,
                "beta": 1.0,
                "lam": 1.0,
                "M": 8.0,
                "n_max": 6,
                "times": [1.0, 2.0, 5.0],
                "dt": 0.05,
            },
            quick={
                "n": 32,
                "replicas": 16,
                "beta": 1.0,
                "lam": 1.0,
                "M": 8.0,
                "n_max": 6,
                "times": [1.0, 2.0, 5.0],
                "dt": 0.1,
            },
            full={
                "n": 128,
                "replicas": 16,
                "beta": 1.0,
                "lam": 1.0,
                "M": 8.0,
                "n_max": 6,
                "times": [1.0, 2.0, 5.0],
                "dt": 0.05,
            },
            doc="lost in the middle: positions n, tokens per position (replicas, uniform on the circle), "
            "beta, ALiBi slope lam, M and n_max of S_t, LIM times (the first U-shaped, the last after t_crit), RK4 dt",
        ),
        "sinkhorn": Option(
            {"n": 12, "d": 3, "beta": 1.0, "iters": 51, "t1": 5.0, "dt": 0.05, "saves": 51},
            doc="Sinkhorn runs: tokens, dimension, beta, Sinkhorn half-steps, RK4 t1, dt and save times",
        ),
        "hardmax": Option(
            {
                "n": 16,
                "d": 3,
                "A": [1.0, 2.0, 3.0],
                "seeds": 4,
                "t1": 20.0,
                "dt": 0.02,
                "tie_tol": 1e-12,
            },
            doc="hardmax runs: tokens, dimension, the eigenvalues of A = Q^T K (diagonal), seeds, Euler "
            "(published renormalised update) t1 and dt, tie tolerance",
        ),
        "tolerances": Option(
            {
                "equiangular_ode": 1e-8,
                "normalization_rate": 0.01,
                "simuformer": 1e-12,
                "simuformer_order": 0.05,
                "causal_converge_to_first": 1e-4,
                "lim_response_vs_expm": 1e-6,
                "lim_profile_constant": 3.0,
                "sinkhorn_marginals": 1e-6,
                "sinkhorn_energy": 1e-10,
                "hardmax_leaders_fixed": 1e-9,
                "hardmax_equilibrium": 1e-6,
            },
            doc="pass tolerances by check (lim_profile_constant: C of the relative O(1/n) tolerance C / n)",
        ),
    },
    steps=(
        "equiangular",
        "normalization",
        "simuformer",
        "causal",
        "lost_in_the_middle",
        "sinkhorn",
        "hardmax",
        "euclidean",
        "figures",
    ),
    timings_suffix="_s",
    figures=(
        "lost_in_the_middle.png",
        "normalization_equiangular.png",
        "attention_variants.png",
    ),
)


# ------------------------------------------------------------------------------ closed forms
def equiangular_rhs(
    rho: ArrayLike, beta: float, n: int, *, normalization: str | Scheme = "post", alpha: float = 0.2
) -> Float[np.ndarray, "..."]:
    r"""$\rho' = 2 (1 - \rho)(1 + (n - 1)\rho) / (e^{\beta (1 - \rho)} + n - 1)$: the common inner
    product of $n$ SA tokens ($Q = K = V = I$, softmax, projected field) from an equiangular start
    (rotf's ``curve.ipynb``).

    With ``normalization="ngpt"`` each token moves along $\alpha P_x F / \|F\|$: the same
    right-hand side times $\alpha / \|F\|$, where $F_i = a x_i + b \sum_{j \ne i} x_j$ with
    $a = e^{\beta} / Z$, $b = e^{\beta\rho} / Z$, $Z = e^\beta + (n - 1) e^{\beta\rho}$, so
    $\|F\|^2 = a^2 + 2 a b (n - 1)\rho + b^2 (n - 1)(1 + (n - 2)\rho)$ (the same for every
    token: the start stays equiangular).

    >>> float(equiangular_rhs(1.0, 2.0, 6))
    0.0
    """
    rho = np.asarray(rho, dtype=np.float64)
    post = 2.0 * (1.0 - rho) * (1.0 + (n - 1) * rho) / (np.exp(beta * (1.0 - rho)) + n - 1)
    scheme = as_scheme(normalization, alpha=alpha)
    if scheme.post_ln:
        return np.asarray(post)
    if not isinstance(scheme, NGPT):
        raise ValueError(f"normalization must be 'post' or 'ngpt', got {normalization!r}")
    # a, b scaled by e^{-beta}: a = 1 / z, b = e^{-beta (1 - rho)} / z
    z = 1.0 + (n - 1) * np.exp(-beta * (1.0 - rho))
    a, b = 1.0 / z, np.exp(-beta * (1.0 - rho)) / z
    norm = np.sqrt(a**2 + 2 * a * b * (n - 1) * rho + b**2 * (n - 1) * (1 + (n - 2) * rho))
    return np.asarray(float(scheme.alpha) * post / norm)


def _equiangular_weights(rho: float, beta: float, n: int) -> tuple[float, float]:
    """Softmax weights of self and of another token at an equiangular configuration, scaled by
    ``e^{-beta}`` (stable for large beta): ``a = e^beta / Z``, ``b = e^{beta rho} / Z``."""
    e = math.exp(-beta * (1.0 - rho))
    z = 1.0 + (n - 1) * e
    return 1.0 / z, e / z


def equiangular_system(
    t: float,
    y: ArrayLike | Sequence[float],
    beta: float,
    n: int,
    *,
    normalization: str | Scheme,
    alpha: float = 0.2,
    switch_time: float = 1.0,
) -> Float[np.ndarray, " 2"]:
    r"""$(\rho', r')$ of $n$ SA tokens ($Q = K = V = I$) from an equiangular start with a common
    radius, for each scheme of ``mf.normalization`` (Karagodin, Ge, Polyanskiy, Rigollet 2025,
    equation (NA) and Table 2): ``y = (rho, r)``, $\rho$ the common inner product of the
    directions, $r$ the common radius.

    With $a = e^\beta / Z$, $b = e^{\beta\rho} / Z$, $Z = e^\beta + (n - 1) e^{\beta\rho}$ (the
    softmax weights of self and of another token), the attention output is
    $A_i = a\theta_i + b \sum_{j \ne i}\theta_j$, $\langle\theta_i, A_i\rangle = c = a + (n - 1) b\rho$,
    $\|A\|^2 = a^2 + 2ab(n - 1)\rho + b^2(n - 1)(1 + (n - 2)\rho)$ and, for $\dot\theta = P_\theta A$,
    $\rho' = G(\rho) = 2 (1 - \rho)(1 + (n - 1)\rho) / (e^{\beta(1 - \rho)} + n - 1)$
    (``equiangular_rhs``). Per scheme:

    | ``normalization`` | $\rho'$ | $r'$ |
    |---|---|---|
    | ``"post"`` | $G$ | $0$ |
    | ``"pre"`` | $G / r$ | $c$ |
    | ``"mix"`` | $G$ for $t \le \tau$ (``switch_time``), then $G / r$ | $0$, then $c$ |
    | ``"peri"`` | $G / (r \|A\|)$ | $c / \|A\|$ |
    | ``"ngpt"`` | $\alpha G / \|A\|$ | $0$ |
    | ``"scaling"`` | $G / \sqrt{t + 1}$ | $0$ |

    At $\rho = 0$, $r = r_0$ this is the $\gamma'(0)$ column of the paper's Theorem 4.1
    (orthogonal start), e.g. Peri-LN's $2 / (r_0 \sqrt{e^{2\beta} + n - 1})$ against Post-LN's
    $2 / (e^\beta + n - 1)$.

    >>> rho_dot, r_dot = equiangular_system(0.0, [0.0, 2.0], 1.0, 4, normalization="peri")
    >>> round(float(rho_dot), 6), round(float(r_dot), 6)
    (0.31025, 0.843347)
    """
    rho, r = (float(v) for v in np.asarray(y, dtype=np.float64))
    G = float(equiangular_rhs(rho, beta, n))
    a, b = _equiangular_weights(rho, beta, n)
    c = a + (n - 1) * b * rho
    norm = float(math.sqrt(a**2 + 2 * a * b * (n - 1) * rho + b**2 * (n - 1) * (1 + (n - 2) * rho)))
    # each scheme states its own reduction (mf.normalization.Scheme.equiangular)
    scheme = as_scheme(normalization, alpha=alpha, switch_time=switch_time)
    return np.array(scheme.equiangular(t, G, r, c, norm), dtype=np.float64)


def _equiangular_solution(
    ts: np.ndarray,
    y0: tuple[float, float],
    beta: float,
    n: int,
    scheme: Scheme,
) -> np.ndarray:
    """``solve_ivp`` (DOP853, rtol 1e-13) of ``equiangular_system`` at ``ts``; a scheme that
    switches (Mix-LN, ``Scheme.switch_at``) in two pieces, ``[0, tau]`` and ``[tau, T]`` (the
    right-hand side jumps at the switch)."""
    from scipy.integrate import solve_ivp

    def piece(t0: float, t1: float, y: Any, t_eval: np.ndarray) -> np.ndarray:
        return np.asarray(
            solve_ivp(
                lambda t, yy: equiangular_system(t, yy, beta, n, normalization=scheme),
                (t0, t1),
                y,
                t_eval=t_eval,
                method="DOP853",
                rtol=1e-13,
                atol=1e-15,
            ).y
        )

    tau = scheme.switch_at()
    if tau is None or ts[-1] <= tau:
        return piece(0.0, float(ts[-1]), list(y0), ts)
    tau = float(tau)
    first = piece(0.0, tau, list(y0), np.r_[ts[ts < tau], tau])
    second = piece(tau, float(ts[-1]), first[:, -1], ts[ts >= tau])
    return np.concatenate([first[:, :-1], second], axis=1)


def _omega(m: Float[np.ndarray, " k"], M: float) -> Float[np.ndarray, " k"]:
    return np.exp(-0.5 * (np.pi * m / M) ** 2)


def _rates(beta: float, n_max: int) -> tuple[Float[np.ndarray, " k"], Float[np.ndarray, " k"]]:
    from scipy.special import iv

    m = np.arange(1, n_max + 1, dtype=np.float64)
    return m, m**2 * iv(m, beta)


def lim_profile(
    s: ArrayLike, beta: float, t: float, lam: float, M: float, n_max: int
) -> Float[np.ndarray, "..."]:
    r"""The truncated soft-accuracy profile of lost in the middle,
    $S_t(s) = \sum_{m=1}^{n_{\max}} \omega_{m,M}\, g_{a_m}(t, 1; s)$ with $a_m = m^2 I_m(\beta)$,
    $\omega_{m,M} = e^{-\pi^2 m^2 / (2 M^2)}$,
    $g_a(t, 1; s) = \frac{\lambda e^{\lambda s}}{e^\lambda - 1} \sqrt{a t / Y} I_1(2 \sqrt{a t Y})$,
    $Y = \log\frac{e^\lambda - 1}{e^{\lambda s} - 1}$ ($\log(1/s)$ and coefficient 1 at $\lambda = 0$): how
    strongly the last token responds at time $t$ to a perturbation of the token at relative position
    $s \in (0, 1)$ (the script ``generate_u_shape_numerology_data.py``'s ``profile_value``).

    >>> round(float(lim_profile(0.02, 1.0, 1.0, 1.0, 8.0, 20)), 2)
    1.66
    """
    from scipy.special import iv

    s = np.asarray(s, dtype=np.float64)
    if lam == 0.0:
        Y, coeff = np.log(1.0 / s), np.ones_like(s)
    else:
        Y = np.log(np.expm1(lam) / np.expm1(lam * s))
        coeff = lam * np.exp(lam * s) / np.expm1(lam)
    m, a = _rates(beta, n_max)
    c = a[:, None] * t
    Yf = np.reshape(Y, (1, -1))
    z = 2.0 * np.sqrt(c * Yf)
    # psi_c(y) = sqrt(c / y) I_1(2 sqrt(c y)), continuous at y = 0 (value c)
    psi = np.where(Yf > 0, np.sqrt(c / np.where(Yf > 0, Yf, 1.0)) * iv(1, z), c)
    out = coeff.reshape(-1) * np.sum(_omega(m, M)[:, None] * psi, axis=0)
    return out.reshape(s.shape)


def lim_t_crit(beta: float, lam: float, M: float, n_max: int) -> float:
    r"""$t_{\rm crit} = 2 (1 - e^{-\lambda}) \sum_m \omega_m a_m / \sum_m \omega_m a_m^2$: the time
    at which the slope of ``lim_profile`` at $s = 1$ changes sign (recency wins before it).

    >>> round(lim_t_crit(1.0, 1.0, 8.0, 20), 4)
    2.4575
    """
    m, a = _rates(beta, n_max)
    w = _omega(m, M)
    return float(2.0 * (1.0 - math.exp(-lam)) * np.sum(w * a) / np.sum(w * a**2))


def sinkhorn_self_ot(logits: ArrayLike, iters: int = 1001) -> float:
    r"""Entropic optimal transport of the empirical measure with itself, cost $-L$ (``logits``),
    $\varepsilon = 1$: the dual objective $\bar f + \bar g - (\sum \pi - 1)$ at Sinkhorn's potentials
    (log domain, rows first, half-steps counted one by one; stops once a row step changes the row
    potentials by less than 1e-13 in total). For $L = \beta X W X^\top$ with $W$ symmetric its
    gradient is $\nabla_{x_i} = -(2\beta/n) \sum_j P_{ij} W x_j$, $P$ the converged Sinkhorn
    attention: Sinkhorn attention with $V = W$ is the flow of $-(n / 2\beta)\nabla$ of it.

    >>> round(sinkhorn_self_ot(np.zeros((3, 3))), 12)
    0.0
    """
    from scipy.special import logsumexp

    c = np.asarray(logits, dtype=np.float64)
    q, k = c.shape
    u, v = np.zeros(q), np.zeros(k)
    for i in range(iters):
        z = c + u[:, None] + v[None, :]
        if i % 2 == 0:
            du = np.log(1.0 / q) - logsumexp(z, axis=1)
            u = u + du
            if np.sum(np.abs(du)) < 1e-13:
                break
        else:
            v = v + np.log(1.0 / k) - logsumexp(z, axis=0)
    pi = np.exp(c + u[:, None] + v[None, :])
    return float(np.mean(u + math.log(q)) + np.mean(v + math.log(k)) - (np.sum(pi) - 1.0))


# ------------------------------------------------------------------------------ helpers
class _Replicated(masks.Mask):
    """``base`` over positions, each position held by ``replicas`` consecutive rows: row
    ``i R + r`` is position ``i``; ``pair_weights`` is ``base.pair_weights(n)`` spread evenly over
    the replicas of each admitted position (a position's density as ``replicas`` tokens)."""

    base: masks.Mask
    replicas: int = eqx.field(static=True)

    def admitted(self, n: int) -> Bool[np.ndarray, "n n"]:
        R = self.replicas
        return np.kron(self.base.admitted(n // R), np.ones((R, R), dtype=bool))

    def pair_weights(self, n: int, dtype: Any = None) -> Float[Array, "n n"]:
        R = self.replicas
        dtype = dtype or jnp.result_type(float)
        return jnp.kron(self.base.pair_weights(n // R, dtype), jnp.full((R, R), 1.0 / R, dtype))


def _clusters(x: np.ndarray, tol: float) -> int:
    """Greedy count of groups of rows within ``tol`` (Euclidean) of a group's first row."""
    left = list(range(len(x)))
    count = 0
    while left:
        first = x[left[0]]
        left = [i for i in left if np.linalg.norm(x[i] - first) > tol]
        count += 1
    return count


def _states(traj: Trajectory) -> Array:
    """The saved states of a run (``save_states=True``, the default)."""
    assert traj.xs is not None
    return traj.xs


def _expm(a: np.ndarray) -> np.ndarray:
    from scipy.linalg import expm

    return np.asarray(expm(a))


# ------------------------------------------------------------------------------ the checks
def _equiangular(S: Mapping[str, Any], tol: float) -> list[dict[str, Any]]:
    from scipy.integrate import solve_ivp

    n, d, beta, rho0 = int(S["n"]), int(S["d"]), float(S["beta"]), float(S["rho0"])
    t1, dt = float(S["t1"]), float(S["dt"])
    G = (1 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    x0 = np.zeros((n, d))
    x0[:, :n] = np.linalg.cholesky(G)
    ts = np.linspace(0.0, t1, 17)
    alpha = float(S["alpha"])
    out, finals = [], {}
    for scheme in (Post(), NGPT(alpha=alpha)):
        norm = scheme.name
        model = models.SelfAttention(beta, normalization=scheme)
        with jax.enable_x64(True):
            traj = simulate(model, jnp.asarray(x0), t1=t1, dt=dt, solver="rk4", ts=ts)
            xs = np.asarray(traj.xs)
        gram = np.einsum("tid,tjd->tij", xs, xs)
        off = gram[:, ~np.eye(n, dtype=bool)]
        ode = solve_ivp(
            lambda _t, y, scheme=scheme: equiangular_rhs(y, beta, n, normalization=scheme),
            (0.0, t1),
            [rho0],
            t_eval=ts,
            rtol=1e-13,
            atol=1e-15,
        ).y[0]
        finals[norm] = ode[-1]
        err = float(np.max(np.abs(off.mean(axis=1) - ode)))
        spread = float(np.max(off.max(axis=1) - off.min(axis=1)))
        common = (
            f"max over {ts.size} save times in [0, {t1:g}] of |mean off-diagonal Gram entry of the "
            f"particles - rho(t)|, particles: SA Q = K = V = I, mf.simulate RK4 dt = {dt:g}, n = {n}, "
            f"d = {d}, beta = {beta:g}, from Gram (1 - rho0) I + rho0 11^T, rho0 = {rho0:g}; rho(t): "
            f"solve_ivp (rtol 1e-13) of "
        )
        if scheme.post_ln:
            note = (
                common + "rotf's rho' = 2(1-rho)(1+(n-1)rho)/(e^(beta(1-rho)) + n - 1); "
                f"rho(t1) = {ode[-1]:.10f}"
            )
        else:
            note = (
                common + f"the same rho' times alpha/|F| (normalization='ngpt', alpha = {alpha:g}; "
                "|F|^2 = a^2 + 2ab(n-1)rho + b^2(n-1)(1+(n-2)rho), a, b the softmax weights of self "
                f"and of another token); rho(t1) = {ode[-1]:.10f} (Post-LN: {finals['post']:.10f})"
            )
        out.append(
            check(
                "equiangular_ode" if scheme.post_ln else f"{norm}_equiangular_ode",
                err,
                0.0,
                tol,
                note + f"; spread of the off-diagonal entries (max - min) {spread:.2e} (the start "
                "stays equiangular)",
            )
        )
    return out


#: The schemes of the paper's Table 2 (``mf.normalization``'s own, in its order).
_SCHEMES = NORMALIZATIONS


def _scheme(name: str, N: Mapping[str, Any]) -> Scheme:
    """The scheme ``name`` with its own parameters from the settings ``N`` (nGPT's ``alpha``,
    Mix-LN's ``switch_time``)."""
    member = Scheme.lookup(name)
    return member(**{p.name: float(N[p.name]) for p in declared_params(member)})


def _params_note(scheme: Scheme) -> str:
    """``", alpha = 0.5"``: the scheme's own parameters, a switch marked as a step point."""
    return "".join(
        f", {p.name} = {float(getattr(scheme, p.name)):g}"
        + (" (a step point)" if scheme.switch_at() is not None else "")
        for p in declared_params(type(scheme))
    )


def _run(
    model: models.SelfAttention, theta: np.ndarray, r0: np.ndarray | None, t1: float, steps: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One RK4 run with ``steps`` steps of ``t1 / steps`` and 17 saves (every compiled program of
    these checks has these shapes, the Post-LN and nGPT ones those of ``equiangular_ode``)."""
    ts = np.linspace(0.0, t1, 17)
    traj = simulate(
        model,
        jnp.asarray(theta),
        t1=t1,
        dt=t1 / steps,
        solver="rk4",
        ts=ts,
        r0=None if r0 is None else jnp.asarray(r0),
    )
    radius = None if traj.radius is None else np.asarray(traj.radius)
    return ts, np.asarray(_states(traj)), radius


def _gap(xs: np.ndarray) -> np.ndarray:
    """``1 - rho_min = max_{i,j} |theta_i - theta_j|^2 / 2`` per save (no cancellation near 1)."""
    diff = xs[:, :, None, :] - xs[:, None, :, :]
    return np.asarray(0.5 * np.max(np.sum(diff**2, axis=-1), axis=(-1, -2)))


def _normalization(
    E: Mapping[str, Any],
    N: Mapping[str, Any],
    tol: Mapping[str, float],
    curves: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The normalisation schemes' checks; ``curves`` (when given) receives, per scheme, the
    equiangular runs it compares: ``{scheme: [(ts, rho_particles, rho_ode, r_particles, r_ode), ...]}``
    (one tuple per start, radii None for the schemes on the sphere), for the figure."""
    n, d, t1, dt = int(E["n"]), int(E["d"]), float(E["t1"]), float(E["dt"])
    beta, alpha = float(N["beta"]), float(N["alpha"])
    steps = int(round(t1 / dt))
    orth = np.zeros((n, d))
    orth[:, :n] = np.eye(n)
    rho0 = float(E["rho0"])
    gen = np.zeros((n, d))
    gen[:, :n] = np.linalg.cholesky((1 - rho0) * np.eye(n) + rho0 * np.ones((n, n)))
    starts = [(orth, 0.0, float(N["r0"])), (gen, rho0, float(N["r0_equiangular"]))]
    rng = np.random.default_rng(int(N["seed"]))
    g = rng.standard_normal((int(N["seeds"]), n, d))
    thetas, radii = g / np.linalg.norm(g, axis=-1, keepdims=True), np.linalg.norm(g, axis=-1)
    rel = float(tol["normalization_rate"])
    rows: list[dict[str, Any]] = []
    v0: dict[str, tuple[float, float, float]] = {}
    early: dict[str, float] = {}
    with jax.enable_x64(True):
        for name in _SCHEMES:
            obj = _scheme(name, N)
            model = models.SelfAttention(beta, normalization=obj)
            radial, scheme = obj.radial, name
            # --- equiangular starts: particles at h and 2h against the scalar ODE
            errs, all_errs, rich, spread, finals = [], [], [], [], []
            for x0, r_start, R0 in starts:
                r0 = np.full(n, R0) if radial else None
                ts, xs, rad = _run(model, x0, r0, t1, steps)
                _, xs2, rad2 = _run(model, x0, r0, 2 * t1, steps)
                ode = _equiangular_solution(ts, (r_start, R0), beta, n, obj)
                off = np.einsum("tid,tjd->tij", xs, xs)[:, ~np.eye(n, dtype=bool)]
                off2 = np.einsum("tid,tjd->tij", xs2, xs2)[:, ~np.eye(n, dtype=bool)]
                rho = off.mean(axis=1)
                err = np.abs(rho - ode[0])
                rich_k = np.abs(off2.mean(axis=1)[:9] - rho[::2])
                if rad is not None and rad2 is not None:
                    r = rad.mean(axis=1)
                    err = np.maximum(err, np.abs(r - ode[1]) / ode[1])
                    rich_k = np.maximum(rich_k, np.abs(rad2.mean(axis=1)[:9] - r[::2]) / r[::2])
                    spread.append(float(np.max(np.ptp(rad, axis=1))))
                spread.append(float(np.max(np.ptp(off, axis=1))))
                if curves is not None:
                    curves.setdefault(scheme, []).append(
                        (ts, rho, ode[0], None if rad is None else rad.mean(axis=1), ode[1])
                    )
                errs.append(float(err[::2].max()))  # the times of the 2h run's saves
                all_errs.append(float(err.max()))
                rich.append(float(rich_k.max()))
                finals.append((float(ode[0, -1]), float(ode[1, -1])))
                if R0 == float(N["r0"]) and r_start == 0.0:
                    early[scheme] = float(rho[1])
            estimate = max(rich) / 15.0
            tolerance = 2.0 * estimate + 1e-12
            rows.append(
                check(
                    f"normalization_equiangular_{scheme}",
                    max(errs),
                    0.0,
                    tolerance,
                    f"normalization={scheme!r}: max over t = 0, {2 * t1 / 16:g}, .., {t1:g} and two equiangular "
                    f"starts of |rho_particles - rho(t)|"
                    + (" and |r_particles - r(t)| / r(t)" if radial else "")
                    + "; rho_particles the mean off-diagonal Gram entry of Trajectory.xs"
                    + (", r_particles the mean of Trajectory.radius" if radial else "")
                    + f", mf.simulate RK4 h = {dt:g}, SA Q = K = V = I, n = {n}, d = {d}, beta = {beta:g}"
                    + _params_note(obj)
                    + f"; starts: orthogonal (rho0 = 0, r0 = {N['r0']:g}) and Gram (1 - {rho0:g}) I + "
                    f"{rho0:g} 11^T (r0 = {N['r0_equiangular']:g}); (rho, r)(t): solve_ivp (DOP853, rtol 1e-13) "
                    "of equiangular_system"
                    + (" in two pieces at the switch" if obj.switch_at() is not None else "")
                    + f"; at t = {t1:g}: (rho, r) = "
                    + ", ".join(f"({a:.8f}, {b:.6f})" for a, b in finals)
                    + f". Tolerance 2 e_R + 1e-12: e_R = max|y_h - y_2h| / 15 = {estimate:.2e}, the Richardson "
                    f"estimate of RK4's global error at h from a second run at 2h (same start, to 2 t1, saves at the "
                    "same times; RK4 is 4th order: y_2h - y_h = 15 (y_h - y) + O(h^5)), x2 for "
                    "the O(h^5) remainder, 1e-12 the rounding floor of the steps and the reference; over all "
                    f"{ts.size} saves (every {t1 / 16:g}) the error is {max(all_errs):.2e}; spread of the "
                    f"off-diagonal entries (and radii) {max(spread):.1e} (the start stays equiangular)",
                )
            )
            # --- Theorem 4.1: the velocity at the orthogonal start, from the model's field
            R0 = float(N["r0"])
            th = jnp.asarray(orth)
            G = model.field(th)
            if radial:
                v = obj.radial_velocity(R0 * th, G, switched=False)
                vt = np.asarray(sphere.project(th, v)) / R0
            else:
                vt = np.asarray(obj.speed(0.0, jnp.float64)) * np.asarray(sphere.project(th, G))
            o = np.asarray(orth)
            pair = vt @ o.T + o @ vt.T
            particles = float(pair[~np.eye(n, dtype=bool)].mean())
            system = float(equiangular_system(0.0, [0.0, R0], beta, n, normalization=obj)[0])
            v0[scheme] = (particles, system, obj.initial_velocity(beta, n, R0))
            # --- rate on random starts
            rows.append(_rate_row(obj, model, thetas, radii, N, beta, n, d, rel))
    worst = max(abs(p - c) / c for p, _, c in v0.values())
    worst_sys = max(abs(s - c) / c for _, s, c in v0.values())
    R0 = float(N["r0"])
    rows.append(
        check(
            "normalization_initial_velocity",
            max(worst, worst_sys),
            0.0,
            1e-12,
            "max over the six schemes of |rho'(0) - gamma'(0)| / gamma'(0), gamma'(0) the column of Theorem 4.1 "
            f"(orthogonal start, n = {n}, beta = {beta:g}, r0 = {R0:g}, alpha = {alpha:g}): rho'(0) = "
            "<theta_i', theta_j> + <theta_i, theta_j'> averaged over pairs, theta' from the model's field at the "
            "start (mf.normalization.radial_velocity / speed, projected, / r0 for the radial schemes) and from "
            "equiangular_system (relative errors: particles "
            f"{worst:.1e}, system {worst_sys:.1e}; tolerance 1e-12: a closed form, rounding only); "
            + ", ".join(f"{k}: {c:.10f}" for k, (_, _, c) in v0.items()),
        )
    )
    ratio = v0["peri"][0] / v0["post"][0]
    theory = (math.exp(beta) + n - 1) / (R0 * math.sqrt(math.exp(2 * beta) + n - 1))
    rows.append(
        check(
            "peri_early_speedup",
            ratio,
            theory,
            1e-12,
            "rho'(0) of Peri-LN over Post-LN at the orthogonal start (particles): theory "
            f"(e^beta + n - 1) / (r0 sqrt(e^(2 beta) + n - 1)) (Theorem 4.1), n = {n}, beta = {beta:g}, r0 = {R0:g} "
            f"(Peri-LN is faster for r0 < {theory * R0:.3f}; for n >> e^(2 beta) the gain is ~ sqrt(n) / r0); "
            f"relative tolerance 1e-12 (a closed form); nGPT over Post-LN {v0['ngpt'][0] / v0['post'][0]:.6f}. "
            f"rho at t = {t1 / 16:g} of the particles: "
            + ", ".join(f"{k}: {v:.6f}" for k, v in early.items()),
            relative=True,
        )
    )
    return rows


def _rate_row(
    scheme: Scheme,
    model: models.SelfAttention,
    thetas: np.ndarray,
    radii: np.ndarray,
    N: Mapping[str, Any],
    beta: float,
    n: int,
    d: int,
    rel: float,
) -> dict[str, Any]:
    """Fit the tail of ``1 - rho_min`` from random starts against the rate of Theorem 4.1's last
    column (``Scheme.collapse_law``: the linearisation about one cluster, the same on any start that
    collapses)."""
    steps = 400
    slopes: list[float] = []
    finals: list[float] = []
    extra: list[Any] = []
    law = scheme.collapse_law()
    theory = law.slope
    tol = rel * abs(theory)
    after = scheme.after_switch()
    # the horizon of an exponential law: the scheme's own setting (t_scaling), else t_exp
    T = float(N.get(f"t_{scheme.name}", N["t_exp"]))
    for theta, r in zip(thetas, radii):
        if not law.polynomial:
            ts, xs, _ = _run(model, theta, None, T, steps)
            gap = _gap(xs)
            win = (gap <= 1e-3) & (gap >= 1e-20)
            x = law.clock(ts)
            slope = float(np.polyfit(x[win], np.log(gap[win]), 1)[0])
            if law.asymptotic is not None:
                extra.append(float(np.polyfit(law.asymptotic(ts[win]), np.log(gap[win]), 1)[0]))
            finals.append(float(gap[-1]))
            slopes.append(slope)
            continue
        # the schemes with a radius: legs [0, L1], then restarts from the last state (a scheme
        # that switches continues as the scheme after its switch); the fit is over the last
        # leg, one decade of t
        legs = [float(v) for v in N["t_poly"]]
        t0, x0, r0 = 0.0, theta, r
        T_all, gap_all, r_all = [], [], []
        for k, L in enumerate(legs):
            leg_model = (
                model
                if (k == 0 or after is None)
                else models.SelfAttention(beta, normalization=after)
            )
            ts, xs, rad = _run(leg_model, x0, r0, L, steps)
            assert rad is not None
            T_all.append(t0 + ts)
            gap_all.append(_gap(xs))
            r_all.append(rad.mean(axis=1))
            x0 = xs[-1] / np.linalg.norm(xs[-1], axis=-1, keepdims=True)
            r0, t0 = rad[-1], t0 + L
        t_last, g_last, r_last = T_all[-1], gap_all[-1], r_all[-1]
        slope = float(np.polyfit(law.clock(t_last), np.log(g_last), 1)[0])
        slope_r = float(np.polyfit(np.log(r_last), np.log(g_last), 1)[0])
        c = float(abs(r_last[0] - t_last[0]))
        # 1 - rho = C r^-2 with r = t + c: local slope -2 t / (t + c), within 2c / (t_a - c) of -2
        tol = max(tol, 2.0 * c / (t_last[0] - c) + rel * abs(theory))
        slopes.append(slope)
        finals.append(float(g_last[-1]))
        extra.append((slope_r, float(r_last[-1] / t_last[-1]), c))
    worst = max(slopes, key=lambda v: abs(v - theory))
    start = (
        f"{len(slopes)} random starts (n = {n} uniform on S^{d - 1}"
        + (", r0 = |g| of the Gaussian g, Theorem 3.1's start" if scheme.radial else "")
        + f"), SA Q = K = V = I, beta = {beta:g} (n <= e^beta: the collapse is unconditional for every scheme, "
        "Theorem 3.1 and its corollary), mf.simulate RK4; "
    )
    if not law.polynomial:
        what = (
            f"slope of log(1 - rho_min) against {law.clock_name} over the saves with 1e-20 <= 1 - rho_min "
            f"<= 1e-3, RK4 h = {T / steps:g} to T = {T:g}; theory {law.statement}"
        )
        if law.asymptotic is not None:
            what += f"; against {law.asymptotic_name}: " + ", ".join(f"{v:.4f}" for v in extra)
    else:
        legs = [float(v) for v in N["t_poly"]]
        what = (
            f"slope of log(1 - rho_min) against {law.clock_name} over the last of the legs "
            + " + ".join(f"{v:g}" for v in legs)
            + f" ({steps} RK4 steps each, restarted from the last state"
            + (
                f", {scheme.label} continued as {after.label} after its switch"
                if after is not None
                else ""
            )
            + f"); theory {law.statement}; against log r: "
            + ", ".join(f"{v[0]:.4f}" for v in extra)
            + "; r(T)/T: "
            + ", ".join(f"{v[1]:.5f}" for v in extra)
            + "; offset c = |r - t| at the window's start: "
            + ", ".join(f"{v[2]:.2f}" for v in extra)
        )
    note = (
        f"normalization={scheme.name!r}: {start}{what}; per start: "
        + ", ".join(f"{v:.4f}" for v in slopes)
        + "; 1 - rho_min at T (one cluster, every start collapses): "
        + ", ".join(f"{v:.1e}" for v in finals)
        + f". Tolerance: relative {rel:g} (x |theory|) for the next-order terms of the linearisation about the "
        "cluster (the softmax weights' deviation from 1/n and the sphere's curvature: O(beta (1 - rho)) <= "
        f"{beta * 1e-3:g} in the window, x5)"
        + (
            "; plus 2c / (t_a - c), the slope of (t + c)^-2 at the window's start t_a (r = t + c)"
            if scheme.radial
            else ""
        )
    )
    return check(f"normalization_rate_{scheme.name}", worst, theory, tol, note)


def _simuformer_checks(S: Mapping[str, Any], tol: Mapping[str, float]) -> list[dict[str, Any]]:
    from . import _simuformer as sf

    n, d, H, beta = int(S["n"]), int(S["d"]), int(S["heads"]), float(S["beta"])
    eta, nsteps = float(S["eta"]), int(S["steps"])
    hs = np.asarray(S["h"], dtype=np.float64)
    rng = np.random.default_rng(int(S["seed"]))
    BF = rng.normal(size=(H, d, d)) / np.sqrt(d)  # simuformer's BF_h = Q_h^T K_h
    V_sim = rng.normal(size=(H, d, d)) / np.sqrt(d)  # simuformer's V_h, acting on the right of rows
    r_start = 1.0 + rng.uniform(size=n)
    Q = np.broadcast_to(np.eye(d), (H, d, d))
    V = np.swapaxes(V_sim, 1, 2)  # meanfield's V acts on columns
    setting = (
        f"n = {n} uniform tokens on S^{d - 1}, {H} heads with BF_h, V_h ~ N(0, 1/d) entries (meanfield: Q_h = I, "
        f"K_h = BF_h, V_h = simuformer's V_h^T), beta = {beta:g}, float64; simuformer's step: "
        "meanfield/reproduce/_simuformer.py, the NumPy transcription of SimuXForm.step (nikitus20/simuformer "
        "simuxform.py, 1959a8a)"
    )
    T = nsteps * eta
    ts = np.linspace(0.0, T, nsteps + 1)
    rows = []
    with jax.enable_x64(True):
        x0 = sphere.uniform(jax.random.key(int(S["seed"])), n, d, dtype=jnp.float64)

        def model(scheme: Scheme) -> models.SelfAttention:
            return models.SelfAttention(
                beta, jnp.asarray(Q), jnp.asarray(BF), jnp.asarray(V), normalization=scheme
            )

        # simuformer's --norm, meanfield's scheme, what differs in words, whether simuformer adds
        # its 1e-9 to |A| (the schemes with a unit attention output)
        on_sphere: tuple[tuple[str, Scheme, str, bool], ...] = (
            ("postln", Post(), "", False),
            (
                "ngpt",
                NGPT(alpha=0.2),
                " (alpha = 0.2 as simuformer, its 1e-9 added to |A| set to 0)",
                True,
            ),
        )
        for norm, scheme, differs, unit_output in on_sphere:
            traj = simulate(
                model(scheme), x0, t1=T, dt=eta, solver="euler", step="renormalize", ts=ts
            )
            xs = np.asarray(_states(traj))
            ref, pub = [np.asarray(x0)], np.asarray(x0)
            for _ in range(nsteps):
                ref.append(
                    sf.simuformer_step(ref[-1], BF, V_sim, beta, eta, norm=norm, norm_eps=0.0)[0]
                )
                pub = sf.simuformer_step(pub, BF, V_sim, beta, eta, norm=norm)[0]
            err = float(np.max(np.abs(xs - np.stack(ref))))
            extra_note = (
                f"; with simuformer's 1e-9 in A / (|A| + 1e-9) kept, the final states differ by "
                f"{float(np.max(np.abs(xs[-1] - pub))):.1e}"
                if unit_output
                else ""
            )
            rows.append(
                check(
                    f"simuformer_{norm}",
                    err,
                    0.0,
                    tol["simuformer"],
                    f"max over {nsteps + 1} saves (step eta = {eta:g}) and coordinates of |mf.simulate(normalization="
                    f"{scheme.name!r}, solver='euler', step='renormalize') - simuformer --norm {norm}|"
                    + differs
                    + f"; {setting}{extra_note}",
                )
            )
        theta = np.asarray(x0)
        # simuformer's --norm, meanfield's scheme, the paper's radial law, what it is of
        with_radius: tuple[tuple[str, Scheme, str, str], ...] = (
            ("preln", Pre(), "<theta, A>", ""),
            ("periln", Peri(), "<theta, A> / |A|", " (of a = A / |A|)"),
        )
        for norm, scheme, law, of_a in with_radius:
            G = np.asarray(
                model(scheme).field(x0)
            )  # meanfield's x' = field (Pre-LN A, Peri-LN A / |A|)
            diffs, own = [], []
            for h in hs:
                th1, r1 = sf.simuformer_step(
                    theta,
                    BF,
                    V_sim,
                    beta,
                    float(h),
                    norm=norm,
                    r=r_start,
                    norm_eps=0.0,
                    radius_eps=0.0,
                    radial="paper",
                )
                mf_x = r_start[:, None] * theta + h * G  # meanfield's Euler step in x = r theta
                diffs.append(float(np.max(np.abs(r1[:, None] * th1 - mf_x))))
                _, r_own = sf.simuformer_step(
                    theta,
                    BF,
                    V_sim,
                    beta,
                    float(h),
                    norm=norm,
                    r=r_start,
                    norm_eps=0.0,
                    radius_eps=0.0,
                )
                own.append(float(np.max(np.abs(r_own - r1))))
            order = float(np.polyfit(np.log(hs), np.log(diffs), 1)[0])
            rows.append(
                check(
                    f"simuformer_{norm}_paper",
                    order,
                    2.0,
                    tol["simuformer_order"],
                    f"order in h of the one-step difference |r1 theta1 (simuformer --norm {norm}, radial law replaced "
                    f"by the paper's r' = {law}, 1e-9s set to 0) - (r0 theta0 + h field) (meanfield's Euler step in "
                    f"x = r theta, normalization={scheme.name!r})| from the same tokens and radii r0 in [1, 2], fitted over "
                    "h = "
                    + ", ".join(f"{v:g}" for v in hs)
                    + ": differences "
                    + ", ".join(f"{v:.2e}" for v in diffs)
                    + ". Two first-order steps of the same ODE agree to O(h^2) per step (theory 2; tolerance "
                    f"{tol['simuformer_order']:g}: the O(h^3) term changes the fitted slope by O(h |A| / r) <= 0.02). What "
                    "differs from the paper (Table 2) and is not followed: simuformer's radial law "
                    "r <- r + eta r sum_k A_k"
                    + of_a
                    + " (r times the sum of the components: not rotation invariant, exponential growth) instead "
                    f"of r' = {law}: its radius differs from the paper's by "
                    + ", ".join(f"{v:.1e}" for v in own)
                    + " after one step (O(h), another ODE); its step is semi-implicit (theta moves with the new radius, "
                    "then is renormalised) and starts from r = 1; 1e-9 added to r and |A|; heads averaged, V on the "
                    f"right; {setting}",
                )
            )
    return rows


def _causal(
    S: Mapping[str, Any], tol: float, panels: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    n, d, beta, t1, dt = int(S["n"]), int(S["d"]), float(S["beta"]), float(S["t1"]), float(S["dt"])
    ts = np.linspace(0.0, t1, 7)
    with jax.enable_x64(True):
        x0 = sphere.uniform(jax.random.key(int(S["seed"])), n, d, dtype=jnp.float64)
        run_ = {
            mask: np.asarray(
                simulate(
                    models.SelfAttention(beta, mask=masks.Causal() if mask else None),
                    x0,
                    t1=t1,
                    dt=dt,
                    solver="rk4",
                    ts=ts,
                ).xs
            )
            for mask in (True, False)
        }
    xc, xu = run_[True], run_[False]
    moved = float(np.max(np.abs(xc[:, 0] - xc[0, 0])))
    dist = np.linalg.norm(xc - xc[:, :1], axis=-1).max(axis=1)
    far = float(dist[-1])
    if panels is not None:  # for _variants_figure
        panels["causal"] = (ts, dist)
    u_dist = float(np.linalg.norm(xu[-1] - xc[0, 0], axis=-1).max())
    u_spread = float(np.linalg.norm(xu[-1] - xu[-1, :1], axis=-1).max())
    setting = (
        f"SA Q = K = V = I, beta = {beta:g}, mask Causal() (j <= i), n = {n} tokens uniform on S^{d - 1} "
        f"(seed {S['seed']}), RK4 dt = {dt:g} to t = {t1:g}"
    )
    return [
        check(
            "causal_first_token_fixed",
            moved,
            0.0,
            0.0,
            f"max over the saves and coordinates of |x_0(t) - x_0(0)| (exactly 0: the first token attends only "
            f"to itself, its field is x_0 and its tangent part vanishes); {setting}",
        ),
        check(
            "causal_converge_to_first",
            far,
            0.0,
            tol,
            f"max_i |x_i(T) - x_0| at T = {t1:g}; max_i |x_i(t) - x_0| at t = "
            + ", ".join(f"{t:g}: {v:.2e}" for t, v in zip(ts, dist))
            + f"; {setting}. Final configuration: {_clusters(xc[-1], 1e-3)} cluster(s) (within 1e-3) at x_0; "
            f"the unmasked run from the same start: {_clusters(xu[-1], 1e-3)} cluster(s) (spread {u_spread:.1e}), "
            f"its consensus {u_dist:.3f} away from x_0 (causality picks the first token as the limit)",
        ),
    ]


def _lim(S: Mapping[str, Any]) -> dict[str, Any]:
    """The lost-in-the-middle linear responses: ``jax.vjp`` of the final states of ``mf.simulate``
    (USA with the replicated ALiBi mask, about the uniform state of ``replicas`` tokens per position)
    with respect to the initial angles, one cotangent per time; returns the measured profiles and
    the per-mode responses against the matrix exponential."""
    n, R = int(S["n"]), int(S["replicas"])
    beta, lam, M, n_max = float(S["beta"]), float(S["lam"]), float(S["M"]), int(S["n_max"])
    times = np.asarray(S["times"], dtype=np.float64)
    phi = 2 * np.pi * np.arange(R) / R
    th = np.tile(phi, n)
    base = masks.ALiBi(lam, include_self=False, normalized=True)
    m, a = _rates(beta, n_max)
    with jax.enable_x64(True):
        x0 = jnp.asarray(np.c_[np.cos(th), np.sin(th)])
        tau = jnp.asarray(np.c_[-np.sin(th), np.cos(th)])
        kernel = kernels.USA(beta, mask=_Replicated(base, R))
        # the LIM force is beta times the projected masked USA field: LIM time t is meanfield time beta t
        ts = jnp.asarray(np.r_[0.0, beta * times])

        def finals(x: Array) -> Array:
            return _states(
                simulate(
                    kernel, x, t1=float(beta * times[-1]), dt=float(S["dt"]), solver="rk4", ts=ts
                )
            )[1:]

        _, vjp = jax.vjp(finals, x0)
        # cotangent: the sum over modes of the last position's mode-m angle coefficients
        # (2/R) sum_r cos(m phi_r) dtheta_r; the gradient's mode-m part at position k is then
        # [exp(a_m t W)]_{n-1,k} cos(m phi_r) (2/R), the modes separated by projection below
        last = np.zeros(n * R)
        last[(n - 1) * R :] = (2.0 / R) * np.cos(np.outer(m, phi)).sum(axis=0)
        cot = jnp.asarray(last)[:, None] * tau

        def grad_at(j: Array) -> Array:
            ct = jnp.zeros((times.size, n * R, 2), jnp.float64).at[j].set(cot)
            return jnp.sum(vjp(ct)[0] * tau, axis=-1)

        g = np.asarray(jax.vmap(grad_at)(jnp.arange(times.size)))  # (times, n R): d/dtheta
        W = np.asarray(base.pair_weights(n, jnp.float64))
    # mode-m response of the last position to position k: sum_r g cos(m phi_r)
    resp = np.einsum("tkr,mr->tmk", g.reshape(times.size, n, R), np.cos(np.outer(m, phi)))
    expm_rows = np.array([[_expm(am * t * W)[-1] for am in a] for t in times])
    w = _omega(m, M)
    prof = n * np.einsum("m,tmk->tk", w, resp)[:, :-1]
    expm_prof = n * np.einsum("m,tmk->tk", w, expm_rows)[:, :-1]
    s = (np.arange(n - 1) + 0.5) / n
    closed = np.array([lim_profile(s, beta, float(t), lam, M, n_max) for t in times])
    return {
        "s": s,
        "times": times,
        "measured": prof,
        "expm": expm_prof,
        "closed": closed,
        "resp_err": float(np.max(np.abs(resp - expm_rows))),
        "t_crit": lim_t_crit(beta, lam, M, n_max),
    }


def _lim_checks(
    S: Mapping[str, Any], L: Mapping[str, Any], tol: Mapping[str, float]
) -> list[dict[str, Any]]:
    n, R = int(S["n"]), int(S["replicas"])
    times, prof, closed, s = L["times"], L["measured"], L["closed"], L["s"]
    setting = (
        f"n = {n} positions x {R} tokens uniform on the circle (the uniform state), USA beta = {S['beta']:g} "
        f"with mask _Replicated(ALiBi({S['lam']:g}, include_self=False, normalized=True)) (ALiBi weights over "
        f"positions, spread evenly over each position's tokens), RK4 dt = {S['dt']:g}, meanfield time beta t"
    )
    what = (
        "measured: n sum_m omega_m d(mode-m angle coefficient of the last position at t)/d(mode-m angle "
        "coefficient of position k at 0), by jax.vjp of mf.simulate's states, m = 1.."
        f"{S['n_max']}, M = {S['M']:g}, at s_k = (k + 1/2)/n"
    )
    rows = []
    rows.append(
        check(
            "lim_response_vs_expm",
            L["resp_err"],
            0.0,
            tol["lim_response_vs_expm"],
            "max over t in "
            + ", ".join(f"{t:g}" for t in times)
            + ", modes and positions of |vjp response - "
            "[exp(a_m t W)]_{n-1,k}|, a_m = m^2 I_m(beta), W = ALiBi(lam, include_self=False, normalized=True)"
            f".pair_weights(n) (the linearised dynamics is exactly u' = a_m W u per mode); {setting}",
        )
    )
    far = s >= 0.1  # away from the boundary layer at s = 0 (first positions: error not O(1/n))
    rel = [
        float(np.max(np.abs(prof[j] - closed[j])[far]) / np.max(np.abs(closed[j][far])))
        for j in range(len(times))
    ]
    first = [float(abs(prof[j][0] - closed[j][0])) for j in range(len(times))]
    C = tol["lim_profile_constant"]
    rows.append(
        check(
            "lim_profile_closed_form",
            max(rel),
            0.0,
            C / n,
            "max over t in "
            + ", ".join(f"{t:g}" for t in times)
            + " of max_{s_k >= 0.1} |measured profile - "
            "S_t(s_k)| / max_{s_k >= 0.1} |S_t| (closed form lim_profile); tolerance "
            f"{C:g} / n, the O(1/n) of the positions' discretisation s_k = (k + 1/2)/n; per t: "
            + ", ".join(f"{t:g}: {r:.4f}" for t, r in zip(times, rel))
            + "; at s_0 = 1/(2n), inside the boundary layer at s = 0 where Y(s) ~ log(1/s), the error does not "
            "decay with n (not checked): "
            + ", ".join(f"{t:g}: {e:.3g}" for t, e in zip(times, first))
            + f"; {what}; {setting}",
        )
    )
    j0 = 0
    p = prof[j0]
    k = int(np.argmin(p))
    u_shape = 0 < k < p.size - 1
    rows.append(
        check(
            "lim_u_shape",
            s[k],
            None,
            note=f"relative position of the minimum of the measured profile at t = {times[j0]:g} (pass: an interior "
            f"minimum, both ends higher: U shape): S(s_0) = {p[0]:.4f}, min {p[k]:.4f} at s = {s[k]:.3f}, "
            f"S(s_last) = {p[-1]:.4f}; closed form: min at s = {s[int(np.argmin(closed[j0]))]:.3f}",
            passed=u_shape,
        )
    )
    jl = len(times) - 1
    dp = np.diff(prof[jl])
    rows.append(
        check(
            "lim_monotone_late",
            float(np.max(dp)),
            None,
            note=f"max_k (S(s_k+1) - S(s_k)) of the measured profile at t = {times[jl]:g} > t_crit = "
            f"{L['t_crit']:.4f} (lim_t_crit; pass: < 0, decreasing: the first tokens dominate); S from "
            f"{prof[jl][0]:.3f} to {prof[jl][-1]:.3f}; closed form's max step {np.max(np.diff(closed[jl])):.3g}",
            passed=lambda v: v < 0 and times[jl] > L["t_crit"],
        )
    )
    return rows


def _sinkhorn(
    S: Mapping[str, Any], tol: Mapping[str, float], panels: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    n, d, beta, iters = int(S["n"]), int(S["d"]), float(S["beta"]), int(S["iters"])
    t1, dt = float(S["t1"]), float(S["dt"])
    ts = np.linspace(0.0, t1, int(S["saves"]))
    rng = np.random.default_rng(0)
    G = rng.standard_normal((d, d))
    Wsym = np.eye(d) + (G + G.T) / (2 * np.sqrt(d))  # symmetric, not I
    I = np.eye(d)
    cases = {"v_qk": (Wsym, Wsym), "identity": (I, I), "v_identity": (Wsym, I)}
    with jax.enable_x64(True):
        x0 = sphere.uniform(jax.random.key(1), n, d, dtype=jnp.float64)
        Ks = jnp.asarray(np.stack([c[0] for c in cases.values()]))
        Vs = jnp.asarray(np.stack([c[1] for c in cases.values()]))

        def model(K: Array, V: Array) -> models.SelfAttention:
            return models.SelfAttention(
                beta, jnp.eye(d), K, V, attention="sinkhorn", sinkhorn_iters=iters
            )

        A = np.asarray(models.attention_matrix(model(Ks[0], Vs[0]), x0))

        def one(K: Array, V: Array) -> Array:
            return _states(simulate(model(K, V), x0, t1=t1, dt=dt, solver="rk4", ts=ts))

        xs = np.asarray(jax.vmap(one)(Ks, Vs))
    rows_err = float(np.max(np.abs(A.sum(axis=1) - 1)))
    cols_err = float(np.max(np.abs(A.sum(axis=0) - 1)))
    rows = [
        check(
            "sinkhorn_marginals",
            max(rows_err, cols_err),
            0.0,
            tol["sinkhorn_marginals"],
            f"max |row sum - 1| = {rows_err:.1e}, max |column sum - 1| = {cols_err:.1e} of the Sinkhorn attention "
            f"(sinkhorn_iters = {iters}, float64) of n = {n} uniform tokens on S^{d - 1}, beta = {beta:g}, "
            "Q = I, K = W symmetric",
        )
    ]
    energies = {}
    for (name, (K, _)), x in zip(cases.items(), xs):
        energies[name] = np.array([sinkhorn_self_ot(beta * xt @ K @ xt.T) for xt in x])
    setting = (
        f"n = {n} on S^{d - 1}, beta = {beta:g}, sinkhorn_iters = {iters}, RK4 dt = {dt:g}, {ts.size} saves to "
        f"t = {t1:g}; W = I + (G + G^T)/(2 sqrt d) symmetric (eigenvalues "
        + ", ".join(f"{v:.2f}" for v in np.linalg.eigvalsh(Wsym))
        + "); E = sinkhorn_self_ot(beta x W x^T), the entropic self-transport cost (eps = 1)"
    )
    Ev = energies["v_identity"]
    rises = int(np.sum(np.diff(Ev) > tol["sinkhorn_energy"]))
    if panels is not None:
        panels["sinkhorn"] = (ts, dict(energies))
    v_identity = (
        f". Not a check: the issue's 'symmetric Q^T K and V = I' (Q = I, K = W, V = I) is not a gradient flow "
        f"of E on the sphere (E is a potential of that field only in the metric W, in R^d with W positive "
        f"definite); measured on the same start, E went from {Ev[0]:.6f} to {Ev[-1]:.6f}, largest rise between "
        f"saves {float(np.max(np.diff(Ev))):.2e}, {rises} rising steps of {Ev.size - 1}"
    )
    for name, label in (("v_qk", "Q = I, K = W, V = W"), ("identity", "Q = K = V = I")):
        E = energies[name]
        rows.append(
            check(
                f"sinkhorn_energy_{name}",
                float(np.max(np.diff(E))),
                0.0,
                tol["sinkhorn_energy"],
                f"max over consecutive saves of E(t_k+1) - E(t_k) ({label}: a gradient flow, "
                f"x' = -(n / 2 beta) grad_sphere E, so <= 0): E from {E[0]:.6f} to {E[-1]:.6f}; {setting}"
                + (v_identity if name == "v_qk" else ""),
                passed=lambda v: v <= tol["sinkhorn_energy"],
            )
        )
    return rows


def _hardmax(
    S: Mapping[str, Any], tol: Mapping[str, float], panels: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    n, d, seeds = int(S["n"]), int(S["d"]), int(S["seeds"])
    t1, dt, tie = float(S["t1"]), float(S["dt"]), float(S["tie_tol"])
    A = np.diag(np.asarray(S["A"], dtype=np.float64))
    ts = np.linspace(0.0, t1, 5)
    with jax.enable_x64(True):
        x0 = jax.vmap(lambda k: sphere.uniform(k, n, d, dtype=jnp.float64))(
            jax.random.split(jax.random.key(2), seeds)
        )
        Qs = jnp.asarray(np.stack([np.eye(d), np.sqrt(A)]))

        def one(Q: Array, x: Array) -> Array:
            model = models.SelfAttention(1.0, Q, Q, attention="hardmax", tie_tol=tie)
            return _states(
                simulate(model, x, t1=t1, dt=dt, solver="euler", step="renormalize", ts=ts)
            )

        xs = np.asarray(
            jax.vmap(lambda Q: jax.vmap(lambda x: one(Q, x))(x0))(Qs)
        )  # (2, seeds, T, n, d)
        vel = []
        for x in xs[1, :, -1]:
            model = models.SelfAttention(1.0, Qs[1], Qs[1], attention="hardmax", tie_tol=tie)
            F = np.asarray(model.field(jnp.asarray(x)))
            vel.append(np.linalg.norm(F - np.sum(F * x, -1, keepdims=True) * x, axis=-1).max())
    static = float(np.max(np.abs(xs[0] - xs[0, :, :1])))
    lead_moved, n_lead, n_clusters, off_lead = [], [], [], []
    for x in xs[1]:
        scores = x[0] @ A @ x[0].T
        leaders = np.flatnonzero(np.argmax(scores, axis=1) == np.arange(n))
        n_lead.append(leaders.size)
        lead_moved.append(float(np.max(np.abs(x[-1, leaders] - x[0, leaders]))))
        dist = np.linalg.norm(x[-1][:, None] - x[0, leaders][None], axis=-1).min(axis=1)
        off_lead.append(int(np.sum(dist > 1e-3)))
        n_clusters.append(_clusters(x[-1], 1e-3))
    if panels is not None:
        panels["hardmax"] = (n_lead, n_clusters, lead_moved)
    setting = (
        f"{seeds} seeds of n = {n} uniform tokens on S^{d - 1}, the published update x <- normalize(x + dt F) "
        f"(dt = {dt:g}, to t = {t1:g}), hardmax attention (tie_tol {tie:g}), V = I"
    )
    return [
        check(
            "hardmax_identity_static",
            static,
            0.0,
            1e-12,
            f"max |x_i(t) - x_i(0)| with Q = K = I (0 up to the rounding of normalize(x + dt x), tolerance 1e-12): on the sphere <x_i, x_j> < 1 = <x_i, x_i> for j != i, so every "
            f"token is its own argmax, F_i = x_i and nothing moves (the paper's clustering needs A != I); {setting}",
        ),
        check(
            "hardmax_leaders_fixed",
            max(lead_moved),
            0.0,
            tol["hardmax_leaders_fixed"],
            f"A = Q^T K = diag{tuple(S['A'])} positive definite: max over seeds of |x_L(T) - x_L(0)| over the leaders L "
            f"(tokens that are their own argmax of <A x_L, x_j> at t = 0); leaders per seed {n_lead}; {setting}",
        ),
        check(
            "hardmax_equilibrium",
            float(max(vel)),
            0.0,
            tol["hardmax_equilibrium"],
            f"max over seeds and tokens of the tangent velocity |P_x F| at T = {t1:g} (a clustered equilibrium: "
            f"each token at rest at a token that is its own argmax); clusters (within 1e-3) per seed "
            f"{n_clusters} against leaders at t = 0 {n_lead}; tokens ending farther than 1e-3 from every initial "
            f"leader per seed {off_lead} (on the sphere a follower can become its own argmax on the way and stop "
            "between: the R^d statement 'every token ends at a leader' is not checked); " + setting,
        ),
    ]


# ------------------------------------------------------------------------------ run
def run(
    out_dir: str | os.PathLike[str],
    *,
    quick: bool = False,
    full: bool = False,
    quiet: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the dynamics reproduction; write a figure, data and ``summary.json``; return the summary.

    ``options`` override entries of ``EXPERIMENT.options`` (an unknown name raises ``ValueError``)."""
    S = EXPERIMENT.settings(EXPERIMENT.mode(quick=quick, full=full), **options)
    out = Path(out_dir) / _NAME
    out.mkdir(parents=True, exist_ok=True)
    tol = S["tolerances"]
    steps = EXPERIMENT.start(quiet=quiet)
    checks: list[dict[str, Any]] = []
    with steps("equiangular"):
        checks += _equiangular(S["equiangular"], tol["equiangular_ode"])
    curves: dict[str, Any] = {}  # the data of the figures, recorded by the checks
    panels: dict[str, Any] = {}
    with steps("normalization"):
        checks += _normalization(S["equiangular"], S["normalization"], tol, curves)
    with steps("simuformer"):
        checks += _simuformer_checks(S["simuformer"], tol)
    with steps("causal"):
        checks += _causal(S["causal"], tol["causal_converge_to_first"], panels)
    with steps("lost_in_the_middle"):
        L = _lim(S["lim"])
        checks += _lim_checks(S["lim"], L, tol)
    with steps("sinkhorn"):
        checks += _sinkhorn(S["sinkhorn"], tol, panels)
    with steps("hardmax"):
        checks += _hardmax(S["hardmax"], tol, panels)
    with steps("euclidean"):  # tokens in R^d (Geshkovski et al. 2023): _euclidean.py
        checks += _euclidean_checks(full=full)
    with steps("figures"):
        figures = (
            _figures(out, L)
            + _normalization_figure(out, curves, S["normalization"])
            + _variants_figure(out, panels)
        )
    np.savez_compressed(
        out / "dynamics_data.npz",
        lim_s=L["s"],
        lim_times=L["times"],
        lim_measured=L["measured"],
        lim_expm=L["expm"],
        lim_closed=L["closed"],
    )
    steps.close()
    return write_summary(
        out, _NAME, quick=quick, settings=S, checks=checks, timings=steps.timings, figures=figures
    )


def _figures(out: Path, L: Mapping[str, Any]) -> list[str]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for j, t in enumerate(L["times"]):
        (line,) = ax.plot(
            L["s"], L["measured"][j], "o", ms=3, label=f"t = {t:g} (vjp of mf.simulate)"
        )
        ax.plot(L["s"], L["closed"][j], "-", color=line.get_color(), lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("relative position s of the perturbed token")
    ax.set_ylabel("response of the last token S_t(s)")
    ax.set_title(
        f"lost in the middle: points measured, lines closed form (t_crit = {L['t_crit']:.3f})",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = "lost_in_the_middle.png"
    fig.savefig(out / name, dpi=120)
    plt.close(fig)
    return [name]


def _normalization_figure(out: Path, curves: Mapping[str, Any], N: Mapping[str, Any]) -> list[str]:
    """One panel per normalisation scheme: the particles' mean inner product rho(t) (points) from
    both equiangular starts against the scalar ODE (lines, ``equiangular_system``), and for the
    radial schemes the mean radius r(t) on a second axis, as ``normalization_equiangular_*`` checks."""
    import matplotlib.pyplot as plt

    if not curves:
        return []
    fig, axes = plt.subplots(2, 3, figsize=(10, 5.6), sharex=True)
    for ax, scheme in zip(axes.flat, _SCHEMES):
        runs = curves.get(scheme, [])
        twin = None
        for k, (ts, rho, rho_ode, r, r_ode) in enumerate(runs):
            label = "orthogonal start" if k == 0 else "equiangular start"
            (line,) = ax.plot(ts, rho, "o", ms=3, label=f"particles, {label}")
            ax.plot(ts, rho_ode, "-", lw=1, color=line.get_color())
            if r is not None:
                twin = twin or ax.twinx()
                twin.plot(ts, r, "s", ms=2.5, mfc="none", color=line.get_color(), alpha=0.7)
                twin.plot(ts, r_ode, ":", lw=1, color=line.get_color())
        ax.set_title(Scheme.lookup(scheme).label or scheme, fontsize=10)
        ax.set_ylim(-0.05, 1.05)
        if twin is not None:
            twin.set_ylabel("radius r (squares, dotted)", fontsize=8)
            twin.tick_params(labelsize=7)
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("t")
    for ax in axes[:, 0]:
        ax.set_ylabel("inner product rho")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        "equiangular starts: particles (points) against the scalar ODE of each scheme (lines); "
        f"beta = {float(N['beta']):g}",
        fontsize=10,
    )
    fig.tight_layout()
    name = "normalization_equiangular.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return [name]


def _variants_figure(out: Path, panels: Mapping[str, Any]) -> list[str]:
    """The attention variants' checks in three panels: under a causal mask every token's distance
    to the first token (which never moves) falls to 0; Sinkhorn attention's entropic self-transport
    cost never rises along a run for the symmetric weights (a gradient flow) and may for V != K;
    hardmax attention: the leaders (tokens that attend to themselves at the start) stay put and the
    runs come to rest in clusters."""
    import matplotlib.pyplot as plt

    if not panels:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    if "causal" in panels:
        ts, dist = panels["causal"]
        axes[0].semilogy(ts, np.maximum(dist, 1e-300), "o-", ms=3)
        axes[0].set_xlabel("t")
        axes[0].set_ylabel("max_i |x_i(t) - x_0|")
        axes[0].set_title("causal mask: all tokens converge to the first", fontsize=9)
    if "sinkhorn" in panels:
        ts, energies = panels["sinkhorn"]
        labels = {
            "v_qk": "V = K = W (gradient flow)",
            "identity": "Q = K = V = I (gradient flow)",
            "v_identity": "K = W, V = I (not one)",
        }
        for name, E in energies.items():
            axes[1].plot(ts, E, "o-", ms=3, label=labels.get(name, name))
        axes[1].set_xlabel("t")
        axes[1].set_ylabel("entropic self-transport cost E")
        axes[1].set_title("Sinkhorn attention: E never rises for symmetric weights", fontsize=9)
        axes[1].legend(fontsize=7)
    if "hardmax" in panels:
        n_lead, n_clusters, moved = panels["hardmax"]
        seeds = np.arange(len(n_lead))
        axes[2].bar(seeds - 0.2, n_lead, 0.4, label="leaders at the start")
        axes[2].bar(seeds + 0.2, n_clusters, 0.4, label="clusters at the end")
        axes[2].set_xlabel("seed")
        axes[2].set_ylabel("count")
        axes[2].set_title(f"hardmax: leaders fixed (moved <= {max(moved):.0e})", fontsize=9)
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    name = "attention_variants.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return [name]
