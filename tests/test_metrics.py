"""Collapse metrics and distances between empirical laws (MATH.md Sec. 1, 3)."""

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
        np.testing.assert_allclose(M.collapse_gap(great_circle(n, 0.3)), 1 + 1 / (n - 1), rtol=1e-13)
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
    np.testing.assert_allclose(M.collapse_gap(great_circle(10).astype(jnp.float32)), 1 + 1 / 9, rtol=1e-6)


@pytest.mark.parametrize("eps", [1e-2, 1e-3, 1e-4])
def test_collapse_gap_accurate_near_collapse_float32(eps):
    # near collapse (the regime plotted on log scales) G must keep its relative accuracy
    n = 256
    x = mf.sphere.normalize(jnp.array([0.0, 0.0, 1.0]) + eps * jax.random.normal(jax.random.key(0), (n, 3)))
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
    np.testing.assert_allclose(M.token_similarity(X[np.random.default_rng(0).permutation(n)]), t, rtol=1e-13)
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
    cap = mf.sphere.normalize(jnp.array([0.0, 0.0, 1.0]) + 0.3 * jax.random.normal(jax.random.key(10), (300, 3)))
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
