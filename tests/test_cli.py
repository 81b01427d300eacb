"""The command line: simulate writes its outputs; user mistakes give one line on stderr, exit 2."""

import json
import subprocess
import sys

import numpy as np
import pytest


def run_cli(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "meanfield", *args], capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_commands():
    p = run_cli("--help")
    assert p.returncode == 0
    for cmd in ("simulate", "reproduce", "sweep", "plot"):
        assert cmd in p.stdout


@pytest.mark.slow
def test_simulate_writes_figures_and_observables(tmp_path):
    (tmp_path / "observables.npz").write_bytes(b"an earlier version's numbers")
    p = run_cli(
        "simulate",
        "--kernel",
        "rope",
        "--n",
        "48",
        "--d",
        "3",
        "--beta",
        "1",
        "--t1",
        "15",
        "--seed",
        "1",
        "--out",
        str(tmp_path),
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["theory_max_energy"] == pytest.approx(np.e / 2, rel=1e-6)
    assert summary["final_energy"] == pytest.approx(np.e / 2, rel=1e-4)  # RoPE reaches the maximum
    assert summary["final_collapse_gap"] > 0.05  # and does not collapse
    import meanfield as mf

    data = mf.sweep.load(tmp_path)  # run.zarr, the one numeric format
    assert data["collapse_gap"].shape == (101,) and data["x"][-1].shape == (48, 3)
    assert not (tmp_path / "observables.npz").exists()  # no longer written; an earlier one removed
    for f in ("configuration.png", "observables.png"):
        assert (tmp_path / f).stat().st_size > 5000


@pytest.mark.slow
def test_simulate_projection_view_and_sa(tmp_path):
    p = run_cli(
        "simulate", "--kernel", "sa", "--n", "16", "--d", "5", "--t1", "1", "--out", str(tmp_path)
    )
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["final_energy"] is None and (tmp_path / "configuration.png").exists()


def test_simulate_published_step_matches_the_api(tmp_path):
    """``--step renormalize`` is ``mf.simulate(..., solver="euler", step="renormalize")``: same final gap."""
    import jax

    import meanfield as mf

    p = run_cli(
        "simulate",
        "--n",
        "12",
        "--d",
        "2",
        "--t1",
        "0.5",
        "--dt",
        "0.05",
        "--solver",
        "euler",
        "--step",
        "renormalize",
        "--seed",
        "3",
        "--out",
        str(tmp_path),
    )
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["step"] == "renormalize"
    x0 = mf.sphere.uniform(jax.random.key(3), 12, 2)
    ts = np.linspace(0.0, 0.5, 101)
    kw = dict(t1=0.5, dt=0.05, solver="euler", ts=ts)
    ren = mf.simulate(mf.kernels.make("usa", d=2), x0, step="renormalize", **kw)
    proj = mf.simulate(mf.kernels.make("usa", d=2), x0, **kw)
    assert s["final_collapse_gap"] == pytest.approx(float(ren.collapse_gap[-1]), rel=1e-5)
    assert (
        abs(float(ren.collapse_gap[-1]) - float(proj.collapse_gap[-1])) > 1e-4
    )  # a different rule


@pytest.mark.parametrize(
    "args, needle",
    [
        (["simulate", "--beta", "-1"], "--beta"),
        (["simulate", "--beta", "abc"], "--beta"),
        (["simulate", "--n", "1"], "--n"),
        (["simulate", "--d", "1"], "--d"),
        (["simulate", "--dt", "0"], "--dt"),
        (["simulate", "--t1", "-2"], "--t1"),
        (["simulate", "--lam", "-1"], "--lam"),
        (["simulate", "--kernel", "nope"], "nope"),
        (["simulate", "--solver", "rk9"], "rk9"),
        (["simulate", "--kernel", "gauge", "--d", "4"], "d"),
        (["simulate", "--kernel", "usa", "--beta", "200", "--t1", "1"], "rescaled"),
        (["simulate", "--solver", "tsit5", "--t1", "1"], "rtol"),
        (["simulate", "--step", "renormalize", "--t1", "1"], "--solver euler"),
        (["simulate", "--step", "sideways"], "sideways"),
        (["reproduce", "nope"], "nope"),
        (["reproduce", "depth", "--quick", "--full"], "--full"),
        (["frobnicate"], "frobnicate"),
    ],
)
def test_bad_arguments_one_line_exit_2(args, needle, tmp_path):
    p = run_cli(*args, "--out", str(tmp_path)) if args[0] == "simulate" else run_cli(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert needle in lines[0]
    assert "Traceback" not in p.stderr


def test_summary_json_takes_numpy_and_jax_scalars():
    """A model's summary value may be a NumPy or JAX scalar (``np.float32``, a 0-d array): the
    summary is still strict JSON, non-finite values as null."""
    import jax.numpy as jnp

    from meanfield import cli as _cli

    text = _cli._dumps(
        {"a": np.float32(1.5), "b": np.float64("nan"), "c": np.array(2), "d": [jnp.asarray(0.25)]}
    )
    assert json.loads(text) == {"a": 1.5, "b": None, "c": 2, "d": [0.25]}
