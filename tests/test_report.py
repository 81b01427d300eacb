"""The report of the main job and the README gallery builder."""

import numpy as np
from PIL import Image

from meanfield.reproduce import _common, gallery, report


def _summary(name, ok=True):
    checks = [
        _common.check("exact", 1.0 + 1e-9, 1.0, 1e-6, "an identity"),
        _common.check("qualitative", 0.4, None, 0.0, "predicted > 0", passed=lambda v: v > 0),
        _common.check(
            "bad", 2.0, 1.0, 0.1, "fails" if not ok else "", passed=None if not ok else True
        ),
    ]
    return {
        "experiment": name,
        "quick": True,
        "settings": {"n": [1, 2]},
        "checks": checks,
        "timings": {"total_s": 1.5},
        "figures": ["f.png"],
    }


def test_check_rows():
    c = _common.check("x", 0.5, 0.25, 0.1, relative=True)
    assert c["pass"] is False and c["theory"] == 0.25 and c["measured"] == 0.5
    assert _common.check("x", 0.26, 0.25, 0.1, relative=True)["pass"] is True
    assert _common.check("x", float("nan"), 0.0, 1.0)["pass"] is False


def test_report_lists_failures_plainly(tmp_path):
    (tmp_path / "a").mkdir()
    Image.new("RGB", (20, 10), "white").save(tmp_path / "a" / "f.png")
    path = report.write_report(
        tmp_path, {"a": _summary("a", ok=False), "b": _summary("b")}, quick=True
    )
    text = path.read_text()
    assert "**1 of 6 checks FAIL:** a/bad" in text
    assert "| `exact` | 1 | 1 | absolute: within 1e-06 of theory | yes |" in text
    assert "| `qualitative` | — | 0.4 | qualitative: measured > 0 | yes |" in text
    html = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in html and "class='fail'" in html


def test_report_all_pass(tmp_path):
    report.write_report(tmp_path, {"a": _summary("a")}, quick=False)
    assert "All 3 checks pass." in (tmp_path / "REPORT.md").read_text()


def test_gallery_resizes(tmp_path):
    src = tmp_path / "out"
    for exp, fig in gallery.FIGURES:
        (src / exp).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((100, 200, 3), np.uint8)).save(src / exp / fig)
    files = gallery.make_gallery(src, tmp_path / "g", width=50)
    assert len(files) == len(gallery.FIGURES)
    assert Image.open(files[0]).size == (50, 25)
