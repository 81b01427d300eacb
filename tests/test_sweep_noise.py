"""Noise in particle sweeps (issue 49, item 4): ``[model] noise`` and ``sigma`` (``mf.noise``),
``sigma`` a traced axis of one compilation, every point the run of ``mf.simulate`` with the key
``fold_in(key(seed), 1)`` (that of ``meanfield simulate --noise ... --seed seed``), ``sigma = 0``
the deterministic point, the noise's refusals at load time in the spec's spelling, a spec without
noise the store it was before; and the observable ``order_parameter``.

One noisy and one deterministic sweep of 6 and 2 points (float64, one point per chunk so that the
two share their chunking) and the 6 direct runs, shared by the module.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
import meanfield.integrate as integrate
from meanfield import sweep
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import plan as sweep_plan

N, D, BETA, T1, DT = 8, 3, 1.0, 0.3, 0.1
SIGMAS = (0.0, 0.2, 0.5)
SEEDS = (3, 4)
OBSERVABLES = ("collapse_gap", "energy", "token_similarity", "order_parameter")

# backend "xla" here and in the direct runs: the same evaluation path (the fused CPU kernel rounds
# differently, docs/sweeps.md "Scaling out")
SPEC = f"""
dtype = "float64"
[model]
kind = "usa"
backend = "xla"
{{noise}}
[grid]
n = [{N}]
d = {D}
beta = [{BETA}]
seeds = {len(SEEDS)}
seed = {SEEDS[0]}
[time]
t1 = {T1}
dt = {DT}
save = 3
{{time}}
[output]
observables = {list(OBSERVABLES)!r}
"""
NOISY = SPEC.format(noise=f"noise = 'independent'\nsigma = {list(SIGMAS)}", time="")
PLAIN = SPEC.format(noise="", time="")
#: ``PLAIN`` without ``order_parameter`` (new too) and its hash computed by the sweep engine before
#: noise existed (meanfield at the commit before issue 49, item 4): a spec without noise keeps its
#: hash, so its older stores resume.
BEFORE = PLAIN.replace(", 'order_parameter'", "")
BEFORE_HASH = "6a78259aaaef4823a61e0ec2437fadd4bff173c40e5881427cda5b2089156cba"

# The sweep's point is one lane of a jitted, sharded vmap; the direct run is unbatched: XLA may
# order a reduction differently, measured 1 ulp (2.2e-16) on the collapse gap here; float64, so
# 1e-13 is rounding and any other key, sigma or x0 would differ by > 1e-3.
RTOL, ATOL = 1e-13, 1e-14


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The noisy and the deterministic sweeps (one point per chunk: ``memory = "1B"``), and how
    many times the noisy one traced ``mf.simulate``."""
    base = tmp_path_factory.mktemp("noise")
    traced = []
    real = integrate.simulate
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(integrate, "simulate", lambda *a, **k: traced.append(1) or real(*a, **k))
        sweep.run_sweep(sweep.parse_spec(NOISY), base / "noisy.zarr", memory="1B", quiet=True)
    sweep.run_sweep(sweep.parse_spec(PLAIN), base / "plain.zarr", memory="1B", quiet=True)
    return sweep.load(base / "noisy.zarr"), sweep.load(base / "plain.zarr"), len(traced)


@pytest.fixture(scope="module")
def direct():
    """``(sigma, seed) -> Trajectory`` of ``mf.simulate`` from the documented x0 and noise key."""
    out = {}
    with jax.enable_x64(True):
        for sigma in SIGMAS:
            for seed in SEEDS:
                x0 = mf.sphere.uniform(jax.random.key(seed), N, D, jnp.float64)
                out[sigma, seed] = mf.simulate(
                    mf.kernels.USA(BETA),
                    x0,
                    t1=T1,
                    dt=DT,
                    ts=np.linspace(0.0, T1, 3),
                    backend="xla",
                    noise=mf.noise.Independent(sigma),
                    key=jax.random.fold_in(jax.random.key(seed), 1),
                    observables={
                        "token_similarity": mf.metrics.token_similarity,
                        "order_parameter": mf.metrics.order_parameter,
                    },
                )
    return out


def _point(ds, sigma, seed):
    return ds.sel(n=N, beta=BETA, sigma=sigma, seed=seed)


@pytest.mark.xla_default
def test_every_point_is_simulate_with_the_seeds_noise_key(stores, direct):
    """(a) x0 from ``key(seed)``, the path from ``fold_in(key(seed), 1)``: each point is that run."""
    noisy, _, _ = stores
    assert noisy["sigma"].values.tolist() == list(SIGMAS)
    assert (noisy["status"].values == sweep.OK).all()
    for (sigma, seed), traj in direct.items():
        point = _point(noisy, sigma, seed)
        want = {
            "collapse_gap": traj.collapse_gap,
            "energy": traj.energy,
            **traj.observables,
        }
        for name in OBSERVABLES:
            np.testing.assert_allclose(
                point[name].values, np.asarray(want[name]), rtol=RTOL, atol=ATOL, err_msg=name
            )
        assert int(point["num_steps"]) == int(traj.num_steps)
        assert float(point["stop_time"]) == pytest.approx(T1, rel=1e-15)
    # the noise moves the tokens: another sigma is another run (the same path, scaled)
    gap = noisy["collapse_gap"].values[0, 0, :, :, -1]  # (sigma, seed)
    assert np.abs(gap[2] - gap[0]).min() > 1e-3


def test_sigma_zero_is_the_deterministic_point(stores):
    """(b) ``sigma = 0`` is the deterministic sweep's point, bit for bit (the same chunking)."""
    noisy, plain, _ = stores
    for name in (*OBSERVABLES, "num_steps", "stop_time", "status"):
        np.testing.assert_array_equal(
            noisy[name].sel(sigma=0.0).values, plain[name].values, err_msg=name
        )


def test_the_sigma_axis_compiles_once(stores):
    """(c) 6 chunks of one point over 3 sigmas and 2 seeds: one trace of the point program, one
    group of the plan, ``sigma`` a traced grid dimension after ``beta``."""
    noisy, _, traced = stores
    assert traced == 1
    spec = sweep.parse_spec(NOISY)
    plan = sweep.make_plan(spec, "1B", devices=1)
    assert len(plan.groups) == 1 and plan.num_chunks == 6
    assert list(spec.axes) == ["beta", "sigma"]
    assert noisy["collapse_gap"].dims == ("n", "beta", "sigma", "seed", "time")
    assert noisy.attrs["model.noise"] == "independent" and "model.sigma" not in noisy.attrs
    text = plan.describe()
    assert "noise: independent (mf.noise), sigma a traced axis of 3 values" in text
    assert "jax.random.fold_in(jax.random.key(s), 1)" in text


@pytest.mark.xla_default
def test_order_parameter_is_the_root_of_token_similarity(stores, direct):
    """(d) ``order_parameter`` = |mean x_i| = sqrt(token_similarity) for unit tokens, and at the last
    save ``mf.metrics.order_parameter`` of the run's final state."""
    noisy, _, _ = stores
    r = noisy["order_parameter"].values
    np.testing.assert_allclose(r, np.sqrt(noisy["token_similarity"].values), rtol=1e-14)
    assert ((r > 0) & (r <= 1 + 1e-15)).all()
    with jax.enable_x64(True):
        for (sigma, seed), traj in direct.items():
            last = float(mf.metrics.order_parameter(traj.xs[-1]))
            got = float(_point(noisy, sigma, seed)["order_parameter"].values[-1])
            assert got == pytest.approx(last, rel=RTOL, abs=ATOL)
    assert "mf.metrics.order_parameter" in noisy["order_parameter"].attrs["description"]


def test_a_spec_without_noise_is_the_store_it_was(stores):
    """(f) Without ``noise`` nothing is recorded of it: the hash the engine gave before noise
    existed (older stores resume), no ``sigma`` dimension, no noise attribute."""
    _, plain, _ = stores
    spec = sweep.parse_spec(PLAIN)
    assert spec.hash == plain.attrs["spec_hash"]
    assert sweep.parse_spec(BEFORE).hash == BEFORE_HASH
    assert "noise" not in spec.data["model"] and "sigma" not in spec.data["model"]
    assert "noise" not in spec.params and "sigma" not in spec.params
    assert dict(plain.sizes) == {"n": 1, "beta": 1, "seed": 2, "time": 3}
    assert sorted(k for k in plain.attrs if k.startswith("model.")) == sorted(
        f"model.{p.name}" for p in mf.kernels.MODELS["usa"].params if p.name != "beta"
    )


@pytest.mark.parametrize(
    "noise,time,match",
    [
        (
            "noise = 'independent'\nsigma = 0.1",
            "solver = 'euler'",
            "model.noise = 'independent' needs time.solver = 'rk2' or time.solver = 'heun' (the "
            "Stratonovich Heun step, fixed or adaptive), not time.solver = 'euler'",
        ),
        (
            "noise = 'independent'\nsigma = [0.1, -0.2]",
            "",
            "model.sigma[1] must be >= 0, got -0.2",
        ),
        (
            "noise = 'brownian'\nsigma = 0.1",
            "",
            "model.noise must be one of 'independent', 'common', got 'brownian'",
        ),
        (
            "noise = 'common'\nsigma = 0.1",
            "early_stop = 1e-8",
            "time.early_stop = 1e-08 stops a run whose energy is stationary (the flow increases "
            "it): not with model.noise = 'common'",
        ),
        (
            "sigma = 0.1",
            "",
            "model.sigma = 0.1 is the amplitude of a noise: it applies with model.noise = "
            "'independent' or model.noise = 'common'",
        ),
        ("noise = 'common'", "", "model.noise = 'common' needs model.sigma"),
        (
            "noise = 'common'\nsigma = 0.1\nnormalization = ['post', 'pre']",
            "",
            "model.noise = 'common' acts on tokens on the sphere or in R^d; "
            "model.normalization = 'pre' carries a radius",
        ),
    ],
    ids=["euler", "negative-sigma", "unknown-noise", "early-stop", "no-noise", "no-sigma", "pre"],
)
def test_refusals_are_one_line_naming_the_key(noise, time, match):
    """(e) The noise's refusals (``Noise.check``) and the spec's own, when the spec is read."""
    with pytest.raises(ValueError) as e:
        sweep.parse_spec(SPEC.format(noise=noise, time=time))
    assert str(e.value).startswith(match) and "\n" not in str(e.value)


def test_noise_needs_dynamics_and_a_list_of_noises_is_a_static_axis():
    with pytest.raises(ValueError, match=r"^model.noise applies to the simulated models, not kind"):
        sweep.parse_spec(
            "[model]\nkind = 'attention'\nnoise = 'common'\nsigma = 0.1\n"
            "[grid]\nn = [8]\nbeta = [1.0]\nseeds = 1\n"
        )
    spec = sweep.parse_spec(
        SPEC.format(noise="noise = ['independent', 'common']\nsigma = 0.3", time="")
    )
    assert spec.statics == {"noise": ("independent", "common")} and list(spec.axes) == ["beta"]
    assert sweep_plan.grid_dims(spec) == ["noise", "n", "beta", "seed"]
    assert spec.at((("noise", "common"),)).params["noise"] == "common"
    assert spec.data["model"]["sigma"] == 0.3
    assert len(sweep.make_plan(spec, "2GB", devices=1).groups) == 2  # one program per noise


def test_cli_bad_noise_spec_is_one_line_exit_2(tmp_path, capsys):
    """(g) ``meanfield sweep`` / ``python -m meanfield.sweep``: one line on stderr, status 2."""
    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.format(noise="noise = 'independent'\nsigma = 0.1", time="solver = 'rk4'"))
    out = tmp_path / "x.zarr"
    for argv in ([str(bad), "--out", str(out)], [str(bad), "--out", str(out), "--dry-run"]):
        assert sweep_cli.console(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
        assert err[0].endswith(
            "model.noise = 'independent' needs time.solver = 'rk2' or time.solver = 'heun' (the "
            "Stratonovich Heun step, fixed or adaptive), not time.solver = 'rk4'"
        )
    assert not out.exists()


def test_an_adaptive_noisy_sweep_point_is_simulates_run(tmp_path):
    """``time.solver = "heun"`` with ``rtol``/``atol``: the adaptive Stratonovich Heun step (its
    Brownian tree of resolution t1 2^-20) in a sweep is mf.simulate's run of the point's key, within
    the controller's tolerance. Not to rounding: a step size that differs by rounding reads the
    path's increment over a slightly other interval, a Brownian path is only Hölder-1/2, so the
    difference grows like a square root at each step until an accept/reject decision flips (the
    sweep's compiled program and mf.simulate's round differently: 453 and 457 steps here, the
    collapse gaps 7e-5 apart at rtol 1e-4; docs/math/noise.md). The same program gives the same
    numbers (tests/test_noise.py)."""
    spec = SPEC.format(
        noise="noise = 'common'\nsigma = 0.4", time="solver = 'heun'\nrtol = 1e-4\natol = 1e-4"
    )
    sweep.run_sweep(sweep.parse_spec(spec), tmp_path / "a.zarr", quiet=True)
    ds = sweep.load(tmp_path / "a.zarr")
    with jax.enable_x64(True):
        seed = SEEDS[1]
        x0 = mf.sphere.uniform(jax.random.key(seed), N, D, jnp.float64)
        traj = mf.simulate(
            mf.kernels.USA(BETA),
            x0,
            t1=T1,
            dt=DT,  # the spec's dt: the controller's first step
            ts=np.linspace(0.0, T1, 3),
            solver="heun",
            rtol=1e-4,
            atol=1e-4,
            backend="xla",
            noise=mf.noise.Common(0.4),
            key=jax.random.fold_in(jax.random.key(seed), 1),
        )
    point = ds.sel(n=N, beta=BETA, seed=seed)
    assert int(point["status"]) == sweep.OK
    np.testing.assert_allclose(
        point["collapse_gap"].values, np.asarray(traj.collapse_gap), rtol=0, atol=2e-3
    )
    steps = int(point["num_steps"])
    assert abs(steps - int(traj.num_steps)) < 0.1 * steps and steps > 100  # the controller's steps
