"""Pair kernels (docs/math/kernels.md, Kernel table): single-pair values, gradients, structured fields.

Every kernel is checked against its closed form ``h((x, s), (y, t))`` and ``grad_x h``,
and its structured evaluation (dense/tiled exponentials, gauge frame, Toeplitz rank 2)
against the single-pair reference ``method="pairwise"``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf

K = mf.kernels
TWO_PI = 2.0 * np.pi


def wavy_gauge(s):
    """Generalised RoPE gauge (docs/math/kernels.md, Generalised RoPE): R_12(2 pi s) R_23(a sin(2 pi k s))."""
    return mf.sphere.rotation(TWO_PI * s, 3, (0, 1)) @ mf.sphere.rotation(
        0.8 * jnp.sin(2.0 * TWO_PI * s), 3, (1, 2)
    )


def phase(s):
    return 3.0 * s**2 + jnp.sin(TWO_PI * s)


def prompt_gauges(dtype=np.float64):
    return np.stack(
        [
            np.asarray(
                mf.sphere.rotation(a, 3, (0, 2)) @ mf.sphere.rotation(2 * a, 3, (0, 1)), dtype
            )
            for a in (0.0, 1.0, 2.5)
        ]
    )


def zoo(beta=1.3, rescaled=False):
    """(name, kernel, reference pair formula h(x, s, y, t) in numpy)."""
    exp_kw = dict(rescaled=rescaled)
    shift = beta if rescaled else 0.0
    G = prompt_gauges()

    def R(theta, plane=(0, 1)):
        return np.asarray(mf.sphere.rotation(float(theta), 3, plane), np.float64)

    def e(dot):
        return np.exp(beta * dot - shift) / beta

    out = [
        ("usa", K.USA(beta, **exp_kw), lambda x, s, y, t: e(x @ y)),
        (
            "distance_bias",
            K.DistanceBias(beta, 0.7, **exp_kw),
            lambda x, s, y, t: np.exp(-0.7 * abs(s - t)) * e(x @ y),
        ),
        (
            "rope",
            K.RoPE(beta, TWO_PI, **exp_kw),
            lambda x, s, y, t: e(x @ R(TWO_PI * (t - s)) @ y),
        ),
        (
            "rope_plane12",
            K.RoPE(beta, 3.0, plane=(1, 2), **exp_kw),
            lambda x, s, y, t: e(x @ R(3.0 * (t - s), (1, 2)) @ y),
        ),
        (
            "phase_field",
            K.PhaseField(beta, phase, **exp_kw),
            lambda x, s, y, t: e(x @ R(float(phase(t) - phase(s))) @ y),
        ),
        (
            "gauge",
            K.Gauge(beta, wavy_gauge, **exp_kw),
            lambda x, s, y, t: e(
                (np.asarray(wavy_gauge(s), np.float64) @ x)
                @ (np.asarray(wavy_gauge(t), np.float64) @ y)
            ),
        ),
        (
            "prompt",
            K.Prompt(beta, G, **exp_kw),
            lambda x, s, y, t: e((G[s] @ x) @ (G[t] @ y)),
        ),
    ]
    if not rescaled:
        out += [
            (
                "toeplitz",
                K.Toeplitz(),
                lambda x, s, y, t: np.cos(TWO_PI * (t - s)) * (x @ y),
            ),
            (
                "toeplitz_m2",
                K.Toeplitz(m=2),
                lambda x, s, y, t: np.cos(2 * TWO_PI * (t - s)) * (x @ y),
            ),
        ]
    return out


NAMES = [name for name, _, _ in zoo()]
EXP_NAMES = [name for name, _, _ in zoo(rescaled=True)]


def get(name, **kw):
    return {nm: (k, f) for nm, k, f in zoo(**kw)}[name]


def labels(kernel, n, key=None):
    """Labels for n particles: random positions in (0, 1] or random prompt ids."""
    key = jax.random.key(7) if key is None else key
    if kernel.integer_labels:
        return jax.random.randint(key, (n,), 0, kernel.num_prompts)
    return jax.random.uniform(key, (n,), dtype=jnp.result_type(float), minval=0.01, maxval=1.0)


def state(n, d=3, seed=0, dtype=None):
    dtype = jnp.result_type(float) if dtype is None else dtype
    return mf.sphere.uniform(jax.random.key(seed), n, d, dtype)


# ------------------------------------------------------------------ pair values


@pytest.mark.parametrize("name", NAMES)
def test_pair_value_gradient_and_symmetry(name, x64):
    kernel, formula = get(name)
    x, y = np.asarray(state(2, seed=3))
    s, t = (1, 2) if kernel.integer_labels else (0.23, 0.71)
    h = float(kernel(jnp.asarray(x), s, jnp.asarray(y), t))
    np.testing.assert_allclose(h, formula(x, s, y, t), rtol=1e-13)
    # symmetric: h(z, w) = h(w, z)
    np.testing.assert_allclose(float(kernel(jnp.asarray(y), t, jnp.asarray(x), s)), h, rtol=1e-13)
    # grad_x (analytic, or autodiff) = Euclidean gradient of the formula (central differences)
    g = np.asarray(kernel.grad_x(jnp.asarray(x), s, jnp.asarray(y), t))
    g_ad = np.asarray(jax.grad(kernel.__call__)(jnp.asarray(x), s, jnp.asarray(y), t))
    np.testing.assert_allclose(g, g_ad, rtol=1e-12, atol=1e-14)
    eps = 1e-6
    fd = np.array(
        [
            (formula(x + eps * e, s, y, t) - formula(x - eps * e, s, y, t)) / (2 * eps)
            for e in np.eye(3)
        ]
    )
    np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-9)


def test_gradients_match_the_math_table(x64):
    # grad_x h from docs/math/kernels.md: exp(beta<x,y>) y ; times bias ; cos(...) y ; exp(...) R y ; Psi(xi)^T Psi(zeta) y
    beta = 1.3
    x, y = np.asarray(state(2, seed=4))
    s, t = 0.2, 0.9
    ex = np.exp(beta * x @ y)
    np.testing.assert_allclose(K.USA(beta).grad_x(x, s, y, t), ex * y, rtol=1e-13)
    np.testing.assert_allclose(
        K.DistanceBias(beta, 0.7).grad_x(x, s, y, t), np.exp(-0.7 * 0.7) * ex * y, rtol=1e-13
    )
    np.testing.assert_allclose(
        K.Toeplitz().grad_x(x, s, y, t), np.cos(TWO_PI * 0.7) * y, rtol=1e-13
    )
    Ry = np.asarray(mf.sphere.rotation(TWO_PI * (t - s), 3)) @ y
    np.testing.assert_allclose(
        K.RoPE(beta, TWO_PI).grad_x(x, s, y, t), np.exp(beta * x @ Ry) * Ry, rtol=1e-12
    )
    A, B = np.asarray(wavy_gauge(s)), np.asarray(wavy_gauge(t))
    np.testing.assert_allclose(
        K.Gauge(beta, wavy_gauge).grad_x(x, s, y, t),
        np.exp(beta * (A @ x) @ (B @ y)) * A.T @ B @ y,
        rtol=1e-12,
    )


def test_positions_and_prompt_default_labels():
    np.testing.assert_allclose(mf.positions(5), np.arange(1, 6) / 5, rtol=1e-7)
    assert mf.positions(4)[-1] == 1.0
    kernel = K.Prompt(1.0, prompt_gauges(np.float32))
    np.testing.assert_array_equal(kernel.default_aux(10), (3 * np.arange(10)) // 10)
    assert kernel.num_prompts == 3


# ------------------------------------------------------------ structured fields


def _all_paths(kernel, x, aux, block_sizes):
    """Pairwise reference and structured field/energy for each block size, in one jit."""

    def run(x, aux):
        ref = (
            mf.field(kernel, x, aux, method="pairwise"),
            mf.energy(kernel, x, aux, method="pairwise"),
        )
        structured = [
            (mf.field(kernel, x, aux, block_size=b), mf.energy(kernel, x, aux, block_size=b))
            for b in block_sizes
        ]
        return ref, structured, mf.velocity(kernel, x, aux, block_size=block_sizes[-1])

    return jax.jit(run)(x, aux)


@pytest.mark.parametrize("name", NAMES)
def test_structured_field_and_energy_equal_pairwise_float64(name, x64):
    kernel, _ = get(name)
    n = 20
    x = state(n, seed=1)
    aux = labels(kernel, n)
    # dense (None, 20, 64 >= n) and tiles of B rows x min(2B, n) columns: B = 7 divides
    # neither, 10 both, 12 gives one column tile, 1 is the smallest
    blocks = (None, 1, 10, 12, 20, 64, 7) if name in ("usa", "distance_bias") else (None, 7)
    (F_ref, E_ref), structured, v = _all_paths(kernel, x, aux, blocks)
    scale = float(jnp.max(jnp.abs(F_ref)))
    for F, E in structured:
        np.testing.assert_allclose(F, F_ref, rtol=0, atol=1e-13 * scale)
        np.testing.assert_allclose(E, E_ref, rtol=1e-13)
    np.testing.assert_allclose(v, mf.sphere.project(x, F_ref), rtol=0, atol=1e-13 * scale)
    # the eager (un-jitted) call agrees
    np.testing.assert_allclose(mf.field(kernel, x, aux), F_ref, rtol=0, atol=1e-13 * scale)


@pytest.mark.parametrize("name", ["usa", "distance_bias", "toeplitz", "rope", "prompt"])
def test_structured_field_equals_pairwise_float32(name):
    kernel, _ = get(name)
    n = 13
    x = state(n, seed=2, dtype=jnp.float32)
    aux = labels(kernel, n)
    (F_ref, E_ref), structured, _ = _all_paths(kernel, x, aux, (None, 5))
    for F, E in structured:
        assert F.dtype == jnp.float32
        np.testing.assert_allclose(F, F_ref, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(F_ref))))
        np.testing.assert_allclose(E, E_ref, rtol=1e-5)


def test_default_aux_is_positions(x64):
    kernel = K.DistanceBias(1.0, 2.0)
    x = state(9)
    np.testing.assert_array_equal(mf.field(kernel, x), mf.field(kernel, x, mf.positions(9)))
    np.testing.assert_array_equal(mf.energy(kernel, x), mf.energy(kernel, x, mf.positions(9)))


def test_usa_ignores_labels(x64):
    x = state(6)
    a = mf.field(K.USA(2.0), x, jnp.zeros(6))
    np.testing.assert_array_equal(a, mf.field(K.USA(2.0), x))


def test_field_vmaps_over_beta():
    x = state(8, dtype=jnp.float32)
    betas = jnp.array([0.5, 1.0, 3.0])
    Fs = jax.jit(jax.vmap(lambda b: mf.field(K.DistanceBias(b, 1.0), x)))(betas)
    for b, F in zip(betas, Fs):
        np.testing.assert_allclose(F, mf.field(K.DistanceBias(float(b), 1.0), x), rtol=1e-6)


# ------------------------------------------------------------------ gauge frame


@pytest.mark.parametrize("name", ["rope", "rope_plane12", "phase_field", "gauge", "prompt"])
def test_gauge_frame_roundtrip_and_usa_equivalence(name, x64):
    kernel, _ = get(name)
    n = 11
    x = state(n, seed=5)
    aux = labels(kernel, n)
    y = kernel.to_gauge_frame(x, aux)
    np.testing.assert_allclose(kernel.from_gauge_frame(y, aux), x, atol=1e-15)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-15)
    # energy is USA's in the gauge frame; field is Psi_i^T F^USA(y)_i (docs/math/kernels.md, Gauge equivalence)
    usa = K.USA(kernel.beta)
    np.testing.assert_allclose(
        mf.energy(kernel, x, aux, method="pairwise"), mf.energy(usa, y), rtol=1e-13
    )
    F = mf.field(kernel, x, aux, method="pairwise")
    np.testing.assert_allclose(kernel.to_gauge_frame(F, aux), mf.field(usa, y), rtol=1e-12)


def test_rope_gauge_is_rotation_by_omega_s(x64):
    kernel = K.RoPE(1.0, 2.5, plane=(0, 2))
    x = state(4, seed=6)
    s = mf.positions(4)
    y = kernel.to_gauge_frame(x, s)
    for i in range(4):
        R = mf.sphere.rotation(2.5 * s[i], 3, (0, 2))
        np.testing.assert_allclose(y[i], R @ x[i], atol=1e-15)


# ------------------------------------------------------------ rescaled kernels


@pytest.mark.parametrize("name", EXP_NAMES)
def test_rescaled_is_exp_minus_beta_times_unscaled_float64(name, x64):
    # beta = 500 is fine in float64 (limit ~709): the rescaled kernel is exactly e^{-beta} h.
    beta = 500.0
    kernel, _ = get(name, beta=beta)
    kernel_r, formula_r = get(name, beta=beta, rescaled=True)
    n = 10
    x = state(n, seed=8)
    aux = labels(kernel, n)
    c = np.exp(-beta)
    F, Fr = mf.field(kernel, x, aux), mf.field(kernel_r, x, aux)
    np.testing.assert_allclose(Fr, c * F, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(Fr))))
    np.testing.assert_allclose(
        mf.energy(kernel_r, x, aux), c * mf.energy(kernel, x, aux), rtol=1e-12
    )
    # and the pair value is exp(beta (<.,.> - 1)) / beta times the bias
    xa, xb = np.asarray(x[:2])
    sa, sb = np.asarray(aux[:2]).tolist()
    # (XLA on the CPU flushes subnormal results to 0: below the smallest normal float64 the
    # pair value may be 0; for these particles exp(500 (<x_0, x_1> - 1)) / 500 ~ 1e-308)
    tiny = np.finfo(np.float64).tiny
    np.testing.assert_allclose(
        kernel_r(x[0], sa, x[1], sb), formula_r(xa, sa, xb, sb), rtol=1e-12, atol=tiny
    )


@pytest.mark.parametrize("name", EXP_NAMES)
def test_rescaled_float32_small_beta_and_beta_500(name):
    kernel, _ = get(name, beta=3.0)
    kernel_r, _ = get(name, beta=3.0, rescaled=True)
    n = 12
    x = state(n, seed=9, dtype=jnp.float32)
    aux = labels(kernel, n)
    np.testing.assert_allclose(
        mf.field(kernel_r, x, aux), np.exp(-3.0) * mf.field(kernel, x, aux), rtol=2e-5, atol=1e-7
    )
    # beta = 500 in float32 only works rescaled: finite, bounded by 1 per pair, energy <= 1/(2 beta)
    big, _ = get(name, beta=500.0, rescaled=True)
    F = mf.field(big, x, aux)
    assert bool(jnp.all(jnp.isfinite(F)))
    assert float(jnp.max(jnp.linalg.norm(F, axis=1))) <= 1.0 + 1e-6
    E = float(mf.energy(big, x, aux))
    assert 0.0 < E <= float(mf.theory.max_energy(500.0, rescaled=True)) * (1 + 1e-6)
    # a collapsed configuration reaches exactly 1/(2 beta) (every exp-gauge kernel: in its frame)
    if name != "distance_bias":
        u = jnp.tile(jnp.array([[0.6, 0.0, 0.8]], jnp.float32), (n, 1))
        xc = big.from_gauge_frame(u, aux) if hasattr(big, "from_gauge_frame") else u
        # rounding of the gauge rotations (~1e-7) is amplified by beta in the exponent
        np.testing.assert_allclose(mf.energy(big, xc, aux), 1.0 / 1000.0, rtol=500 * 4e-7)


@pytest.mark.parametrize("name", EXP_NAMES)
def test_unscaled_overflow_raises_valueerror_mentioning_rescaled(name):
    kernel, _ = get(name, beta=500.0)
    n = 6
    x = state(n, dtype=jnp.float32)
    aux = labels(kernel, n)
    for fn in (mf.field, mf.velocity, mf.energy):
        with pytest.raises(ValueError, match="rescaled"):
            fn(kernel, x, aux)
    with pytest.raises(ValueError, match="rescaled"):
        mf.simulate(kernel, x, aux, t1=1.0)


@pytest.mark.parametrize(("beta", "n"), [(85.0, 256), (88.0, 4)])
def test_overflow_guard_accounts_for_n(beta, n):
    # beta below log(float32 max) ~ 88.7 but n e^beta (field) or n^2 e^beta (energy) above it:
    # either raise the rescaled hint or return finite numbers; never silent inf/NaN.
    x = jnp.tile(jnp.array([[0.0, 0.0, 1.0]], jnp.float32), (n, 1))
    kernel = K.USA(beta)
    for fn in (mf.velocity, mf.energy):
        try:
            out = fn(kernel, x)
        except ValueError as err:
            assert "rescaled" in str(err)
        else:
            assert bool(jnp.all(jnp.isfinite(out))), f"{fn.__name__} returned {out}"


def test_time_change_helpers():
    s = mf.kernels.rescaled_time(0.3, 4.0)
    np.testing.assert_allclose(s, 0.3 * np.exp(4.0), rtol=1e-6)
    np.testing.assert_allclose(mf.kernels.original_time(s, 4.0), 0.3, rtol=1e-6)


def test_automatic_tiling_above_the_dense_limit():
    # n^2 > DENSE_LIMIT switches to tiles of DEFAULT_BLOCK rows (which do not divide n here)
    n = int(np.sqrt(K.DENSE_LIMIT)) + 37
    assert n * n > K.DENSE_LIMIT and n % K.DEFAULT_BLOCK != 0 and n % (2 * K.DEFAULT_BLOCK) != 0
    x = mf.sphere.uniform(jax.random.key(0), n, 3)
    for kernel in (K.USA(1.0), K.DistanceBias(1.0, 2.0)):
        auto = jax.jit(lambda x, k=kernel: (mf.field(k, x), mf.energy(k, x)))(x)
        dense = jax.jit(
            lambda x, k=kernel: (mf.field(k, x, block_size=n), mf.energy(k, x, block_size=n))
        )(x)
        np.testing.assert_allclose(auto[0], dense[0], rtol=0, atol=1e-6)
        np.testing.assert_allclose(auto[1], dense[1], rtol=1e-6)
