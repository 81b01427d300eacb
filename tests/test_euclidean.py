"""Tokens in R^d (``SelfAttention(geometry="euclidean")``, Geshkovski, Letrouit, Polyanskiy, Rigollet
2023, arXiv 2305.05465) against NumPy transcriptions of borjanG/2023-transformers, the paper's discrete
rescaling and hull monotonicity, ``rescaled_states``, the errors, gradients, and the report's checks
(meanfield/reproduce/_euclidean.py). Float64 throughout (the ``x64`` fixture)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from scipy.spatial import ConvexHull

import meanfield as mf
from meanfield.reproduce import _euclidean

DT = 0.1


def _psd(rng: np.random.Generator, d: int) -> np.ndarray:
    """leaders.py's random positive semi-definite matrix: S S^T, S ~ U[-1, 1]^{d x d}."""
    S = 2 * rng.random((d, d)) - np.ones((d, d))
    return S @ S.T


def _leaders_py(x0: np.ndarray, A: np.ndarray, V: np.ndarray, steps: int) -> np.ndarray:
    """borjanG/2023-transformers ``leaders.py``'s loop, written out: explicit Euler, step 0.1, of
    x_i' = sum_j P_ij V x_j with P_ij = 1 / sum_k exp(<A x_i, x_k - x_j>) (softmax of <A x_i, x_j>)."""
    n = len(x0)
    x = np.zeros((n, steps + 1, x0.shape[1]))
    x[:, 0, :] = x0
    for l in range(steps):
        attention = [
            [
                1
                / np.sum(
                    [np.exp(np.dot(np.matmul(A, x[i][l]), x[k][l] - x[j][l])) for k in range(n)]
                )
                for j in range(n)
            ]
            for i in range(n)
        ]
        for i in range(n):
            dlst = np.array([attention[i][j] * np.matmul(V, x[j][l]) for j in range(n)])
            x[i][l + 1] = x[i][l] + DT * np.sum(dlst, axis=0)
    return np.swapaxes(x, 0, 1)  # (steps + 1, n, d)


def _euler(model: mf.models.SelfAttention, x0: np.ndarray, steps: int) -> np.ndarray:
    ts = DT * np.arange(steps + 1)
    traj = mf.simulate(model, jnp.asarray(x0), t1=float(ts[-1]), dt=DT, solver="euler", ts=ts)
    assert traj.xs is not None and not bool(traj.failed)
    return np.asarray(traj.xs)


@pytest.mark.parametrize("split", ["QA_KI", "sqrt"])
def test_euler_matches_leaders_py(x64, split):
    """mf.simulate's Euler run equals leaders.py's update step for step (Q = A, K = I, or
    Q = K = A^(1/2): <Q x_i, K x_j> = <A x_i, x_j> either way), to 1e-12."""
    rng = np.random.default_rng(3)
    n, d, steps = 7, 2, 5
    V, A = _psd(rng, d), _psd(rng, d)
    x0 = rng.uniform(-1, 1, (n, d))
    if split == "sqrt":
        R = np.real(scipy.linalg.sqrtm(A))
        Q, K = R, R
    else:
        Q, K = A, np.eye(d)
    model = mf.models.SelfAttention(
        1.0, jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V), geometry="euclidean"
    )
    ours = _euler(model, x0, steps)
    theirs = _leaders_py(x0, A, V, steps)
    assert np.max(np.abs(ours - theirs)) <= 1e-12 * max(1.0, np.max(np.abs(theirs)))
    assert np.max(np.abs(ours[-1] - x0)) > 0.01  # the tokens moved


def test_discrete_rescaling(x64):
    """The paper's discrete rescaling (r:discreterescaling): with R = I + dt V, z^[k] = R^-k x^k of the
    Euler run solves z_i^[k+1] = z_i^[k] + dt sum_j P_ij(R^k z^[k]) R^-1 V (z_j^[k] - z_i^[k]),
    clustering-Tformers.py's update on z with R^k for its e^(t V) and R^-1 V for its V (its stages
    k1..k4 are equal: the attention is frozen and z_curr + k adds one vector to every token), to 1e-12."""
    rng = np.random.default_rng(4)
    n, d, steps = 6, 3, 6
    V = rng.uniform(0, 1, (d, d))
    Q = _psd(rng, d) + 0.1 * np.eye(d)
    x0 = rng.uniform(-1, 1, (n, d))
    model = mf.models.SelfAttention(1.0, jnp.asarray(Q), None, jnp.asarray(V), geometry="euclidean")
    xs = _euler(model, x0, steps)
    R = np.eye(d) + DT * V
    Rinv = np.linalg.inv(R)
    z = np.stack([xs[k] @ np.linalg.matrix_power(Rinv, k).T for k in range(steps + 1)])
    zk = z[0].copy()
    for k in range(steps):
        y = zk @ np.linalg.matrix_power(R, k).T  # R^k z^[k]: the tokens whose attention acts
        logits = (y @ Q.T) @ y.T
        P = np.exp(logits - logits.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        step = np.einsum("ij,ijd->id", P, (zk[None] - zk[:, None]) @ (Rinv @ V).T)
        zk = zk + DT * step
        assert np.max(np.abs(zk - z[k + 1])) <= 1e-12


def _outside(p: np.ndarray, y: np.ndarray) -> float:
    """Largest signed distance of the points y beyond a facet of conv(p) (scipy's Qhull)."""
    eq = ConvexHull(p).equations
    return float(np.max(y @ eq[:, :-1].T + eq[:, -1]))


def test_hull_non_increasing(x64):
    """p:noninc for V = I, Q^T K > 0: conv{z(t)} is non-increasing. Euler's discrete rescaling
    z^[k] = (1 + dt)^-k x^k is a convex combination of the z^[k] (weights 1 - c and c P_ij,
    c = dt / (1 + dt)): exact to rounding. The RK4 run's z = e^-t x (rescaled_states as an
    observable): within 2x the step-doubling estimate of its error."""
    rng = np.random.default_rng(5)
    n, d, steps = 12, 2, 40
    A = _psd(rng, d) + 0.2 * np.eye(d)
    x0 = rng.uniform(-1, 1, (n, d))
    model = mf.models.SelfAttention(1.0, jnp.asarray(A), None, None, geometry="euclidean")
    xs = _euler(model, x0, steps)
    z = xs / (1 + DT) ** np.arange(steps + 1)[:, None, None]
    assert max(_outside(z[k], z[k + 1]) for k in range(steps)) <= 1e-12
    assert ConvexHull(z[-1]).volume < 0.9 * ConvexHull(z[0]).volume  # it shrinks

    ts = np.linspace(0.0, 4.0, 9)

    def rk4(dt: float) -> np.ndarray:
        traj = mf.simulate(
            model,
            jnp.asarray(x0),
            t1=4.0,
            dt=dt,
            solver="rk4",
            ts=ts,
            save_states=False,
            observables={"z": lambda x, t: model.rescaled_states(x, t)},
        )
        return np.asarray(traj.observables["z"])

    zc, zf = rk4(0.05), rk4(0.025)
    err = 16 / 15 * np.max(np.abs(zc - zf))
    assert err < 1e-6
    assert max(_outside(zc[k], zc[k + 1]) for k in range(len(ts) - 1)) <= 2 * err + 1e-12


def test_rescaled_states_against_scipy(x64):
    """model.rescaled_states(x, t) = x e^(-t V)^T (scipy.linalg.expm); V = None: e^-t x; as an
    observable with a parameter t it is evaluated at the save times."""
    rng = np.random.default_rng(6)
    n, d = 5, 3
    V = rng.standard_normal((d, d))
    x = rng.standard_normal((n, d))
    model = mf.models.SelfAttention(1.0, V=jnp.asarray(V), geometry="euclidean")
    for t in (0.0, 0.3, 1.7):
        expected = x @ scipy.linalg.expm(-t * V).T
        got = np.asarray(model.rescaled_states(jnp.asarray(x), t))
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)
    plain = mf.models.SelfAttention(1.0, geometry="euclidean")
    np.testing.assert_allclose(
        np.asarray(plain.rescaled_states(jnp.asarray(x), 0.5)), np.exp(-0.5) * x, rtol=1e-14
    )
    ts = np.array([0.0, 0.25, 0.5])
    traj = mf.simulate(
        model,
        jnp.asarray(x),
        t1=0.5,
        dt=0.05,
        solver="rk4",
        ts=ts,
        observables={"z": lambda x, t: model.rescaled_states(x, t)},
    )
    xs = np.asarray(traj.xs)
    for k, t in enumerate(ts):
        np.testing.assert_allclose(
            np.asarray(traj.observables["z"][k]),
            xs[k] @ scipy.linalg.expm(-t * V).T,
            rtol=1e-12,
            atol=1e-13,
        )


def test_errors(x64):
    x0 = jnp.asarray(np.random.default_rng(7).uniform(-1, 1, (4, 2)))
    with pytest.raises(ValueError, match="geometry='euclidean' has no layer norm"):
        mf.models.SelfAttention(1.0, geometry="euclidean", normalization="pre")
    model = mf.models.SelfAttention(1.0, geometry="euclidean")
    with pytest.raises(ValueError, match="NaN or inf"):
        mf.simulate(model, x0.at[1, 0].set(jnp.nan), t1=0.1, dt=0.05)
    with pytest.raises(ValueError, match="NaN or inf"):
        mf.simulate(model, x0.at[0, 1].set(jnp.inf), t1=0.1, dt=0.05)
    with pytest.raises(ValueError, match="renormalise"):
        mf.simulate(model, x0, t1=0.1, dt=0.05, solver="euler", step="renormalize")
    two = mf.models.SelfAttention(1.0, V=jnp.stack([jnp.eye(2)] * 2), geometry="euclidean")
    with pytest.raises(ValueError, match="2 heads"):
        two.rescaled_states(x0, 0.5)


def test_grad_through_simulate(x64):
    """jax.grad of a loss of the final tokens with respect to a scale of V and to x0, against
    central finite differences (float64)."""
    rng = np.random.default_rng(8)
    n, d = 5, 2
    V0 = jnp.asarray(_psd(rng, d) + 0.1 * np.eye(d))
    Q = jnp.asarray(_psd(rng, d) + 0.1 * np.eye(d))
    x0 = jnp.asarray(rng.uniform(-1, 1, (n, d)))
    w = jnp.asarray(rng.standard_normal((n, d)))

    def loss(s, x):
        model = mf.models.SelfAttention(1.0, Q, None, s * V0, geometry="euclidean")
        traj = mf.simulate(model, x, t1=1.0, dt=0.1, solver="rk4")
        return jnp.sum(w * traj.xs[-1])

    gs, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(1.0, x0)
    loss = jax.jit(loss)  # one compilation for the four evaluations
    h = 1e-6
    fd_s = (loss(1.0 + h, x0) - loss(1.0 - h, x0)) / (2 * h)
    assert abs(float(gs) - float(fd_s)) <= 1e-6 * max(1.0, abs(float(fd_s)))
    u = jnp.asarray(rng.standard_normal((n, d)))
    fd_x = (loss(1.0, x0 + h * u) - loss(1.0, x0 - h * u)) / (2 * h)
    assert abs(float(jnp.sum(gx * u)) - float(fd_x)) <= 1e-6 * max(1.0, abs(float(fd_x)))


def test_planar_hull_helpers():
    """The report's monotone-chain hull and distances against scipy's Qhull."""
    rng = np.random.default_rng(9)
    p = rng.uniform(-1, 1, (20, 2))
    assert set(_euclidean._hull(p).tolist()) == set(ConvexHull(p).vertices.tolist())
    y = rng.uniform(-1.5, 1.5, (50, 2))
    assert abs(_euclidean._outside(p, y) - _outside(p, y)) <= 1e-12
    eq = ConvexHull(p).equations
    inside = -np.max(p @ eq[:, :-1].T + eq[:, -1], axis=1)  # distance to the nearest facet line
    np.testing.assert_allclose(_euclidean._to_boundary(p), inside, atol=1e-12)


@pytest.mark.slow
def test_report_checks_pass():
    """The quick report rows: every check passes, with the names the module docstring lists."""
    rows = _euclidean.checks()
    names = [r["name"] for r in rows]
    assert names == [
        "rd_identity_hull_noninc",
        "rd_identity_boundary",
        "rd_identity_boolean",
        "rd_identity_rank_clusters",
        "rd_good_triple_hyperplanes",
        "rd_1d_boolean",
        "rd_1d_leaders",
        "rd_1d_rank",
    ]
    failed = [(r["name"], r["measured"], r["tolerance"], r["note"]) for r in rows if not r["pass"]]
    assert not failed
