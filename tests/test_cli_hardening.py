"""Issue 17, the CLI reproducers of `simulate`, `reproduce` and the argument parser: each gives one
clear line on stderr with exit status 2, a recorded failure with its outputs written (exit 1),
or a correct result (exit 0); never a traceback, a hang or a silently wrong number."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import meanfield as mf
from meanfield import _resources, cli


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")  # no native-kernel notice among the lines
    monkeypatch.setenv("MPLBACKEND", "Agg")


def run(capsys, *argv):
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, [ln for ln in err.splitlines() if ln.strip()]


def one_line_error(capsys, *argv, needle=None):
    status, out, lines = run(capsys, *argv)
    assert status == 2, (status, out, lines)
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0] and "usage:" not in lines[0]
    if needle is not None:
        assert needle in lines[0], lines[0]
    return lines[0]


def strict_json(path: Path):
    """JSON without NaN/Infinity (what other tools can read)."""

    def bad(token):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(path.read_text(), parse_constant=bad)


SMALL = ("--n", "12", "--t1", "0.2", "--saves", "5")


# ------------------------------------------------------------------ --out and OSError


def test_out_under_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    bad = str(tmp_path / "file" / "out")
    one_line_error(capsys, "simulate", *SMALL, "--out", bad, needle="not a writable directory")
    one_line_error(capsys, "reproduce", "depth", "--quick", "--out", bad, needle="--out")


def test_out_that_cannot_be_created(capsys):
    # /proc refuses new directories even to root
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    one_line_error(
        capsys, "simulate", *SMALL, "--out", "/proc/meanfield-test/out", needle="not a writable"
    )


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_out_read_only(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        one_line_error(
            capsys, "simulate", *SMALL, "--out", str(ro), needle="not a writable directory"
        )
        one_line_error(
            capsys, "simulate", *SMALL, "--out", str(ro / "sub"), needle="not a writable directory"
        )
        one_line_error(capsys, "reproduce", "depth", "--quick", "--out", str(ro))
    finally:
        ro.chmod(0o700)


# ------------------------------------------------------------------ resource limits


@pytest.mark.parametrize(
    "args",
    [
        ["--t1", "1e9"],  # was MemoryError: a 745 GiB step grid
        ["--dt", "1e-12"],
        ["--dt", "1e-300"],  # was "Maximum allowed size exceeded"
        # --saves 100000000: refused by the dense-grid rule first (test_a_hundred_million_saves_...)
        ["--n", "1e20"],  # was "get(): incompatible function arguments"
        ["--n", "100000000000000000000"],
        ["--d", "100000000"],
        ["--n", "300000"],  # defaults otherwise: past the work bound (was an n x n matrix)
    ],
)
def test_past_the_limits_refused_before_any_allocation(args, tmp_path, capsys):
    out = tmp_path / "out"
    line = one_line_error(capsys, "simulate", *args, "--out", str(out), needle="simulate needs")
    assert "steps" in line and "saves" in line  # the estimate
    assert not out.exists()  # refused before anything was made


def test_work_refusal_is_forced_away_and_memory_beyond_the_machine_is_not(
    monkeypatch, tmp_path, capsys
):
    line = one_line_error(capsys, "simulate", "--n", "300000", "--out", str(tmp_path / "a"))
    assert "--force" in line and "flop" in line
    # beyond the machine's total memory --force does not help
    line = one_line_error(
        capsys, "simulate", "--t1", "1e9", "--force", "--out", str(tmp_path / "b")
    )
    assert "in total" in line and "--force" not in line
    # a small run over a (lowered) work bound: refused, then run with --force
    monkeypatch.setattr(_resources, "WORK_LIMIT", 1.0)
    one_line_error(capsys, "simulate", *SMALL, "--out", str(tmp_path / "c"), needle="--force")
    status, out, lines = run(capsys, "simulate", *SMALL, "--force", "--out", str(tmp_path / "c"))
    assert status == 0, lines
    assert strict_json(tmp_path / "c" / "summary.json")["failed"] is False


# ------------------------------------------------------------------ numbers out of range


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--seed", str(2**64)], "must be <= 4294967295"),  # was OverflowError
        (["--seed", "-1"], "--seed"),
        (["--seed", "1.5"], "integer"),
        (["--kernel", "toeplitz", "--m", "1e20"], "2^24"),  # was OverflowError
        (["--kernel", "distance-bias", "--lam", "1e300"], "2^24"),
        (["--kernel", "prompt", "--gauge-seed", str(2**40)], "--gauge-seed"),
        (["--kernel", "prompt", "--prompts", "20", "--n", "8"], "--prompts"),
        (["--t1", "inf"], "finite"),
        (["--t1", "nan"], "--t1"),
        (["--dt", "-inf"], "--dt"),
        (["--beta", "1e400"], "--beta"),
        (["--n", "nan"], "integer"),
        (["--lam", "2"], "not a parameter of --kernel usa"),  # a flag of another model
    ],
)
def test_values_out_of_range_one_line(args, needle, tmp_path, capsys):
    one_line_error(capsys, "simulate", *args, "--out", str(tmp_path), needle=needle)


# ------------------------------------------------------------------ argparse


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["simulate", "--out"], "--out"),  # missing value
        (["simulate", "--bogus"], "--bogus"),
        (["simulate", "--n"], "--n"),
        (["reproduce", "--bogus"], "--bogus"),
        (["reproduce", "--out"], "--out"),
        (["simulate", "--kernel"], "--kernel"),
        (["nope"], "nope"),
        (["info", "--bogus"], "--bogus"),
    ],
)
def test_argparse_errors_one_line_no_usage(argv, needle, capsys):
    one_line_error(capsys, *argv, needle=needle)


def test_help_is_status_0(capsys):
    status, out, _ = run(capsys, "simulate", "--help")
    assert status == 0 and "--force" in out and "exit status" in out


# ------------------------------------------------------------------ failed runs


def test_overflowing_run_is_recorded_as_failed_with_its_outputs(tmp_path, capsys):
    # --beta 88.7: e^beta overflows the field in float32 (was "cannot convert float NaN to integer")
    status, out, lines = run(
        capsys, "simulate", "--n", "16", "--t1", "0.1", "--beta", "88.7", "--out", str(tmp_path)
    )
    assert status == 1, lines
    assert not any("Traceback" in ln for ln in lines)
    assert any("the run failed" in ln for ln in lines)
    s = strict_json(tmp_path / "summary.json")
    assert s["failed"] is True and "non-finite" in s["failure"]
    assert s["final_clusters"] is None  # never int(NaN)
    assert json.loads(out.strip().splitlines()[-1])["failed"] is True  # stdout: strict JSON too
    data = mf.sweep.load(tmp_path)  # the failed run's numbers are in its store
    assert data["collapse_gap"].shape == (101,)
    assert int(data["status"]) == mf.sweep.FAILED
    for f in ("configuration.png", "observables.png"):
        assert (tmp_path / f).exists()


def test_underflowing_beta_is_never_a_silent_infinity(tmp_path, capsys):
    # --beta 1e-300 rounds to 0 in float32 (was final_energy: Infinity with failed: false):
    # a one-line refusal, or a run recorded as failed
    status, out, lines = run(
        capsys, "simulate", "--n", "8", "--t1", "0.1", "--beta", "1e-300", "--out", str(tmp_path)
    )
    if status == 2:
        assert len(lines) == 1 and "beta" in lines[0]
    else:
        assert status == 1
        s = strict_json(tmp_path / "summary.json")
        assert s["failed"] is True and "energy" in s["failure"]


def test_json_safe_writes_null_for_non_finite():
    text = cli._dumps({"a": float("inf"), "b": [float("nan"), 1.0], "c": {"d": -float("inf")}})
    assert json.loads(text) == {"a": None, "b": [None, 1.0], "c": {"d": None}}


# ------------------------------------------------------------------ silently wrong


def test_long_step_warns_and_energy_decrease_is_flagged(tmp_path, capsys):
    # the issue's `simulate --n 32 --beta 10 --t1 0.2` (dt = 0.01): dt x rate = 422
    status, out, lines = run(
        capsys, "simulate", "--n", "32", "--beta", "10", "--t1", "0.2", "--out", str(tmp_path)
    )
    assert status == 0, lines
    assert any("--dt = 0.01 is long for the interaction rate" in ln for ln in lines), lines
    assert any("energy decreased" in ln for ln in lines), lines
    s = strict_json(tmp_path / "summary.json")
    assert s["energy_decreases"] > 0 and len(s["warnings"]) == 2
    E = mf.sweep.load(tmp_path)["energy"].values.astype(np.float64)
    assert s["energy_decreases"] == int(
        np.sum(np.diff(E) < -1000 * np.finfo(np.float32).eps * np.abs(E).max())
    )


def test_a_good_run_has_no_warning(tmp_path, capsys):
    status, out, lines = run(capsys, "simulate", "--n", "16", "--t1", "1", "--out", str(tmp_path))
    assert status == 0 and lines == []
    s = strict_json(tmp_path / "summary.json")
    assert (
        s["energy_decreases"] == 0
        and s["warnings"] == []
        and s["failed"] is False
        and s["failure"] is None
    )
    E = mf.sweep.load(tmp_path)["energy"].values.astype(np.float64)
    assert np.all(np.diff(E) >= -1e-4 * E.max())  # the flow increases the energy
    assert isinstance(s["final_clusters"], int) and "steps" in s["estimate"]


# ------------------------------------------------------------------ the console script


@pytest.mark.parametrize(
    "args, status",
    [
        (["simulate", "--bogus"], 2),
        (["simulate", "--t1", "1e9"], 2),
        (["simulate", "--seed", str(2**64)], 2),
    ],
)
def test_console_script(args, status, tmp_path):
    exe = shutil.which("meanfield") or str(Path(sys.executable).with_name("meanfield"))
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "meanfield"]
    env = dict(os.environ, MEANFIELD_NATIVE_QUIET="1")
    p = subprocess.run(
        [*cmd, *args, "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == status, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr


def test_a_hundred_million_saves_are_refused_before_the_grid_exists(capsys):
    """``--saves 100000000`` over ``t1 = 0.1`` (issue 47 item 1): the dense-grid rule, decided from
    the three numbers (``integrate.uniform_saves_problem``) before any grid is allocated."""
    one_line_error(
        capsys, "simulate", "--n", "8", "--t1", "0.1", "--saves", "100000000", needle="dt / 1000"
    )
