"""The documentation site's sources, checked without building it (``mkdocs build --strict``,
run by .ci/run, builds it): every public module has an API page in the navigation, the pages
taken from the repository root keep working links, the docstrings' math is well formed, and
the README says how to serve the site and re-execute the notebooks."""

import ast
import importlib
import io
import pkgutil
import re
import tokenize
import tomllib
from pathlib import Path

import pytest

import meanfield

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS = (ROOT / "mkdocs.yml").read_text()
README = (ROOT / "README.md").read_text()


def _public_modules() -> list[str]:
    names = ["meanfield"]
    for info in pkgutil.walk_packages(meanfield.__path__, "meanfield."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


PUBLIC_MODULES = _public_modules()
SOURCES = sorted((ROOT / "meanfield").rglob("*.py"))


def _api_pages() -> dict[str, str]:
    """``{module: page}`` of every ``::: module`` directive under docs/api/."""
    found = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        for target in re.findall(r"^::: *([\w.]+) *$", page.read_text(), flags=re.MULTILINE):
            found[target] = f"api/{page.name}"
    return found


def test_public_modules_are_found():
    for name in (
        "meanfield.theory",
        "meanfield.sweep.store",
        "meanfield.reproduce.usa_av",
        "meanfield.notebooks",
    ):
        assert name in PUBLIC_MODULES
    assert not any(".__main__" in m or "._" in m for m in PUBLIC_MODULES)
    # every module re-exported by the package is public
    for name in meanfield.__all__:
        if type(getattr(meanfield, name)).__name__ == "module":
            assert f"meanfield.{name}" in PUBLIC_MODULES


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_module_has_an_api_page_in_the_nav(module):
    pages = _api_pages()
    assert module in pages, f"no `::: {module}` in docs/api/*.md"
    assert re.search(
        rf"^\s*- [\w. ]+: {re.escape(pages[module])}\s*$", MKDOCS, flags=re.MULTILINE
    ), f"{pages[module]} is not in the nav of mkdocs.yml"


def test_api_directives_name_importable_modules():
    for target in _api_pages():
        importlib.import_module(target)
    assert set(_api_pages()) == set(PUBLIC_MODULES)


def test_nav_pages_exist():
    for page in re.findall(
        r":\s*([\w/]+\.md)\s*$|^\s*- ([\w/]+\.md)\s*$", MKDOCS, flags=re.MULTILINE
    ):
        path = next(p for p in page if p)
        if path in ("index.md", "benchmarks.md"):  # README.md and BENCHMARKS.md (docs/_hooks.py)
            continue
        assert (DOCS / path).is_file(), path
    assert "notebooks/*.ipynb" in MKDOCS  # one page per notebook (docs/_hooks.py)
    assert "docs/_hooks.py" in MKDOCS and "execute: false" in MKDOCS


def test_readme_links_resolve_on_the_site():
    """docs/_hooks.py rewrites ``docs/X`` to ``X`` and ``BENCHMARKS.md`` to ``benchmarks.md``;
    any other relative link of the README would break the strict build."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        if link == "BENCHMARKS.md":
            assert (ROOT / link).is_file()
        else:
            assert link.startswith("docs/") and (ROOT / link).is_file(), link
    for link in re.findall(r"\]\(([^)#\s]+)\)", (ROOT / "BENCHMARKS.md").read_text()):
        assert re.match(r"[a-z]+://", link), f"BENCHMARKS.md: relative link {link} (not rewritten)"


def test_gallery_page_shows_every_gallery_image():
    text = (DOCS / "gallery.md").read_text()
    images = sorted(p.name for p in (DOCS / "gallery").glob("*.png"))
    assert images
    for name in images:
        assert f"(gallery/{name})" in text, name


def _docstrings(path: Path):
    """``(lineno, source literal, value)`` of every module, class and function docstring."""
    src = path.read_text()
    tree = ast.parse(src)
    starts = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                starts[first.lineno] = first.value.value
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.STRING and tok.start[0] in starts:
            yield tok.start[0], tok.string, starts.pop(tok.start[0])


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_docstring_math_is_well_formed(path):
    """LaTeX in a docstring needs a raw string (``\\beta`` would be a backspace and ``eta``),
    and ``$`` delimiters come in pairs within each paragraph (display math ``$$`` alone)."""
    for lineno, literal, value in _docstrings(path):
        prefix = literal[: len(literal) - len(literal.lstrip("rRbBuUfF"))]
        if "r" not in prefix.lower():
            assert "\\" not in literal.replace("\\\\", ""), (
                f'{path.name}:{lineno}: a docstring with backslashes must be raw (r"""...""")'
            )
        for paragraph in re.split(r"\n\s*\n", value):
            if ">>>" in paragraph:
                continue
            paragraph = re.sub(r"``.*?``|`[^`]*`", "", paragraph, flags=re.DOTALL)  # code: no math
            stripped = paragraph.strip()
            if "$$" in stripped:
                assert (
                    stripped.startswith("$$")
                    and stripped.endswith("$$")
                    and stripped.count("$$") == 2
                ), (
                    f"{path.name}:{lineno}: display math $$...$$ must be a paragraph of its own: {stripped[:80]!r}"
                )
                continue
            assert paragraph.count("$") % 2 == 0, (
                f"{path.name}:{lineno}: unpaired $ in {stripped[:80]!r}"
            )


def test_math_renders_on_the_site():
    assert "pymdownx.arithmatex" in MKDOCS and "generic: true" in MKDOCS
    # rendered to MathML at build time by docs/_hooks.py: no MathJax, no CDN (tests/test_math_docs.py)
    assert "mathjax" not in MKDOCS.lower() and "on_page_content" in (DOCS / "_hooks.py").read_text()


def test_docs_extra_lists_the_site_dependencies():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[<>=\[ ]", r)[0] for r in extras["docs"]}
    assert {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocs-jupyter"} <= names


def test_readme_says_how_to_serve_the_docs_and_rerun_the_notebooks():
    assert re.search(r'pip install [^\n]*\.\[docs\]"[^\n]*&& [^\n]*mkdocs serve', README), (
        "the README needs the one-line command that serves the documentation site"
    )
    assert "python -m meanfield.notebooks --execute" in README


def test_ci_builds_the_site_strictly():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in ci
