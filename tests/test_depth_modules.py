"""The depth stacks as equinox Modules (issue 26, item 7): ``RMSNorm``, ``CausalSelfAttention``,
``SwiGLU``, the norm placements, ``Block``, ``Stack`` and ``DecoderLM`` of ``meanfield.depth``.

The dict-based functions of ``meanfield.depth`` are thin wrappers over these Modules. The
``_frozen_*`` functions below are a verbatim copy of the dict-based math as it was before the
rebuild (commit e82f970): the same PRNG key must give the same initial weights (exactly) and the
same forward pass, statistics and gradients (float64 to 1e-12, float32 to rounding), so that every
number of ``meanfield reproduce depth`` and the notebooks stays what it was.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import meanfield as mf

D = mf.depth
F64_RTOL = 1e-12
F32_RTOL = 1e-6  # float32: the Modules run the same operations, so rounding-level at most

SIZES = {"d": 8, "d_ff": 12, "heads": 2}

# ----------------------------------------------------------------------------- frozen copy (e82f970)


def _frozen_init_block_params(key, *, d, d_ff, heads, sigma_w=None, dtype=jnp.float32):
    s = 1.0 / math.sqrt(d) if sigma_w is None else sigma_w
    k = jax.random.split(key, 7)
    shapes = {
        "wq": (d, d),
        "wk": (d, d),
        "wv": (d, d),
        "wo": (d, d),
        "w1": (d, d_ff),
        "w3": (d, d_ff),
        "w2": (d_ff, d),
    }
    p = {
        name: s * jax.random.normal(kk, shape, dtype)
        for kk, (name, shape) in zip(k, shapes.items())
    }
    p["g_attn"] = jnp.ones((d,), dtype)
    p["g_ffn"] = jnp.ones((d,), dtype)
    return p


def _frozen_init_stack(key, *, depth, d, d_ff, heads, sigma_w=None, dtype=jnp.float32):
    s = 1.0 / math.sqrt(d) if sigma_w is None else sigma_w
    keys = jax.random.split(key, depth)
    return jax.vmap(
        lambda k: _frozen_init_block_params(k, d=d, d_ff=d_ff, heads=heads, sigma_w=s, dtype=dtype)
    )(keys)


def _frozen_init_lm(key, *, vocab, depth, d, d_ff, heads, sigma_w=None):
    s = 1.0 / math.sqrt(d) if sigma_w is None else sigma_w
    ke, kb, ku = jax.random.split(key, 3)
    return {
        "embed": jax.random.normal(ke, (vocab, d)),
        "blocks": _frozen_init_stack(kb, depth=depth, d=d, d_ff=d_ff, heads=heads, sigma_w=s),
        "final_gain": jnp.ones((d,)),
        "unembed": s * jax.random.normal(ku, (d, vocab)),
    }


def _frozen_rms_rows(Y, g, eps=1e-6):
    return jax.vmap(lambda y: g * y * jax.lax.rsqrt(jnp.mean(y * y) + eps))(Y)


def _frozen_attention_matrix(p, X, heads, alpha_prefix=0.0):
    n, d = X.shape
    dh = d // heads
    q = (X @ p["wq"]).reshape(n, heads, dh)
    k = (X @ p["wk"]).reshape(n, heads, dh)
    logits = jnp.einsum("ihe,jhe->hij", q, k) / math.sqrt(dh)
    logits = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), logits, -jnp.inf)
    C = jnp.tril(jnp.ones((n, n), X.dtype)) / jnp.arange(1, n + 1, dtype=X.dtype)[:, None]
    return jax.nn.softmax(logits, axis=-1) - alpha_prefix * C


def _frozen_attention(p, X, heads, alpha_prefix=0.0):
    n, d = X.shape
    P = _frozen_attention_matrix(p, X, heads, alpha_prefix)
    v = (X @ p["wv"]).reshape(n, heads, d // heads)
    return jnp.einsum("hij,jhe->ihe", P, v).reshape(n, d) @ p["wo"]


def _frozen_swiglu(p, X):
    return (jax.nn.silu(X @ p["w1"]) * (X @ p["w3"])) @ p["w2"]


def _frozen_block(p, X, *, norm, heads, alpha_prefix=0.0, taps=None):
    t = jnp.zeros((4,) + X.shape, X.dtype) if taps is None else taps
    X1 = X + t[0]
    if norm == "post":
        Y1 = X1 + _frozen_attention(p, X1, heads, alpha_prefix) + t[1]
        X2 = _frozen_rms_rows(Y1, p["g_attn"]) + t[2]
        Y2 = X2 + _frozen_swiglu(p, X2) + t[3]
        out = _frozen_rms_rows(Y2, p["g_ffn"])
        N1, N2 = Y1, Y2
    else:
        Y1 = (
            X1 + _frozen_attention(p, _frozen_rms_rows(X1, p["g_attn"]), heads, alpha_prefix) + t[1]
        )
        X2 = Y1 + t[2]
        Y2 = X2 + _frozen_swiglu(p, _frozen_rms_rows(X2, p["g_ffn"])) + t[3]
        out = Y2
        N1, N2 = X1, X2
    return out, {"X1": X1, "Y1": Y1, "X2": X2, "Y2": Y2, "N1": N1, "N2": N2}


def _frozen_stats(states, out):
    ts = mf.metrics.token_similarity

    def rms_factor(Y):
        return jnp.mean(math.sqrt(Y.shape[-1]) / jnp.linalg.norm(Y, axis=-1))

    return {
        "t_x1": ts(states["X1"]),
        "t_y1": ts(states["Y1"]),
        "t_x2": ts(states["X2"]),
        "t_y2": ts(states["Y2"]),
        "t_out": ts(out),
        "rms_attn": rms_factor(states["N1"]),
        "rms_ffn": rms_factor(states["N2"]),
        "norm_out": jnp.mean(jnp.linalg.norm(out, axis=-1)) / math.sqrt(out.shape[-1]),
    }


def _frozen_forward(blocks, X, *, norm, heads, alpha_prefix=0.0, taps=None):
    def body(x, layer):
        p, tp = layer
        out, states = _frozen_block(
            p, x, norm=norm, heads=heads, alpha_prefix=alpha_prefix, taps=tp
        )
        return out, _frozen_stats(states, out)

    depth = jax.tree_util.tree_leaves(blocks)[0].shape[0]
    if taps is None:
        taps = jnp.zeros((depth, 4) + X.shape, X.dtype)
    return jax.lax.scan(body, X, (blocks, taps))


def _frozen_lm_logits(params, tokens, *, norm, heads):
    H, stats = _frozen_forward(params["blocks"], params["embed"][tokens], norm=norm, heads=heads)
    if norm == "pre":
        H = _frozen_rms_rows(H, params["final_gain"])
    stats["t_final"] = mf.metrics.token_similarity(H)
    return H @ params["unembed"], stats


def _frozen_lm_loss(params, tokens, *, norm, heads):
    def one(tok, y):
        logits, _ = _frozen_lm_logits(params, tok, norm=norm, heads=heads)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=-1))

    return jnp.mean(jax.vmap(one)(tokens[:, :-1], tokens[:, 1:]))


# ----------------------------------------------------------------------------- helpers


def _assert_trees_close(a, b, rtol, atol=0.0):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, y.dtype, x.shape, y.shape)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def _assert_trees_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _tokens(key, vocab, batch, length):
    return D.sample_tokens(
        key, *D.zipf_markov_source(jax.random.key(123), vocab=vocab), batch=batch, length=length
    )


# ----------------------------------------------------------------------------- same key, same weights


def test_same_key_same_initial_weights():
    key = jax.random.key(21)
    # eager, as the dict functions are called in the reproduction and the notebooks
    frozen = _frozen_init_block_params(key, **SIZES, sigma_w=0.3)
    blk = D.Block.init(key, **SIZES, sigma_w=0.3)
    _assert_trees_equal(blk.to_params(), frozen)
    _assert_trees_equal(D.init_block_params(key, **SIZES, sigma_w=0.3), frozen)
    frozen_stack = _frozen_init_stack(key, depth=2, **SIZES)
    _assert_trees_equal(D.Stack.init(key, depth=2, **SIZES).to_params(), frozen_stack)
    # the Module's leaves are the parameter arrays, nothing else
    assert len(jax.tree_util.tree_leaves(blk)) == 9


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_same_key_same_initial_weights_traced(x64, dtype):
    """Inside a program (``init_trace`` draws its stack there, ``sigma_w`` a traced leaf)."""
    key, sw = jax.random.key(21), jnp.asarray(0.3, dtype)
    _assert_trees_equal(
        jax.jit(lambda k, s: D.init_stack(k, depth=2, **SIZES, sigma_w=s, dtype=dtype))(key, sw),
        jax.jit(lambda k, s: _frozen_init_stack(k, depth=2, **SIZES, sigma_w=s, dtype=dtype))(
            key, sw
        ),
    )


def test_same_key_same_language_model():
    key, kw = jax.random.key(22), {"vocab": 7, "depth": 2, **SIZES}
    frozen = _frozen_init_lm(key, **kw)
    _assert_trees_equal(D.init_lm(key, **kw), frozen)
    _assert_trees_equal(D.DecoderLM.init(key, **kw).to_params(), frozen)
    with jax.enable_x64(
        True
    ):  # dtype=None: JAX's default float outside the blocks, as init_lm always did
        frozen64 = jax.jit(lambda k: _frozen_init_lm(k, **kw))(key)
        assert (
            frozen64["embed"].dtype == jnp.float64 and frozen64["blocks"]["wq"].dtype == jnp.float32
        )
        _assert_trees_equal(jax.jit(lambda k: D.init_lm(k, **kw))(key), frozen64)
        lm = eqx.filter_jit(lambda k: D.DecoderLM.init(k, **kw, dtype=jnp.float64))(key)
        assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(lm)} == {jnp.dtype(jnp.float64)}


# ----------------------------------------------------------------------------- same numbers


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_block_and_stack_match_the_dict_math_float64(x64, norm):
    k1, k2, k3 = jax.random.split(jax.random.key(23), 3)
    blocks = _frozen_init_stack(k1, depth=3, **SIZES, sigma_w=0.5, dtype=jnp.float64)
    # gains away from 1, so that the order of the RMSNorm products is tested too
    blocks = {
        **blocks,
        "g_attn": 1 + 0.3 * jax.random.normal(k3, (3, 8), jnp.float64),
        "g_ffn": 1 - 0.2 * jax.random.normal(k2, (3, 8), jnp.float64),
    }
    X = D.gaussian_tokens(k2, 6, 8, jnp.float64)
    taps = 0.1 * jax.random.normal(k3, (3, 4, 6, 8), jnp.float64)
    alphas = jnp.array([0.0, 0.3])
    stack = D.Stack.from_params(blocks, norm=norm, heads=2)
    want = jax.jit(
        jax.vmap(
            lambda a: _frozen_forward(blocks, X, norm=norm, heads=2, alpha_prefix=a, taps=taps)
        )
    )(alphas)
    got = eqx.filter_jit(jax.vmap(lambda a: stack(X, alpha_prefix=a, taps=taps)))(alphas)
    _assert_trees_close(got, want, F64_RTOL, 1e-14)
    got = jax.jit(
        jax.vmap(lambda a: D.forward(blocks, X, norm=norm, heads=2, alpha_prefix=a, taps=taps))
    )(alphas)
    _assert_trees_close(got, want, F64_RTOL, 1e-14)

    def pieces(block_fn, attention_matrix, attention, swiglu, rms_rows):
        p0 = jax.tree_util.tree_map(lambda a: a[0], blocks)
        return (
            block_fn(p0, X, norm=norm, heads=2, alpha_prefix=0.3, taps=taps[0]),
            attention_matrix(p0, X, 2, 0.3),
            attention(p0, X, 2, 0.3),
            swiglu(p0, X),
            rms_rows(X, p0["g_attn"]),
        )

    want = jax.jit(
        lambda: pieces(
            _frozen_block,
            _frozen_attention_matrix,
            _frozen_attention,
            _frozen_swiglu,
            _frozen_rms_rows,
        )
    )()
    got = jax.jit(
        lambda: pieces(
            D.block,
            D.causal_attention_matrix,
            D.attention,
            D.swiglu,
            lambda Y, g: jax.vmap(D.RMSNorm(g))(Y),
        )
    )()
    _assert_trees_close(got, want, F64_RTOL, 1e-14)
    got = jax.jit(
        lambda: pieces(
            lambda p, X, **kw: D.Block.from_params(p, norm=kw.pop("norm"), heads=kw.pop("heads"))(
                X, **kw
            ),
            lambda p, X, h, a: D.CausalSelfAttention(
                p["wq"], p["wk"], p["wv"], p["wo"], heads=h
            ).attention_matrix(X, alpha_prefix=a),
            lambda p, X, h, a: D.CausalSelfAttention(p["wq"], p["wk"], p["wv"], p["wo"], heads=h)(
                X, alpha_prefix=a
            ),
            lambda p, X: jax.vmap(D.SwiGLU(p["w1"], p["w3"], p["w2"]))(X),
            lambda Y, g: jax.vmap(lambda y: D.rms_norm(y, g))(Y),
        )
    )()
    _assert_trees_close(got, want, F64_RTOL, 1e-14)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_language_model_and_gradients_match_the_dict_math_float64(x64, norm):
    params = jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float64),
        _frozen_init_lm(jax.random.key(24), vocab=7, depth=2, **SIZES, sigma_w=0.5),
    )
    params["final_gain"] = params["final_gain"] * 1.3
    toks = _tokens(jax.random.key(25), 7, 3, 6)
    want_logits = jax.jit(lambda p: _frozen_lm_logits(p, toks[0], norm=norm, heads=2))(params)
    _assert_trees_close(
        jax.jit(lambda p: D.lm_logits(p, toks[0], norm=norm, heads=2))(params),
        want_logits,
        F64_RTOL,
        1e-14,
    )
    lm = D.DecoderLM.from_params(params, norm=norm, heads=2)
    _assert_trees_close(eqx.filter_jit(lambda m: m(toks[0]))(lm), want_logits, F64_RTOL, 1e-14)
    want_loss, want_grads = jax.jit(
        jax.value_and_grad(lambda p: _frozen_lm_loss(p, toks, norm=norm, heads=2))
    )(params)
    (loss, _), grads = jax.jit(
        jax.value_and_grad(lambda p: D.lm_loss(p, toks, norm=norm, heads=2), has_aux=True)
    )(params)
    np.testing.assert_allclose(loss, want_loss, rtol=F64_RTOL)
    _assert_trees_close(grads, want_grads, F64_RTOL, 1e-14)
    # gradients with respect to the Module itself are the same arrays
    mgrads = eqx.filter_jit(
        eqx.filter_grad(
            lambda m: jnp.mean(
                jax.vmap(
                    lambda t, y: (
                        -jnp.mean(
                            jnp.take_along_axis(jax.nn.log_softmax(m(t)[0]), y[:, None], axis=-1)
                        )
                    )
                )(toks[:, :-1], toks[:, 1:])
            )
        )
    )(lm)
    _assert_trees_close(mgrads.to_params(), want_grads, F64_RTOL, 1e-14)


def test_float32_forward_matches_the_dict_math():
    blocks = _frozen_init_stack(jax.random.key(26), depth=4, **SIZES)
    X = D.gaussian_tokens(jax.random.key(27), 9, 8)
    for norm in D.NORMS:
        want = jax.jit(
            lambda b, x, norm=norm: _frozen_forward(b, x, norm=norm, heads=2, alpha_prefix=0.2)
        )(blocks, X)
        got = jax.jit(
            lambda b, x, norm=norm: D.forward(b, x, norm=norm, heads=2, alpha_prefix=0.2)
        )(blocks, X)
        _assert_trees_close(got, want, F32_RTOL, 1e-7)


def test_init_trace_matches_the_dict_math():
    """``init_trace`` (the reproduction's forward sweep) against the frozen stack on the same draws."""
    key, kw = jax.random.key(28), {"depth": 2, "n": 10, **SIZES}

    @jax.jit
    def frozen(key):
        kx, kp = jax.random.split(key)
        blocks = _frozen_init_stack(kp, depth=2, **SIZES, sigma_w=0.4)
        return {
            norm: _frozen_forward(
                blocks, D.gaussian_tokens(kx, 10, 8), norm=norm, heads=2, alpha_prefix=0.5
            )[1]
            for norm in D.NORMS
        }

    want = frozen(key)
    for norm in D.NORMS:
        got = D.init_trace(key, norm=norm, sigma_w=0.4, alpha_prefix=0.5, **kw)
        for k, v in want[norm].items():
            np.testing.assert_allclose(got[k], v, rtol=F32_RTOL, atol=1e-7, err_msg=k)


# ----------------------------------------------------------------------------- training with optax


def test_train_lm_matches_an_explicit_optax_loop_and_trains_the_module():
    """``train_lm`` (dict parameters) against an optax loop on the frozen loss, and the same loop
    run directly on a ``DecoderLM`` Module with ``equinox.filter_value_and_grad``."""
    V, norm = 7, "post"
    params = D.init_lm(jax.random.key(29), vocab=V, depth=2, **SIZES)
    data = _tokens(jax.random.key(30), V, 3 * 2, 6).reshape(3, 2, 6)
    _, hist = D.train_lm(params, data, 3e-2, norm=norm, heads=2, warmup=1)
    opt = D.make_optimizer(3e-2, steps=3, warmup=1)

    def loop(p, loss_fn, value_and_grad, apply):
        @eqx.filter_jit
        def step(p, state, batch):
            loss, g = value_and_grad(loss_fn)(p, batch)
            upd, state = opt.update(g, state, eqx.filter(p, eqx.is_array))
            return apply(p, upd), state, loss

        state, losses = opt.init(eqx.filter(p, eqx.is_array)), []
        for batch in data:
            p, state, loss = step(p, state, batch)
            losses.append(float(loss))
        return p, np.asarray(losses)

    _, want = loop(
        params,
        lambda p, b: _frozen_lm_loss(p, b, norm=norm, heads=2),
        jax.value_and_grad,
        optax.apply_updates,
    )
    np.testing.assert_allclose(hist["loss"], want, rtol=1e-5)
    assert want[-1] < want[0]  # it trains

    def module_loss(m, batch):
        ce = jax.vmap(
            lambda t, y: (
                -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(m(t)[0]), y[:, None], axis=-1))
            )
        )
        return jnp.mean(ce(batch[:, :-1], batch[:, 1:]))

    lm, got = loop(
        D.DecoderLM.from_params(params, norm=norm, heads=2),
        module_loss,
        eqx.filter_value_and_grad,
        eqx.apply_updates,
    )
    assert isinstance(lm, D.DecoderLM) and isinstance(lm.stack.placement, D.PostNorm)
    np.testing.assert_allclose(got, want, rtol=1e-5)


# ----------------------------------------------------------------------------- structure and errors


def test_norm_placement_is_a_module_field():
    assert tuple(cls.name for cls in (D.PostNorm, D.PreNorm)) == D.NORMS
    post = D.Stack.init(jax.random.key(31), depth=2, **SIZES, norm="post")
    pre = D.Stack.init(jax.random.key(31), depth=2, **SIZES, norm=D.PreNorm())
    assert isinstance(post.placement, D.PostNorm) and isinstance(pre.placement, D.PreNorm)
    assert post.depth == 2 and post.blocks.attention.wq.shape == (2, 8, 8)
    # same weights, different placement: the placement carries no leaves, only structure
    _assert_trees_equal(post.to_params(), pre.to_params())
    assert jax.tree_util.tree_structure(post) != jax.tree_util.tree_structure(pre)
    assert jax.tree_util.tree_leaves(D.PostNorm()) == []
    X = D.gaussian_tokens(jax.random.key(32), 5, 8)
    out_post, out_pre = post(X)[0], pre(X)[0]
    # Post-Norm outputs are RMS-normalised rows, Pre-Norm outputs are not
    np.testing.assert_allclose(jnp.linalg.norm(out_post, axis=-1), math.sqrt(8), rtol=1e-5)
    assert not np.allclose(jnp.linalg.norm(out_pre, axis=-1), math.sqrt(8), rtol=1e-2)
    # a custom observable is saved per layer instead of the default statistics
    _, obs = post(X, observe=lambda states, out: jnp.sum(out**2))
    assert obs.shape == (2,)
    np.testing.assert_allclose(obs, 5 * 8, rtol=1e-5)


@pytest.mark.parametrize("bad", ["mid", "Post"])
def test_invalid_norm_is_one_value_error(bad):
    msg = f"unknown norm {bad!r}; accepted: 'post', 'pre'"
    p = D.init_block_params(jax.random.key(0), **SIZES)
    blocks = D.init_stack(jax.random.key(0), depth=2, **SIZES)
    X = D.gaussian_tokens(jax.random.key(1), 4, 8)
    calls = [
        lambda: D.forward(blocks, X, norm=bad, heads=2),
        lambda: D.block(p, X, norm=bad, heads=2),
        lambda: D.Block.init(jax.random.key(0), **SIZES, norm=bad),
        lambda: D.Stack.from_params(blocks, norm=bad, heads=2),
        lambda: D.similarity_profile(jax.random.key(0), depth=2, n=4, **SIZES, norm=bad),
        lambda: D.lm_logits(
            D.init_lm(jax.random.key(0), vocab=5, depth=2, **SIZES),
            jnp.arange(3),
            norm=bad,
            heads=2,
        ),
    ]
    for call in calls:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == msg


def test_module_invariants():
    p = D.init_block_params(jax.random.key(0), **SIZES)
    with pytest.raises(ValueError, match="heads must divide d, got d = 8, heads = 3"):
        D.CausalSelfAttention(p["wq"], p["wk"], p["wv"], p["wo"], heads=3)
    with pytest.raises(ValueError, match="stacked on a leading"):
        D.Stack(D.Block.from_params(p, norm="post", heads=2))
    with pytest.raises(ValueError, match="heads must divide d"):
        D.Block.init(jax.random.key(0), d=8, d_ff=4, heads=3)
