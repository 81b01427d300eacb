"""The fused C kernel of the exp-kernel fields (``meanfield._native`` ``exp_kernel.c``, an XLA
FFI call) against the XLA formulation and the single-pair reference.

``backend="xla"`` (``kernels.use_backend("xla")``) selects the XLA formulation (the reference),
``backend="native"`` the fused kernel; every comparison runs both in one process. Shapes cover the kernel's branches: ``n`` below, at and above
a SIMD vector (16 float32 / 8 float64 columns), row blocks of 4 with absent rows, the
specialised dimensions (2, 3, 4, 8, 16) and the generic one, batches larger and smaller than
the thread count (the latter with rows in parallel). No timings.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import _native

K = mf.kernels


@pytest.fixture(autouse=True)
def _needs_native(request):
    """Tests of the kernel skip where it cannot be built, except the one that says it must."""
    if (
        request.node.originalname != "test_native_kernel_builds"
        and not _native.exp_library().available
    ):
        pytest.skip(f"no native kernel: {_native.exp_library().reason}")


@pytest.fixture
def xla_path():
    with K.use_backend("xla"):
        yield


def _xs(S, n, d, seed=0, dtype=jnp.float64):
    keys = jax.random.split(jax.random.key(seed), S)
    return jax.vmap(lambda k: mf.sphere.uniform(k, n, d, dtype))(keys)


def _both(fn, *args, check_path=True):
    """``fn(*args)`` jitted with the native kernel and with the XLA formulation; the lowered
    programs prove which path each took (the FFI call is in the first only; ``check_path=False``
    for programs whose every native value may be dead code, e.g. a pure gradient)."""
    paths = []
    for backend in ("native", "xla"):
        with K.use_backend(backend):  # what mf.field & co. run without their own backend=
            f = jax.jit(lambda *a: fn(*a))  # a fresh function: no trace shared between the paths
            paths.append((f(*args), "meanfield_exp" in f.lower(*args).as_text()))
    (native, used_native), (xla, used_ffi) = paths
    assert not used_ffi and (used_native or not check_path)
    return native, xla


def test_native_kernel_builds():
    """CI machines have a C compiler and jaxlib's FFI headers: the kernel must build there."""
    lib = _native.exp_library()
    assert lib.available, lib.reason
    assert lib.reason is None and lib.crossover is not None


@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-14), ("float32", 2e-6)])
def test_two_antipodal_clusters_closed_form(dtype, rtol, x64):
    """k particles at u and n - k at -u (docs/math/particles.md, Energy): exactly
    F_i = (1/n) (k e^beta - (n - k) e^-beta) u for x_i = u (and the mirror for -u), and
    E = (k^2 + (n - k)^2) e^beta + 2 k (n - k) e^-beta over 2 beta n^2; through the native path."""
    n, k, beta = 37, 12, 1.7
    u = np.array([0.6, 0.0, 0.8])
    x = jnp.asarray(np.concatenate([np.tile(u, (k, 1)), np.tile(-u, (n - k, 1))]), dtype)
    F, E = _both(lambda x: (mf.field(K.USA(beta), x), mf.energy(K.USA(beta), x)), x)[0]
    a = (k * np.exp(beta) - (n - k) * np.exp(-beta)) / n
    b = ((n - k) * np.exp(beta) - k * np.exp(-beta)) / n
    np.testing.assert_allclose(F[:k], np.tile(a * u, (k, 1)), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(F[k:], np.tile(-b * u, (n - k, 1)), rtol=rtol, atol=rtol)
    E_ref = ((k**2 + (n - k) ** 2) * np.exp(beta) + 2 * k * (n - k) * np.exp(-beta)) / (
        2 * beta * n**2
    )
    np.testing.assert_allclose(E, E_ref, rtol=rtol)


@pytest.mark.parametrize(
    "n,d", [(1, 3), (2, 2), (5, 3), (8, 4), (16, 8), (17, 3), (33, 5), (70, 16), (129, 2), (40, 64)]
)
def test_exp_field_numpy_against_formula(n, d, x64):
    """``exp_field`` (ctypes) against the dense formula, float64 to 1e-13 and float32 to 2e-6."""
    x = np.asarray(_xs(3, n, d, seed=n + d))
    beta = np.array([0.3, 2.0, 7.0])
    W = np.exp(beta[:, None, None] * (np.einsum("bid,bjd->bij", x, x) - 1.0))
    F_ref, S_ref = np.einsum("bij,bjd->bid", W, x) / n, W.sum((1, 2))
    F, S = _native.exp_field(x, beta)
    np.testing.assert_allclose(F, F_ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(S, S_ref, rtol=1e-13)
    F32, S32 = _native.exp_field(x.astype(np.float32), beta)
    np.testing.assert_allclose(F32, F_ref, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(S32, S_ref, rtol=2e-6)
    none, S_only = _native.exp_field(x, beta, field=False)
    assert none is None
    np.testing.assert_array_equal(S_only, S)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("S,n,d", [(7, 10, 3), (3, 33, 8), (1, 300, 3), (2, 520, 8), (4, 21, 6)])
def test_velocity_and_energy_native_equal_xla(dtype, S, n, d, x64):
    """Every exp kernel (USA, rescaled USA, RoPE, Prompt, Gauge) vmapped over seeds: field and
    energy through the native kernel equal the XLA formulation to rounding."""
    xs = _xs(S, n, d, seed=S + n, dtype=jnp.dtype(dtype))
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == "float64" else dict(rtol=2e-5, atol=2e-6)
    kernels = [
        K.USA(1.3),
        K.USA(40.0, rescaled=True),
        K.RoPE(1.1, 2.5),
        K.Prompt(0.9, K.random_gauges(jax.random.key(3), 3, d, jnp.dtype(dtype))),
        K.Gauge(1.2, lambda s: mf.sphere.rotation(6.0 * s, d, (0, 1))),
    ]
    for kernel in kernels:
        aux = kernel.default_aux(n)
        fn = jax.vmap(lambda x, k=kernel, a=aux: (mf.velocity(k, x, a), mf.energy(k, x, a)))
        (v, e), (vx, ex) = _both(fn, xs)
        assert v.dtype == jnp.dtype(dtype)
        np.testing.assert_allclose(v, vx, **tol)
        np.testing.assert_allclose(e, ex, rtol=tol["rtol"])


def test_native_against_pairwise_reference(x64):
    """The single-pair definition (the reference of every fast path) on one system."""
    x = _xs(1, 23, 4, seed=9)[0]
    for kernel in (
        K.USA(2.2),
        K.RoPE(0.7, 3.0),
        K.Prompt(1.4, K.random_gauges(jax.random.key(1), 2, 4, jnp.float64)),
    ):
        aux = kernel.default_aux(23)
        np.testing.assert_allclose(
            mf.velocity(kernel, x, aux),
            mf.velocity(kernel, x, aux, method="pairwise"),
            rtol=1e-12,
            atol=1e-14,
        )
        np.testing.assert_allclose(
            mf.energy(kernel, x, aux), mf.energy(kernel, x, aux, method="pairwise"), rtol=1e-12
        )


def test_nested_vmaps_shared_gauge_and_beta_grid(x64):
    """vmap over beta (outer) and seeds (inner); per-system labels; one state under batched labels."""
    xs = _xs(5, 19, 3, seed=1)
    betas = jnp.array([0.5, 1.0, 3.0])
    kern = K.RoPE(1.5, 3.0)
    auxs = jax.vmap(lambda k: jax.random.uniform(k, (19,), jnp.float64))(
        jax.random.split(jax.random.key(2), 5)
    )
    fns = [
        lambda: jax.vmap(lambda b: jax.vmap(lambda x: mf.velocity(K.RoPE(b, 2.0), x))(xs))(betas),
        lambda: jax.vmap(lambda x, a: mf.velocity(kern, x, a))(xs, auxs),
        lambda: jax.vmap(lambda a: mf.velocity(kern, xs[0], a))(auxs),
        lambda: jax.vmap(lambda b: mf.energy(K.USA(b), xs[0]))(betas),
    ]
    for fn in fns:
        native, xla = _both(fn)
        np.testing.assert_allclose(native, xla, rtol=1e-12, atol=1e-14)


def test_derivatives_equal_the_xla_formulation(x64):
    """grad, jvp, d/dbeta and the Hessian through the native kernel (its tangent:
    tests/test_native_ad.py) equal those of the XLA path."""
    xs = _xs(3, 12, 3, seed=4)
    f = lambda b, x: mf.energy(K.USA(b), x)  # noqa: E731
    for fn in (
        lambda: jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=(None, 0))(1.7, xs),
        lambda: jax.jvp(lambda y: mf.velocity(K.RoPE(1.2, 2.0), y), (xs[0],), (xs[1],)),
        lambda: jax.hessian(lambda x: f(0.8, x))(xs[2]),
    ):
        native, xla = _both(fn, check_path=False)  # reverse mode needs no primal value: DCE
        for a, b in zip(jax.tree.leaves(native), jax.tree.leaves(xla), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


def test_simulation_native_equals_xla(x64):
    """A diffrax integration (the velocity inside diffrax's loop) is the same with both paths."""
    x0 = _xs(1, 24, 3, seed=7)[0]
    native, xla = _both(lambda x: mf.simulate(K.USA(2.0), x, t1=2.0, dt=0.05, ts=[1.0, 2.0]).xs, x0)
    np.testing.assert_allclose(native, xla, rtol=1e-10, atol=1e-12)


def test_thread_count_changes_nothing_per_system_and_little_across_rows(x64):
    """Batches of at least the thread count run whole systems per thread; one large system sums
    its rows through a fixed set of virtual workers: bit-identical for any thread count."""
    xs = np.asarray(_xs(4, 150, 3, seed=11))
    big = np.asarray(_xs(1, 700, 5, seed=12))
    beta4, beta1 = np.full(4, 1.5), np.full(1, 1.5)
    try:  # fixed thread counts (adaptive=False): the load of the machine must not pick the branch
        _native.set_exp_threads(1, adaptive=False)
        one = _native.exp_field(xs, beta4), _native.exp_field(big, beta1)
        _native.set_exp_threads(3, adaptive=False)
        three = _native.exp_field(xs, beta4), _native.exp_field(big, beta1)
    finally:
        _native.set_exp_threads()
    np.testing.assert_array_equal(one[0][0], three[0][0])
    np.testing.assert_array_equal(one[0][1], three[0][1])
    np.testing.assert_array_equal(one[1][0], three[1][0])
    np.testing.assert_array_equal(one[1][1], three[1][1])


def test_fallbacks_and_errors():
    """d > 64 and float16: "auto" runs XLA, "native" is one ValueError saying why; bad arguments of
    the NumPy entry and of the backend."""
    x = _xs(1, 6, 65, dtype=jnp.float32)[0]
    np.testing.assert_allclose(
        mf.velocity(K.USA(1.0), x),
        mf.velocity(K.USA(1.0), x, method="pairwise"),
        rtol=1e-5,
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="backend='native' supports d <= 64, got d = 65"):
        mf.velocity(K.USA(1.0), x, backend="native")
    h = mf.sphere.normalize(x[:, :4].astype(jnp.float16))
    assert mf.velocity(K.USA(1.0), h).dtype == jnp.float16
    with pytest.raises(ValueError, match="backend='native' runs float32 and float64, got float16"):
        mf.velocity(K.USA(1.0), h, backend="native")
    with pytest.raises(
        ValueError, match="backend must be one of 'auto', 'native', 'xla', got 'gpu'"
    ):
        K.use_backend("gpu")
    with pytest.raises(ValueError, match="float64 or float32"):
        _native.exp_field(np.ones((1, 3, 2), np.int32), [1.0])
    with pytest.raises(ValueError, match="shape"):
        _native.exp_field(np.ones((3, 2)), [1.0])
    with pytest.raises(ValueError, match="beta must have shape"):
        _native.exp_field(np.ones((2, 3, 2)), [1.0])
    with pytest.raises(ValueError, match="threads"):
        _native.set_exp_threads(0)
    with pytest.raises(TypeError, match="adaptive"):
        _native.set_exp_threads(2, adaptive=1)


def test_the_jaxpr_keeps_the_xla_path_for_other_platforms():
    """The native call sits in a platform-dependent branch: CPU lowers the FFI call, any other
    platform the XLA formulation (which the jaxpr still holds)."""
    x = _xs(2, 8, 3, dtype=jnp.float32)
    jaxpr = str(jax.make_jaxpr(jax.vmap(lambda x: mf.velocity(K.USA(1.0), x, backend="native")))(x))
    assert "meanfield_exp_fs_f32" in jaxpr and "platform_index" in jaxpr
    hlo = (
        jax.jit(jax.vmap(lambda x: mf.velocity(K.USA(1.0), x, backend="native"))).lower(x).as_text()
    )
    assert "meanfield_exp_fs_f32" in hlo


_ENV_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np, meanfield as mf
from meanfield import _native
x = mf.sphere.uniform(jax.random.key(0), 20, 3)
k = mf.kernels.USA(1.0)  # imports meanfield.kernels: the kernel is built (or not) here
b = "native" if _native.exp_library().available else "auto"  # "auto" runs XLA where it is unavailable
v = jax.jit(lambda x: mf.velocity(mf.kernels.USA(1.0), x, backend=b))(x)
hlo = jax.jit(lambda x: mf.velocity(mf.kernels.USA(1.0), x, backend=b)).lower(x).as_text()
print(_native.exp_library().available, "meanfield_exp" in hlo, "|", _native.exp_library().reason)
np.save(__import__("sys").argv[1], np.asarray(v))
"""


@pytest.mark.parametrize("env", [{"MEANFIELD_NATIVE": "0"}, {"CC": "false"}, {}])
def test_build_switch_and_compiler_failure(tmp_path, env):
    """A fresh cache builds the kernel (both dtypes); MEANFIELD_NATIVE=0 or a failing compiler
    leave the XLA formulation with the same numbers and the reason."""
    cache = tmp_path / "cache"
    full = {**os.environ, "MEANFIELD_CACHE_DIR": str(cache), "MEANFIELD_NATIVE": "1", **env}
    r = subprocess.run(
        [sys.executable, "-c", _ENV_SCRIPT, str(tmp_path / "v.npy")],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    built = sorted(p.name.split("-")[0] for p in cache.glob("*.so")) if cache.exists() else []
    if not env:
        assert line.startswith("True True"), line
        assert built == ["exp_kernel", "exp_kernel"]
    else:
        assert line.startswith("False False"), line
        assert (
            ("MEANFIELD_NATIVE=0" in line)
            if "MEANFIELD_NATIVE" in env
            else ("C compiler failed" in line)
        )
        assert built == []
    x = mf.sphere.uniform(jax.random.key(0), 20, 3)
    np.testing.assert_allclose(
        np.load(tmp_path / "v.npy"),
        mf.velocity(K.USA(1.0), x, method="pairwise"),
        rtol=2e-5,
        atol=2e-6,
    )


@pytest.mark.parametrize("B", [1, 3])
def test_float32_keeps_float32_accuracy_at_large_n(B):
    """n = 6000 in float32 (rows split over 2 threads when B = 1, whole systems when B = 3):
    partial sums switch to double, so the error stays at float32 rounding (< 2e-6 relative)
    instead of growing with n."""
    n, d = 6000, 3
    x = np.asarray(_xs(B, n, d, seed=21, dtype=jnp.float32))
    beta = np.linspace(0.5, 4.0, B).astype(np.float32)
    try:
        _native.set_exp_threads(2, adaptive=False)
        F, S = _native.exp_field(x, beta)
    finally:
        _native.set_exp_threads()
    for b in range(B):
        xd = x[b].astype(np.float64)
        W = np.exp(float(beta[b]) * (xd @ xd.T - 1.0))
        F_ref = W @ xd / n
        assert np.abs(F[b] - F_ref).max() / np.abs(F_ref).max() < 2e-6
        assert abs(S[b] - W.sum()) / W.sum() < 2e-6


_SHARDED = r"""
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import meanfield as mf
sh = NamedSharding(Mesh(np.asarray(jax.devices()), ("batch",)), P("batch"))
x = jax.vmap(lambda k: mf.sphere.uniform(k, 40, 3))(jax.random.split(jax.random.key(0), 8))
fn = lambda x: (mf.velocity(mf.kernels.RoPE(1.3, 2.0), x), mf.energy(mf.kernels.USA(0.7), x))
with mf.kernels.use_backend("native"):
    f = jax.jit(jax.vmap(fn), in_shardings=sh, out_shardings=sh)
    hlo = f.lower(x).compile().as_text()
    v, e = f(x)
calls = [l for l in hlo.splitlines() if "meanfield_exp" in l and "custom-call" in l]
with mf.kernels.use_backend("xla"):
    vx, ex = jax.jit(jax.vmap(fn))(x)
print(len(calls), "all-gather" in hlo, all("[2,40,3]" in l for l in calls),
      float(jnp.abs(v - vx).max()), float(jnp.abs(e / ex - 1).max()),
      mf._native.exp_threads() == max(1, mf._native.default_threads() // 4))
"""


def test_sharded_batch_stays_sharded():
    """A batch sharded over 4 CPU devices (a sweep's mesh): each device runs the native call on
    its own 2 systems (custom_partitioning), no all-gather, same numbers as the XLA path."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    r = subprocess.run(
        [sys.executable, "-c", _SHARDED],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "MEANFIELD_NATIVE": "1"},
    )
    assert r.returncode == 0, r.stderr
    ncalls, gathered, local, dv, de, threads_per_device = r.stdout.split()
    assert int(ncalls) == 2 and gathered == "False" and local == "True", r.stdout
    assert threads_per_device == "True"  # 4 devices share the CPUs: no oversubscription
    assert float(dv) < 1e-5 and float(de) < 1e-5


@pytest.mark.parametrize("shared", [True, False])
def test_exp_field_with_gauges_against_formula(shared, x64):
    """Gauge matrices inside the kernel: weights of y_i = Psi_i x_i, field Psi_i^T (1/n) W y."""
    B, n, d = 3, 29, 4
    x = np.asarray(_xs(B, n, d, seed=5))
    G = np.asarray(K.random_gauges(jax.random.key(8), n if shared else B * n, d, jnp.float64))
    G = G if shared else G.reshape(B, n, d, d)
    beta = np.array([0.4, 1.7, 5.0])
    Gb = np.broadcast_to(G, (B, n, d, d))
    y = np.einsum("bnac,bnc->bna", Gb, x)
    W = np.exp(beta[:, None, None] * (np.einsum("bid,bjd->bij", y, y) - 1.0))
    F_ref = np.einsum("bnac,bna->bnc", Gb, np.einsum("bij,bjd->bid", W, y) / n)
    F, S = _native.exp_field(x, beta, gauge=G)
    np.testing.assert_allclose(F, F_ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(S, W.sum((1, 2)), rtol=1e-13)
    with pytest.raises(ValueError, match="gauge must have shape"):
        _native.exp_field(x, beta, gauge=G[..., :2])


def test_use_backend_applies_to_functions_traced_before():
    """``use_backend`` is a public JAX user context, in jit's cache key: the same jitted function
    traces the other path inside it instead of keeping the one it was compiled with (no cache is
    cleared: tests/test_registry.py shows that switching back does not retrace)."""
    x = _xs(1, 12, 3, dtype=jnp.float32)[0]
    f = jax.jit(lambda x: mf.velocity(K.USA(1.0), x))
    with K.use_backend("native"):
        assert "meanfield_exp" in f.lower(x).as_text()
        v_native = f(x)
    with K.use_backend("xla"):
        assert "meanfield_exp" not in f.lower(x).as_text()
        np.testing.assert_allclose(f(x), v_native, rtol=2e-6, atol=1e-7)


def test_auto_follows_the_measured_crossover(monkeypatch):
    """``"auto"`` takes the fused kernel exactly where the crossover measured on this machine says
    it is faster (a crossover put in its place here), never by a fixed rule."""
    from meanfield._native import Crossover

    lib = _native.exp_library()
    measured = lib.crossover
    assert measured.max_d in (0, *_native.CROSSOVER_DS, _native.EXP_MAX_D) and measured.seconds < 10
    assert set(measured.times) == {f"{n} x 3" for n in _native.CROSSOVER_NS} | {
        f"{_native.CROSSOVER_N} x {d}" for d in _native.CROSSOVER_DS
    }
    monkeypatch.setitem(
        _native._exp_state, "crossover", Crossover(max_d=4, min_n=100, times={}, seconds=0.0)
    )
    for (n, d), path in {(120, 3): "native", (120, 5): "xla", (50, 3): "xla"}.items():
        x = _xs(1, n, d, dtype=jnp.float32)[0]
        hlo = jax.jit(lambda x: mf.velocity(K.USA(1.0), x)).lower(x).as_text()  # fresh: traced now
        assert ("meanfield_exp" in hlo) == (path == "native"), (n, d)
        assert K.resolve_backend("auto", n, d, jnp.float32) == path
    monkeypatch.setitem(
        _native._exp_state, "crossover", Crossover(max_d=0, min_n=None, times={}, seconds=0.0)
    )
    assert K.resolve_backend("auto", 512, 3, jnp.float32) == "xla"
    assert K.resolve_backend("native", 512, 3, jnp.float32) == "native"


def test_crossover_is_recorded_beside_the_library(tmp_path):
    """A fresh cache: the first "auto" measures (median of a few calls, well under the budget of
    the brief) and records the crossover beside the float32 library; a second process reads it.
    (The libraries, without any crossover, are this process's.)"""
    _seed(tmp_path, crossovers=False)
    code = (
        "import json, jax, meanfield as mf\nfrom meanfield import _native\n"
        "mf.velocity(mf.kernels.USA(1.0), mf.sphere.uniform(jax.random.key(0), 16, 3))\n"
        "c = _native._exp_state['crossover']\n"
        "print(json.dumps({'recorded': c.recorded, 'seconds': c.seconds, 'max_d': c.max_d}))"
    )
    env = {**os.environ, "MEANFIELD_CACHE_DIR": str(tmp_path), "MEANFIELD_NATIVE": "1"}
    runs = []
    for _ in range(2):
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
        )
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert runs[0]["recorded"] and runs[0]["recorded"].endswith(".crossover.json")
    assert runs[0]["recorded"].startswith(str(tmp_path))
    # what was measured is what is on disk (the time it took is recorded, not bounded: no timing
    # assertion), and a second process reads it back instead of measuring again
    on_disk = json.loads(Path(runs[0]["recorded"]).read_text())
    assert on_disk["seconds"] == runs[0]["seconds"] > 0 and on_disk["times"]
    assert runs[1] == runs[0]


def _seed(cache, crossovers):
    """Copy this process's built native libraries and their manifests (and, if ``crossovers``,
    the recorded crossovers) into ``cache``: a process using it loads them instead of compiling
    them again (the builds themselves: ``test_build_switch_and_compiler_failure``)."""
    cache.mkdir(mode=0o700, exist_ok=True)
    phase = _native.phase_library()  # built (or found) in this process's cache
    assert phase.available, phase.reason
    source = Path(os.path.realpath(_native._cache._cache_dir()))
    for path in source.iterdir():
        keep = path.suffix == ".so" or (
            path.suffix == ".json" and (crossovers or not path.name.endswith(".crossover.json"))
        )
        if keep and path.is_file() and not path.is_symlink():
            shutil.copy2(path, cache / path.name)


_SUBNORMALS = r"""
import numpy as np, jax, meanfield as mf
from meanfield import _native
before = float(np.float64(1e-300) * 1e-10)
x = mf.sphere.uniform(jax.random.key(0), 8, 3)
mf.velocity(mf.kernels.USA(1.0), x).block_until_ready()
mf.phase_diagram.sa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=3, t1=0.2, checkpoints=2)
assert _native.exp_library().available and _native.phase_library().available
print(before, float(np.float64(1e-300) * 1e-10), float(np.float32(1e-38) * np.float32(1e-3)))
"""


def test_loading_the_kernels_keeps_subnormals(tmp_path):
    """The kernels are compiled with -ffast-math but linked without it: GCC's crtfastmath.o would
    set flush-to-zero for the whole process when a library loads (subnormals in NumPy become 0).
    The libraries this process built, loaded by a fresh process."""
    _seed(tmp_path, crossovers=True)
    r = subprocess.run(
        [sys.executable, "-c", _SUBNORMALS],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MEANFIELD_CACHE_DIR": str(tmp_path), "MEANFIELD_NATIVE": "1"},
    )
    assert r.returncode == 0, r.stderr
    before, after, single = (float(v) for v in r.stdout.split())
    assert before > 0 and after == before and single > 0


_SHARD_MAP = r"""
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import meanfield as mf
mesh = Mesh(np.asarray(jax.devices()), ("batch",))
x = jax.vmap(lambda k: mf.sphere.uniform(k, 40, 3))(jax.random.split(jax.random.key(0), 8))
fn = jax.vmap(lambda y: (mf.velocity(mf.kernels.Prompt(1.1, mf.kernels.random_gauges(jax.random.key(2), 2, 3)), y),
                         mf.energy(mf.kernels.USA(0.8), y)))
f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("batch"), out_specs=P("batch")))
with mf.kernels.use_backend("native"):
    assert "meanfield_exp" in f.lower(x).as_text()
    v, e = f(x)
with mf.kernels.use_backend("xla"):
    vx, ex = jax.jit(fn)(x)
print(float(jnp.abs(v - vx).max()), float(jnp.abs(e / ex - 1).max()))
"""


def test_inside_shard_map():
    """Under ``jax.shard_map`` (varying manual axes checked): the native branch's outputs are
    cast to the inputs' varying axes, like the XLA branch's."""
    r = subprocess.run(
        [sys.executable, "-c", _SHARD_MAP],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MEANFIELD_NATIVE": "1"},
    )
    assert r.returncode == 0, r.stderr
    dv, de = (float(v) for v in r.stdout.split())
    assert dv < 1e-5 and de < 1e-5
