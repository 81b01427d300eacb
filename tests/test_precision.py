"""The engine's matrix products state their precision (meanfield/_precision.py).

JAX's default float32 matmul precision is TF32 on NVIDIA GPUs (bfloat16 passes on TPUs): every
``dot_general`` that meanfield traces must state ``Precision.HIGHEST`` instead of inheriting it,
so that a GPU gives the CPU's float32 numbers, except inside ``mf.matmul_precision(...)``, where
they take the precision chosen there. Checked on the jaxprs of the entry points, sub-jaxprs
(jit, scan, while, cond, custom_jvp/vjp) included, with ``backend="xla"`` where the API has it:
the XLA formulation is what accelerators run (the fused CPU kernel is a custom call, no
``dot_general``).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jcore

import meanfield as mf
from meanfield import _precision
from meanfield import phase_diagram as pd

HIGHEST = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
DEFAULT = (lax.Precision.DEFAULT, lax.Precision.DEFAULT)


def _sub_jaxprs(value):
    if isinstance(value, jcore.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jcore.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _sub_jaxprs(v)


def _dot_precisions(jaxpr, out=None):
    """The ``precision`` of every ``dot_general`` of ``jaxpr`` and of its sub-jaxprs."""
    out = [] if out is None else out
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, jcore.ClosedJaxpr) else jaxpr
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                _dot_precisions(sub, out)
    return out


def _precisions(f, *args):
    found = _dot_precisions(jax.make_jaxpr(f)(*args))
    assert found, "no dot_general traced: the check would be empty"
    return found


N, D = 12, 3


@functools.cache
def _setup():
    x = mf.sphere.uniform(jax.random.key(0), N, D)
    Q, K, V = mf.models.random_weights(jax.random.key(1), D, heads=2)
    gauges = jnp.linalg.qr(jax.random.normal(jax.random.key(2), (3, D, D)))[0]
    return x, (Q, K, V), gauges


def _cases():
    _, (Q, K, V), gauges = _setup()
    usa = mf.kernels.USA(1.0)
    rope = mf.kernels.RoPE(1.0, 2 * jnp.pi)
    gauge = mf.kernels.Gauge(1.0, mf.kernels.WavyGauge())
    prompt = mf.kernels.Prompt(1.0, gauges)
    labels = jnp.arange(N) % 3
    sa_heads = mf.models.SelfAttention(1.0, Q, K, V)
    sa_random = mf.models.SelfAttention(1.0, heads=2, weights="gaussian")
    sa_sinkhorn = mf.models.SelfAttention(1.0, Q, K, V, attention="sinkhorn", sinkhorn_iters=5)

    def energy_grad(kernel, aux=None):
        return jax.grad(lambda x: mf.energy(kernel, x, aux, backend="xla"))

    return {
        "velocity-usa": lambda x: mf.velocity(usa, x, backend="xla"),
        "velocity-usa-tiled": lambda x: mf.velocity(usa, x, backend="xla", block_size=4),
        "energy-usa": lambda x: mf.energy(usa, x, backend="xla"),
        "grad-energy-usa": energy_grad(usa),
        "velocity-rope": lambda x: mf.velocity(rope, x, backend="xla"),
        "grad-energy-rope": energy_grad(rope),
        "velocity-gauge": lambda x: mf.velocity(gauge, x, backend="xla"),
        "velocity-prompt": lambda x: mf.velocity(prompt, x, labels, backend="xla"),
        "grad-energy-prompt": energy_grad(prompt, labels),
        "velocity-toeplitz": lambda x: mf.velocity(mf.kernels.Toeplitz(1.0), x),
        "velocity-pairwise-rope": lambda x: mf.velocity(rope, x, method="pairwise"),
        "simulate-usa": lambda x: mf.simulate(usa, x, t1=0.02, dt=0.01, backend="xla").xs,
        "simulate-sa-heads": lambda x: mf.simulate(sa_heads, x, t1=0.02, dt=0.01).xs,
        "field-sa": lambda x: mf.field(mf.models.SelfAttention(1.0), x),
        "field-sa-heads": lambda x: mf.field(sa_heads, x),
        "field-sa-random-weights": lambda x: mf.field(sa_random, x),
        "field-sa-sinkhorn": lambda x: mf.field(sa_sinkhorn, x),
        "random-batch-rope": lambda x: mf.random_batch.random_batch_field(
            rope, x, key=jax.random.key(3), p=4
        ),
        "anchored-rope": lambda x: mf.velocity(mf.design.Anchored(rope, x[0]), x, backend="xla"),
        "attention-displacement": lambda x: mf.attention.displacement(x[0], x, 2.0, V=Q[0]),
        "euler-step": lambda x: pd.euler_step(x, 1.0, 0.1),
    }


CASES = sorted(_cases())


@pytest.mark.parametrize("name", CASES)
def test_engine_products_state_highest(name):
    x = _setup()[0]
    found = _precisions(_cases()[name], x)
    assert all(p == HIGHEST for p in found), found


def _sweep_args(S=3, n=8):
    x0 = jnp.stack([mf.sphere.uniform(jax.random.key(i), n, D) for i in range(S)])
    slots, pos = pd._checkpoint_slots(np.arange(4), 4)
    return x0, (
        jnp.float32(1.0),  # beta
        jnp.float32(0.1),  # step
        jnp.int32(3),  # steps
        jnp.asarray(slots, jnp.int32),
        jnp.asarray(pos, jnp.int32),
        jnp.float32(0.99),  # threshold
    )


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("normalized", [True, False])
def test_phase_diagram_sweep_kernel_states_highest(normalized, packed):
    """The XLA sweep kernel of ``sa_phase_diagram`` / ``usa_phase_diagram`` (``_run_one_beta``)."""
    x0, args = _sweep_args()
    run = functools.partial(pd._run_one_beta, normalized=normalized, packed=packed, every_step=True)
    found = _precisions(lambda x0: run(x0, *args), x0)
    assert all(p == HIGHEST for p in found), found


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn"])
def test_phase_diagram_attention_kernel_states_highest(attention):
    """The engine's step in ``sa_phase_diagram`` with heads and weights (``_run_one_beta_engine``)."""
    x0, args = _sweep_args()
    S = x0.shape[0]
    qkv = tuple(jnp.broadcast_to(M, (S, *M.shape)) for M in _setup()[1])
    # sinkhorn: 5 iterations (the default, 21, is refused at these shapes otherwise)
    iters = 5 if attention == "sinkhorn" else None
    model = mf.models.SelfAttention(1.0, attention=attention, sinkhorn_iters=iters)

    def run(x0, qkv):
        return pd._run_one_beta_engine(
            x0, pd._Systems(model, *qkv), *args, every_step=True, rule=mf.steps.Projected()
        )

    found = _precisions(run, x0, qkv)
    assert all(p == HIGHEST for p in found), found


@pytest.mark.parametrize("d", [2, 3])
def test_continuum_solver_states_highest(d):
    """The mean-field solver, ``s2fft``'s transforms on S^2 included (``_precision.third_party``)."""
    g = mf.continuum.grid(d, 16 if d == 2 else 6)
    rho = mf.continuum.mode_perturbation(g, 2, 0.05)
    found = _precisions(lambda r: mf.continuum.solve(2.0, r, d=d, t1=0.1, dt=0.05).densities, rho)
    assert all(p == HIGHEST for p in found), found
    if d == 3:  # JAX's spherical harmonics (Legendre recurrences) too
        x = _setup()[0]
        found = _precisions(lambda x: mf.continuum.project_particles(x, g), x)
        assert all(p == HIGHEST for p in found), found


@pytest.mark.parametrize(
    "name", ["velocity-usa", "grad-energy-rope", "field-sa-heads", "field-sa-sinkhorn"]
)
def test_matmul_precision_default_inherits(name):
    """Inside ``mf.matmul_precision("default")`` the products take the chosen precision (none of
    their own); on the CPU the numbers stay those of full precision."""
    x = _setup()[0]
    f = jax.jit(_cases()[name])
    ref = f(x)  # compiled outside: HIGHEST
    with mf.matmul_precision("default"):
        found = _precisions(_cases()[name], x)
        got = f(x)  # the same jitted function: traced again for the chosen precision
    assert all(p == DEFAULT for p in found), found
    tol = 1e-6 if jax.default_backend() == "cpu" else 1e-2
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_context_is_in_the_cache_key_and_scoped():
    # JAX's config context leaves its thread-local state set (to the global value) after the first
    # block of a process, which is another jit cache key than the state before any block: enter
    # one block first, so that the traces below compare like with like whatever ran before
    with mf.matmul_precision("high"):
        pass
    traces = []

    @jax.jit
    def f(a):
        traces.append(_precision.current())
        return _precision.matmul(a, a.T)

    a = jnp.ones((3, 4))
    f(a)
    with mf.matmul_precision("high"):
        assert _precision.current() is None
        f(a)
        with mf.matmul_precision("highest"):  # nested: the innermost choice
            assert _dot_precisions(jax.make_jaxpr(f)(a)) == [HIGHEST]
    f(a)  # after the block: the first program again, no new trace
    assert traces == [lax.Precision.HIGHEST, None, None]
    assert _precision.current() == lax.Precision.HIGHEST
    with mf.matmul_precision("high"):
        assert _dot_precisions(jax.make_jaxpr(f)(a)) == [(lax.Precision.HIGH, lax.Precision.HIGH)]


def test_jax_config_alone_does_not_lower_the_engine_precision():
    """JAX's own ``default_matmul_precision`` leaves meanfield's products at HIGHEST (the choice
    is ``mf.matmul_precision``'s); a program traced under it is not reused under
    ``mf.matmul_precision`` with the same value (both scopes are in the cache key)."""
    x = _setup()[0]
    f = jax.jit(lambda x: _precision.matmul(x, x.T))
    with jax.default_matmul_precision("default"):
        assert _precisions(f, x) == [HIGHEST]
        f(x)
        with mf.matmul_precision("default"):
            assert _precisions(f, x) == [DEFAULT]


def test_helpers_keep_the_operators_semantics():
    a = np.arange(6.0).reshape(2, 3)
    b = np.arange(3.0)
    out = _precision.matmul(a, b)  # NumPy operands: NumPy's product, as `a @ b`
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_array_equal(out, a @ b)
    ja = jnp.asarray(a, jnp.float32)
    np.testing.assert_array_equal(_precision.matmul(ja, b), ja @ b)
    np.testing.assert_array_equal(_precision.dot(b, b), jnp.dot(b, b))
    np.testing.assert_array_equal(_precision.einsum("ij,j->i", ja, b), jnp.einsum("ij,j->i", ja, b))


@pytest.mark.parametrize("bad", ["tf32", "HIGHEST", "float32", "", None, lax.Precision.HIGHEST, 3])
def test_bad_precision_is_a_value_error(bad):
    with pytest.raises(ValueError, match=r"'default', 'high', 'highest'") as info:
        mf.matmul_precision(bad)
    assert repr(bad) in str(info.value)
    assert _precision.current() == lax.Precision.HIGHEST


def test_public_name():
    assert "matmul_precision" in mf.__all__
    assert mf.matmul_precision is _precision.matmul_precision
    assert mf.matmul_precision.__module__ == "meanfield"
    assert _precision.PRECISIONS == ("default", "high", "highest")
