"""End to end: `meanfield reproduce usa-av --quick` and its numbers against theory (docs/math/particles.md, docs/math/kernels.md)."""

import json

import numpy as np
import pytest
from _figures import FigureAudit

import meanfield as mf

SEEDS = 4  # Fig. 2 seeds of the in-process run


@pytest.mark.slow
def test_reproduce_usa_av_quick(tmp_path):
    # in process (the command line of `meanfield reproduce` is run in a subprocess by
    # tests/test_reproduce_continuum.py), with 4 Fig. 2 seeds instead of the quick run's 8
    from meanfield.reproduce import usa_av

    with FigureAudit() as figures:  # every figure it writes, checked as it is saved
        usa_av.run(tmp_path, quick=True, quiet=True, fig2_seeds=SEEDS)
    assert figures.saved and not figures.problems, "\n".join(figures.problems)
    out = tmp_path / "usa-av"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == "usa-av" and summary["quick"] is True
    checks = {c["name"]: c for c in summary["checks"]}
    required = {
        "usa_collapse",
        "distance_bias_dirac",
        "rope_noncollapse",
        "prompt_noncollapse",
        "rope_max_energy",
        "toeplitz_great_circle",
        "gauge_equivalence",
        "prompt_clusters",
        "dobrushin_stability",
        "nonatomic_prompt",
        "toeplitz_fourier",
        "nonatomic_prompt_flow",
        "nonatomic_prompt_energy",
        *(
            f"toeplitz_fourier_{m}_{q}"
            for m in ("m0", "m1", "m2", "m3", "sign")
            for q in ("energy", "winding")
        ),
    }
    assert required <= set(checks)
    for c in checks.values():
        assert {"name", "theory", "measured", "tolerance", "pass", "note"} <= set(c)
        assert {"tolerance_kind", "rule"} <= set(c)
    e_max = float(np.exp(1.0) / 2.0)  # beta = 1
    # our own tolerances, independent of the summary's
    assert checks["usa_collapse"]["measured"] < 1e-3
    assert abs(checks["distance_bias_dirac"]["measured"]) < 1e-3
    assert checks["rope_noncollapse"]["measured"] > 0.3
    assert checks["prompt_noncollapse"]["measured"] > 0.3
    assert abs(checks["rope_max_energy"]["measured"] - e_max) < 1e-4 * e_max
    assert checks["rope_max_energy"]["theory"] == pytest.approx(e_max, rel=1e-6)
    assert abs(checks["toeplitz_great_circle"]["measured"] - 0.25) < 1e-4
    assert checks["gauge_equivalence"]["measured"] < 1e-4
    assert checks["prompt_clusters"]["measured"] == 3
    assert checks["toeplitz_gap"]["measured"] == pytest.approx(1 + 1 / 255, abs=1e-4)
    assert checks["toeplitz_rank"]["measured"] == 2
    assert (
        abs(checks["rope_latitude_gap"]["measured"] - checks["rope_latitude_gap"]["theory"]) < 1e-3
    )
    assert all(c["pass"] for c in checks.values()), [c for c in checks.values() if not c["pass"]]
    # Prop. 10: winding number = dominant mode, energy = max_k c_hat(k) / 2
    for m, (wind, e) in {
        "m0": (0, 0.25),
        "m1": (1, 0.25),
        "m2": (2, 0.25),
        "m3": (3, 0.225),
        "sign": (2, 0.175),
    }.items():
        assert checks[f"toeplitz_fourier_{m}_winding"]["measured"] == wind
        assert checks[f"toeplitz_fourier_{m}_energy"]["measured"] == pytest.approx(e, rel=1e-4)
    assert 0 < checks["dobrushin_stability"]["measured"] <= 1
    assert checks["nonatomic_prompt_flow"]["measured"] < 1e-4
    assert checks["nonatomic_prompt"]["theory"] == pytest.approx(0.783, abs=1e-3)
    for fig in (
        "fig2_collapse_gap.png",
        "fig3_configurations.png",
        "energy.png",
        "toeplitz_fourier.png",
        "dobrushin.png",
        "nonatomic_prompt.png",
    ):
        assert (out / fig).stat().st_size > 10_000
    data = np.load(out / "fig2_data.npz")
    assert data["usa_n128_gap"].shape == (SEEDS, 41)
    # stop times are reported (paper's early-stop rule)
    assert "fig3/Toeplitz (m=1)" in summary["settings"]["stop_times"]


def test_settings_quick_vs_full():
    from meanfield.reproduce import usa_av

    q, f = usa_av.settings_for(True), usa_av.settings_for(False)
    assert q["fig2_n"] == [64, 128] and q["fig2_seeds"] == 8
    assert f["fig2_n"] == [64, 128, 256, 512] and f["fig2_seeds"] == 100
    assert f["dt"] == 1e-2 and f["early_stop"] == 1e-8 and f["solver"] == "rk2"
    assert q["toeplitz_fourier"]["kernels"] == f["toeplitz_fourier"]["kernels"]
    assert q["nonatomic"]["replicates"] < f["nonatomic"]["replicates"]
    from meanfield.reproduce import EXPERIMENTS, PAPERS

    assert PAPERS == (
        "usa-av",
        "attention",
        "depth",
        "prototypes",
        "continuum",
        "dynamics",
        "noise",
    )
    assert set(PAPERS) <= set(EXPERIMENTS)
    assert mf.theory.max_energy(1.0) == pytest.approx(np.e / 2)
