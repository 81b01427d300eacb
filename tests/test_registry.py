"""Core coherence (issue 16): one model registry behind Python, the CLI and sweeps; abstract
bases; parametrised phases and gauges as PyTrees; checks that survive jit and vmap; the
native-kernel choice traced, never a process-wide switch."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import cli

K = mf.kernels

# ---------------------------------------------------------------- the registry


def test_registry_covers_every_model_name():
    builtin = {n for n, e in K.MODELS.items() if e.builtin}
    assert builtin == {
        "usa",
        "distance-bias",
        "toeplitz",
        "rope",
        "phase-field",
        "gauge",
        "prompt",
        "sa",
        "kuramoto",
    }
    # every registered model has dynamics; the attention sweep (one query against uniform keys)
    # is a sweep kind of its own (meanfield.sweep._attention), not a registry entry
    assert K.MODEL_NAMES == tuple(K.MODELS)
    assert all(e.build is not None and e.cls is not None for e in K.MODELS.values())
    for name, entry in K.MODELS.items():
        assert entry.doc and all(p.doc for p in entry.params), name
        for p in entry.params:
            assert p.kind in K.PARAM_KINDS
            assert p.validate(p.default) == p.default  # every default is in its own range


@pytest.mark.parametrize("name", K.MODEL_NAMES)
def test_make_builds_every_model_with_registry_defaults(name):
    model = K.make(name, d=3)
    assert isinstance(model, mf.models.Model)
    assert isinstance(model, K.Kernel) == K.MODELS[name].has_energy
    x = mf.sphere.uniform(jax.random.key(0), 8, 3)
    v = mf.velocity(model, x)
    assert v.shape == (8, 3) and bool(jnp.all(jnp.isfinite(v)))


def test_phase_field_default_is_the_default_phase():
    """One meaning of 'phase-field': phi(s) = 2 pi s + sin(2 pi s) from make, the CLI and sweeps."""
    k = K.make("phase-field")
    s = jnp.linspace(0, 1, 7)
    np.testing.assert_allclose(jax.vmap(k.phase)(s), K.default_phase(s), rtol=1e-6)
    assert isinstance(k.phase, K.FourierPhase)


def test_make_rejects_unknown_names_params_and_bad_values():
    with pytest.raises(ValueError, match=r"unknown model 'nope'.*usa"):
        K.make("nope")
    with pytest.raises(ValueError, match=r"'lam' is not a parameter of model 'usa'.*beta"):
        K.make("usa", lam=1.0)
    with pytest.raises(ValueError, match=r"beta must be > 0, got -1"):
        K.make("rope", beta=-1.0)
    with pytest.raises(TypeError, match=r"beta must be a number, got '1'"):
        K.make("usa", beta="1")
    with pytest.raises(ValueError, match=r"model 'gauge' needs d=3, got d=4"):
        K.make("gauge", d=4)
    with pytest.raises(ValueError, match=r"gauges must be one of 'random', 'rotation', got 'x'"):
        K.make("prompt", gauges="x")
    with pytest.raises(
        ValueError, match=r"unknown model 'attention'; accepted: usa, .*sa, kuramoto$"
    ):
        K.make("attention")


def test_prompt_gauges_same_in_float32_and_float64():
    G32 = np.asarray(K.make("prompt", gauge_seed=5).gauges)
    with jax.enable_x64(True):
        G64 = np.asarray(K.make("prompt", gauge_seed=5, dtype=jnp.float64).gauges)
    assert G64.dtype == np.float64
    np.testing.assert_allclose(G64, G32, atol=1e-6)
    np.testing.assert_allclose(
        np.swapaxes(G64, -1, -2) @ G64, np.broadcast_to(np.eye(3), G64.shape), atol=1e-13
    )


def _simulate_cli(tmp_path, name, params, *, n, seed, t1, dt, saves):
    flags = []
    for k, v in params.items():
        flags += [f"--{k.replace('_', '-')}", str(v)]
    out = tmp_path / f"cli-{name}"
    argv = [
        "simulate",
        "--kernel",
        name,
        "--n",
        str(n),
        "--d",
        "3",
        *flags,
        "--t1",
        str(t1),
        "--dt",
        str(dt),
        "--saves",
        str(saves),
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    return mf.sweep.load(out)  # the run's store, run.zarr


# parameters away from the defaults, where the model has them
CLI_PARAMS = {
    "usa": {"beta": 1.5},
    "distance-bias": {"beta": 1.5, "lam": 0.5},
    "toeplitz": {"m": 2},
    "rope": {"beta": 1.5, "omega": 3.0},
    "phase-field": {"beta": 1.5, "amplitude": 0.5},
    "gauge": {"beta": 1.5, "amplitude": 0.4},
    "prompt": {"beta": 1.5, "prompts": 2, "gauge_seed": 3},
    "sa": {"beta": 1.5},
    "kuramoto": {"coupling": 1.5},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", K.MODEL_NAMES)
def test_cli_sweep_and_python_give_the_same_numbers(name, tmp_path):
    """`meanfield simulate --kernel K`, a one-point sweep of kind K and mf.simulate(make(K)) agree."""
    from meanfield import sweep

    assert set(CLI_PARAMS) == {n for n in K.MODEL_NAMES if K.MODELS[n].builtin}
    params = CLI_PARAMS[name]
    n, seed, t1, dt, saves = 12, 3, 0.6, 0.05, 7
    got = _simulate_cli(tmp_path, name, params, n=n, seed=seed, t1=t1, dt=dt, saves=saves)

    model_keys = "\n".join(f"{k} = {json.dumps(v)}" for k, v in params.items() if k != "beta")
    beta = f"beta = [{params['beta']}]" if "beta" in params else ""
    observables = '["collapse_gap", "energy"]' if K.MODELS[name].has_energy else '["collapse_gap"]'
    spec = (
        f'name = "one"\n[model]\nkind = "{name}"\n{model_keys}\n[grid]\nn = [{n}]\nd = 3\n{beta}\n'
        f"seeds = 1\nseed = {seed}\n[time]\nt1 = {t1}\ndt = {dt}\nsave = {saves}\n"
        f"[output]\nobservables = {observables}\n"
    )
    store = tmp_path / f"{name}.zarr"
    sweep.run_sweep(spec, store, quiet=True)
    ds = sweep.load(store)

    model = K.make(name, d=3, **params)
    traj = mf.simulate(
        model,
        mf.sphere.uniform(jax.random.key(seed), n, 3),
        t1=t1,
        dt=dt,
        ts=np.linspace(0, t1, saves),
    )

    tol = dict(rtol=2e-5, atol=2e-6)  # float32 rounding (vmapped vs single system)
    G_sweep = np.asarray(ds["collapse_gap"].values).reshape(-1, saves)[0]
    np.testing.assert_allclose(got["collapse_gap"].values, np.asarray(traj.collapse_gap), **tol)
    np.testing.assert_allclose(G_sweep, np.asarray(traj.collapse_gap), **tol)
    if K.MODELS[name].has_energy:
        E_sweep = np.asarray(ds["energy"].values).reshape(-1, saves)[0]
        np.testing.assert_allclose(got["energy"].values, np.asarray(traj.energy), **tol)
        np.testing.assert_allclose(E_sweep, np.asarray(traj.energy), **tol)
    assert (
        np.ptp(np.asarray(traj.collapse_gap)) > 0
    )  # the flow moved: the comparison is not vacuous


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--kernel", "usa", "--lam", "0.5"], "--lam is not a parameter of --kernel usa"),
        (["--kernel", "toeplitz", "--beta", "2"], "--beta is not a parameter of --kernel toeplitz"),
        (["--kernel", "rope", "--omega", "inf"], "--omega"),
        (["--kernel", "prompt", "--gauges", "wavy"], "--gauges"),
        (["--kernel", "phase-field", "--plane", "0,0"], "--plane"),
    ],
)
def test_cli_model_flags_come_from_the_registry(argv, needle, tmp_path, capsys):
    assert cli.main(["simulate", *argv, "--out", str(tmp_path)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and needle in err[0], err


# ---------------------------------------------------------------- abstract bases


def test_bases_are_abstract():
    with pytest.raises(TypeError):
        mf.models.Model()
    with pytest.raises(TypeError):
        K.Kernel()

    class NoGauge(K.GaugeKernel):
        pass

    with pytest.raises(TypeError):
        NoGauge(1.0)


def test_new_gauge_kernel_is_one_method_and_gets_the_gauge_frame_path():
    class Reflect(K.GaugeKernel):
        """Psi(s) = a reflection of e_1 for s > 1/2, else the identity."""

        def gauge_matrix(self, label, d):
            return jnp.diag(jnp.ones(d).at[0].set(jnp.where(label > 0.5, -1.0, 1.0)))

    k = Reflect(1.3)
    x = mf.sphere.uniform(jax.random.key(1), 10, 3)
    np.testing.assert_allclose(
        mf.field(k, x), mf.field(k, x, method="pairwise"), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(mf.energy(k, x), mf.energy(k, x, method="pairwise"), rtol=1e-5)
    # the maximiser of a gauge kernel: x_i = Psi_i^T u, E = e^beta / (2 beta)
    s = mf.positions(10)
    xm = k.from_gauge_frame(jnp.tile(jnp.array([1.0, 0.0, 0.0]), (10, 1)), s)
    np.testing.assert_allclose(mf.energy(k, xm), mf.theory.max_energy(1.3), rtol=1e-6)


def test_simulate_dispatches_on_types():
    class NotAModel(eqx.Module):
        def field(self, x, aux, *, block_size=None):
            return x

    x0 = mf.sphere.uniform(jax.random.key(0), 6, 3)
    with pytest.raises(TypeError, match="mf.models.Model"):
        mf.simulate(NotAModel(), x0, t1=0.1)
    traj = mf.simulate(mf.models.SelfAttention(1.0), x0, t1=0.1, dt=0.05)
    assert traj.energy is None  # no pair energy: dispatched on the type


# ---------------------------------------------------------------- PyTree phases and gauges


def test_fourier_phase_sweep_traces_once():
    x0 = mf.sphere.uniform(jax.random.key(0), 8, 3)
    traces = []

    @jax.jit
    def final_energy(omega, amplitude):
        traces.append(1)
        k = K.PhaseField(1.0, K.FourierPhase(omega, amplitude))
        return mf.simulate(k, x0, t1=0.2, dt=0.05, save_states=False).energy[-1]

    values = [final_energy(2 * np.pi, a) for a in (0.0, 0.3, 0.7, 1.0)]
    assert len(traces) == 1
    assert len({float(v) for v in values}) == 4  # the amplitude reaches the program
    k = K.PhaseField(1.0, K.FourierPhase(2 * np.pi, 0.7))
    ref = mf.simulate(k, x0, t1=0.2, dt=0.05).energy[-1]
    np.testing.assert_allclose(values[2], ref, rtol=1e-6)


def test_wavy_gauge_sweep_traces_once():
    x = mf.sphere.uniform(jax.random.key(0), 8, 3)
    traces = []

    @jax.jit
    def energy(amplitude):
        traces.append(1)
        return mf.energy(K.Gauge(1.0, K.WavyGauge(amplitude, 3)), x)

    values = [energy(a) for a in (0.1, 0.4, 0.6)]
    assert len(traces) == 1
    np.testing.assert_allclose(
        values[2], mf.energy(K.Gauge(1.0, K.wavy_gauge(0.6, 3)), x, method="pairwise"), rtol=1e-5
    )
    batched = jax.vmap(energy)(jnp.array([0.1, 0.4, 0.6]))
    np.testing.assert_allclose(batched, jnp.stack(values), rtol=1e-5)


def test_plain_callable_phase_still_works():
    k = K.PhaseField(1.0, lambda s: 2 * jnp.pi * s + jnp.sin(2 * jnp.pi * s))
    x = mf.sphere.uniform(jax.random.key(0), 8, 3)
    np.testing.assert_allclose(mf.energy(k, x), mf.energy(K.make("phase-field"), x), rtol=1e-6)
    with pytest.raises(TypeError, match="phase must be a callable"):
        K.PhaseField(1.0, 3.0)


# ---------------------------------------------------------------- checks under jit and vmap

_x = mf.sphere.uniform(jax.random.key(0), 6, 3)


def test_traced_bad_beta_raises_under_jit_and_vmap():
    with pytest.raises(ValueError, match="beta must be > 0"):
        mf.energy(K.USA(-1.0), _x)
    f = lambda b: mf.energy(K.USA(b), _x)  # noqa: E731
    with pytest.raises(Exception, match="beta must be > 0"):
        jax.block_until_ready(jax.jit(f)(-1.0))
    with pytest.raises(Exception, match="beta must be > 0"):
        jax.block_until_ready(jax.vmap(f)(jnp.array([1.0, jnp.nan])))
    assert bool(jnp.isfinite(jax.jit(f)(1.0)))


def test_traced_states_off_the_sphere_raise_under_jit_and_vmap():
    k = K.USA(1.0)
    with pytest.raises(ValueError, match="unit norm"):
        mf.simulate(k, 2 * _x, t1=0.1)
    run = lambda x: mf.simulate(k, x, t1=0.1, dt=0.05).energy  # noqa: E731
    with pytest.raises(Exception, match="x0 must be finite with unit rows"):
        jax.block_until_ready(jax.jit(run)(2 * _x))
    with pytest.raises(Exception, match="x0 must be finite with unit rows"):
        jax.block_until_ready(jax.vmap(run)(jnp.stack([_x, _x.at[0, 0].set(jnp.nan)])))
    with pytest.raises(Exception, match="x must be finite with unit rows"):
        jax.block_until_ready(jax.jit(lambda x: mf.velocity(k, x))(2 * _x))
    np.testing.assert_allclose(jax.jit(run)(_x), run(_x), rtol=1e-6)


def test_traced_prompt_labels_out_of_range_raise_under_jit_and_vmap():
    k = K.make("prompt", prompts=2)
    good = jnp.array([0, 0, 0, 1, 1, 1])
    bad = good.at[2].set(5)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 1\]"):
        mf.energy(k, _x, bad)
    with pytest.raises(Exception, match="Prompt labels must lie in"):
        jax.block_until_ready(jax.jit(lambda a: mf.energy(k, _x, a))(bad))
    with pytest.raises(Exception, match="Prompt labels must lie in"):
        jax.block_until_ready(jax.vmap(lambda a: mf.velocity(k, _x, a))(jnp.stack([good, bad])))
    with pytest.raises(Exception, match="Prompt labels must lie in"):
        jax.block_until_ready(jax.jit(lambda a: mf.simulate(k, _x, a, t1=0.1, dt=0.05).energy)(bad))
    np.testing.assert_allclose(
        jax.jit(lambda a: mf.energy(k, _x, a))(good), mf.energy(k, _x, good), rtol=1e-6
    )


# ---------------------------------------------------------------- native kernel: traced, scoped


def test_use_backend_does_not_retrace_user_functions():
    traces = []

    @jax.jit
    def f(x):
        traces.append(1)
        return mf.energy(K.USA(1.0), x)

    with K.use_backend("auto"):
        e1 = f(_x)
    with K.use_backend("xla"):
        e2 = f(_x)  # another backend is a new trace (the XLA formulation) ...
    with K.use_backend("auto"):
        e3 = f(_x)  # ... and switching back finds the first one: no retrace, no cache cleared
    assert len(traces) == 2
    with K.use_backend("xla"):
        f(_x)
    assert len(traces) == 2
    np.testing.assert_allclose([e1, e2, e3], float(e1), rtol=1e-6)


def test_backend_option_is_scoped_and_agrees():
    x = mf.sphere.uniform(jax.random.key(2), 40, 3)
    k = K.RoPE(2.0, 3.0)
    for fn in (mf.energy, mf.field, mf.velocity):
        np.testing.assert_allclose(
            fn(k, x, backend="native"), fn(k, x, backend="xla"), rtol=2e-5, atol=1e-6
        )
    a = mf.simulate(k, x, t1=0.2, dt=0.05, backend="xla").energy
    b = mf.simulate(k, x, t1=0.2, dt=0.05, backend="native").energy
    np.testing.assert_allclose(a, b, rtol=2e-5)
    with pytest.raises(
        ValueError, match="backend must be one of 'auto', 'native', 'xla', got 'gpu'"
    ):
        mf.energy(k, x, backend="gpu")
    mf.energy(k, x, backend="xla")
    assert K._exp._BACKEND.value == "auto"  # no process-wide change


def test_backend_xla_never_calls_the_native_kernel(monkeypatch):
    from meanfield import _native

    def boom(*a, **k):
        raise AssertionError("the native kernel was traced under backend='xla'")

    monkeypatch.setattr(_native, "exp_field_xla", boom)
    x = mf.sphere.uniform(jax.random.key(3), 17, 3)  # a shape no other test compiled
    jax.block_until_ready(mf.energy(K.USA(1.1), x, backend="xla"))


def test_attention_is_a_sweep_kind_not_a_model():
    """``kind = "attention"`` chooses the attention sweep kind; its one parameter is the ``beta``
    of ``SelfAttention`` (the same declaration as ``make("sa")``'s)."""
    from meanfield.sweep import spec as sweep_spec

    kind = sweep_spec.kind_of("attention")
    assert kind.name == "attention" and not kind.timed and kind.seeded
    (beta,) = kind.model_params("attention")
    assert beta == K.MODELS["sa"].param("beta")
    assert "attention" not in K.MODELS and "attention" not in [m.name for m in cli._models()]
    assert {sweep_spec.kind_of(n).name for n in K.MODEL_NAMES} == {"particles"}
    assert sweep_spec.kind_of("continuum").size_axis == "resolution"
    with pytest.raises(
        ValueError, match=r"unknown model kind 'nope'; accepted: 'usa'.*'attention', 'continuum'"
    ):
        sweep_spec.kind_of("nope")
