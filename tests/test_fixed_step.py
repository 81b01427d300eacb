"""Issue 46, item 2: one vector field, one step. ``mf.integrate.FixedStep`` is ``mf.simulate``'s
fixed step; the phase diagrams and the random-batch integrator step with it, so their iterates are
simulate's (float64, to rounding) for every solver, scheme and attention kind."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import phase_diagram as pd
from meanfield import random_batch as rb
from meanfield.integrate import FixedStep

MODELS = {
    "usa": (mf.kernels.USA(1.5), None),
    "sa sinkhorn": (mf.models.SelfAttention(2.0, attention="sinkhorn", sinkhorn_iters=5), None),
    "sa hardmax, gaussian weights": (
        mf.models.SelfAttention(2.0, attention="hardmax", weights="gaussian"),
        None,
    ),
    "pre, gaussian weights": (
        mf.models.SelfAttention(1.0, weights="gaussian", normalization="pre"),
        1.5,
    ),
    "mix, switch off the grid": (
        mf.models.SelfAttention(1.0, normalization="mix", switch_time=0.35),
        None,
    ),
    "ngpt": (mf.models.SelfAttention(1.0, normalization="ngpt", alpha=0.3), None),
    "scaling, causal": (
        mf.models.SelfAttention(1.0, normalization="scaling", mask=mf.masks.Causal()),
        None,
    ),
    "euclidean": (mf.models.SelfAttention(1.0, geometry="euclidean"), None),
}


# every model with Euler (the phase diagrams' solver); the higher orders (the random-batch
# integrator's rk2) on the sphere and across Mix-LN's switch, where a stage has a radius too
CASES = [(name, "euler") for name in MODELS] + [
    (name, solver) for name in ("usa", "mix, switch off the grid") for solver in ("rk2", "rk4")
]


@pytest.mark.parametrize("name, solver", CASES)
def test_grid_steps_are_simulates_steps(name, solver, x64):
    model, r0 = MODELS[name]
    x0 = mf.sphere.uniform(jax.random.key(2), 6, 3, jnp.float64)
    h, steps = 0.1, 6
    stepper = FixedStep.of(model, x0, solver=solver, h=h)
    y = stepper.init(x0 if r0 is None else r0 * x0)
    run = jax.jit(lambda y: jax.lax.fori_loop(0, steps, lambda k, y: stepper.grid(k, y), y))
    y = run(y)
    traj = mf.simulate(model, x0, t1=steps * h, dt=h, solver=solver, r0=r0, ts=[0.0, steps * h])
    want = np.asarray(traj.xs[-1])
    got = np.asarray(stepper.directions(y))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert not bool(stepper.failed(y)) and not bool(traj.failed)
    assert np.abs(want - np.asarray(x0)).max() > 1e-3  # the tokens moved


@pytest.mark.parametrize(
    "switch_time, index",
    [(0.35, 3), (0.3, -1), (0.30001, -1), (0.3002, 3), (0.05, 0), (0.00005, -1), (2.55, 25)],
)
def test_split_index_is_the_step_grid_splits(switch_time, index, x64):
    """Mix-LN's step over its switch time (``grid``'s ``lax.cond``) is ``split`` at
    ``split_index()`` and ``whole`` elsewhere (the loop the phase diagrams run): the same steps.
    A switch within ``h / 1000`` of a grid point splits no step."""
    model = mf.models.SelfAttention(1.0, normalization="mix", switch_time=switch_time)
    x0 = mf.sphere.uniform(jax.random.key(3), 5, 3, jnp.float64)
    stepper = FixedStep.of(model, x0, h=0.1)
    k = stepper.split_index(jnp.float64)
    assert int(k) == index
    for j in range(30):
        assert bool(stepper._splits(j, jnp.float64)) == (j == index)
    y0 = stepper.init(x0)
    steps = max(index + 2, 5)
    by_grid = jax.lax.fori_loop(0, steps, lambda j, y: stepper.grid(j, y), y0)
    whole = lambda a, b: lambda y: jax.lax.fori_loop(a, b, lambda j, y: stepper.whole(j, y), y)  # noqa: E731
    if index < 0:
        y = jax.jit(whole(0, steps))(y0)
    else:
        y = jax.jit(lambda y: whole(index + 1, steps)(stepper.split(index, whole(0, index)(y))))(y0)
    # the same steps, compiled in another loop structure: equal to rounding
    np.testing.assert_allclose(np.asarray(y[0]), np.asarray(by_grid[0]), rtol=0, atol=1e-14)
    assert not np.array_equal(np.asarray(y[0]), np.asarray(x0))
    no_switch = FixedStep.of(mf.models.SelfAttention(1.0, normalization="pre"), x0, h=0.1)
    assert no_switch.split_index(jnp.float64) is None


def test_refusals_are_the_rules():
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    model = mf.models.SelfAttention(1.0)
    with pytest.raises(ValueError, match="solver"):
        FixedStep.of(model, x0, solver="tsit5", h=0.1)
    with pytest.raises(ValueError, match="step='renormalize' needs solver='euler'"):
        FixedStep.of(model, x0, solver="rk2", step="renormalize", h=0.1)
    for h in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="h must be"):
            FixedStep.of(model, x0, h=h)
    with pytest.raises(ValueError, match="normalization='pre' has a radius"):
        FixedStep.of(
            mf.models.SelfAttention(1.0, normalization="pre"), x0, step="renormalize", h=0.1
        )


def test_a_failed_system_is_flagged():
    # a non-finite state fails the run, as simulate's failure 1
    model = mf.models.SelfAttention(1.0)
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    stepper = FixedStep.of(model, x0, h=0.1)
    y = stepper.grid(0, stepper.init(x0.at[0, 0].set(jnp.nan)))
    assert bool(stepper.failed(y))
    assert not bool(stepper.failed(stepper.grid(0, stepper.init(x0))))


@pytest.mark.parametrize(
    "scheme",
    [
        dict(normalization="peri"),
        dict(attention="hardmax"),
        dict(weights="gaussian", value="+qk", heads=2, mask=mf.masks.Window(2)),
        dict(normalization="mix", switch_time=0.35),
    ],
)
def test_phase_diagram_systems_are_simulate_runs(scheme, x64):
    """Each seed of ``sa_phase_diagram`` off the fused kernels is ``mf.simulate``'s Euler run of its
    own ``SelfAttention``: fractions at the checkpoints and final states."""
    S, n, d, beta, t1, dt = 3, 5, 3, 2.0, 0.6, 0.1
    x0 = np.asarray(
        jnp.stack([mf.sphere.uniform(jax.random.key(s), n, d, jnp.float64) for s in range(S)])
    )
    out = pd.sa_phase_diagram(
        None, [beta], x0=x0, dt=dt, t1=t1, checkpoints=4, per_seed=True, threshold=0.9, **scheme
    )
    qkv = pd.system_weights(
        np.arange(S),
        d,
        heads=scheme.get("heads", 1),
        weights=scheme.get("weights", "identity"),
        value=scheme.get("value", "identity"),
        dtype=jnp.float64,
    )
    N, h, idx = pd.checkpoint_steps(t1, dt, 4)
    rest = {k: v for k, v in scheme.items() if k not in ("weights", "value", "heads")}
    for s in range(S):
        Q, K, V = (None if M is None else M[s] for M in qkv)
        model = mf.models.SelfAttention(beta, Q, K, V, **rest)
        traj = mf.simulate(model, x0[s], t1=t1, dt=dt, solver="euler", ts=idx * h)
        want = [float(pd.clustering_fraction(x, 0.9)) for x in traj.xs]
        np.testing.assert_array_equal(out.per_seed[0, s], want)
    assert out.per_seed.max() > 0  # pairs cluster: the comparison is not trivial


def test_random_batch_steps_with_the_engine(x64):
    """The random-batch run with one batch of all tokens is simulate's rk2 run, to rounding."""
    n = 8
    x0 = mf.sphere.uniform(jax.random.key(0), n, 3, jnp.float64)
    k = mf.kernels.USA(1.0)
    run = rb.simulate_random_batch(k, x0, key=jax.random.key(1), p=n, t1=1.0, dt=0.1, num_saves=3)
    tr = mf.simulate(k, x0, t1=1.0, dt=0.1, solver="rk2", ts=np.linspace(0, 1, 3))
    np.testing.assert_allclose(run.x_final, tr.xs[-1], rtol=0, atol=1e-13)
    np.testing.assert_allclose(run.collapse_gap, tr.collapse_gap, rtol=1e-12)


@pytest.mark.parametrize("normalized", [True, False])
def test_fused_backend_is_the_engine_step_reordered(normalized, x64):
    """The fused XLA kernel of the identity Post-LN flow and the engine's step of
    ``SelfAttention(beta)``: the same fractions, states within 1e-12 (float64). For USA the fused
    kernel runs the time-rescaled form (weights ``exp(beta (G - 1))``, step ``e^beta h``)."""
    S, n, d, beta, t1, dt = 4, 8, 3, 3.0, 1.0, 0.1
    x0 = jnp.stack([mf.sphere.uniform(jax.random.key(s), n, d, jnp.float64) for s in range(S)])
    N, h, idx = pd.checkpoint_steps(t1, dt, 6)
    common = (x0, np.array([beta]), [h], [N], [idx], 0.99, normalized, False, None)
    fr_fused, xs_fused = pd._sweep(*common, states=True, backend="xla")
    model = mf.models.SelfAttention(beta, normalized=normalized)
    fr_engine, xs_engine = pd._sweep(*common, states=True, systems=pd._Systems(model))
    np.testing.assert_allclose(xs_fused, xs_engine, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(fr_fused, fr_engine)
    assert fr_fused[0, :, -1].max() > 0  # pairs cluster


def test_noisy_grid_steps_are_simulates_noisy_run(x64):
    """``FixedStep.of(noise=, key=, t1=)``: simulate's Stratonovich Heun step on the same Brownian
    tree, so a loop of ``grid`` steps is ``mf.simulate(noise=, key=)`` (float64, to rounding); the
    refusals are simulate's. (The noise's term is the one of simulate for every noise: one of them
    here.)"""
    noise = mf.noise.Independent(0.4)
    x0 = mf.sphere.uniform(jax.random.key(0), 6, 3, jnp.float64)
    model, key, h, t1 = mf.kernels.USA(1.5), jax.random.key(7), 0.125, 1.0
    stepper = FixedStep.of(model, x0, solver="rk2", h=h, noise=noise, key=key, t1=t1)
    y = stepper.init(x0)
    for k in range(8):
        y = stepper.grid(k, y)
    traj = mf.simulate(model, x0, t1=t1, dt=h, noise=noise, key=key)
    np.testing.assert_allclose(y[0], traj.xs[-1], rtol=0, atol=1e-12)
    still = mf.simulate(model, x0, t1=t1, dt=h)
    assert np.abs(np.asarray(y[0]) - np.asarray(still.xs[-1])).max() > 1e-2  # the noise acted
    with pytest.raises(ValueError, match="needs solver='rk2'"):
        FixedStep.of(model, x0, solver="euler", h=h, noise=noise, key=key, t1=t1)
    with pytest.raises(TypeError, match="needs the run's end time t1"):
        FixedStep.of(model, x0, solver="rk2", h=h, noise=noise, key=key)
