"""The attention variants of issue 28 against closed forms and brute-force loops (float64).

Heads and random weight ensembles, positional masks on every registered kernel, Sinkhorn and
hardmax attention, the redraw of random weights (``regen_period``), derivatives through
``mf.simulate`` and the refusals of inconsistent parameters. The equality with the public
simulators is tests/test_simulator_equality.py.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_sims import lim_build_causal_weights, sinkformers_sinkhorn

import meanfield as mf

SA = mf.models.SelfAttention


def _states(seed: int, n: int, d: int = 3) -> jax.Array:
    return mf.sphere.uniform(jax.random.key(seed), n, d, dtype=jnp.float64)


def _stacks(seed: int, H: int, d: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=(H, d, d)) / math.sqrt(d) for _ in range(3))  # type: ignore[return-value]


def _loop_field(x, Q, K, V, beta, normalized=True):
    """F_i = (1/H) sum_h sum_j A^h_ij V_h x_j by explicit Python loops."""
    x = np.asarray(x)
    n, d = x.shape
    H = Q.shape[0]
    F = np.zeros((n, d))
    for h in range(H):
        for i in range(n):
            logits = np.array([beta * (Q[h] @ x[i]) @ (K[h] @ x[j]) for j in range(n)])
            if normalized:
                a = np.exp(logits - logits.max())
                a = a / a.sum()
            else:
                a = np.exp(logits) / n
            for j in range(n):
                F[i] += a[j] * (V[h] @ x[j]) / H
    return F


# -- 1. heads and weights -----------------------------------------------------------------------


@pytest.mark.parametrize("normalized", [True, False])
def test_multi_head_field_is_the_average_of_heads(x64, normalized):
    x = _states(0, 7)
    Q, K, V = _stacks(1, 3)
    got = mf.field(SA(1.7, Q, K, V, normalized=normalized), x)
    np.testing.assert_allclose(
        got, _loop_field(x, Q, K, V, 1.7, normalized), rtol=1e-12, atol=1e-13
    )


def test_one_matrix_is_one_head_and_identical_heads_are_one_head(x64):
    x = _states(2, 6)
    Q, K, V = _stacks(3, 1)
    one = mf.field(SA(2.0, Q[0], K[0], V[0]), x)
    np.testing.assert_allclose(mf.field(SA(2.0, Q, K, V), x), one, rtol=1e-13, atol=1e-14)
    same = [np.repeat(M, 4, axis=0) for M in (Q, K, V)]
    np.testing.assert_allclose(mf.field(SA(2.0, *same), x), one, rtol=1e-13, atol=1e-14)
    # a (d, d) matrix is shared by every head of a stack
    Qs, Ks, Vs = _stacks(4, 3)
    shared = mf.field(SA(2.0, Qs, Ks, V[0]), x)
    np.testing.assert_allclose(
        shared, _loop_field(x, Qs, Ks, np.repeat(V, 3, axis=0), 2.0), rtol=1e-12, atol=1e-13
    )
    assert SA(2.0, Qs, Ks, V[0]).num_heads() == 3


@pytest.mark.parametrize("ensemble", ["identity", "gaussian", "symmetric", "gpt2"])
@pytest.mark.parametrize("value", ["identity", "gaussian", "+qk", "-qk"])
def test_random_weights_shapes_symmetry_and_qk_relations(x64, ensemble, value):
    d, H = 4, 3
    Q, K, V = mf.models.random_weights(
        jax.random.key(5), d, heads=H, ensemble=ensemble, value=value, dtype=jnp.float64
    )
    assert Q.shape == K.shape == V.shape == (H, d, d)
    assert Q.dtype == K.dtype == V.dtype == jnp.float64
    eye = np.broadcast_to(np.eye(d), (H, d, d))
    if ensemble == "identity":
        np.testing.assert_array_equal(Q, eye)
        np.testing.assert_array_equal(K, eye)
    if ensemble == "symmetric":
        np.testing.assert_array_equal(K, np.swapaxes(K, 1, 2))
    qk = np.einsum("hki,hkj->hij", Q, K)
    norm = {"identity": 1.0, "gaussian": math.sqrt(d), "symmetric": math.sqrt(d + 1), "gpt2": 1.0}
    if value == "identity":
        np.testing.assert_array_equal(V, eye)
    elif value in ("+qk", "-qk"):
        sign = 1.0 if value == "+qk" else -1.0
        np.testing.assert_allclose(V, sign * qk / norm[ensemble], rtol=1e-14, atol=1e-15)
    # the heads are independent draws
    if ensemble != "identity":
        assert not np.allclose(K[0], K[1])
    # same key, same weights; another key, other weights
    again = mf.models.random_weights(
        jax.random.key(5), d, heads=H, ensemble=ensemble, value=value, dtype=jnp.float64
    )
    for a, b in zip((Q, K, V), again):
        np.testing.assert_array_equal(a, b)
    other = mf.models.random_weights(
        jax.random.key(6), d, heads=H, ensemble=ensemble, value=value, dtype=jnp.float64
    )
    if ensemble != "identity" or value == "gaussian":
        assert any(not np.array_equal(a, b) for a, b in zip((Q, K, V), other))


def _assert_moments(entries, mean, var, k=5.0):
    """Sample mean and variance of ``entries`` within ``k`` standard errors (computed here)."""
    e = np.asarray(entries, dtype=np.float64).ravel()
    N = e.size
    se_mean = math.sqrt(var / N)
    centred2 = (e - mean) ** 2
    se_var = np.std(centred2) / math.sqrt(N)
    assert abs(e.mean() - mean) < k * se_mean, (e.mean(), mean, se_mean)
    assert abs(centred2.mean() - var) < k * se_var, (centred2.mean(), var, se_var)


def test_random_weight_moments(x64):
    d, H = 4, 4000
    key = jax.random.key(11)
    Q, K, V = mf.models.random_weights(
        key, d, heads=H, ensemble="gaussian", value="gaussian", dtype=jnp.float64
    )
    qk = np.einsum("hki,hkj->hij", Q, K)
    _assert_moments(qk, 0.0, 1.0)  # Q^T K = G1 G2 / sqrt(d): entries of variance 1
    _assert_moments(V, 0.0, 1.0 / d)
    _, Ks, _ = mf.models.random_weights(key, d, heads=H, ensemble="symmetric", dtype=jnp.float64)
    off = ~np.eye(d, dtype=bool)
    _assert_moments(np.asarray(Ks)[:, off], 0.0, 1.0)  # GOE: off-diagonal variance 1
    _assert_moments(np.diagonal(np.asarray(Ks), axis1=1, axis2=2), 0.0, 2.0)  # diagonal 2
    Qg, Kg, _ = mf.models.random_weights(key, d, heads=H, ensemble="gpt2", dtype=jnp.float64)
    _assert_moments(np.einsum("hki,hkj->hij", Qg, Kg), 0.0, 0.02**2)  # GPT-2: std 0.02


def test_drawn_weights_are_those_of_random_weights(x64):
    x = _states(12, 6)
    m = SA(1.5, weights="gaussian", value="gaussian", heads=3, weight_seed=7)
    Q, K, V = mf.models.random_weights(
        jax.random.key(7), 3, heads=3, ensemble="gaussian", value="gaussian", dtype=jnp.float64
    )
    want = _loop_field(x, *(np.asarray(M) for M in (Q, K, V)), 1.5)
    np.testing.assert_allclose(mf.field(m, x), want, rtol=1e-12, atol=1e-13)


# -- 2. masks -----------------------------------------------------------------------------------

MASKS = [
    mf.masks.Causal(),
    mf.masks.Causal(include_self=False, normalized=True),
    mf.masks.ALiBi(0.7),
    mf.masks.ALiBi(1.3, include_self=False, normalized=True),
    mf.masks.Window(1),
    mf.masks.Window(2, causal=True, include_self=False),
]


def _mask_weights(mask, n):
    """w_ij and the pair weights m_ij of ``mask`` written out from the definitions of mf.masks."""
    w = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if not mask.include_self and i == j:
                continue
            if isinstance(mask, mf.masks.Causal) and j <= i:
                w[i, j] = 1.0
            elif isinstance(mask, mf.masks.ALiBi) and j <= i:
                w[i, j] = math.exp(-(float(mask.slope) / n) * (i - j))
            elif isinstance(mask, mf.masks.Window):
                inside = 0 <= i - j <= mask.width if mask.causal else abs(i - j) <= mask.width
                w[i, j] = 1.0 if inside else 0.0
    if not mask.normalized:
        return w, w / n
    rows = w.sum(axis=1, keepdims=True)
    return w, np.divide(w, rows, out=np.zeros_like(w), where=rows > 0)


KERNELS = [name for name in mf.kernels.MODELS if name != "sa"]


@pytest.mark.parametrize("name", KERNELS)
def test_masked_kernel_field_is_the_brute_force_sum(x64, name):
    n = 5
    x = _states(20, n)
    plain = mf.kernels.make(name, d=3, dtype=jnp.float64)
    aux = plain.default_aux(n)
    G = np.array(
        [[np.asarray(plain.grad_x(x[i], aux[i], x[j], aux[j])) for j in range(n)] for i in range(n)]
    )
    for mask in MASKS:
        if mf.masks.from_params(mf.masks.to_params(mask)) == mask:
            kernel = mf.kernels.make(name, d=3, dtype=jnp.float64, **mf.masks.to_params(mask))
        else:  # Window(causal=True) has no registry parameter (test_mask_params_round_trip)
            kernel = dataclasses.replace(plain, mask=mask)
        assert kernel.mask == mask
        _, m = _mask_weights(mask, n)
        np.testing.assert_allclose(
            np.asarray(mask.pair_weights(n, jnp.float64)), m, rtol=1e-14, atol=1e-300
        )
        want = np.einsum("ij,ijd->id", m, G)
        np.testing.assert_allclose(mf.field(kernel, x), want, rtol=1e-12, atol=1e-13)
        assert kernel.has_energy is False
        with pytest.raises(TypeError, match="no pair energy"):
            mf.energy(kernel, x)
    # a window as wide as the sequence is no mask
    wide = mf.kernels.make(name, d=3, dtype=jnp.float64, mask="window", width=n)
    np.testing.assert_allclose(mf.field(wide, x), mf.field(plain, x), rtol=1e-12, atol=1e-13)
    assert type(plain).has_energy is True


@pytest.mark.parametrize("mask", MASKS)
def test_mask_params_round_trip(mask):
    assert mf.masks.from_params(mf.masks.to_params(mask)) == mask


def test_causal_first_token_has_no_field_and_never_moves(x64):
    x = _states(21, 6)
    models = (
        mf.kernels.USA(1.5, mask=mf.masks.Causal(include_self=False)),
        SA(2.0, *_stacks(22, 2), mask=mf.masks.Causal(include_self=False)),
        mf.kernels.make("rope", d=3, beta=1.0, mask="causal", include_self=False),
    )
    for k, model in enumerate(models):
        F = mf.field(model, x)
        np.testing.assert_array_equal(F[0], 0.0)
        assert np.all(np.linalg.norm(F[1:], axis=-1) > 0)
        if k < 2:
            traj = mf.simulate(model, x, t1=1.0, dt=0.1, solver="euler", ts=jnp.linspace(0, 1, 3))
            np.testing.assert_array_equal(traj.xs[:, 0], np.broadcast_to(x[0], (3, 3)))
            assert not np.allclose(traj.xs[-1, 1:], x[1:])


def test_sa_causal_weights_vanish_above_the_diagonal(x64):
    x = _states(23, 7)
    n = 7
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    for model in (
        SA(1.3, mask=mf.masks.Causal()),
        SA(1.3, *_stacks(24, 3), mask=mf.masks.Causal()),
        SA(1.3, mask=mf.masks.Causal(), attention="sinkhorn", sinkhorn_iters=5),
        SA(1.3, mask=mf.masks.Causal(), attention="hardmax"),
        SA(1.3, mask=mf.masks.Causal(), normalized=False),
    ):
        A = np.asarray(mf.models.attention_matrix(model, x))
        np.testing.assert_array_equal(A[..., upper], 0.0)
        if model.normalized:
            np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-12)
    # causal softmax, row i: the softmax over j <= i of the logits
    Q, K, V = _stacks(25, 1)
    A = np.asarray(mf.models.attention_matrix(SA(1.3, Q, K, V, mask=mf.masks.Causal()), x))
    assert A.shape == (1, n, n)  # a (1, d, d) stack is one head on a head axis
    A = A[0]
    L = 1.3 * (np.asarray(x) @ Q[0].T) @ (np.asarray(x) @ K[0].T).T
    for i in range(n):
        e = np.exp(L[i, : i + 1] - L[i, : i + 1].max())
        np.testing.assert_allclose(A[i, : i + 1], e / e.sum(), rtol=1e-13)


def test_alibi_weights_are_lost_in_the_middle_weights(x64):
    for n in (2, 5, 16, 64):
        for lam in (0.0, 1.0, 2.5):
            got = np.asarray(
                mf.masks.ALiBi(lam, include_self=False, normalized=True).pair_weights(
                    n, jnp.float64
                )
            )
            want = lim_build_causal_weights(n, lam)
            np.testing.assert_array_equal(got == 0.0, want == 0.0)
            # equal up to the order of the row sum (XLA's reduction vs NumPy's): a sum of up to n
            # terms in another order differs by up to ~n ulp in the worst case (5 seen at n = 64)
            np.testing.assert_array_max_ulp(got, want, maxulp=max(4, n))


# -- 3. Sinkhorn --------------------------------------------------------------------------------


def _logits(x, Q, K, beta):
    x = np.asarray(x)
    return beta * np.einsum("hid,hjd->hij", x @ np.swapaxes(Q, 1, 2), x @ np.swapaxes(K, 1, 2))


def test_sinkhorn_converges_to_a_doubly_stochastic_matrix(x64):
    x = _states(30, 8)
    Q, K, V = _stacks(31, 2)
    A = np.asarray(
        mf.models.attention_matrix(SA(2.0, Q, K, V, attention="sinkhorn", sinkhorn_iters=401), x)
    )
    assert A.shape == (2, 8, 8)
    np.testing.assert_allclose(A.sum(-1), 1.0, atol=1e-12)  # odd count: ends on rows
    np.testing.assert_allclose(A.sum(-2), 1.0, atol=1e-6)
    assert np.all(A > 0)


def test_sinkhorn_one_iteration_is_softmax(x64):
    x = _states(32, 7)
    Q, K, V = _stacks(33, 3)
    sk = SA(1.7, Q, K, V, attention="sinkhorn", sinkhorn_iters=1)
    sm = SA(1.7, Q, K, V)
    np.testing.assert_allclose(
        mf.models.attention_matrix(sk, x), mf.models.attention_matrix(sm, x), rtol=1e-14
    )
    np.testing.assert_allclose(mf.field(sk, x), mf.field(sm, x), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("iters", [1, 3, 5, 7, 21])
def test_sinkhorn_equals_sinkformers(x64, iters):
    x = _states(34, 6)
    Q, K, V = _stacks(35, 2)
    model = SA(1.9, Q, K, V, attention="sinkhorn", sinkhorn_iters=iters)
    A = np.asarray(mf.models.attention_matrix(model, x))
    want = sinkformers_sinkhorn(_logits(x, Q, K, 1.9), iters)
    np.testing.assert_allclose(A, want, rtol=1e-12, atol=1e-14)
    F = np.einsum("hij,hjd->id", want, np.asarray(x) @ np.swapaxes(V, 1, 2)) / 2
    np.testing.assert_allclose(mf.field(model, x), F, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("iters", [1, 3])
def test_sinkhorn_with_an_empty_mask_row_is_finite(x64, iters):
    # Causal(include_self=False): row 0 admits nothing (its field should be 0, as for softmax and
    # hardmax) and column n - 1 is admitted by nobody; the log-domain row/column steps take
    # logsumexp of an all -inf row/column: NaN (row 0 at iters = 1, everything from iters = 3).
    x = _states(36, 4)
    model = SA(
        1.0, attention="sinkhorn", sinkhorn_iters=iters, mask=mf.masks.Causal(include_self=False)
    )
    F = np.asarray(mf.field(model, x))
    assert np.all(np.isfinite(F))
    np.testing.assert_array_equal(F[0], 0.0)


# -- 4. hardmax ---------------------------------------------------------------------------------


def _brute_hardmax(scores, admitted, tol):
    n = scores.shape[-1]
    out = np.zeros_like(scores)
    for i in range(n):
        js = [j for j in range(n) if admitted[i, j]]
        if not js:
            continue
        top = max(scores[i, j] for j in js)
        chosen = [j for j in js if scores[i, j] >= top - tol]
        for j in chosen:
            out[i, j] = 1.0 / len(chosen)
    return out


def _tied_states():
    x = np.array(_states(40, 7))
    x[4] = x[1]  # duplicated tokens: equal scores, a tie
    x[6] = x[1]
    return jnp.asarray(x)


@pytest.mark.parametrize("mask", [None, mf.masks.Causal(include_self=False), mf.masks.Window(2)])
def test_hardmax_is_the_brute_force_argmax_with_ties_averaged(x64, mask):
    x = _tied_states()
    n = x.shape[0]
    admitted = np.ones((n, n), dtype=bool) if mask is None else mask.admitted(n)
    for weights in (None, _stacks(41, 1)):
        QKV = (None, None, None) if weights is None else weights
        model = SA(3.0, *QKV, attention="hardmax", mask=mask)
        A = np.asarray(mf.models.attention_matrix(model, x))
        Qh = np.eye(3)[None] if weights is None else weights[0]
        Kh = np.eye(3)[None] if weights is None else weights[1]
        Vh = np.eye(3)[None] if weights is None else weights[2]
        scores = _logits(x, Qh, Kh, 1.0)[0]
        want = _brute_hardmax(scores, admitted, model.tie_tol)
        np.testing.assert_array_equal(A.reshape(want.shape), want)
        np.testing.assert_allclose(
            mf.field(model, x), want @ (np.asarray(x) @ Vh[0].T), rtol=1e-14, atol=1e-15
        )
    if mask is None:  # with Q = K = I, a token's maximiser is itself and its copies
        A = np.asarray(mf.models.attention_matrix(SA(3.0, attention="hardmax"), x))
        np.testing.assert_array_equal(A[1, [1, 4, 6]], 1.0 / 3.0)


def test_hardmax_does_not_depend_on_beta(x64):
    x = _tied_states()
    Q, K, V = _stacks(42, 2)
    fields = [
        np.asarray(mf.field(SA(b, Q, K, V, attention="hardmax", mask=mf.masks.Causal()), x))
        for b in (0.1, 1.0, 50.0)
    ]
    np.testing.assert_array_equal(fields[0], fields[1])
    np.testing.assert_array_equal(fields[0], fields[2])


# -- 5. regen_period ----------------------------------------------------------------------------


def test_weights_are_redrawn_exactly_at_multiples_of_the_period(x64):
    m = SA(1.0, weights="gaussian", value="gaussian", heads=2, weight_seed=3, regen_period=0.5)

    def stacks(t):
        return [np.asarray(M) for M in m.at_time(t).weight_stacks(3, jnp.float64)]

    epochs = {0: (0.0, 0.25, 0.4999), 1: (0.5, 0.75, 0.9999), 2: (1.0, 1.25), 3: (1.5,)}
    firsts = {}
    for epoch, times in epochs.items():
        first = stacks(times[0])
        firsts[epoch] = first
        assert int(m.at_time(times[0]).epoch) == epoch
        for t in times[1:]:
            for a, b in zip(first, stacks(t)):
                np.testing.assert_array_equal(a, b)
    for e1 in firsts:
        for e2 in firsts:
            if e1 < e2:
                assert all(not np.allclose(a, b) for a, b in zip(firsts[e1], firsts[e2]))
    # without a period the weights are those of the seed, whatever the time
    fixed = SA(1.0, weights="gaussian", heads=2, weight_seed=3)
    assert fixed.at_time(7.0) is fixed


def test_regenerated_run_is_an_euler_loop_with_the_epochs_weights_and_is_reproducible(x64):
    x0 = _states(50, 6)
    dt, steps = 0.125, 12  # dyadic: the times k dt are exact, epochs change at k = 4, 8
    m = SA(2.0, weights="gaussian", value="gaussian", heads=2, weight_seed=9, regen_period=0.5)
    run = lambda model: mf.simulate(  # noqa: E731
        model, x0, t1=dt * steps, dt=dt, solver="euler", step="renormalize"
    ).xs[-1]
    got = run(m)
    x = np.asarray(x0)
    for k in range(steps):
        F = np.asarray(m.at_time(k * dt).field(jnp.asarray(x)))
        x = x + dt * F
        x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    np.testing.assert_allclose(got, x, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(run(m), got)  # same seed, same run
    assert not np.allclose(run(dataclasses.replace(m, weight_seed=10)), got)


# -- 6. derivatives through mf.simulate -----------------------------------------------------------


def _check_grad(make_model, theta0, x0, *, t1=0.2, dt=0.05, solver="euler", step="projected"):
    c = np.random.default_rng(0).normal(size=np.shape(x0))

    def loss(theta):
        traj = mf.simulate(make_model(theta), x0, t1=t1, dt=dt, solver=solver, step=step)
        return jnp.sum(traj.xs[-1] * c)

    theta0 = jnp.asarray(theta0, jnp.float64)
    g = np.asarray(jax.jit(jax.grad(loss))(theta0))
    f = jax.jit(loss)
    eps = 1e-5
    flat = np.asarray(theta0).ravel()
    fd = np.zeros_like(flat)
    for k in range(flat.size):
        e = np.zeros_like(flat)
        e[k] = eps
        up = float(f(jnp.asarray((flat + e).reshape(np.shape(theta0)))))
        down = float(f(jnp.asarray((flat - e).reshape(np.shape(theta0)))))
        fd[k] = (up - down) / (2 * eps)
    np.testing.assert_allclose(g.ravel(), fd, rtol=1e-6, atol=1e-8 * max(1.0, np.abs(fd).max()))
    return g


def _families():
    causal = mf.masks.Causal()
    return {
        "masked usa": lambda b, QKV: mf.kernels.USA(b, mask=mf.masks.Causal(include_self=False)),
        "multi-head sa": lambda b, QKV: SA(b, *QKV),
        "causal sa": lambda b, QKV: SA(b, *QKV, mask=causal),
        "alibi normalized usa": lambda b, QKV: mf.kernels.USA(
            b, mask=mf.masks.ALiBi(1.0, include_self=False, normalized=True)
        ),
        "sinkhorn": lambda b, QKV: SA(b, *QKV, attention="sinkhorn", sinkhorn_iters=5),
        "random weights with regen": lambda b, QKV: SA(
            b, weights="gaussian", value="gaussian", heads=2, weight_seed=4, regen_period=0.1
        ),
        "causal ngpt": lambda b, QKV: SA(b, *QKV, mask=causal, normalization="ngpt", alpha=0.3),
    }


FAST_FAMILIES = ("causal sa",)


@pytest.mark.parametrize(
    "family",
    [f if f in FAST_FAMILIES else pytest.param(f, marks=pytest.mark.slow) for f in _families()],
)
def test_gradient_in_beta_through_simulate_matches_finite_differences(x64, family):
    x0 = _states(60, 5)
    QKV = tuple(jnp.asarray(M) for M in _stacks(61, 2))
    make_model = _families()[family]
    g = _check_grad(lambda b: make_model(b, QKV), 1.3, x0)
    assert abs(float(g)) > 1e-6


@pytest.mark.slow
def test_gradient_in_the_alibi_slope_matches_finite_differences(x64):
    _check_grad(
        lambda s: mf.kernels.USA(1.2, mask=mf.masks.ALiBi(s, include_self=False, normalized=True)),
        0.8,
        _states(60, 5),
    )


@pytest.mark.slow
def test_gradient_in_the_ngpt_step_factor_matches_finite_differences(x64):
    QKV = tuple(jnp.asarray(M) for M in _stacks(61, 2))
    g = _check_grad(
        lambda a: SA(1.3, *QKV, normalization="ngpt", alpha=a),
        0.3,
        _states(60, 5),
        step="renormalize",
    )
    assert abs(float(g)) > 1e-6


@pytest.mark.slow
def test_hardmax_gradients(x64):
    x0 = _states(62, 5)
    Q, K, V = (jnp.asarray(M) for M in _stacks(63, 2))
    # the weights are piecewise constant: the derivative in beta is 0, that in V is not
    g_beta = _check_grad(lambda b: SA(b, Q, K, V, attention="hardmax"), 1.0, x0)
    assert float(g_beta) == 0.0
    g_v = _check_grad(lambda v: SA(1.0, Q, K, v, attention="hardmax"), V, x0)
    assert np.abs(g_v).max() > 1e-6


# -- 7. bad parameters --------------------------------------------------------------------------


def test_inconsistent_parameters_raise_one_clear_error():
    Q3 = np.stack([np.eye(3)] * 3)
    Q2 = np.stack([np.eye(3)] * 2)
    with pytest.raises(ValueError, match="does not match the weight stacks"):
        SA(1.0, Q3, heads=2)
    with pytest.raises(ValueError, match="needs \\(H, d, d\\) weight stacks"):
        SA(1.0, np.eye(3), heads=2)
    with pytest.raises(ValueError, match="different numbers of heads"):
        SA(1.0, Q2, Q3)
    with pytest.raises(ValueError, match="sinkhorn_iters must be >= 1"):
        SA(1.0, attention="sinkhorn", sinkhorn_iters=0)
    with pytest.raises(ValueError, match="use normalized=True"):
        SA(1.0, normalized=False, attention="sinkhorn")
    with pytest.raises(ValueError, match="give either Q, K, V or the ensembles"):
        SA(1.0, np.eye(3), weights="gaussian")
    for model in (SA, mf.kernels.USA):
        with pytest.raises(TypeError, match="mask"):
            model(1.0, mask="causal")  # (beartype's check under the test suite's import hook)
    with pytest.raises(TypeError, match="mask must be None or a mask from mf.masks"):
        mf.masks.check_mask("causal")  # the package's own check, without the hook
    with pytest.raises(ValueError, match="attention must be one of"):
        SA(1.0, attention="sparse")
    with pytest.raises(ValueError, match="normalization must be one of"):
        SA(1.0, normalization="rms")
    with pytest.raises(
        ValueError, match="alpha = 0.5 applies with normalization = 'ngpt', not 'post'"
    ):
        SA(1.0, alpha=0.5)
    with pytest.raises(ValueError, match="switch_time = 2.0 applies with normalization = 'mix'"):
        SA(1.0, normalization="pre", switch_time=2.0)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        SA(1.0, normalization="ngpt", alpha=0.0)
    with pytest.raises(ValueError, match="unknown ensemble 'wishart'"):
        mf.models.random_weights(jax.random.key(0), 3, ensemble="wishart")
    with pytest.raises(ValueError, match="square \\(d, d\\) matrix or an \\(H, d, d\\) stack"):
        SA(1.0, np.ones((2, 3)))
