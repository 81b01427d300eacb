"""The report a reader trusts (issue 50, item B): every check row says its kind of tolerance
(relative, absolute, bound, or qualitative with its rule in words), a note is one sentence in the
table with the rest folded, a table of the experiments (passed / total, time) comes first, and each
section shows at least one figure. From check rows made here, not from real runs (the end-to-end
reproduce tests write the real reports)."""

from __future__ import annotations

import html as html_lib
import re

import numpy as np
import pytest
from PIL import Image

from meanfield import reproduce
from meanfield.reproduce import _common, report
from meanfield.reproduce._common import check

KINDS = re.compile(r"^(relative|absolute|bound|qualitative): \S")


def _rows():
    threshold = 0.05
    return [
        check("rel", 2.01, 2.0, 0.01, "a rate against its closed form", relative=True),
        check("abs", 1.0 + 1e-9, 1.0, 1e-6, "an identity; exact up to rounding"),
        check("err", 3e-4, 0.0, 1e-3, "max |x - y| over the saves; run: n = 6, beta = 4"),
        check(
            "above", 0.3, None, passed=lambda v: v > threshold, note="spread stays above a floor"
        ),
        check("sign", 0.4, None, passed=lambda m: m > 0, note="the gap is positive"),
        check(
            "order",
            2.0,
            None,
            note="hard VQ at epoch 1 against soft. Paper: hard < soft; pass = hard <= soft",
            passed=False,
        ),
        # a row of an older summary.json, without the new fields
        {
            "name": "old",
            "theory": None,
            "measured": 1.0,
            "tolerance": 0.0,
            "pass": True,
            "note": "collapse found (last-layer t_sim > 0.9); rates 1e-3, 2e-3",
        },
    ]


def _summary(name, rows, figures=("f.png",), total_s=75.0):
    return {
        "experiment": name,
        "quick": True,
        "settings": {"n": 1},
        "checks": rows,
        "timings": {"part_s": 1.0, "total_s": total_s},
        "figures": list(figures),
    }


@pytest.fixture
def written(tmp_path):
    summaries = {"a": _summary("a", _rows()), "b": _summary("b", _rows()[:2], total_s=300.0)}
    for name in summaries:
        (tmp_path / name).mkdir()
        Image.fromarray(np.zeros((10, 20, 3), np.uint8)).save(tmp_path / name / "f.png")
    report.write_report(tmp_path, summaries, quick=True)
    return (
        summaries,
        (tmp_path / "REPORT.md").read_text(),
        (tmp_path / "report.html").read_text(),
    )


def _md_check_rows(md):
    """The cells of every row of the check tables (rows starting with a check name in backticks)."""
    rows = []
    for line in md.splitlines():
        if line.startswith("| `"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows.append(cells)
    return rows


def test_the_kinds_derived_from_the_comparison():
    rows = {r["name"]: r for r in _rows()}
    got = {k: _common.tolerance_rule(r) for k, r in rows.items()}
    assert got["rel"] == ("relative", "within 1% of theory")
    assert got["abs"] == ("absolute", "within 1e-06 of theory")
    assert got["err"] == ("bound", "|measured| <= 0.001")
    assert got["above"] == ("bound", "measured > 0.05")  # the closure's number, not its name
    assert got["sign"] == ("qualitative", "measured > 0")
    assert got["order"] == ("qualitative", "hard <= soft")  # the note's pass rule
    assert got["old"] == ("qualitative", "collapse found (last-layer t_sim > 0.9)")
    assert rows["rel"]["tolerance_kind"] == "relative" and rows["rel"]["rule"]
    assert check("x", 1.0, None, passed=True, rule="one cluster")["rule"] == "one cluster"
    # a one-sided comparison against a theory of 0 says so (not |measured| <= tolerance)
    energy = check("rise", -1e-4, 0.0, 1e-10, "E never rises", passed=lambda v: v <= 1e-10)
    assert (energy["pass"], energy["tolerance_kind"], energy["rule"]) == (
        True,
        "bound",
        "measured <= 1e-10",
    )


def test_every_row_says_its_kind_of_tolerance(written):
    summaries, md, page = written
    rows = _md_check_rows(md)
    assert len(rows) == sum(len(s["checks"]) for s in summaries.values())
    for cells in rows:
        assert KINDS.match(cells[3]), cells
    html_tolerances = re.findall(
        r"<tr(?: class='fail')?><td>[^<]*</td><td>[^<]*</td><td>[^<]*</td><td>([^<]*)</td>", page
    )
    assert len(html_tolerances) == len(rows)
    for t in html_tolerances:
        assert KINDS.match(html_lib.unescape(t)), t


def test_notes_are_one_sentence_with_the_rest_folded(written):
    summaries, md, page = written
    for cells in _md_check_rows(md):
        note = re.sub(r" \[more\]\(#[^)]*\)$", "", cells[5])
        assert not re.search(r"[.;] [A-Za-z]", note), note  # one sentence
    # the rest of a long note: after the table in REPORT.md, in <details> in the HTML
    assert "- `err`: max |x - y| over the saves; run: n = 6, beta = 4" in md
    assert "[more](#exp-a-notes)" in md and '<a id="exp-a-notes"></a>' in md
    assert (
        "<td>max |x - y| over the saves<details><summary>details</summary>run: n = 6, beta = 4"
        "</details></td>" in page
    )
    assert "<td>the gap is positive</td>" in page  # a short note has nothing to fold


def test_the_summary_table_on_top(written):
    summaries, md, page = written
    top = md[: md.index("## ")]
    assert "| [a](#exp-a) | 6 / 7 **FAIL** | 75 s |" in top
    assert "| [b](#exp-b) | 2 / 2 | 5.0 min |" in top
    assert "<a href='#exp-a'>a</a></td><td>6 / 7</td><td>75 s</td>" in page
    assert page.index("class='summary'") < page.index("<h2")


def test_each_section_shows_a_figure(written):
    summaries, md, page = written
    sections = md.split("\n## ")[1:]
    assert len(sections) == len(summaries)
    for name, section in zip(summaries, sections):
        assert f"![f.png]({name}/f.png)" in section
    assert page.count("data:image/png;base64,") == len(summaries)


@pytest.mark.parametrize("name", list(reproduce.EXPERIMENTS))
def test_every_experiment_declares_a_figure_and_the_report_shows_it(name, tmp_path):
    declared = reproduce.get(name).EXPERIMENT.figures
    assert declared and all(f.endswith(".png") for f in declared)
    md = report.write_report(
        tmp_path, {name: _summary(name, _rows()[:1], figures=declared)}, quick=True
    ).read_text()
    for fig in declared:
        assert f"![{fig}]({name}/{fig})" in md


def test_the_dynamics_section_has_its_figures():
    figures = reproduce.get("dynamics").EXPERIMENT.figures
    assert {"normalization_equiangular.png", "attention_variants.png"} <= set(figures)


def test_first_sentence():
    assert _common.first_sentence("one (a; b) thing; rest") == ("one (a; b) thing", "rest")
    assert _common.first_sentence("e.g. this. That") == ("e.g. this", "That")
    head, rest = _common.first_sentence("word " * 100, limit=40)
    assert len(head) <= 42 and head.endswith("…") and rest.startswith("…")
    head, rest = _common.first_sentence("a " * 30 + "b; c", limit=40)
    assert rest.endswith("a b; c")  # nothing of the note is lost
