"""MkDocs hooks of the documentation site (mkdocs.yml: ``hooks``).

The site shows files that live outside ``docs/`` without copying them, so the repository keeps
one source for each:

* ``README.md`` is the home page (``index.md``) and ``BENCHMARKS.md`` the page ``benchmarks.md``;
  their repository-relative links (``docs/gallery/...``, ``docs/sweeps.md``, ``BENCHMARKS.md``)
  are rewritten to the site's layout;
* every ``notebooks/*.ipynb`` is a page ``notebooks/<name>.ipynb`` (rendered, not executed, by
  mkdocs-jupyter), listed in the navigation where ``mkdocs.yml`` has the entry
  ``notebooks/*.ipynb``, titled by the notebook's first heading.

Mathematics is rendered when the site is built, so that pages need no network and no script to
show formulas: ``pymdownx.arithmatex`` (generic mode) wraps the TeX of the pages and of the API
pages (mkdocstrings docstrings) as ``<span class="arithmatex">\\(...\\)</span>`` and
``<div class="arithmatex">\\[...\\]</div>``, and ``on_page_content`` replaces each by MathML
(``latex2mathml``), which browsers render natively. Notebook pages (rendered by mkdocs-jupyter,
not by arithmatex) get the same treatment for ``$...$`` and ``$$...$$`` in their markdown cells.
A formula that does not convert is a warning, so ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import html
import json
import logging
import re
from pathlib import Path

from latex2mathml.converter import convert as _latex2mathml
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_GLOB = "notebooks/*.ipynb"
PAGES = {"index.md": ROOT / "README.md", "benchmarks.md": ROOT / "BENCHMARKS.md"}
# (pattern, replacement) applied to the markdown links of the pages taken from the repository root
_LINKS = [(re.compile(r"\]\(docs/"), "]("), (re.compile(r"\]\(BENCHMARKS\.md"), "](benchmarks.md")]
log = logging.getLogger("mkdocs.hooks.math")  # under "mkdocs": a warning fails --strict


def _notebooks() -> list[Path]:
    return sorted(ROOT.glob(NOTEBOOK_GLOB))


def _title(path: Path) -> str:
    for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", [])).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


def on_config(config):
    """Expand the navigation entry ``notebooks/*.ipynb`` into one page per notebook."""

    def expand(items):
        out = []
        for item in items:
            if isinstance(item, dict):
                out.append({k: expand(v) if isinstance(v, list) else v for k, v in item.items()})
            elif item == NOTEBOOK_GLOB:
                out += [{_title(p): f"notebooks/{p.name}"} for p in _notebooks()]
            else:
                out.append(item)
        return out

    config["nav"] = expand(config["nav"] or [])
    return config


@event_priority(100)  # before mkdocs-jupyter turns .ipynb files into notebook pages
def on_files(files: Files, config) -> Files:
    """Add README.md (links rewritten), BENCHMARKS.md and the notebooks to the site's files."""
    for dest, src in PAGES.items():
        text = src.read_text(encoding="utf-8")
        for pattern, repl in _LINKS:
            text = pattern.sub(repl, text)
        files.append(File.generated(config, dest, content=text))
    for nb in _notebooks():
        # a file with a source directory (the repository root): mkdocs-jupyter reads it from there
        files.append(
            File(
                f"notebooks/{nb.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]
            )
        )
    return files


# --------------------------------------------------------------------------------------------
# mathematics: TeX -> MathML at build time

# TeX that latex2mathml does not know, rewritten to TeX it does (applied before conversion)
_TEX_REWRITES = [(re.compile(r"\\arg(?![A-Za-z])"), r"\\operatorname{arg}")]
# arithmatex (generic mode) output: inline \(..\), display \[..\] or a bare \begin{env}..\end{env}
_ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
# notebook markdown cells (mkdocs-jupyter): $$..$$ and $..$ in their text
_NB_CELL = re.compile(r'(<div class="[^"]*jp-RenderedMarkdown[^"]*"[^>]*>)(.*?)(</div>)', re.S)
_NB_SKIP = re.compile(r"(<(code|pre)\b.*?</\2>|<[^>]+>)", re.S)  # tags and code: left alone
_UNKNOWN_COMMAND = re.compile(r">\s*(\\[A-Za-z]+)")
_NB_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?!\s)([^$\n]+?)(?<![\s\\])\$(?!\d)", re.S)


def tex_to_mathml(tex: str, *, display: bool = False) -> str:
    """MathML (a ``<math>`` element) of the TeX formula ``tex`` (without delimiters).

    Raises ``ValueError`` when the TeX does not convert.
    """
    for pattern, repl in _TEX_REWRITES:
        tex = pattern.sub(repl, tex)
    try:
        out = _latex2mathml(tex.strip(), display="block" if display else "inline")
    except Exception as error:  # latex2mathml raises its own exception types (and IndexError)
        raise ValueError(f"cannot convert TeX to MathML: {tex!r} ({error})") from error
    # an escaped underscore in \text{..} (base\_dt) is kept as "\_" by latex2mathml
    out = out.replace("\\_", "_")
    # a command latex2mathml does not know comes out as its own name (<mi>\foo</mi>)
    unknown = _UNKNOWN_COMMAND.search(out)
    if unknown:
        raise ValueError(
            f"cannot convert TeX to MathML: {tex!r} (unknown command {unknown.group(1)})"
        )
    return out


def _render(tex: str, display: bool, where: str, fallback: str) -> str:
    try:
        return tex_to_mathml(tex, display=display)
    except ValueError as error:
        log.warning("%s: %s", where, error)
        return fallback


def _arithmatex(match: re.Match, where: str) -> str:
    tag, body = match.group(1), html.unescape(match.group(2)).strip()
    # \(..\) and \[..\] lose their delimiters; a bare \begin{..}..\end{..} is converted whole
    if body[:2] in ("\\(", "\\[") and body[-2:] in ("\\)", "\\]"):
        body = body[2:-2]
    return f'<{tag} class="arithmatex">{_render(body, tag == "div", where, match.group(0))}</{tag}>'


def _notebook_math(text: str, where: str) -> str:
    def formula(match: re.Match) -> str:
        display = match.group(1) is not None
        tex = html.unescape(match.group(1) if display else match.group(2))
        return _render(tex, display, where, match.group(0))

    # convert only the text between tags, never inside <code>/<pre>
    pieces, pos = [], 0
    for skip in _NB_SKIP.finditer(text):
        pieces.append(_NB_MATH.sub(formula, text[pos : skip.start()]))
        pieces.append(skip.group(0))
        pos = skip.end()
    pieces.append(_NB_MATH.sub(formula, text[pos:]))
    return "".join(pieces)


def render_math(html_text: str, *, where: str = "", notebook: bool = False) -> str:
    """Replace the arithmatex output in ``html_text`` (and, for a notebook page, ``$...$`` in its
    markdown cells) by MathML."""
    html_text = _ARITHMATEX.sub(lambda m: _arithmatex(m, where), html_text)
    if notebook:
        html_text = _NB_CELL.sub(
            lambda m: m.group(1) + _notebook_math(m.group(2), where) + m.group(3), html_text
        )
    return html_text


def on_page_content(html_text: str, page, config, files) -> str:
    """Render the page's mathematics as MathML (no script, no network when the page is read)."""
    return render_math(
        html_text, where=page.file.src_uri, notebook=page.file.src_uri.endswith(".ipynb")
    )
