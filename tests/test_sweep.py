"""Tests of the sweep engine (the package meanfield/sweep/: spec, plan, run, store, plot, cli).

Small grids only (2 CPU cores): a 2 n x 2 beta x 3 seed USA grid whose second
beta (200, above the float32 overflow of exp(beta <x, y>)) must come out as
failed points while the sweep goes on. Subprocesses run the CLI for SIGKILL and
for the 4-device sharding check.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import sweep
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import run as sweep_run

ROOT = Path(__file__).resolve().parents[1]

TINY = """
name = "tiny"
[model]
kind = "usa"
[grid]
n = [5, 7]
d = 3
beta = [1.5, 200.0]
seeds = 3
seed = 10
[time]
t1 = 0.6
dt = 0.1
solver = "rk2"
save = 4
[output]
observables = ["collapse_gap", "energy", "clusters"]
"""

# float32 results compared across chunkings / shardings: batch size changes the
# order of XLA's reductions, so allow 1e-6 relative (energies are O(1)..O(10))
RTOL, ATOL = 1e-6, 1e-6


def _run_cli(args, env=None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "meanfield.sweep", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        **kw,
    )


def _values(ds):
    return {k: np.asarray(ds[k].values) for k in ds.data_vars}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny grid run uninterrupted in one chunk per shape, and with one point per chunk."""
    base = tmp_path_factory.mktemp("sweep")
    spec_path = base / "tiny.toml"
    spec_path.write_text(TINY)
    big = base / "big.zarr"
    small = base / "small.zarr"
    sweep.run_sweep(spec_path, big, quiet=True)
    sweep.run_sweep(spec_path, small, memory="1B", quiet=True)
    return spec_path, big, small


# --------------------------------------------------------------------------- results


def test_store_layout_and_values(tiny):
    spec_path, big, _ = tiny
    ds = sweep.load(big)
    assert dict(ds.sizes) == {"n": 2, "beta": 2, "seed": 3, "time": 4}
    assert ds["collapse_gap"].dims == ("n", "beta", "seed", "time")
    np.testing.assert_array_equal(ds["n"].values, [5, 7])
    np.testing.assert_array_equal(ds["seed"].values, [10, 11, 12])
    np.testing.assert_allclose(ds["time"].values, [0.0, 0.2, 0.4, 0.6])
    assert ds.attrs["spec"] == TINY
    assert ds.attrs["spec_hash"] == sweep.parse_spec(TINY).hash
    assert ds.attrs["jax_version"] == jax.__version__
    assert "meanfield_version" in ds.attrs and "devices" in ds.attrs
    assert ds.attrs["chunks_done"] == ds.attrs["chunks_total"] == 2
    # beta = 200 overflows exp(beta <x, y>) in float32: recorded as failed, the rest ran
    status = ds["status"].values
    np.testing.assert_array_equal(status[:, 0], 1)
    np.testing.assert_array_equal(status[:, 1], 2)
    assert np.all(np.isfinite(ds["collapse_gap"].values[:, 0]))

    # one point against a direct simulation from the documented initial condition
    n, beta, seed = 7, 1.5, 11
    x0 = mf.sphere.uniform(jax.random.key(seed), n, 3)
    traj = mf.simulate(
        mf.kernels.USA(beta),
        x0,
        t1=0.6,
        dt=0.1,
        ts=[0.0, 0.2, 0.4, 0.6],
        save_states=False,
        observables={"c": lambda x: mf.metrics.num_clusters(x, 0.1)},
    )
    point = ds.sel(n=n, beta=beta, seed=seed)
    np.testing.assert_allclose(
        point["collapse_gap"].values, traj.collapse_gap, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(point["energy"].values, traj.energy, rtol=1e-5)
    np.testing.assert_array_equal(point["clusters"].values, traj.observables["c"])
    # the USA flow is an energy ascent (docs/math/particles.md, Lyapunov identity)
    E = ds["energy"].values[:, 0]
    assert np.all(np.diff(E, axis=-1) >= -1e-5 * np.abs(E[..., 1:]))


# Chunking changes results by rounding only (docs/sweeps.md, "Chunking and rounding"): measured on
# smoke.toml (float32, t1 = 4) between --memory 2GB, 20kB and 1B, up to 2.5e-6 relative in the
# energy and 1.4e-6 absolute in the collapse gap; the integer outputs are identical.
CHUNK_ENERGY_RTOL, CHUNK_GAP_ATOL = 1e-5, 1e-5


def _assert_chunkings_agree(a, b) -> None:
    va, vb = _values(a), _values(b)
    assert va.keys() == vb.keys()
    for k in ("status", "num_steps", "stop_time", "clusters"):
        if k in va:
            np.testing.assert_array_equal(vb[k], va[k], err_msg=k)
    np.testing.assert_allclose(
        vb["energy"], va["energy"], rtol=CHUNK_ENERGY_RTOL, atol=0, equal_nan=True
    )
    np.testing.assert_allclose(
        vb["collapse_gap"], va["collapse_gap"], rtol=0, atol=CHUNK_GAP_ATOL, equal_nan=True
    )


def test_results_depend_on_chunking_by_rounding_only(tiny):
    _, big, small = tiny
    a, b = sweep.load(big), sweep.load(small)
    assert b.attrs["chunks_done"] == b.attrs["chunks_total"] == 12
    _assert_chunkings_agree(a, b)
    va, vb = _values(a), _values(b)
    for k in va:  # on this short run (t1 = 0.6) the rounding has not grown yet
        np.testing.assert_allclose(vb[k], va[k], rtol=RTOL, atol=ATOL, equal_nan=True, err_msg=k)


@pytest.mark.slow
def test_resume_after_sigkill_equals_uninterrupted_run(tiny, tmp_path):
    spec_path, _, small = tiny
    out = tmp_path / "killed.zarr"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "meanfield.sweep",
            str(spec_path),
            "--out",
            str(out),
            "--memory",
            "1B",
            "--quiet",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    done = out / "_sweep" / "done"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if done.is_dir() and any(p.isdigit() for p in os.listdir(done)):
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    marks = len([p for p in os.listdir(done) if p.isdigit()])
    assert 1 <= marks < 12, marks

    # without --resume: refused, one line on stderr, exit 2
    r = _run_cli([spec_path, "--out", out, "--memory", "1B", "--quiet"])
    assert r.returncode == 2
    assert "--resume" in r.stderr and len(r.stderr.strip().splitlines()) == 1

    r = _run_cli(
        [spec_path, "--out", out, "--resume", "--quiet"]
    )  # --memory ignored: stored chunking kept
    assert r.returncode == 0, r.stderr
    # the same sweep uninterrupted, in a fresh process like the killed and resumed ones: bit-identical
    ref = tmp_path / "uninterrupted.zarr"
    r = _run_cli([spec_path, "--out", ref, "--memory", "1B", "--quiet"])
    assert r.returncode == 0, r.stderr
    va, vb = _values(sweep.load(ref)), _values(sweep.load(out))
    for k in va:
        np.testing.assert_array_equal(vb[k], va[k], err_msg=k)
    # against the in-process run (another process state; XLA may round the last ulp differently)
    vs = _values(sweep.load(small))
    for k in vs:
        np.testing.assert_allclose(vb[k], vs[k], rtol=1e-6, atol=1e-7, equal_nan=True, err_msg=k)
    assert sweep.load(out).attrs["chunks_done"] == 12


@pytest.mark.slow
def test_sharded_equals_unsharded(tiny, tmp_path):
    spec_path, big, _ = tiny
    out = tmp_path / "sharded.zarr"
    env = dict(
        os.environ,
        XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
    )
    r = _run_cli([spec_path, "--out", out, "--memory", "10kB"], env=env)
    assert r.returncode == 0, r.stderr
    assert "devices: 4" in r.stderr
    ds = sweep.load(out)
    assert ds.attrs["devices"].startswith("4 x cpu")
    va, vb = _values(sweep.load(big)), _values(ds)
    for k in va:
        np.testing.assert_allclose(vb[k], va[k], rtol=RTOL, atol=ATOL, equal_nan=True, err_msg=k)


def test_refuses_overwrite_and_other_spec(tiny, tmp_path):
    spec_path, big, _ = tiny
    with pytest.raises(FileExistsError, match="use --resume or another path"):
        sweep.run_sweep(spec_path, big, quiet=True)
    other = TINY.replace("beta = [1.5, 200.0]", "beta = [1.5, 3.0]").replace(
        "seeds = 3", "seeds = 4"
    )
    with pytest.raises(ValueError, match=r"differing keys: grid\.beta, grid\.seeds"):
        sweep.run_sweep(sweep.parse_spec(other), big, resume=True, quiet=True)
    # a directory that is not a store is never touched
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="not a sweep store"):
        sweep.run_sweep(spec_path, junk, resume=True, quiet=True)
    assert (junk / "keep.txt").read_text() == "x"
    # resuming a complete store computes nothing and leaves the data unchanged
    before = _values(sweep.load(big))
    sweep.run_sweep(spec_path, big, resume=True, quiet=True)
    after = _values(sweep.load(big))
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


@pytest.mark.slow
def test_model_axis_gauge_kernels_respect_energy_bound(tmp_path):
    """kind as a list is a "model" axis; RoPE and prompt energies climb to at most e^beta/(2 beta)."""
    text = """
[model]
kind = ["rope", "prompt"]
[grid]
n = [6]
beta = [1.0, 3.0]
seeds = 2
[time]
t1 = 1.0
dt = 0.1
save = 3
"""
    out = tmp_path / "gauge.zarr"
    sweep.run_sweep(text, out, quiet=True)
    ds = sweep.load(out)
    assert ds["energy"].dims == ("model", "n", "beta", "seed", "time")
    assert list(ds["model"].values) == ["rope", "prompt"]
    np.testing.assert_array_equal(ds["status"].values, 1)
    E = ds["energy"].values
    bound = np.asarray(mf.theory.max_energy(ds["beta"].values))[None, None, :, None, None]
    assert np.all(E <= bound * (1 + 1e-6))
    # E increases (docs/math/particles.md, Lyapunov identity)
    assert np.all(np.diff(E, axis=-1) >= -1e-6 * np.abs(E[..., 1:]))
    # same seed, different kernels: different trajectories from the same initial state
    np.testing.assert_allclose(
        ds["collapse_gap"].values[0, ..., 0], ds["collapse_gap"].values[1, ..., 0]
    )
    assert not np.allclose(
        ds["collapse_gap"].values[0, ..., -1], ds["collapse_gap"].values[1, ..., -1]
    )


def _direct(name, params, n, d, seed, ts, dt):
    """One point run outside the sweep: the registry's model from the documented initial state."""
    x0 = mf.sphere.uniform(jax.random.key(seed), n, d)
    return mf.simulate(
        mf.kernels.make(name, d=d, **params),
        x0,
        t1=float(ts[-1]),
        dt=dt,
        solver="rk2",
        ts=ts,
        save_states=False,
    )


def test_phase_field_sweep_is_the_registry_model(tmp_path):
    """kind = "phase-field" with default settings is mf.kernels.make("phase-field", beta=b):
    phi(s) = 2 pi s + 1.0 sin(2 pi s) (FourierPhase), the same model as `meanfield simulate`."""
    text = """
[model]
kind = "phase-field"
[grid]
n = [6]
beta = [1.0, 2.0]
seeds = 2
[time]
t1 = 1.0
dt = 0.05
save = 5
"""
    spec = sweep.parse_spec(text)
    entry = mf.kernels.MODELS["phase-field"]
    assert spec.params["amplitude"] == entry.param("amplitude").default == 1.0
    out = tmp_path / "phase.zarr"
    sweep.run_sweep(spec, out, quiet=True)
    ds = sweep.load(out)
    assert ds.attrs["model.amplitude"] == 1.0 and ds.attrs["model.frequency"] == 1
    np.testing.assert_array_equal(ds["status"].values, sweep.OK)
    ts = ds["time"].values
    for beta in (1.0, 2.0):
        for seed in (0, 1):
            tr = _direct("phase-field", {"beta": beta}, 6, 3, seed, ts, 0.05)
            point = ds.sel(n=6, beta=beta, seed=seed)
            np.testing.assert_allclose(point["energy"].values, tr.energy, rtol=2e-6)
            np.testing.assert_allclose(
                point["collapse_gap"].values, tr.collapse_gap, rtol=2e-5, atol=1e-6
            )
    # amplitude 1.0 is not the pure RoPE phase: the trajectories differ from amplitude 0
    flat = _direct("phase-field", {"beta": 1.0, "amplitude": 0.0}, 6, 3, 0, ts, 0.05)
    assert not np.allclose(
        ds["energy"].sel(n=6, beta=1.0, seed=0).values[-1], flat.energy[-1], rtol=1e-4
    )


def test_gauge_sweep_runs_with_a_traced_amplitude_axis(tmp_path):
    """kind = "gauge" (WavyGauge, d = 3): amplitude is a traced grid axis of one compilation;
    every point equals the registry's model and stays below the maximal energy e^beta/(2 beta)."""
    text = """
[model]
kind = "gauge"
amplitude = [0.0, 0.6]
k = 2
[grid]
n = [6]
beta = [1.0]
seeds = 2
[time]
t1 = 1.0
dt = 0.05
save = 4
"""
    out = tmp_path / "gauge.zarr"
    plan = sweep.run_sweep(text, out, quiet=True)
    assert len(plan.groups) == 1  # one compilation for the whole amplitude axis
    ds = sweep.load(out)
    assert ds["energy"].dims == ("n", "beta", "amplitude", "seed", "time")
    assert ds.attrs["model.k"] == 2 and ds.attrs["d"] == 3
    np.testing.assert_array_equal(ds["status"].values, sweep.OK)
    ts = ds["time"].values
    for amp in (0.0, 0.6):
        tr = _direct("gauge", {"beta": 1.0, "amplitude": amp, "k": 2}, 6, 3, 1, ts, 0.05)
        point = ds.sel(n=6, beta=1.0, amplitude=amp, seed=1)
        np.testing.assert_allclose(point["energy"].values, tr.energy, rtol=2e-6)
        np.testing.assert_allclose(
            point["collapse_gap"].values, tr.collapse_gap, rtol=2e-5, atol=1e-6
        )
    E = ds["energy"].values
    assert np.all(E <= float(mf.theory.max_energy(1.0)) * (1 + 1e-6))
    # E increases (docs/math/particles.md, Lyapunov identity)
    assert np.all(np.diff(E, axis=-1) >= -1e-6 * np.abs(E[..., 1:]))
    assert not np.allclose(E[..., 0, :, -1], E[..., 1, :, -1])  # the amplitude changes the flow


@pytest.mark.parametrize("name", mf.kernels.MODEL_NAMES)
def test_every_registry_model_is_a_sweep_kind(name):
    """Every simulated name of the registry parses as model.kind with the registry's defaults,
    and its point program builds (traced) through mf.kernels.build."""
    entry = mf.kernels.MODELS[name]
    has_beta = any(p.name == "beta" for p in entry.params)
    d = entry.d or 3
    spec = sweep.parse_spec(
        f"[model]\nkind = '{name}'\n[grid]\nn = [6]\nd = {d}\n"
        + ("beta = [1.0, 2.0]\n" if has_beta else "")
        + "seeds = 2\n[time]\nt1 = 0.2\ndt = 0.1\nsave = 2\n[output]\nobservables = ['collapse_gap']\n"
    )
    expected = {
        p.name: list(p.default) if p.kind == "plane" else p.default
        for p in entry.params
        if p.name != "beta"
    }
    assert spec.params == expected
    assert sweep.spec_hash(spec.data) == spec.hash
    plan = sweep.make_plan(spec, "2GB", devices=1)
    g = plan.groups[0]
    _, _, sl = plan.chunks[0]
    params, seeds = sweep_run.chunk_inputs(spec, g, sl, plan.padded_size(g))
    out = jax.eval_shape(jax.vmap(sweep_run.point_program(spec, name, 6, d)), params, seeds)
    assert out["collapse_gap"].shape == (seeds.size, 2)


# --------------------------------------------------------------------------- attention


@pytest.mark.xla_default
def test_attention_order_statistics(tmp_path):
    text = """
dtype = "float64"
[model]
kind = "attention"
[grid]
n = [16, 64]
d = 5
beta = {critical = [0.25, 4.0]}
seeds = 4
[output]
observables = ["top_weight", "top_weights", "ratios", "cumulative", "log_partition"]
top_k = 4
"""
    out = tmp_path / "att.zarr"
    sweep.run_sweep(text, out, quiet=True)
    assert (
        jax.numpy.zeros(1).dtype == np.float32
    )  # float64 sweeps do not switch x64 on for the caller
    ds = sweep.load(out)
    assert ds["top_weights"].dtype == np.float64
    assert ds["top_weights"].dims == ("n", "beta_factor", "seed", "rank")
    # beta coordinate from the rule beta = f n^(2/(d-1))
    np.testing.assert_allclose(
        ds["beta"].values,
        np.outer([16, 64], [0.25, 4.0]) * 0 + np.outer(np.array([16.0, 64.0]) ** 0.5, [0.25, 4.0]),
        rtol=1e-12,
    )
    w = ds["top_weights"].values
    assert np.all(np.diff(w, axis=-1) <= 0) and np.all((w > 0) & (w <= 1))
    np.testing.assert_allclose(ds["ratios"].values[..., 0], 1.0)
    np.testing.assert_allclose(ds["cumulative"].values, np.cumsum(w, axis=-1), rtol=1e-6)
    np.testing.assert_array_equal(ds["top_weight"].values, w[..., 0])
    # one point against the attention module directly
    n, f, seed = 64, 4.0, 2
    with jax.enable_x64(True):
        keys = mf.sphere.uniform(jax.random.key(seed), n, 5, jax.numpy.float64)
        q = jax.numpy.eye(5, dtype=jax.numpy.float64)[0]
        ref = np.asarray(mf.attention.ordered_weights(q, keys, f * n**0.5)[:4])
        ref_logz = float(mf.attention.log_partition(q, keys, f * n**0.5))
    point = ds.sel(n=n, beta_factor=f, seed=seed)
    np.testing.assert_allclose(point["top_weights"].values, ref, rtol=1e-12)
    np.testing.assert_allclose(point["log_partition"].values, ref_logz, rtol=1e-12)
    # supercritical beta concentrates more mass on the top key than subcritical (paper Sec. 3)
    mean = ds["top_weight"].mean("seed")
    assert np.all(mean.sel(beta_factor=4.0).values > mean.sel(beta_factor=0.25).values)


# --------------------------------------------------------------------------- plan, specs, CLI


def test_dry_run_plan(capsys):
    plan = sweep.run_sweep(
        ROOT / "sweeps" / "smoke.toml", "/nonexistent/never-written.zarr", dry_run=True
    )
    text = capsys.readouterr().out
    assert "64 points" in text and "compilations: 2" in text and "chunks: 2" in text
    assert "per chunk per device" in text
    assert plan.spec.grid_size == 64 and len(plan.groups) == 2
    assert not Path("/nonexistent/never-written.zarr").exists()
    # a small budget cuts the batch; every chunk fits it (estimate from the shapes)
    plan = sweep.make_plan(plan.spec, "20kB", devices=1)
    assert len(plan.chunks) > 2
    for g in plan.groups:
        assert g.point_bytes * plan.padded_size(g) <= 20_000 or np.prod(g.block) == 1
    # blocks nest: every chunk covers whole zarr chunks
    for g in plan.groups:
        assert all(
            b % z == 0 or b == s for b, z, s in zip(g.block, plan.zarr_block, plan.batch_shape)
        )


@pytest.mark.parametrize("kind,n,d", [("attention", 1000, 5), ("usa", 24, 3)])
def test_memory_estimate_bounds_xla_peak(kind, n, d):
    """The plan's memory per chunk is an upper bound of XLA's own peak (memory_analysis), within 3x,
    for the XLA formulation of the fields (what accelerators run; the CPU's native exp kernel
    forms no n x n weights, so there the estimate is a looser upper bound)."""
    _check_memory_estimate(kind, n, d)


def _check_memory_estimate(kind, n, d):
    extra = (
        ""
        if kind == "attention"
        else '[time]\nt1 = 0.5\ndt = 0.1\nsave = 3\n[output]\nobservables = ["collapse_gap", "energy", "clusters"]\n'
    )
    backend = (
        "" if kind == "attention" else "backend = 'xla'\n"
    )  # the spec's own key (attention: no dynamics)
    spec = sweep.parse_spec(
        f"[model]\nkind = '{kind}'\n{backend}[grid]\nn = [{n}]\nd = {d}\nbeta = [1.0, 2.0]\nseeds = 4\n{extra}"
    )
    plan = sweep.make_plan(spec, "2GB", devices=1)
    g = plan.groups[0]
    _, gi, sl = plan.chunks[0]
    params, seeds = sweep_run.chunk_inputs(spec, g, sl, plan.padded_size(g))
    compiled = (
        jax.jit(jax.vmap(sweep_run.point_program(spec, kind, n, d))).lower(params, seeds).compile()
    )
    m = compiled.memory_analysis()
    xla = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
    estimate = g.point_bytes * plan.padded_size(g)
    assert xla <= estimate <= 3 * xla, (estimate, xla)


RULE = """
name = "rule"
dtype = "float64"
[model]
kind = "usa"
[grid]
n = [6]
d = 2
beta = [0.2, 1.5, 3.0]
seeds = 2
[time]
t1 = 0.25
dt = 0.1
solver = "euler"
save = 6
step_rule = "reference"
[output]
observables = ["collapse_gap", "energy"]
"""


@pytest.mark.xla_default
def test_reference_step_rule_buckets_by_beta_and_compiles_once(tmp_path, monkeypatch):
    """step_rule = "reference": dt(beta) = 0.1 / max(sqrt(beta) e^(beta - 1/2), 1), one beta per
    chunk (each chunk runs its own step count, no padding), one trace for the whole grid, and
    every point equal to simulate() with that beta's concrete step."""
    import meanfield.integrate as integrate

    spec = sweep.parse_spec(RULE)
    plan = sweep.make_plan(spec, "2GB", devices=1)
    assert len(plan.chunks) == 3 and plan.groups[0].block[0] == 1  # beta axis first, one per chunk
    assert "step_rule = 'reference'" in plan.describe()
    calls = []
    real = integrate.simulate
    monkeypatch.setattr(integrate, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    with jax.enable_x64(True):
        sweep.run_sweep(spec, tmp_path / "rule.zarr", quiet=True)
        ds = sweep.load(tmp_path / "rule.zarr")
        assert len(calls) == 1  # traced once for all betas and chunks
        steps = ds["num_steps"].values[0]  # (beta, seed)
        for bi, b in enumerate(spec.axes["beta"]):
            h = float(mf.phase_diagram.usa_step_size(float(b), 0.1))
            assert h == pytest.approx(0.1 / max(np.sqrt(b) * np.exp(b - 0.5), 1.0), rel=1e-15)
            for si, seed in enumerate(spec.seeds):
                x0 = mf.sphere.uniform(jax.random.key(int(seed)), 6, 2, jax.numpy.float64)
                tr = real(mf.kernels.USA(float(b)), x0, t1=0.25, dt=h, solver="euler", ts=spec.ts)
                assert steps[bi, si] == int(tr.num_steps)
                np.testing.assert_allclose(ds["energy"].values[0, bi, si], tr.energy, rtol=1e-13)
                np.testing.assert_allclose(
                    ds["collapse_gap"].values[0, bi, si], tr.collapse_gap, rtol=1e-12
                )
    assert steps[0, 0] < steps[1, 0] < steps[2, 0]  # beta-dependent step counts


@pytest.mark.parametrize(
    "extra,model,match",
    [
        ('solver = "tsit5"\nrtol = 1e-6\natol = 1e-8\n', "", "fixed-step solver"),
        ("", "rescaled = true\n", "rescaled = false"),
        ("", "", "step_rule"),
    ],
)
def test_reference_step_rule_bad_specs(extra, model, match):
    text = RULE.replace('solver = "euler"\n', extra or 'solver = "euler"\n').replace(
        'kind = "usa"\n', 'kind = "usa"\n' + model
    )
    if match == "step_rule":
        text = text.replace('step_rule = "reference"', 'step_rule = "adaptive"')
    with pytest.raises(ValueError, match=match):
        sweep.parse_spec(text)


def test_plan_warns_when_fixed_steps_overshoot():
    """dt x sqrt(beta) e^(beta - 1/2) > 1 is warned about (dt = 0.05 at beta = 4 lost energy with
    projected RK2); dt = 0.01, a rescaled kernel or an adaptive solver is not."""
    base = (
        "[model]\nkind = 'usa'\n{resc}[grid]\nn = [8]\nd = 3\nbeta = [1.0, 4.0]\nseeds = 2\n"
        "[time]\nt1 = 1.0\ndt = {dt}\nsave = 3\n{solver}"
    )

    def text(dt, resc="", solver=""):
        return sweep.make_plan(
            sweep.parse_spec(base.format(dt=dt, resc=resc, solver=solver)), "2GB", devices=1
        ).describe()

    warned = text(0.05)
    assert (
        "overshoot" in warned
        and "1 (shape, beta) pair(s)" in warned
        and "dt x rate up to 3.3" in warned
    )
    assert "overshoot" not in text(0.01)
    assert "overshoot" not in text(0.05, resc="rescaled = true\n")
    assert "overshoot" not in text(0.05, solver="solver = 'tsit5'\nrtol = 1e-6\natol = 1e-8\n")


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_specs_parse_and_plan(path, capsys):
    spec = sweep.load_spec(path)
    plan = sweep.make_plan(spec, "2GB", devices=1)
    assert len(plan.chunks) >= len(plan.groups) >= 1
    assert "overshoot" not in plan.describe()  # the shipped steps resolve the field
    if path.name == "smoke.toml":
        assert len(spec.n) >= 2 and len(spec.axes["beta"]) >= 4 and len(spec.seeds) >= 8
    if path.name == "usa_av_fig2.toml":
        assert (
            spec.kinds == ("usa", "rope", "prompt") and len(spec.n) == 4 and len(spec.seeds) == 100
        )
        assert spec.time["t1"] == 20 and spec.time["dt"] == 1e-2 and spec.time["solver"] == "rk2"
        assert len(plan.groups) == 12


BAD_SPECS = [
    ("name = 'x'\n[model\nkind = 'usa'", tomllib.TOMLDecodeError, None),
    (
        "colour = 1\n" + TINY,
        ValueError,
        "unknown key 'colour' in top level; accepted keys: name, description",
    ),
    (
        TINY.replace("seeds = 3", "seeds = 3\nrepeats = 2"),
        ValueError,
        r"unknown key 'repeats' in \[grid\]; accepted keys: n, d, beta, seeds, seed",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "usa"\nlam = 1.0'),
        ValueError,
        r"unknown key 'lam' in \[model\]; accepted keys: kind, rescaled",
    ),
    (
        TINY.replace("t1 = 0.6", "t1 = 0.6\nt0 = 0"),
        ValueError,
        r"unknown key 't0' in \[time\]; accepted keys: t1, dt, solver",
    ),
    (
        TINY.replace("[output]", "[output]\nplots = 1"),
        ValueError,
        r"unknown key 'plots' in \[output\]",
    ),
    (
        TINY.replace("beta = [1.5, 200.0]", "beta = {critical = [1.0], gamma = 2}"),
        ValueError,
        r"unknown key 'gamma' in \[grid.beta\]; accepted keys: critical, c, p",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "transformer"'),
        ValueError,
        "unknown model kind 'transformer'; accepted: 'usa'",
    ),
    (TINY.replace("n = [5, 7]", "n = [1, 7]"), ValueError, r"grid.n\[0\] must be >= 2, got 1"),
    (TINY.replace("n = [5, 7]", "n = [5.5]"), TypeError, "must be an integer"),
    (TINY.replace("n = [5, 7]", "n = [5, 5]"), ValueError, "distinct"),
    (TINY.replace("d = 3", "d = 1"), ValueError, "grid.d must be >= 2"),
    (
        TINY.replace("beta = [1.5, 200.0]", "beta = [1.5, -2.0]"),
        ValueError,
        r"grid.beta\[1\] must be > 0, got -2.0",
    ),
    (TINY.replace("beta = [1.5, 200.0]", "beta = [1.5, 'hot']"), TypeError, "must be a number"),
    (TINY.replace("beta = [1.5, 200.0]", "beta = {c = [1.0]}"), ValueError, "needs critical"),
    (TINY.replace("beta = [1.5, 200.0]\n", ""), ValueError, r"\[grid\] needs beta"),
    (TINY.replace("seeds = 3", "seeds = 0"), ValueError, "grid.seeds must be >= 1"),
    (TINY.replace("dt = 0.1", "dt = 0.0"), ValueError, "time.dt must be > 0"),
    (
        TINY.replace('solver = "rk2"', 'solver = "leapfrog"'),
        ValueError,
        "unknown time.solver 'leapfrog'",
    ),
    (
        TINY.replace('solver = "rk2"', 'solver = "tsit5"'),
        ValueError,
        "adaptive: give both time.rtol and time.atol",
    ),
    (
        TINY.replace("save = 4", "save = [0.0, 1.0]"),
        ValueError,
        r"time.save must lie in \[0, time.t1\] = \[0, ",
    ),
    (TINY.replace("[time]", "[tyme]"), ValueError, "unknown key 'tyme'"),
    (TINY.split("[time]")[0], ValueError, r"\[time\] with t1 is required"),
    (
        TINY.replace('"clusters"]', '"entropy"]'),
        ValueError,
        "unknown observable 'entropy' for kind 'usa'; accepted: collapse_gap, energy",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "sa"'),
        ValueError,
        "unknown observable 'energy' for kind 'sa'",
    ),
    (
        TINY.replace("dtype", "x").replace('name = "tiny"', 'name = "tiny"\ndtype = "float16"'),
        ValueError,
        "unknown dtype 'float16'",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "distance-bias"\nlam = -1.0'),
        ValueError,
        "model.lam must be >= 0",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "rope"\nplane = [0, 3]'),
        ValueError,
        r"model.plane \[0, 3\] needs indices < grid.d = 3",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "toeplitz"'),
        ValueError,
        "grid.beta is not a parameter of kind 'toeplitz'",
    ),
    (
        "[model]\nkind = 'attention'\n[grid]\nn = [8]\nbeta = [1.0]\nseeds = 1\n[time]\nt1 = 1.0",
        ValueError,
        r"\[time\] does not apply",
    ),
    (
        "[model]\nkind = 'attention'\n[grid]\nn = [8]\nbeta = [1.0]\nseeds = 1\n[output]\ntop_k = 9",
        ValueError,
        "top_k = 9 must be <= the smallest n = 8",
    ),
    (
        "[model]\nkind = ['usa', 'attention']\n[grid]\nn = [8]\nbeta = [1.0]\nseeds = 1",
        ValueError,
        "cannot share a sweep",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "gauge"').replace("d = 3", "d = 4"),
        ValueError,
        r"model 'gauge' needs grid.d = 3, got grid.d = 4",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = ["usa", "gauge"]').replace("d = 3", "d = [2, 3]"),
        ValueError,
        r"needs grid.d = 3, got grid.d = 2",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "sa"\nattention = "hardmax"\ntie_tol = [0.1, 0.2]'),
        TypeError,
        "model.tie_tol changes the compiled program: give one value",
    ),
    (
        TINY.replace('kind = "usa"', "kind = \"phase-field\"\namplitude = [0.5, 'x']"),
        TypeError,
        r"model.amplitude\[1\] must be a number",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "prompt"\ngauges = "haar"'),
        ValueError,
        "model.gauges must be one of 'random', 'rotation'",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = ["phase-field", "gauge"]'),
        ValueError,
        r"model.amplitude has different defaults .*phase-field: 1.0, gauge: 0.6",
    ),
    (
        TINY.replace('kind = "usa"', 'kind = "usa"\nbeta = 1.0'),
        ValueError,
        r"unknown key 'beta' in \[model\]",
    ),
]


@pytest.mark.parametrize(
    "text,exc,match", BAD_SPECS, ids=[f"bad{i}" for i in range(len(BAD_SPECS))]
)
def test_bad_specs(text, exc, match):
    with pytest.raises(exc, match=match):
        sweep.parse_spec(text)


def test_missing_file_and_bad_memory(tmp_path):
    with pytest.raises(FileNotFoundError, match="sweep spec not found"):
        sweep.load_spec(tmp_path / "nope.toml")
    for bad in ("lots", "-1GB", "2XB", 0):
        with pytest.raises(ValueError, match="memory"):
            sweep.parse_memory(bad)
    assert sweep.parse_memory("2GB") == 2 * 10**9
    assert sweep.parse_memory("1.5MiB") == int(1.5 * 2**20)


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.replace("seeds = 3", "seeds = 3\nrepeats = 2"))
    malformed = tmp_path / "malformed.toml"
    malformed.write_text("[model\n")
    cases = [
        ([bad], "unknown key 'repeats' in [grid]; accepted keys"),
        ([tmp_path / "missing.toml"], "sweep spec not found"),
        ([malformed], "error: "),
        ([bad.with_name("x.toml"), "--memory", "lots"], "sweep spec not found"),
    ]
    for args, msg in cases:
        rc = sweep_cli.console([*map(str, args), "--out", str(tmp_path / "x.zarr")])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    TINY_OK = tmp_path / "ok.toml"
    TINY_OK.write_text(TINY)
    assert (
        sweep_cli.console([str(TINY_OK), "--out", str(tmp_path / "x.zarr"), "--memory", "lots"])
        == 2
    )
    assert "memory must be a size like 2GB" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()
    # the same through `python -m meanfield.sweep` (a separate process)
    r = _run_cli([bad, "--out", tmp_path / "x.zarr"])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'repeats'" in lines[0] and "accepted keys" in lines[0]


def test_plot_main(tiny, tmp_path):
    import matplotlib

    _, big, _ = tiny
    backend = matplotlib.get_backend()
    assert sweep.plot_main([str(big), "--out", str(tmp_path / "plots")]) == 0
    assert matplotlib.get_backend() == backend  # no process-wide backend switch
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "collapse_gap_vs_time.png" in names
    assert "collapse_gap_heatmap_n_beta.png" in names
    assert all((tmp_path / "plots" / n).stat().st_size > 1000 for n in names)


@pytest.mark.slow
def test_smoke_sweep_energy_ascends_below_the_maximum(tmp_path):
    """The shipped smoke sweep: every point finishes, E(t) <= e^beta/(2 beta) and E increases (docs/math/kernels.md, docs/math/particles.md);
    run again with --memory 20kB (24 chunks instead of 2) it agrees within the documented chunking bound."""
    out = tmp_path / "smoke.zarr"
    sweep.run_sweep(ROOT / "sweeps" / "smoke.toml", out, quiet=True)
    ds = sweep.load(out)
    assert bool((ds.status == 1).all())
    emax = np.exp(ds.beta) / (2 * ds.beta)
    assert bool((ds.energy <= emax * (1 + 1e-5)).all())
    assert bool((ds.energy.diff("time") >= -1e-5 * emax).all())
    # the documented chunking bound, on the grid where it was measured
    small = tmp_path / "smoke_20kB.zarr"
    sweep.run_sweep(ROOT / "sweeps" / "smoke.toml", small, memory="20kB", quiet=True)
    assert sweep.load(small).attrs["chunks_total"] == 16
    _assert_chunkings_agree(ds, sweep.load(small))
