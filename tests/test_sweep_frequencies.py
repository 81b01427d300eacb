"""Natural frequencies in particle sweeps (issue 49, item 4): ``[model] frequencies`` and ``spread``
(``mf.frequencies``), ``spread`` a traced axis of one compilation, optional ``frequency_seed``;
every point the run of ``mf.simulate(frequencies=law.sample(n[, key=key(K)], dtype=dtype))`` from
``x0 = mf.sphere.uniform(key(seed), n, 2)`` (that of ``meanfield simulate --frequencies NAME
--spread S [--frequency-seed K] --seed seed``), with noise too; the refusals at load time in the
spec's spelling; a spec without frequencies the store it was.

Two sweeps (float64, one point per chunk), shared by the module: a Kuramoto sweep over the coupling
and the spread with the law's midpoint quantiles and ``order_parameter``, and a USA sweep over the
noise's sigma (0 and 0.2) with frequencies drawn from ``key(frequency_seed)``; and the direct runs
without noise (a noisy program compiles in seconds: ``sigma = 0`` is the deterministic point,
tests/test_sweep_noise.py, and its noisy points equal ``mf.simulate(noise=, key=)`` there).
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

N, D, T1, DT = 8, 2, 0.6, 0.1
SEEDS = (3, 4)
COUPLINGS = (1.0, 4.0)
SPREADS = (0.5, 2.0)
BETA, SIGMA, SPREAD, FREQUENCY_SEED = 1.0, 0.2, 1.5, 7
OBSERVABLES = ("collapse_gap", "energy", "token_similarity", "order_parameter")

# backend "xla" here and in the direct runs: the same evaluation path (the fused CPU kernel rounds
# differently, docs/sweeps.md "Scaling out")
GRID = f"""
dtype = "float64"
[model]
kind = "{{kind}}"
backend = "xla"
{{model}}
[grid]
n = [{N}]
d = {{d}}
{{beta}}
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


def spec_text(model="", *, kind="usa", d=D, beta=f"beta = [{BETA}]", time=""):
    return GRID.format(kind=kind, model=model, d=d, beta=beta, time=time)


KURAMOTO = spec_text(
    f"coupling = {list(COUPLINGS)}\nfrequencies = 'lorentzian'\nspread = {list(SPREADS)}",
    kind="kuramoto",
    beta="",
)
DRAWN = spec_text(
    f"noise = 'independent'\nsigma = [0.0, {SIGMA}]\nfrequencies = 'gaussian'\nspread = {SPREAD}\n"
    f"frequency_seed = {FREQUENCY_SEED}"
)
#: A spec without frequencies, and its hash computed by the sweep engine before frequencies existed
#: (meanfield at commit 4bf73eb): nothing of them is recorded, so older stores resume.
PLAIN = spec_text()
PLAIN_HASH = "88f4c5e03419910f1d5818dd5b636a4b128f204b10f2a830e6d027f1daed7f25"

# A sweep's point is one lane of a jitted, sharded vmap, the direct run unbatched: XLA may order a
# reduction differently (an ulp); float64, so 1e-13 is rounding, and other frequencies, another
# spread or key would differ by > 1e-3.
RTOL, ATOL = 1e-13, 1e-14


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The Kuramoto and the drawn sweeps (one point per chunk: ``memory = "1B"``) and how many
    times the Kuramoto sweep traced ``mf.simulate``."""
    base = tmp_path_factory.mktemp("frequencies")
    traced = []
    real = integrate.simulate
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(integrate, "simulate", lambda *a, **k: traced.append(1) or real(*a, **k))
        sweep.run_sweep(sweep.parse_spec(KURAMOTO), base / "k.zarr", memory="1B", quiet=True)
    sweep.run_sweep(sweep.parse_spec(DRAWN), base / "d.zarr", memory="1B", quiet=True)
    return sweep.load(base / "k.zarr"), sweep.load(base / "d.zarr"), len(traced)


def _run(model, seed, frequencies, **kw):
    x0 = mf.sphere.uniform(jax.random.key(seed), N, D, jnp.float64)
    return mf.simulate(
        model,
        x0,
        t1=T1,
        dt=DT,
        ts=np.linspace(0.0, T1, 3),
        backend="xla",
        frequencies=frequencies,
        observables={
            "token_similarity": mf.metrics.token_similarity,
            "order_parameter": mf.metrics.order_parameter,
        },
        **kw,
    )


@pytest.fixture(scope="module")
def direct():
    """The documented runs: ``(coupling, spread, seed) -> Trajectory`` of the Kuramoto sweep with
    the Lorentzian's quantiles; ``seed -> Trajectory`` of the drawn one at ``sigma = 0`` (Gaussian
    draws from ``key(FREQUENCY_SEED)``); and those runs with the quantiles instead."""
    kuramoto, drawn, quantiles = {}, {}, {}
    with jax.enable_x64(True):
        for K in COUPLINGS:
            for s in SPREADS:
                w = mf.frequencies.Lorentzian(s).sample(N, dtype=jnp.float64)
                for seed in SEEDS:
                    kuramoto[K, s, seed] = _run(mf.kernels.Kuramoto(K), seed, w)
        law = mf.frequencies.Gaussian(SPREAD)
        w = law.sample(N, key=jax.random.key(FREQUENCY_SEED), dtype=jnp.float64)
        for seed in SEEDS:
            drawn[seed] = _run(mf.kernels.USA(BETA), seed, w)
            quantiles[seed] = _run(mf.kernels.USA(BETA), seed, law.sample(N, dtype=jnp.float64))
    return kuramoto, drawn, quantiles


def _check_point(point, traj, names):
    want = {"collapse_gap": traj.collapse_gap, "energy": traj.energy, **traj.observables}
    for name in names:
        np.testing.assert_allclose(
            point[name].values, np.asarray(want[name]), rtol=RTOL, atol=ATOL, err_msg=name
        )
    assert int(point["status"]) == sweep.OK
    assert int(point["num_steps"]) == int(traj.num_steps)
    assert float(point["stop_time"]) == pytest.approx(T1, rel=1e-15)


@pytest.mark.xla_default
def test_kuramoto_points_are_simulate_with_the_laws_quantiles(stores, direct):
    """Each point of the Kuramoto sweep is ``mf.simulate(Kuramoto(K), x0, frequencies=
    Lorentzian(spread).sample(n))``, ``order_parameter`` among its observables (1e-13)."""
    ks, _, _ = stores
    kuramoto, _, _ = direct
    assert ks["spread"].values.tolist() == list(SPREADS)
    for (K, s, seed), traj in kuramoto.items():
        _check_point(ks.sel(n=N, coupling=K, spread=s, seed=seed), traj, OBSERVABLES)
        with jax.enable_x64(True):
            last = float(mf.metrics.order_parameter(traj.xs[-1]))
        got = float(ks["order_parameter"].sel(n=N, coupling=K, spread=s, seed=seed)[-1])
        assert got == pytest.approx(last, rel=RTOL, abs=ATOL)


def test_spread_values_give_other_points(stores):
    """The frequencies move the tokens: another spread is another run (the same x0)."""
    ks, _, _ = stores
    gap = ks["collapse_gap"].values[0, :, :, :, -1]  # (coupling, spread, seed)
    assert np.abs(gap[:, 1] - gap[:, 0]).min() > 1e-3
    r = ks["order_parameter"].values[0, :, :, :, -1]
    assert np.abs(r[:, 1] - r[:, 0]).min() > 1e-3
    r0 = ks["order_parameter"].values[0, :, :, :, 0]  # t = 0: the seed's x0 at every spread
    np.testing.assert_array_equal(r0[:, 1], r0[:, 0])


def test_the_spread_axis_compiles_once(stores):
    """8 chunks of one point over 2 couplings, 2 spreads and 2 seeds: one trace of the point
    program, one group of the plan, ``spread`` a traced grid dimension after the model's axes."""
    ks, _, traced = stores
    assert traced == 1
    spec = sweep.parse_spec(KURAMOTO)
    plan = sweep.make_plan(spec, "1B", devices=1)
    assert len(plan.groups) == 1 and plan.num_chunks == 8
    assert list(spec.axes) == ["coupling", "spread"]
    assert ks["collapse_gap"].dims == ("n", "coupling", "spread", "seed", "time")
    assert ks.attrs["model.frequencies"] == "lorentzian" and "model.spread" not in ks.attrs
    assert "model.frequency_seed" not in ks.attrs
    assert (
        "frequencies: lorentzian (mf.frequencies), spread a traced axis of 2 values; "
        "the law's midpoint quantiles" in plan.describe()
    )


@pytest.mark.xla_default
def test_frequency_seed_draws_from_its_key_with_noise(stores, direct):
    """``frequency_seed = K``: the frequencies are ``law.sample(n, key=key(K))`` at every seed (not
    the quantiles), the noise of ``model.noise`` on top: ``sigma = 0`` is the run with those
    frequencies and no noise, ``sigma = 0.2`` another one."""
    _, ds, _ = stores
    _, drawn, quantiles = direct
    assert ds["sigma"].values.tolist() == [0.0, SIGMA]
    assert (ds["status"].values == sweep.OK).all()
    for seed, traj in drawn.items():
        point = ds.sel(n=N, beta=BETA, sigma=0.0, seed=seed)
        _check_point(point, traj, OBSERVABLES)
        other = np.asarray(quantiles[seed].collapse_gap)[-1]
        assert abs(float(point["collapse_gap"][-1]) - other) > 1e-3
        noisy = ds.sel(n=N, beta=BETA, sigma=SIGMA, seed=seed)
        assert abs(float(noisy["collapse_gap"][-1]) - float(point["collapse_gap"][-1])) > 1e-3
    assert ds.attrs["model.frequency_seed"] == FREQUENCY_SEED
    assert ds.attrs["model.spread"] == SPREAD and ds.attrs["model.noise"] == "independent"
    assert ds["collapse_gap"].dims == ("n", "beta", "sigma", "seed", "time")
    spec = sweep.parse_spec(DRAWN)
    assert spec.data["model"]["frequency_seed"] == FREQUENCY_SEED
    assert (
        f"drawn from jax.random.key({FREQUENCY_SEED})"
        in sweep.make_plan(spec, "2GB", devices=1).describe()
    )


def test_a_spec_without_frequencies_is_the_store_it_was():
    """Without ``frequencies`` nothing of them is recorded: the hash the engine gave before they
    existed (older stores resume)."""
    spec = sweep.parse_spec(PLAIN)
    assert spec.hash == PLAIN_HASH
    assert not {"frequencies", "spread", "frequency_seed"} & (
        set(spec.data["model"]) | set(spec.params)
    )
    assert list(spec.axes) == ["beta"] and spec.statics == {}


def test_a_list_of_laws_is_a_static_axis():
    spec = sweep.parse_spec(spec_text("frequencies = ['lorentzian', 'gaussian']\nspread = 0.3"))
    assert spec.statics == {"frequencies": ("lorentzian", "gaussian")}
    assert list(spec.axes) == ["beta"]
    assert sweep_plan.grid_dims(spec) == ["frequencies", "n", "beta", "seed"]
    assert spec.at((("frequencies", "gaussian"),)).params["frequencies"] == "gaussian"
    assert spec.data["model"]["spread"] == 0.3
    assert len(sweep.make_plan(spec, "2GB", devices=1).groups) == 2  # one program per law


@pytest.mark.parametrize(
    "model,kw,match",
    [
        (
            "frequencies = 'lorentzian'",
            {},
            "model.frequencies = 'lorentzian' needs model.spread, the law's scale (a number > 0, "
            "or a list: a grid axis)",
        ),
        (
            "spread = 0.5",
            {},
            "model.spread = 0.5 is the scale of a frequency law: it applies with "
            "model.frequencies = 'lorentzian' or model.frequencies = 'gaussian'",
        ),
        (
            "frequency_seed = 3",
            {},
            "model.frequency_seed draws the frequencies of model.frequencies: give both",
        ),
        (
            "frequencies = 'cauchy'\nspread = 0.5",
            {},
            "model.frequencies must be one of 'lorentzian', 'gaussian', got 'cauchy'",
        ),
        ("frequencies = 'gaussian'\nspread = [0.5, 0.0]", {}, "model.spread[1] must be > 0"),
        (
            "frequencies = 'gaussian'\nspread = 0.5\nfrequency_seed = -1",
            {},
            "model.frequency_seed must be >= 0",
        ),
        (
            "frequencies = 'gaussian'\nspread = 0.5",
            {"d": "[2, 3]"},
            "model.frequencies = 'gaussian' gives angular velocities on the circle: it needs "
            "grid.d = 2, got grid.d = 3",
        ),
        (
            "frequencies = 'lorentzian'\nspread = 0.5",
            {"time": "early_stop = 1e-8"},
            "time.early_stop = 1e-08 stops a run whose energy is stationary (the flow increases "
            "it): not with model.frequencies = 'lorentzian'",
        ),
        (
            "frequencies = 'lorentzian'\nspread = 0.5\nnormalization = ['post', 'peri']",
            {},
            "model.frequencies = 'lorentzian': natural frequencies rotate tokens on the sphere or "
            "in R^d; model.normalization = 'peri' carries a radius",
        ),
    ],
    ids=[
        "no-spread",
        "no-frequencies",
        "seed-alone",
        "unknown-law",
        "zero-spread",
        "negative-seed",
        "d3",
        "early-stop",
        "peri",
    ],
)
def test_refusals_are_one_line_naming_the_key(model, kw, match):
    """What ``mf.simulate(frequencies=)`` and ``meanfield simulate --frequencies`` refuse, and the
    spec's own, when the spec is read."""
    with pytest.raises(ValueError) as e:
        sweep.parse_spec(spec_text(model, **kw))
    assert str(e.value).startswith(match) and "\n" not in str(e.value), str(e.value)


def test_a_seed_is_one_integer_and_frequencies_need_dynamics():
    with pytest.raises(TypeError, match=r"^model.frequency_seed is one seed"):
        sweep.parse_spec(
            spec_text("frequencies = 'gaussian'\nspread = 0.5\nfrequency_seed = [1, 2]")
        )
    with pytest.raises(
        ValueError, match=r"^model.frequencies applies to the simulated models, not kind"
    ):
        sweep.parse_spec(
            "[model]\nkind = 'attention'\nfrequencies = 'gaussian'\nspread = 0.5\n"
            "[grid]\nn = [8]\nd = 2\nbeta = [1.0]\nseeds = 1\n"
        )


def test_cli_bad_frequencies_spec_is_one_line_exit_2(tmp_path, capsys):
    """``meanfield sweep``: one line on stderr, status 2, no store."""
    bad = tmp_path / "bad.toml"
    bad.write_text(spec_text("frequencies = 'lorentzian'\nspread = 0.5", d=3))
    out = tmp_path / "x.zarr"
    assert sweep_cli.console([str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].endswith("it needs grid.d = 2, got grid.d = 3")
    assert not out.exists()
