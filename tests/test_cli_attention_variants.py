"""``meanfield simulate`` with the flags of the attention variants (issue 28): masks on every
kernel, ``sa``'s attention normalisations, heads and random weights. A bad value is one line on
stderr and status 2; a masked kernel's JSON has no energy and no theoretical maximum."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meanfield import cli, sweep

SMALL = ("--n", "6", "--t1", "0.1", "--dt", "0.05", "--saves", "3", "--no-plots")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")  # no native-kernel notice among the lines
    monkeypatch.setenv("MPLBACKEND", "Agg")


def _run(capsys, tmp_path, *args):
    status = cli.main(["simulate", *args, *SMALL, "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    return status, out, [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["--kernel", "sa", "--sinkhorn-iters", "0"],
            "argument --sinkhorn-iters: must be >= 1, got 0",
        ),
        (["--kernel", "sa", "--heads", "0"], "argument --heads: must be >= 1, got 0"),
        (["--mask", "nope"], "argument --mask: invalid choice: 'nope'"),
        (["--kernel", "sa", "--attention", "hardmax", "--no-normalized"], "attention='hardmax'"),
        (["--kernel", "sa", "--attention", "bogus"], "argument --attention: invalid choice"),
        (["--kernel", "sa", "--weights", "bad"], "argument --weights: invalid choice"),
        (["--kernel", "sa", "--value", "bad"], "argument --value: invalid choice"),
        (["--kernel", "sa", "--weight-seed", "-1"], "argument --weight-seed: must be >= 0"),
        (["--kernel", "sa", "--weight-seed", "1.5"], "--weight-seed"),
        (["--kernel", "sa", "--tie-tol", "-1"], "argument --tie-tol: must be >= 0"),
        (["--kernel", "sa", "--regen-period", "nan"], "--regen-period"),
        (["--mask", "alibi", "--slope", "-1"], "argument --slope: must be >= 0"),
        (["--mask", "window", "--width", "0"], "argument --width: must be >= 1"),
        (["--kernel", "usa", "--heads", "2"], "--heads is not a parameter of --kernel usa"),
        (
            ["--kernel", "sa", "--alpha", "0.5"],
            "--alpha = 0.5 applies with --normalization = 'ngpt'",
        ),
        (["--slope", "2"], "--slope = 2.0 applies with --mask = 'alibi', not 'none'"),
        (["--mask", "causal", "--window-causal"], "applies with --mask = 'window'"),
        (
            ["--kernel", "sa", "--normalization", "bogus"],
            "argument --normalization: invalid choice",
        ),
        (
            ["--kernel", "sa", "--normalization", "ngpt", "--alpha", "0"],
            "argument --alpha: must be > 0",
        ),
    ],
)
def test_bad_values_are_one_line_exit_2(args, needle, tmp_path, capsys):
    status, out, lines = _run(capsys, tmp_path, *args)
    assert status == 2, (status, out, lines)
    assert len(lines) == 1 and "Traceback" not in lines[0] and "usage:" not in lines[0], lines
    assert needle in lines[0], lines[0]
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("kernel", ["usa", "toeplitz", "rope", "gauge"])
def test_masked_kernel_json_has_no_energy_and_no_maximum(kernel, tmp_path, capsys):
    status, out, lines = _run(capsys, tmp_path, "--kernel", kernel, "--mask", "causal")
    assert status == 0, lines
    r = json.loads(out)
    assert r["mask"] == "causal"
    assert r["final_energy"] is None and r["theory_max_energy"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["theory_max_energy"] is None
    saved = sweep.load(tmp_path)  # the run's store: no energy variable (observables.npz had NaN)
    assert "energy" not in saved and saved.sizes["time"] > 0


def test_unmasked_kernel_keeps_its_maximum(tmp_path, capsys):
    status, out, _ = _run(capsys, tmp_path, "--kernel", "usa", "--beta", "1")
    assert status == 0
    r = json.loads(out)
    assert r["theory_max_energy"] == pytest.approx(np.e / 2, rel=1e-6)
    assert r["final_energy"] is not None


def test_every_new_flag_of_sa(tmp_path, capsys):
    """Every flag at once (``--value -qk``: a choice starting with a dash, joined to its flag);
    ``--mask-normalized`` is left out: with Sinkhorn attention it changes nothing and is refused."""
    args = [
        "--kernel", "sa", "--attention", "sinkhorn", "--sinkhorn-iters", "3",
        "--heads", "2", "--weights", "gaussian", "--value", "-qk", "--weight-seed", "5",
        "--regen-period", "0.05", "--mask", "alibi", "--slope", "0.5",
    ]  # fmt: skip
    status, out, lines = _run(capsys, tmp_path, *args)
    assert status == 0, lines
    r = json.loads(out)
    expected = {
        "attention": "sinkhorn", "sinkhorn_iters": 3, "heads": 2, "weights": "gaussian",
        "value": "-qk", "weight_seed": 5, "regen_period": 0.05, "mask": "alibi", "slope": 0.5,
    }  # fmt: skip
    assert {k: r[k] for k in expected} == expected
    assert r["theory_max_energy"] is None and np.isfinite(r["final_collapse_gap"])


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--attention", "hardmax", "--tie-tol", "1e-3", "--no-include-self"],
            {"attention": "hardmax", "tie_tol": 1e-3, "include_self": False},
        ),
        (
            ["--normalization", "ngpt", "--alpha", "0.3", "--window-causal"],
            {"normalization": "ngpt", "alpha": 0.3, "window_causal": True},
        ),
    ],
    ids=["hardmax", "ngpt-causal-window"],
)
def test_sa_variants_with_a_window_run(args, expected, tmp_path, capsys):
    status, out, lines = _run(
        capsys, tmp_path, "--kernel", "sa", "--mask", "window", "--width", "2", *args
    )
    assert status == 0, lines
    r = json.loads(out)
    assert {k: r[k] for k in expected} == expected and (r["mask"], r["width"]) == ("window", 2)
