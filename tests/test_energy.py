"""Energy and velocity (docs/math/particles.md): autodiff, the Lyapunov identity, closed forms,
and the self-attention models (no pair energy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf

K = mf.kernels
TWO_PI = 2.0 * np.pi


def wavy_gauge(s):
    return mf.sphere.rotation(TWO_PI * s, 3, (0, 1)) @ mf.sphere.rotation(
        0.8 * jnp.sin(2.0 * TWO_PI * s), 3, (1, 2)
    )


def make(name, beta=1.7):
    G = jnp.stack(
        [
            mf.sphere.rotation(a, 3, (0, 2)) @ mf.sphere.rotation(2 * a, 3, (0, 1))
            for a in (0.0, 1.0, 2.5)
        ]
    )
    return {
        "usa": lambda: K.USA(beta),
        "usa_rescaled": lambda: K.USA(beta, rescaled=True),
        "distance_bias": lambda: K.DistanceBias(beta, 1.5),
        "toeplitz": lambda: K.Toeplitz(),
        "toeplitz_m3": lambda: K.Toeplitz(m=3),
        "rope": lambda: K.RoPE(beta, TWO_PI),
        "rope_rescaled": lambda: K.RoPE(beta, 5.0, plane=(2, 0), rescaled=True),
        "phase_field": lambda: K.PhaseField(beta, lambda s: 4.0 * s**2, plane=(1, 2)),
        "gauge": lambda: K.Gauge(beta, wavy_gauge),
        "prompt": lambda: K.Prompt(beta, G),
    }[name]()


NAMES = [
    "usa",
    "usa_rescaled",
    "distance_bias",
    "toeplitz",
    "toeplitz_m3",
    "rope",
    "rope_rescaled",
    "phase_field",
    "gauge",
    "prompt",
]


def labels(kernel, n):
    if kernel.integer_labels:
        return jax.random.randint(jax.random.key(3), (n,), 0, kernel.num_prompts)
    return jax.random.uniform(jax.random.key(3), (n,), dtype=jnp.float64, minval=0.01, maxval=1.0)


@pytest.mark.parametrize("name", NAMES)
def test_velocity_is_n_times_projected_gradient_of_energy(name, x64):
    # grad_{x_i} E = F_i / n (h symmetric), so v_i = n P_{x_i} grad_{x_i} E.
    kernel = make(name)
    n = 9
    x = mf.sphere.uniform(jax.random.key(1), n, 3, jnp.float64)
    aux = labels(kernel, n)

    @jax.jit
    def run(x):
        grads = [
            jax.grad(lambda y, m=m: mf.energy(kernel, y, aux, method=m))(x)
            for m in ("auto", "pairwise")
        ]
        return mf.velocity(kernel, x, aux), mf.field(kernel, x, aux), grads

    v, F, grads = run(x)
    scale = float(jnp.max(jnp.abs(v)))
    for g in grads:
        np.testing.assert_allclose(v, n * mf.sphere.project(x, g), rtol=0, atol=1e-12 * scale)
    # and the unprojected field is n grad E
    np.testing.assert_allclose(F, n * grads[0], rtol=0, atol=1e-12 * scale)
    # tangent
    np.testing.assert_allclose(jnp.sum(v * x, axis=1), 0.0, atol=1e-14 * max(scale, 1.0))


@pytest.mark.parametrize("name", NAMES)
def test_lyapunov_identity_at_random_states(name, x64):
    # dE/dt along the flow = <grad E, v> = (1/n) sum_i ||P_{x_i} F_i||^2 >= 0 (docs/math/particles.md, Lyapunov identity).
    kernel = make(name)
    n = 11
    for seed in (0, 1):
        x = mf.sphere.uniform(jax.random.key(10 + seed), n, 3, jnp.float64)
        aux = labels(kernel, n)

        @jax.jit
        def run(x, aux):
            v = mf.velocity(kernel, x, aux)
            return v, jax.jvp(lambda y: mf.energy(kernel, y, aux), (x,), (v,))[1]

        v, dE = run(x, aux)
        rhs = jnp.sum(v * v) / n
        assert float(rhs) > 0.0
        np.testing.assert_allclose(dE, rhs, rtol=1e-12)


def test_lyapunov_identity_float32():
    kernel = K.DistanceBias(2.0, 0.5)
    x = mf.sphere.uniform(jax.random.key(2), 16, 4)
    v = mf.velocity(kernel, x)
    _, dE = jax.jvp(lambda y: mf.energy(kernel, y), (x,), (v,))
    np.testing.assert_allclose(dE, jnp.sum(v * v) / 16, rtol=1e-4)


@pytest.mark.parametrize("beta", [0.5, 2.0, 30.0])
def test_collapsed_energy_is_maximal(beta, x64):
    n = 7
    x = jnp.tile(mf.sphere.normalize(jnp.array([[1.0, -2.0, 0.5]])), (n, 1))
    np.testing.assert_allclose(mf.energy(K.USA(beta), x), np.exp(beta) / (2 * beta), rtol=1e-13)
    np.testing.assert_allclose(mf.energy(K.USA(beta, rescaled=True), x), 1 / (2 * beta), rtol=1e-13)
    # zero velocity at the Dirac mass
    np.testing.assert_allclose(mf.velocity(K.USA(beta), x), 0.0, atol=1e-12 * np.exp(beta))
    # distance bias at a Dirac: E = e^beta / (2 beta n^2) sum_ij exp(-lam |s_i - s_j|), s_i = i/n
    lam = 3.0
    s = np.arange(1, n + 1) / n
    closed = np.exp(beta) / (2 * beta * n**2) * np.exp(-lam * np.abs(s[:, None] - s[None, :])).sum()
    np.testing.assert_allclose(mf.energy(K.DistanceBias(beta, lam), x), closed, rtol=1e-13)


def test_energy_bounded_by_max_energy_at_random_states(x64):
    # h <= e^beta / beta for every exp-gauge kernel, so E <= e^beta / (2 beta); the max is attained
    # by the gauge-frame Dirac x_i = Psi(xi_i)^T u.
    beta, n = 1.7, 10
    for name in ("usa", "rope", "phase_field", "gauge", "prompt"):
        kernel = make(name, beta)
        aux = kernel.default_aux(n)
        for seed in range(3):
            x = mf.sphere.uniform(jax.random.key(seed), n, 3, jnp.float64)
            assert float(mf.energy(kernel, x, aux)) < float(mf.theory.max_energy(beta))
        if hasattr(kernel, "from_gauge_frame"):
            u = jnp.tile(jnp.array([[0.0, 0.6, 0.8]]), (n, 1))
            x = kernel.from_gauge_frame(u, aux)
            np.testing.assert_allclose(
                mf.energy(kernel, x, aux), mf.theory.max_energy(beta), rtol=1e-13
            )
            np.testing.assert_allclose(mf.velocity(kernel, x, aux), 0.0, atol=1e-13)


def test_toeplitz_energy_on_the_great_circle(x64):
    # x_i = cos(2 pi m s_i) a + sin(2 pi m s_i) b at s_i = i/n: E = 1/4, the maximum.
    n = 12
    s = np.asarray(mf.positions(n))
    a, b = np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.6, 0.8])
    for m in (1, 2):
        x = jnp.asarray(np.cos(TWO_PI * m * s)[:, None] * a + np.sin(TWO_PI * m * s)[:, None] * b)
        kernel = K.Toeplitz(m=m)
        np.testing.assert_allclose(mf.energy(kernel, x), 0.25, rtol=1e-13)
        np.testing.assert_allclose(mf.velocity(kernel, x), 0.0, atol=1e-14)


def test_velocity_vmaps_over_states_and_beta():
    xs = jax.vmap(lambda k: mf.sphere.uniform(k, 6, 3))(jax.random.split(jax.random.key(0), 3))
    betas = jnp.array([0.5, 1.0, 2.0])
    vs = jax.jit(jax.vmap(lambda x, b: mf.velocity(K.RoPE(b, 1.0), x)))(xs, betas)
    for i in range(3):
        np.testing.assert_allclose(
            vs[i], mf.velocity(K.RoPE(float(betas[i]), 1.0), xs[i]), atol=1e-6
        )


# --------------------------------------------------------------- self-attention


def _sa_direct(x, beta, Q, K_, V, normalized):
    x = np.asarray(x, np.float64)
    n, d = x.shape
    v = np.zeros_like(x)
    for i in range(n):
        logits = np.array([beta * (Q @ x[i]) @ (K_ @ x[j]) for j in range(n)])
        w = np.exp(logits)
        w = w / w.sum() if normalized else w / n
        F = sum(w[j] * (V @ x[j]) for j in range(n))
        v[i] = F - (F @ x[i]) * x[i]
    return v


@pytest.mark.parametrize("normalized", [True, False])
def test_self_attention_velocity_direct_formula(normalized, x64):
    n, d, beta = 7, 4, 1.4
    keys = jax.random.split(jax.random.key(4), 4)
    x = mf.sphere.uniform(keys[0], n, d, jnp.float64)
    Q, K_, V = (np.asarray(jax.random.normal(k, (d, d), jnp.float64)) / 2 for k in keys[1:])
    model = mf.models.SelfAttention(beta, Q=Q, K=K_, V=V, normalized=normalized)
    np.testing.assert_allclose(
        mf.velocity(model, x), _sa_direct(x, beta, Q, K_, V, normalized), rtol=1e-12, atol=1e-13
    )
    # identity Q, K, V by default
    eye = np.eye(d)
    np.testing.assert_allclose(
        mf.velocity(mf.models.SelfAttention(beta, normalized=normalized), x),
        _sa_direct(x, beta, eye, eye, eye, normalized),
        rtol=1e-12,
        atol=1e-13,
    )


def test_unnormalized_self_attention_with_identity_is_usa(x64):
    x = mf.sphere.uniform(jax.random.key(5), 10, 3, jnp.float64)
    for rescaled in (False, True):
        sa = mf.models.SelfAttention(2.5, normalized=False, rescaled=rescaled)
        np.testing.assert_allclose(
            mf.velocity(sa, x),
            mf.velocity(K.USA(2.5, rescaled=rescaled), x),
            rtol=1e-12,
            atol=1e-14,
        )


def test_self_attention_has_no_energy():
    sa = mf.models.SelfAttention(1.0)
    x = mf.sphere.uniform(jax.random.key(0), 5, 3)
    with pytest.raises(TypeError, match="SelfAttention"):
        mf.energy(sa, x)


def test_self_attention_overflow_guard():
    n = 64
    x = jnp.tile(jnp.array([[0.0, 0.0, 1.0]], jnp.float32), (n, 1))
    # normalised softmax never overflows
    assert bool(jnp.all(jnp.isfinite(mf.velocity(mf.models.SelfAttention(500.0), x))))
    # unnormalised: beta close to the float32 limit, n terms: finite (row max factored out)
    F = mf.field(mf.models.SelfAttention(85.0, normalized=False), x)
    assert bool(jnp.all(jnp.isfinite(F)))
    # ||Q|| ||K|| multiplies the exponent: 50 * 2 > 88.7 must raise the rescaled hint
    with pytest.raises(ValueError, match="rescaled"):
        mf.velocity(mf.models.SelfAttention(50.0, Q=2 * jnp.eye(3), normalized=False), x)
    with pytest.raises(ValueError, match="rescaled"):
        mf.velocity(mf.models.SelfAttention(500.0, normalized=False), x)
    v = mf.velocity(mf.models.SelfAttention(500.0, normalized=False, rescaled=True), x)
    assert bool(jnp.all(jnp.isfinite(v)))
