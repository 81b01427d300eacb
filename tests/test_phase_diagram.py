"""Tests of the fast phase-diagram sweeps (meanfield.phase_diagram) and of the tiled velocity.

The fast sweeps are checked against a straightforward reference (a Python loop of dense
``euler_step`` / ``clustering_fraction``) in float64; compile-once is proved by counting
traces; a few laws of the dynamics are checked with Monte Carlo error bars. No timings.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import phase_diagram as pd


def _x0(S, n, d, seed=0):
    keys = jax.random.split(jax.random.key(seed), S)
    return jax.vmap(lambda k: mf.sphere.uniform(k, n, d, jnp.float64))(keys)


def _reference(x0, betas, hs, Ns, idxs, threshold, normalized):
    """Plain loop: dense Euler steps in original time, metric on every state."""
    fr_all, xs_all = [], []
    frac = jax.jit(jax.vmap(lambda y: pd.clustering_fraction(y, threshold)))
    for b, h, N, idx in zip(betas, hs, Ns, idxs):
        step = jax.jit(jax.vmap(lambda y, b=b, h=h: pd.euler_step(y, b, h, normalized=normalized)))
        x = x0
        fr = [frac(x)]
        for _ in range(N):
            x = step(x)
            fr.append(frac(x))
        fr_all.append(np.stack(fr, axis=1)[:, idx])
        xs_all.append(np.asarray(x))
    return np.stack(fr_all), np.stack(xs_all)


BACKENDS = [(False, "xla"), (True, "xla"), pytest.param(False, "native", marks=pytest.mark.native)]


@pytest.mark.parametrize(("packed", "backend"), BACKENDS)
def test_sa_sweep_equals_reference(packed, backend, x64):
    S, n, d, t1, dt, C, thr = 5, 8, 2, 2.0, 0.1, 9, 0.95
    x0 = _x0(S, n, d)
    betas = np.array([0.3, 2.0, 6.0])
    N, h, idx = pd.checkpoint_steps(t1, dt, C)
    assert N == 20 and abs(h - 0.1) < 1e-15
    ref_fr, ref_x = _reference(x0, betas, [h] * 3, [N] * 3, [idx] * 3, thr, True)
    fr, xs = pd._sweep(
        x0, betas, [h] * 3, [N] * 3, [idx] * 3, thr, True, packed, 2, states=True, backend=backend
    )
    np.testing.assert_allclose(xs, ref_x, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(fr, ref_fr)
    out = pd.sa_phase_diagram(
        None,
        betas,
        x0=x0,
        dt=dt,
        t1=t1,
        checkpoints=C,
        threshold=thr,
        per_seed=True,
        packed=packed,
        seed_chunk=2,
        backend=backend,
    )
    np.testing.assert_array_equal(out.per_seed, ref_fr)
    np.testing.assert_allclose(out.fraction, ref_fr.mean(axis=1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(out.times, np.linspace(0, t1, C))
    assert ref_fr.max() > 0.2  # the comparison is not trivial: clusters form


@pytest.mark.parametrize(("packed", "backend"), BACKENDS)
def test_usa_sweep_equals_reference_in_original_time(packed, backend, x64):
    """The rescaled kernel exp(beta(G - 1)) with step e^beta h gives the iterates of
    exp(beta G) with step h; each beta runs its own step count."""
    S, n, d, t1, C, thr = 4, 6, 3, 0.25, 7, 0.95
    x0 = _x0(S, n, d, seed=3)
    betas = np.array([0.2, 1.5, 3.0])
    grids = [pd.checkpoint_steps(t1, float(pd.usa_step_size(b)), C) for b in betas]
    Ns, hs, idxs = zip(*grids)
    assert Ns[0] == 3 and Ns[2] > Ns[1] > Ns[0]  # 0.1 / max(sqrt(b) e^(b - 1/2), 1)
    ref_fr, ref_x = _reference(x0, betas, hs, Ns, idxs, thr, False)
    fr, xs = pd._sweep(
        x0, betas, hs, Ns, idxs, thr, False, packed, None, states=True, backend=backend
    )
    np.testing.assert_allclose(xs, ref_x, rtol=0, atol=1e-11)
    np.testing.assert_array_equal(fr, ref_fr)
    out = pd.usa_phase_diagram(
        None,
        betas,
        x0=x0,
        t1=t1,
        checkpoints=C,
        threshold=thr,
        per_seed=True,
        packed=packed,
        backend=backend,
    )
    np.testing.assert_array_equal(out.per_seed, ref_fr)
    np.testing.assert_array_equal(out.steps, Ns)


def test_packed_kernel_pieces_equal_dense(x64):
    x = _x0(1, 10, 4, seed=5)[0]
    k = 5
    T, G12 = pd._packed_gram(x, k)
    G = x @ x.T
    np.testing.assert_allclose(G12, G[:k, k:], atol=1e-15)
    n = 2 * k
    assert int(pd._packed_count(T, G12, 0.2, k)) == round(
        float(pd.clustering_fraction(x, 0.2)) * n * (n - 1)
    )
    W = pd._dense_weights(G, 1.7, 0.3)
    assert int(pd._weight_count(W, 1.7, 0.3, 0.2)) == int(pd._packed_count(T, G12, 0.2, k))
    for normalized in (True, False):
        a = pd._packed_field(x, T, G12, 1.7, 0.3, k, normalized)
        b = pd._dense_field_w(x, W, normalized)
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_grid_compiles_once():
    """A beta x seed grid (several betas, several seed chunks incl. a ragged last one,
    different step counts per beta) traces the sweep kernel once per shape and mode
    (the metric mode ``every_step`` is static: dense or sparse checkpoints)."""
    n, d, S, C = 6, 3, 7, 5

    def keys(normalized):
        # (normalized, packed, every_step, project): project=True is step="projected"
        return {
            m: ("run", (3, n, d), "float32", normalized, False, m, True, (C,))
            for m in (True, False)
        }

    before = {k: pd._TRACES[k] for nz in (True, False) for k in keys(nz).values()}
    x0 = jax.vmap(lambda k: mf.sphere.uniform(k, n, d))(jax.random.split(jax.random.key(1), S))
    kw = dict(x0=x0, checkpoints=C, seed_chunk=3, backend="xla")
    pd.sa_phase_diagram(None, [0.5, 1.0, 2.0], dt=0.5, t1=1.0, **kw)
    pd.sa_phase_diagram(None, [3.0, 4.0], dt=0.25, t1=2.0, **kw)
    pd.usa_phase_diagram(None, [0.1, 1.0, 2.5], t1=0.05, **kw)
    pd.usa_phase_diagram(None, [2.0, 3.0], t1=0.05, **kw)
    new = {k: pd._TRACES[k] - before[k] for k in before}
    assert all(v <= 1 for v in new.values()), new  # 8 + 8 kernel runs, at most one trace per key
    assert pd._TRACES[keys(True)[True]] >= 1  # SA: every step a checkpoint
    # USA: beta = 0.1 takes 1 step (dense checkpoints), beta >= 1 many (sparse): both modes ran
    assert pd._TRACES[keys(False)[True]] >= 1 and pd._TRACES[keys(False)[False]] >= 1


def test_initial_fraction_matches_uniform_law(x64):
    """At t = 0 (uniform on the circle) P(<x_i, x_j> > c) = arccos(c) / pi; seeds are
    independent, so the standard error comes from the per-seed fractions."""
    thr = 0.9
    out = pd.sa_phase_diagram(
        jax.random.key(4),
        [1.0],
        n=16,
        d=2,
        seeds=400,
        t1=0.1,
        checkpoints=2,
        threshold=thr,
        per_seed=True,
    )
    c0 = out.per_seed[0, :, 0]
    se = c0.std(ddof=1) / np.sqrt(c0.size)
    theory = np.arccos(thr) / np.pi
    assert abs(c0.mean() - theory) < 4 * se, (c0.mean(), theory, se)


def test_sanity_laws(x64):
    """SA (n = 16, d = 2): small beta collapses to one cluster by t = 10 (consensus), the
    fraction growing in time; large beta forms local clusters first (more clustered early)
    but they are metastable (less clustered late). Differences are checked against
    4 standard errors of the per-seed differences (same initial states for both betas).
    USA at tiny beta barely moves by t = 0.25."""
    out = pd.sa_phase_diagram(
        jax.random.key(0), [0.1, 9.0], n=16, d=2, seeds=64, t1=10.0, checkpoints=11, per_seed=True
    )
    f = out.fraction
    assert f[0, -1] > 0.85 and f[0, 0] < 0.05
    assert np.all(np.diff(f[0]) >= -0.01)
    diff = out.per_seed[0] - out.per_seed[1]  # (seeds, C)
    se = diff.std(axis=0, ddof=1) / np.sqrt(diff.shape[0])
    assert np.all(diff[:, 8:].mean(0) > 4 * se[8:])  # t >= 8: small beta ahead
    assert diff[:, 2].mean() < -4 * se[2]  # t = 2: large beta ahead
    u = pd.usa_phase_diagram(
        jax.random.key(0), [0.1], n=16, d=2, seeds=64, checkpoints=3, per_seed=True
    )
    assert u.steps[0] == 3  # step 0.1 for beta <= ~0.6
    assert abs(u.fraction[0, -1] - u.fraction[0, 0]) < 0.01


def test_bad_input():
    with pytest.raises(ValueError, match="betas"):
        pd.sa_phase_diagram(jax.random.key(0), [-1.0, 2.0], n=4, seeds=2)
    with pytest.raises(ValueError, match="even n"):
        pd.sa_phase_diagram(jax.random.key(0), [1.0], n=5, seeds=2, packed=True)
    with pytest.raises(ValueError, match="threshold"):
        pd.usa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=2, threshold=1.5)
    with pytest.raises(ValueError, match="x0"):
        pd.sa_phase_diagram(None, [1.0], x0=np.ones((4, 3)))
    with pytest.raises(ValueError, match="seed_chunk"):
        pd.sa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=2, seed_chunk=0)
    with pytest.raises(TypeError, match="seed_chunk"):
        pd.usa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=2, seed_chunk=2.5)


# ----------------------------------------------------------------------------
# tiled velocity
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["usa", "rope"])
def test_velocity_tiled_equals_dense(name, x64):
    n, d = 50, 3  # 50 = 3 tiles of 16 + a ragged tile of 2
    x = _x0(1, n, d, seed=9)[0]
    k = mf.kernels.make(name, beta=1.3)
    dense = mf.velocity(k, x)
    tiled = mf.velocity(k, x, block_size=16)
    np.testing.assert_allclose(tiled, dense, rtol=0, atol=1e-13)
    np.testing.assert_allclose(dense, mf.velocity(k, x, method="pairwise"), rtol=0, atol=1e-12)


def test_velocity_tiled_large_n_runs():
    """n = 8192 (n^2 > DENSE_LIMIT: row tiles) completes; rows agree with the dense formula."""
    n, d = 8192, 3
    assert n * n > mf.kernels.DENSE_LIMIT
    x = mf.sphere.uniform(jax.random.key(0), n, d)
    v = jax.jit(lambda x: mf.velocity(mf.kernels.USA(1.0), x))(x)
    assert v.shape == (n, d) and bool(jnp.all(jnp.isfinite(v)))
    assert float(jnp.abs(jnp.sum(v * x, axis=1)).max()) < 1e-5
    # the reference in float64 (NumPy): a float32 reference sum of 8192 terms is itself off by up to
    # ~4e-5 of the field's size on some CPUs (measured), the engine's tiles by ~3e-6
    i = np.arange(0, n, 257)
    X = np.asarray(x, np.float64)
    F = np.exp(X[i] @ X.T) @ X / n
    vr = F - np.sum(F * X[i], -1, keepdims=True) * X[i]
    np.testing.assert_allclose(
        np.asarray(v, np.float64)[i], vr, rtol=0, atol=2e-5 * float(np.abs(vr).max())
    )


_TWO_DEVICES = r"""
import sys, jax, numpy as np
jax.config.update("jax_enable_x64", True)
from meanfield import phase_diagram as pd
x0 = np.load(sys.argv[1])
a = pd.sa_phase_diagram(None, [0.5, 4.0], x0=x0, dt=0.1, t1=1.0, checkpoints=5, seed_chunk=3, per_seed=True,
                       backend="xla")
b = pd.usa_phase_diagram(None, [0.3, 3.0], x0=x0, checkpoints=5, per_seed=True, backend="xla")
np.savez(sys.argv[2], sa=a.per_seed, usa=b.per_seed, devices=len(jax.devices()))
"""


def test_tasks_spread_over_devices_give_the_same_numbers(tmp_path, x64):
    """With two CPU devices the (beta, seed chunk) tasks of the XLA kernel run on both; the
    results equal the one-device run (each task is the same program on the same data)."""
    import os
    import subprocess
    import sys

    x0 = np.asarray(_x0(7, 6, 2, seed=9))
    np.save(tmp_path / "x0.npy", x0)
    env = dict(
        os.environ,
        XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2",
    )
    r = subprocess.run(
        [sys.executable, "-c", _TWO_DEVICES, str(tmp_path / "x0.npy"), str(tmp_path / "out.npz")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")
    assert int(out["devices"]) == 2
    a = pd.sa_phase_diagram(
        None,
        [0.5, 4.0],
        x0=x0,
        dt=0.1,
        t1=1.0,
        checkpoints=5,
        seed_chunk=3,
        per_seed=True,
        backend="xla",
    )
    b = pd.usa_phase_diagram(None, [0.3, 3.0], x0=x0, checkpoints=5, per_seed=True, backend="xla")
    np.testing.assert_array_equal(out["sa"], a.per_seed)
    np.testing.assert_array_equal(out["usa"], b.per_seed)
    assert a.per_seed.max() > 0  # not trivially zero


# ----------------------------------------------------------------------------
# native (fused C) backend
# ----------------------------------------------------------------------------


@pytest.mark.native
def test_native_kernel_builds():
    """The CI machine has a C compiler: the fused kernel must build there (the XLA
    fallback would hide a broken build)."""
    from meanfield import _native

    assert _native.phase_library().available, _native.phase_library().reason
    assert _native.phase_library().reason is None


@pytest.mark.native
@pytest.mark.parametrize("normalized", [True, False])
def test_native_generic_d_odd_n_ragged_seeds_equal_reference(normalized, x64):
    """d = 5 (the kernel's runtime-d path), odd n, 11 seeds (padded to blocks of 8)."""
    S, n, d, C, thr = 11, 7, 5, 6, 0.6
    x0 = _x0(S, n, d, seed=21)
    betas = np.array([0.4, 2.5])
    if normalized:
        grids = [pd.checkpoint_steps(1.5, 0.1, C)] * 2
    else:
        grids = [pd.checkpoint_steps(0.2, float(pd.usa_step_size(b)), C) for b in betas]
    Ns, hs, idxs = zip(*grids)
    ref_fr, ref_x = _reference(x0, betas, hs, Ns, idxs, thr, normalized)
    fr, xs = pd._sweep(
        x0, betas, hs, Ns, idxs, thr, normalized, False, None, states=True, backend="native"
    )
    np.testing.assert_allclose(xs, ref_x, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(fr, ref_fr)
    assert 0 < ref_fr.mean() < 1 and np.unique(ref_fr).size > 3  # not a trivial comparison


@pytest.mark.native
def test_native_equals_xla_at_the_benchmark_shape(x64):
    """n = 32, d = 2, 100 SA steps with a checkpoint at every state (the benchmark's
    setting, 48 seeds): the same fractions, states equal to rounding; thread count does
    not change a bit (blocks of seeds are independent)."""
    from meanfield import _native

    x0 = _x0(48, 32, 2, seed=2)
    kw = dict(x0=x0, dt=0.1, t1=10.0, checkpoints=200, per_seed=True)
    a = pd.sa_phase_diagram(None, [0.1, 4.0, 9.0], backend="xla", **kw)
    b = pd.sa_phase_diagram(None, [0.1, 4.0, 9.0], backend="native", **kw)
    np.testing.assert_array_equal(a.per_seed, b.per_seed)
    assert a.fraction[:, -1].min() > 0.2
    N, h, idx = pd.checkpoint_steps(10.0, 0.1, 200)
    u = np.unique(idx)
    f1, x1 = _native.phase_run(np.asarray(x0), 9.0, 0.0, h, N, u, 0.999, True, threads=1)
    f2, x2 = _native.phase_run(np.asarray(x0), 9.0, 0.0, h, N, u, 0.999, True, threads=2)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(f1, f2)
    _, xx = pd._sweep(
        x0, np.array([9.0]), [h], [N], [idx], 0.999, True, False, None, states=True, backend="xla"
    )
    np.testing.assert_allclose(x1, xx[0], rtol=0, atol=1e-11)


@pytest.mark.native
def test_backend_choice_and_errors(x64):
    x32 = np.asarray(_x0(3, 4, 2), dtype=np.float32)
    x64_ = _x0(3, 4, 2)
    from meanfield import _native

    # "auto" follows the crossover measured on this machine (tests/test_backend.py); here one
    # where the kernel was faster at every shape, so the choice depends on the states alone
    faster = _native.Crossover(max_d=_native.MAX_D, min_n=2, times={}, seconds=0.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(_native._state, "crossover", {"float64": faster, "float32": faster})
        assert pd._resolve_backend("auto", jnp.asarray(x64_), False) == "native"
        assert pd._resolve_backend("auto", jnp.asarray(x32), False) == "native"
    assert pd._resolve_backend("auto", jnp.asarray(x64_, jnp.float16), False) == "xla"
    assert pd._resolve_backend("auto", jnp.asarray(x64_), True) == "xla"
    with pytest.raises(ValueError, match="backend must be one of"):
        pd.sa_phase_diagram(None, [1.0], x0=x64_, backend="cuda")
    with pytest.raises(ValueError, match="float32 and float64"):
        pd.sa_phase_diagram(None, [1.0], x0=x64_, dtype=jnp.float16, backend="native")
    with pytest.raises(ValueError, match="packed"):
        pd.usa_phase_diagram(None, [1.0], x0=x64_, packed=True, backend="native")
    from meanfield import _native

    with pytest.raises(ValueError, match="ckpt"):
        _native.phase_run(np.asarray(x64_), 1.0, 0.0, 0.1, 3, [2, 1], 0.9, True)
    with pytest.raises(ValueError, match="x0"):
        _native.phase_run(np.ones((3, 4)), 1.0, 0.0, 0.1, 3, [1], 0.9, True)
    with pytest.raises(ValueError, match="nsteps"):
        _native.phase_run(np.asarray(x64_), 1.0, 0.0, 0.1, -1, [], 0.9, True)
    with pytest.raises(ValueError, match="threads"):
        _native.phase_run(np.asarray(x64_), 1.0, 0.0, 0.1, 3, [1], 0.9, True, threads=0)


@pytest.mark.native
@pytest.mark.parametrize("normalized", [True, False])
def test_native_float32_matches_xla_float32(normalized):
    """float32 (JAX's default dtype): the native kernel (16 seeds per SIMD block) against the
    XLA kernel in float32 and the float64 reference: states agree to float32 rounding as the
    dynamics amplify it; a pair within that distance of the threshold may count differently,
    so the fractions agree on all but a few per-seed entries and on average."""
    with jax.enable_x64(True):
        x0 = np.asarray(_x0(40, 16, 3, seed=8), dtype=np.float32)
    betas = np.array([0.5, 4.0])
    if normalized:
        grids = [pd.checkpoint_steps(5.0, 0.1, 11)] * 2
    else:
        grids = [pd.checkpoint_steps(0.25, float(pd.usa_step_size(b)), 11) for b in betas]
    Ns, hs, idxs = zip(*grids)
    args = (betas, hs, Ns, idxs, 0.99, normalized, False, None)
    fn, xn = pd._sweep(jnp.asarray(x0), *args, states=True, backend="native")
    fx, xx = pd._sweep(jnp.asarray(x0), *args, states=True, backend="xla")
    assert xn.dtype == np.float32 and fn.dtype == np.float32
    np.testing.assert_allclose(xn, xx, rtol=0, atol=2e-4)
    with jax.enable_x64(True):
        f64, x64_ = pd._sweep(jnp.asarray(x0, jnp.float64), *args, states=True, backend="native")
    np.testing.assert_allclose(xn, x64_, rtol=0, atol=2e-4)
    # a different count is a step of 1/240; float32 vs float64 division differ by an ulp
    assert np.mean(np.abs(fn - fx) > 1e-6) < 0.01 and abs(fn.mean() - fx.mean()) < 1e-3
    assert np.mean(np.abs(fn - f64) > 1e-6) < 0.01 and fn.max() > 0.1


_NATIVE_ENV = r"""
import sys, jax, numpy as np
jax.config.update("jax_enable_x64", True)
from meanfield import _native, phase_diagram as pd
x0 = np.load(sys.argv[1])
out = pd.sa_phase_diagram(None, [2.0], x0=x0, dt=0.1, t1=1.0, checkpoints=4, per_seed=True)
try:
    pd.sa_phase_diagram(None, [2.0], x0=x0, dt=0.1, t1=1.0, checkpoints=4, backend="native")
    err = ""
except RuntimeError as e:
    err = str(e)
np.savez(sys.argv[2], per_seed=out.per_seed, available=_native.phase_library().available, err=err)
"""


@pytest.mark.parametrize("disabled", [False, True])
def test_native_build_cache_and_switch(tmp_path, disabled, x64):
    """A fresh cache directory gets one compiled library per dtype; MEANFIELD_NATIVE=0 disables the
    kernel: "auto" falls back to XLA with the same numbers, "native" says why it cannot run."""
    import os
    import subprocess
    import sys

    x0 = np.asarray(_x0(9, 6, 2, seed=4))
    np.save(tmp_path / "x0.npy", x0)
    cache = tmp_path / "cache"
    env = dict(
        os.environ, MEANFIELD_CACHE_DIR=str(cache), MEANFIELD_NATIVE="0" if disabled else "1"
    )
    r = subprocess.run(
        [sys.executable, "-c", _NATIVE_ENV, str(tmp_path / "x0.npy"), str(tmp_path / "o.npz")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "o.npz")
    built = list(cache.glob("phase_kernel-*.so")) if cache.exists() else []
    assert bool(out["available"]) is (not disabled)
    assert len(built) == (0 if disabled else 2)  # float64 and float32 builds
    assert ("MEANFIELD_NATIVE=0" in str(out["err"])) is disabled
    ref = pd.sa_phase_diagram(
        None, [2.0], x0=x0, dt=0.1, t1=1.0, checkpoints=4, per_seed=True, backend="xla"
    )
    np.testing.assert_array_equal(out["per_seed"], ref.per_seed)


def test_native_compiler_failure_is_reported_and_remembered(tmp_path):
    """A compiler that rejects the source (here ``CC=false``): the kernel is unavailable with
    the reason, "auto" runs the XLA kernel, and each rejected flag set is marked in the cache
    so that later processes do not compile again."""
    import os
    import subprocess
    import sys

    code = (
        "from meanfield import _native, phase_diagram as pd\n"
        "import jax\n"
        "print(_native.phase_library().available, '|', _native.phase_library().reason)\n"
        "print(pd.sa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=3, t1=0.2, checkpoints=2).shape)\n"
    )
    env = dict(os.environ, CC="false", MEANFIELD_CACHE_DIR=str(tmp_path), MEANFIELD_NATIVE="1")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()[-2:]
    assert first.startswith("False") and "C compiler failed" in first
    assert second == "(1, 2)"
    assert len(list(tmp_path.glob("phase_kernel-*.failed"))) == 2 and not list(
        tmp_path.glob("phase_kernel-*.so")
    )
