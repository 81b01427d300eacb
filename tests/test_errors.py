"""Bad input: ValueError / TypeError naming the value and what is accepted, raised
before any compilation (issue 2, "Bad input")."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import integrate
from meanfield._checks import check_flag

K = mf.kernels


@pytest.fixture
def no_compile(monkeypatch):
    """Fail if the jitted simulation entry point is reached (errors must come first)."""

    def boom(*args, **kwargs):
        raise AssertionError("simulate reached compilation before rejecting the input")

    monkeypatch.setattr(integrate, "_simulate", boom)


@pytest.fixture(scope="module")
def x0():
    return np.asarray(mf.sphere.uniform(jax.random.key(0), 6, 3))


def G3():
    return jnp.stack([jnp.eye(3), mf.sphere.rotation(1.0, 3)])


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize(
    "build",
    [
        lambda b: K.USA(b),
        lambda b: K.USA(b, rescaled=True),
        lambda b: K.DistanceBias(b, 1.0),
        lambda b: K.RoPE(b, 1.0),
        lambda b: K.PhaseField(b, lambda s: s),
        lambda b: K.Gauge(b, lambda s: jnp.eye(3)),
        lambda b: K.Prompt(b, G3()),
        lambda b: mf.models.SelfAttention(b),
    ],
)
def test_bad_beta(build, bad):
    with pytest.raises(ValueError, match=rf"beta.*{re.escape(repr(bad))}"):
        build(bad)


def test_bad_lam():
    with pytest.raises(ValueError, match=r"lam must be >= 0.*-0\.5"):
        K.DistanceBias(1.0, -0.5)
    with pytest.raises(ValueError, match="lam"):
        K.DistanceBias(1.0, float("nan"))
    K.DistanceBias(1.0, 0.0)  # lam = 0 is accepted (plain USA)


def test_bad_toeplitz_frequency_and_rope_omega_and_planes(x0):
    with pytest.raises(ValueError, match=r"m.*0"):
        K.Toeplitz(m=0)
    with pytest.raises(ValueError, match="omega"):
        K.RoPE(1.0, float("inf"))
    with pytest.raises(ValueError, match="plane"):
        K.RoPE(1.0, 1.0, plane=(1, 1))
    with pytest.raises(ValueError, match="plane"):
        mf.velocity(K.RoPE(1.0, 1.0, plane=(0, 3)), x0)  # d = 3 has no index 3
    with pytest.raises(ValueError, match="plane"):
        mf.sphere.rotation(0.1, 3, (0, 3))
    with pytest.raises(TypeError, match="phase"):
        K.PhaseField(1.0, 2.0)
    with pytest.raises(TypeError, match="gauge"):
        K.Gauge(1.0, jnp.eye(3))


def test_non_orthogonal_gauge(x0, no_compile):
    bad = lambda s: 2.0 * jnp.eye(3)  # noqa: E731
    with pytest.raises(ValueError, match="orthogonal"):
        mf.simulate(K.Gauge(1.0, bad), x0, t1=1.0)
    with pytest.raises(ValueError, match="orthogonal"):
        mf.velocity(K.Gauge(1.0, bad), x0)
    with pytest.raises(ValueError, match="orthogonal"):
        mf.energy(K.Gauge(1.0, bad), x0)
    with pytest.raises(ValueError, match="orthogonal"):
        K.Prompt(1.0, 2.0 * G3())
    shear = jnp.eye(3).at[0, 1].set(0.1)
    with pytest.raises(ValueError, match="orthogonal"):
        K.Prompt(1.0, jnp.stack([jnp.eye(3), shear]))
    with pytest.raises(ValueError, match=r"\(K, d, d\)"):
        K.Prompt(1.0, jnp.eye(3))
    with pytest.raises(ValueError, match=r"\(3, 3\)"):
        mf.velocity(K.Gauge(1.0, lambda s: jnp.eye(4)), x0)


def test_prompt_labels(x0, no_compile):
    kernel = K.Prompt(1.0, G3())
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mf.simulate(kernel, x0, np.array([0, 1, 2, 0, 1, 0]), t1=1.0)
    with pytest.raises(TypeError, match="integer"):
        mf.simulate(kernel, x0, np.linspace(0.1, 1, 6), t1=1.0)


# --------------------------------------------------------------------- states


@pytest.mark.parametrize("fn", ["simulate", "velocity", "energy", "field"])
def test_bad_shapes(fn, no_compile):
    kernel = K.USA(1.0)

    def call(x):
        if fn == "simulate":
            return mf.simulate(kernel, x, t1=1.0)
        return getattr(mf, fn)(kernel, x)

    with pytest.raises(ValueError, match=r"n must be >= 2, got 1"):
        call(np.array([[1.0, 0.0, 0.0]], np.float32))
    with pytest.raises(ValueError, match=r"d must be >= 2, got 1"):
        call(np.array([[1.0], [-1.0], [1.0]], np.float32))
    with pytest.raises(ValueError, match=r"\(n, d\).*\(3,\)"):
        call(np.array([1.0, 0.0, 0.0], np.float32))
    with pytest.raises(ValueError, match=r"\(n, d\).*\(2, 2, 3\)"):
        call(np.zeros((2, 2, 3), np.float32))


def test_non_finite_and_non_unit_x0(x0, no_compile):
    kernel = K.USA(1.0)
    for bad in (np.nan, np.inf):
        x = x0.copy()
        x[2, 1] = bad
        with pytest.raises(ValueError, match="NaN or inf"):
            mf.simulate(kernel, x, t1=1.0)
    x = x0.copy()
    x[3] *= 1.01
    with pytest.raises(ValueError, match=r"unit norm.*1\.01.*normali[sz]e"):
        mf.simulate(kernel, x, t1=1.0)
    # within 1e-3 is accepted (checked only, then compiled: not under no_compile here)


def test_aux_of_wrong_length(x0, no_compile):
    kernel = K.DistanceBias(1.0, 1.0)
    with pytest.raises(ValueError, match=r"aux.*n = 6.*\(5,\)"):
        mf.simulate(kernel, x0, np.linspace(0.1, 1.0, 5), t1=1.0)
    for fn in (mf.velocity, mf.energy):
        with pytest.raises(ValueError, match=r"aux.*\(7,\)"):
            fn(kernel, x0, np.linspace(0.1, 1.0, 7))
    with pytest.raises(ValueError, match="aux"):
        mf.simulate(kernel, x0, np.ones((6, 2)), t1=1.0)


# ---------------------------------------------------------------------- times


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan")])
def test_bad_dt_and_t1(x0, bad, no_compile):
    kernel = K.USA(1.0)
    with pytest.raises(ValueError, match=rf"dt.*{re.escape(repr(bad))}"):
        mf.simulate(kernel, x0, t1=1.0, dt=bad)
    with pytest.raises(ValueError, match=rf"t1.*{re.escape(repr(bad))}"):
        mf.simulate(kernel, x0, t1=bad)


@pytest.mark.parametrize("ts", [[0.0, 2.0], [-0.1, 0.5], [0.0, float("nan")]])
def test_ts_outside_range(x0, ts, no_compile):
    with pytest.raises(ValueError, match=r"ts must lie in \[0, t1\] = \[0, 1\]"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, ts=ts)


def test_ts_not_increasing_or_empty(x0, no_compile):
    with pytest.raises(ValueError, match="increasing"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, ts=[0.5, 0.2])
    with pytest.raises(ValueError, match="ts"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, ts=[])


# ---------------------------------------------------------------- options


def test_unknown_solver_lists_accepted(x0, no_compile):
    with pytest.raises(ValueError, match="'rk3'") as err:
        mf.simulate(K.USA(1.0), x0, t1=1.0, solver="rk3")
    for name in ("euler", "rk2", "rk4", "tsit5", "dopri5"):
        assert repr(name) in str(err.value)


def test_adaptive_needs_tolerances(x0, no_compile):
    with pytest.raises(ValueError, match="rtol and atol"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, solver="tsit5")
    with pytest.raises(ValueError, match="rtol and atol"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, solver="dopri5", rtol=1e-6)
    with pytest.raises(ValueError, match="atol"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, solver="tsit5", rtol=1e-6, atol=-1.0)


def test_other_options(x0, no_compile):
    with pytest.raises(ValueError, match="early_stop"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, early_stop=-1e-8)
    with pytest.raises(TypeError, match="'g'"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, observables={"g": 3.0})
    with pytest.raises(TypeError, match="str"):
        mf.simulate("usa", x0, t1=1.0)
    with pytest.raises(ValueError, match="'dense'.*'auto'"):
        mf.velocity(K.USA(1.0), x0, method="dense")
    with pytest.raises(TypeError, match="SelfAttention"):
        mf.energy(mf.models.SelfAttention(1.0), x0)


def test_sphere_and_theory_inputs():
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        mf.sphere.uniform(jax.random.key(0), 0, 3)
    with pytest.raises(ValueError, match="d must be >= 2, got 1"):
        mf.sphere.uniform(jax.random.key(0), 3, 1)
    with pytest.raises(TypeError, match="n must be an integer, got 2.5"):
        mf.sphere.uniform(jax.random.key(0), 2.5, 3)
    with pytest.raises(ValueError, match=r"beta.*-1"):
        mf.theory.max_energy(-1.0)
    with pytest.raises(ValueError, match="n must be >= 2"):
        mf.theory.great_circle_gap(1)


def test_overflow_message_names_beta_dtype_and_fix():
    x = mf.sphere.uniform(jax.random.key(0), 4, 3)
    with pytest.raises(ValueError) as err:
        mf.velocity(K.RoPE(120.0, 1.0), x)
    msg = str(err.value)
    assert "120" in msg and "float32" in msg and "rescaled=True" in msg
    # the same beta is fine in float64 (limit ~709)
    with jax.enable_x64(True):
        v = mf.velocity(K.RoPE(120.0, 1.0), jnp.asarray(x, jnp.float64))
        assert bool(jnp.all(jnp.isfinite(v)))


def test_gauge_dimension_mismatch(no_compile):
    x = np.asarray(mf.sphere.uniform(jax.random.key(0), 6, 4))
    with pytest.raises(ValueError, match=r"\(4, 4\).*\(3, 3\)"):
        mf.simulate(K.Gauge(1.0, lambda s: jnp.eye(3)), x, t1=1.0)
    with pytest.raises(ValueError, match=r"3x3.*d = 4"):
        mf.velocity(K.Prompt(1.0, G3()), x)


def test_prompt_dimension_mismatch_before_tracing(no_compile):
    x = np.asarray(mf.sphere.uniform(jax.random.key(0), 6, 4))
    with pytest.raises(ValueError, match=r"3x3.*d = 4"):
        mf.simulate(K.Prompt(1.0, G3()), x, t1=1.0)


# ------------------------------------------- issue 17: the Python API, tried as a new user


_STATE_FNS = ["energy", "velocity", "field"]


def _call(fn, model, x, aux=None, **kw):
    if fn == "simulate":
        return mf.simulate(model, x, aux, t1=0.1, dt=0.05, **kw)
    return getattr(mf, fn)(model, x, aux, **kw)


@pytest.mark.parametrize("fn", _STATE_FNS + ["simulate"])
def test_states_off_the_sphere_nan_and_zero_rows(fn, x0, no_compile):
    """energy / velocity / field validate states exactly like simulate (2x gave E = 6.93 vs 0.74)."""
    name = "x0" if fn == "simulate" else "x"
    kernel = K.USA(1.0)
    with pytest.raises(
        ValueError, match=rf"rows of {name} must have unit norm within 0\.001, got a row of norm 2"
    ):
        _call(fn, kernel, 2 * x0)
    x = x0.copy()
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match=rf"{name} contains NaN or inf"):
        _call(fn, kernel, x)
    x = x0.copy()
    x[4] = 0.0
    with pytest.raises(ValueError, match=r"unit norm.*norm 0;"):
        _call(fn, kernel, x)


@pytest.mark.parametrize("fn", _STATE_FNS)
def test_traced_states_off_the_sphere_stop_the_program(fn, x0):
    kernel = K.USA(1.0)
    run = jax.jit(lambda y: getattr(mf, fn)(kernel, y))
    with pytest.raises(RuntimeError, match="x must be finite with unit rows"):
        jax.block_until_ready(run(2 * jnp.asarray(x0)))
    with pytest.raises(RuntimeError, match="x must be finite with unit rows"):
        jax.block_until_ready(run(jnp.asarray(x0).at[0, 0].set(jnp.nan)))
    np.testing.assert_allclose(
        run(jnp.asarray(x0)), getattr(mf, fn)(kernel, x0), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("fn", _STATE_FNS + ["simulate"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.complex64])
def test_states_need_a_floating_dtype(fn, dtype, no_compile):
    x = np.eye(3).astype(dtype)
    with pytest.raises(
        TypeError, match=rf"must be a floating-point array .*got dtype {np.dtype(dtype).name}"
    ):
        _call(fn, K.USA(1.0), x)
    with pytest.raises(
        TypeError, match=r"must be a floating-point array .*got dtype (int|bool|complex)"
    ):
        _call(fn, K.USA(1.0), jnp.asarray(x))  # JAX's own integer arrays too


@pytest.mark.parametrize("fn", _STATE_FNS + ["simulate"])
def test_states_of_wrong_type_and_labels(fn, x0, no_compile):
    kernel = K.DistanceBias(1.0, 1.0)
    with pytest.raises(TypeError, match="floating-point array"):
        _call(fn, kernel, np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(ValueError, match=r"\(n, d\).*\(6, 3, 1\)"):
        _call(fn, kernel, x0[..., None])
    with pytest.raises(ValueError, match=r"aux.*n = 6.*\(4,\)"):
        _call(fn, kernel, x0, np.linspace(0.1, 1.0, 4))
    with pytest.raises(ValueError, match="aux contains NaN or inf"):
        _call(fn, kernel, x0, np.full(6, np.nan))
    with pytest.raises(TypeError, match="aux must be an array of real numbers"):
        _call(fn, kernel, x0, "abcdef")


def test_traced_labels_non_finite_stop_the_program(x0):
    kernel = K.DistanceBias(1.0, 1.0)
    run = jax.jit(lambda a: mf.energy(kernel, x0, a))
    with pytest.raises(RuntimeError, match="aux must be finite"):
        jax.block_until_ready(run(jnp.full(6, jnp.nan)))
    np.testing.assert_allclose(run(mf.positions(6)), mf.energy(kernel, x0), rtol=1e-6)


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda v: K.USA(v), "beta"),
        (lambda v: K.USA(1.0, rescaled=False).__class__(v), "beta"),
        (lambda v: K.DistanceBias(1.0, v), "lam"),
        (lambda v: K.Toeplitz(v), "m"),
        (lambda v: K.RoPE(1.0, v), "omega"),
        (lambda v: K.PhaseField(v, K.FourierPhase()), "beta"),
        (lambda v: K.FourierPhase(v, 1.0), "omega"),
        (lambda v: K.FourierPhase(1.0, v), "amplitude"),
        (lambda v: K.WavyGauge(v), "amplitude"),
        (lambda v: K.Gauge(v, K.WavyGauge()), "beta"),
        (lambda v: K.Prompt(v, G3()), "beta"),
        (lambda v: mf.models.SelfAttention(v), "beta"),
    ],
)
@pytest.mark.parametrize(
    "bad", [True, np.array(True), np.array("1"), np.array(1 + 1j), jnp.array(1 + 1j)]
)
def test_parameter_types_at_construction(build, name, bad):
    """USA('1') was accepted and failed later: a TypeError naming the parameter, at once.
    (These values pass the annotations, so the constructor's own message is what is seen
    with or without the test suite's run-time type checks.)"""
    with pytest.raises(TypeError, match=rf"^{name} must be a real number, got "):
        build(bad)
    for other in (
        "1",
        None,
        1 + 1j,
    ):  # rejected by the annotation under the test hook, else by the check
        with pytest.raises(TypeError, match=name):
            build(other)


@pytest.mark.parametrize("vector", [np.array([1.0, 2.0]), jnp.array([1.0, 2.0]), np.ones((1, 1))])
def test_vector_parameter_is_not_a_scalar(vector, x0):
    with pytest.raises(ValueError, match=r"beta must be a scalar .*got shape \(\d.*jax.vmap"):
        K.USA(vector)
    with pytest.raises(ValueError, match=r"lam must be a scalar"):
        K.DistanceBias(1.0, vector)
    with pytest.raises(ValueError, match=r"beta must be a scalar"):
        mf.models.SelfAttention(vector)
    # the supported way: a function of a scalar beta, vmapped
    E = jax.vmap(lambda b: mf.energy(K.USA(b), x0))(jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(E, [mf.energy(K.USA(1.0), x0), mf.energy(K.USA(2.0), x0)], rtol=1e-6)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_flags_must_be_bools(bad, x0, no_compile):
    # the annotation (bool) rejects these under the test hook; without it, check_flag does:
    # either way a TypeError naming the flag
    with pytest.raises(TypeError, match="rescaled"):
        K.USA(1.0, rescaled=bad)
    with pytest.raises(TypeError, match="normalized"):
        mf.models.SelfAttention(1.0, normalized=bad)
    with pytest.raises(TypeError, match="save_states"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, save_states=bad)
    with pytest.raises(TypeError, match=r"^rescaled must be True or False, got 1 of type int"):
        check_flag("rescaled", bad if bad == 1 else 1)


@pytest.mark.parametrize("fn", _STATE_FNS + ["simulate"])
@pytest.mark.parametrize(
    "bad, error, message",
    [
        (0, ValueError, "block_size must be >= 1, got 0"),
        (-3, ValueError, "block_size must be >= 1, got -3"),
        (2.5, TypeError, "block_size must be an integer, got 2.5"),
        (True, TypeError, "block_size must be an integer, got True"),
        ("4", TypeError, "block_size must be an integer, got '4'"),
    ],
)
def test_bad_block_size(fn, bad, error, message, x0, no_compile):
    with pytest.raises(error, match=re.escape(message)):
        _call(fn, K.USA(1.0), x0, block_size=bad)


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (0, ValueError, "max_steps must be >= 1, got 0"),
        (-5, ValueError, "max_steps must be >= 1, got -5"),
        (2.5, TypeError, "max_steps must be an integer, got 2.5"),
        (True, TypeError, "max_steps must be an integer, got True"),
    ],
)
def test_bad_max_steps(bad, error, message, x0, no_compile):
    """max_steps=0 no longer means the default (None does); -5 is not a math domain error."""
    with pytest.raises(error, match=re.escape(message)):
        mf.simulate(K.USA(1.0), x0, t1=1.0, max_steps=bad)


@pytest.mark.parametrize("name", ["t1", "dt", "early_stop"])
@pytest.mark.parametrize(
    "bad, error",
    [(True, TypeError), (np.array("1"), TypeError), (np.array([0.1, 0.2]), ValueError)],
)
def test_bad_time_options(name, bad, error, x0, no_compile):
    kw = {"t1": 1.0, name: bad}
    with pytest.raises(error, match=rf"^{name} must be a"):
        mf.simulate(K.USA(1.0), x0, **kw)


@pytest.mark.parametrize("fn", _STATE_FNS + ["simulate"])
def test_parameters_that_do_not_fit_the_dtype(fn, x0, no_compile):
    """beta = 1e-300 is 0 in float32 (the CLI wrote final_energy: Infinity, failed: false);
    lam = 1e300 is inf (NaN on the diagonal). Both are rejected with the dtype named."""
    with pytest.raises(ValueError, match=r"beta = 1e-300 rounds to 0 in float32"):
        _call(fn, K.USA(1e-300), x0)
    with pytest.raises(ValueError, match=r"lam = 1e\+300 is not representable in float32"):
        _call(fn, K.DistanceBias(1.0, 1e300), x0)
    with pytest.raises(ValueError, match=r"phase\.omega = 1e\+300 is not representable in float32"):
        _call(fn, K.PhaseField(1.0, K.FourierPhase(1e300, 0.5)), x0)


def test_tiny_beta_is_fine_in_float64(x0):
    with jax.enable_x64(True):
        x = jnp.asarray(x0, jnp.float64)
        E = float(mf.energy(K.USA(1e-300), x))
        # E = (1/(2 beta n^2)) sum_ij exp(beta <x_i, x_j>) = 1 / (2 beta) to relative 1e-300
        assert E == pytest.approx(0.5e300, rel=1e-12)


@pytest.mark.xla_default
def test_beta_zero_or_tiny_under_jit_is_a_failed_run(x0):
    """beta = 0 under jit: the in-program check stops it; a subnormal beta (> 0, so it passes)
    gives an infinite energy with finite states: Trajectory.failed is true."""
    run = jax.jit(lambda b: mf.simulate(K.USA(b), x0, t1=0.2, dt=0.1))
    with pytest.raises(RuntimeError, match="beta must be > 0"):
        jax.block_until_ready(run(jnp.float32(0.0)))
    tiny = run(jnp.float32(1e-39))
    assert bool(jnp.all(jnp.isfinite(tiny.xs))) and not bool(jnp.all(jnp.isfinite(tiny.energy)))
    assert bool(tiny.failed)
    ok = run(jnp.float32(1.0))
    assert not bool(ok.failed) and bool(jnp.all(jnp.isfinite(ok.energy)))


def test_traced_t1_is_a_clear_error(x0):
    with pytest.raises(TypeError, match="t1 must be concrete"):
        jax.jit(lambda t: mf.simulate(K.USA(1.0), x0, t1=t).energy)(1.0)


def test_more_constructor_and_option_types(x0, no_compile):
    """The rest of the new-user tour: one clear error each (these raised AttributeError,
    'can only concatenate str', a zero-size reduction, or returned NaN)."""
    with pytest.raises(
        TypeError, match=r"plane must be a pair of coordinate indices like \(0, 1\), got 'ab'"
    ):
        K.RoPE(1.0, 1.0, plane="ab")
    with pytest.raises(TypeError, match=r"plane must be a pair of coordinate indices"):
        K.PhaseField(1.0, K.FourierPhase(), plane=(0.5, 1))
    with pytest.raises(ValueError, match=r"plane must be two distinct indices >= 0, got \(-1, 0\)"):
        K.RoPE(1.0, 1.0, plane=(-1, 0))
    with pytest.raises(TypeError, match=r"gauges must be a real \(K, d, d\) array"):
        K.Prompt(1.0, np.array("abc"))
    with pytest.raises(ValueError, match=r"K >= 1, got \(0, 3, 3\)"):
        K.Prompt(1.0, np.zeros((0, 3, 3)))
    with pytest.raises(ValueError, match="K must be >= 1, got 0"):
        K.random_gauges(jax.random.key(0), 0, 3)
    with pytest.raises(ValueError, match="Q contains NaN or inf"):
        mf.models.SelfAttention(1.0, Q=np.full((3, 3), np.nan))
    with pytest.raises(ValueError, match=r"Q is 4x4 but the states have d = 3"):
        mf.simulate(mf.models.SelfAttention(1.0, Q=np.eye(4)), x0, t1=1.0)
    with pytest.raises(
        TypeError, match=r"params must be a dict of parameter values, got \[\('beta', 1.0\)\]"
    ):
        K.build("usa", [("beta", 1.0)], d=3)
    with pytest.raises(
        TypeError, match=r"key must be a JAX PRNG key such as jax.random.key\(0\), got 0"
    ):
        mf.sphere.uniform(0, 4, 3)
    with pytest.raises(TypeError, match="observables"):  # the annotation under the test hook
        mf.simulate(K.USA(1.0), x0, t1=1.0, observables=[mf.metrics.collapse_gap])
    with pytest.raises(TypeError, match="observable"):  # names must be strings
        mf.simulate(K.USA(1.0), x0, t1=1.0, observables={1: mf.metrics.collapse_gap})
    with pytest.raises(TypeError, match="got the class USA; pass an instance, e.g. USA"):
        mf.energy(K.USA, x0)
    with pytest.raises(TypeError, match="got the class USA"):
        mf.velocity(K.USA, x0)
