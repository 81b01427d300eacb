"""The notebooks in notebooks/: they run in a fresh kernel and show figures, and the outputs
committed with them are current (``meanfield.notebooks``)."""

import copy
from pathlib import Path

import nbformat
import pytest

from meanfield import notebooks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: committed notebooks stay small enough to review and to load on a code host
MAX_BYTES = 300_000


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5
    assert notebooks.find_notebooks(ROOT) == NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_outputs_are_current(path):
    """Executed by ``python -m meanfield.notebooks --execute`` from the code as it is now,
    without errors, with at least one figure, and small."""
    nb = nbformat.read(path, as_version=4)
    assert notebooks.problems(nb) == [], (
        f"{path.name}: {notebooks.problems(nb)}; run `python -m meanfield.notebooks --execute {path.relative_to(ROOT)}`"
    )
    assert path.stat().st_size < MAX_BYTES
    assert "matplotlib.use" not in "".join(c.source for c in nb.cells), (
        "a backend override hides the figures"
    )


def _toy(code=("x = 1", "print(x)")):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# toy")] + [
        nbformat.v4.new_code_cell(c) for c in code
    ]
    for i, c in enumerate(nb.cells[1:]):
        c.execution_count = i + 1
    nb.cells[-1].outputs = [
        nbformat.v4.new_output("stream", text="1\n"),
        nbformat.v4.new_output(
            "display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}
        ),
    ]
    nb.metadata[notebooks.METADATA_KEY] = {"source_sha256": notebooks.source_hash(nb)}
    return nb


def test_stale_check_flags_code_changes_only():
    nb = _toy()
    assert notebooks.problems(nb) == []
    # numbers in the outputs and prose may change: not stale
    noisy = copy.deepcopy(nb)
    noisy.cells[-1].outputs[0].text = "1.0000001\n"
    noisy.cells[0].source = "# toy, reworded"
    noisy.cells[1].source = "x = 1   \n"  # trailing whitespace
    assert notebooks.problems(noisy) == []
    # any change of code is
    changed = copy.deepcopy(nb)
    changed.cells[1].source = "x = 2"
    assert notebooks.problems(changed) == ["stale outputs: the code changed since they were stored"]
    # so are moving code between cells and adding a cell
    moved = _toy(("x = 1\nprint(x)", ""))
    moved.metadata = nb.metadata
    assert notebooks.source_hash(moved) != notebooks.source_hash(nb)
    added = copy.deepcopy(nb)
    added.cells.append(nbformat.v4.new_code_cell("y = 3"))
    assert "stale outputs: the code changed since they were stored" in notebooks.problems(added)


def test_problems_names_each_defect():
    nb = _toy()
    del nb.metadata[notebooks.METADATA_KEY]
    nb.cells[1].execution_count = None
    nb.cells[-1].outputs = [
        nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[])
    ]
    assert notebooks.problems(nb) == [
        "never executed by `python -m meanfield.notebooks --execute`",
        "code cells without outputs from a run: [1]",
        "error output ValueError: bad",
        "no figure among the outputs",
    ]
    assert notebooks.image_count(_toy()) == 1


def test_cli_usage_errors_are_one_line(tmp_path, capsys):
    assert notebooks.main(["--check", str(tmp_path / "missing.ipynb")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.ipynb" in err
    with pytest.raises(SystemExit) as e:
        notebooks.main(["--execute", "--check"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not allowed with" in err
    nbformat.write(_toy(), tmp_path / "toy.ipynb")
    assert notebooks.main(["--check", "--timeout", "0", str(tmp_path / "toy.ipynb")]) == 2
    assert capsys.readouterr().err == "error: --timeout must be > 0, got 0\n"
    with pytest.raises(FileNotFoundError, match="no notebooks"):
        notebooks.find_notebooks(tmp_path)


def test_cli_check_reports_stale(tmp_path, capsys):
    good, stale = tmp_path / "good.ipynb", tmp_path / "stale.ipynb"
    nbformat.write(_toy(), good)
    nb = _toy()
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, stale)
    assert notebooks.main(["--check", str(good)]) == 0
    assert notebooks.main(["--check", str(good), str(stale)]) == 1
    out = capsys.readouterr().out
    assert f"{stale}: stale outputs" in out and f"{good}: ok" in out


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_shows_figures(path, monkeypatch):
    """A fresh kernel runs it top to bottom (a failing cell raises) and every figure its cells
    make is an image output, even where CI sets ``MPLBACKEND=Agg``."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = notebooks.execute(path, write=False)
    assert notebooks.error_outputs(nb) == []
    fresh = notebooks.image_count(nb)
    assert fresh >= 1
    assert fresh == notebooks.image_count(nbformat.read(path, as_version=4))
    assert notebooks.problems(nb) == []
    if path.stem.startswith(
        "01_"
    ):  # the widget panel is displayed; without a frontend its figure is static
        views = [
            o
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.outputs
            if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        ]
        assert len(views) == 1
        assert views[0]["data"]["text/plain"] == notebooks.WIDGET_PLACEHOLDER
