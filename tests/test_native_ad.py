"""Derivatives through the fused C kernel (``exp_kernel.c``'s tangent, ``kernels._exp._exp_tangent``)
against the XLA formulation (``backend="xla"``, the reference) and central finite differences.

Everything in float64. Against the XLA path the agreement is rounding-level: both evaluate the
same sums in another order (relative ``1e-11``: ``n = 16`` pair sums of terms up to ``e^beta``,
each a few ulp, plus the rounding of one forward field reused in the tangent). Against central
differences with step ``h = 1e-5`` the error is ``O(h^2 |f'''|) + O(eps |f| / h)``, about
``1e-10`` relative here: tolerance ``1e-7``. Every native program is checked to contain the FFI
target of the tangent (``meanfield_exp_t_f64``) or, for a pure gradient of the energy (which needs
only the forward field), the forward target; every XLA program contains neither. No timings.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import _native

K = mf.kernels
RTOL_XLA = 1e-11
RTOL_FD = 1e-7
H = 1e-5


@pytest.fixture(autouse=True)
def _needs_native():
    if not _native.exp_library().available:
        pytest.skip(f"no native kernel: {_native.exp_library().reason}")


def _xs(S, n, d, seed=0, dtype=jnp.float64):
    keys = jax.random.split(jax.random.key(seed), S)
    return jax.vmap(lambda k: mf.sphere.uniform(k, n, d, dtype))(keys)


def _both(fn, *args, target="meanfield_exp_t"):
    """``fn(*args)`` jitted with the native kernel and with the XLA formulation, and whether the
    native program contains ``target`` (the XLA one must contain no meanfield FFI call)."""
    out, texts = [], []
    for backend in ("native", "xla"):
        with K.use_backend(backend):
            f = jax.jit(lambda *a: fn(*a))  # a fresh function: no trace shared between the paths
            out.append(f(*args))
            texts.append(f.lower(*args).as_text())
    assert target in texts[0], f"the native program has no {target}"
    assert "meanfield_exp" not in texts[1]
    return out[0], out[1]


def _close(a, b, rtol):
    """Max-norm relative agreement over every leaf."""
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        u, v = np.asarray(u), np.asarray(v)
        scale = max(float(np.abs(v).max()), 1e-300)
        assert float(np.abs(u - v).max()) <= rtol * scale, (
            float(np.abs(u - v).max()) / scale,
            rtol,
        )


def _central(f, x, v):
    return (f(x + H * v) - f(x - H * v)) / (2 * H)


_KERNELS = {
    "usa": lambda: K.USA(1.7),
    "rope": lambda: K.RoPE(1.3, 2.0),
    "gauge": lambda: K.Gauge(0.9, K.WavyGauge(0.6, 3)),
    "prompt": lambda: K.Prompt(1.1, K.random_gauges(jax.random.key(3), 3, 3, jnp.float64)),
}


@pytest.mark.parametrize("B,n,d", [(3, 37, 3), (2, 9, 5), (1, 5, 2), (1, 600, 3), (2, 40, 8)])
def test_exp_tangent_against_formula(B, n, d, x64):
    """The C tangent (both of its branches: systems per thread, and rows of one large system
    over threads) against the dense NumPy formula
    dF_i = (1/n) sum_j [beta w_ij (<dy_i, y_j> + <y_i, dy_j>) y_j + w_ij dy_j]; float32 too."""
    rng = np.random.default_rng(B * 1000 + n + d)
    y = rng.normal(size=(B, n, d))
    y /= np.linalg.norm(y, axis=-1, keepdims=True)
    dy, beta = rng.normal(size=(B, n, d)), rng.uniform(0.3, 4.0, B)
    W = np.exp(beta[:, None, None] * (np.einsum("bid,bjd->bij", y, y) - 1))
    C = (
        beta[:, None, None]
        * W
        * (np.einsum("bid,bjd->bij", dy, y) + np.einsum("bid,bjd->bij", y, dy))
    )
    ref = (np.einsum("bij,bjd->bid", C, y) + np.einsum("bij,bjd->bid", W, dy)) / n
    _close(_native.exp_tangent(y, dy, beta), ref, 1e-13)
    _close(_native.exp_tangent(y.astype(np.float32), dy.astype(np.float32), beta), ref, 2e-6)
    with pytest.raises(ValueError, match="one shape"):
        _native.exp_tangent(y, dy[..., :1], beta)


def test_tangent_is_its_own_transpose(x64):
    """<u, T v> = <T u, v> (the Hessian of S / (2 beta n)): the transpose rule of reverse mode."""
    y, u, v = (np.asarray(a) for a in _xs(3, 50, 4, seed=1))
    beta = np.array([2.5])
    Tu, Tv = (
        _native.exp_tangent(y[None], u[None], beta),
        _native.exp_tangent(y[None], v[None], beta),
    )
    a, b = float(np.sum(u * Tv[0])), float(np.sum(Tu[0] * v))
    assert abs(a - b) <= 1e-13 * abs(a)


@pytest.mark.parametrize("name", ["usa", "rope", "gauge", "prompt"])
def test_grad_jvp_hvp_vjp_against_xla_and_finite_differences(name, x64):
    """grad(energy), jvp(velocity), the Hessian-vector product jvp(grad(energy)) and
    vjp(velocity): native = XLA to rounding, = central differences to FD accuracy."""
    k = _KERNELS[name]()
    x, v, u = _xs(3, 16, 3, seed=2)
    E = lambda y: mf.energy(k, y)  # noqa: E731
    V = lambda y: mf.velocity(k, y)  # noqa: E731

    g, gx = _both(jax.grad(E), x, target="meanfield_exp_fs")
    _close(g, gx, RTOL_XLA)
    _close(jnp.sum(g * v), _central(E, x, v), RTOL_FD)

    jv, jvx = _both(lambda y, t: jax.jvp(V, (y,), (t,))[1], x, v)
    _close(jv, jvx, RTOL_XLA)
    _close(jv, _central(V, x, v), RTOL_FD)

    hv, hvx = _both(lambda y, t: jax.jvp(jax.grad(E), (y,), (t,))[1], x, v)
    _close(hv, hvx, RTOL_XLA)
    _close(hv, _central(jax.grad(E), x, v), RTOL_FD)

    vj, vjx = _both(lambda y, c: jax.vjp(V, y)[1](c)[0], x, u)
    _close(vj, vjx, RTOL_XLA)
    _close(jnp.sum(vj * v), _central(lambda y: jnp.sum(u * V(y)), x, v), RTOL_FD)


@pytest.mark.slow
def test_tangent_hessian_of_analysis(x64):
    """mf.analysis.tangent_hessian (jax.hessian: forward over reverse) through the kernel."""
    k = K.RoPE(2.0, 3.0)
    x = _xs(1, 10, 3, seed=5)[0]
    H1, H2 = _both(lambda y: mf.analysis.tangent_hessian(k, y), x)
    _close(H1, H2, RTOL_XLA)
    # one column of the Euclidean Hessian by central differences of the gradient
    v = jnp.zeros_like(x).at[3, 1].set(1.0)
    hess = jax.hessian(lambda y: mf.energy(k, y))(x)[:, :, 3, 1]
    _close(hess, _central(jax.grad(lambda y: mf.energy(k, y)), x, v), RTOL_FD)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["usa", "gauge"])
def test_grad_through_simulate_and_vmap(name, x64):
    """jax.grad of a loss of a fixed-step (rk2) simulation: diffrax's reverse mode transposes
    the tangent kernel at every step; vmapped over seeds; = XLA and = central differences."""
    k = _KERNELS[name]()
    xs = _xs(3, 12, 3, seed=6)

    def loss(x0):
        traj = mf.simulate(k, x0, t1=0.4, dt=0.05, solver="rk2", ts=[0.4])
        return jnp.sum(traj.xs[-1] * jnp.arange(36.0).reshape(12, 3) / 36.0)

    # the central difference reads the native program's own values at x0 +- H v (batch entries
    # 3 and 4): no separate forward compilation
    v = _xs(1, 12, 3, seed=7)[0]
    batch = jnp.concatenate([xs, jnp.stack([xs[0] + H * v, xs[0] - H * v])])
    (val, g), (valx, gx) = _both(jax.vmap(jax.value_and_grad(loss)), batch)
    _close(g, gx, RTOL_XLA)
    _close(val, valx, RTOL_XLA)
    _close(jnp.sum(g[0] * v), (val[3] - val[4]) / (2 * H), RTOL_FD)


def test_vmapped_parameters_gauges_and_beta_derivatives(x64):
    """A beta grid and seeds vmapped (nested), d/dbeta and d/domega (a tangent of the gauge
    matrices) of the energy, the Jacobian of the velocity in (beta, omega): native = XLA."""
    xs = _xs(2, 14, 3, seed=8)
    betas = jnp.array([0.5, 1.5, 3.0])
    f = jax.vmap(
        jax.vmap(
            lambda b, x: jax.jvp(lambda y: mf.velocity(K.USA(b), y), (x,), (x[::-1],))[1],
            in_axes=(None, 0),
        ),
        in_axes=(0, None),
    )
    _close(*_both(f, betas, xs), RTOL_XLA)
    grad = jax.grad(lambda b, w, x: mf.energy(K.RoPE(b, w), x), argnums=(0, 1, 2))
    _close(*_both(grad, 1.3, 2.0, xs[0], target="meanfield_exp_fs"), RTOL_XLA)
    jac = jax.jacfwd(
        lambda b, w, x: mf.velocity(K.PhaseField(b, K.FourierPhase(w, 0.5)), x), argnums=(0, 1, 2)
    )
    _close(*_both(jac, 1.3, 2.0, xs[0]), RTOL_XLA)


def test_second_order_reverse_and_float32(x64):
    """Reverse over reverse (the tangent's own derivative in y is the XLA formulation's) and
    the float32 kernel (agreement at float32 rounding)."""
    x = _xs(1, 16, 3, seed=9)[0]
    f = jax.grad(
        lambda y: jnp.sum(jax.grad(lambda z: jnp.sum(mf.velocity(K.USA(1.5), z) ** 2))(y) ** 2)
    )
    _close(*_both(f, x), RTOL_XLA)
    x32 = x.astype(jnp.float32)
    vj = lambda y: jax.vjp(lambda z: mf.velocity(K.RoPE(1.5, 2.0), z), y)[1](y[::-1])[0]  # noqa: E731
    _close(*_both(vj, x32), 2e-5)


def test_auto_where_xla_is_faster_derivatives_stay_xla(x64, monkeypatch):
    """Where "auto" takes XLA (the measured crossover says so), no native call in the derivative
    either; "native" there takes the kernel in both."""
    from meanfield._native import Crossover

    monkeypatch.setitem(
        _native._exp_state, "crossover", Crossover(max_d=8, min_n=2, times={}, seconds=0.0)
    )
    x = _xs(1, 10, 10, seed=10)[0]
    jv = {}
    for backend in ("auto", "native"):
        f = jax.jit(
            lambda y, b=backend: jax.jvp(
                lambda z: mf.velocity(K.USA(1.0), z, backend=b), (y,), (y[::-1],)
            )[1]
        )
        assert ("meanfield_exp" in f.lower(x).as_text()) == (backend == "native")
        jv[backend] = f(x)
    with K.use_backend("xla"):
        ref = jax.jvp(lambda z: mf.velocity(K.USA(1.0), z), (x,), (x[::-1],))[1]
    _close(jv["auto"], ref, RTOL_XLA)
    _close(jv["native"], ref, RTOL_XLA)


def test_xla_lowering_of_the_tangent_equals_the_kernel(x64):
    """``_tangent_xla`` is the tangent primitive's lowering on every platform but the CPU
    (accelerators): it equals the kernel."""
    y, dy = _xs(4, 3 * 11, 4, seed=11).reshape(2, 2, 3, 11, 4)
    beta = jnp.array([[0.5, 1.0, 2.0], [3.0, 0.7, 1.1]])
    _close(
        jax.jit(K._exp._tangent_xla)(y, dy, beta),
        jax.jit(K._exp._exp_tangent)(y, dy, beta),
        RTOL_XLA,
    )


_SHARDED = r"""
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import meanfield as mf
mesh = Mesh(np.asarray(jax.devices()), ("batch",))
x = jax.vmap(lambda k: mf.sphere.uniform(k, 40, 3))(jax.random.split(jax.random.key(0), 8))
k = mf.kernels.Prompt(1.1, mf.kernels.random_gauges(jax.random.key(2), 2, 3))
fn = jax.vmap(lambda y: (jax.jvp(lambda z: mf.velocity(k, z), (y,), (y[::-1],))[1],
                         jax.grad(lambda z: jnp.sum(mf.velocity(mf.kernels.USA(0.8), z) ** 2))(y)))
f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("batch"), out_specs=P("batch")))
with mf.kernels.use_backend("native"):
    a = f(x)
    in_shard_map = "meanfield_exp_t" in f.lower(x).as_text()
    xs = jax.device_put(x, NamedSharding(mesh, P("batch")))
    hlo = jax.jit(fn).lower(xs).compile().as_text()
    b = jax.jit(fn)(xs)
with mf.kernels.use_backend("xla"):
    c = jax.jit(fn)(x)
err = max(float(jnp.abs(u - w).max() / jnp.abs(w).max()) for u, w in zip(jax.tree.leaves((a, b)), 2 * jax.tree.leaves(c)))
print(in_shard_map, "meanfield_exp_t" in hlo, "all-gather" in hlo, err)
"""


def test_sharded_batch_and_shard_map():
    """A batch sharded over 4 CPU devices: the tangent's FFI call runs on each device's systems
    (custom_partitioning, no all-gather); under ``jax.shard_map`` too; float32 = the XLA path."""
    r = subprocess.run(
        [sys.executable, "-c", _SHARDED],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MEANFIELD_NATIVE": "1"},
    )
    assert r.returncode == 0, r.stderr
    in_shard_map, in_sharded, gathered, err = r.stdout.split()
    assert (in_shard_map, in_sharded, gathered) == ("True", "True", "False"), r.stdout
    assert float(err) < 1e-5
