"""Tokens in R^d (``SelfAttention(geometry="euclidean")``, issue 29) from the command line and in
sweeps: the same numbers as ``mf.simulate``; the observables of unit tokens (energy, cluster
counts) and the renormalising step are one clear error."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import cli, sweep

SMALL = ("--n", "6", "--t1", "0.4", "--dt", "0.1", "--saves", "3", "--no-plots")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")


def test_cli_runs_tokens_in_rd_as_simulate(capsys, tmp_path):
    status = cli.main(
        ["simulate", "--kernel", "sa", "--geometry", "euclidean", *SMALL, "--out", str(tmp_path)]
    )
    out, _ = capsys.readouterr()
    assert status == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["geometry"] == "euclidean" and summary["final_clusters"] is None
    assert summary["failed"] is False
    saved = sweep.load(tmp_path)  # the run's store, run.zarr
    x_final = saved["x"].values[-1]
    model = mf.models.SelfAttention(1.0, geometry="euclidean")
    x0 = mf.sphere.uniform(jax.random.key(0), 6, 3)
    traj = mf.simulate(model, x0, t1=0.4, dt=0.1, ts=np.linspace(0, 0.4, 3))
    np.testing.assert_allclose(x_final, np.asarray(traj.xs[-1]), rtol=1e-6)
    # tokens in R^d leave the sphere (V = I: they grow like e^t)
    assert np.all(np.linalg.norm(x_final, axis=-1) > 1.2)
    # no cluster count (of unit tokens) and no energy: absent, not NaN
    assert "clusters" not in saved and "energy" not in saved


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--normalization", "pre"], "geometry='euclidean' has no layer norm"),
        (["--step", "renormalize", "--solver", "euler"], "geometry='euclidean' has no sphere"),
    ],
)
def test_cli_refuses_bad_combinations(capsys, tmp_path, args, needle):
    status = cli.main(
        ["simulate", "--kernel", "sa", "--geometry", "euclidean", *args, *SMALL]
        + ["--out", str(tmp_path)]
    )
    _, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1 and needle in lines[0], lines


def _spec(model: str = "", output: str = "", time: str = "") -> str:
    return (
        f'[model]\nkind = "sa"\ngeometry = "euclidean"\n{model}\n[grid]\nn = [6]\nbeta = [1.0, 2.0]\n'
        f"seeds = 2\n[time]\nt1 = 0.4\ndt = 0.1\nsave = 3\n{time}\n{output}"
    )


def test_sweep_of_tokens_in_rd_equals_simulate(tmp_path):
    spec = sweep.parse_spec(_spec())
    assert spec.data["output"]["observables"] == ["collapse_gap"]  # nothing of unit tokens
    sweep.run_sweep(spec, tmp_path / "s.zarr", quiet=True)
    ds = sweep.load(tmp_path / "s.zarr")
    assert np.all(ds["status"].values == sweep.OK)
    for beta in (1.0, 2.0):
        model = mf.models.SelfAttention(beta, geometry="euclidean")
        for seed in (0, 1):
            x0 = mf.sphere.uniform(jax.random.key(seed), 6, 3)
            traj = mf.simulate(model, x0, t1=0.4, dt=0.1, ts=spec.ts)
            got = ds["collapse_gap"].sel(seed=seed, n=6, beta=beta).values
            np.testing.assert_allclose(got, np.asarray(traj.collapse_gap), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "output, time, needle",
    [
        ('[output]\nobservables = ["collapse_gap", "clusters"]', "", "'clusters' is an observable"),
        ('[output]\nobservables = ["final_clusters"]', "", "of tokens on the sphere"),
        (
            "",
            'solver = "euler"\nstep = "renormalize"',
            "model.geometry = 'euclidean' has no sphere",
        ),
    ],
)
def test_sweep_refuses_sphere_observables(output, time, needle):
    with pytest.raises((ValueError, TypeError)) as e:
        sweep.parse_spec(_spec(output=output, time=time))
    assert needle in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)
