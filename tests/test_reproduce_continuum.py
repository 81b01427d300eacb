"""End to end: `meanfield reproduce continuum --quick` (docs/math/continuum.md, issue 19) and its numbers."""

import json
import subprocess

import numpy as np
import pytest
from _figures import audit_record, audited_command

from meanfield.reproduce import EXPERIMENTS, PAPERS
from meanfield.reproduce import continuum as repro


@pytest.mark.slow
def test_reproduce_continuum_quick(tmp_path):
    audit = tmp_path / "figure-audit.json"  # every figure it writes, checked as it is saved
    proc = subprocess.run(
        audited_command(
            audit, "reproduce", "continuum", "--quick", "--quiet", "--out", str(tmp_path)
        ),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = audit_record(audit)
    assert figures["saved"] and not figures["problems"], figures
    out = tmp_path / "continuum"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == "continuum" and summary["quick"] is True
    checks = {c["name"]: c for c in summary["checks"]}
    assert set(checks) == {
        "dispersion_relation",
        "particle_dispersion",
        "cluster_count",
        "particle_to_density",
        "mass_and_positivity",
    }
    for c in checks.values():
        assert {"name", "theory", "measured", "tolerance", "pass", "note"} <= set(c)
        assert {"tolerance_kind", "rule"} <= set(c)
    assert all(c["pass"] for c in checks.values()), [c for c in checks.values() if not c["pass"]]
    # our own tolerances, independent of the summary's
    assert checks["dispersion_relation"]["measured"] < 1e-3
    assert checks["particle_dispersion"]["measured"] < 5e-2
    assert checks["cluster_count"]["measured"] <= 1.0
    assert abs(checks["particle_to_density"]["measured"] + 0.5) < 0.1
    assert checks["mass_and_positivity"]["measured"] < 1e-5
    plateaus = summary["settings"]["cluster_plateaus"]
    assert len(plateaus) >= 4 and all(4 <= float(b) <= 40 for b in plateaus)
    assert (
        summary["settings"]["particle_n"]["2"] >= 2000 and summary["settings"]["cluster_n"] >= 1000
    )
    for fig in ("growth_rates.png", "circle_density.png", "cluster_count.png"):
        assert (out / fig).stat().st_size > 10_000
    data = np.load(out / "continuum_data.npz")
    assert data["solver_d3_beta4"].shape == (6,)


def test_registered_and_in_the_report():
    assert EXPERIMENTS["continuum"] == "meanfield.reproduce.continuum"
    assert "continuum" in PAPERS
    q, f = repro.settings_for(True), repro.settings_for(False)
    assert q["modes"] == [1, 2, 3, 4, 5, 6] and q["betas"] == [1.0, 4.0, 9.0]
    assert min(q["particle_n"].values()) >= 2000 and q["cluster_n"] >= 1000
    assert max(q["w1_n"]) / min(q["w1_n"]) >= 10**1.5 * 0.99
    assert f["cluster_n"] > q["cluster_n"] and max(f["w1_n"]) > max(q["w1_n"])


def test_first_plateau_and_cluster_count():
    counts = np.array([1, 1, 5, 14, 9, 6, 6, 6, 6, 5, 5, 5, 5])
    assert repro._first_plateau(counts, 4) == (5, 6)
    assert repro._first_plateau(np.array([1, 3, 4, 5]), 4) == (3, 5)  # no plateau: the last value
    th = np.concatenate(
        [np.full(100, 0.0), np.full(100, 2.0), np.full(5, 4.0), [5.0]]
    )  # a straggler at 5
    x = np.stack([np.cos(th), np.sin(th)], 1)
    assert repro._count_clusters_circle(x, 0.1, 0.01) == 3  # groups of >= max(3, 2.06) particles
    assert repro._count_clusters_circle(x, 0.1, 0.05) == 2  # groups of >= 10.3 particles
    assert repro._count_clusters_circle(x, 3.0, 0.01) == 1  # no gap larger than 3 rad
