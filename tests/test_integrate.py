"""Simulation on (S^{d-1})^n (docs/math/particles.md, Numerics; docs/math/kernels.md): gauge equivalence, long-time laws,
convergence orders, adaptive solvers, early stop, failure flags, compile-once vmaps,
time-rescaled kernels.

Compilation dominates the cost: runs share shapes, t1, dt and ts, and swept parameters
are passed as arrays (traced leaves), so that one compiled program serves many runs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf

K = mf.kernels
TWO_PI = 2.0 * np.pi

N, D, T1, DT = 32, 3, 20.0, 0.1
TS = np.linspace(0.0, T1, 11)


def wavy_gauge(s):
    return mf.sphere.rotation(TWO_PI * s, 3, (0, 1)) @ mf.sphere.rotation(
        0.8 * jnp.sin(2.0 * TWO_PI * s), 3, (1, 2)
    )


def phase(s):
    return 2.0 * TWO_PI * s**2


def prompt_gauges(dtype):
    return jnp.stack(
        [
            mf.sphere.rotation(a, 3, (0, 2)) @ mf.sphere.rotation(2 * a, 3, (0, 1))
            for a in (0.0, 1.0, 2.5)
        ]
    ).astype(dtype)


def gauge_kernels(beta, dtype):
    return {
        "rope": K.RoPE(beta, TWO_PI),
        "phase_field": K.PhaseField(beta, phase),
        "gauge": K.Gauge(beta, wavy_gauge),
        "prompt": K.Prompt(beta, prompt_gauges(dtype)),
    }


def usa_run_in_gauge_frame(kernel, x0, **kw):
    """The USA run from y0_i = Psi(xi_i) x0_i, mapped back by Psi(xi_i)^T (docs/math/kernels.md, Gauge equivalence)."""
    aux = kernel.default_aux(x0.shape[0])
    y0 = kernel.to_gauge_frame(x0, aux)
    traj = mf.simulate(K.USA(kernel.beta), y0, **kw)
    back = jax.vmap(lambda y: kernel.from_gauge_frame(y, aux))(traj.xs)
    return traj, back


# --------------------------------------------------------------------------
# long float32 runs shared by several tests (n = 32, d = 3, beta = 1, t = 20)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs():
    x0 = mf.sphere.uniform(jax.random.key(0), N, D)
    beta = jnp.asarray(1.0, jnp.float32)
    kernels = dict(gauge_kernels(beta, jnp.float32))
    kernels["toeplitz"] = K.Toeplitz()
    kernels["distance_bias"] = K.DistanceBias(beta, jnp.asarray(1.0, jnp.float32))
    out = {}
    for name, kernel in kernels.items():
        out[name] = mf.simulate(kernel, x0, t1=T1, dt=DT, ts=TS)
    for name in gauge_kernels(beta, jnp.float32):
        out["usa_frame:" + name] = usa_run_in_gauge_frame(kernels[name], x0, t1=T1, dt=DT, ts=TS)
    out["kernels"] = kernels
    out["x0"] = x0
    return out


@pytest.mark.parametrize("name", ["rope", "phase_field", "gauge", "prompt"])
def test_gauge_equivalence_float32(runs, name):
    traj = runs[name]
    usa, back = runs["usa_frame:" + name]
    assert not bool(traj.failed) and not bool(usa.failed)
    np.testing.assert_allclose(back, traj.xs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(traj.energy, usa.energy, rtol=1e-5)


def test_saved_trajectory_layout(runs):
    traj = runs["rope"]
    np.testing.assert_allclose(traj.ts, TS, rtol=1e-6)
    assert traj.xs.shape == (len(TS), N, D) and traj.energy.shape == (len(TS),)
    np.testing.assert_allclose(traj.xs[0], runs["x0"], atol=2e-7)  # renormalised on save
    np.testing.assert_allclose(
        traj.collapse_gap, jax.vmap(mf.metrics.collapse_gap)(traj.xs), atol=1e-6
    )
    np.testing.assert_allclose(
        traj.energy, jax.vmap(lambda x: mf.energy(runs["kernels"]["rope"], x))(traj.xs), rtol=1e-6
    )
    assert float(traj.stop_time) == T1 and not bool(traj.stopped)
    assert int(traj.num_steps) == round(T1 / DT)


@pytest.mark.parametrize(
    "name", ["rope", "phase_field", "gauge", "prompt", "toeplitz", "distance_bias"]
)
def test_energy_ascent_and_norms(runs, name):
    traj = runs[name]
    E = np.asarray(traj.energy, np.float64)
    assert np.all(np.diff(E) >= -2e-6 * np.abs(E[1:])), E
    assert E[-1] > E[0]
    norms = np.linalg.norm(np.asarray(traj.xs, np.float64), axis=-1)
    assert np.max(np.abs(norms - 1.0)) < 1e-6


@pytest.mark.parametrize("name", ["rope", "phase_field", "gauge", "prompt"])
def test_maximal_energy_reached(runs, name):
    # E -> e^beta / (2 beta): a Dirac mass in the gauge frame (docs/math/kernels.md, Maximal energy).
    traj = runs[name]
    np.testing.assert_allclose(traj.energy[-1], mf.theory.max_energy(1.0), rtol=1e-5)
    y = runs["kernels"][name].to_gauge_frame(traj.xs[-1], runs["kernels"][name].default_aux(N))
    assert float(mf.metrics.collapse_gap(y)) < 1e-5
    # ... which is non-collapse in the original frame (Fig. 2, 3 of the paper)
    assert float(traj.collapse_gap[-1]) > 0.3


@pytest.mark.parametrize("name", ["rope", "phase_field"])
def test_latitude_circle_d3(runs, name):
    # x(s) = R_{-phi(s)} u: the final configuration lies on the latitude circle at height
    # ||P_{E^perp} u|| (E = span(e_1, e_2)), u the gauge-frame limit point.
    kernel = runs["kernels"][name]
    s = mf.positions(N)
    x = runs[name].xs[-1]
    u = mf.sphere.normalize(jnp.mean(kernel.to_gauge_frame(x, s), axis=0))
    height = float(mf.theory.latitude_height(u))
    assert 0.05 < height < 0.95  # a genuine latitude circle, neither pole nor equator
    np.testing.assert_allclose(np.abs(x[:, 2]), height, atol=1e-5)
    np.testing.assert_allclose(x[:, 2], u[2], atol=1e-5)  # same hemisphere as u
    angles = -TWO_PI * s if name == "rope" else -phase(s)
    circle = jax.vmap(lambda a: mf.sphere.rotation(a, 3) @ u)(angles)
    np.testing.assert_allclose(x, circle, atol=1e-5)


def test_rope_in_d2_reaches_the_great_circle():
    # d = 2: E^perp = {0}, the latitude circle has height 0 -- a uniform great circle in
    # order of the positions, with the maximal energy.
    n = 16
    x0 = mf.sphere.uniform(jax.random.key(15), n, 2)
    traj = mf.simulate(K.RoPE(jnp.asarray(1.0), TWO_PI), x0, t1=T1, dt=DT)
    np.testing.assert_allclose(traj.energy[-1], mf.theory.max_energy(1.0), rtol=1e-5)
    np.testing.assert_allclose(traj.collapse_gap[-1], mf.theory.great_circle_gap(n), atol=1e-4)
    x = np.asarray(traj.xs[-1], np.float64)
    np.testing.assert_allclose(
        np.sum(x * np.roll(x, -1, axis=0), axis=1), np.cos(TWO_PI / n), atol=1e-4
    )


def test_prompt_forms_one_cluster_per_prompt(runs):
    x = runs["prompt"].xs[-1]
    assert int(mf.metrics.num_clusters(x, 0.05)) == 3
    aux = runs["kernels"]["prompt"].default_aux(N)
    G = prompt_gauges(jnp.float32)
    y = runs["kernels"]["prompt"].to_gauge_frame(x, aux)
    u = mf.sphere.normalize(jnp.mean(y, axis=0))
    for k in range(3):
        np.testing.assert_allclose(
            x[np.asarray(aux) == k],
            jnp.broadcast_to(G[k].T @ u, (int(np.sum(np.asarray(aux) == k)), 3)),
            atol=1e-5,
        )


def test_toeplitz_reaches_the_great_circle(runs):
    traj = runs["toeplitz"]
    np.testing.assert_allclose(traj.energy[-1], mf.theory.great_circle_energy(1), atol=1e-4)
    np.testing.assert_allclose(traj.collapse_gap[-1], 1.0 + 1.0 / (N - 1), atol=1e-4)
    np.testing.assert_allclose(traj.collapse_gap[-1], mf.theory.great_circle_gap(N), atol=1e-4)
    assert int(mf.metrics.gram_rank(traj.xs[-1])) == 2
    assert int(mf.metrics.gram_rank(traj.xs[0])) == 3
    # uniformly spaced in the order of the positions: consecutive angles differ by 2 pi / n
    x = np.asarray(traj.xs[-1], np.float64)
    cos = np.sum(x * np.roll(x, -1, axis=0), axis=1)
    np.testing.assert_allclose(cos, np.cos(TWO_PI / N), atol=1e-3)


def test_distance_bias_collapses(runs):
    traj = runs["distance_bias"]
    assert float(traj.collapse_gap[0]) > 0.5
    assert float(traj.collapse_gap[-1]) < 1e-5
    assert int(mf.metrics.num_clusters(traj.xs[-1], 0.01)) == 1
    s = np.arange(1, N + 1) / N
    closed = np.e / (2 * N**2) * np.exp(-np.abs(s[:, None] - s[None, :])).sum()
    np.testing.assert_allclose(traj.energy[-1], closed, rtol=1e-5)


# --------------------------------------------------------------------------
# float64: exact gauge equivalence, convergence orders, adaptive solvers
# --------------------------------------------------------------------------


def test_gauge_equivalence_float64(x64):
    x0 = mf.sphere.uniform(jax.random.key(1), 12, 3, jnp.float64)
    beta = jnp.asarray(2.0)
    kw = dict(t1=2.0, dt=0.05, ts=[0.0, 1.0, 2.0])
    for name, kernel in gauge_kernels(beta, jnp.float64).items():
        traj = mf.simulate(kernel, x0, **kw)
        usa, back = usa_run_in_gauge_frame(kernel, x0, **kw)
        assert traj.xs.dtype == jnp.float64
        np.testing.assert_allclose(back, traj.xs, rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(traj.energy, usa.energy, rtol=1e-12, err_msg=name)


# The float64 runs below share one configuration (RoPE in the plane (1, 2), n = 8, d = 3,
# t1 = 1, default save times) so that equal (solver, dt) pairs reuse one compilation.


def f64_rope(beta=2.0, rescaled=False):
    return K.RoPE(jnp.asarray(beta), jnp.asarray(3.0), plane=(1, 2), rescaled=rescaled)


def f64_x0():
    return mf.sphere.uniform(jax.random.key(3), 8, 3, jnp.float64)


def f64_reference(x0):
    return mf.simulate(f64_rope(), x0, t1=1.0, dt=1.0 / 1024, solver="rk4")


def test_gauge_equivalence_rk4_float64(x64):
    # projected RK4 commutes with rotations as well (docs/math/kernels.md, Gauge equivalence)
    x0 = f64_x0()
    kernel = f64_rope()
    kw = dict(t1=1.0, dt=1.0 / 8, solver="rk4")
    traj = mf.simulate(kernel, x0, **kw)
    _, back = usa_run_in_gauge_frame(kernel, x0, **kw)
    np.testing.assert_allclose(back, traj.xs, rtol=0, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("solver", "order", "coarsest"), [("euler", 1, 32), ("rk2", 2, 8), ("rk4", 4, 8)]
)
def test_convergence_order(solver, order, coarsest, x64):
    # global error at t = 1 against a fine rk4 reference; slope of log err vs log dt.
    # Euler enters its asymptotic regime later (slopes 1.45, 1.12, 0.97 from dt = 1/8, 1/16,
    # 1/32 for these particles): its three steps start at 1/32.
    x0 = f64_x0()
    ref = f64_reference(x0).xs[-1]
    dts = np.array([1, 1 / 2, 1 / 4]) / coarsest
    errs = []
    for dt in dts:
        traj = mf.simulate(f64_rope(), x0, t1=1.0, dt=float(dt), solver=solver)
        errs.append(float(jnp.max(jnp.abs(traj.xs[-1] - ref))))
        np.testing.assert_allclose(np.linalg.norm(traj.xs[-1], axis=1), 1.0, atol=1e-14)
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    assert abs(slope - order) < 0.25, (errs, slope)
    assert errs[-1] > 1e-13  # still above rounding: the fit measured the scheme


@pytest.mark.parametrize("solver", ["tsit5", "dopri5"])
def test_adaptive_solver_agrees_with_fine_rk4(solver, x64):
    x0 = f64_x0()
    ref = f64_reference(x0)
    traj = mf.simulate(f64_rope(), x0, t1=1.0, solver=solver, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(traj.ts, [0.0, 1.0])
    np.testing.assert_allclose(traj.xs, ref.xs, rtol=0, atol=1e-8)
    np.testing.assert_allclose(traj.energy, ref.energy, rtol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(traj.xs, axis=-1), 1.0, atol=1e-12)
    assert not bool(traj.failed) and int(traj.num_steps) > 3


def test_rescaled_run_is_a_time_change_float64(x64):
    # rescaled flow at time s = original flow at t = e^{-beta} s; with dt_s = e^beta dt_t the
    # projected scheme takes identical steps.
    beta = 2.0
    x0 = f64_x0()
    a = mf.simulate(f64_rope(beta), x0, t1=1.0, dt=1.0 / 16)
    s1 = float(K.rescaled_time(1.0, beta))
    b = mf.simulate(
        f64_rope(beta, rescaled=True), x0, t1=s1, dt=float(K.rescaled_time(1.0 / 16, beta))
    )
    np.testing.assert_allclose(K.original_time(b.ts, beta), a.ts, rtol=1e-12)
    np.testing.assert_allclose(b.xs, a.xs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(b.energy, np.exp(-beta) * a.energy, rtol=1e-12)
    assert float(a.collapse_gap[-1]) < float(a.collapse_gap[0])  # the run moved


def test_final_energy_is_differentiable_in_beta(x64):
    # reverse-mode through the projected solver (users differentiate energies, DESIGN.md)
    x0 = f64_x0()

    def final_energy(beta):
        return mf.simulate(f64_rope(beta), x0, t1=1.0, dt=1.0 / 8).energy[-1]

    # one compiled program: its value at the shifted betas gives the central difference
    vg = jax.jit(jax.value_and_grad(final_energy))
    g = vg(jnp.asarray(2.0))[1]
    h = 1e-5
    fd = (vg(jnp.asarray(2.0 + h))[0] - vg(jnp.asarray(2.0 - h))[0]) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-7)
    assert abs(float(g)) > 1e-3


def test_projected_schemes_step_by_step(x64):
    # euler: x <- N(x + h v(x)); rk2 (projected Heun): k1 = v(x), k2 = v(N(x + h k1)),
    # x <- N(x + h/2 (k1 + k2)); N = row normalisation. dt = 0.3 does not divide t1 = 1
    # (last step 0.1), and an off-grid save time 0.45 becomes a step end.
    x0 = mf.sphere.uniform(jax.random.key(12), 6, 3, jnp.float64)
    kernel = K.DistanceBias(jnp.asarray(1.5), jnp.asarray(1.0))

    def v(x):
        return mf.velocity(kernel, x)

    def manual(solver, steps):
        x, out = x0, [x0]
        for h in steps:
            if solver == "euler":
                x = mf.sphere.normalize(x + h * v(x))
            else:
                k1 = v(x)
                k2 = v(mf.sphere.normalize(x + h * k1))
                x = mf.sphere.normalize(x + h / 2 * (k1 + k2))
            out.append(x)
        return out

    steps = [0.3, 0.15, 0.15, 0.3, 0.1]  # grid 0, .3, .45, .6, .9, 1
    for solver in ("euler", "rk2"):
        traj = mf.simulate(kernel, x0, t1=1.0, dt=0.3, solver=solver, ts=[0.45, 1.0])
        ref = manual(solver, steps)
        assert int(traj.num_steps) == len(steps)
        np.testing.assert_allclose(traj.xs[0], ref[2], atol=1e-14)
        np.testing.assert_allclose(traj.xs[1], ref[5], atol=1e-14)


# --------------------------------------------------------------------------
# large beta in float32, early stop, failures, vmap
# --------------------------------------------------------------------------


def test_beta_500_rescaled_float32_collapses():
    beta = 500.0
    x0 = mf.sphere.normalize(
        jnp.array([0.0, 0.0, 1.0]) + 0.02 * jax.random.normal(jax.random.key(6), (16, 3))
    )
    traj = mf.simulate(K.USA(beta, rescaled=True), x0, t1=10.0, dt=0.05, ts=[0.0, 5.0, 10.0])
    assert not bool(traj.failed)
    assert traj.xs.dtype == jnp.float32
    assert float(traj.collapse_gap[0]) > 1e-4
    assert float(traj.collapse_gap[-1]) < 1e-6
    E = np.asarray(traj.energy)
    assert np.all(np.diff(E) >= -1e-6 * E[1:])
    # float32 rounding of <x_i, x_j> near 1 (a few ulp, ~2e-7 for d = 3) moves each weight
    # exp(beta (<x_i, x_j> - 1)) by beta times that: ~1e-4 relative at beta = 500
    np.testing.assert_allclose(E[-1], mf.theory.max_energy(beta, rescaled=True), rtol=1e-4)
    with pytest.raises(ValueError, match="rescaled"):
        mf.simulate(K.USA(beta), x0, t1=1.0)


def test_early_stop_paper_rule():
    # stop at the first window end t (length-1 windows) with |E(t) - E(t-1)| <= tol |E(t)|
    x0 = mf.sphere.uniform(jax.random.key(7), 16, 3)
    kernel = K.USA(jnp.asarray(1.0))
    ts = np.arange(0.0, 31.0)
    full = mf.simulate(kernel, x0, t1=30.0, dt=0.1, ts=ts)
    assert not bool(full.stopped) and float(full.stop_time) == 30.0
    tol = 1e-4
    E = np.asarray(full.energy, np.float64)
    rel = np.abs(np.diff(E)) / np.abs(E[1:])
    k = int(np.argmax(rel <= tol)) + 1
    assert 2 <= k < 25 and rel[k - 2] > 3 * tol  # a clear crossing
    traj = mf.simulate(kernel, x0, t1=30.0, dt=0.1, ts=ts, early_stop=tol)
    assert bool(traj.stopped) and not bool(traj.failed)
    np.testing.assert_allclose(traj.stop_time, k, atol=1e-4)
    # identical up to the stop, then the final state repeats
    np.testing.assert_allclose(traj.xs[: k + 1], full.xs[: k + 1], atol=1e-6)
    np.testing.assert_allclose(traj.xs[k:], jnp.broadcast_to(traj.xs[k], traj.xs[k:].shape), atol=0)
    np.testing.assert_allclose(traj.energy[k:], traj.energy[k], rtol=0)
    assert traj.ts.shape == ts.shape
    # under vmap over seeds every run stops on its own (same answers as unbatched)
    keys = jnp.stack([jax.random.key(7), jax.random.key(3)])
    out = jax.vmap(
        lambda key: mf.simulate(
            kernel, mf.sphere.uniform(key, 16, 3), t1=30.0, dt=0.1, ts=ts, early_stop=tol
        )
    )(keys)
    assert bool(jnp.all(out.stopped)) and float(out.stop_time[0]) == float(traj.stop_time)
    np.testing.assert_allclose(out.xs[0], traj.xs, atol=1e-6)
    assert float(out.stop_time[1]) != float(out.stop_time[0])


def test_nonfinite_state_sets_failed_flag_under_vmap():
    # beta traced under vmap: the trace-time overflow check cannot fire; the run must flag it.
    x0 = mf.sphere.uniform(jax.random.key(8), 8, 3)
    betas = jnp.array([1.0, 200.0], jnp.float32)
    out = jax.vmap(lambda b: mf.simulate(K.USA(b), x0, t1=1.0, dt=0.1, ts=[0.0, 0.5, 1.0]))(betas)
    np.testing.assert_array_equal(out.failed, [False, True])
    assert bool(jnp.all(jnp.isfinite(out.xs[0]))) and float(out.stop_time[0]) == 1.0
    assert float(out.stop_time[1]) < 1.0
    assert not bool(out.stopped[1])
    E = np.asarray(out.energy[0])
    assert np.all(np.diff(E) > 0)
    # same under jit with a traced beta (no vmap)
    run = jax.jit(lambda b: mf.simulate(K.USA(b), x0, t1=1.0, dt=0.1, ts=[0.0, 0.5, 1.0]))
    bad = run(jnp.asarray(200.0))
    assert bool(bad.failed) and bool(jnp.all(jnp.isnan(bad.xs[-1])))
    good = run(jnp.asarray(1.0))
    assert not bool(good.failed)
    np.testing.assert_allclose(good.xs, out.xs[0], atol=1e-6)


def test_vmap_over_seeds_and_beta_compiles_once():
    traces = []

    def first_coordinate(x):
        traces.append(1)  # runs only while tracing
        return x[0, 0]

    def one(key, beta):
        x0 = mf.sphere.uniform(key, 8, 3)
        return mf.simulate(
            K.DistanceBias(beta, 0.5), x0, t1=1.0, dt=0.1, observables={"x00": first_coordinate}
        )

    batched = jax.vmap(jax.vmap(one, in_axes=(0, None)), in_axes=(None, 0))
    a = batched(jax.random.split(jax.random.key(0), 3), jnp.array([1.0, 2.0]))
    n_traces = len(traces)
    assert n_traces > 0
    b = batched(jax.random.split(jax.random.key(1), 3), jnp.array([0.5, 4.0]))
    assert len(traces) == n_traces  # new seeds and betas: no retrace
    assert a.xs.shape == (2, 3, 2, 8, 3)
    assert not bool(jnp.any(b.failed))
    np.testing.assert_array_equal(b.observables["x00"], b.xs[..., 0, 0])
    # a batched entry equals the single run
    key = jax.random.split(jax.random.key(1), 3)[2]
    # (row tiles of 3: block_size is passed through to the field evaluation)
    single = mf.simulate(
        K.DistanceBias(4.0, 0.5), mf.sphere.uniform(key, 8, 3), t1=1.0, dt=0.1, block_size=3
    )
    np.testing.assert_allclose(b.xs[1, 2], single.xs, atol=2e-6)


def test_observables_and_save_states_false():
    x0 = mf.sphere.uniform(jax.random.key(9), 10, 3)
    kernel = K.Toeplitz()
    obs = {"ts": mf.metrics.token_similarity, "mean": lambda x: jnp.mean(x, axis=0)}
    a = mf.simulate(kernel, x0, t1=2.0, dt=0.1, ts=[0.0, 1.0, 2.0], observables=obs)
    np.testing.assert_allclose(
        a.observables["ts"], jax.vmap(mf.metrics.token_similarity)(a.xs), rtol=1e-6
    )
    np.testing.assert_allclose(a.observables["mean"], jnp.mean(a.xs, axis=1), atol=1e-7)
    b = mf.simulate(
        kernel, x0, t1=2.0, dt=0.1, ts=[0.0, 1.0, 2.0], observables=obs, save_states=False
    )
    assert b.xs is None
    np.testing.assert_array_equal(b.energy, a.energy)
    np.testing.assert_array_equal(b.observables["mean"], a.observables["mean"])


def test_self_attention_simulation():
    x0 = mf.sphere.uniform(jax.random.key(11), 10, 3)
    sa = mf.simulate(mf.models.SelfAttention(jnp.asarray(1.0)), x0, t1=10.0, dt=0.1)
    assert sa.energy is None and not bool(sa.failed)
    # the normalised SA flow with identity matrices clusters (Geshkovski et al.)
    assert float(sa.collapse_gap[-1]) < 0.5 * float(sa.collapse_gap[0])
    np.testing.assert_allclose(np.linalg.norm(sa.xs, axis=-1), 1.0, atol=1e-6)
    with pytest.raises(TypeError):
        mf.simulate(mf.models.SelfAttention(1.0), x0, t1=1.0, early_stop=1e-6)


def test_python_float_parameters_do_not_retrace():
    # DESIGN principle 2: a loop over beta given as Python floats must reuse the compiled run
    traces = []

    def obs(x):
        traces.append(1)
        return x[0, 0]

    x0 = mf.sphere.uniform(jax.random.key(13), 5, 3)
    a = mf.simulate(K.USA(1.0), x0, t1=0.3, dt=0.1, observables={"o": obs})
    n_traces = len(traces)
    b = mf.simulate(K.USA(2.0), x0, t1=0.3, dt=0.1, observables={"o": obs})
    assert float(b.energy[0]) != float(a.energy[0])
    assert len(traces) == n_traces
    # default save times: 0 and t1
    np.testing.assert_allclose(b.ts, [0.0, 0.3], rtol=1e-7)
    assert b.xs.shape == (2, 5, 3)


def test_failed_run_fills_nan_after_stop_time():
    # max_steps exhausted: failed, and nothing saved after stop_time may look like a result
    x0 = mf.sphere.uniform(jax.random.key(14), 5, 3)
    traj = mf.simulate(K.USA(jnp.asarray(1.0)), x0, t1=1.0, dt=0.1, max_steps=3)
    assert bool(traj.failed)
    assert float(traj.stop_time) < 1.0
    assert bool(jnp.isnan(traj.energy[-1])) and bool(jnp.all(jnp.isnan(traj.xs[-1])))


def test_traced_step_equals_concrete_step(x64):
    """A traced dt (fixed-step solvers) steps on the same grid k dt merged with the save
    times as a concrete dt: same states to rounding, same step counts, one compilation."""
    x0 = mf.sphere.uniform(jax.random.key(3), 12, 3, jnp.float64)
    K = mf.kernels.RoPE(2.0, 3.0)
    ts = np.linspace(0.0, 1.0, 5)
    traces = []

    @jax.jit
    def run(h):
        traces.append(1)
        return mf.simulate(K, x0, t1=1.0, dt=h, ts=ts, solver="rk4", max_steps=300)

    # (grids of 13, 12 and 15 points: one padded length, so the concrete runs compile once too)
    for dt in (0.1, 0.13, 0.095):
        a = mf.simulate(K, x0, t1=1.0, dt=dt, ts=ts, solver="rk4")
        b = run(jnp.asarray(dt))
        np.testing.assert_allclose(b.xs, a.xs, rtol=0, atol=1e-14)
        assert int(b.num_steps) == int(a.num_steps)
    assert len(traces) == 1
    # vmapped over the step: each member takes its own number of steps
    r = jax.vmap(
        lambda h: mf.simulate(
            K, x0, t1=1.0, dt=h, ts=ts, solver="euler", max_steps=300, save_states=False
        )
    )(jnp.array([0.1, 0.05, 0.025]))
    np.testing.assert_array_equal(
        r.num_steps, [12, 20, 40]
    )  # 10 steps + 2 landings on 0.25, 0.75; 20; 40


def test_traced_step_needs_max_steps_and_a_fixed_step_solver():
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    K = mf.kernels.USA(1.0)
    with pytest.raises(ValueError, match="max_steps"):
        jax.jit(lambda h: mf.simulate(K, x0, t1=1.0, dt=h).energy)(0.1)
    with pytest.raises(TypeError, match="fixed-step"):
        jax.jit(
            lambda h: mf.simulate(K, x0, t1=1.0, dt=h, solver="tsit5", rtol=1e-6, atol=1e-8).energy
        )(0.1)


def test_traced_step_many_steps_float32():
    """36 861 float32 steps of h = usa_step_size(9): the traced-step grid keeps its index as
    state, so the step count equals the concrete grid's (uniform points + save landings)."""
    from meanfield.integrate import _step_grid

    x0 = mf.sphere.uniform(jax.random.key(0), 4, 2)
    ts = np.linspace(0.0, 0.25, 26)
    h = float(mf.phase_diagram.usa_step_size(9.0))
    r = jax.jit(
        lambda h: mf.simulate(
            K.USA(9.0, rescaled=True),
            x0,
            t1=0.25,
            dt=h,
            ts=ts,
            solver="euler",
            max_steps=40_000,
            save_states=False,
        )
    )(jnp.float32(h))
    assert not bool(r.failed) and float(r.stop_time) == pytest.approx(0.25)
    assert int(r.num_steps) == len(_step_grid(0.25, h, ts)) - 1 == 36_861 + 24


@pytest.mark.xla_default
def test_non_finite_energy_or_observable_marks_the_run_failed():
    """Issue 17: failed looked only at the state and the collapse gap; beta = 1e-39 (> 0, a
    float32 subnormal) gives E = e^beta / (2 beta) = inf with finite states. Any non-finite
    saved value fails the run; the values are kept as computed (the run is not stopped)."""
    x0 = mf.sphere.uniform(jax.random.key(16), 6, 3)
    run = jax.jit(lambda b: mf.simulate(K.USA(b), x0, t1=0.3, dt=0.1, ts=[0.0, 0.1, 0.3]))
    bad = run(jnp.float32(1e-39))
    assert bool(bad.failed) and not bool(bad.stopped)
    assert bool(jnp.all(jnp.isinf(bad.energy))) and bool(jnp.all(jnp.isfinite(bad.xs)))
    assert float(bad.stop_time) == pytest.approx(0.3)
    assert not bool(run(jnp.float32(1.0)).failed)
    # an observable that goes non-finite at one save only, under vmap: per-run flags
    obs = {"spike": lambda x: jnp.where(x[0, 0] > 2.0, jnp.inf, x[0, 0])}

    def one(scale):
        spike = {"spike": lambda x: jnp.log(scale * x[0, 0] ** 2)}  # log 0 = -inf when scale = 0
        return mf.simulate(K.USA(1.0), x0, t1=0.3, dt=0.1, observables={**obs, **spike})

    out = jax.vmap(one)(jnp.array([1.0, 0.0]))
    np.testing.assert_array_equal(out.failed, [False, True])
    assert bool(jnp.all(jnp.isneginf(out.observables["spike"][1])))
    np.testing.assert_array_equal(out.xs[0], out.xs[1])  # the states themselves are the same
