"""mf.metastability: clusters, merges, plateaus, the staircase and the two-cluster quadrature."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.sparse.csgraph import connected_components

import meanfield as mf
from meanfield import metastability as ms


def _circle(th):
    th = np.asarray(th, float)
    return np.stack([np.cos(th), np.sin(th)], axis=1)


def _brute_labels(x, threshold):
    cos = np.clip(x @ x.T, -1, 1)
    _, comp = connected_components(cos > np.cos(threshold), directed=False)
    # canonical: smallest index of each component
    first = {c: i for i, c in reversed(list(enumerate(comp)))}
    return np.array([first[c] for c in comp])


# --------------------------------------------------------------------- clusters


@pytest.mark.parametrize("seed,block", [(0, None), (1, 16), (2, 7)])
def test_clusters_match_dense_single_linkage(seed, block):
    x = np.asarray(mf.sphere.uniform(jax.random.key(seed), 300, 3), np.float64)
    c = ms.clusters(x, 0.2, block_size=block)
    ref = _brute_labels(x, 0.2)
    np.testing.assert_array_equal(np.asarray(c.labels), ref)
    w = np.bincount(ref, minlength=300) / 300
    np.testing.assert_allclose(np.asarray(c.weights), w, atol=1e-6)
    assert int(c.num) == len(set(ref.tolist())) == int(mf.metrics.num_clusters(x, 0.2))


@pytest.mark.parametrize("bad", [0.0, -0.1, math.pi, 4.0])
def test_threshold_outside_open_interval_is_an_error(bad):
    x = _circle([0.0, 1.0])
    with pytest.raises(ValueError, match=r"threshold must be an angle in \(0, pi\)"):
        ms.clusters(x, bad)
    with pytest.raises(ValueError, match="threshold"):
        ms.merge_events(([0.0], x[None]), bad)


def test_clusters_jit_and_vmap():
    xs = jnp.stack([jnp.asarray(_circle([0, 0.01, 2.0])), jnp.asarray(_circle([0, 1.0, 2.0]))])
    nums = jax.jit(jax.vmap(lambda x: ms.clusters(x, 0.1).num))(xs)
    assert nums.tolist() == [2, 3]


# --------------------------------------------------------------------- merges


def test_merge_events_from_states():
    ts = [0.0, 1.0, 2.0, 3.0]
    xs = np.stack(
        [
            _circle([0.0, 1.0, 2.0, 3.0]),
            _circle([0.0, 0.0, 2.0, 3.0]),  # 0 and 1 merge in (0, 1]
            _circle([0.0, 0.0, 2.0, 3.0]),
            _circle([2.5, 2.5, 2.5, 2.5]),  # {0,1}, {2}, {3} merge in (2, 3]
        ]
    )
    ev = ms.merge_events((ts, xs), 0.1)
    assert [(e.time, e.time_before, e.left, e.right, e.merged) for e in ev] == [
        (1.0, 0.0, 0, 1, 0),
        (3.0, 2.0, 0, 2, 0),
        (3.0, 2.0, 0, 3, 0),
    ]
    assert [(e.w_left, e.w_right, e.w_merged) for e in ev] == [
        (0.25, 0.25, 0.5),
        (0.5, 0.25, 0.75),
        (0.75, 0.25, 1.0),
    ]


@pytest.mark.slow
def test_merge_events_without_states_uses_saved_labels():
    th = np.r_[np.zeros(3), np.full(5, 0.5)]
    x0 = jnp.asarray(np.c_[_circle(th), np.zeros(8)], jnp.float32)
    kw = dict(t1=40.0, dt=0.1, ts=np.linspace(0, 40, 41))
    k = mf.kernels.USA(10.0, rescaled=True)
    full = mf.simulate(k, x0, **kw, observables={"cluster_labels": ms.cluster_labels(0.1)})
    lean = eqx.tree_at(
        lambda t: t.xs, full, None, is_leaf=lambda v: v is None
    )  # as with save_states=False
    assert lean.xs is None
    a, b = ms.merge_events(full, 0.1), ms.merge_events(lean)
    assert len(a) == 1 and a == b
    assert (a[0].left, a[0].right, a[0].w_left, a[0].w_right) == (0, 3, 0.375, 0.625)


def test_merge_events_bad_input():
    with pytest.raises(ValueError, match="empty"):
        ms.merge_events((np.zeros(0), np.zeros((0, 2, 2))), 0.1)
    z = jnp.zeros(2)
    lean = mf.Trajectory(
        ts=jnp.arange(2.0),
        xs=None,
        energy=z,
        collapse_gap=z,
        observables={},
        stop_time=z[0],
        stopped=jnp.array(False),
        failed=jnp.array(False),
        num_steps=jnp.array(0),
    )
    with pytest.raises(ValueError, match="cluster_labels"):
        ms.merge_events(lean, 0.1)


def test_first_merge_time_is_jittable():
    f = jax.jit(ms.first_merge_time)
    assert float(f(jnp.arange(4.0), jnp.array([3, 3, 2, 1]))) == 2.0
    assert math.isinf(float(f(jnp.arange(3.0), jnp.array([2, 2, 2]))))


# --------------------------------------------------------------------- plateaus


def test_plateaus_rule_and_jit_count():
    t = np.geomspace(1, 1e6, 61)
    E = np.where(t < 1e2, 0.2, np.where(t < 1e4, 0.28, 0.44)) + 1e-5 * np.sin(t)
    E[20] = 0.24  # one save inside a jump: not a plateau
    p = ms.plateaus(t, E)
    np.testing.assert_allclose(p.level, [0.2, 0.28, 0.44], atol=1e-4)
    assert p.start[0] == t[0] and p.end[-1] == t[-1]
    assert int(jax.jit(ms.num_plateaus)(jnp.asarray(E))) == 3
    assert len(ms.plateaus(t, np.ones_like(t))) == 1


def test_plateaus_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        ms.plateaus([], [])
    with pytest.raises(ValueError, match="rel_tol"):
        ms.plateaus([0.0, 1.0], [1.0, 2.0], rel_tol=-1)
    with pytest.raises(ValueError, match="finite"):
        ms.plateaus([0.0, 1.0, 2.0], [1.0, np.nan, 2.0])


# --------------------------------------------------------------------- staircase


def _dotm_algo_traj_1(theta0):
    """dotm staircase.py ``algo_traj_1``/``algo_traj_2`` predictor, rewritten in NumPy from its
    published logic (github.com/HugoKoubbi/2024-transformers-dotm): merge the pair at the
    smallest (counter-clockwise) gap, time increment 1 - cos(gap), energy jump 2 w_i w_j / M^2
    from the level 1/n, the merged particle at the weighted mean angle."""
    theta = np.array(theta0, float)
    M = len(theta)
    w = np.ones_like(theta)
    jumps, times, gaps = [], [], []
    while len(theta) >= 2:
        n = len(theta)
        best = (np.inf, None, None)
        for i in range(n):
            for j in range(n):
                if i != j:
                    g = abs((theta[i] - theta[j]) % (2 * np.pi))
                    if g < best[0]:
                        best = (g, i, j)
        g, i, j = best
        gaps.append(g)
        times.append(1 - np.cos(g))
        jumps.append(2 * w[i] * w[j] / M**2)
        theta[j] = ((theta[j] * w[j] + theta[i] * w[i]) / (w[i] + w[j])) % (2 * np.pi)
        w[j] += w[i]
        theta, w = np.delete(theta, i), np.delete(w, i)
    levels = [1 / M + sum(jumps[:k]) for k in range(len(jumps) + 1)]
    return (
        np.array(levels),
        np.array(gaps),
        np.array([sum(times[:k]) for k in range(len(times) + 1)]),
    )


@pytest.mark.parametrize("beta", [500.0, 1000.0, 2000.0, 4000.0])
def test_staircase_matches_dotm_predictor_on_its_example(beta):
    # dotm staircase.py's example: n = 5 at 0.5 * (0, 0.5, 2, 4, 7) log(beta) / sqrt(beta)
    th = 0.5 * np.array([0, 0.5, 2, 4, 7]) * np.log(beta) / np.sqrt(beta)
    levels, gaps, times = _dotm_algo_traj_1(th)
    s = ms.staircase(np.ones(5), th)
    np.testing.assert_allclose(s.levels, levels, rtol=1e-12)
    np.testing.assert_allclose(s.gaps, gaps, rtol=1e-9)
    np.testing.assert_allclose(s.rescaled_times, times, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(s.levels, [0.2, 0.28, 0.44, 0.52, 1.0], rtol=1e-12)


def test_staircase_closed_forms():
    w = np.array([0.1, 0.2, 0.3, 0.4])
    s = ms.staircase(w)
    assert s.levels[0] == pytest.approx(np.sum(w**2))
    assert s.levels[-1] == pytest.approx(1.0)
    np.testing.assert_allclose(np.diff(s.levels), s.jumps)
    assert s.jumps[0] == pytest.approx(2 * 0.1 * 0.2)
    # vectors on S^2: closest pair first, merged at the weighted geodesic mean
    pos = np.array([[1, 0, 0], [np.cos(0.2), np.sin(0.2), 0], [0, 0, 1.0]])
    s = ms.staircase([1, 3, 1], pos)
    assert s.pairs.tolist() == [[0, 1], [0, 2]]
    assert s.gaps[0] == pytest.approx(0.2)
    assert s.gaps[1] == pytest.approx(np.pi / 2)  # the mean stays in the xy-plane
    with pytest.raises(ValueError, match="weights"):
        ms.staircase([1.0, -1.0])


def test_normalized_energy_of_point_clusters_is_sum_of_squared_weights():
    th = np.r_[np.zeros(2), np.full(3, 1.5), np.full(5, 3.0)]
    with jax.enable_x64(True):
        E = mf.energy(mf.kernels.USA(200.0, rescaled=True), jnp.asarray(_circle(th)))
        assert float(ms.normalized_energy(E, 200.0)) == pytest.approx(0.04 + 0.09 + 0.25, rel=1e-12)


# --------------------------------------------------------------------- two clusters


def test_merge_time_small_beta_closed_form():
    T = ms.two_cluster_merge_time(0.3, 0.2, 2.0, 1e-10, threshold=0.05)
    assert T == pytest.approx(math.log(math.tan(1.0) / math.tan(0.025)) / 0.5, rel=1e-8)


@pytest.mark.parametrize("beta,theta", [(5.0, 1.0), (30.0, 0.7), (100.0, 0.5), (0.5, 2.8)])
def test_merge_time_against_reduced_ode(beta, theta):
    w1, w2, thc = 0.25, 0.5, 0.1

    def rhs(t, y):
        return [-(w1 + w2) * np.sin(y[0]) * np.exp(-beta * (1 - np.cos(y[0])))]

    T = ms.two_cluster_merge_time(w1, w2, theta, beta, threshold=thc)
    t_eval = T * np.array([1 - 1e-5, 1 + 1e-5])
    sol = solve_ivp(
        rhs, (0.0, t_eval[-1]), [theta], t_eval=t_eval, rtol=1e-12, atol=1e-14, method="LSODA"
    )
    before, after = sol.y[0]
    assert before > thc > after  # the ODE crosses the threshold within T (1 +- 1e-5)


def test_merge_time_laplace_asymptotics_and_log():
    w, th, beta = 1.0, 0.8, 4000.0
    u0 = 1 - math.cos(th)
    logT = ms.two_cluster_merge_time(0.5, 0.5, th, beta, log=True)
    lead = beta * u0 - math.log(w * beta * u0 * (2 - u0))
    assert logT - lead == pytest.approx(0.0, abs=5.0 / (beta * u0))
    assert ms.two_cluster_merge_time(0.5, 0.5, th, beta) == math.inf  # past float64: use log=True
    t_res = ms.two_cluster_merge_time(0.5, 0.5, th, 20.0)
    assert ms.two_cluster_merge_time(0.5, 0.5, th, 20.0, rescaled=False) == pytest.approx(
        t_res * math.exp(-20.0)
    )
    with pytest.raises(ValueError, match="theta must lie in"):
        ms.two_cluster_merge_time(0.5, 0.5, 0.05, 1.0, threshold=0.1)


# --------------------------------------------------------------------- long runs


@pytest.mark.slow
@pytest.mark.parametrize("beta,theta", [(20.0, 0.8), (60.0, 0.7)])
def test_simulate_long_first_merge_matches_quadrature(beta, theta):
    n1, n2 = 3, 5
    th = np.r_[np.zeros(n1), np.full(n2, theta)]
    T = ms.two_cluster_merge_time(n1 / 8, n2 / 8, theta, beta, threshold=0.1)
    with jax.enable_x64(True):
        x0 = jnp.asarray(np.c_[_circle(th), np.zeros(8)])
        ts = np.r_[0.0, np.geomspace(T / 3, 3 * T, 300)]
        traj = ms.simulate_long(
            mf.kernels.USA(beta, rescaled=True), x0, t1=3 * T, ts=ts, rtol=1e-7, atol=1e-10
        )
        assert not bool(traj.failed)
        (e,) = ms.merge_events(traj, 0.1)
    ratio = ts[2] / ts[1]
    assert e.time_before / ratio <= T <= e.time * ratio
    assert (e.w_left, e.w_right) == (0.375, 0.625)


def test_simulate_long_memory_is_the_saves_and_failures_are_flagged():
    th = np.array([0.0, 0.0, 0.6])
    with jax.enable_x64(True):
        x0 = jnp.asarray(_circle(th))
        k = mf.kernels.USA(20.0, rescaled=True)
        traj = ms.simulate_long(
            k,
            x0,
            t1=1e8,
            rtol=1e-6,
            atol=1e-9,
            num_saves=40,
            save_states=False,
            observables={"cluster_labels": ms.cluster_labels(0.1)},
        )
        assert traj.xs is None and traj.observables["cluster_labels"].shape == (40, 3)
        assert traj.energy.shape == (40,) and not bool(traj.failed)
        assert len(ms.merge_events(traj)) == 1
        short = ms.simulate_long(k, x0, t1=1e8, rtol=1e-6, atol=1e-9, num_saves=40, max_steps=5)
        assert bool(short.failed) and np.isnan(np.asarray(short.energy)[-1])
    with pytest.raises(ValueError, match="overflows float32"):
        ms.simulate_long(k, _circle(th).astype(np.float32), t1=1e60, rtol=1e-6, atol=1e-9)
    with pytest.raises(TypeError, match="USA"):
        ms.simulate_long(mf.kernels.Toeplitz(), _circle(th), t1=1.0, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="rtol"):
        ms.simulate_long(k, _circle(th), t1=1.0, rtol=0.0, atol=1e-9)


# Log-time runs (issue 30, item 1): merge exponents beta (1 - cos theta) from 50 to 1000, i.e.
# t up to e^993, past float64's range. Tolerance of a first merge in log t: the saves are spaced
# by _DLOG in log t, so the merge is bracketed by (log t_before, log t_after]; the integrator
# (atol 1e-10, ~1e4 steps) moves the angle by at most ~1e-6, which shifts log T by
# beta sin(theta) dtheta <= 2e-3 at beta = 2000: a margin of 0.01 on each side of the bracket.
_DLOG, _LOG_MARGIN = 0.05, 0.01


def _two_point_clusters(theta, n1=3, n2=5):
    return np.c_[_circle(np.r_[np.zeros(n1), np.full(n2, theta)]), np.zeros(n1 + n2)]


@pytest.mark.parametrize(
    "beta,exponent", [(100.0, 50.0), (400.0, 200.0), (1000.0, 500.0), (2000.0, 1000.0)]
)
def test_simulate_long_first_merge_in_log_time_matches_quadrature(beta, exponent):
    theta = math.acos(1.0 - exponent / beta)
    logT = ms.two_cluster_merge_time(3 / 8, 5 / 8, theta, beta, threshold=0.1, log=True)
    log_ts = np.r_[-np.inf, np.arange(-20, 21) * _DLOG + logT + 0.3 * _DLOG]
    with jax.enable_x64(True):
        traj = ms.simulate_long(
            mf.kernels.USA(beta, rescaled=True),
            jnp.asarray(_two_point_clusters(theta)),
            log_t1=log_ts[-1],
            log_ts=log_ts,
            rtol=1e-7,
            atol=1e-10,
        )
        assert not bool(traj.failed)
        log_t = np.asarray(traj.observables["log_t"])
        np.testing.assert_array_equal(log_t, log_ts)
        (e,) = ms.merge_events((log_t, traj.xs), 0.1)
    assert e.time - e.time_before == pytest.approx(_DLOG)
    assert e.time_before - _LOG_MARGIN <= logT <= e.time + _LOG_MARGIN
    assert (e.w_left, e.w_right) == (0.375, 0.625)
    # past float64's range the physical times are inf, the log times carry the run
    assert np.isinf(np.asarray(traj.ts)[-1]) == (log_ts[-1] > 709.78)


@pytest.mark.slow
def test_simulate_long_staircase_to_e_beta():
    # four singletons on the circle at beta = 200: three merges with exponents
    # beta (1 - cos gap) = 24.5, 118.3, 212.5, the last one past t = e^beta
    beta, th = 200.0, np.array([0.0, 0.5, -0.9, 1.5])
    pred = ms.staircase(np.ones(4), th)
    np.testing.assert_allclose(beta * pred.exponents, [24.48, 118.30, 212.50], atol=0.01)
    with jax.enable_x64(True):
        traj = ms.simulate_long(
            mf.kernels.USA(beta, rescaled=True),
            jnp.asarray(_circle(th)),
            log_t1=1.1 * beta,
            num_saves=120,
            rtol=1e-6,
            atol=1e-9,
        )
        assert not bool(traj.failed)
        log_t = np.asarray(traj.observables["log_t"])
        En = np.asarray(ms.normalized_energy(traj.energy, beta))
        ev = ms.merge_events((log_t, traj.xs), 0.1)
    plat = ms.plateaus(log_t, En)
    np.testing.assert_allclose(plat.level, pred.levels, atol=1e-6)
    assert [(e.w_left, e.w_right) for e in ev] == [(0.25, 0.25), (0.5, 0.25), (0.75, 0.25)]
    assert ev[-1].time_before > beta  # the last merge happens after t = e^beta
    # the first merge is a two-point-cluster merge: the quadrature, in log t
    logT = ms.two_cluster_merge_time(0.25, 0.25, 0.5, beta, threshold=0.1, log=True)
    assert ev[0].time_before <= logT <= ev[0].time


@pytest.mark.parametrize("rescaled", [False, True])
def test_simulate_long_field_is_the_kernels_velocity(x64, rescaled):
    """The long run's field is the kernel's (``USA.scaled_velocity``): ``e^c G`` is ``mf.velocity``
    to rounding at every tile size, and a group of merged copies drops exactly its inner pairs
    (their pull is radial: the velocity of a state with two coincident tokens is the same)."""
    k = mf.kernels.USA(3.0, rescaled=rescaled)
    x = mf.sphere.normalize(mf.sphere.uniform(jax.random.key(5), 9, 3).astype(jnp.float64))
    v = np.asarray(mf.velocity(k, x))
    for block in (1, 4, 9, 128):
        c, G = k.scaled_velocity(x, jnp.arange(9), block_size=block)
        np.testing.assert_allclose(np.exp(float(c)) * np.asarray(G), v, rtol=1e-12, atol=1e-14)
    # tokens 0 and 1 coincide: one group or two, the same velocity
    y = x.at[1].set(x[0])
    c1, G1 = k.scaled_velocity(y, jnp.arange(9))
    c2, G2 = k.scaled_velocity(y, jnp.array([0, 0, 2, 3, 4, 5, 6, 7, 8]))
    np.testing.assert_allclose(np.exp(float(c1)) * G1, np.exp(float(c2)) * G2, atol=1e-14)
    # every pair in one group: no field (c = -inf)
    c, G = k.scaled_velocity(x, jnp.zeros(9, int))
    assert float(c) == -np.inf
    # the scaled form applies no mask and no scheme: refused, as a bad tile
    for bad, match in (
        (dict(mask=mf.masks.Causal()), "unmasked field; got mask=Causal"),
        (dict(normalization="pre"), "Post-LN flow"),
    ):
        with pytest.raises(ValueError, match=match):
            mf.kernels.USA(3.0, **bad).scaled_velocity(x, jnp.arange(9))
    with pytest.raises(ValueError, match="block_size"):
        k.scaled_velocity(x, jnp.arange(9), block_size=0)
    # a kernel that gives no scaled velocity is refused by that fact, not by its class
    with pytest.raises(TypeError, match="velocity in scaled form .* got DistanceBias"):
        ms.simulate_long(mf.kernels.DistanceBias(3.0, lam=0.5), x, t1=1.0, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="unmasked flow, got mask=Causal"):
        ms.simulate_long(
            mf.kernels.USA(3.0, mask=mf.masks.Causal()), x, t1=1.0, rtol=1e-6, atol=1e-8
        )


def test_simulate_long_log_time_api():
    theta = math.acos(1.0 - 0.5)
    x0 = _two_point_clusters(theta).astype(np.float32)
    k = mf.kernels.USA(200.0, rescaled=True)
    # float32 past its range (t ~ e^95 > 3.4e38): the log times carry the run
    logT = ms.two_cluster_merge_time(3 / 8, 5 / 8, theta, 200.0, threshold=0.1, log=True)
    log_ts = np.r_[-np.inf, logT - 0.5, logT + 0.5]
    traj = ms.simulate_long(k, x0, log_t1=logT + 0.5, log_ts=log_ts, rtol=1e-5, atol=1e-6)
    assert not bool(traj.failed) and np.isinf(np.asarray(traj.ts)[-1])
    assert traj.observables["log_t"].dtype == jnp.float32
    (e,) = ms.merge_events((traj.observables["log_t"], traj.xs), 0.1)
    assert e.time == pytest.approx(logT + 0.5, rel=1e-6)
    with pytest.raises(TypeError, match="exactly one of t1"):
        ms.simulate_long(k, x0, rtol=1e-6, atol=1e-9)
    with pytest.raises(TypeError, match="exactly one of t1"):
        ms.simulate_long(k, x0, t1=1.0, log_t1=0.0, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="log_t1 must be finite"):
        ms.simulate_long(k, x0, log_t1=math.inf, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="log_ts must lie in"):
        ms.simulate_long(k, x0, log_t1=1.0, log_ts=[0.0, 2.0], rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="'log_t' is reserved"):
        ms.simulate_long(
            k, x0, log_t1=1.0, rtol=1e-6, atol=1e-9, observables={"log_t": lambda x: x[0, 0]}
        )


# --------------------------------------------------------------------- movies


@pytest.fixture(scope="module")
def small_run():
    x0 = mf.sphere.uniform(jax.random.key(3), 32, 3)
    return mf.simulate(mf.kernels.USA(4.0), x0, t1=3.0, dt=0.05, ts=np.linspace(0, 3, 12))


def test_animate_gif_has_one_frame_per_save(small_run, tmp_path):
    from PIL import Image

    from meanfield import plotting

    path = plotting.animate(small_run, tmp_path / "run.gif", fps=10)
    with Image.open(path) as im:
        assert im.n_frames == 12
        assert im.size == (8 * 72, 4 * 72)


@pytest.mark.filterwarnings("ignore:os.fork")
def test_animate_mp4_frame_count(small_run, tmp_path):
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    from meanfield import plotting

    path = plotting.animate(small_run, tmp_path / "run.mp4", fps=12)
    frames, secs = imageio_ffmpeg.count_frames_and_secs(path)
    assert frames == 12 and secs == pytest.approx(1.0, abs=0.1)


def test_animate_bad_input(small_run, tmp_path):
    from meanfield import plotting

    with pytest.raises(ValueError, match="cannot be written"):
        plotting.animate(small_run, tmp_path / "missing" / "run.gif")
    with pytest.raises(ValueError, match=r"\.mp4"):
        plotting.animate(small_run, tmp_path / "run.avi")
    with pytest.raises(ValueError, match="non-empty trajectory"):
        plotting.animate((np.zeros(0), np.zeros((0, 4, 3))), tmp_path / "run.gif")
    lean = eqx.tree_at(lambda t: t.xs, small_run, None, is_leaf=lambda v: v is None)
    with pytest.raises(ValueError, match="save_states=True"):
        plotting.animate(lean, tmp_path / "run.gif")
    with pytest.raises(ValueError, match="threshold"):
        plotting.animate(small_run, tmp_path / "run.gif", threshold=4.0)
    assert not (tmp_path / "run.gif").exists()


def test_animate_missing_ffmpeg_names_the_package(small_run, tmp_path, monkeypatch):
    import sys

    from meanfield import plotting

    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    with pytest.raises(ImportError, match="imageio-ffmpeg"):
        plotting.animate(small_run, tmp_path / "run.mp4")


@pytest.mark.slow
def test_cli_simulate_movie(tmp_path, capsys):
    from PIL import Image

    from meanfield import cli

    movie = tmp_path / "m.gif"
    rc = cli.main(
        [
            "simulate",
            "--n",
            "16",
            "--t1",
            "1",
            "--dt",
            "0.1",
            "--saves",
            "7",
            "--out",
            str(tmp_path / "out"),
            "--movie",
            str(movie),
        ]
    )
    assert rc == 0
    with Image.open(movie) as im:
        assert im.n_frames == 7
    rc = cli.main(
        [
            "simulate",
            "--n",
            "16",
            "--t1",
            "1",
            "--out",
            str(tmp_path / "out"),
            "--movie",
            str(tmp_path / "nodir" / "m.gif"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [
        f"meanfield: error: movie path '{tmp_path / 'nodir' / 'm.gif'}' cannot be written "
        "(No such file or directory)"
    ]


# --------------------------------------------------------------------- sweep observables

SWEEP = """
name = "meta"
[model]
kind = "usa"
[grid]
n = [8]
d = 2
beta = [1.0, 3.0]
seeds = 2
[time]
t1 = 12.0
dt = 0.1
save = 25
[output]
observables = ["energy", "clusters", "first_merge_time", "num_plateaus", "final_clusters"]
cluster_threshold = 0.2
"""


@pytest.mark.slow
def test_sweep_metastability_observables(tmp_path):
    from meanfield import sweep

    spec = tmp_path / "meta.toml"
    spec.write_text(SWEEP)
    sweep.run_sweep(spec, tmp_path / "meta.zarr", quiet=True)
    ds = sweep.load(tmp_path / "meta.zarr")
    assert ds["first_merge_time"].dims == ("n", "beta", "seed")
    assert np.all(ds["status"].values == 1)
    for beta in (1.0, 3.0):
        point = ds.sel(n=8, beta=beta, seed=0)
        x0 = mf.sphere.uniform(jax.random.key(0), 8, 2)
        ts = np.linspace(0, 12, 25)
        traj = mf.simulate(
            mf.kernels.USA(beta),
            x0,
            t1=12.0,
            dt=0.1,
            ts=ts,
            observables={"c": lambda x: ms.clusters(x, 0.2).num},
        )
        c = np.asarray(traj.observables["c"])
        np.testing.assert_array_equal(point["clusters"].values, c)
        assert float(point["final_clusters"]) == c[-1]
        merged = np.flatnonzero(c < c[0])
        assert float(point["first_merge_time"]) == (ts[merged[0]] if merged.size else np.inf)
        assert int(point["num_plateaus"]) == len(ms.plateaus(ts, np.asarray(traj.energy)))
    with pytest.raises(ValueError, match="unknown observable 'num_plateaus'"):
        sweep.parse_spec(SWEEP.replace('kind = "usa"', 'kind = "sa"').replace('"energy", ', ""))
