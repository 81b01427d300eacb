"""The sweep kind ``continuum``: the mean-field density solver as a model of the sweep engine
(meanfield/sweep/_continuum.py, docs/sweeps.md "The density solver").

Closed form checked: on the circle the dispersion relation of the USA flow is
``lambda_k = k^2 I_k(beta) / beta`` (``e^{-beta}`` times that per unit of the rescaled time), so
the measured rate ``log(a(t1) / a(0)) / t1`` of a mode perturbation of amplitude ``eps`` must
match it up to the nonlinear correction ``O((eps e^{lambda t1})^2)`` (``<= 2e-4`` here) and the
solver's tolerance: the stated tolerance is 1e-4 relative in float64 (measured: 6e-6).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.special

import meanfield as mf
from meanfield import sweep
from meanfield.sweep.plan import make_plan

ROOT = Path(__file__).resolve().parents[1]
GROWTH = ROOT / "sweeps" / "continuum_growth.toml"


def _run_cli(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "meanfield", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        **kw,
    )


SMALL = """
dtype = "float64"
[model]
kind = "continuum"
model = "usa"
rescaled = true
[grid]
d = 2
resolution = 8
beta = [1.0, 4.0, 9.0]
mode = [1, 2, 3]
eps = 1e-3
[time]
t1 = 8.0
save = 5
rtol = 1e-9
atol = 1e-12
[output]
observables = ["growth_rate", "theory_rate", "mass_drift", "min_density", "amplitude"]
"""


def test_growth_map_spec_through_the_cli(tmp_path):
    """sweeps/continuum_growth.toml through `meanfield sweep`, `--verify` and `meanfield plot`."""
    out = tmp_path / "growth.zarr"
    r = _run_cli(["sweep", GROWTH, "--out", out, "--quiet"])
    assert r.returncode == 0, r.stderr
    ds = sweep.load(out)
    assert ds["status"].dims == ("resolution", "beta", "mode")  # no seed axis: deterministic
    assert "seed" not in ds.dims
    assert np.all(ds["status"].values == sweep.OK)
    assert np.all(ds["solver_status"].values == mf.continuum.OK)
    beta = ds["beta"].values[:, None]
    k = ds["mode"].values[None, :]
    closed = k**2 * scipy.special.ive(k, beta) / beta  # rescaled USA rates on the circle
    theory = ds["theory_rate"].isel(resolution=0).values
    np.testing.assert_allclose(theory, closed, rtol=1e-12)
    measured = ds["growth_rate"].isel(resolution=0).values
    np.testing.assert_allclose(measured, closed, rtol=1e-4)
    assert float(ds["mass_drift"].max()) < 1e-12
    assert float(ds["min_density"].min()) > 0
    # the linear regime: the perturbed amplitude grows by e^{lambda t}
    amp = ds["amplitude"].isel(resolution=0).values
    t = ds["time"].values
    np.testing.assert_allclose(amp, 1e-3 * np.exp(closed[..., None] * t), rtol=2e-4)

    # --verify and plot through the same `meanfield` entry point, in this process (the
    # subprocess path of --verify: test_resume_recomputes_missing_and_damaged_chunks)
    assert mf.cli.main(["sweep", "--verify", str(out)]) == 0
    assert mf.cli.main(["plot", str(out), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "growth_rate_heatmap_beta_mode.png").stat().st_size > 0
    assert (tmp_path / "plots" / "amplitude_vs_time.png").stat().st_size > 0


def _values(ds) -> dict:
    return {k: np.asarray(ds[k].values) for k in ds.data_vars}


def test_resume_recomputes_missing_and_damaged_chunks(tmp_path):
    ref = tmp_path / "ref.zarr"
    sweep.run_sweep(SMALL, ref, memory="1B", quiet=True)  # one point per chunk: 9 chunks
    out = tmp_path / "cut.zarr"
    plan = sweep.run_sweep(SMALL, out, memory="1B", quiet=True)
    assert plan.num_chunks == 9
    # an interrupted run: chunk 3 never finished; chunk 5's data file damaged
    os.unlink(out / "_sweep" / "done" / "000003")
    files = sorted(
        p for p in (out / "growth_rate").rglob("*") if p.is_file() and p.name != "zarr.json"
    )
    assert len(files) == 9
    files[5].write_bytes(b"garbage!")
    r = _run_cli(["sweep", "--verify", out])
    assert r.returncode == 1 and "chunk" in r.stdout + r.stderr
    with pytest.raises(sweep.StoreDamagedError):
        sweep.load(out)
    with pytest.raises(FileExistsError):
        sweep.run_sweep(SMALL, out, quiet=True)
    with pytest.raises(ValueError, match="grid.eps"):
        sweep.run_sweep(SMALL.replace("eps = 1e-3", "eps = 2e-3"), out, resume=True, quiet=True)
    sweep.run_sweep(SMALL, out, resume=True, quiet=True)
    a, b = _values(sweep.load(ref)), _values(sweep.load(out))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    np.testing.assert_allclose(a["growth_rate"], a["theory_rate"], rtol=1e-4)


def test_sphere_normalised_model_eps_axis_in_float64(tmp_path):
    spec = """
dtype = "float64"
[model]
kind = "continuum"
model = "sa"
[grid]
d = 3
resolution = 8
beta = [1.0, 4.0]
mode = [1, 2, 3]
eps = [1e-3, -1e-3]
[time]
t1 = 1.0
save = 3
rtol = 1e-10
atol = 1e-13
"""
    out = tmp_path / "s2.zarr"
    sweep.run_sweep(spec, out, quiet=True)
    ds = sweep.load(out)
    assert ds["status"].dims == ("resolution", "beta", "mode", "eps")
    assert np.all(ds["status"].values == sweep.OK)
    beta = ds["beta"].values[:, None]
    ell = ds["mode"].values[None, :]
    i = lambda nu: scipy.special.ive(nu, beta)  # noqa: E731
    closed = ell * (ell + 1) * i(ell + 0.5) / (beta * i(0.5))  # sa on S^2: l (l+1) i_l / (beta i_0)
    for j in range(2):  # both signs of eps: the same rate
        measured = ds["growth_rate"].isel(resolution=0, eps=j).values
        np.testing.assert_allclose(measured, closed, rtol=1e-3)
        np.testing.assert_allclose(
            ds["theory_rate"].isel(resolution=0, eps=j).values, closed, rtol=1e-10
        )
    assert float(ds["mass_drift"].max()) < 1e-12


def test_float32_default_and_resolution_loss_is_recorded(tmp_path):
    """float32 (the default dtype) measures the rates to ~1e-3; a sharpening run at a low
    resolution stops with status resolution_lost, recorded per point, not an error."""
    spec = """
[model]
kind = "continuum"
[grid]
resolution = 8
beta = [2.0, 9.0]
mode = [1, 3]
eps = 0.01
[time]
t1 = 0.5
save = 6
"""
    out = tmp_path / "f32.zarr"
    sweep.run_sweep(spec, out, quiet=True)
    ds = sweep.load(out)
    assert ds["growth_rate"].dtype == np.float32
    status = ds["solver_status"].isel(resolution=0).values
    # beta = 2: rates ~ 1, linear over t1 = 0.5; beta = 9: rates ~ 10^2-10^3: clusters form, L = 8 loses them
    assert np.all(status[0] == mf.continuum.OK)
    assert np.all(status[1] == mf.continuum.RESOLUTION_LOST)
    assert np.all(ds["stop_time"].isel(resolution=0).values[1] < 0.5)
    g = ds.isel(resolution=0, beta=0)
    np.testing.assert_allclose(g["growth_rate"].values, g["theory_rate"].values, rtol=2e-2)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            ("[grid]\n", "[grid]\nseeds = 4\n"),
            "grid.seeds does not apply to kind 'continuum': the density solver is deterministic",
        ),
        (("[grid]\n", "[grid]\nn = [8]\n"), "grid.n does not apply to kind 'continuum'"),
        (("mode = [1, 2, 3]", "mode = [1, 8]"), "grid.mode 8 must be < grid.resolution = 8"),
        (("mode = [1, 2, 3]", "mode = [0, 1]"), "grid.mode[0] must be >= 1"),
        (("mode = [1, 2, 3]", "mode = [1.5]"), "grid.mode[0] must be an integer"),
        (("eps = 1e-3", "eps = 1.5"), "grid.eps must satisfy 0 < |eps| < 1"),
        (("eps = 1e-3", "eps = 0"), "grid.eps must satisfy 0 < |eps| < 1"),
        (("d = 2", "d = 4"), "grid.d must be <= 3"),
        (("resolution = 8", "resolution = 2"), "grid.resolution must be >= 4"),
        (('model = "usa"', 'model = "softmax"'), "unknown model.model 'softmax'"),
        (('model = "usa"', 'model = "sa"'), "model.rescaled applies to model = 'usa' only"),
        (("rescaled = true", "rescaled = 1"), "model.rescaled must be true or false"),
        (('kind = "continuum"', 'kind = ["continuum", "usa"]'), "cannot share a sweep"),
        (
            ("[time]\n", '[time]\nsolver = "rk4"\n'),
            "time.solver does not apply to kind 'continuum'",
        ),
        (("t1 = 8.0", "t1 = -1.0"), "time.t1 must be > 0"),
        (
            ("save = 5", "save = [0.0, 9.0]"),
            "time.save must be at least two increasing times in [0, t1 = 8]",
        ),
        (
            ("[grid]\n", "[grid]\nwidth = 3\n"),
            "unknown key 'width' in [grid]; accepted keys: d, resolution, beta, mode, eps",
        ),
        (
            ('observables = ["growth_rate"', 'observables = ["collapse_gap"'),
            "unknown observable 'collapse_gap' for kind 'continuum'",
        ),
        (
            ("[output]\n", "[output]\ntop_k = 3\n"),
            "output.top_k does not apply to kind 'continuum'",
        ),
        (("rescaled = true", "rescaled = false\n[x]"), "unknown key 'x' in top level"),
    ],
)
def test_bad_continuum_spec_is_one_line_error(patch, message):
    old, new = patch
    assert old in SMALL
    with pytest.raises((ValueError, TypeError)) as e:
        sweep.parse_spec(SMALL.replace(old, new, 1))
    text = str(e.value)
    assert message in text, text
    assert "\n" not in text


def test_overflowing_beta_without_rescaling_is_refused():
    spec = SMALL.replace("rescaled = true", "rescaled = false").replace(
        'dtype = "float64"', 'dtype = "float32"'
    )
    with pytest.raises(
        ValueError, match=r"grid.beta = 100 overflows e\^beta in float32 .*rescaled = true"
    ):
        sweep.parse_spec(spec.replace("beta = [1.0, 4.0, 9.0]", "beta = [1.0, 100.0]"))


def test_cli_bad_spec_and_dry_run(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL.replace("[grid]\n", "[grid]\nseeds = 2\n", 1))
    assert sweep.main([str(bad), "--out", str(tmp_path / "x.zarr")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grid.seeds" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "x.zarr").exists()
    good = tmp_path / "good.toml"
    good.write_text(SMALL)
    assert sweep.main([str(good), "--out", str(tmp_path / "y.zarr"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "continuum resolution=8 d=2: 9 points" in text and "seed" not in text
    assert not (tmp_path / "y.zarr").exists()


def test_plan_memory_and_limits():
    spec = sweep.parse_spec(SMALL.replace("resolution = 8", "resolution = [8, 16]"))
    plan = make_plan(spec, "1GB", devices=1)
    assert [g.n for g in plan.groups] == [8, 16]  # one compilation per (resolution, d)
    assert plan.groups[1].point_bytes > plan.groups[0].point_bytes > 0
    assert plan.batch_shape == (3, 3, 1)  # beta, mode, the placeholder seed
    with pytest.raises(sweep.plan.ResourceLimitError, match="continuum resolution=8 d=2"):
        plan.check(device_memory=(plan.groups[1].point_bytes, 10**12))
    layout = sweep.plan.store_layout(plan)
    assert layout["dims"] == ["resolution", "beta", "mode"]
    assert len(layout["chunks"]) == 3
    assert layout["variables"]["amplitude"]["dims"] == ["time"]
    assert layout["variables"]["solver_status"]["dtype"] == "int8"
