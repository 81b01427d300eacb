"""The README's Python examples run and their assertions hold."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_quickstart_has_two_commands():
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1]
    block = re.search(r"```(?:bash)?\n(.*?)```", section, flags=re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(lines) == 2
    assert "meanfield reproduce --quick" in lines[0]
    assert "pytest" in lines[1]


@pytest.mark.slow
def test_readme_python_blocks_run():
    blocks = _blocks()
    assert len(blocks) >= 3
    namespace: dict = {}
    for code in blocks:  # the blocks build on each other, like a notebook
        exec(compile(code, str(README), "exec"), namespace)
    assert namespace["gaps"].shape == (4, 8)
