"""MkDocs hooks of the documentation site (mkdocs.yml: ``hooks``).

The site shows files that live outside ``docs/`` without copying them, so the repository keeps
one source for each:

* ``README.md`` is the home page (``index.md``) and ``BENCHMARKS.md`` the page ``benchmarks.md``;
  their repository-relative links (``docs/gallery/...``, ``docs/sweeps.md``, ``BENCHMARKS.md``)
  are rewritten to the site's layout;
* every ``notebooks/*.ipynb`` is a page ``notebooks/<name>.ipynb`` (rendered, not executed, by
  mkdocs-jupyter), listed in the navigation where ``mkdocs.yml`` has the entry
  ``notebooks/*.ipynb``, titled by the notebook's first heading.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_GLOB = "notebooks/*.ipynb"
PAGES = {"index.md": ROOT / "README.md", "benchmarks.md": ROOT / "BENCHMARKS.md"}
# (pattern, replacement) applied to the markdown links of the pages taken from the repository root
_LINKS = [(re.compile(r"\]\(docs/"), "]("), (re.compile(r"\]\(BENCHMARKS\.md"), "](benchmarks.md")]


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
        files.append(File(f"notebooks/{nb.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
