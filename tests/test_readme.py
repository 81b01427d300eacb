"""The README's Quickstart and Python examples, and the examples of the pages the README sends
its readers to (docs/tour.md: the rest of the API tour; docs/speed.md): they run and their
assertions hold."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# pages whose Python blocks build on each other, like a notebook, one namespace per page
PAGES = {
    "README.md": ("gaps",),
    "docs/tour.md": ("gaps", "energies", "sol", "s"),
    "docs/speed.md": ("fast",),
}


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def _quickstart() -> str:
    return README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]


def test_quickstart_has_two_commands():
    section = _quickstart()
    assert section.lstrip().startswith("```bash\n"), "the Quickstart starts with its commands"
    block = re.search(r"```(?:bash)?\n(.*?)```", section, flags=re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(lines) == 2
    assert "meanfield reproduce --quick" in lines[0]
    assert "pytest" in lines[1]


def test_quickstart_says_how_long_each_command_takes():
    """The two commands and the inner loop (docs/testing.md), each with its time on 2 cores."""
    section = _quickstart()
    assert re.search(r"first command, about [\d-]+ minutes", section)
    assert re.search(r"second command, about [\d-]+ minutes", section)
    assert "pytest -q -n 2 -m fast" in section and re.search(
        r"inner loop, (?:about|under) \d+ minutes", section
    )


def test_the_pages_sent_to_have_python_examples():
    assert len(_blocks(README)) >= 3
    assert len(_blocks(ROOT / "docs" / "tour.md")) > len(_blocks(README))
    for page in PAGES:
        if page != "README.md":
            assert f"]({page})" in README.read_text(), f"the README does not link to {page}"


def _run(page: str) -> dict:
    blocks = _blocks(ROOT / page)
    assert blocks
    namespace: dict = {}
    for code in blocks:  # the blocks build on each other, like a notebook
        exec(compile(code, str(ROOT / page), "exec"), namespace)
    for name in PAGES[page]:
        assert name in namespace, f"{page}: {name} not defined by its examples"
    return namespace


@pytest.mark.slow
def test_readme_python_blocks_run():
    assert _run("README.md")["gaps"].shape == (4, 8)


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(set(PAGES) - {"README.md"}))
def test_linked_pages_python_blocks_run(page):
    namespace = _run(page)
    if "gaps" in namespace:
        assert namespace["gaps"].shape == (4, 8)
