"""The mathematics pages (docs/math/) and their rendering without network (docs/_hooks.py).

Docstrings, tests, notebooks and sweep specifications cite the formulas they implement as
"docs/math/<page>.md, <Section>"; these tests check that every cited path exists, that every
cited section is a heading of its page, and that the built site shows the formulas as MathML
with no script fetched from another host.
"""

import importlib.util
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MATH = ROOT / "docs" / "math"
MKDOCS = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
MATHML_NS = "{http://www.w3.org/1998/Math/MathML}"

# the retired notes file, spelled so that this file does not cite it
RETIRED = "MATH" + ".md"
# files that cite the mathematics (README.md is checked on its own, below)
CITING = sorted(
    [
        *(ROOT / "meanfield").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "docs").glob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.md"),
        *(ROOT / "notebooks").glob("*.ipynb"),
        *(ROOT / "sweeps").rglob("*.toml"),
        *(ROOT / "sweeps").rglob("*.py"),
        ROOT / "BENCHMARKS.md",
    ]
)
# a repository path under docs/ with a file extension, as cited in text
DOCS_PATH = re.compile(r"(?<![\w/.])docs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.(?:md|png|py|yml|css)\b")
# "docs/math/<page>.md, <section>": the section runs to the next ; : ) or end of line
SECTION_CITE = re.compile(r"docs/math/([a-z_]+)\.md, ([A-Z][^;:)\n\"`]*)")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _missing_paths(text: str) -> list[str]:
    return sorted({p for p in DOCS_PATH.findall(text) if not (ROOT / p).exists()})


def _headings(page: str) -> set[str]:
    text = (MATH / f"{page}.md").read_text(encoding="utf-8")
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _bad_sections(text: str) -> list[str]:
    bad = []
    for page, cited in SECTION_CITE.findall(text):
        if not (MATH / f"{page}.md").is_file():
            continue  # reported as a missing path
        if not any(cited.startswith(h) for h in _headings(page)):
            bad.append(f"docs/math/{page}.md, {cited.strip()}")
    return bad


def test_no_file_cites_the_retired_notes_or_a_missing_docs_path():
    problems = []
    for path in CITING:
        text = path.read_text(encoding="utf-8")
        if RETIRED in text:
            problems.append(f"{_rel(path)}: cites {RETIRED} (cite a docs/math page)")
        problems += [f"{_rel(path)}: cites missing {p}" for p in _missing_paths(text)]
        problems += [f"{_rel(path)}: no such section: {s}" for s in _bad_sections(text)]
        problems += [f"{_rel(path)}: cites {p} (outside the repository)" for p in _outside(text)]
    assert not problems, "\n".join(problems)


# the papers' text files and the design notes live beside the repository, not in it: cite a paper
# by title (docs/papers.md lists them)
OUTSIDE = re.compile(r"(?<![\w/.])(?:\.\./shared/[\w./-]*\w|papers/[\w.-]+\.txt)")


def _outside(text: str) -> list[str]:
    return sorted(set(OUTSIDE.findall(text)))


def test_the_outside_pattern_catches_paper_paths():
    paper = "papers/" + "post-norm-rank-collapse.txt"  # spelled apart: this file is scanned too
    notes = "../" + "shared/DESIGN.md"
    assert _outside(f"see {paper}, Sec. 2") == [paper]
    assert _outside(f"read {notes}.") == [notes]
    assert _outside("docs/papers.md lists the papers") == []


def test_readme_cites_no_retired_notes_or_missing_docs_path():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    problems = [
        f"line {i}: cites {RETIRED}"
        for i, line in enumerate(text.splitlines(), 1)
        if RETIRED in line
    ]
    problems += [f"cites missing {p}" for p in _missing_paths(text)]
    problems += [f"no such section: {s}" for s in _bad_sections(text)]
    assert not problems, "README.md:\n" + "\n".join(problems)


def test_every_math_page_is_in_the_navigation():
    pages = sorted(p.name for p in MATH.glob("*.md"))
    assert "index.md" in pages and len(pages) >= 8
    assert "- Mathematics:" in MKDOCS
    for name in pages:
        assert f"math/{name}" in MKDOCS, f"docs/math/{name} is not in mkdocs.yml nav"


def test_the_site_loads_no_mathjax_from_a_cdn():
    assert "mathjax" not in MKDOCS.lower()
    assert not re.search(r"^\s*-\s*https?://", MKDOCS, re.M), "mkdocs.yml loads a remote asset"


# --------------------------------------------------------------------------------------------
# TeX -> MathML (docs/_hooks.py)


@pytest.fixture(scope="module")
def hooks():
    pytest.importorskip("mkdocs")
    pytest.importorskip("latex2mathml")
    spec = importlib.util.spec_from_file_location(
        "_meanfield_docs_hooks", ROOT / "docs" / "_hooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse(mathml: str) -> ET.Element:
    root = ET.fromstring(mathml)  # well-formed XML
    assert root.tag == f"{MATHML_NS}math"
    return root


def _tags(root: ET.Element) -> set[str]:
    return {el.tag.removeprefix(MATHML_NS) for el in root.iter()}


def _text(root: ET.Element) -> str:
    return "".join(root.itertext())


@pytest.mark.parametrize(
    "tex, tags, chars",
    [
        # docs/math/particles.md, Dynamics
        (r"\dot x_i = P_{x_i} F_i", {"msub", "mover"}, ["x", "P", "F", "="]),
        # docs/math/kernels.md, Maximal energy
        (r"E \le \frac{e^{\beta}}{2 \beta}", {"mfrac", "msup"}, ["\u2264", "\u03b2"]),
        # docs/math/depth.md, Token similarity
        (
            r"t_{\text{sim}}(X) = \frac{\lVert \Pi X\rVert_F^2}{\lVert X\rVert_F^2}",
            {"mfrac", "msubsup", "mtext"},
            ["sim", "\u2016", "\u03a0"],
        ),
        # docs/math/depth.md, Blocks
        (
            r"X \leftarrow \operatorname{RMSNorm}(X + \operatorname{Attn}(X))",
            {"mo"},
            ["RMSNorm", "\u2190"],
        ),
        # docs/math/continuum.md, Growth rates
        (
            r"\lambda_l^{\text{sa}} = \frac{l (l + d - 2)\, I_{l + d/2 - 1}(\beta)}{\beta\, I_{d/2 - 1}(\beta)}",
            {"msubsup", "mfrac"},
            ["\u03bb", "sa"],
        ),
        # docs/math/depth.md, Prefix average
        (
            r"(C_n)_{ij} = \begin{cases} 1/i & j \le i, \\ 0 & \text{otherwise}, \end{cases}",
            {"mtable", "mtr", "mtd"},
            ["otherwise"],
        ),
        # docstrings: \arg (rewritten) and \_ in \text
        (r"k^* = \arg\max_k \lambda_k", {"msub"}, ["arg", "max"]),
        (r"\text{base\_dt}", {"mtext"}, ["base_dt"]),
    ],
)
def test_tex_to_mathml(hooks, tex, tags, chars):
    for display in (False, True):
        out = hooks.tex_to_mathml(tex, display=display)
        root = _parse(out)
        assert root.get("display") == ("block" if display else "inline")
        assert tags <= _tags(root), (tags - _tags(root), out)
        text = _text(root)
        assert "\\" not in text, out
        for c in chars:
            assert c in text, (c, out)


@pytest.mark.parametrize("tex", [r"\frac{1}{", "a^", r"\left( x", r"\nosuchcommand x"])
def test_tex_to_mathml_rejects_what_it_cannot_render(hooks, tex):
    with pytest.raises(ValueError, match="cannot convert TeX to MathML"):
        hooks.tex_to_mathml(tex)


def test_render_math_replaces_arithmatex_output(hooks):
    page = (
        '<p>weights <span class="arithmatex">\\(A_j = e^{-\\beta T_j} / Z_n &lt; 1\\)</span></p>\n'
        '<div class="arithmatex">\\[Z_n = \\sum_j e^{-\\beta T_j}\\]</div>'
    )
    out = hooks.render_math(page)
    assert "\\(" not in out and "\\[" not in out
    inline, block = re.findall(r"<math\b.*?</math>", out, re.S)
    assert _parse(inline).get("display") == "inline" and "<" in _text(_parse(inline))
    assert _parse(block).get("display") == "block" and "munder" in _tags(_parse(block))


def test_render_math_in_notebook_markdown_leaves_code_alone(hooks):
    cell = (
        '<div class="jp-RenderedHTMLCommon jp-RenderedMarkdown jp-MarkdownOutput">'
        "<p>At large $\\beta$ the levels are $\\sum_k w_k^2$; it costs $5 or $6; "
        "<code>$x$</code></p></div>"
    )
    out = hooks.render_math(cell, notebook=True)
    assert out.count("<math") == 2
    assert "<code>$x$</code>" in out and "$5 or $6" in out
    # pages that are not notebooks keep their dollars
    assert hooks.render_math(cell) == cell


# --------------------------------------------------------------------------------------------
# the built site


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter", "latex2mathml"):
        pytest.importorskip(module)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    problems = [line for line in run.stderr.splitlines() if not line.startswith("INFO")]
    assert run.returncode == 0, "\n".join(problems)[-4000:]
    return out


@pytest.mark.slow
def test_built_site_loads_no_external_script(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 40
    offenders = [
        _rel_site(site, p)
        for p in pages
        if re.search(r"<script\b[^>]*\bsrc=[\"']?(https?:)?//", p.read_text(encoding="utf-8"))
    ]
    assert not offenders, offenders


def _rel_site(site: Path, path: Path) -> str:
    return path.relative_to(site).as_posix()


@pytest.mark.slow
def test_built_math_pages_show_mathml_not_tex(site):
    for src in sorted(MATH.glob("*.md")):
        name = "" if src.stem == "index" else src.stem
        html = (site / "math" / name / "index.html").read_text(encoding="utf-8")
        assert html.count("<math") >= 5, src.name
        assert "\\(" not in html and "\\[" not in html, src.name
        for mathml in re.findall(r"<math\b.*?</math>", html, re.S)[:50]:
            _parse(mathml)
    kernels = (site / "math" / "kernels" / "index.html").read_text(encoding="utf-8")
    assert 'display="block"' in kernels and 'id="gauge-equivalence"' in kernels


@pytest.mark.slow
def test_built_api_pages_show_mathml_not_tex(site):
    # every formula of every page (docstrings included) was converted: no arithmatex TeX is left
    left = [
        _rel_site(site, p)
        for p in sorted(site.rglob("*.html"))
        if re.search(r'class="arithmatex">\s*\\[(\[]', p.read_text(encoding="utf-8"))
    ]
    assert not left, left
    continuum = (site / "api" / "continuum" / "index.html").read_text(encoding="utf-8")
    assert continuum.count("<math") > 20
