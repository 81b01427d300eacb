"""Chunked batching of the exp-kernel fields (``kernels._exp._exp_op``).

A ``vmap`` over systems (seeds, beta grids, nested) must give exactly what a loop over
the systems gives, for the field, the energy and their derivatives, whatever the chunk
size (``kernels.BATCH_BYTES``), and must never form a ``(seeds, n, n)`` array. No timings.
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf

K = mf.kernels


def _xs(S, n, d, seed=0, dtype=jnp.float64):
    keys = jax.random.split(jax.random.key(seed), S)
    return jax.vmap(lambda k: mf.sphere.uniform(k, n, d, dtype))(keys)


def _kernels(d):
    return [
        K.USA(1.3),
        K.USA(2.0, rescaled=True),
        K.RoPE(1.1, 2.5),
        K.Prompt(0.9, K.random_gauges(jax.random.key(3), 3, d, jnp.float64)),
        K.Gauge(1.2, lambda s: mf.sphere.rotation(6.0 * s, d, (0, 1))),
    ]


@pytest.fixture
def small_chunks(monkeypatch):
    """A budget of 3 systems of n = 10 per chunk: 7 systems run as 3 equal padded chunks (the
    XLA formulation: the native kernel, tested in test_kernels_native.py, does not chunk)."""
    monkeypatch.setattr(K._exp, "BATCH_BYTES", 3 * 10 * 10 * 8)
    K._exp._exp_op.cache_clear()
    with K.use_backend("xla"):
        yield
    K._exp._exp_op.cache_clear()


@pytest.mark.parametrize("chunked", [False, True])
def test_vmap_equals_loop(chunked, request, x64):
    """Unchunked: the default path (the native kernel on the CPU when it builds); chunked: XLA."""
    if chunked:
        request.getfixturevalue("small_chunks")
        assert K._exp._batch_chunk(10, None, 8) == 3
    S, n, d = 7, 10, 3
    xs = _xs(S, n, d)
    for kernel in _kernels(d):
        _check_against_loop(kernel, xs, kernel.default_aux(n))


def _check_against_loop(kernel, xs, aux):
    v = jax.jit(jax.vmap(lambda x: mf.velocity(kernel, x, aux)))(xs)
    e = jax.jit(jax.vmap(lambda x: mf.energy(kernel, x, aux)))(xs)
    g = jax.jit(jax.vmap(jax.grad(lambda x: mf.energy(kernel, x, aux))))(xs)
    ref_grad = jax.grad(lambda x: mf.energy(kernel, x, aux, method="pairwise"))
    for i in range(xs.shape[0]):
        ref_v = mf.velocity(kernel, xs[i], aux, method="pairwise")
        ref_e = mf.energy(kernel, xs[i], aux, method="pairwise")
        np.testing.assert_allclose(v[i], ref_v, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(e[i], ref_e, rtol=1e-12)
        np.testing.assert_allclose(g[i], ref_grad(xs[i]), rtol=1e-11, atol=1e-13)


def test_nested_and_batched_parameters(small_chunks, x64):
    """vmap over beta (outer) and seeds (inner), and a vmap over per-system labels."""
    S, n, d = 5, 10, 3
    xs = _xs(S, n, d, seed=1)
    betas = jnp.array([0.5, 1.0, 3.0])
    v = jax.jit(jax.vmap(lambda b: jax.vmap(lambda x: mf.velocity(K.RoPE(b, 2.0), x))(xs)))(betas)
    for j, b in enumerate(np.asarray(betas)):
        for i in range(S):
            ref = mf.velocity(K.RoPE(float(b), 2.0), xs[i], method="pairwise")
            np.testing.assert_allclose(v[j, i], ref, rtol=1e-12, atol=1e-13)
    # labels batched with the states (each system its own positions)
    auxs = jax.vmap(lambda k: jax.random.uniform(k, (n,), jnp.float64))(
        jax.random.split(jax.random.key(2), S)
    )
    kern = K.RoPE(1.5, 3.0)
    v2 = jax.vmap(lambda x, a: mf.velocity(kern, x, a))(xs, auxs)
    for i in range(S):
        np.testing.assert_allclose(
            v2[i], mf.velocity(kern, xs[i], auxs[i], method="pairwise"), rtol=1e-12, atol=1e-13
        )
    # seeds outer, labels inner (labels batched below an unbatched state)
    v3 = jax.vmap(lambda a: mf.velocity(kern, xs[0], a))(auxs)
    for i in range(S):
        np.testing.assert_allclose(
            v3[i], mf.velocity(kern, xs[0], auxs[i], method="pairwise"), rtol=1e-12, atol=1e-13
        )


def test_derivatives_through_the_batched_op(small_chunks, x64):
    """d/dbeta, forward mode and the Riemannian Hessian of a vmapped energy."""
    xs = _xs(4, 10, 3, seed=4)
    f = lambda b, x: mf.energy(K.USA(b), x)  # noqa: E731
    fp = lambda b, x: mf.energy(K.USA(b), x, method="pairwise")  # noqa: E731
    gb = jax.vmap(jax.grad(f), in_axes=(None, 0))(1.7, xs)
    for i in range(4):
        np.testing.assert_allclose(gb[i], jax.grad(fp)(1.7, xs[i]), rtol=1e-12)
    t = jax.random.normal(jax.random.key(5), xs.shape, jnp.float64)
    _, jv = jax.vmap(lambda x, dx: jax.jvp(lambda y: f(1.7, y), (x,), (dx,)))(xs, t)
    for i in range(4):
        _, ref = jax.jvp(lambda y: fp(1.7, y), (xs[i],), (t[i],))
        np.testing.assert_allclose(jv[i], ref, rtol=1e-11)
    H = jax.vmap(jax.hessian(lambda x: f(1.7, x)))(xs)
    for i in range(4):
        np.testing.assert_allclose(
            H[i], jax.hessian(lambda x: fp(1.7, x))(xs[i]), rtol=1e-10, atol=1e-12
        )


def _largest_intermediate(fn, *args) -> int:
    """Elements of the largest array produced anywhere in the jaxpr of ``fn`` (all sub-jaxprs)."""
    biggest = 0

    def walk(jaxpr):
        nonlocal biggest
        for eqn in jaxpr.eqns:
            for v in eqn.outvars:
                biggest = max(biggest, int(np.prod(getattr(v.aval, "shape", ()))))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return biggest


@pytest.mark.parametrize("name", ["USA", "RoPE"])
def test_vmap_never_materialises_all_weight_matrices(name):
    """64 seeds x n = 512 (float32): a plain vmap forms a (64, 512, 512) array (64 MiB);
    the chunked op keeps at most BATCH_BYTES of weights (8 systems) live."""
    S, n, d = 64, 512, 3
    xs = _xs(S, n, d, dtype=jnp.float32)
    kernel = K.USA(1.0) if name == "USA" else K.RoPE(1.0, 2.0)
    chunk = K._exp._batch_chunk(n, None, 4)
    assert 1 <= chunk < S
    big = _largest_intermediate(jax.vmap(lambda x: mf.velocity(kernel, x, backend="xla")), xs)
    assert big <= chunk * n * n, (big, chunk)
    plain = _largest_intermediate(jax.vmap(lambda x: jnp.exp(x @ x.T) @ x), xs)
    assert plain >= S * n * n  # the check can fail: the naive formulation is caught


@pytest.mark.parametrize("d", [2, 3, 8])
def test_gauge_transform_float32_under_jit_and_vmap(d):
    """The gauge transform (a sum of d broadcast products) under jit + vmap in float32:
    a broadcast-multiply-reduce form of it was miscompiled by XLA:CPU at d = 3 (error 0.5)."""
    xs = _xs(24, 256, d, seed=6, dtype=jnp.float32)
    for kernel in (K.RoPE(1.0, 1.0), K.Prompt(1.0, K.random_gauges(jax.random.key(1), 3, d))):
        v = jax.jit(jax.vmap(lambda x, kernel=kernel: mf.velocity(kernel, x)))(xs)
        for i in (0, 23):
            ref = mf.velocity(kernel, xs[i], method="pairwise")
            np.testing.assert_allclose(v[i], ref, rtol=0, atol=5e-7)
