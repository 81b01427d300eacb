"""``meanfield reproduce --jobs``: experiments in concurrent spawned processes (issue 32, "use both
cores"), with real processes. The experiments are the stand-ins of ``tests/_fake_experiments``: each
records its process id and whether it ran while its peer ran (a file handshake, no timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meanfield import reproduce


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.setattr(
        reproduce,
        "EXPERIMENTS",
        {
            "one": "_fake_experiments.one",
            "two": "_fake_experiments.two",
            "bad": "_fake_experiments.bad",
        },
    )
    monkeypatch.setattr(reproduce, "PAPERS", ("one", "two"))


_DRIVER = """
import json, sys
from meanfield import cli, reproduce
reproduce.EXPERIMENTS = {"one": "_fake_experiments.one", "two": "_fake_experiments.two", "bad": "_fake_experiments.bad"}
reproduce.PAPERS = tuple(sys.argv[1].split(","))
sys.exit(cli.main(["reproduce", "--quick", "--quiet", "--jobs", "2", "--out", sys.argv[2]]))
"""


def _drive(papers, out):
    """``meanfield reproduce --jobs 2`` with the stand-ins as PAPERS, in a fresh process (the pool of
    processes is not started from the pytest worker itself)."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, "-c", _DRIVER, ",".join(papers), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_two_jobs_run_concurrently_in_other_processes(tmp_path):
    proc = _drive(["one", "two"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    s = {
        name: json.loads((tmp_path / name / "summary.json").read_text()) for name in ("one", "two")
    }
    pids = {s["one"]["settings"]["pid"], s["two"]["settings"]["pid"]}
    assert len(pids) == 2
    assert s["one"]["settings"]["met_peer"] and s["two"]["settings"]["met_peer"]
    assert all(
        v["timings"]["total_s"] >= 0 for v in s.values()
    )  # the whole experiment's time, on disk too
    assert "one: 1/1 checks pass" in proc.stdout and "two: 1/1 checks pass" in proc.stdout
    report = (tmp_path / "REPORT.md").read_text()  # names == PAPERS: the report, in PAPERS's order
    assert "All 2 checks pass." in report
    assert report.index("## one (`one`)") < report.index("## two (`two`)")


def test_one_job_runs_in_this_process_one_after_the_other(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_WAIT_S", "0.3")
    s = reproduce.run_experiments(
        ["two", "one"], tmp_path, quick=True, quiet=True, jobs=1, report=False
    )
    assert list(s) == ["two", "one"]
    assert {v["settings"]["pid"] for v in s.values()} == {os.getpid()}
    assert not s["one"]["settings"]["met_peer"] and not s["two"]["settings"]["met_peer"]
    assert not (tmp_path / "REPORT.md").exists()


def test_a_failing_experiment_is_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_WAIT_S", "0.3")
    proc = _drive(["one", "bad"], tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines()[-1]
        == "meanfield: error: bad experiment: option x must be > 0, got -1"
    )
    assert (tmp_path / "one" / "summary.json").exists()  # what finished stays


def test_a_failing_experiment_in_this_process(fakes, tmp_path):
    with pytest.raises(ValueError, match="bad experiment"):
        reproduce.run_experiments(["bad"], tmp_path, jobs=1)


@pytest.mark.parametrize("jobs", [0, -1, True])
def test_bad_jobs(jobs, tmp_path):
    with pytest.raises(ValueError, match="jobs must be a positive integer or None, got"):
        reproduce.run_experiments(["usa-av"], tmp_path, jobs=jobs)


@pytest.mark.parametrize("jobs", [1.5, "2"])
def test_jobs_of_another_type(jobs, tmp_path):
    with pytest.raises(TypeError):  # ours, or the annotation's under the tests' jaxtyping hook
        reproduce.run_experiments(["usa-av"], tmp_path, jobs=jobs)


def test_unknown_name_and_quick_full(tmp_path):
    with pytest.raises(ValueError, match="unknown experiment 'nope'; accepted: usa-av"):
        reproduce.run_experiments(["nope"], tmp_path)
    with pytest.raises(ValueError, match="quick and full exclude each other"):
        reproduce.run_experiments(["usa-av"], tmp_path, quick=True, full=True)


def test_default_jobs():
    assert reproduce.default_jobs(1) == 1
    assert 1 <= reproduce.default_jobs(5) <= min(5, len(os.sched_getaffinity(0)))
