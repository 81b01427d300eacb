"""``python -m benchmarks.device --smoke``: every section of the accelerator benchmark at tiny
sizes on the CPU, in a subprocess, and the JSON it writes (sections, numbers, agreement)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {"roofline", "field", "phase", "sweep", "simulate"}


def _positive(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


@pytest.mark.slow
def test_device_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.device", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("device-*.json")
    assert path.with_suffix(".md").read_text().startswith("### ")
    data = json.loads(path.read_text())
    meta, limits, secs = data["meta"], data["limits"], data["sections"]
    assert meta["profile"] == "smoke" and meta["jax"] and meta["device_kind"]
    assert set(secs) == SECTIONS
    for name, sec in secs.items():
        if sec["status"] == "skipped":  # only for a documented reason: the sweep package absent
            assert name == "sweep" and "does not import" in sec["reason"], sec
            continue
        assert sec["status"] == "ok", (name, sec.get("error"))
        assert _positive(sec["elapsed_s"])
        assert not any("skipped" in r or "error" in r for r in sec["rows"]), (name, sec["rows"])
        # on the CPU every check has a tolerance, and each was met
        assert sec["checks"] and all(c["ok"] is True for c in sec["checks"]), sec["checks"]

    for key in ("gemm_f32_highest", "gemm_f32_default", "gemm_f64", "bandwidth", "exp_f32"):
        assert _positive(limits[key]), key

    rows = secs["field"]["rows"]
    assert {r["quantity"] for r in rows} == {"velocity", "energy", "grad"}
    for r in rows:
        for key in ("compile_s", "run_s", "pairs_per_s", "frac_exp", "frac_gemm", "vs_plain"):
            assert _positive(r[key]), (r["case"], r["quantity"], r["impl"], key)
        assert 0 <= r["rel_f64"] < 1e-3
    mine = [r for r in rows if r["impl"] == "meanfield"]
    assert len(mine) == 3 * len({r["case"] for r in rows})
    assert all(0 <= r["rel_plain"] < 1e-3 for r in mine)  # meanfield against plain JAX

    phase = secs["phase"]["rows"]
    # SA float64 (meanfield, plain JAX), SA float32 (meanfield), USA float64 (meanfield, plain JAX)
    impls = [r["impl"].split(" ")[0] for r in phase]
    assert impls == ["meanfield", "plain", "meanfield", "meanfield", "plain"]
    for r in phase:
        assert _positive(r["run_s"]) and _positive(r["pairs_per_s"])
    assert all(r["max_diff"] == 0.0 for r in phase if r["impl"].startswith("plain"))

    if secs["sweep"]["status"] == "ok":
        for r in secs["sweep"]["rows"]:
            assert r["status_ok"] == r["points"] > 0
            assert _positive(r["point_steps_per_s"]) and r["rel_diff_point0"] < 1e-4

    sim = secs["simulate"]["rows"]
    assert len(sim) == 4
    for r in sim:
        assert _positive(r["steps_per_s"]) and _positive(r["vs_plain"])
        assert r["steps"] == 50 and r["rel_diff_final_energy"] < 1e-4
