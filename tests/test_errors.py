"""Bad input: ValueError / TypeError naming the value and what is accepted, raised
before any compilation (issue 2, "Bad input")."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import integrate

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
    with pytest.raises(TypeError, match="n must be an int, got 2.5"):
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
