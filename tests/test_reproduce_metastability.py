"""``meanfield reproduce metastability``: every check passes and its numbers are the documented ones."""

import json
import math

import numpy as np
import pytest
from _figures import FigureAudit

from meanfield.reproduce import EXPERIMENTS, PAPERS
from meanfield.reproduce import metastability as rm


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    with FigureAudit() as figures:  # every figure it writes, checked as it is saved
        s = rm.run(out, quick=True, quiet=True)
    assert figures.saved and not figures.problems, "\n".join(figures.problems)
    return s, out


@pytest.mark.slow
def test_all_checks_pass_with_numbers(summary):
    s, out = summary
    rows = {c["name"]: c for c in s["checks"]}
    assert set(rows) == {
        "staircase_levels",
        "first_merge_time",
        "plateau_growth_rate",
        "dotm_staircase",
        "dotm_simulated_levels",
        "dotm_merge_times",
    }
    assert all(c["pass"] for c in s["checks"]), [c for c in s["checks"] if not c["pass"]]
    assert rows["plateau_growth_rate"]["theory"] == pytest.approx(1 - math.cos(0.8))
    assert 0 < rows["first_merge_time"]["measured"] <= rows["first_merge_time"]["tolerance"]
    assert rows["staircase_levels"]["measured"] < 0.01
    on_disk = json.loads((out / "metastability" / "summary.json").read_text())
    assert on_disk["checks"] == s["checks"]
    assert (out / "metastability" / "metastability.png").exists()
    # every simulated merge lands in the save bracket around the quadrature
    for r in s["settings"]["merge_runs"]:
        lo, hi = r["bracket"]
        assert lo / r["save_ratio"] <= r["quadrature"] <= hi * r["save_ratio"] and not r["failed"]
    # dotm's example by simulation, to t ~ e^180 at beta = 4000: every merge in its save bracket
    dotm = s["settings"]["dotm_runs"]
    assert [r["beta"] for r in dotm] == [500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0]
    for r in dotm:
        assert not r["failed"] and len(r["log_merge_bracket"]) == 4
        for (lo, hi), q in zip(r["log_merge_bracket"], r["log_merge_theory"]):
            assert lo - r["log_spacing"] <= q <= hi + r["log_spacing"]
    assert dotm[-1]["log_merge_theory"][-1] > 170


def test_dotm_port_agrees_and_can_fail():
    th = 0.5 * np.array([0, 0.5, 2, 4, 7]) * np.log(1000.0) / np.sqrt(1000.0)
    levels, times = rm.dotm_staircase(th)
    np.testing.assert_allclose(levels, [0.2, 0.28, 0.44, 0.52, 1.0])
    assert times[0] == 0 and np.all(np.diff(times) > 0)
    # a different configuration changes the predicted merge order and levels
    other, _ = rm.dotm_staircase(np.array([0.0, 1.0, 1.1, 1.2, 3.0]))
    assert not np.allclose(other, levels)


def test_registered_but_not_in_the_default_run():
    assert EXPERIMENTS["metastability"] == "meanfield.reproduce.metastability"
    assert "metastability" not in PAPERS


def test_continuum_row_is_reused(tmp_path):
    (tmp_path / "continuum").mkdir()
    row = {
        "name": "cluster_count",
        "theory": 0.0,
        "measured": 0.2,
        "tolerance": 0.5,
        "pass": True,
        "note": "x",
    }
    (tmp_path / "continuum" / "summary.json").write_text(json.dumps({"checks": [row]}))
    got = rm._continuum_row(tmp_path)
    assert (
        got["name"] == "first_plateau_clusters"
        and got["measured"] == 0.2
        and "continuum" in got["note"]
    )
    assert rm._continuum_row(tmp_path / "nothing") is None
