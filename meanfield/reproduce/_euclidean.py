r"""Tokens in $\mathbb R^d$ (``SelfAttention(geometry="euclidean")``): the check rows of Geshkovski,
Letrouit, Polyanskiy, Rigollet, "The emergence of clusters in self-attention dynamics" (arXiv 2305.05465,
NeurIPS 2023) for ``meanfield reproduce dynamics``.

The dynamics (``eq:trans_dyn``) is $\dot x_i = \sum_j P_{ij} V x_j$ with
$P_{ij} = \operatorname{softmax}_j \langle Q x_i, K x_j\rangle$ (no projection, $\beta = 1$), and the
rescaled tokens (Sec. 3, ``e:Rres``) $z_i(t) = e^{-tV} x_i(t)$ solve
$\dot z_i = \sum_j P_{ij}(e^{tV} z) V (z_j - z_i)$. One compiled program (``mf.simulate``, RK4,
float64) runs three cases, ``seeds`` starts each, $x_i(0) \sim U[-1, 1]^d$ as in borjanG/2023-transformers'
``leaders.py``, $d = 2$, at step ``dt`` and ``dt / 2`` (the second run only estimates the first's
integration error, $E = \tfrac{16}{15} \max |z_{dt} - z_{dt/2}|$); the attention matrix $P(t)$ is a
saved observable, $z = e^{-tV} x$ is computed from the saved tokens (``scipy.linalg.expm``, which
``model.rescaled_states`` equals, tests/test_euclidean.py).

* ``V = I``, $Q^\top K = A$ positive definite (``t:Idcase11int``, Sec. 3; ``t:Idcase11``, Sec. 8):
  $t \mapsto \operatorname{conv}\{z_i(t)\}$ is non-increasing (``p:noninc``) and converges to a convex
  polytope $K$; every $z_i(t)$ converges to a point of a finite set $S$ with
  $\operatorname{vert} K \subset S \subset \partial K \cup \{0\}$. Checked: ``rd_identity_hull_noninc``
  (how far any $z_i(t_{k+1})$ lies outside $\operatorname{conv}\{z(t_k)\}$, tolerance $2E$ plus
  rounding), ``rd_identity_boundary`` (each $z_i(T)$ within $\operatorname{diam} z(0)\, e^{-(T - t_h)}$
  of $\partial \operatorname{conv}\{z(T)\}$ or of $0$: once $P$ is Boolean, from the first save $t_h$
  where it is within $10^{-3}$ of one, a token follows its leader at rate $e^{-t}$),
  ``rd_identity_boolean`` ($P(T)$ a 0/1 matrix to rounding, or to the doubly exponential approach
  $b(T) \le b(T - h)^{e^h}$ predicted from the previous save: the logit gaps grow like $e^t$; proved
  for $d = 1$, ``t:boolean``; in $d \ge 2$ the paper's observation) and ``rd_identity_rank_clusters``
  (its rank equals the number of clusters of the $z_i(T)$, which remark ``r:higherdimclus`` says can
  fail in rare cases). The issue's
  wording "the vertices of the convex hull of the initial tokens" is not the theorem: $K$ is the limit
  polytope, $K \subset \operatorname{conv}\{z(0)\}$, and an initial vertex $v$ that is not its own
  maximiser of $\langle A v, z_j\rangle$ moves inwards (and every token moves while $P$ is soft); the
  note of ``rd_identity_rank_clusters`` gives how far the limit clusters lie from the initial vertices.
* A good triple (``d:good``, Sec. 4; ``l:3hyperplanes11``, proof Sec. 9): the top eigenvalue
  $\lambda_1$ of $V$ real, positive, simple and above $|\lambda_k|$, and $\langle Q\varphi_1, K\varphi_1\rangle > 0$
  ($V$ entrywise positive, Perron-Frobenius, as ``clustering-Tformers.py``'s "hyperplanes"; $Q = K = I$):
  $\varphi_1^*(z_i(t))$ converges, to at most three values ($\varphi_1^*$ the left eigenvector,
  $\varphi_1^*(\varphi_1) = 1$): the $z_i$ approach at most three parallel hyperplanes. Checked:
  ``rd_good_triple_hyperplanes`` (the number of groups of $\varphi_1^*(z_i(T))$ at most 3, each group
  far narrower than the gaps between groups).
* $d = 1$, $V > 0$, $QK > 0$ (``t:boolean``, Sec. 2, proof Sec. 7), embedded in $d = 2$ (tokens
  $(s_i, 0)$, $V = I$, $Q = K = I$: the second coordinate stays 0): $P(t)$ tends to a matrix whose rows
  are $e_a$ or $e_b$ ($a$, $b$ the largest and smallest initial tokens), all but at most one row, rank
  $\le 2$ for almost every start. Checked: ``rd_1d_boolean`` (Boolean as ``rd_identity_boolean``),
  ``rd_1d_leaders`` (rows beyond one not equal to $e_a$ or $e_b$: 0), ``rd_1d_rank`` (rank $\le 2$).

No doctest: ``checks`` compiles a run of a few seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from .. import metrics, models
from ..integrate import simulate
from ._common import check

__all__ = ["SIZES", "checks"]

#: The runs' sizes: tokens ``n``, starts per case ``seeds``, horizon ``T``, RK4 step ``dt``, save
#: spacing ``save``, the seed of the weights and starts (NumPy ``default_rng``).
SIZES: Mapping[str, Mapping[str, Any]] = {
    "quick": {"n": 16, "seeds": 4, "T": 12.0, "dt": 0.025, "save": 1.0, "seed": 0},
    "full": {"n": 32, "seeds": 16, "T": 12.0, "dt": 0.025, "save": 1.0, "seed": 0},
}

_D = 2
_CASES = ("identity", "good_triple", "one_dimensional")
#: P is "Boolean" from the first save where it is within this of a 0/1 matrix (Frobenius): the
#: start of the hardmax regime in which a token follows its leader at rate e^{-t}.
_HARDMAX = 1e-3
_EPS = float(np.finfo(np.float64).eps)


def checks(*, full: bool = False) -> list[dict[str, Any]]:
    """The check rows (``meanfield.reproduce._common.check``) of the three cases of the module
    docstring, at the ``SIZES`` of ``full`` (else quick), in float64."""
    S = SIZES["full" if full else "quick"]
    run = _run(S)
    return [*_identity(S, run), *_good_triple(S, run), *_one_dimensional(S, run)]


# ------------------------------------------------------------------------------ the runs
def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    G = rng.uniform(-1.0, 1.0, (_D, _D))
    A = G @ G.T  # leaders.py's A = S S^T: positive definite (almost surely)
    W = rng.uniform(0.0, 1.0, (_D, _D))  # clustering-Tformers' "hyperplanes": V = |rand|
    W /= np.max(np.linalg.eigvals(W).real)  # lambda_1 = 1: the three cases grow alike
    I = np.eye(_D)
    return {"A": A, "Vg": W, "Q": np.stack([A, I, I]), "V": np.stack([I, W, I])}


def _run(S: Mapping[str, Any]) -> dict[str, Any]:
    n, seeds, T, dt = int(S["n"]), int(S["seeds"]), float(S["T"]), float(S["dt"])
    ts = np.arange(0.0, T + 0.5 * S["save"], S["save"])
    w = _weights(int(S["seed"]))
    rng = np.random.default_rng(int(S["seed"]) + 1)
    x0 = rng.uniform(-1.0, 1.0, (len(_CASES), seeds, n, _D))
    x0[2, :, :, 1] = 0.0  # d = 1 on the first axis
    steps = int(math.ceil(T / (dt / 2))) + 2

    def one(Q: Array, V: Array, x: Array, h: Array) -> tuple[Array, Array, Array]:
        model = models.SelfAttention(1.0, Q, jnp.eye(_D, dtype=x.dtype), V, geometry="euclidean")
        traj = simulate(
            model,
            x,
            t1=T,
            dt=h,
            solver="rk4",
            ts=ts,
            max_steps=steps,
            observables={"P": model.attention_weights},
        )
        assert traj.xs is not None
        return traj.xs, traj.observables["P"], traj.failed

    seeds_axis = jax.vmap(one, in_axes=(None, None, 0, None))
    cases_axis = jax.vmap(seeds_axis, in_axes=(0, 0, 0, None))
    both = jax.jit(jax.vmap(cases_axis, in_axes=(None, None, None, 0)))
    with jax.enable_x64(True):
        xs, P, failed = both(
            jnp.asarray(w["Q"]), jnp.asarray(w["V"]), jnp.asarray(x0), jnp.asarray([dt, dt / 2])
        )
    import scipy.linalg  # the report's dependency only

    xs, P = np.asarray(xs), np.asarray(P)  # (2, cases, seeds, T, n, d), (2, cases, seeds, T, n, n)
    # z = e^{-tV} x (model.rescaled_states), per case and save time
    E = np.stack([np.stack([scipy.linalg.expm(-t * V) for t in ts]) for V in w["V"]])
    z = np.einsum("ctab,hcstnb->hcstna", E, xs)
    err = 16.0 / 15.0 * np.max(np.abs(z[0] - z[1]), axis=(1, 2, 3, 4))  # per case (RK4: order 4)
    return {
        "ts": ts,
        "x0": x0,
        "z": z[0],
        "P": P[0],
        "err": err,
        "failed": bool(np.any(np.asarray(failed))),
        **w,
    }


def _setting(S: Mapping[str, Any], run: Mapping[str, Any], what: str) -> str:
    return (
        f"{S['seeds']} starts x_i(0) ~ U[-1, 1]^{_D}, n = {S['n']}, {what}; mf.simulate RK4 dt = {S['dt']:g} "
        f"to T = {S['T']:g}, saves every {S['save']:g}, float64, geometry='euclidean', beta = 1, K = I"
        + ("; A RUN FAILED (non-finite state)" if run["failed"] else "")
    )


# ------------------------------------------------------------------------------ planar geometry
def _hull(p: np.ndarray) -> np.ndarray:
    """The vertices of the convex hull of points ``(m, 2)``, counter-clockwise (monotone chain;
    collinear points dropped; a segment for collinear input)."""
    idx = sorted(range(len(p)), key=lambda i: (p[i, 0], p[i, 1]))

    def cross(o: int, a: int, b: int) -> float:
        return float(
            (p[a, 0] - p[o, 0]) * (p[b, 1] - p[o, 1]) - (p[a, 1] - p[o, 1]) * (p[b, 0] - p[o, 0])
        )

    lower: list[int] = []
    upper: list[int] = []
    for i in idx:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], i) <= 0:
            lower.pop()
        lower.append(i)
    for i in reversed(idx):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], i) <= 0:
            upper.pop()
        upper.append(i)
    return np.asarray(lower[:-1] + upper[:-1])


def _outside(p: np.ndarray, y: np.ndarray) -> float:
    """How far the points ``y`` lie outside conv(``p``) (max over the points of the largest signed
    distance beyond an edge's line; <= 0 when all are inside)."""
    v = p[_hull(p)]
    a, b = v, np.roll(v, -1, axis=0)
    e = b - a
    normal = np.stack([e[:, 1], -e[:, 0]], axis=1) / np.linalg.norm(e, axis=1, keepdims=True)
    signed = np.einsum("kd,mkd->mk", normal, y[:, None, :] - a[None])  # outward: ccw polygon
    return float(np.max(np.max(signed, axis=1)))


def _to_boundary(p: np.ndarray) -> np.ndarray:
    """Each point's distance to the boundary of conv(``p``) (the nearest edge segment)."""
    v = p[_hull(p)]
    a, b = v, np.roll(v, -1, axis=0)
    e = b - a
    s = np.einsum("mkd,kd->mk", p[:, None] - a[None], e) / np.maximum(np.sum(e * e, axis=1), 1e-300)
    foot = a[None] + np.clip(s, 0.0, 1.0)[..., None] * e[None]
    return np.min(np.linalg.norm(p[:, None] - foot, axis=-1), axis=1)


def _groups(p: np.ndarray, radius: float) -> list[np.ndarray]:
    """Groups of rows (connected within ``radius``): index arrays."""
    p = p.reshape(len(p), -1)
    label = -np.ones(len(p), dtype=int)
    for i in range(len(p)):
        if label[i] >= 0:
            continue
        label[i] = i
        stack = [i]
        while stack:
            j = stack.pop()
            near = np.flatnonzero((np.linalg.norm(p - p[j], axis=1) <= radius) & (label < 0))
            label[near] = i
            stack.extend(near.tolist())
    return [np.flatnonzero(label == k) for k in np.unique(label)]


def _hardmax_time(ts: np.ndarray, P: np.ndarray) -> float:
    """The first save time from which every seed's P is within ``_HARDMAX`` of a 0/1 matrix."""
    dist = np.asarray(metrics.boolean_distance(P)).max(axis=0)  # (T,) max over seeds
    ok = np.flatnonzero(dist <= _HARDMAX)
    later = [k for k in ok if np.all(dist[k:] <= _HARDMAX)]
    return float(ts[later[0]]) if later else float(ts[-1])


def _boolean_row(
    name: str, ts: np.ndarray, P: np.ndarray, n: int, setting: str, status: str
) -> dict[str, Any]:
    """``max over starts of boolean_distance(P(T))`` against the doubly exponential approach of the
    hardmax regime: the weight a row puts off its leader is ``exp(-g(t))`` with a logit gap ``g``
    that grows at least like ``e^t`` (tokens that share a limit differ by ``e^t (z_j - z_k)`` with
    ``z_j - z_k ~ e^{-t}``: a constant, times ``x_i ~ e^t``; tokens with other limits by ``e^{2t}``),
    so ``b(T) <= b(T - h)^(e^h)`` from the previous save ``T - h`` once ``b(T - h) < 1``."""
    b = np.asarray(metrics.boolean_distance(P)).max(axis=0)  # (T,) max over starts
    h = float(ts[-1] - ts[-2])
    prev = float(b[-2])
    predicted = prev ** math.exp(h) if prev < 1 else 0.0
    tol = max(n * _EPS, predicted)
    return check(
        name,
        float(b[-1]),
        0.0,
        tol,
        f"max over starts of ||P(T) - 1[P(T) > 1/2]||_F (mf.metrics.boolean_distance; P(t) -> a 0/1 matrix: "
        f"{status}); tolerance max(n eps, b(T - h)^(e^h)) = max({n * _EPS:.1e}, {prev:.2e}^{math.exp(h):.2f}): "
        f"rounding of n softmax weights, or the prediction from the previous save (h = {h:g}) of the weights off "
        f"each row's leader, exp(-gap) with a logit gap growing like e^t (no prediction while b(T - h) >= 1); "
        f"per save "
        + ", ".join(f"t = {t:g}: {float(v):.1e}" for t, v in zip(ts[::2], b[::2]))
        + f"; {setting}",
    )


# ------------------------------------------------------------------------------ V = I
def _identity(S: Mapping[str, Any], run: Mapping[str, Any]) -> list[dict[str, Any]]:
    c = _CASES.index("identity")
    ts, z, P, T = run["ts"], run["z"][c], run["P"][c], float(S["T"])
    seeds, n = z.shape[0], z.shape[2]
    A = run["A"]
    setting = _setting(
        S,
        run,
        "V = I, Q = A = G G^T with G ~ U[-1, 1]^{2x2} (leaders.py; eigenvalues "
        + ", ".join(f"{e:.3f}" for e in np.linalg.eigvalsh(A))
        + ")",
    )
    viol = max(_outside(z[s, k], z[s, k + 1]) for s in range(seeds) for k in range(len(ts) - 1))
    E = float(run["err"][c])
    rounding = 1e-12
    rows = [
        check(
            "rd_identity_hull_noninc",
            max(viol, 0.0),
            0.0,
            2 * E + rounding,
            f"max over starts and consecutive saves of how far a z_i(t_k+1) = e^(-t) x_i lies outside "
            f"conv{{z_j(t_k)}} (p:noninc: the hull is non-increasing, so 0 for the exact flow; signed {viol:.2e}); "
            f"tolerance 2E + {rounding:g}: E = {E:.2e} = (16/15) max |z_dt - z_dt/2| estimates the RK4 run's "
            f"error at each save, which can move both hulls' points by E; {setting}",
        )
    ]
    diam0 = max(
        float(np.max(np.linalg.norm(z[s, 0][:, None] - z[s, 0][None], axis=-1)))
        for s in range(seeds)
    )
    t_h = _hardmax_time(ts, P)
    radius = diam0 * math.exp(-(T - t_h))
    per_t = []
    for k in range(len(ts)):
        per_t.append(
            max(
                float(np.max(np.minimum(_to_boundary(z[s, k]), np.linalg.norm(z[s, k], axis=1))))
                for s in range(seeds)
            )
        )
    vert = max(
        float(
            np.max(
                np.min(
                    np.linalg.norm(z[s, -1][:, None] - z[s, -1][_hull(z[s, -1])][None], axis=-1),
                    axis=1,
                )
            )
        )
        for s in range(seeds)
    )
    rows.append(
        check(
            "rd_identity_boundary",
            per_t[-1],
            0.0,
            radius,
            f"max over starts and tokens of min(distance of z_i(T) to the boundary of conv{{z(T)}}, |z_i(T)|) "
            f"(t:Idcase11: z_i -> a point of dK or 0); tolerance diam(z(0)) e^(-(T - t_h)) = {diam0:.3f} "
            f"e^(-({T:g} - {t_h:g})): from t_h (the first save from which P is within {_HARDMAX:g} of a 0/1 "
            f"matrix, Frobenius) each token follows its leader, z_i' = z_L - z_i, at rate e^(-t). Per save "
            + ", ".join(f"t = {t:g}: {v:.1e}" for t, v in zip(ts[::2], per_t[::2]))
            + f"; distance to the nearest vertex of conv{{z(T)}} (stronger, not the theorem) {vert:.1e}; {setting}",
        )
    )
    PT = P[:, -1]
    rows.append(
        _boolean_row("rd_identity_boolean", ts, P, n, setting, "in d >= 2 the paper's observation")
    )
    ranks, clusters, leaders, init_vertices, kept = [], [], [], [], []
    for s in range(seeds):
        groups = _groups(z[s, -1], radius)
        clusters.append(len(groups))
        ranks.append(int(metrics.gram_rank(jnp.asarray(PT[s]), 1e-8)))
        leaders.append(len(set(np.argmax(PT[s], axis=1).tolist())))
        h0 = _hull(z[s, 0])
        init_vertices.append(len(h0))
        centres = np.stack([z[s, -1, g].mean(axis=0) for g in groups])
        to_vertex = np.linalg.norm(centres[:, None] - z[s, 0, h0][None], axis=-1).min(axis=1)
        kept.append(float(np.max(to_vertex)))
    mismatch = max(abs(r - k) for r, k in zip(ranks, clusters))
    rows.append(
        check(
            "rd_identity_rank_clusters",
            mismatch,
            0.0,
            0.0,
            f"max over starts of |rank P(T) - number of clusters of z(T)| (rank: mf.metrics.gram_rank, "
            f"rtol 1e-8; clusters: groups within the boundary check's tolerance {radius:.1e}); ranks {ranks}, "
            f"clusters {clusters}, distinct leaders (argmax of each row) {leaders}. The issue's 'the vertices of "
            f"the convex hull of the initial tokens' is not t:Idcase11, whose limit points lie on the LIMIT "
            f"polytope K (conv{{z(t)}} -> K, a subset of conv{{z(0)}}): per start the initial hull has "
            f"{init_vertices} vertices, and the farthest cluster of z(T) lies "
            + ", ".join(f"{v:.3f}" for v in kept)
            + f" from the nearest of them (every token, leaders included, moves while P is soft, before t_h; "
            f"a vertex v with <A v, v> < max_j <A v, z_j> is not its own leader and moves inwards); {setting}",
        )
    )
    return rows


# ------------------------------------------------------------------------------ good triple
def _good_triple(S: Mapping[str, Any], run: Mapping[str, Any]) -> list[dict[str, Any]]:
    c = _CASES.index("good_triple")
    z = run["z"][c]
    V = run["Vg"]
    lam, right = np.linalg.eig(V)
    left_lam, left = np.linalg.eig(V.T)
    k, kl = int(np.argmax(lam.real)), int(np.argmax(left_lam.real))
    phi1, phi1s = right[:, k].real, left[:, kl].real
    phi1s = phi1s / (phi1s @ phi1)
    qk = float(phi1 @ phi1)  # <Q phi_1, K phi_1> with Q = K = I
    values = z @ phi1s  # (seeds, T, n)
    seeds = values.shape[0]
    counts, widths, gaps, found = [], [], [], []
    spread0 = float(np.max(np.ptp(values[:, 0], axis=1)))
    for s in range(seeds):
        v = values[s, -1]
        groups = _groups(v[:, None], 1e-3 * spread0)
        counts.append(len(groups))
        widths.append(max(float(np.ptp(v[g])) for g in groups))
        centres = np.sort([float(np.mean(v[g])) for g in groups])
        gaps.append(float(np.min(np.diff(centres))) if len(centres) > 1 else math.inf)
        found.append(", ".join(f"{m:.4f}" for m in centres))
    tail = float(np.max(np.abs(values[:, -1] - values[:, -2])))
    width, gap = max(widths), min(gaps)
    setting = _setting(
        S,
        run,
        "V = W / lambda_1(W), W ~ U[0, 1]^{2x2} entrywise (clustering-Tformers' 'hyperplanes'; eigenvalues "
        + ", ".join(f"{e:.4f}" for e in sorted(lam.real, reverse=True))
        + f"), Q = K = I (<Q phi_1, K phi_1> = {qk:.3f} > 0)",
    )
    return [
        check(
            "rd_good_triple_hyperplanes",
            max(counts),
            None,
            note=f"max over starts of the number of groups of phi_1^*(z_i(T)) (left eigenvector, phi_1^*(phi_1) = 1; "
            f"grouped within 1e-3 of the initial spread {spread0:.3f}); pass: <= 3 (l:3hyperplanes11: the limits "
            f"lie in a set {{0, a, b}}) and every group narrower than a hundredth of the gap between groups "
            f"(widest group {width:.1e}, narrowest gap {gap:.3g}; largest change of a phi_1^*(z_i) over the last "
            f"save interval {tail:.1e}: converging); group values per start "
            + "; ".join(f"[{f}]" for f in found)
            + f"; {setting}",
            passed=max(counts) <= 3 and width < gap / 100,
        )
    ]


# ------------------------------------------------------------------------------ d = 1
def _one_dimensional(S: Mapping[str, Any], run: Mapping[str, Any]) -> list[dict[str, Any]]:
    c = _CASES.index("one_dimensional")
    ts, P, x0, n = run["ts"], run["P"][c], run["x0"][c], int(S["n"])
    PT = P[:, -1]
    seeds = PT.shape[0]
    setting = _setting(
        S,
        run,
        "d = 1 as the first axis of R^2 (tokens (s_i, 0), V = I, Q = K = I: V = 1 > 0, QK = 1 > 0)",
    )
    others, ranks = [], []
    for s in range(seeds):
        a, b = int(np.argmax(x0[s, :, 0])), int(np.argmin(x0[s, :, 0]))
        target = np.argmax(PT[s], axis=1)
        others.append(max(int(np.sum((target != a) & (target != b))) - 1, 0))
        ranks.append(int(metrics.gram_rank(jnp.asarray(PT[s]), 1e-8)))
    return [
        _boolean_row("rd_1d_boolean", ts, P, n, setting, "t:boolean"),
        check(
            "rd_1d_leaders",
            max(others),
            0.0,
            0.0,
            f"max over starts of the number of rows of P(T) beyond one whose argmax is neither a nor b (the "
            f"largest and smallest initial tokens; t:boolean, e:star: all rows but at most one are e_a or e_b); "
            f"per start {others}; {setting}",
        ),
        check(
            "rd_1d_rank",
            max(ranks),
            None,
            note=f"max over starts of rank P(T) (mf.metrics.gram_rank, rtol 1e-8); pass: <= 2 (t:boolean: rank "
            f"1 or 2 for almost every start, <= 3 always); per start {ranks}; {setting}",
            passed=max(ranks) <= 2,
        ),
    ]
