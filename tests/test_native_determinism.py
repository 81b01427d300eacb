"""Issue 47, item 3 (its last cause): the fused C kernel gives the same bits for a given input
whatever its thread count and schedule.

A system of more than ``4 * FLUSH = 512`` particles is cut into windows of 128 rows dealt to a
fixed set of virtual workers (``exp_kernel.c``, ``workers_of``: their number depends on ``n`` and
``d`` only), each summing into its own buffer, added up in worker order. Before, a batch smaller
than the thread count summed its windows per thread in the order threads took them: float64
fields, sums and tangents moved by ulps between 1, 2 and 3 threads, between calls and between
processes. Here the field, the weight sum (with and without the field) and the tangent are
compared bit for bit across thread counts 1, 2, 3 and 5 (fixed teams: ``adaptive=False``, so the
machine's load picks nothing) and across repeated calls, through ctypes and through XLA's FFI;
a batch of 2 crosses the kernel's two branches (whole systems per thread with 1 or 2 threads,
the workers of each system in parallel with 3 or 5). No timings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meanfield import _native

pytestmark = pytest.mark.native

#: rows per window of the kernel (FLUSH): systems of more than 4 windows take the workers' path
WINDOW = 128
THREADS = (1, 2, 3, 5)


@pytest.fixture(autouse=True)
def _needs_native():
    if not _native.exp_library().available:
        pytest.skip(f"no native kernel: {_native.exp_library().reason}")


def _inputs(B: int, n: int, d: int, dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, n, d))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    dx = rng.standard_normal((B, n, d))
    beta = np.linspace(0.7, 3.1, B)
    return x.astype(dtype), dx.astype(dtype), beta.astype(dtype)


def _by_threads(x, dx, beta, threads=THREADS, repeats=1):
    """``{threads: [(F, S, S without the field, dF), ...]}``, one entry per repeated call."""
    out = {}
    try:
        for t in threads:
            _native.set_exp_threads(t, adaptive=False)
            out[t] = [
                (
                    *_native.exp_field(x, beta),
                    _native.exp_field(x, beta, field=False)[1],
                    _native.exp_tangent(x, dx, beta),
                )
                for _ in range(repeats)
            ]
    finally:
        _native.set_exp_threads()
    return out


def _assert_identical(results):
    first = results[THREADS[0]][0]
    for t, calls in results.items():
        for call in calls:
            for name, a, b in zip(
                ("field", "sum", "sum alone", "tangent"), first, call, strict=True
            ):
                assert a.dtype == b.dtype
                assert np.array_equal(a, b), f"{name} differs with {t} threads"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_system_is_bit_identical_for_any_thread_count(dtype):
    """n = 33 windows + 77 rows: 32 workers, worker 0 taking windows 0 and 32 (the interleaving),
    and a batch of 2 across both branches; each thread count called twice. The values are the
    exp kernel's (checked against the dense sums), not merely equal to each other."""
    n, d = 32 * WINDOW + 77, 3
    x, dx, beta = _inputs(2, n, d, dtype, seed=3)
    results = _by_threads(x, dx, beta, repeats=2)
    _assert_identical(results)
    F, S, S_alone, dF = results[1][0]
    rows = np.r_[0:40, n // 2 : n // 2 + 40, n - 40 : n]  # the right numbers, on a sample of rows
    for b in range(2):  # float32 rounding at most, against float64 dense sums
        xd, dxd, bd = x[b].astype(np.float64), dx[b].astype(np.float64), float(beta[b])
        W = np.exp(bd * (xd[rows] @ xd.T - 1.0))
        C = bd * W * (dxd[rows] @ xd.T + xd[rows] @ dxd.T)
        tol = 2e-6 if dtype == "float32" else 1e-12
        ref_F, ref_dF = W @ xd / n, (C @ xd + W @ dxd) / n
        assert np.abs(F[b][rows] - ref_F).max() <= tol * np.abs(ref_F).max()
        assert np.abs(dF[b][rows] - ref_dF).max() <= tol * np.abs(ref_dF).max()
        if b == 0:  # the weight sum needs all n^2 weights: one system
            ref_S = np.exp(bd * (xd @ xd.T - 1.0)).sum()
            assert abs(S[b] - ref_S) <= tol * ref_S
    np.testing.assert_array_equal(S, S_alone)


@settings(max_examples=8, deadline=None)
@given(
    extra=st.integers(1, 3 * WINDOW),
    d=st.sampled_from([1, 2, 3, 5, 8, 17]),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
def test_windowed_systems_are_bit_identical_property(extra, d, dtype, seed):
    """Any n just past the windowed threshold (5 to 7 windows, the last partial), any dimension
    (specialised and generic), either dtype: the same bits for 1, 2, 3 and 5 threads."""
    x, dx, beta = _inputs(1, 4 * WINDOW + extra, d, dtype, seed)
    _assert_identical(_by_threads(x, dx, beta))


def test_ffi_call_is_bit_identical_for_any_thread_count(x64):
    """Through XLA's FFI (what ``meanfield.kernels`` runs inside jit): the field, the sum and the
    tangent equal the ctypes entry's bits with 1 and 3 threads."""
    x, dx, beta = _inputs(1, 5 * WINDOW + 9, 3, "float64", seed=5)
    field = jax.jit(lambda x, b: _native.exp_field_xla(x, b))
    tangent = jax.jit(
        lambda y, dy, b: jax.ffi.ffi_call(
            _native.EXP_TANGENT_TARGETS["float64"], jax.ShapeDtypeStruct(y.shape, y.dtype)
        )(y, dy, b)
    )
    ref = _by_threads(x, dx, beta, threads=(1,))[1][0]
    try:
        for t in (1, 3):
            _native.set_exp_threads(t, adaptive=False)
            F, S = field(jnp.asarray(x), jnp.asarray(beta))
            dF = tangent(jnp.asarray(x), jnp.asarray(dx), jnp.asarray(beta))
            np.testing.assert_array_equal(np.asarray(F), ref[0])
            np.testing.assert_array_equal(np.asarray(S), ref[1])
            np.testing.assert_array_equal(np.asarray(dF), ref[3])
    finally:
        _native.set_exp_threads()
