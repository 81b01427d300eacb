"""The layer-norm schemes as particle dynamics (``mf.normalization``; Karagodin, Ge, Polyanskiy,
Rigollet, arXiv 2510.22026, equation (NA) and Table 2).

Each scheme is $\\dot\\theta_i = P_{\\theta_i} A_i / s_i$ with its own radial law $\\dot r_i$; the
engine integrates $x_i = r_i \\theta_i$ for the schemes with a radius (Pre-, Mix-, Peri-LN). The
equations are checked on the engine's velocity, read off one explicit Euler step (exact to
rounding), against an attention output $A$ written out in NumPy; then the default is Post-LN bit
for bit, gradients through ``mf.simulate`` against finite differences, compile-once ``vmap``, and
the errors of bad combinations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import normalization as N

K = mf.kernels
SCHEMES = N.NORMALIZATIONS
n, d = 5, 4


def _weights(seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V: (d, d) float64 matrices of norm ~1 (a non-trivial single head)."""
    g = np.random.default_rng(seed)
    Q, Kw, V = (np.eye(d) + 0.4 * g.standard_normal((d, d)) for _ in range(3))
    return Q, Kw, V


def _attention(theta: np.ndarray, beta: float, Q: np.ndarray, Kw: np.ndarray, V: np.ndarray):
    """$A_i = \\sum_j \\operatorname{softmax}_j(\\beta \\langle Q\\theta_i, K\\theta_j\\rangle) V\\theta_j$."""
    L = beta * (theta @ Q.T) @ (theta @ Kw.T).T
    W = np.exp(L - L.max(axis=1, keepdims=True))
    W /= W.sum(axis=1, keepdims=True)
    return W @ (theta @ V.T)


def _proj(theta: np.ndarray, A: np.ndarray) -> np.ndarray:
    return A - np.sum(theta * A, axis=1, keepdims=True) * theta


def _expected_velocity(scheme, theta, r, A, t=0.0, alpha=0.2, switched=True):
    """$\\dot x = \\dot r\\,\\theta + r\\,\\dot\\theta$ from Table 2: $\\dot\\theta = P A / s$, $\\dot r$."""
    r = np.asarray(r, float)[:, None]
    PA = _proj(theta, A)
    normA = np.linalg.norm(A, axis=1, keepdims=True)
    cos = np.sum(theta * A, axis=1, keepdims=True)
    s, rdot = {
        "post": (1.0, 0.0),
        "pre": (r, cos),
        "mix": (r, cos) if switched else (1.0, 0.0),
        "peri": (r * normA, cos / normA),
        "ngpt": (normA / alpha, 0.0),
        "scaling": (np.sqrt(t + 1.0), 0.0),
    }[scheme]
    return rdot * theta + r * PA / s


def _models(scheme: str, beta=1.5, **kw):
    """SelfAttention, USA and RoPE with ``normalization=scheme``."""
    return [
        mf.models.SelfAttention(beta, normalization=scheme, **kw),
        K.USA(beta, normalization=scheme, **kw),
        K.RoPE(beta, 0.7, normalization=scheme, **kw),
    ]


def _x0(seed: int = 0, m: int = n, dim: int = d, dtype=jnp.float64) -> jax.Array:
    return mf.sphere.uniform(jax.random.key(seed), m, dim, dtype)


# --- 1. every scheme runs -------------------------------------------------------------------


FAMILIES = [
    "usa",
    pytest.param("sa", marks=pytest.mark.slow),
    pytest.param("rope", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_runs(scheme, family):
    # SelfAttention, USA and a gauge kernel (RoPE); each compilation costs seconds, so the USA
    # runs are the quick ones (the equations below run every scheme on SelfAttention)
    x0 = _x0(1, 6, 3, jnp.float32)
    radial = scheme in N.RADIAL
    r0 = jnp.array([0.5, 1.0, 2.0, 3.0, 1.5, 0.8]) if radial else None
    model = dict(zip(("sa", "usa", "rope"), _models(scheme)))[family]
    assert N.uses_radius(model) == radial
    traj = mf.simulate(model, x0, t1=0.5, dt=0.125, ts=[0.0, 0.25, 0.5], r0=r0)
    assert not bool(traj.failed)
    assert traj.xs.shape == (3, 6, 3)
    np.testing.assert_allclose(np.linalg.norm(traj.xs, axis=-1), 1.0, atol=1e-6)
    if radial:
        assert traj.radius is not None and traj.radius.shape == (3, 6)
        assert bool(jnp.all(traj.radius > 0))
        np.testing.assert_allclose(traj.radius[0], r0, rtol=1e-6)
    else:
        assert traj.radius is None
    assert float(jnp.max(jnp.abs(traj.xs[-1] - traj.xs[0]))) > 1e-3  # it moved


# --- 2. the equations of Table 2 on the engine's velocity ----------------------------------


def _euler(model, theta0, r0, *, ts, **kw):
    """A fixed-step Euler run with steps on ``ts`` (spacing 0.25, exact in binary)."""
    return mf.simulate(
        model, theta0, t1=ts[-1], dt=0.25, solver="euler", ts=ts, r0=r0, save_states=True, **kw
    )


def _radial_velocities(traj, h=0.25):
    """$\\dot x$ of each explicit Euler step of the $x = r\\theta$ state: $(x_{k+1} - x_k)/h$."""
    x = np.asarray(traj.radius)[..., None] * np.asarray(traj.xs)
    return (x[1:] - x[:-1]) / h


def _sphere_velocities(traj, h=0.25):
    """$\\dot x$ of each projected Euler step on the sphere: $x_{k+1} \\propto x_k + h v_k$ with
    $v_k \\perp x_k$, so $v_k = (x_{k+1} / \\langle x_{k+1}, x_k\\rangle - x_k) / h$."""
    x = np.asarray(traj.xs)
    c = np.sum(x[1:] * x[:-1], axis=-1, keepdims=True)
    return (x[1:] / c - x[:-1]) / h


@pytest.mark.parametrize("scheme", ["pre", "peri"])
def test_radial_schemes_velocity_is_table2(x64, scheme):
    # x' = r' theta + r theta' with theta' = P A / s: Pre-LN s = r, r' = <theta, A> (x' = A);
    # Peri-LN s = r |A|, r' = <theta, A> / |A| (x' = A / |A|); A on the directions theta.
    beta = 1.3
    Q, Kw, V = _weights()
    model = mf.models.SelfAttention(beta, Q, Kw, V, normalization=scheme)
    theta0 = _x0(2)
    r0 = np.array([0.5, 1.0, 2.0, 3.0, 1.7])
    traj = _euler(model, theta0, r0, ts=[0.0, 0.25, 0.5])
    v = _radial_velocities(traj)
    for k in range(2):
        theta, r = np.asarray(traj.xs[k]), np.asarray(traj.radius[k])
        A = _attention(theta, beta, Q, Kw, V)
        np.testing.assert_allclose(
            v[k], _expected_velocity(scheme, theta, r, A), rtol=0, atol=1e-12
        )
        # and x' = A (Pre) or A / |A| (Peri): the radius plays no part in x'
        xdot = A if scheme == "pre" else A / np.linalg.norm(A, axis=1, keepdims=True)
        np.testing.assert_allclose(v[k], xdot, rtol=0, atol=1e-12)
    assert np.max(np.abs(np.asarray(traj.radius[-1]) - r0)) > 1e-2  # the radius moved


def test_mix_velocity_is_post_then_pre(x64):
    # Mix-LN: Post-LN (r' = 0, theta' = P A) for t <= tau, Pre-LN after; the switch happens at the
    # end of the step that reaches tau = 0.5 (a save time), so the step from 0.5 on is Pre-LN.
    beta = 1.3
    Q, Kw, V = _weights()
    model = mf.models.SelfAttention(beta, Q, Kw, V, normalization="mix", switch_time=0.5)
    theta0 = _x0(2)
    r0 = np.array([0.5, 1.0, 2.0, 3.0, 1.7])
    traj = _euler(model, theta0, r0, ts=[0.0, 0.25, 0.5, 0.75, 1.0])
    v = _radial_velocities(traj)
    for k in range(4):
        theta, r = np.asarray(traj.xs[k]), np.asarray(traj.radius[k])
        A = _attention(theta, beta, Q, Kw, V)
        switched = k >= 2
        want = _expected_velocity("mix", theta, r, A, switched=switched)
        np.testing.assert_allclose(v[k], want, rtol=0, atol=1e-12)
        other = _expected_velocity("mix", theta, r, A, switched=not switched)
        assert np.max(np.abs(v[k] - other)) > 1e-3  # the two phases differ here
        # Euler's drift off the circle |x| = r before the switch: r_{k+1} = r_k sqrt(1 + h^2 |P A|^2)
        if not switched:
            grow = np.sqrt(1.0 + 0.25**2 * np.sum(_proj(theta, A) ** 2, axis=1))
            np.testing.assert_allclose(traj.radius[k + 1], r * grow, rtol=1e-13)


@pytest.mark.parametrize("scheme", ["post", "ngpt", "scaling"])
def test_sphere_schemes_velocity_is_table2(x64, scheme):
    # Post-LN theta' = P A; nGPT theta' = alpha P A / |A|; LN-scaling theta' = P A / sqrt(1 + t):
    # the step from t = 0.5 checks the time factor away from t = 0.
    beta = 1.3
    Q, Kw, V = _weights()
    kw = {"alpha": 0.7} if scheme == "ngpt" else {}
    model = mf.models.SelfAttention(beta, Q, Kw, V, normalization=scheme, **kw)
    ts = [0.0, 0.25, 0.5, 0.75]
    traj = _euler(model, _x0(2), None, ts=ts)
    assert traj.radius is None
    v = _sphere_velocities(traj)
    for k in range(3):
        theta = np.asarray(traj.xs[k])
        A = _attention(theta, beta, Q, Kw, V)
        want = _expected_velocity(scheme, theta, np.ones(n), A, t=ts[k], alpha=0.7)
        np.testing.assert_allclose(v[k], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scheme", ["pre", "peri", "mix"])
def test_radial_velocity_of_the_model_field_is_table2(x64, scheme):
    # the same equations through mf.normalization.radial_velocity and model.field (no solver)
    beta = 0.9
    Q, Kw, V = _weights(5)
    model = mf.models.SelfAttention(beta, Q, Kw, V, normalization=scheme)
    theta = np.asarray(_x0(4))
    r = np.array([0.3, 1.0, 2.5, 4.0, 1.1])
    A = _attention(theta, beta, Q, Kw, V)
    G = model.field(jnp.asarray(theta), None)
    x = jnp.asarray(r[:, None] * theta)
    for switched in (True, False) if scheme == "mix" else (True,):
        got = N.radial_velocity(scheme, x, G, switched=switched)
        want = _expected_velocity(scheme, theta, r, A, switched=switched)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def test_radial_velocity_refuses_schemes_without_radius():
    x = jnp.ones((2, 3)) / jnp.sqrt(3.0)
    for scheme in ("post", "ngpt", "scaling"):
        with pytest.raises(ValueError, match=repr(scheme)):
            N.radial_velocity(scheme, x, x)


def test_mix_radius_stays_until_the_switch_then_grows(x64):
    # rk4, small step, tau among the save times: r(t) = r0 to integrator precision on [0, tau];
    # after tau r' = <theta, A> > 0 for a clustered start with Q = K = V = I.
    tau = 0.5
    model = K.USA(1.0, normalization="mix", switch_time=tau)
    theta0 = mf.sphere.normalize(jnp.array([0.0, 0.0, 0.0, 1.0]) + 0.3 * _x0(6))
    r0 = np.array([1.0, 2.0, 0.5, 1.5, 3.0])
    ts = [0.0, 0.25, tau, 0.75, 1.0]
    # (the drift is rk4's: 9.5e-11 at dt = 1/128, 5.9e-12 at 1/256, order 4)
    traj = mf.simulate(model, theta0, t1=1.0, dt=1.0 / 256, solver="rk4", ts=ts, r0=r0)
    R = np.asarray(traj.radius)
    np.testing.assert_allclose(R[:3], np.broadcast_to(r0, (3, n)), rtol=2e-11, atol=0)
    assert np.all(np.diff(R[2:], axis=0) > 0.1)
    # the Post-LN phase moves the directions as the Post-LN model does (1.1e-12 here)
    post = mf.simulate(K.USA(1.0), theta0, t1=tau, dt=1.0 / 256, solver="rk4", ts=ts[:3])
    np.testing.assert_allclose(traj.xs[:3], post.xs, rtol=0, atol=5e-12)


@pytest.mark.slow
def test_every_solver_integrates_the_radial_state(x64):
    # Mix-LN (both phases) with each solver against rk4 at dt = 1/512: theta on the sphere, the
    # radius r0 up to tau, and the error of each solver's order (measured: euler 7e-3, rk2 8e-5,
    # rk4 5e-9, tsit5 3e-9, dopri5 6e-9 at dt = 1/64 or rtol = 1e-10)
    model = K.USA(1.0, normalization="mix", switch_time=0.5)
    x0 = _x0(0, 6, 3)
    r0 = np.array([1.0, 2.0, 0.5, 1.5, 3.0, 1.2])
    ts = [0.0, 0.25, 0.5, 0.75, 1.0]
    ref = mf.simulate(model, x0, t1=1.0, dt=1.0 / 512, solver="rk4", ts=ts, r0=r0)
    assert float(jnp.min(ref.radius[-1] / ref.radius[2])) > 1.1  # it grew after tau
    for solver, tol in (
        ("euler", 2e-2),
        ("rk2", 3e-4),
        ("rk4", 2e-8),
        ("tsit5", 2e-8),
        ("dopri5", 2e-8),
    ):
        kw = {"rtol": 1e-10, "atol": 1e-12} if solver in ("tsit5", "dopri5") else {"dt": 1.0 / 64}
        traj = mf.simulate(model, x0, t1=1.0, solver=solver, ts=ts, r0=r0, **kw)
        np.testing.assert_allclose(np.linalg.norm(traj.xs, axis=-1), 1.0, atol=1e-15)
        np.testing.assert_allclose(traj.radius, ref.radius, rtol=0, atol=tol, err_msg=solver)
        np.testing.assert_allclose(traj.xs, ref.xs, rtol=0, atol=tol, err_msg=solver)


# --- 3. Post-LN is the default, bit for bit --------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_post_given_explicitly_is_the_default_bit_for_bit(family):
    x0 = _x0(7, 8, 3, jnp.float32)
    default = {
        "sa": mf.models.SelfAttention(1.5),
        "usa": K.USA(1.5),
        "rope": K.RoPE(1.5, 0.7),
    }[family]
    post = dict(zip(("sa", "usa", "rope"), _models("post")))[family]
    assert post == default and post.normalization == mf.normalization.Post()
    a = mf.simulate(default, x0, t1=0.5, dt=0.125)
    b = mf.simulate(post, x0, t1=0.5, dt=0.125)
    for name in ("xs", "energy", "collapse_gap", "ts"):
        u, w = getattr(a, name), getattr(b, name)
        if u is not None or w is not None:
            np.testing.assert_array_equal(u, w)
    assert a.radius is None and b.radius is None


@pytest.mark.parametrize("scheme", SCHEMES)
def test_kernel_field_is_the_normalised_attention_field(scheme):
    x = _x0(8, 7, 3, jnp.float32)
    aux = mf.positions(7)
    kw = {"alpha": 0.5} if scheme == "ngpt" else {}
    for kernel in _models(scheme, 2.0, **kw)[1:] + [
        K.DistanceBias(2.0, 0.3, normalization=scheme, **kw)
    ]:
        F = kernel.attention_field(x, aux)
        G = kernel.field(x, aux)
        if scheme in ("post", "pre", "mix", "scaling"):
            np.testing.assert_array_equal(G, F)
        else:
            scale = 0.5 if scheme == "ngpt" else 1.0
            np.testing.assert_allclose(
                G, scale * F / jnp.linalg.norm(F, axis=1, keepdims=True), rtol=1e-6
            )
    # SelfAttention: the field of every scheme but peri/ngpt is Post-LN's attention output
    A = mf.models.SelfAttention(2.0).field(x, None)
    G = mf.models.SelfAttention(2.0, normalization=scheme, **kw).field(x, None)
    np.testing.assert_array_equal(G, N.output(scheme, A, kw.get("alpha", 0.2)))


# --- 4. gradients through simulate ----------------------------------------------------------


def _final(scheme: str, beta, r0, alpha=0.2):
    """Final collapse gap (+ mean radius for the schemes with one) of a short rk2 run."""
    kw = {"alpha": alpha} if scheme == "ngpt" else {}
    if scheme == "mix":
        kw["switch_time"] = 0.25  # both phases inside [0, t1]
    model = K.USA(beta, normalization=scheme, **kw)
    radial = scheme in N.RADIAL
    traj = mf.simulate(
        model, _x0(9), t1=0.5, dt=0.125, ts=[0.0, 0.25, 0.5], r0=r0 if radial else None
    )
    out = traj.collapse_gap[-1]
    if radial:
        out = out + jnp.mean(traj.radius[-1])
    return out


def _central(f, x, h=1e-6):
    return (f(x + h) - f(x - h)) / (2 * h)


def _value_and_grad(f, argnums):
    """``f`` and its gradient as one compiled program: the central differences read its value at
    the shifted arguments (the same forward computation), so no separate forward compilation."""
    vg = jax.jit(jax.value_and_grad(f, argnums=argnums))
    return vg, lambda *args: vg(*args)[0]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_grad_through_simulate_matches_finite_differences(x64, scheme):
    # d/d beta, d/d r0 (the schemes with a radius) and d/d alpha (nGPT) in one reverse pass
    beta, r0, alpha = jnp.asarray(1.4), jnp.asarray(1.3), jnp.asarray(0.3)
    vg, f = _value_and_grad(lambda b, r, a: _final(scheme, b, r, a), (0, 1, 2))
    _, (gb, gr, ga) = vg(beta, r0, alpha)
    fd_b = _central(lambda b: f(b, r0, alpha), beta)
    np.testing.assert_allclose(gb, fd_b, rtol=1e-6)
    assert abs(float(gb)) > 1e-4
    if scheme in N.RADIAL:
        fd_r = _central(lambda r: f(beta, r, alpha), r0)
        np.testing.assert_allclose(gr, fd_r, rtol=1e-6)
        assert abs(float(gr)) > 1e-2
    else:
        assert float(gr) == 0.0  # r0 unused
    if scheme == "ngpt":
        np.testing.assert_allclose(ga, _central(lambda a: f(beta, r0, a), alpha), rtol=1e-6)
        assert abs(float(ga)) > 1e-4
    else:
        assert float(ga) == 0.0  # alpha unused


@pytest.mark.slow
def test_grad_in_per_token_r0_matches_finite_differences(x64):
    # d(mean final radius)/d r0_i, Pre-LN, one reverse pass against n central differences
    model = K.USA(1.2, normalization="pre")
    x0 = _x0(10)

    vg, f = _value_and_grad(
        lambda r0: jnp.mean(mf.simulate(model, x0, t1=0.5, dt=0.125, r0=r0).radius[-1]), 0
    )
    r0 = jnp.array([0.5, 1.0, 2.0, 3.0, 1.7])
    _, g = vg(r0)
    eye = np.eye(n)
    fd = np.array([float(_central(lambda h, i=i: f(r0 + h * eye[i]), 0.0)) for i in range(n)])
    np.testing.assert_allclose(g, fd, rtol=1e-6)


# --- 5. vmap compiles once -------------------------------------------------------------------


@pytest.mark.slow
def test_vmap_over_beta_and_r0_compiles_once_and_matches_the_loop(x64):
    traces = []

    def mean_radius(theta, radius):
        traces.append(1)  # runs only while tracing
        return jnp.mean(radius)

    x0 = _x0(11)

    def one(beta, r0):
        return mf.simulate(
            K.USA(beta, normalization="peri"),
            x0,
            t1=0.5,
            dt=0.125,
            r0=r0,
            observables={"r": mean_radius},
        )

    batched = jax.vmap(one)
    a = batched(jnp.array([0.5, 2.0]), jnp.array([1.0, 3.0]))
    count = len(traces)
    assert count > 0
    b = batched(jnp.array([1.0, 4.0]), jnp.array([0.7, 2.0]))
    assert len(traces) == count  # new betas and radii: no retrace
    loop = [one(float(bt), float(r)) for bt, r in ((0.5, 1.0), (2.0, 3.0), (1.0, 0.7), (4.0, 2.0))]
    for out, k, run in ((a, 0, loop[0]), (a, 1, loop[1]), (b, 0, loop[2]), (b, 1, loop[3])):
        np.testing.assert_allclose(out.xs[k], run.xs, rtol=0, atol=1e-13)
        np.testing.assert_allclose(out.radius[k], run.radius, rtol=1e-13)
        np.testing.assert_allclose(
            out.observables["r"][k], jnp.mean(run.radius, axis=1), rtol=1e-13
        )

    # Mix-LN's switch time is traced too: a vmap over it matches the loop
    def mix(tau):
        model = K.USA(1.0, normalization="mix", switch_time=tau)
        return mf.simulate(model, x0, t1=1.0, dt=0.125, ts=[0.0, 0.25, 0.5, 0.75, 1.0], r0=2.0)

    taus = jnp.array([0.25, 0.75])
    m = jax.vmap(mix)(taus)
    for k, tau in enumerate((0.25, 0.75)):
        np.testing.assert_array_equal(m.radius[k], mix(tau).radius)
    # the radius is 2 up to tau (the step ending on tau is still Post-LN: a save time), then moves
    np.testing.assert_allclose(m.radius[0, :2], 2.0, rtol=1e-3)
    np.testing.assert_allclose(m.radius[1, :4], 2.0, rtol=1e-3)
    assert float(jnp.min(jnp.abs(m.radius[0, 2] - 2.0))) > 1e-2
    # the per-token r0 of a vmapped run: rows of r0
    rows = jnp.array([[1.0, 2.0, 3.0, 0.5, 1.5], [2.0, 2.0, 2.0, 2.0, 2.0]])
    c = jax.vmap(lambda r: one(1.0, r))(rows)
    np.testing.assert_allclose(c.radius[:, 0], rows, rtol=1e-15)
    np.testing.assert_allclose(c.radius[1], one(1.0, 2.0).radius, rtol=1e-13)


# --- 6. bad combinations: one clear error ----------------------------------------------------


def test_toeplitz_kernel_refuses_a_normalization():
    with pytest.raises(ValueError, match="'normalization' is not a parameter of model 'toeplitz'"):
        K.make("toeplitz", normalization="pre")
    with pytest.raises(ValueError, match="'alpha' is not a parameter of model 'toeplitz'"):
        K.make("toeplitz", alpha=0.3)
    with pytest.raises(TypeError, match="normalization"):
        K.Toeplitz(normalization="pre")


def test_unknown_normalization_is_named():
    with pytest.raises(ValueError, match="bogus"):
        mf.models.SelfAttention(1.0, normalization="bogus")
    with pytest.raises(ValueError, match="bogus"):
        K.USA(1.0, normalization="bogus")


@pytest.mark.parametrize(
    ("r0", "error", "match"),
    [
        (0.0, ValueError, "0.0"),
        (-1.0, ValueError, "-1.0"),
        (float("nan"), ValueError, "nan"),
        (float("inf"), ValueError, "inf"),
        (np.array([1.0, 2.0, -0.5, 1.0, 1.0]), ValueError, "-0.5"),
        (np.ones(4), ValueError, r"\(4,\)"),
        (np.ones((5, 1)), ValueError, r"\(5, 1\)"),
        ("1.0", TypeError, "'1.0'"),
        (True, TypeError, "True"),
        (np.array([1 + 1j] * 5), TypeError, "complex"),
    ],
)
def test_bad_r0_is_one_clear_error(r0, error, match):
    with pytest.raises(error, match=match):
        mf.simulate(
            K.USA(1.0, normalization="pre"), _x0(0, dtype=jnp.float32), t1=0.1, dt=0.1, r0=r0
        )


def test_r0_and_radius_observables_need_a_radial_scheme():
    x0 = _x0(0, dtype=jnp.float32)
    for scheme in ("post", "ngpt", "scaling"):
        model = K.USA(1.0, normalization=scheme)
        with pytest.raises(ValueError, match=f"r0.*{scheme}"):
            mf.simulate(model, x0, t1=0.1, dt=0.1, r0=1.0)

        def mean_radius(theta, radius):
            return jnp.mean(radius)

        with pytest.raises(TypeError, match=f"'r'.*{scheme}"):
            mf.simulate(model, x0, t1=0.1, dt=0.1, observables={"r": mean_radius})
    # an observable without a radius parameter is fine on a radial model, and one with it works
    traj = mf.simulate(
        K.USA(1.0, normalization="pre"),
        x0,
        t1=0.1,
        dt=0.1,
        r0=2.0,
        observables={"gap": mf.metrics.collapse_gap, "r": lambda theta, radius: radius},
    )
    np.testing.assert_array_equal(traj.observables["r"], traj.radius)
    assert traj.observables["gap"].shape == (2,)


@pytest.mark.parametrize("scheme", N.RADIAL)
def test_renormalize_step_is_refused_with_a_radius(scheme):
    with pytest.raises(ValueError, match=f"renormalize.*{scheme}"):
        mf.simulate(
            K.USA(1.0, normalization=scheme),
            _x0(0, dtype=jnp.float32),
            t1=0.1,
            dt=0.1,
            solver="euler",
            step="renormalize",
        )


def test_scheme_parameters_apply_only_with_their_scheme():
    for cls in (mf.models.SelfAttention, K.USA):
        with pytest.raises(ValueError, match=r"alpha = 0\.5.*'ngpt'.*'post'"):
            cls(1.0, alpha=0.5)
        with pytest.raises(ValueError, match=r"switch_time = 2\.0.*'mix'.*'pre'"):
            cls(1.0, normalization="pre", switch_time=2.0)
        cls(1.0, normalization="ngpt", alpha=0.5)
        cls(1.0, normalization="mix", switch_time=2.0)
        cls(1.0, alpha=0.2, switch_time=1.0)  # the defaults given explicitly are fine
    with pytest.raises(ValueError, match="alpha"):
        K.RoPE(1.0, 0.7, normalization="mix", alpha=0.3)


def test_traced_nonpositive_r0_stops_the_program():
    x0 = _x0(0, dtype=jnp.float32)
    run = jax.jit(lambda r: mf.simulate(K.USA(1.0, normalization="pre"), x0, t1=0.1, dt=0.1, r0=r))
    assert float(run(jnp.asarray(2.0)).radius[0, 0]) == pytest.approx(2.0)
    for bad in (-1.0, 0.0, float("nan")):
        with pytest.raises(
            (RuntimeError, ValueError), match="r0: every radius must be finite and > 0"
        ):
            jax.block_until_ready(run(jnp.asarray(bad)))
    vrun = jax.vmap(
        lambda r: mf.simulate(K.USA(1.0, normalization="pre"), x0, t1=0.1, dt=0.1, r0=r)
    )
    with pytest.raises((RuntimeError, ValueError), match="r0: every radius must be finite and > 0"):
        jax.block_until_ready(vrun(jnp.array([1.0, -2.0])))
