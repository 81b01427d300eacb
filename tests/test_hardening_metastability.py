"""Issue 47, items 7-9: the long-time studies refuse what they cannot hold, check their arguments,
and count plateaus by metastable stage (mf.metastability, mf.random_batch, mf.analysis)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meanfield as mf
from meanfield import _machine, analysis, random_batch
from meanfield import metastability as ms
from meanfield._machine import ResourceLimitError

_USA = mf.kernels.USA(1.0, rescaled=True)
_X2 = np.array([[1.0, 0.0], [0.0, 1.0]])


def _circle(th):
    th = np.asarray(th, float)
    return np.stack([np.cos(th), np.sin(th)], axis=1)


def _one_line(err):
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------- item 7: memory guards


@pytest.mark.parametrize(
    "call, names",
    [
        (
            lambda: ms.simulate_long(_USA, _X2, t1=10.0, rtol=1e-3, atol=1e-5, num_saves=10**12),
            ("num_saves = 1000000000000", "save_states=False"),
        ),
        (
            lambda: ms.simulate_long(
                _USA, _X2, t1=10.0, rtol=1e-3, atol=1e-5, num_saves=10**12, save_states=False
            ),
            ("num_saves = 1000000000000",),
        ),
        (lambda: ms.log_time_grid(10.0, 10**13), ("num = 10000000000000",)),
        (lambda: ms.staircase(np.ones(10**6), np.zeros(10**6)), ("1000000 clusters",)),
    ],
)
def test_counts_past_memory_are_refused_before_allocating(call, names):
    # the 22 GB simulate_long of the audit: refused at once, one line naming the argument, the
    # estimate and the machine's limit (nothing of that size is allocated first)
    with pytest.raises(ResourceLimitError) as err:
        call()
    msg = _one_line(err)
    assert isinstance(err.value, ValueError)
    assert "of memory, more than the" in msg and "available" in msg
    for name in names:
        assert name in msg


def test_simulate_long_guard_counts_states_and_observables(monkeypatch):
    # the estimate scales with the saves, the saved states and the observables' sizes: under a
    # 1 MiB limit 4000 saves of 2 x 2 states are refused, without the states they fit
    monkeypatch.setattr(_machine, "machine_memory", lambda: 2**20)
    kw = dict(t1=10.0, rtol=1e-3, atol=1e-5, num_saves=4000)
    x = jnp.asarray(_circle(np.linspace(0.0, 1.0, 32)))
    with pytest.raises(ResourceLimitError, match=r"simulate_long with num_saves = 4000 \(n = 32"):
        ms.simulate_long(_USA, x, **kw)
    ms._check_long_memory(x, {}, 4000, "num_saves", False, None)  # fits: no error
    big = {"labels": ms.cluster_labels(0.1)}
    with pytest.raises(ResourceLimitError, match="35 numbers a save"):
        ms._check_long_memory(x, big, 4000, "num_saves", False, None)
    with pytest.raises(ResourceLimitError, match="simulate_long with 4000 log_ts"):
        ms.simulate_long(_USA, x, log_t1=2.0, log_ts=np.linspace(-3, 2, 4000), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize(
    "call, name",
    [
        (
            lambda: random_batch.simulate_random_batch(
                _USA, _X2, key=jax.random.key(0), p=1, mode="sample", t1=1.0, dt=1e-12, num_saves=2
            ),
            "round(t1/dt)",
        ),
        (
            lambda: random_batch.simulate_random_batch(
                _USA,
                _X2,
                key=jax.random.key(0),
                p=10**12,
                mode="sample",
                t1=1.0,
                dt=0.5,
                num_saves=3,
            ),
            "p = 1000000000000",
        ),
        (
            lambda: random_batch.random_batch_field(
                _USA, _X2, key=jax.random.key(0), p=10**12, mode="sample"
            ),
            "p = 1000000000000",
        ),
        (
            lambda: random_batch.field_errors(
                _USA, _X2, key=jax.random.key(0), ps=[2], num_draws=10**12
            ),
            "num_draws = 1000000000000",
        ),
        (lambda: analysis.cluster_state(10**13, 1), "n = 10000000000000"),
        (
            lambda: random_batch.meanfield_distances(
                _USA,
                lambda k, m: mf.sphere.uniform(k, m, 2),
                [10**9],
                key=jax.random.key(0),
                ts=[0.0, 1.0],
            ),
            "n = 1000000000",
        ),
    ],
)
def test_random_batch_and_analysis_counts_past_memory_are_refused(call, name):
    with pytest.raises(ResourceLimitError) as err:
        call()
    msg = _one_line(err)
    assert name in msg and "of memory, more than the" in msg


def test_tangent_hessian_past_memory_is_refused(monkeypatch):
    # the (n d)^2 Hessian: refused from the state's size (n = 128, d = 3 under a 1 MiB limit)
    monkeypatch.setattr(_machine, "machine_memory", lambda: 2**20)
    x = mf.sphere.uniform(jax.random.key(0), 128, 3)
    with pytest.raises(ResourceLimitError, match=r"tangent Hessian of n = 128, d = 3"):
        analysis.tangent_hessian(_USA, x)
    with pytest.raises(ResourceLimitError, match="tangent Hessian"):
        analysis.classify_state(_USA, x)


# --------------------------------------------------------------------- item 8: arguments


@pytest.mark.parametrize(
    "ts, num, exc, match",
    [
        ([0.0, 1.0], [2, np.nan], ValueError, r"num must be cluster counts .* got nan at save 1"),
        ([0.0, 1.0], [2, 1.5], ValueError, r"num must be cluster counts .* got 1.5"),
        ([0.0, 1.0], [2, -1], ValueError, r"num must be cluster counts"),
        ([0.0, 1.0], [2, 1, 1], ValueError, r"num must have the shape of ts \(2,\)"),
        ([1.0, 0.0], [2, 1], ValueError, r"ts must be strictly increasing, got 1.0 then 0.0"),
        ([0.0, 0.0], [2, 1], ValueError, r"ts must be strictly increasing"),
        ([0.0, np.inf], [2, 1], ValueError, r"ts must be finite"),
        ([0.0, np.nan], [2, 1], ValueError, r"ts must be finite"),
        (np.zeros((2, 2)), np.zeros((2, 2)), ValueError, r"ts must be a non-empty 1-d array"),
        ([], [], ValueError, r"ts must be a non-empty 1-d array"),
        ("ab", [2, 1], TypeError, r"ts must be an array of real numbers"),
        ([0.0, 1.0], [True, False], TypeError, r"num must be an array of real numbers"),
        ([0.0, 1.0], ["3", "2"], TypeError, r"num must be an array of real numbers"),
    ],
)
def test_first_merge_time_refuses_bad_arguments(ts, num, exc, match):
    with pytest.raises(exc, match=match) as err:
        ms.first_merge_time(ts, num)
    _one_line(err)


@settings(max_examples=15, deadline=None)
@given(
    counts=st.lists(st.integers(1, 9), min_size=8, max_size=8),  # one shape: one compilation
    gaps=st.lists(st.floats(0.01, 10.0), min_size=8, max_size=8),
    log_grid=st.booleans(),
)
def test_first_merge_time_valid_arguments(counts, gaps, log_grid):
    # valid counts on any strictly increasing grid (a log grid may start at -inf): the first save
    # with fewer clusters than at the first save, else inf; the same under jit (no value checks)
    ts = np.cumsum(gaps[: len(counts)])
    if log_grid:
        ts = np.r_[-np.inf, ts[1:]]
    drop = [k for k, c in enumerate(counts) if c < counts[0]]
    want = ts[drop[0]] if drop else math.inf
    got = float(ms.first_merge_time(ts, counts))
    assert got == pytest.approx(want, rel=1e-6) or got == want
    jitted = float(jax.jit(ms.first_merge_time)(jnp.asarray(ts), jnp.asarray(counts)))
    assert jitted == got


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: ms.clusters("abc"), TypeError, "x must be an array of real numbers"),
        (
            lambda: ms.clusters(np.array([[np.nan, 0.0], [1.0, 0.0]])),
            ValueError,
            "x must be finite",
        ),
        (lambda: ms.cluster_labels(0.1, block_size=0), ValueError, "block_size must be >= 1"),
        (
            lambda: ms.cluster_labels(0.1, block_size="a"),
            TypeError,
            "block_size must be an integer",
        ),
        (
            lambda: ms.merge_events(([1.0, 0.0], np.stack([_X2, _X2]))),
            ValueError,
            "ts must be strictly increasing",
        ),
        (
            lambda: ms.merge_events(([0.0, 1.0], np.stack([_X2, _X2])), block_size=0),
            ValueError,
            "block_size must be >= 1",
        ),
        (
            lambda: ms.merge_events((["a", "b"], np.stack([_X2, _X2]))),
            TypeError,
            "ts must be an array of real numbers",
        ),
        (lambda: ms.plateaus([0.0], [1.0, 2.0]), ValueError, r"ts must have shape \(2,\)"),
        (lambda: ms.plateaus([1.0, 0.0], [1.0, 2.0]), ValueError, "ts must be strictly increasing"),
        (
            lambda: ms.plateaus([0, 1], [1, 2], rate_tol=2),
            ValueError,
            r"rate_tol must be a fraction",
        ),
        (
            lambda: ms.plateaus([0, 1], [1, 2], rel_tol=1.0),
            ValueError,
            r"rel_tol must be a fraction",
        ),
        (lambda: ms.plateaus([0, 1], ["a", "b"]), TypeError, "energy must be an array of real"),
        (lambda: ms.num_plateaus([1.0, np.nan]), ValueError, "energy must be finite"),
        (lambda: ms.staircase("ab"), TypeError, "weights must be an array of real numbers"),
        (lambda: ms.staircase([1, 1], ["a", "b"]), TypeError, "positions must be an array"),
        (
            lambda: ms.two_cluster_merge_time(0.5, 0.5, 1.0, 1.0, rescaled="yes"),
            TypeError,
            "rescaled must be True or False",
        ),
        (
            lambda: ms.two_cluster_merge_time(0.5, 0.5, 1.0, 1.0, log=1),
            TypeError,
            "log must be True or False",
        ),
        (lambda: ms.normalized_energy("a", 1.0), TypeError, "energy must be an array of real"),
        (lambda: ms.normalized_energy(1.0, -1.0), ValueError, "beta must be > 0"),
        (lambda: ms.normalized_energy(1.0, 1.0, rescaled="no"), TypeError, "rescaled must be"),
        (
            lambda: ms.simulate_long(_USA, _X2, t1=10.0, rtol=1e-3, atol=1e-5, ts=["a"]),
            TypeError,
            "ts must be an array of real numbers",
        ),
        (
            lambda: ms.simulate_long(_USA, _X2, t1=10.0, rtol=1e-3, atol=1e-5, save_states="no"),
            TypeError,
            "save_states must be True or False",
        ),
        (
            lambda: ms.simulate_long(_USA, _X2, t1=10.0, rtol=1e-3, atol=1e-5, observables=[1]),
            TypeError,
            "observables must be a dict",
        ),
    ],
)
def test_metastability_arguments_get_one_clear_error(call, exc, match):
    with pytest.raises(exc, match=match) as err:
        call()
    _one_line(err)


def test_plateaus_accept_a_log_grid_from_t_zero():
    # simulate_long's observables["log_t"] starts at -inf (t = 0): a valid time axis
    lt = np.r_[-np.inf, np.linspace(-3.0, 3.0, 9)]
    E = np.r_[np.full(5, 0.2), np.full(5, 0.6)]
    p = ms.plateaus(lt, E)
    assert p.start.tolist() == [-np.inf, lt[5]] and p.level.tolist() == [0.2, 0.6]


# --------------------------------------------------------------------- item 9: plateaus


@st.composite
def _staircase_traces(draw):
    """A trace of K plateaus with drift and noise, joined by jumps over 1-3 saves, and the true
    (start, end) save indices and levels."""
    K = draw(st.integers(2, 5))  # one noisy plateau alone has no scale: its noise is its jumps
    jumps = [draw(st.floats(0.1, 1.0)) for _ in range(K - 1)]
    jmin = min(jumps, default=1.0)
    lengths = [draw(st.integers(3, 30)) for _ in range(K)]
    ramps = [draw(st.integers(1, 3)) for _ in range(K - 1)]
    drift = draw(st.floats(-0.002, 0.002)) * jmin  # per save, either sign
    noise = draw(st.floats(0.0, 0.001)) * jmin
    seed = draw(st.integers(0, 2**31 - 1))
    spike = draw(st.booleans())
    rng = np.random.default_rng(seed)
    E, bounds, levels, level = [], [], [], 0.0
    for k in range(K):
        a = len(E)
        seg = level + drift * np.arange(lengths[k])
        E.extend(seg)
        bounds.append((a, len(E) - 1))
        levels.append(seg)
        if k < K - 1:
            top = seg[-1] + jumps[k]
            E.extend(seg[-1] + jumps[k] * np.arange(1, ramps[k]) / ramps[k])
            level = top
    E = np.asarray(E) + noise * rng.uniform(-1.0, 1.0, len(E))
    long_ = [k for k in range(K) if lengths[k] >= 7]
    if spike and long_:
        # one save of a plateau knocked off its level by half the level band: the plateau stays one
        k = long_[0]
        a, b = bounds[k]
        E[(a + b) // 2] += 0.5 * 0.02 * (E.max() - E.min())
    return E, bounds, levels


@settings(max_examples=20, deadline=None)
@given(trace=_staircase_traces(), log_grid=st.booleans())
def test_plateaus_count_the_stages_of_a_noisy_staircase(trace, log_grid):
    E, bounds, levels = trace
    T = E.size
    t = np.geomspace(1e-2, 1e6, T) if log_grid else np.arange(T, dtype=float)
    p = ms.plateaus(t, E)
    assert len(p) == len(bounds)
    assert p.start.tolist() == [t[a] for a, _ in bounds]
    assert p.end.tolist() == [t[b] for _, b in bounds]
    for lv, seg in zip(p.level, levels):
        assert seg.min() - 0.02 <= lv <= seg.max() + 0.02
    E32 = E.astype(np.float32)
    assert len(ms.plateaus(t, E32)) == len(bounds)


def test_plateaus_drift_ramp_and_flat():
    # a slow drift far past the level band is one plateau; a constant rate has none; a
    # constant curve is one
    t = np.arange(400.0)
    drift = np.r_[np.linspace(0.0, 0.3, 200), np.linspace(1.0, 1.2, 200)]
    assert len(ms.plateaus(t, drift)) == 2
    assert len(ms.plateaus(t, 0.01 * t)) == 0
    assert len(ms.plateaus(t, np.ones(400))) == 1


def test_num_plateaus_jit_and_vmap_match_plateaus():
    t = np.arange(60.0)
    Es = np.stack(
        [
            np.repeat([0.1, 0.4, 0.9], 20),
            np.repeat([0.1, 0.9], 30) + 1e-4 * np.sin(t),
            np.linspace(0.0, 1.0, 60),
        ]
    )
    counts = jax.jit(jax.vmap(ms.num_plateaus))(jnp.asarray(Es, jnp.float32))
    assert counts.tolist() == [len(ms.plateaus(t, E)) for E in Es] == [3, 2, 0]


@pytest.mark.slow
def test_plateaus_of_a_moderate_beta_run_on_the_circle():
    # the audit's case: n = 64 on the circle at beta = 9 (rescaled USA) from random angles; the
    # former rule counted 11 plateaus, mostly the slow merges of the transient. The cluster count
    # sits at 8, then 4, then 3 (887 of 1001 saves): three metastable stages, each one plateau
    th = np.asarray(jax.random.uniform(jax.random.key(2), (64,), minval=0, maxval=2 * np.pi))
    x0 = jnp.asarray(_circle(th), jnp.float32)
    ts = np.linspace(0, 1000.0, 1001)
    obs = {"nc": lambda x: ms.clusters(x, 0.1).num}
    traj = mf.simulate(
        mf.kernels.USA(9.0, rescaled=True), x0, t1=1000.0, dt=0.1, ts=ts, observables=obs
    )
    E, nc = np.asarray(traj.energy), np.asarray(traj.observables["nc"]).astype(int)
    p = ms.plateaus(ts, E)
    assert len(p) == 3 == int(ms.num_plateaus(traj.energy))
    stage = [int(nc[np.searchsorted(ts, 0.5 * (a + b))]) for a, b in zip(p.start, p.end)]
    assert stage == [8, 4, 3]
    assert p.end[-1] == ts[-1] and np.all(np.diff(p.level) > 0)


_K = mf.kernels.USA(1.0)
_X8 = mf.sphere.uniform(jax.random.key(0), 8, 3)
_KEY = jax.random.key(0)


def _init(k, m):
    return mf.sphere.uniform(k, m, 3)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (
            lambda: random_batch.field_errors(_K, _X8, key=_KEY, ps="24"),
            TypeError,
            "ps must be a list",
        ),
        (lambda: random_batch.field_errors(_K, _X8, key=_KEY, ps=[]), ValueError, "ps must hold"),
        (
            lambda: random_batch.field_errors(_K, _X8, key=_KEY, ps=[2], num_draws=0),
            ValueError,
            "num_draws must be >= 1",
        ),
        (
            lambda: random_batch.simulate_random_batch(
                _K, _X8, key=_KEY, p=2, t1=1.0, dt=0.1, observables=[1]
            ),
            TypeError,
            "observables must be a dict",
        ),
        (
            lambda: random_batch.meanfield_distances(_K, _init, [4.0], key=_KEY, ts=[0.0]),
            TypeError,
            "n must be an integer",
        ),
        (
            lambda: random_batch.meanfield_distances(_K, _init, [4], key=_KEY, ts=[1.0, 0.0]),
            ValueError,
            "ts must be finite, >= 0 and increasing",
        ),
        (
            lambda: random_batch.meanfield_distances(_K, 3, [4], key=_KEY, ts=[0.0]),
            TypeError,
            "sample_init must be a callable",
        ),
        (
            lambda: random_batch.meanfield_distances(_K, _init, [4], key=_KEY, ts=[0.0], repeats=0),
            ValueError,
            "repeats must be >= 1",
        ),
        (
            lambda: random_batch.fit_rate([1, 2], [1.0, -1.0]),
            ValueError,
            "dist must be finite and > 0",
        ),
        (lambda: random_batch.fit_rate([1], [1.0]), ValueError, "at least 2 entries"),
        (lambda: random_batch.fit_rate([2, 2], [1.0, 2.0]), ValueError, "two distinct"),
        (lambda: random_batch.fit_rate("ab", [1.0, 2.0]), TypeError, "ns must be an array of real"),
        (lambda: analysis.cluster_state(6.0, 2), TypeError, "n must be an integer"),
        (lambda: analysis.cluster_state(6, 2, 1), ValueError, "d must be >= 2"),
        (lambda: analysis.cluster_state(6, 2, 3, jnp.int32), TypeError, "dtype must be a floating"),
        (lambda: analysis.collapsed_spectrum(-1.0, 4, 3), ValueError, "beta must be > 0"),
        (lambda: analysis.antipodal_spectrum(1.0, 5, 3), ValueError, "even n"),
        (lambda: analysis.classify(np.ones((2, 3)), num_zero_modes=1), ValueError, "square"),
        (lambda: analysis.classify(np.eye(2), num_zero_modes=-1), ValueError, "num_zero_modes"),
        (lambda: analysis.tangent_hessian(_K, np.ones((2, 3), bool)), TypeError, "real numbers"),
        (lambda: analysis.tangent_hessian(_K, np.ones(3)), ValueError, r"x must be an \(n, d\)"),
        (
            lambda: analysis.tangent_hessian(_K, np.array([[np.nan, 0.0, 1.0]])),
            ValueError,
            "x must be finite",
        ),
        (lambda: analysis.tangent_frame(np.ones(3)), ValueError, r"x must be an \(n, d\)"),
        (
            lambda: analysis.escape_time(_K, _X8, dt=0.1, t_max=1.0, fraction=2.0),
            ValueError,
            r"fraction must be in \(0, 1\)",
        ),
    ],
)
def test_random_batch_and_analysis_arguments_get_one_clear_error(call, exc, match):
    with pytest.raises(exc, match=match) as err:
        call()
    _one_line(err)
