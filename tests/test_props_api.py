"""Property-based tests of the Python API contract (issue 17, item 6): bad and edge-case
inputs to ``energy``, ``velocity``, ``field``, ``simulate``, ``make``/``build`` and the kernel
constructors give a ``ValueError``/``TypeError`` with a message, or a finite result -- never
another exception type, a silent NaN/inf or a hang.

Each property also states *which* inputs are valid (an independent predicate), so that a valid
input that raises and an invalid one that returns a number both fail. Shapes come from a small
fixed set so that compilations are reused; examples are few and derandomised (reproducible).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meanfield as mf

K = mf.kernels

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

F32 = np.finfo(np.float32)
#: exp(beta) overflows float32 from here (the kernels' concrete check)
EXP_LIMIT_F32 = math.log(float(F32.max))


def contract(fn):
    """``("error", message)`` for a ValueError/TypeError with a message, ``("ok", result)``
    otherwise; any other exception propagates (and fails the test)."""
    try:
        result = fn()
    except (ValueError, TypeError) as err:
        message = str(err).strip()
        assert message, f"{type(err).__name__} without a message"
        return "error", message
    return "ok", result


def all_finite(tree) -> bool:
    return all(
        bool(jnp.all(jnp.isfinite(leaf)))
        for leaf in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.inexact)
    )


# ---------------------------------------------------------------- states


SHAPES = [(2, 2), (3, 3), (5, 3)]
CORRUPTIONS = [
    "none",
    "scale",
    "negate",
    "nan",
    "inf",
    "zero_row",
    "flatten",
    "add_axis",
    "one_row",
    "dtype",
]
DTYPES = [np.float32, np.float16, np.int32, np.bool_, np.complex64, np.float64]


@st.composite
def states(draw):
    """A state ``x`` (NumPy array) and whether it is valid for the API (independent check)."""
    n, d = draw(st.sampled_from(SHAPES))
    seed = draw(st.integers(0, 3))
    x = np.asarray(mf.sphere.uniform(jax.random.key(seed), n, d), np.float64)
    kind = draw(st.sampled_from(CORRUPTIONS))
    i = draw(st.integers(0, n - 1))
    if kind == "scale":
        x = x * draw(st.sampled_from([0.0, 0.5, 1.0 + 5e-4, 1.0 + 2e-3, 2.0, 1e30]))
    elif kind == "negate":
        x = -x  # still unit rows: valid
    elif kind == "nan":
        x[i, 0] = np.nan
    elif kind == "inf":
        x[i, -1] = draw(st.sampled_from([np.inf, -np.inf]))
    elif kind == "zero_row":
        x[i] = 0.0
    elif kind == "flatten":
        x = x.reshape(-1)
    elif kind == "add_axis":
        x = x[None]
    elif kind == "one_row":
        x = x[:1]
    dtype = draw(st.sampled_from(DTYPES)) if kind == "dtype" else np.float32
    with np.errstate(all="ignore"):
        x = x.astype(dtype)
    return x, _valid_state(x)


def _valid_state(x) -> bool:
    if x.dtype.kind != "f" or x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        return False
    if x.dtype == np.float64 and not jax.config.jax_enable_x64:
        x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        return False
    atol = 1e-2 if x.dtype.itemsize == 2 else 1e-3
    return bool(np.max(np.abs(np.linalg.norm(x.astype(np.float64), axis=1) - 1.0)) <= atol)


@pytest.mark.parametrize("fn", ["energy", "velocity", "field"])
@SETTINGS
@given(data=states())
def test_states_contract(fn, data):
    x, valid = data
    kind, out = contract(lambda: getattr(mf, fn)(K.DistanceBias(1.5, 0.5), x))
    if valid:
        assert kind == "ok", out
        assert all_finite(out)
        assert np.shape(out) == (() if fn == "energy" else x.shape)
    else:
        assert kind == "error", f"invalid state accepted: dtype {x.dtype}, shape {x.shape}"


# ---------------------------------------------------------------- parameters


REALS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=1e-45, max_value=1e-30),
    st.floats(min_value=80.0, max_value=100.0),
    st.integers(-3, 200),
)
WRONG = st.one_of(
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.complex_numbers(max_magnitude=2.0, allow_nan=False),
    st.just(np.array([1.0, 2.0])),
    st.just(np.array(True)),
    st.just(np.array("1")),
)
VALUES = st.one_of(REALS, WRONG)


def _real(v) -> bool:
    """A real scalar, as the constructors accept it (not a bool, a string, a complex, a vector)."""
    if isinstance(v, (bool, np.bool_, str, complex)) or v is None:
        return False
    if isinstance(v, np.ndarray):
        return v.shape == () and v.dtype.kind in "iuf"
    return isinstance(v, (int, float))


def _valid_beta(v) -> bool:
    return _real(v) and math.isfinite(float(v)) and float(v) > 0


@SETTINGS
@given(beta=VALUES, rescaled=st.booleans())
def test_usa_beta_contract(beta, rescaled):
    x = mf.sphere.uniform(jax.random.key(0), 4, 3)
    kind, out = contract(lambda: K.USA(beta, rescaled=rescaled))
    assert (kind == "ok") == _valid_beta(beta), (beta, out)
    if kind != "ok":
        return
    b = float(beta)
    # in float32: beta must not round to 0, and exp(beta) must not overflow unless rescaled
    fits = b >= float(F32.tiny) and (rescaled or b < EXP_LIMIT_F32)
    for fn in (mf.energy, mf.velocity):
        kind, out = contract(lambda fn=fn: fn(K.USA(beta, rescaled=rescaled), x))
        assert (kind == "ok") == fits, (beta, rescaled, out)
        if kind == "ok":
            assert all_finite(out), (beta, rescaled, out)


@SETTINGS
@given(lam=VALUES)
def test_distance_bias_lam_contract(lam):
    x = mf.sphere.uniform(jax.random.key(1), 4, 3)
    kind, out = contract(lambda: K.DistanceBias(1.0, lam))
    valid = _real(lam) and math.isfinite(float(lam)) and float(lam) >= 0
    assert (kind == "ok") == valid, (lam, out)
    if kind == "ok":
        kind, out = contract(lambda: mf.energy(K.DistanceBias(1.0, lam), x))
        assert (kind == "ok") == (float(lam) <= float(F32.max)), (lam, out)
        if kind == "ok":
            assert all_finite(out)


@SETTINGS
@given(omega=VALUES, m=VALUES)
def test_rope_omega_and_toeplitz_m_contract(omega, m):
    x = mf.sphere.uniform(jax.random.key(2), 4, 3)
    kind, out = contract(lambda: K.RoPE(1.0, omega))
    assert (kind == "ok") == (_real(omega) and math.isfinite(float(omega))), (omega, out)
    if kind == "ok":
        kind, out = contract(lambda: mf.velocity(K.RoPE(1.0, omega), x))
        assert (kind == "ok") == (abs(float(omega)) <= float(F32.max)), (omega, out)
        if kind == "ok":
            assert all_finite(out)
    kind, out = contract(lambda: K.Toeplitz(m))
    assert (kind == "ok") == _valid_beta(m), (m, out)
    if kind == "ok":
        kind, out = contract(lambda: mf.energy(K.Toeplitz(m), x))
        assert (kind == "ok") == (float(F32.tiny) <= float(m) <= float(F32.max)), (m, out)
        if kind == "ok":
            assert all_finite(out)


@SETTINGS
@given(beta=VALUES, normalized=st.booleans())
def test_self_attention_contract(beta, normalized):
    x = mf.sphere.uniform(jax.random.key(3), 4, 3)
    kind, out = contract(lambda: mf.models.SelfAttention(beta, normalized=normalized))
    assert (kind == "ok") == _valid_beta(beta), (beta, out)
    if kind == "ok":
        kind, out = contract(
            lambda: mf.velocity(mf.models.SelfAttention(beta, normalized=normalized), x)
        )
        if kind == "ok":
            assert all_finite(out), (beta, normalized)
        else:  # float32 cannot hold beta, or the unnormalised field overflows
            b = float(beta)
            assert b < float(F32.tiny) or (not normalized and b >= EXP_LIMIT_F32), (beta, out)


# ---------------------------------------------------------------- options


INTS = st.one_of(
    st.integers(-5, 40), st.floats(-2.0, 8.0), st.booleans(), st.text(max_size=2), st.none()
)


@SETTINGS
@given(block_size=INTS, method=st.sampled_from(["auto", "pairwise", "dense", 3]))
def test_block_size_and_method_contract(block_size, method):
    x = mf.sphere.uniform(jax.random.key(4), 5, 3)
    kind, out = contract(lambda: mf.field(K.USA(1.0), x, method=method, block_size=block_size))
    valid_block = block_size is None or (
        isinstance(block_size, int) and not isinstance(block_size, bool) and block_size >= 1
    )
    assert (kind == "ok") == (valid_block and method in ("auto", "pairwise")), (
        block_size,
        method,
        out,
    )
    if kind == "ok":
        np.testing.assert_allclose(out, mf.field(K.USA(1.0), x), rtol=1e-5, atol=1e-6)


_X0 = np.asarray(mf.sphere.uniform(jax.random.key(5), 4, 3))


@settings(SETTINGS, max_examples=25)
@given(
    beta=st.one_of(st.floats(1e-3, 60.0), st.floats(allow_nan=True, allow_infinity=True), WRONG),
    max_steps=INTS,
    t1=st.one_of(st.floats(-1.0, 0.3), st.just(float("nan")), st.booleans()),
    state=states(),
)
def test_simulate_contract(beta, max_steps, t1, state):
    """simulate: a clear error for any bad input, else a Trajectory whose saved values are
    finite unless ``failed`` is set (a recorded failure, never a silent NaN)."""
    x, valid_x = state
    if valid_x:
        x = _X0  # one shape for every valid run: the compilation is reused
    kind, out = contract(lambda: mf.simulate(K.USA(beta), x, t1=t1, dt=0.1, max_steps=max_steps))
    valid = (
        _valid_beta(beta)
        and float(beta) >= float(F32.tiny)
        and valid_x
        and isinstance(t1, float)
        and t1 > 0
        and (
            max_steps is None
            or (isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps >= 1)
        )
    )
    assert (kind == "ok") == valid, (beta, max_steps, t1, out)
    if kind == "ok":
        assert bool(out.failed) or all_finite((out.energy, out.collapse_gap, out.xs))
        # too few steps is a recorded failure, not a truncated result
        needed = math.ceil(t1 / 0.1 - 1e-9)
        if max_steps is not None and max_steps < needed:
            assert bool(out.failed)


# ---------------------------------------------------------------- the registry


# "attention" is a sweep kind, not a model: make and build refuse it like any unknown name
_NAMES = list(K.MODEL_NAMES) + ["attention", "USA", "", 3, None]


@st.composite
def registry_calls(draw):
    name = draw(st.sampled_from(_NAMES))
    entry = K.MODELS.get(name) if isinstance(name, str) else None
    keys = [p.name for p in entry.params] if entry is not None else ["beta"]
    params = {}
    for key in draw(st.lists(st.sampled_from(keys + ["nope"]), max_size=3, unique=True)):
        params[key] = draw(
            st.one_of(VALUES, st.sampled_from([(0, 1), (1, 1), "random", "rotation", 2]))
        )
    d = draw(st.sampled_from([2, 3, 3, 1, 2.5]))
    return name, params, d


@SETTINGS
@given(call=registry_calls(), via_make=st.booleans())
def test_make_and_build_contract(call, via_make):
    """make/build: a clear error, or a model whose velocity on valid states is finite or a
    clear error (a parameter that does not fit float32)."""
    name, params, d = call
    if via_make:
        kind, model = contract(lambda: K.make(name, d=d, **params))
    else:
        kind, model = contract(lambda: K.build(name, params, d=d))
    if kind != "ok":
        return
    assert isinstance(model, mf.models.Model)
    assert isinstance(name, str) and name in K.MODEL_NAMES and isinstance(d, int) and d >= 2
    x = mf.sphere.uniform(jax.random.key(6), 4, d)
    kind, out = contract(lambda: mf.velocity(model, x))
    if kind == "ok":
        assert all_finite(out), (name, params, d)
