"""Edge cases of the phase-diagram sweeps (issue 27, item 6): fractions stay in [0, 1] at large
beta on every backend, bad inputs get one clear error, runs that cannot finish are refused, and a
run whose states stop being finite is recorded as NaN."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meanfield as mf
from meanfield import phase_diagram as pd

SETTINGS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _reference(x0, beta, N, h, idx, threshold=0.999):
    """Dense float64 reference: ``euler_step`` and ``clustering_fraction``, vmapped over the seeds."""
    with jax.enable_x64(True):
        step = jax.jit(jax.vmap(lambda x: pd.euler_step(x, beta, h)))
        frac = jax.jit(jax.vmap(lambda x: pd.clustering_fraction(x, threshold)))
        xs = jnp.asarray(np.asarray(x0, np.float64))
        fr = [np.asarray(frac(xs))]
        for _ in range(N):
            xs = step(xs)
            fr.append(np.asarray(frac(xs)))
        return np.stack(fr)[idx].mean(axis=1)


def test_sa_xla_fraction_at_beta_200_float32_matches_float64_reference():
    # was -0.143 (e^200 overflows float32: every weight inf, the diagonal subtracted from 0)
    key = jax.random.key(0)
    got = pd.sa_phase_diagram(
        key, [200.0], n=8, seeds=4, t1=1, dt=0.1, checkpoints=5, backend="xla"
    )
    assert got.dtype == np.float32
    assert np.all((got >= 0) & (got <= 1)), got
    x0 = jax.vmap(lambda k: mf.sphere.uniform(k, 8, 2, jnp.float32))(jax.random.split(key, 4))
    N, h, idx = pd.checkpoint_steps(1, 0.1, 5)
    np.testing.assert_allclose(got[0], _reference(x0, 200.0, N, h, idx), atol=1e-6)


@pytest.mark.native
def test_sa_native_and_xla_agree_at_beta_200_float32():
    key = jax.random.key(1)
    kw = dict(n=8, seeds=4, t1=1, dt=0.1, checkpoints=5, per_seed=True)
    xla = pd.sa_phase_diagram(key, [200.0], backend="xla", **kw)
    nat = pd.sa_phase_diagram(key, [200.0], backend="native", **kw)
    # native used to return NaN states counted as 0 (e^200 overflow, Z = inf)
    assert np.all(np.isfinite(nat.per_seed)) and np.all((nat.per_seed >= 0) & (nat.per_seed <= 1))
    np.testing.assert_allclose(nat.fraction, xla.fraction, atol=1 / 56 + 1e-6)


@pytest.mark.parametrize("backend", ["xla", "auto"])
def test_sa_beta_1e6_float32_in_unit_interval(backend):
    got = pd.sa_phase_diagram(
        jax.random.key(2),
        [1e6],
        n=8,
        seeds=4,
        t1=1,
        dt=0.1,
        checkpoints=5,
        backend=backend,
        dtype=jnp.float32,
    )
    assert np.all(np.isfinite(got)) and np.all((got >= 0) & (got <= 1)), got


def test_non_finite_run_is_recorded_as_nan():
    # beta = 1e38 in float32: beta <x_i, x_i> - beta rounds to -6e30, every weight is 0, Z = 0: NaN states.
    r = pd.sa_phase_diagram(
        jax.random.key(3),
        [1e38, 1.0],
        n=4,
        seeds=2,
        t1=0.2,
        dt=0.1,
        checkpoints=2,
        backend="xla",
        dtype=jnp.float32,
        per_seed=True,
    )
    assert np.all(np.isnan(r.per_seed[0])) and np.all(np.isnan(r.fraction[0]))
    assert np.all(np.isfinite(r.per_seed[1]))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, "float16"])
def test_sixteen_bit_dtype_refused(dtype):
    with pytest.raises(ValueError, match="float32 and float64, got dtype (float16|bfloat16)"):
        pd.sa_phase_diagram(
            jax.random.key(0), [2.0], n=8, seeds=4, t1=1, dt=0.1, checkpoints=5, dtype=dtype
        )
    with pytest.raises(ValueError, match="float32 and float64"):
        pd.usa_phase_diagram(jax.random.key(0), [2.0], n=8, seeds=4, checkpoints=5, dtype=dtype)


def _x0(seeds=2, n=4, d=2):
    return np.asarray(
        jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(5), seeds))
    )


@pytest.mark.parametrize(
    "x0, exc, match",
    [
        (np.full((2, 4, 2), np.nan), ValueError, r"x0 must be finite, got 16 NaN"),
        (np.ones((2, 4, 3)), ValueError, r"x0 must have unit rows .* got a row of norm 1\.73205"),
        (3 * _x0(), ValueError, r"unit rows .* norm 3"),
        (
            np.eye(2, dtype=np.int64)[None].repeat(3, 0).repeat(2, 1),
            TypeError,
            r"x0 must be a floating-point .* int64",
        ),
        (_x0().astype(np.complex64), TypeError, "complex64"),
        (np.ones((4, 2)), ValueError, r"x0 must have shape \(seeds, n, d\)"),
    ],
)
def test_x0_validated(x0, exc, match):
    with pytest.raises(exc, match=match):
        pd.sa_phase_diagram(None, [2.0], x0=x0, t1=1, dt=0.1, checkpoints=3)
    with pytest.raises(exc, match=match):
        pd.usa_phase_diagram(None, [2.0], x0=x0, checkpoints=3)


def test_integer_x0_with_dtype_runs():
    # an integer x0 with an explicit dtype is converted: all particles at e_1 are one cluster
    x0 = np.zeros((2, 4, 2), np.int64)
    x0[..., 0] = 1
    got = pd.sa_phase_diagram(None, [2.0], x0=x0, dtype=jnp.float32, t1=1, dt=0.1, checkpoints=3)
    np.testing.assert_array_equal(got, np.ones((1, 3), np.float32))


@pytest.mark.parametrize("beta, power", [(100.0, "44.6"), (1000.0, "436.0")])
def test_usa_large_beta_refused_without_warning(beta, power):
    # was zeros with a numpy cast warning (beta = 100) and a ZeroDivisionError (beta = 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(
            ValueError, match=rf"beta = {beta:g} needs .* = 10\^{power} Euler steps.*MAX_STEPS"
        ):
            pd.usa_phase_diagram(jax.random.key(0), [1.0, beta], n=8, seeds=4, checkpoints=5)


def test_step_count_past_max_steps_refused():
    # was an int32 overflow leaking out of the kernel ("ckpt must be distinct sorted steps")
    with pytest.raises(
        ValueError, match=r"t1 / dt = 1e\+12 / 0.001 = 1e\+15 steps is more than MAX_STEPS"
    ):
        pd.sa_phase_diagram(jax.random.key(0), [2.0], n=8, seeds=4, t1=1e12, dt=1e-3, checkpoints=5)
    with pytest.raises(ValueError, match="MAX_STEPS"):
        pd.checkpoint_steps(1e300, 1e-300, 3)
    with pytest.raises(ValueError, match="more than 100000000"):
        pd.published_checkpoint_steps(1e12, 1e-3, 3)
    assert pd.MAX_STEPS == pd.MAX_PUBLISHED_STEPS == 10**8


def test_usa_step_size_edges():
    with pytest.raises(ValueError, match=r"beta must be > 0 and finite, got -1"):
        pd.usa_step_size(-1)
    with pytest.raises(ValueError, match=r"base_dt must be > 0 and finite, got 0"):
        pd.usa_step_size(1, 0)
    with pytest.raises(ValueError, match="beta must be > 0"):
        pd.usa_step_size([1.0, np.nan])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(
            pd.usa_step_size([0.25, 2.0, 50.0]),
            [0.1, 0.1 / (np.sqrt(2) * np.exp(1.5)), 0.1 / (np.sqrt(50) * np.exp(49.5))],
            rtol=1e-13,
        )
        assert pd.usa_step_size(1000.0) == 0.0  # underflows (no overflow warning, no NaN)
    f = jax.jit(pd.usa_step_size)
    np.testing.assert_allclose(f(jnp.float32(2.0)), pd.usa_step_size(2.0), rtol=1e-6)
    with pytest.raises(
        (RuntimeError, ValueError), match="beta must be > 0 and finite; a traced beta was not"
    ):
        jax.block_until_ready(f(jnp.float32(-1.0)))


@settings(SETTINGS, max_examples=10)
@given(
    log_beta=st.floats(-3, 8),
    n=st.sampled_from([4, 6]),
    d=st.sampled_from([2, 3]),
    steps=st.integers(1, 12),
    checkpoints=st.integers(1, 4),
    threshold=st.sampled_from([0.0, 0.9, 0.999]),
)
def test_sa_fraction_in_unit_interval_property(log_beta, n, d, steps, checkpoints, threshold):
    got = pd.sa_phase_diagram(
        jax.random.key(7),
        [10.0**log_beta],
        n=n,
        d=d,
        seeds=3,
        t1=0.1 * steps,
        dt=0.1,
        checkpoints=checkpoints,
        threshold=threshold,
        dtype=jnp.float32,
    )
    assert got.shape == (1, checkpoints)
    assert np.all(np.isfinite(got)) and np.all((got >= 0) & (got <= 1)), got
    # a multiple of 1 / (n (n - 1) seeds)
    np.testing.assert_allclose(got * n * (n - 1) * 3, np.round(got * n * (n - 1) * 3), atol=1e-4)


@SETTINGS
@given(
    beta=st.sampled_from([0.01, 0.5, 2.0, 8.0, 60.0, 1e4]),
    scale=st.sampled_from([1.0, 1.0005, 1.5, 0.0, np.nan, np.inf]),
    t1=st.sampled_from([0.01, 0.05, 1e9]),
)
def test_usa_contract_property(beta, scale, t1):
    """Either one ValueError/TypeError naming the problem or fractions in [0, 1] (at most 2e5 steps run:
    beta = 8, t1 = 0.05; beta = 60 or t1 = 1e9 are past MAX_STEPS)."""
    x0 = _x0(2, 4, 3) * scale
    try:
        got = pd.usa_phase_diagram(None, [beta], x0=x0, t1=t1, checkpoints=3, dtype=jnp.float32)
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert ("x0" in msg and scale != 1.0) or "MAX_STEPS" in msg, msg
        return
    assert scale in (1.0, 1.0005)
    assert np.all(np.isfinite(got)) and np.all((got >= 0) & (got <= 1)), got


@pytest.mark.parametrize("betas", ["abc", [1 + 2j], [[1.0, "x"]]])
def test_betas_that_are_not_real_numbers_name_betas(betas):
    # "abc" gave numpy's "could not convert string to float: 'abc'", naming no argument
    for f in (pd.sa_phase_diagram, pd.usa_phase_diagram):
        with pytest.raises(
            TypeError, match=r"betas must be real numbers \(a 1-d array of floats\), got "
        ):
            f(jax.random.key(0), betas, n=4, seeds=1, checkpoints=2)
