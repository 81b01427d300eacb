"""Phase diagrams over (beta, sigma) (issue 49, item 4): ``sa_phase_diagram(solver="rk2",
noise=, sigma=, noise_seed=)``. Each system is mf.simulate's noisy run of its model with the key
``fold_in(key(noise_seed), s)`` (pinned through the clustering count to 1e-10), sigma = 0 is the
deterministic Heun diagram, a list of sigma is labelled data equal to the separate calls, and the
refusals are the noise's own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import phase_diagram as pd

KW = dict(n=6, d=3, seeds=3, dt=0.1, t1=1.0, checkpoints=3, dtype=jnp.float64)


@pytest.fixture(scope="module")
def x64():
    with jax.enable_x64(True):
        yield


def _pair_threshold_fractions(key, beta, sigma, s, kind, **extra):
    """The system ``s`` run by mf.simulate, and the diagram's final fractions at thresholds just
    below and above its largest final Gram entry: they differ by one pair (2 / (n (n - 1))) only
    if the diagram's final state has that entry within 1e-10."""
    x0 = pd._initial(key, KW["seeds"], KW["n"], KW["d"], jnp.float64, None)
    N, h, idx = pd.checkpoint_steps(KW["t1"], KW["dt"], KW["checkpoints"])
    model = mf.models.SelfAttention(beta, **extra.get("model", {}))
    traj = mf.simulate(
        model,
        x0[s],
        t1=N * h,
        dt=h,
        solver="rk2",
        noise=kind(sigma),
        key=jax.random.fold_in(jax.random.key(4), s),
        ts=np.asarray(idx) * h,
    )
    x = np.asarray(traj.xs[-1])
    G = x @ x.T
    off = ~np.eye(KW["n"], dtype=bool)
    g = float(G[off].max())
    fr = [
        pd.sa_phase_diagram(
            key,
            [beta],
            solver="rk2",
            noise=kind.name,
            sigma=sigma,
            noise_seed=4,
            threshold=t,
            per_seed=True,
            **extra.get("diagram", {}),
            **KW,
        ).per_seed[0, s, -1]
        for t in (g - 1e-10, g + 1e-10)
    ]
    n = KW["n"]
    return fr, np.mean(G[off] > g - 1e-10), 2 / (n * (n - 1))


@pytest.mark.parametrize("kind", [mf.noise.Independent, mf.noise.Common])
def test_each_system_is_simulates_noisy_run(kind, x64):
    key = jax.random.key(0)
    (below, above), expect, pair = _pair_threshold_fractions(key, 3.0, 0.6, 2, kind)
    assert below == pytest.approx(expect, abs=1e-12)
    assert below - above == pytest.approx(pair, abs=1e-12)


def test_random_weights_and_noise_together(x64):
    """Random Q, K (rotf's gaussian ensemble) with noise: system s draws its weights as without
    noise and its path from fold_in(key(noise_seed), s)."""
    key = jax.random.key(1)
    Q, K, V = pd.system_weights(
        np.arange(KW["seeds"]), KW["d"], weights="gaussian", dtype=jnp.float64
    )
    s = 1
    extra = dict(model=dict(Q=Q[s], K=K[s]), diagram=dict(weights="gaussian"))
    (below, above), expect, pair = _pair_threshold_fractions(
        key, 2.0, 0.4, s, mf.noise.Independent, **extra
    )
    assert below == pytest.approx(expect, abs=1e-12)
    assert below - above == pytest.approx(pair, abs=1e-12)


def test_sigma_zero_is_the_deterministic_heun_diagram_and_lists_are_labelled(x64):
    key = jax.random.key(2)
    betas = [0.5, 4.0]
    det = pd.sa_phase_diagram(key, betas, solver="rk2", **KW)
    zero = pd.sa_phase_diagram(key, betas, solver="rk2", noise="common", sigma=0.0, **KW)
    np.testing.assert_allclose(zero, det, atol=1e-12)
    noisy = pd.sa_phase_diagram(key, betas, solver="rk2", noise="common", sigma=2.0, **KW)
    assert not np.allclose(noisy, det)  # the noise moves the tokens
    ds = pd.sa_phase_diagram(key, betas, solver="rk2", noise="common", sigma=[0.0, 2.0], **KW)
    assert dict(ds.fraction.sizes) == {"sigma": 2, "beta": 2, "time": 3}
    np.testing.assert_array_equal(ds.fraction.sel(sigma=2.0).values, noisy)
    np.testing.assert_array_equal(ds.fraction.sel(sigma=0.0).values, zero)
    assert ds.attrs["noise"] == "common" and ds.attrs["function"] == "sa_phase_diagram"
    kw = {k: v for k, v in KW.items() if k != "n"}
    both = pd.sa_phase_diagram(
        key, betas, n=[4, 6], solver="rk2", noise="common", sigma=[0.0, 2.0], **kw
    )
    assert dict(both.fraction.sizes) == {"n": 2, "sigma": 2, "beta": 2, "time": 3}
    np.testing.assert_array_equal(both.fraction.sel(n=6).values, ds.fraction.values)


def test_rk2_without_noise_is_simulates_heun_run(x64):
    key = jax.random.key(3)
    x0 = pd._initial(key, KW["seeds"], KW["n"], KW["d"], jnp.float64, None)
    N, h, idx = pd.checkpoint_steps(KW["t1"], KW["dt"], KW["checkpoints"])
    traj = mf.simulate(
        mf.models.SelfAttention(2.0), x0[0], t1=N * h, dt=h, solver="rk2", ts=np.asarray(idx) * h
    )
    x = np.asarray(traj.xs[-1])
    off = ~np.eye(KW["n"], dtype=bool)
    g = float((x @ x.T)[off].max())
    per = [
        pd.sa_phase_diagram(key, [2.0], solver="rk2", threshold=t, per_seed=True, **KW).per_seed[
            0, 0, -1
        ]
        for t in (g - 1e-10, g + 1e-10)
    ]
    assert per[0] - per[1] == pytest.approx(2 / (KW["n"] * (KW["n"] - 1)), abs=1e-12)


def test_refusals():
    key = jax.random.key(0)
    small = dict(n=4, d=2, seeds=2, t1=0.2, checkpoints=2)
    with pytest.raises(ValueError, match="solver='rk2'"):
        pd.sa_phase_diagram(key, [1.0], noise="independent", sigma=0.1, **small)
    with pytest.raises(ValueError, match="needs sigma, the noise's amplitude"):
        pd.sa_phase_diagram(key, [1.0], solver="rk2", noise="common", **small)
    with pytest.raises(ValueError, match="amplitude of a noise"):
        pd.sa_phase_diagram(key, [1.0], solver="rk2", sigma=0.1, **small)
    with pytest.raises(ValueError, match="solver"):
        pd.sa_phase_diagram(key, [1.0], solver="rk4", **small)
    with pytest.raises(ValueError, match="carries a radius"):
        pd.sa_phase_diagram(
            key, [1.0], solver="rk2", noise="independent", sigma=0.1, normalization="pre", **small
        )
    with pytest.raises(ValueError, match="sigma"):
        pd.sa_phase_diagram(key, [1.0], solver="rk2", noise="independent", sigma=-0.1, **small)
    with pytest.raises(ValueError, match="repeat"):
        pd.sa_phase_diagram(
            key, [1.0], solver="rk2", noise="independent", sigma=[0.1, 0.1], **small
        )
    with pytest.raises(ValueError, match="backend='xla'"):
        pd.sa_phase_diagram(
            key, [1.0], solver="rk2", noise="independent", sigma=0.1, backend="native", **small
        )
    with pytest.raises(ValueError, match="noise_seed"):
        pd.sa_phase_diagram(
            key, [1.0], solver="rk2", noise="independent", sigma=0.1, noise_seed=-1, **small
        )
