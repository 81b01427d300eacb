"""The sweep reproducers of issue 17 (resource limits, bad paths, usage errors): each one
is a one-line error with exit status 2, or a refusal that carries the estimate, checked
before anything is allocated (``--dry-run`` included, which never allocates)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meanfield import sweep
from meanfield._resources import WORK_LIMIT, ResourceLimitError, run_cost
from meanfield.kernels import USA
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import plan as sweep_plan
from meanfield.sweep import store as sweep_store

ROOT = Path(__file__).resolve().parents[1]

OK = """
[model]
kind = "usa"
[grid]
n = [8]
beta = [1.0]
seeds = 2
[time]
t1 = 0.5
dt = 0.1
save = 3
"""


def _spec(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _one_line_error(capsys, argv, entry=sweep_cli.main) -> str:
    """Run the CLI entry point in-process; assert status 2 and exactly one line on stderr."""
    rc = entry([str(a) for a in argv])
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2, (rc, cap.err)
    assert len(lines) == 1, cap.err
    assert "Traceback" not in cap.err and "usage:" not in cap.err
    return lines[0]


# (spec text, the words the one line must contain)
REPRODUCERS = [
    pytest.param(
        OK.replace("dt = 0.1", "dt = 1e-12"), ["5e+11 steps per point", "int32"], id="dt=1e-12"
    ),
    pytest.param(
        OK.replace("t1 = 0.5", "t1 = 1e12"), ["steps per point", "lengthen time.dt"], id="t1=1e12"
    ),
    pytest.param(
        OK.replace("n = [8]", "n = [8]\nd = 1e8"),
        ["grid.d must be an integer", "without a decimal"],
        id="d=1e8-float",
    ),
    pytest.param(
        OK.replace("n = [8]", "n = [8]\nd = 2000000000"), ["of memory", "in total"], id="d=2e9"
    ),
    pytest.param(
        OK.replace("n = [8]", "n = [8]\nd = 10000000000"),
        ["grid.d must be <= 2147483647"],
        id="d=1e10",
    ),
    pytest.param(
        OK.replace("beta = [1.0]", "beta = {c = [1.0], p = 1000.0}"),
        ["grid.beta", "10^903", "not a finite positive float32"],
        id="beta-power-1000",
    ),
    # n = 1e8 needs ~11 GiB a point: refused for its work, or first for its memory when less than that
    # is free on this machine (a loaded CI box); either line carries the estimate and --force
    pytest.param(
        OK.replace("n = [8]", "n = [100000000]"), ["flop", "9 steps", "--force"], id="n=1e8"
    ),
    # the work refusal on its own: n = 3e6 needs ~0.3 GiB a point, so no machine refuses it for memory
    pytest.param(
        OK.replace("n = [8]", "n = [3000000]"),
        ["flop", "9 steps and 3 saves per point", "--force"],
        id="n=3e6",
    ),
    pytest.param(
        OK.replace("seeds = 2", "seeds = 1e9"),
        ["grid.seeds must be an integer"],
        id="seeds=1e9-float",
    ),
    pytest.param(
        OK.replace("seeds = 2", "seeds = 1000000000"),
        ["grid.seeds must be <= 10000000"],
        id="seeds=1e9",
    ),
    pytest.param(
        OK.replace("seeds = 2", "seed = 2147483000\nseeds = 1000"),
        ["int32 PRNG keys"],
        id="seed-overflow",
    ),
    pytest.param(
        OK.replace("save = 3", "save = 1e8"), ["time.save must be an integer"], id="save=1e8-float"
    ),
    pytest.param(
        OK.replace("save = 3", "save = 100000000"), ["time.save must be <= 1000000"], id="save=1e8"
    ),
    pytest.param(
        OK.replace("n = [8]", f"n = {list(range(2, 1002))}")
        .replace("beta = [1.0]", f"beta = {[float(b) for b in np.linspace(0.1, 5, 1000)]}")
        .replace("seeds = 2", "seeds = 1000"),
        ["1e+09 points", "flop", "--force"],
        id="grid-1000^3",
    ),
]


@pytest.mark.parametrize("text,words", REPRODUCERS)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_reproducers_are_one_line_errors(tmp_path, capsys, text, words, dry_run):
    spec = _spec(tmp_path, text)
    out = tmp_path / "out.zarr"
    line = _one_line_error(capsys, [spec, "--out", out] + (["--dry-run"] if dry_run else []))
    for w in words:
        assert w in line, line
    assert not out.exists()  # refused before anything was written


def test_refusals_carry_the_estimate_and_force_lifts_the_soft_ones():
    spec = sweep.parse_spec(OK.replace("n = [8]", "n = [100000000]"))
    plan = sweep.make_plan(spec, "2GB", devices=1)
    with pytest.raises(ResourceLimitError, match="flop") as info:
        plan.check(device_memory=(2**40, 2**40))
    # the estimate of meanfield simulate (run_cost): 0.5 / 0.1 + 3 + 1 = 9 steps of 2 stages
    # over n^2 pairs of (4 d + 8) flop, plus the observables at the 3 saves, for 2 points
    work = run_cost(
        n=10**8,
        d=3,
        t1=0.5,
        dt=0.1,
        saves=3,
        itemsize=4,
        batch=2,
        footprint=USA(1.0).footprint(10**8, 3),
        save_states=False,
        observables=4,
        clusters=False,
    ).work
    assert 2 * 9 * 2 * 1e16 * 20 <= work <= 2 * (9 * 2 + 2 * 3) * 1e16 * 20
    assert (
        f"~{work:.2g} flop for 2 points (9 steps and 3 saves per point" in str(info.value)
        and work > WORK_LIMIT
    )
    plan.check(force=True, device_memory=(2**40, 2**40))  # forced: the work bound is lifted
    # one chunk past the device's total memory is refused even with force
    big = sweep.make_plan(
        sweep.parse_spec(OK.replace("n = [8]", "n = [8]\nd = 100000000")), "2GB", devices=1
    )
    with pytest.raises(ResourceLimitError, match="in total"):
        big.check(force=True, device_memory=(16 * 2**30, 16 * 2**30))
    # past the available (not the total) memory: refused unless force
    with pytest.raises(ResourceLimitError, match="--force"):
        big.check(device_memory=(16 * 2**30, 64 * 2**30))
    big.check(force=True, device_memory=(16 * 2**30, 64 * 2**30))
    # the estimate counts at least the states: 8 x 1e8 float32 x (2 stages x 2 + 6) copies
    assert big.cost(big.groups[0], 1).bytes >= 10 * 8 * 10**8 * 4


def test_step_count_bound_cannot_be_forced():
    plan = sweep.make_plan(sweep.parse_spec(OK.replace("dt = 0.1", "dt = 1e-12")), "2GB", devices=1)
    with pytest.raises(ResourceLimitError, match="int32"):
        plan.check(force=True)


def test_chunk_count_and_disk_bounds(tmp_path, monkeypatch):
    spec = sweep.parse_spec(OK.replace("seeds = 2", "seeds = 3000"))
    plan = sweep.make_plan(spec, "1B", devices=1)  # one point per chunk
    assert plan.num_chunks == 3000
    monkeypatch.setattr(sweep_plan, "MAX_CHUNKS", 1000)
    with pytest.raises(ResourceLimitError, match="3e\\+03 chunks"):
        plan.check()
    plan.check(force=True)
    monkeypatch.setattr(sweep_plan, "_free_space", lambda path: 1000)
    with pytest.raises(ResourceLimitError, match="free there"):
        sweep.make_plan(spec, "2GB", devices=1).check(out=tmp_path / "x.zarr")


def test_dry_run_allocates_nothing_and_lists_no_chunks(tmp_path, capsys, monkeypatch):
    """--dry-run of the 1000 x 1000 x 1000 grid prints the plan (20 groups shown) and the
    refusal without listing its chunks or creating anything."""
    text = REPRODUCERS[-1].values[0]
    spec = _spec(tmp_path, text)

    def boom(self):
        raise AssertionError("the chunks were listed")

    monkeypatch.setattr(sweep_plan.Plan, "chunks", property(boom))
    line = _one_line_error(capsys, [spec, "--out", tmp_path / "x.zarr", "--dry-run"])
    assert "flop" in line
    rc = sweep_cli.main([str(spec), "--out", str(tmp_path / "x.zarr"), "--dry-run", "--force"])
    out = capsys.readouterr().out
    assert rc == 0 and "1000000000 points" in out and "... and 980 more groups" in out
    assert "estimate:" in out and "flop in all" in out
    assert not (tmp_path / "x.zarr").exists()


# --------------------------------------------------------------------------- paths


def test_out_under_a_file(tmp_path, capsys):
    spec = _spec(tmp_path, OK)
    f = tmp_path / "file.txt"
    f.write_text("x")
    line = _one_line_error(capsys, [spec, "--out", f / "x.zarr"])
    assert "is a file, not a directory" in line and str(f) in line
    line = _one_line_error(capsys, [spec, "--out", f])  # the store path itself is a file
    assert "already exists" in line


@pytest.mark.parametrize("err", [errno.EACCES, errno.EROFS], ids=["unwritable", "read-only"])
def test_out_unwritable_or_read_only(tmp_path, capsys, monkeypatch, err):
    """(The tests may run as root, which ignores permissions: the file system's refusal is
    injected where the store is created.)"""
    spec = _spec(tmp_path, OK)
    real = os.mkdir

    def refuse(path, *a, **k):
        if ".creating-" in str(path):
            raise OSError(err, os.strerror(err), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(sweep_store.os, "mkdir", refuse)
    line = _one_line_error(capsys, [spec, "--out", tmp_path / "x.zarr"])
    assert f"cannot create store {tmp_path / 'x.zarr'}: {os.strerror(err)}" in line
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".x.zarr")]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("limits")
    out = base / "ok.zarr"
    sweep.run_sweep(OK, out, quiet=True)
    return out


def test_plot_out_under_a_file_or_unwritable(small_store, tmp_path, capsys, monkeypatch):
    f = tmp_path / "file.txt"
    f.write_text("x")
    line = _one_line_error(capsys, [small_store, "--out", f / "plots"], entry=sweep_cli.plot_main)
    assert "cannot write the plots" in line
    line = _one_line_error(capsys, [small_store, "--out", f], entry=sweep_cli.plot_main)
    assert "cannot write the plots" in line

    from matplotlib.figure import Figure

    def refuse(self, path, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(Figure, "savefig", refuse)
    line = _one_line_error(
        capsys, [small_store, "--out", tmp_path / "plots"], entry=sweep_cli.plot_main
    )
    assert line.startswith("meanfield plot: error: Read-only file system: ")


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    "argv,words",
    [
        (["{spec}"], "required: --out"),
        (["{spec}", "--out", "{out}", "--bogus"], "unrecognized arguments: --bogus"),
        (
            ["{spec}", "--out", "{out}", "--memory", "-1GB"],
            "memory must be > 0 and finite, got '-1GB'",
        ),
        (
            ["{spec}", "--out", "{out}", "--memory=-1GB"],
            "memory must be > 0 and finite, got '-1GB'",
        ),
        (["{spec}", "--out", "{out}", "--memory"], "expected one argument"),
        ([], "required: spec"),
        (["--verify", "{out}", "{spec}"], "--verify STORE takes no spec"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, capsys, argv, words):
    spec = _spec(tmp_path, OK)
    args = [a.format(spec=spec, out=tmp_path / "x.zarr") for a in argv]
    line = _one_line_error(capsys, args)
    assert line.startswith("meanfield sweep: error: ") and words in line, line
    assert not (tmp_path / "x.zarr").exists()


def test_plot_usage_errors_are_one_line(tmp_path, capsys):
    assert "required: store" in _one_line_error(capsys, [], entry=sweep_cli.plot_main)
    assert "unrecognized arguments" in _one_line_error(
        capsys, ["x.zarr", "--bogus"], entry=sweep_cli.plot_main
    )
    assert "sweep store not found" in _one_line_error(
        capsys, [tmp_path / "none.zarr"], entry=sweep_cli.plot_main
    )


def test_meanfield_command_reports_sweep_errors_in_one_line(tmp_path):
    """The same through the installed entry point `python -m meanfield sweep` (a process)."""
    spec = _spec(tmp_path, OK)
    r = subprocess.run(
        [sys.executable, "-m", "meanfield", "sweep", str(spec), "--memory", "-1GB"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "meanfield sweep: error: the following arguments are required: --out"
    ]
