"""Issue 47, the integrator's cases: tokens through the origin (item 5), the memory guard of the
Python API (item 7), a euclidean token at the origin (item 8) and Mix-LN's switch time on the
step grid (item 10). Each ends in a one-line error, a recorded failure or a correct value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meanfield as mf
from meanfield import _resources, cli
from meanfield import integrate as I
from meanfield import phase_diagram as pd

K = mf.kernels


# ------------------------------------------------------------------ item 5: through the origin


@pytest.mark.parametrize("scheme", ["pre", pytest.param("peri", marks=pytest.mark.slow)])
def test_a_token_through_the_origin_is_a_recorded_failure(scheme):
    # the audit's case: gaussian Q, K and V = -Q^T K from r0 = 0.3; a token is driven into the
    # origin (radii reached 5e-4, directions flipped 25 times between saves, failed False)
    model = mf.models.SelfAttention(1.0, weights="gaussian", value="-qk", normalization=scheme)
    x0 = mf.sphere.uniform(jax.random.key(0), 16, 3)
    ts = np.linspace(0.0, 2.0, 21)
    traj = mf.simulate(model, x0, t1=2.0, dt=0.01, ts=ts, r0=0.3)
    assert bool(traj.failed) and int(traj.failure) == 2
    assert traj.failure_reason() == "token through the origin" == I.FAILURES[2]
    stop = float(traj.stop_time)
    assert 0.0 < stop < 2.0
    before = ts <= stop
    # the run stops there: values up to the stop as computed, after it NaN
    assert np.all(np.isfinite(np.asarray(traj.radius)[before]))
    assert np.all(np.isnan(np.asarray(traj.radius)[~before]))
    # no saved direction flipped before the stop
    xs = np.asarray(traj.xs)[before]
    assert np.all(np.sum(xs[1:] * xs[:-1], axis=-1) > 0)


@settings(max_examples=60, deadline=None)
@given(
    x=st.lists(st.floats(-3, 3), min_size=3, max_size=3),
    dx=st.lists(st.floats(-3, 3), min_size=3, max_size=3),
)
def test_the_origin_rule_flags_every_turn_past_90_degrees_and_no_short_step(x, dx):
    x0 = np.asarray(x, np.float64)[None]
    x1 = x0 + np.asarray(dx, np.float64)[None]
    r0 = float(np.linalg.norm(x0))
    if r0 < 1e-6:
        return
    flagged = bool(I._near_origin(jnp.asarray(x0), jnp.asarray(x1))[0])
    if float(np.sum(x0 * x1)) <= 0:  # the direction turned by 90 degrees or more
        assert flagged
    if np.linalg.norm(dx) < 0.5 * r0:  # a step short against the radius never reaches it
        assert not flagged


@pytest.mark.parametrize(
    "scheme",
    [
        "mix",
        pytest.param("pre", marks=pytest.mark.slow),
        pytest.param("peri", marks=pytest.mark.slow),
    ],
)
def test_runs_that_resolve_the_radius_are_never_flagged(scheme):
    # the schemes' ordinary runs (identity weights, r0 of order 1, dt = 0.1; Mix-LN switching
    # inside the run) for a batch of starts: none is a failure
    model = K.USA(1.0, normalization=scheme, switch_time=0.35) if scheme == "mix" else None
    model = model or mf.models.SelfAttention(2.0, normalization=scheme)

    def run(key, r0):
        return mf.simulate(model, mf.sphere.uniform(key, 8, 3), t1=1.0, dt=0.1, r0=r0)

    keys = jax.random.split(jax.random.key(1), 6)
    traj = jax.vmap(run)(keys, jnp.array([0.5, 1.0, 1.5, 2.0, 3.0, 0.8]))
    assert not np.any(np.asarray(traj.failed))
    assert np.all(np.asarray(traj.failure) == 0)


@pytest.mark.parametrize("r0", [1e-20, 1e20, 0.0, float("inf"), np.array([1.0, 1e-30, 1.0, 1.0])])
def test_r0_the_dtype_cannot_carry_is_one_error(r0):
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    model = mf.models.SelfAttention(1.0, normalization="pre")
    with pytest.raises(
        ValueError, match=r"r0 must be finite and > 0, in \[3\.1e-16, 6\.4e\+15\] for float32"
    ):
        mf.simulate(model, x0, t1=0.2, dt=0.1, r0=r0)


def test_r0_range_follows_the_dtype(x64):
    lo32, hi32 = I.r0_range(np.float32)
    lo64, hi64 = I.r0_range(np.float64)
    assert lo64 < 1e-140 < lo32 < 1e-15 and hi32 < 1e16 < 1e140 < hi64
    # 1e-20 is refused in float32 and runs in float64
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3, jnp.float64)
    traj = mf.simulate(
        mf.models.SelfAttention(1.0, normalization="pre"), x0, t1=0.1, dt=0.1, r0=1e-6
    )
    assert np.all(np.isfinite(np.asarray(traj.radius)))
    with pytest.raises(ValueError, match="float64"):
        mf.simulate(
            mf.models.SelfAttention(1.0, normalization="pre"), x0, t1=0.1, dt=0.1, r0=1e-200
        )


def test_traced_r0_out_of_range_stops_the_program():
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    model = mf.models.SelfAttention(1.0, normalization="pre")
    run = jax.jit(lambda r: mf.simulate(model, x0, t1=0.1, dt=0.1, r0=r).radius)
    assert np.all(np.isfinite(np.asarray(run(jnp.float32(2.0)))))
    with pytest.raises(
        (RuntimeError, ValueError), match=r"r0: every radius must be finite and > 0, in"
    ):
        jax.block_until_ready(run(jnp.float32(1e-18)))


def test_cli_r0_out_of_range_is_one_line(capsys):
    status = cli.main(["simulate", "--kernel", "sa", "--normalization", "pre", "--r0", "1e20",
                       "--n", "4", "--t1", "0.1", "--saves", "2"])  # fmt: skip
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1 and "r0" in lines[0] and "6.4e+15" in lines[0], lines


@pytest.mark.slow
def test_phase_diagram_refuses_r0_and_records_the_origin_as_nan():
    key = jax.random.key(0)
    kw = dict(n=16, d=3, seeds=4, t1=10.0, dt=0.01, checkpoints=3, per_seed=True)
    with pytest.raises(ValueError, match=r"r0 must be finite and > 0, in \[3\.1e-16"):
        pd.sa_phase_diagram(key, [1.0], n=6, d=3, seeds=2, t1=0.5, checkpoints=3,
                            normalization="pre", r0=1e-30)  # fmt: skip
    r = pd.sa_phase_diagram(
        key, [1.0], **kw, normalization="pre", r0=0.3, weights="gaussian", value="-qk"
    )
    failed = np.isnan(r.per_seed[0])
    # the systems whose token went through the origin are NaN at every checkpoint, the others
    # fractions in [0, 1]
    assert np.any(failed) and not np.all(failed)
    assert np.all(failed.all(axis=-1) == failed.any(axis=-1))
    ok = r.per_seed[0][~failed]
    assert np.all((ok >= 0) & (ok <= 1))


# ------------------------------------------------------------------ item 7: the memory guard


def test_simulate_refuses_a_run_past_the_machine_before_allocating():
    x0 = mf.sphere.uniform(jax.random.key(0), 8, 3)
    # 1e12 steps of grid, a 1e6-save trajectory of 3e5 tokens: terabytes, refused in one line
    with pytest.raises(_resources.ResourceLimitError, match=r"simulate needs ~.* of memory"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, dt=1e-12)
    with pytest.raises(_resources.ResourceLimitError, match=r"simulate needs ~.* of memory"):
        mf.simulate(K.USA(1.0), x0, t1=1e9, dt=0.01)
    big = jnp.tile(x0, (40_000, 1))  # 320,000 tokens
    ts = np.linspace(0.0, 1.0, 10**6)
    with pytest.raises(_resources.ResourceLimitError, match="memory") as e:
        mf.simulate(K.USA(1.0), big, t1=1.0, dt=1e-3, ts=ts)
    assert "\n" not in str(e.value)
    # under jit the shapes are concrete: the guard runs at trace time, and a traced dt is
    # counted by its max_steps bound
    with pytest.raises(_resources.ResourceLimitError):
        jax.jit(lambda h: mf.simulate(K.USA(1.0), big, t1=1.0, dt=h, ts=ts, max_steps=10**6).xs)(
            1e-3
        )
    # and a small run traces and runs as before
    assert jax.jit(lambda x: mf.simulate(K.USA(1.0), x, t1=0.2, dt=0.1).xs)(x0).shape == (2, 8, 3)


def test_uniform_saves_problem_is_the_grid_rule_without_the_saves():
    # meanfield simulate --n 8 --t1 0.1 --saves 100000000 (default dt 0.01)
    msg = I.uniform_saves_problem(0.1, 0.01, 10**8)
    assert msg is not None and "100000000 save times" in msg and "dt / 1000" in msg
    assert I.uniform_saves_problem(0.1, 0.01, 101) is None
    # it agrees with step_grid_problem on save grids it can decide
    for t1, dt, saves in ((1.0, 0.01, 100_002), (0.3, 0.05, 7000), (1.0, 0.01, 5000)):
        cheap = I.uniform_saves_problem(t1, dt, saves)
        full = I.step_grid_problem(t1, dt, np.linspace(0.0, t1, saves))
        assert (cheap is None) == (full is None) or cheap is None, (t1, dt, saves)


# ------------------------------------------------------------------ item 8: euclidean origin


def test_a_euclidean_token_at_the_origin_is_not_a_failure():
    x0 = (2.0 * mf.sphere.uniform(jax.random.key(0), 5, 3)).at[0].set(0.0)
    model = mf.models.SelfAttention(1.0, geometry="euclidean")
    traj = mf.simulate(model, x0, t1=0.3, dt=0.1)
    assert not bool(traj.failed) and int(traj.failure) == 0
    assert np.all(np.isfinite(np.asarray(traj.xs)))
    gap = np.asarray(traj.collapse_gap)
    assert np.isnan(gap[0]) and np.isfinite(gap[-1])  # the token moved off the origin
    # a non-finite observable is still a failure, with its reason
    traj = mf.simulate(
        model, x0, t1=0.3, dt=0.1, observables={"bad": lambda x: jnp.log(x[0, 0] - 9.0)}
    )
    assert bool(traj.failed) and traj.failure_reason() == "non-finite saved value"


# ------------------------------------------------------------------ item 10: Mix-LN's switch


def _mix(tau):
    return K.USA(1.0, normalization="mix", switch_time=tau)


def test_mix_switch_on_the_grid_keeps_its_steps_and_numbers():
    x0 = mf.sphere.uniform(jax.random.key(3), 6, 3)
    kw = dict(t1=1.0, dt=0.1, r0=1.5, ts=np.linspace(0.0, 1.0, 11))
    on = mf.simulate(_mix(0.5), x0, **kw)
    assert int(on.num_steps) == 10
    # a switch time within dt / 1000 of the step point 0.5 switches there: the same steps, the
    # same numbers bit for bit (before, 0.5 + 2e-5 switched one step late)
    for tau in (0.5 - 2e-5, 0.5 + 2e-5):
        near = mf.simulate(_mix(tau), x0, **kw)
        assert int(near.num_steps) == 10
        np.testing.assert_array_equal(near.radius, on.radius)
        np.testing.assert_array_equal(near.xs, on.xs)


@pytest.mark.slow
def test_mix_switch_off_the_grid_is_a_step_point(x64):
    # tau = 0.55 between the points of dt = 0.1: the run steps to tau and switches there, so
    # rk2 keeps its order 2 (before: a switch 0.05 late, 3.4e-2 relative radius error at dt = 0.1
    # for every solver; now euler 7e-3, rk2 3.8e-4, rk4 1.3e-6 at dt = 0.1)
    x0 = mf.sphere.uniform(jax.random.key(3), 6, 3, jnp.float64)
    model = _mix(0.55)
    ref = mf.simulate(model, x0, t1=1.0, dt=1.0 / 256, solver="rk4", r0=1.5).radius[-1]

    def err(**kw):
        traj = mf.simulate(model, x0, t1=1.0, r0=1.5, **kw)
        assert not bool(traj.failed)
        return float(jnp.max(jnp.abs(traj.radius[-1] - ref) / ref))

    e1, e2 = err(dt=0.1, solver="rk2"), err(dt=0.05, solver="rk2")
    assert e1 < 1e-3 and 3.0 < e1 / e2 < 5.0
    assert err(dt=0.1, solver="rk4") < 1e-5
    assert err(dt=0.1, solver="euler") < 1e-2
    # 11 steps: the grid's 10 and the one to tau
    assert int(mf.simulate(model, x0, t1=1.0, dt=0.1, r0=1.5).num_steps) == 11
    # an adaptive solver steps up to the jump (before: an FSAL solver carried the Post-LN stage
    # over the switch and failed)
    assert err(solver="tsit5", rtol=1e-8, atol=1e-10) < 1e-6
    # a traced dt (the sweeps' reference step) and a traced tau (a sweep axis) too
    traced = jax.jit(
        lambda h: mf.simulate(model, x0, t1=1.0, dt=h, max_steps=16, r0=1.5).radius[-1]
    )
    np.testing.assert_allclose(
        traced(0.1), mf.simulate(model, x0, t1=1.0, dt=0.1, r0=1.5).radius[-1], rtol=1e-12
    )
    taus = jax.vmap(lambda tau: mf.simulate(_mix(tau), x0, t1=1.0, dt=0.1, r0=1.5).radius[-1])
    np.testing.assert_array_equal(
        taus(jnp.array([0.55]))[0], mf.simulate(model, x0, t1=1.0, dt=0.1, r0=1.5).radius[-1]
    )


def test_phase_diagram_mix_switch_off_the_grid_as_simulate(x64):
    # the diagram's Euler step over tau is two, as simulate's steps: equal to rounding
    x0 = np.asarray(mf.sphere.uniform(jax.random.key(3), 5, 3, jnp.float64))[None]
    N, h, idx = pd.checkpoint_steps(0.6, 0.1, 3)
    scheme = {"normalization": "mix", "switch_time": 0.35}
    attn = pd._Systems(mf.models.SelfAttention(1.5, **scheme))
    _, xs = pd._sweep(
        jnp.asarray(x0), np.array([1.5]), [h], [N], [idx], 0.999, True, False, None,
        states=True, backend="xla", systems=attn,
    )  # fmt: skip
    traj = mf.simulate(mf.models.SelfAttention(1.5, **scheme), jnp.asarray(x0[0]), t1=0.6, dt=0.1,
                       solver="euler", ts=[0.0, 0.6])  # fmt: skip
    np.testing.assert_allclose(xs[0][0], np.asarray(traj.xs[-1]), rtol=0, atol=1e-12)


def test_check_tolerances_is_simulates_rule():
    # an adaptive solver needs both tolerances, positive; a fixed-step solver ignores them; the CLI
    # applies the same rule before its estimate line
    from meanfield.integrate import check_tolerances

    check_tolerances("rk4", None, None)
    check_tolerances("tsit5", 1e-6, 1e-8)
    for rtol, atol in ((None, 1e-8), (1e-6, None)):
        with pytest.raises(ValueError, match="adaptive: give both rtol and atol"):
            check_tolerances("dopri5", rtol, atol)
    with pytest.raises(ValueError, match="atol"):
        check_tolerances("tsit5", 1e-6, -1.0)
