"""``meanfield simulate --normalization`` (issue 29, ``mf.normalization``): the schemes with a
radius take ``--r0`` and write the radii (``radius`` in ``run.zarr``, ``r0`` and
``final_mean_radius`` in ``summary.json``), the same numbers as ``mf.simulate``; a flag that
applies with another scheme, or ``--r0`` without a radius, is one line on stderr and status 2."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import cli

SMALL = ("--n", "6", "--t1", "0.4", "--dt", "0.1", "--saves", "3", "--no-plots")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")


def _run(capsys, tmp_path, *args):
    status = cli.main(["simulate", *args, *SMALL, "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    return status, out, [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--normalization", "pre", "--r0", "0"], "argument --r0: must be > 0, got 0"),
        (["--normalization", "pre", "--r0", "-1"], "argument --r0: must be > 0"),
        (["--normalization", "pre", "--r0", "nan"], "argument --r0"),
        (
            ["--r0", "2"],
            "--r0 is the initial radius of the schemes with one (--normalization pre, "
            "--normalization mix or --normalization peri), "
            "not --normalization post",
        ),
        (["--normalization", "ngpt", "--r0", "2"], "not --normalization ngpt"),
        (["--kernel", "toeplitz", "--r0", "2"], "--kernel toeplitz takes no --normalization"),
        (
            ["--kernel", "toeplitz", "--normalization", "pre"],
            "--normalization is not a parameter of --kernel toeplitz",
        ),
        (["--alpha", "0.2"], "--alpha = 0.2 applies with --normalization = 'ngpt', not 'post'"),
        (
            ["--kernel", "sa", "--normalization", "pre", "--alpha", "0.5"],
            "--alpha = 0.5 applies with --normalization = 'ngpt', not 'pre'",
        ),
        (
            ["--normalization", "ngpt", "--switch-time", "1"],
            "--switch-time = 1.0 applies with --normalization = 'mix', not 'ngpt'",
        ),
        (["--switch-time", "0.5"], "--switch-time = 0.5 applies with --normalization = 'mix'"),
        (["--normalization", "mix", "--switch-time", "0"], "argument --switch-time: must be > 0"),
        (["--normalization", "nope"], "argument --normalization: invalid choice: 'nope'"),
        (
            ["--normalization", "pre", "--solver", "euler", "--step", "renormalize"],
            "normalization='pre' has a radius: use step='projected'",
        ),
    ],
)
def test_bad_combinations_are_one_line_exit_2(args, needle, tmp_path, capsys):
    status, out, lines = _run(capsys, tmp_path, *args)
    assert status == 2, (status, out, lines)
    assert len(lines) == 1 and "Traceback" not in lines[0] and "usage:" not in lines[0], lines
    assert needle in lines[0], lines[0]
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    "kernel, args, scheme",
    [
        ("usa", ["--normalization", "pre", "--r0", "2"], {"normalization": "pre"}),
        (
            "sa",
            ["--normalization", "mix", "--switch-time", "0.2", "--r0", "1.5"],
            {"normalization": "mix", "switch_time": 0.2},
        ),
        ("rope", ["--normalization", "peri"], {"normalization": "peri"}),
    ],
)
def test_radial_run_writes_the_radii_of_simulate(kernel, args, scheme, tmp_path, capsys):
    status, out, lines = _run(capsys, tmp_path, "--kernel", kernel, *args)
    assert status == 0, lines
    r = json.loads(out)
    r0 = float(args[args.index("--r0") + 1]) if "--r0" in args else None
    assert r["normalization"] == scheme["normalization"]
    assert r["r0"] == (1.0 if r0 is None else r0)
    model = mf.kernels.make(kernel, d=3, **scheme)
    x0 = mf.sphere.uniform(jax.random.key(0), 6, 3)
    traj = mf.simulate(model, x0, t1=0.4, dt=0.1, ts=np.linspace(0, 0.4, 3), r0=r0)
    saved = mf.sweep.load(tmp_path)  # the run's store, run.zarr
    assert saved["radius"].shape == (3, 6) and saved["radius"].dims == ("time", "token")
    np.testing.assert_allclose(saved["radius"].values, np.asarray(traj.radius), rtol=1e-6)
    np.testing.assert_allclose(saved["x"].values[-1], np.asarray(traj.xs[-1]), rtol=1e-6, atol=1e-7)
    assert saved.attrs["r0"] == r["r0"]  # the initial radius, recorded with the settings
    assert r["final_mean_radius"] == pytest.approx(float(np.mean(traj.radius[-1])), rel=1e-6)
    assert (
        json.loads((tmp_path / "summary.json").read_text())["final_mean_radius"]
        == (r["final_mean_radius"])
    )


@pytest.mark.parametrize("scheme", ["post", "ngpt", "scaling"])
def test_sphere_schemes_write_no_radius(scheme, tmp_path, capsys):
    status, out, lines = _run(capsys, tmp_path, "--normalization", scheme)
    assert status == 0, lines
    r = json.loads(out)
    assert "r0" not in r and "final_mean_radius" not in r and r["normalization"] == scheme
    saved = mf.sweep.load(tmp_path)
    assert "radius" not in saved and "r0" not in saved.attrs
