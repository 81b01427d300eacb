"""Issue 49, item 1: noise as part of a run (``mf.simulate(noise=, key=)``, ``mf.noise``).

Checks against closed forms (docs/math/noise.md): a free token under either noise is Brownian
motion on the sphere, $E \\langle x(t), x(0)\\rangle = e^{-(d - 1)\\sigma^2 t / 2}$ and
$E P_2(\\langle x(t), x(0)\\rangle) = e^{-d \\sigma^2 t}$ (Monte Carlo error stated); the
projected Stratonovich Heun step's strong order, fitted on one Brownian path per key; the same
key gives the same path; ``sigma`` is traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield.noise import Common, Independent


def _free(d: int) -> mf.models.SelfAttention:
    """A model with no field (V = 0): the tokens move by the noise alone."""
    return mf.models.SelfAttention(1.0, V=jnp.zeros((d, d)))


@pytest.mark.parametrize("kind", [Independent, Common])
@pytest.mark.parametrize("d", [2, 3])
def test_a_free_token_is_brownian_motion_on_the_sphere(kind, d, x64):
    r"""Generator $\frac{\sigma^2}{2}\Delta_{S^{d-1}}$ for both noises (docs/math/noise.md: the
    common noise's Ito correction is the independent one's): the zonal harmonics of degree 1 and 2
    decay at $\frac{\sigma^2}{2} \ell (\ell + d - 2)$. Mean over n tokens and seeds, tolerance
    4 standard errors (from the second moment's closed form) plus the Heun step's weak error
    bound (measured below 1e-3 at dt = 0.02; 5e-3 allowed)."""
    sigma, t1, n, seeds = 0.8, 0.6, 256, 8
    keys = jax.random.split(jax.random.key(7), seeds)
    x0 = mf.sphere.uniform(jax.random.key(1), n, d, jnp.float64)

    def run(key):
        traj = mf.simulate(_free(d), x0, t1=t1, dt=0.02, noise=kind(sigma), key=key, ts=[0.0, t1])
        return jnp.sum(traj.xs[-1] * x0, axis=-1)

    c = np.asarray(jax.vmap(run)(keys)).ravel()  # cos of the angle travelled
    if kind is Common:  # one path per seed moves every token: the seeds are the samples
        samples = np.asarray(jax.vmap(run)(keys)).mean(axis=1)
        count = seeds
    else:
        samples, count = c, c.size
    m1 = np.exp(-(d - 1) * sigma**2 * t1 / 2)
    p2 = np.exp(-d * sigma**2 * t1)  # E of the degree-2 zonal harmonic (d c^2 - 1) / (d - 1)
    m2 = ((d - 1) * p2 + 1) / d  # E c^2
    se = np.sqrt((m2 - m1**2) / count) if kind is Independent else np.std(samples) / np.sqrt(count)
    assert abs(samples.mean() - m1) <= 4 * se + 5e-3, (samples.mean(), m1, se)
    if kind is Independent:
        p2_measured = np.mean((d * c**2 - 1) / (d - 1))
        assert (
            abs(p2_measured - p2) <= 4 * np.std((d * c**2 - 1) / (d - 1)) / np.sqrt(c.size) + 5e-3
        )


@pytest.mark.parametrize("kind", [Independent, Common])
def test_strong_order_one_half_fitted_on_one_path(kind, x64):
    """The projected Stratonovich Heun step (``solver="rk2"``) converges with strong order 1/2
    (non-commuting noise fields on the sphere): the runs of one key with dt = t1 / 2^j read one
    Brownian path (``_noise_tol``), fitted against dt = t1 / 128 of the same path (16 keys:
    measured slopes 0.50-0.52 with 64 keys and dt down to t1 / 128 against t1 / 1024)."""
    x0 = mf.sphere.uniform(jax.random.key(0), 6, 3, jnp.float64)
    model, t1 = mf.kernels.USA(1.0), 1.0
    keys = jax.random.split(jax.random.key(5), 16)

    def run(dt):  # every key at one step, the step traced: one program for every dt
        return jax.vmap(
            lambda k: mf.simulate(
                model, x0, t1=t1, dt=dt, noise=kind(0.7), key=k, ts=[0.0, t1], max_steps=130
            ).xs[-1]
        )(keys)

    dts = jnp.asarray([t1 / 4, t1 / 8, t1 / 16, t1 / 32, t1 / 128])
    xs = jax.jit(jax.vmap(run))(dts)
    ref = xs[-1]
    errs = [float(jnp.sqrt(jnp.mean(jnp.sum((x - ref) ** 2, axis=-1)))) for x in xs[:-1]]
    dts = np.asarray(dts[:-1])
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    assert 0.35 <= slope <= 0.75, (errs, slope)
    assert errs[-1] < errs[0]


def test_same_key_same_path_and_vmap_over_keys(x64):
    x0 = mf.sphere.uniform(jax.random.key(0), 12, 3, jnp.float64)
    model = mf.models.SelfAttention(2.0)

    def run(key, sigma=0.5):
        return mf.simulate(model, x0, t1=0.5, dt=0.05, noise=Common(sigma), key=key).xs[-1]

    keys = jax.random.split(jax.random.key(3), 3)
    a, b = run(keys[0]), run(keys[0])
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit for bit
    assert np.abs(np.asarray(run(keys[1]) - a)).max() > 1e-3  # another key, another path
    batched = jax.vmap(run)(keys)
    for i in range(3):
        np.testing.assert_allclose(batched[i], run(keys[i]), rtol=0, atol=1e-13)
    # sigma = 0 is the deterministic flow
    det = mf.simulate(model, x0, t1=0.5, dt=0.05, solver="rk2").xs[-1]
    np.testing.assert_array_equal(np.asarray(run(keys[0], 0.0)), np.asarray(det))


def test_sigma_is_traced_vmap_and_grad(x64):
    x0 = mf.sphere.uniform(jax.random.key(0), 10, 3, jnp.float64)
    model, key = mf.kernels.USA(1.0), jax.random.key(4)

    def gap(sigma):
        traj = mf.simulate(model, x0, t1=0.4, dt=0.05, noise=Independent(sigma), key=key)
        return traj.collapse_gap[-1]

    batched = jax.vmap(gap)(jnp.array([0.0, 0.3]))
    np.testing.assert_allclose(batched[1], gap(0.3), rtol=1e-10)
    assert abs(float(batched[1] - batched[0])) > 1e-4  # sigma changes the run
    g = jax.grad(gap)(0.3)
    fd = (gap(0.3 + 1e-6) - gap(0.3 - 1e-6)) / 2e-6  # the same path: a smooth function of sigma
    np.testing.assert_allclose(g, fd, rtol=1e-5)
    assert abs(float(g)) > 1e-6


def test_euclidean_tokens_take_the_unprojected_noise(x64):
    # in R^d a free token's noise is sigma W: E |x(t) - x(0)|^2 = d sigma^2 t (Independent)
    d, n, sigma, t1 = 3, 512, 0.5, 0.4
    x0 = jax.random.normal(jax.random.key(0), (n, d), jnp.float64)
    model = mf.models.SelfAttention(1.0, V=jnp.zeros((d, d)), geometry="euclidean")
    traj = mf.simulate(model, x0, t1=t1, dt=0.1, noise=Independent(sigma), key=jax.random.key(1))
    sq = np.sum(np.asarray(traj.xs[-1] - x0) ** 2, axis=-1)
    se = np.std(sq) / np.sqrt(n)
    assert abs(sq.mean() - d * sigma**2 * t1) <= 4 * se


def test_refusals_are_the_noises():
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    model, key = mf.models.SelfAttention(1.0), jax.random.key(0)
    with pytest.raises(ValueError, match="needs solver='rk2'.*not solver='euler'"):
        mf.simulate(model, x0, t1=1.0, solver="euler", noise=Independent(0.1), key=key)
    with pytest.raises(ValueError, match="normalization='pre' carries a radius"):
        mf.simulate(
            mf.models.SelfAttention(1.0, normalization="pre"),
            x0,
            t1=1.0,
            noise=Independent(0.1),
            key=key,
        )
    with pytest.raises(TypeError, match="needs key="):
        mf.simulate(model, x0, t1=1.0, noise=Independent(0.1))
    with pytest.raises(TypeError, match="give noise= too"):
        mf.simulate(model, x0, t1=1.0, key=key)
    with pytest.raises(ValueError, match="early_stop=0.001 stops a run whose energy is stationary"):
        mf.simulate(mf.kernels.USA(1.0), x0, t1=1.0, noise=Common(0.1), key=key, early_stop=1e-3)
    with pytest.raises(TypeError, match="meanfield.noise.Noise"):
        mf.simulate(model, x0, t1=1.0, noise="independent", key=key)
    with pytest.raises(ValueError, match="sigma must be >= 0"):
        Independent(-1.0)
    with pytest.raises(ValueError, match="noise must be one of 'independent', 'common'"):
        mf.noise.Noise.coerce("brownian", sigma=0.1)


def test_the_command_line_runs_the_same_noisy_run(tmp_path, capsys):
    """``meanfield simulate --noise common --sigma S``: the run of ``mf.simulate`` with the key
    ``fold_in(key(seed), 1)``, recorded in summary.json and the run's store; a noise with another
    solver is one line on stderr, exit 2."""
    from meanfield import cli, sweep

    out = tmp_path / "run"
    argv = ["simulate", "--n", "16", "--t1", "0.5", "--dt", "0.05", "--saves", "3", "--seed", "2"]
    status = cli.main(
        argv + ["--noise", "common", "--sigma", "0.4", "--no-plots", "--out", str(out)]
    )
    assert status == 0
    ds = sweep.load(out)
    assert ds.attrs["noise"] == "common" and ds.attrs["sigma"] == 0.4
    x0 = mf.sphere.uniform(jax.random.key(2), 16, 3)
    key = jax.random.fold_in(jax.random.key(2), 1)
    traj = mf.simulate(
        mf.kernels.USA(1.0),
        x0,
        t1=0.5,
        dt=0.05,
        ts=np.linspace(0, 0.5, 3),
        noise=Common(0.4),
        key=key,
    )
    np.testing.assert_allclose(ds["x"].values[-1], np.asarray(traj.xs[-1]), rtol=0, atol=1e-5)
    capsys.readouterr()
    status = cli.main(argv + ["--noise", "independent", "--sigma", "0.4", "--solver", "rk4",
                              "--no-plots", "--out", str(tmp_path / "bad")])  # fmt: skip
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 2 and len(err) == 1, err
    assert err[0].endswith(
        "--noise independent needs --solver rk2 or --solver heun (the Stratonovich Heun step, "
        "fixed or adaptive), not --solver rk4"
    )
    # the energy-plateau stop: one rule (meanfield._spelling.early_stop_problem), each surface's spelling
    status = cli.main(argv + ["--noise", "common", "--sigma", "0.4", "--solver", "rk2",
                              "--early-stop", "1e-6", "--out", str(tmp_path / "bad")])  # fmt: skip
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 2 and len(err) == 1, err
    assert err[0].endswith(
        "--early-stop 1e-06 stops a run whose energy is stationary (the flow increases it): "
        "not with --noise common"
    )
    # half of the pair: one rule (meanfield._spelling.pair_problem), as a spec's and a diagram's
    for flags, text in (
        (["--noise", "common"], "--noise common needs --sigma, the noise's amplitude (a number >= 0)"),
        (["--sigma", "0.1"], "--sigma 0.1 is the amplitude of a noise: it applies with --noise "
                             "independent or --noise common"),
    ):  # fmt: skip
        assert cli.main(argv + flags + ["--out", str(tmp_path / "bad")]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].endswith(text), err


def test_the_tree_resolves_every_step_saves_off_the_grid_included():
    """``_noise_tol``: at most a quarter of the shortest step; a save time off the step grid cuts a
    step short (t1 = 1, dt = 0.1, a save at 0.105: a step of 0.005), and two step points never
    share the tree's finest interval; the same rule for a traced dt."""
    from meanfield.integrate import _noise_tol

    on = float(_noise_tol(1.0, 0.1, np.linspace(0, 1, 11), jnp.float32))
    assert on == 2.0**-6  # 1/64 <= 0.1 / 4, dyadic
    off = float(_noise_tol(1.0, 0.1, np.array([0.0, 0.105, 1.0]), jnp.float32))
    assert off <= 0.005 / 4 and np.log2(off) == int(np.log2(off))
    traced = jax.jit(lambda dt: _noise_tol(1.0, dt, np.array([0.0, 0.105, 1.0]), jnp.float32))
    assert float(traced(0.1)) == off


def test_bad_keys_and_integer_sigmas():
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    model = mf.kernels.USA(1.0)
    with pytest.raises(TypeError, match="one jax.random key"):
        mf.simulate(
            model, x0, t1=0.2, dt=0.1, noise=Common(0.1), key=jax.random.split(jax.random.key(0), 3)
        )
    # an integer sigma is traced like a float: the same program, the same numbers as 1.0
    a = mf.simulate(model, x0, t1=0.2, dt=0.1, noise=Independent(1), key=jax.random.key(1))
    b = mf.simulate(model, x0, t1=0.2, dt=0.1, noise=Independent(1.0), key=jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(a.xs), np.asarray(b.xs))


def test_a_traced_negative_sigma_is_an_error_in_the_program():
    """A concrete sigma < 0 is refused by the constructor; a traced one by the program (an error
    naming sigma; under EQX_ON_ERROR=nan a failed run)."""
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)

    def run(s):
        traj = mf.simulate(
            mf.kernels.USA(1.0), x0, t1=0.2, dt=0.1, noise=Independent(s), key=jax.random.key(1)
        )
        return traj.xs[-1]

    run = jax.jit(run)
    assert bool(jnp.all(jnp.isfinite(run(0.3))))
    with pytest.raises(Exception, match="sigma must be >= 0 and finite"):
        jax.block_until_ready(run(-0.3))


def test_adaptive_heun_converges_on_the_fixed_steps_path(x64):
    """``solver="heun"`` (adaptive: Euler's step the error estimate, rejected step times revisited)
    reads the Brownian tree of resolution t1 2^-20 whose values at the dyadic points are the fixed-step
    tree's: as rtol falls it approaches the fixed-step solution on a fine grid of the same path
    (measured max-norm distances: 0.015, 0.0053, 0.0024 at rtol 1e-3, 1e-4, 1e-5 against dt =
    2^-12, whose own error is about 0.007 at 2^-10), and the same key gives the same run."""
    x0 = mf.sphere.uniform(jax.random.key(0), 8, 3, jnp.float64)
    model, key, noise = mf.kernels.USA(1.0), jax.random.key(3), Independent(0.5)
    fixed = jax.jit(  # a traced dt: the Brownian tree (the grid path is for concrete steps)
        lambda dt: mf.simulate(
            model, x0, t1=1.0, dt=dt, max_steps=17000, solver="rk2", noise=noise, key=key
        ).xs[-1]
    )(2.0**-14)

    def adaptive(rtol):
        return mf.simulate(
            model, x0, t1=1.0, solver="heun", rtol=rtol, atol=rtol, noise=noise, key=key
        )

    coarse, fine = adaptive(1e-3), adaptive(1e-5)
    e_coarse = float(jnp.abs(coarse.xs[-1] - fixed).max())
    e_fine = float(jnp.abs(fine.xs[-1] - fixed).max())
    assert e_fine < 0.01 and e_fine < e_coarse / 3, (e_coarse, e_fine)
    assert int(fine.num_steps) > 10 * int(coarse.num_steps)  # the steps follow the tolerance
    np.testing.assert_array_equal(np.asarray(adaptive(1e-3).xs), np.asarray(coarse.xs))
    assert not bool(fine.failed)


def test_adaptive_heun_without_noise_is_an_ode_solver(x64):
    """``solver="heun"`` is also an adaptive ODE solver (order 2, its error estimate order 1): it
    meets tsit5's solution to its tolerance."""
    x0 = mf.sphere.uniform(jax.random.key(1), 8, 3, jnp.float64)
    model = mf.kernels.USA(1.0)
    ref = mf.simulate(model, x0, t1=1.0, solver="tsit5", rtol=1e-10, atol=1e-10).xs[-1]
    for tol in (1e-4, 1e-7):
        run = mf.simulate(model, x0, t1=1.0, solver="heun", rtol=tol, atol=tol)
        assert float(jnp.abs(run.xs[-1] - ref).max()) < 20 * tol
