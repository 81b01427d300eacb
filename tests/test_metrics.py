"""Collapse metrics and distances between empirical laws (docs/math/particles.md, docs/math/depth.md)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf

M = mf.metrics


def great_circle(n, phase=0.0):
    a = 2 * np.pi * np.arange(n) / n + phase
    return jnp.asarray(np.stack([np.cos(a), np.sin(a), np.zeros(n)], axis=1))


# ----------------------------------------------------------------- collapse gap


def test_collapse_gap_closed_forms(x64):
    # Dirac: 0; uniform great circle: 1 + 1/(n-1); antipodal pair: 2; regular simplex
    # (n = d + 1 points, <x_i, x_j> = -1/d): 1 + 1/d; orthonormal frame: 1.
    u = mf.sphere.normalize(jnp.array([0.3, -0.4, 1.2]))
    assert float(M.collapse_gap(jnp.tile(u, (9, 1)))) == pytest.approx(0.0, abs=1e-15)
    for n in (3, 8, 33):
        np.testing.assert_allclose(
            M.collapse_gap(great_circle(n, 0.3)), 1 + 1 / (n - 1), rtol=1e-13
        )
    np.testing.assert_allclose(M.collapse_gap(jnp.stack([u, -u])), 2.0, rtol=1e-14)
    d = 4
    # simplex: centred standard basis of R^{d+1}, expressed in d coordinates
    E = np.eye(d + 1) - 1.0 / (d + 1)
    basis = np.linalg.svd(E)[2][:d]  # orthonormal basis of the sum-zero hyperplane
    simplex = mf.sphere.normalize(jnp.asarray(E @ basis.T))
    np.testing.assert_allclose(M.collapse_gap(simplex), 1 + 1 / d, rtol=1e-13)
    np.testing.assert_allclose(M.collapse_gap(jnp.eye(5)), 1.0, rtol=1e-15)


def test_collapse_gap_matches_pairwise_definition_and_invariances(x64):
    x = mf.sphere.uniform(jax.random.key(0), 17, 5, jnp.float64)
    G = np.asarray(x @ x.T)
    n = 17
    direct = 1 - (G.sum() - np.trace(G)) / (n * (n - 1))
    np.testing.assert_allclose(M.collapse_gap(x), direct, rtol=1e-13)
    Q = np.linalg.qr(np.asarray(jax.random.normal(jax.random.key(1), (5, 5), jnp.float64)))[0]
    np.testing.assert_allclose(M.collapse_gap(x @ Q), direct, rtol=1e-13)
    np.testing.assert_allclose(M.collapse_gap(x[::-1]), direct, rtol=1e-13)
    # bounds 0 <= G <= n / (n - 1)
    assert 0.0 <= float(M.collapse_gap(x)) <= n / (n - 1)


def test_collapse_gap_vmaps_and_float32():
    xs = jax.vmap(lambda k: mf.sphere.uniform(k, 12, 3))(jax.random.split(jax.random.key(2), 4))
    gs = jax.vmap(M.collapse_gap)(xs)
    for x, g in zip(xs, gs):
        np.testing.assert_allclose(g, M.collapse_gap(x), rtol=1e-6)
    np.testing.assert_allclose(
        M.collapse_gap(great_circle(10).astype(jnp.float32)), 1 + 1 / 9, rtol=1e-6
    )


@pytest.mark.parametrize("eps", [1e-2, 1e-3, 1e-4])
def test_collapse_gap_accurate_near_collapse_float32(eps):
    # near collapse (the regime plotted on log scales) G must keep its relative accuracy
    n = 256
    x = mf.sphere.normalize(
        jnp.array([0.0, 0.0, 1.0]) + eps * jax.random.normal(jax.random.key(0), (n, 3))
    )
    x64 = np.asarray(x, np.float64)
    x64 /= np.linalg.norm(x64, axis=1, keepdims=True)
    G = x64 @ x64.T
    exact = 1 - (G.sum() - np.trace(G)) / (n * (n - 1))
    got = float(M.collapse_gap(x))
    assert got >= 0.0
    np.testing.assert_allclose(got, exact, rtol=1e-3)


# ------------------------------------------------------------- token similarity


def test_token_similarity_definition_and_invariances(x64):
    X = jax.random.normal(jax.random.key(3), (9, 6), jnp.float64)
    n = 9
    Pi = np.ones((n, n)) / n
    direct = np.linalg.norm(Pi @ X) ** 2 / np.linalg.norm(X) ** 2
    t = float(M.token_similarity(X))
    np.testing.assert_allclose(t, direct, rtol=1e-13)
    assert 0.0 <= t <= 1.0
    # invariant under scaling, right-orthogonal maps, row permutations
    Q = np.linalg.qr(np.asarray(jax.random.normal(jax.random.key(4), (6, 6), jnp.float64)))[0]
    np.testing.assert_allclose(M.token_similarity(-3.7 * X), t, rtol=1e-13)
    np.testing.assert_allclose(M.token_similarity(X @ Q), t, rtol=1e-13)
    np.testing.assert_allclose(
        M.token_similarity(X[np.random.default_rng(0).permutation(n)]), t, rtol=1e-13
    )
    # equal rows: 1; zero-mean rows: 0
    row = jax.random.normal(jax.random.key(5), (6,), jnp.float64)
    np.testing.assert_allclose(M.token_similarity(jnp.tile(row, (n, 1))), 1.0, rtol=1e-14)
    np.testing.assert_allclose(M.token_similarity(X - X.mean(0)), 0.0, atol=1e-15)
    # any (n, m) shape, m != d of the sphere
    np.testing.assert_allclose(M.token_similarity(great_circle(7)), 0.0, atol=1e-15)
    Y = jnp.ones((4, 2)).at[0].set(jnp.array([3.0, 3.0]))
    np.testing.assert_allclose(M.token_similarity(Y), 4 * 1.5**2 * 2 / (2 * 9 + 3 * 2), rtol=1e-14)


# ---------------------------------------------------------------- num_clusters


def test_num_clusters_hand_made_configurations():
    rng = np.random.default_rng(0)
    centres = np.eye(3)
    pts = [c + 0.005 * rng.standard_normal((5, 3)) for c in centres]
    x = mf.sphere.normalize(jnp.asarray(np.concatenate(pts), jnp.float32))
    assert int(M.num_clusters(x, 0.1)) == 3
    assert int(M.num_clusters(x, 2.0)) == 1  # every pair within 2 rad (the groups are pi/2 apart)
    assert int(M.num_clusters(x, 1e-5)) == 15  # every particle alone
    # antipodal pair: 2; a Dirac: 1; n distinct points of a great circle: n
    u = jnp.array([[0.0, 0.0, 1.0]])
    assert int(M.num_clusters(jnp.concatenate([u, -u]), 0.1)) == 2
    assert int(M.num_clusters(jnp.tile(u, (6, 1)), 0.1)) == 1
    assert int(M.num_clusters(great_circle(12).astype(jnp.float32), 0.1)) == 12


def test_num_clusters_is_transitive_along_chains():
    # 20 points 0.05 rad apart on an arc: one cluster at threshold 0.08 (chain),
    # 20 clusters at 0.03; the arc and a far point: 2 clusters.
    a = 0.05 * np.arange(20)
    arc = np.stack([np.cos(a), np.sin(a), np.zeros(20)], axis=1)
    x = jnp.asarray(arc, jnp.float32)
    assert int(M.num_clusters(x, 0.08)) == 1
    assert int(M.num_clusters(x, 0.03)) == 20
    # shuffled order: same answer (label propagation is order free)
    perm = np.random.default_rng(1).permutation(20)
    assert int(M.num_clusters(x[perm], 0.08)) == 1
    far = jnp.concatenate([x, jnp.array([[0.0, 0.0, 1.0]])])
    assert int(M.num_clusters(far, 0.08)) == 2
    # jit / vmap compatible
    counts = jax.vmap(lambda th: M.num_clusters(x, th))(jnp.array([0.03, 0.08]))
    np.testing.assert_array_equal(counts, [20, 1])


@jax.jit
def _dense_labels(x, threshold):
    n = x.shape[0]
    adj = jnp.clip(x @ x.T, -1.0, 1.0) > jnp.cos(threshold)
    labels0 = jnp.arange(n)

    def body(state):
        labels, _ = state
        new = jnp.minimum(jnp.min(jnp.where(adj, labels[None, :], n), axis=1), labels)
        return new, jnp.any(new != labels)

    labels, _ = jax.lax.while_loop(lambda s: s[1], body, (labels0, jnp.array(True)))
    return jnp.sum(labels == labels0)


def _dense_num_clusters(x, threshold):
    """The former definition (an n x n adjacency, plain min-label propagation): the reference."""
    return int(_dense_labels(x, threshold))


_blocked = jax.jit(M.num_clusters, static_argnames="block_size")


def _clustered(rng, n, d, k, spread):
    c = rng.standard_normal((k, d))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    x = c[rng.integers(0, k, n)] + spread * rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("n, d", [(2, 3), (7, 2), (100, 3), (257, 5)])
def test_num_clusters_equals_the_dense_definition(n, d):
    # random clustered configurations, thresholds and tile sizes (tiles of 3 or 16 rows make
    # many tiles, skipped and visited): the same count as the dense n x n definition
    rng = np.random.default_rng(n)
    for _ in range(5):
        k, spread = int(rng.integers(1, 25)), float(rng.choice([0.01, 0.05, 0.2]))
        x = jnp.asarray(_clustered(rng, n, d, k, spread), jnp.float32)
        for th in (0.05, 0.3, 1.5):
            want = _dense_num_clusters(x, th)
            for bs in (None, 3, 16):
                assert int(_blocked(x, th, block_size=bs)) == want, (n, d, k, spread, th, bs)


def test_num_clusters_edge_cases():
    x = great_circle(12).astype(jnp.float32)
    assert int(M.num_clusters(x[:1], 0.1)) == 1
    # non-finite rows join nothing (as in the dense definition); the others are unaffected
    bad = x.at[3].set(jnp.nan).at[7].set(jnp.inf)
    assert int(M.num_clusters(bad, 0.1)) == _dense_num_clusters(bad, 0.1) == 12
    assert int(M.num_clusters(bad, 1.0)) == _dense_num_clusters(bad, 1.0)
    # threshold above pi: everything joined; float64 states
    assert int(M.num_clusters(x, 3.5)) == 1
    # rows that are not unit: the skip bound uses the largest norm, so nothing is missed
    y = jnp.asarray(_clustered(np.random.default_rng(3), 200, 3, 4, 0.05), jnp.float32) * 1.3
    assert int(M.num_clusters(y, 0.6, block_size=8)) == _dense_num_clusters(y, 0.6)
    with pytest.raises(ValueError, match="block_size"):
        M.num_clusters(x, 0.1, block_size=0)


def test_num_clusters_jit_and_vmap_over_states_and_thresholds():
    rng = np.random.default_rng(4)
    xs = jnp.asarray(np.stack([_clustered(rng, 300, 3, k, 0.01) for k in (2, 5, 9)]), jnp.float32)
    want = [_dense_num_clusters(x, 0.1) for x in xs]
    got = jax.jit(jax.vmap(lambda x: M.num_clusters(x, 0.1, block_size=32)))(xs)
    np.testing.assert_array_equal(got, want)
    ths = jnp.array([0.01, 0.1, 1.0])
    got = jax.vmap(lambda t: M.num_clusters(xs[1], t, block_size=32))(ths)
    np.testing.assert_array_equal(got, [_dense_num_clusters(xs[1], float(t)) for t in ths])


def test_num_clusters_never_forms_an_n_by_n_matrix():
    # n = 300000 (the issue's --n 300000): compiled, not run; an n x n float32 adjacency
    # would take 360 GB, the compiled program's temporaries stay below 64 MB
    n = 300_000
    compiled = jax.jit(M.num_clusters).lower(jax.ShapeDtypeStruct((n, 3), jnp.float32)).compile()
    mem = compiled.memory_analysis()
    assert mem is not None and mem.temp_size_in_bytes < 64 * 2**20, mem.temp_size_in_bytes
    # and no value in the traced program has more than a tile's entries
    jaxpr = jax.make_jaxpr(M.num_clusters)(jax.ShapeDtypeStruct((n, 3), jnp.float32))

    def sizes(jx):
        for eqn in jx.eqns:
            for v in eqn.outvars:
                yield int(np.prod(v.aval.shape)) if hasattr(v.aval, "shape") else 0
            for p in eqn.params.values():
                for sub in p if isinstance(p, (list, tuple)) else [p]:
                    inner = getattr(sub, "jaxpr", None)
                    if inner is not None:
                        yield from sizes(getattr(inner, "jaxpr", inner))

    biggest = max(sizes(jaxpr.jaxpr))
    assert biggest <= max(3 * n + 3 * M.CLUSTER_BLOCK, M.CLUSTER_BLOCK * 2 * M.CLUSTER_BLOCK), (
        biggest
    )


@pytest.mark.slow
@pytest.mark.xla_default
def test_num_clusters_n_300000_runs():
    # 300 well separated clusters (a Fibonacci lattice, spacing ~0.2 rad) of 1000 particles
    n, K = 300_000, 300
    i = np.arange(K) + 0.5
    phi, th = np.arccos(1 - 2 * i / K), np.pi * (1 + 5**0.5) * i
    cen = np.stack([np.cos(th) * np.sin(phi), np.sin(th) * np.sin(phi), np.cos(phi)], 1)
    rng = np.random.default_rng(0)
    x = cen[np.repeat(np.arange(K), n // K)] + 1e-3 * rng.standard_normal((n, 3))
    x = jnp.asarray(x / np.linalg.norm(x, axis=1, keepdims=True), jnp.float32)
    assert int(M.num_clusters(x, 0.1)) == K
    # that the count is free of the order of the rows is shown at small n, where it costs nothing:
    # test_num_clusters_is_transitive_along_chains (a shuffled chain) and
    # test_num_clusters_equals_the_dense_definition (random orders, many tiles skipped and visited);
    # a second n = 300000 run in reversed order repeated this one at its full cost (CI time, issue 31)


# ------------------------------------------------------------------------- mmd


def test_mmd_zero_for_identical_sets_and_positive_otherwise(x64):
    x = mf.sphere.uniform(jax.random.key(6), 40, 3, jnp.float64)
    assert float(M.mmd(x, x)) == 0.0
    assert float(M.mmd(x, x[::-1])) < 1e-7  # same empirical law
    y = mf.sphere.uniform(jax.random.key(7), 40, 3, jnp.float64)
    assert float(M.mmd(x, y)) > 0.0
    np.testing.assert_allclose(M.mmd(x, y), M.mmd(y, x), rtol=1e-12)
    # two single points a, b: MMD^2 = 2 - 2 exp((<a, b> - 1) / bandwidth^2)
    a, b = x[:1], x[1:2]
    for bw in (0.3, 1.0):
        expected = np.sqrt(2 - 2 * np.exp((float(a[0] @ b[0]) - 1) / bw**2))
        np.testing.assert_allclose(M.mmd(a, b, bandwidth=bw), expected, rtol=1e-12)


def test_mmd_separates_laws_beyond_sampling_noise():
    # uniform vs uniform (two seeds) is small; uniform vs a cap around e_3 is large
    x = mf.sphere.uniform(jax.random.key(8), 300, 3)
    y = mf.sphere.uniform(jax.random.key(9), 300, 3)
    cap = mf.sphere.normalize(
        jnp.array([0.0, 0.0, 1.0]) + 0.3 * jax.random.normal(jax.random.key(10), (300, 3))
    )
    same, diff = float(M.mmd(x, y)), float(M.mmd(x, cap))
    assert diff > 5 * same, (same, diff)
    # the mmd of a set with itself is exactly 0 also in float32, with different sizes allowed
    assert float(M.mmd(x, x)) == 0.0
    assert M.mmd(x, y[:50]).shape == ()


# ---------------------------------------------------------------------- gram_rank


def test_gram_rank():
    u = jnp.array([[0.0, 0.6, 0.8]])
    assert int(M.gram_rank(jnp.tile(u, (5, 1)))) == 1
    assert int(M.gram_rank(great_circle(9).astype(jnp.float32))) == 2
    assert int(M.gram_rank(mf.sphere.uniform(jax.random.key(0), 9, 4))) == 4


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan")])
def test_threshold_and_bandwidth_must_be_positive(bad):
    x = mf.sphere.uniform(jax.random.key(0), 5, 3)
    with pytest.raises(ValueError, match="threshold"):
        mf.metrics.num_clusters(x, bad)
    with pytest.raises(ValueError, match="bandwidth"):
        mf.metrics.mmd(x, x, bad)
