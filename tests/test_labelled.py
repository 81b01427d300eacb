"""One result format (issue 46, item 4): a run is an xarray Dataset (``Trajectory.to_xarray``),
``meanfield simulate --out DIR`` writes it to ``DIR/run.zarr``, a one-point sweep store that
``mf.sweep.load`` opens as the same Dataset, and a phase diagram over a list of ``n`` is labelled
data whose ``n`` slices are the single-``n`` calls (``meanfield._labelled``)."""

from __future__ import annotations

import functools
import json

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import meanfield as mf
from meanfield import cli, phase_diagram
from meanfield._labelled import RUN_STORE, write_run


@functools.cache  # one compilation per scheme for the whole file
def _run(normalization: str = "post"):
    model = mf.kernels.make("usa", d=3, beta=1.5, normalization=normalization)
    x0 = mf.sphere.uniform(jax.random.key(3), 5, 3)
    traj = mf.simulate(
        model,
        x0,
        t1=0.3,
        dt=0.1,
        ts=[0.0, 0.1, 0.3],
        observables={"first": lambda x: x[0], "gap2": lambda x: 2 * mf.metrics.collapse_gap(x)},
    )
    return model, traj


def test_to_xarray_holds_the_trajectory_arrays_unchanged():
    model, traj = _run("pre")  # a scheme with a radius: radius over (time, token)
    aux = model.default_aux(5)
    ds = traj.to_xarray(model, aux=aux, attrs={"t1": 0.3, "solver": "rk2", "flag": True})
    assert dict(ds.sizes) == {"time": 3, "token": 5, "dim": 3, "first_1": 3}
    np.testing.assert_array_equal(ds["time"].values, np.asarray(traj.ts))
    assert ds["time"].dtype == np.asarray(traj.ts).dtype
    np.testing.assert_array_equal(ds["token"].values, np.arange(5))
    np.testing.assert_array_equal(ds["dim"].values, np.arange(3))
    assert ds["x"].dims == ("time", "token", "dim")
    np.testing.assert_array_equal(ds["x"].values, np.asarray(traj.xs))
    assert ds["radius"].dims == ("time", "token")
    np.testing.assert_array_equal(ds["radius"].values, np.asarray(traj.radius))
    np.testing.assert_array_equal(ds["collapse_gap"].values, np.asarray(traj.collapse_gap))
    np.testing.assert_array_equal(ds["energy"].values, np.asarray(traj.energy))
    assert ds["first"].dims == ("time", "first_1")
    np.testing.assert_array_equal(ds["first"].values, np.asarray(traj.observables["first"]))
    np.testing.assert_array_equal(ds["gap2"].values, np.asarray(traj.observables["gap2"]))
    np.testing.assert_array_equal(ds["aux"].values, np.asarray(aux))
    assert float(ds["stop_time"]) == float(traj.stop_time)
    assert int(ds["num_steps"]) == int(traj.num_steps) == 3
    assert not bool(ds["stopped"]) and int(ds["failure"]) == 0
    assert int(ds["status"]) == mf.sweep.OK
    a = ds.attrs
    assert (a["result"], a["model"], a["model.beta"], a["model.normalization"]) == (
        "run",
        "usa",
        1.5,
        "pre",
    )
    assert (a["n"], a["d"], a["t1"], a["solver"], a["flag"]) == (5, 3, 0.3, "rk2", 1)
    assert a["meanfield_version"] == mf.__version__ and a["jax_version"] == jax.__version__
    assert json.loads(a["spec_json"])["model.beta"] == 1.5 and len(a["spec_hash"]) == 64


def test_to_xarray_status_failed_and_refusals():
    model, traj = _run()
    plain = traj.to_xarray()
    bad = eqx.tree_at(lambda t: t.failed, traj, jnp.asarray(True))
    assert int(bad.to_xarray()["status"]) == mf.sweep.FAILED and int(plain["status"]) == mf.sweep.OK
    assert "radius" not in plain and "model" not in plain.attrs
    with pytest.raises(TypeError, match="attribute 'x0' must be a number, string"):
        traj.to_xarray(attrs={"x0": object()})
    with pytest.raises(ValueError, match="attribute 'spec_hash' is not accepted"):
        traj.to_xarray(attrs={"spec_hash": "abc"})
    with pytest.raises(ValueError, match=r"takes one run: ts has shape \(1, 3\)"):
        jax.tree.map(lambda v: v[None], traj).to_xarray()
    with pytest.raises(ValueError, match=r"aux must hold one label per token, shape \(5, ...\)"):
        traj.to_xarray(aux=np.zeros(4))


def test_run_store_opens_as_the_dataset_and_replaces_only_a_run(tmp_path):
    model, traj = _run("pre")
    ds = traj.to_xarray(model, attrs={"t1": 0.3})
    path = write_run(tmp_path / RUN_STORE, ds)
    for opened in (mf.sweep.load(path), mf.sweep.load(tmp_path)):  # the store or its directory
        xr.testing.assert_identical(opened.load().drop_attrs(), ds.drop_attrs())
        assert {k: opened.attrs[k] for k in ds.attrs} == ds.attrs
        assert (opened.attrs["chunks_done"], opened.attrs["chunks_total"]) == (1, 1)
    assert mf.sweep.verify(path) == []
    xr.testing.assert_equal(xr.open_zarr(path).load(), ds)  # a plain zarr store too
    # written again: replaced (no leftovers beside it); anything else there is refused
    write_run(path, ds.assign(collapse_gap=ds.collapse_gap * 0))
    assert float(mf.sweep.load(path)["collapse_gap"].sum()) == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_STORE]
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match="exists and is not the store of a run"):
        write_run(tmp_path / "other", ds)
    # a NaN saved value: status failed in the Dataset and in the store, which still verifies
    nan = jnp.asarray([0.1, 0.2, np.nan], traj.energy.dtype)
    bad = eqx.tree_at(lambda t: t.energy, traj, nan).to_xarray(model)
    assert int(bad["status"]) == mf.sweep.FAILED
    failed = mf.sweep.load(write_run(tmp_path / "failed.zarr", bad))
    assert int(failed["status"]) == mf.sweep.FAILED and np.isnan(float(failed["energy"][-1]))


def test_plot_refuses_a_run_store_in_one_line(tmp_path, capsys):
    model, traj = _run("pre")
    path = write_run(tmp_path / RUN_STORE, traj.to_xarray(model))
    assert cli.main(["plot", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is the store of one run (meanfield simulate)" in err[0]


_ARGS = ["--n", "6", "--d", "3", "--beta", "2", "--t1", "0.2", "--dt", "0.05", "--saves", "3"]


def test_simulate_out_is_the_python_run(tmp_path):
    assert cli.main(["simulate", *_ARGS, "--seed", "4", "--out", str(tmp_path), "--no-plots"]) == 0
    stored = mf.sweep.load(tmp_path).load()
    plain = xr.open_zarr(tmp_path / RUN_STORE).load()
    model = mf.kernels.make("usa", d=3, beta=2.0)
    x0 = mf.sphere.uniform(jax.random.key(4), 6, 3)
    traj = mf.simulate(
        model,
        x0,
        t1=0.2,
        dt=0.05,
        solver="rk2",
        ts=np.linspace(0.0, 0.2, 3),
        observables={"clusters": lambda x: mf.metrics.num_clusters(x, 0.1)},
        adjoint=diffrax.ForwardMode(),
    )
    ds = traj.to_xarray(model, aux=model.default_aux(6))
    # the Python run's Dataset, and the initial states as drawn (x at time 0: them renormalised)
    ds = ds.assign(x0=(("token", "dim"), np.asarray(x0)))
    assert stored["x0"].dtype == np.asarray(x0).dtype and "initial" in stored["x0"].description
    xr.testing.assert_identical(stored.drop_attrs(), ds.drop_attrs())
    xr.testing.assert_equal(plain, ds)
    a = stored.attrs
    assert (a["model"], a["model.beta"], a["n"], a["d"], a["seed"], a["t1"], a["dt"]) == (
        "usa",
        2.0,
        6,
        3,
        4,
        0.2,
        0.05,
    )
    assert (a["solver"], a["result"], a["meanfield_version"]) == ("rk2", "run", mf.__version__)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final_collapse_gap"] == float(stored["collapse_gap"][-1])
    # run.zarr is the one numeric format: no observables.npz beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_STORE, "summary.json"]


def test_simulate_refuses_an_out_store_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / RUN_STORE).write_text("not a store")
    assert cli.main(["simulate", *_ARGS, "--out", str(tmp_path), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not the store of a run" in err[0]
    assert not (tmp_path / "summary.json").exists()  # refused before the run


_PD = {"seeds": 3, "t1": 0.4, "checkpoints": 3}


@pytest.mark.parametrize("sweep", [phase_diagram.sa_phase_diagram, phase_diagram.usa_phase_diagram])
def test_phase_diagram_over_two_n_is_the_single_calls_labelled(sweep):
    key, betas = jax.random.key(1), [0.5, 3.0]
    ds = sweep(key, betas, n=[4, 6], per_seed=True, **_PD)
    assert dict(ds.sizes) == {"n": 2, "beta": 2, "time": 3, "seed": 3}
    assert ds["n"].values.tolist() == [4, 6] and ds["beta"].values.tolist() == betas
    for n in (4, 6):
        one = sweep(key, betas, n=n, per_seed=True, **_PD)
        np.testing.assert_array_equal(ds["time"].values, one.times)
        np.testing.assert_array_equal(ds["fraction"].sel(n=n).values, one.fraction)
        np.testing.assert_array_equal(ds["per_seed"].sel(n=n).values, one.per_seed)
        np.testing.assert_array_equal(ds["steps"].sel(n=n).values, one.steps)
    assert ds["per_seed"].dims == ("n", "beta", "seed", "time")
    assert ds.attrs["function"] == sweep.__name__ and ds.attrs["t1"] == 0.4
    plain = sweep(key, betas, n=(6,), **_PD)  # without per_seed: fraction only
    assert list(plain.data_vars) == ["fraction"]
    np.testing.assert_array_equal(plain["fraction"].sel(n=6).values, ds["fraction"].sel(n=6).values)


def test_phase_diagram_list_of_n_refusals():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="must not repeat a value"):
        phase_diagram.sa_phase_diagram(key, [1.0], n=[4, 4], **_PD)
    with pytest.raises(TypeError, match="n must be an int or a non-empty list of ints"):
        phase_diagram.sa_phase_diagram(key, [1.0], n=[], **_PD)
    with pytest.raises(ValueError, match="x0 fixes n"):
        x0 = np.asarray(mf.sphere.uniform(key, 4, 2))[None]
        phase_diagram.sa_phase_diagram(None, [1.0], n=[4, 6], x0=x0, **_PD)
