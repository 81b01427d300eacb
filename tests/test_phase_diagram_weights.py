"""The SA phase diagram with random weights, heads, masks and attention (issue 28, item 5).

``sa_phase_diagram(weights=, value=, heads=, weight_seed=, mask=, attention=)`` runs the XLA kernel
with ``mf.models.SelfAttention``'s field, each system ``s`` with its own weights
(``system_weights``: ``random_weights(fold_in(key(weight_seed), s), ...)``). Checked against
``mf.simulate`` of the model with the same weights (``step="renormalize"``), and against a NumPy
loop of rotf's ``simu_xform.step_1`` (``tests/_reference_sims.py``, float64). rotf applies ``V``
on the right of row vectors: its ``V`` is the transpose of meanfield's, and its ``BF`` is
$Q^\\top K$.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _reference_sims import rotf_step_1

import meanfield as mf
from meanfield import phase_diagram as pd

THRESHOLD = 0.999


def _x0(S: int, n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((S, n, d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _states(x0, beta, t1, dt, *, normalized=True, project=False, schedule="uniform", **attn):
    """The diagram's fractions and final states of one ``beta`` (the private sweep, as
    ``sa_phase_diagram`` calls it)."""
    grid = pd.published_checkpoint_steps if schedule == "published" else pd.checkpoint_steps
    N, h, idx = grid(t1, dt, 5)
    qkv = pd.system_weights(
        np.arange(x0.shape[0]),
        x0.shape[2],
        heads=attn.get("heads", 1),
        weights=attn.get("weights", "identity"),
        value=attn.get("value", "identity"),
        weight_seed=attn.get("weight_seed", 0),
        dtype=jnp.float64,
    )
    model = mf.models.SelfAttention(
        beta,
        normalized=normalized,
        mask=attn.get("mask"),
        attention=attn.get("attention", "softmax"),
        sinkhorn_iters=attn.get("sinkhorn_iters"),
    )
    spec = pd._Systems(model, *qkv)
    fr, xs = pd._sweep(
        jnp.asarray(x0),
        np.array([beta]),
        [h],
        [N],
        [idx],
        THRESHOLD,
        normalized,
        False,
        2,  # two chunks of 2 for 3 systems: the padded last chunk draws the right weights
        states=True,
        backend="xla",
        step="projected" if project else "renormalize",
        systems=spec,
    )
    return fr[0], xs[0], qkv, (N, h, idx)


def test_system_weights_are_random_weights_folded_by_system(x64):
    Q, K, V = pd.system_weights([0, 2], 3, weights="gaussian", value="-qk", weight_seed=5)
    for row, s in enumerate([0, 2]):
        key = jax.random.fold_in(jax.random.key(5), s)
        q, k, v = mf.models.random_weights(key, 3, ensemble="gaussian", value="-qk")
        # one compiled draw for all systems: equal to rounding (XLA fuses the scalings)
        np.testing.assert_allclose(Q[row], q[0], rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(K[row], k[0], rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(V[row], v[0], rtol=1e-14, atol=1e-15)
    Q, K, V = pd.system_weights([1], 3, heads=2, weights="identity", value="gaussian")
    assert Q is None and K is None and V.shape == (1, 2, 3, 3)
    assert pd.system_weights([0, 1], 3, heads=3, weights="identity") == (None, None, None)


CASES = {
    "gaussian -qk": dict(weights="gaussian", value="-qk", weight_seed=3),
    "symmetric, 2 heads, causal": dict(
        weights="symmetric", value="gaussian", heads=2, mask=mf.masks.Causal()
    ),
    "sinkhorn, ALiBi": dict(attention="sinkhorn", sinkhorn_iters=5, mask=mf.masks.ALiBi(2.0)),
}


@pytest.mark.parametrize("case", CASES)
def test_one_system_equals_simulate_of_its_self_attention(case, x64):
    attn = CASES[case]
    x0 = _x0(3, 6, 3, seed=1)
    beta, t1, dt = 3.0, 2.0, 0.1
    fr, xs, qkv, (N, h, idx) = _states(x0, beta, t1, dt, **attn)
    public = pd.sa_phase_diagram(
        None,
        [beta],
        x0=x0,
        dt=dt,
        t1=t1,
        checkpoints=5,
        step="renormalize",
        per_seed=True,
        dtype=jnp.float64,
        seed_chunk=2,  # the kernel compiled for _states
        **attn,
    )
    np.testing.assert_array_equal(public.per_seed[0], fr)
    ts = jnp.asarray(idx * h)
    for s in range(3):
        Q, K, V = (None if M is None else M[s] for M in qkv)
        model = mf.models.SelfAttention(
            beta,
            Q,
            K,
            V,
            attention=attn.get("attention", "softmax"),
            sinkhorn_iters=attn.get("sinkhorn_iters", 21),
            mask=attn.get("mask"),
        )
        traj = mf.simulate(model, x0[s], t1=t1, dt=dt, solver="euler", step="renormalize", ts=ts)
        np.testing.assert_allclose(xs[s], traj.xs[-1], rtol=0, atol=1e-12)
        want = [float(pd.clustering_fraction(x, THRESHOLD)) for x in traj.xs]
        np.testing.assert_array_equal(fr[s], want)
    assert np.abs(xs - x0).max() > 0.05  # the particles moved


@pytest.mark.parametrize("normalized", [True, False])
def test_diagram_equals_rotf_loop(normalized, x64):
    """rotf's ``step_1`` with ``BF = Q^T K`` and its ``V = V^T`` (row convention), from the same
    particles, ``schedule="published"`` (rotf's time grid); softmax or ``exp / n``."""
    x0 = _x0(3, 5, 3, seed=2)
    beta, t1, dt = 2.0, 1.5, 0.1
    attn = dict(weights="gaussian", value="-qk", weight_seed=7)
    fr, xs, (Q, K, V), (N, h, idx) = _states(
        x0, beta, t1, dt, normalized=normalized, schedule="published", **attn
    )
    public = pd.sa_phase_diagram(
        None,
        [beta],
        x0=x0,
        dt=dt,
        t1=t1,
        checkpoints=5,
        normalized=normalized,
        step="renormalize",
        schedule="published",
        per_seed=True,
        seed_chunk=2,
        **attn,
    )
    np.testing.assert_array_equal(public.per_seed[0], fr)
    for s in range(3):
        BF = np.asarray(Q[s]).T @ np.asarray(K[s])
        V_rotf = np.asarray(V[s]).T
        x, seen = np.array(x0[s]), {}
        for j in range(1, N + 1):
            x = rotf_step_1(x, BF, V_rotf, beta, dt, use_softmax=normalized)
            seen[j] = x
        np.testing.assert_allclose(xs[s], x, rtol=0, atol=1e-12)
        off = ~np.eye(x.shape[0], dtype=bool)
        want = [np.mean((seen[j] @ seen[j].T > THRESHOLD)[off]) for j in idx]
        np.testing.assert_array_equal(fr[s], want)


def test_identity_weights_keep_the_fast_path(x64):
    """Identity ensembles (any number of equal heads) run the identity kernels, same numbers."""
    x0 = _x0(4, 6, 2, seed=3)
    kw = dict(x0=x0, dt=0.1, t1=1.0, checkpoints=4, per_seed=True)
    plain = pd.sa_phase_diagram(None, [1.0, 4.0], **kw)
    heads = pd.sa_phase_diagram(None, [1.0, 4.0], heads=3, **kw)
    np.testing.assert_array_equal(plain.per_seed, heads.per_seed)
    before = sum(v for k, v in pd._TRACES.items() if k[0] == "attn")
    pd.sa_phase_diagram(None, [1.0], heads=2, **kw)
    assert sum(v for k, v in pd._TRACES.items() if k[0] == "attn") == before


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(weights="wishart"), "weights must be one of"),
        (dict(value="qk"), "value must be one of"),
        (dict(heads=0), "heads must be >= 1"),
        (dict(weight_seed=-1), "weight_seed must be >= 0"),
        (dict(weights="gaussian", backend="native"), "backend='xla'"),
        (dict(value="gaussian", packed=True), "packed=False"),
        (dict(attention="hardmax", normalized=False), "normalized=True"),
        (dict(attention="sinkhorn", sinkhorn_iters=0), "sinkhorn_iters must be >= 1"),
    ],
)
def test_bad_input_is_one_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        pd.sa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=2, t1=0.2, checkpoints=2, **kw)
