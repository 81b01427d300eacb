"""The public surface: every module's ``__all__`` lists exactly its public names (issue 16)."""

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import meanfield

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(meanfield.__path__, "meanfield.")
    if not m.name.endswith("__main__")
)


def _defined_public_names(path: Path) -> set[str]:
    """Names bound at module level by def, class or assignment, not starting with ``_``."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("name", ["meanfield", *MODULES])
def test_all_lists_exactly_the_public_names(name):
    mod = importlib.import_module(name)
    assert hasattr(mod, "__all__"), f"{name} has no __all__"
    listed = list(mod.__all__)
    assert len(listed) == len(set(listed)), f"{name}.__all__ has duplicates"
    missing = [n for n in listed if not hasattr(mod, n)]
    assert not missing, f"{name}.__all__ names what the module does not have: {missing}"
    path = Path(mod.__file__)
    unlisted = sorted(_defined_public_names(path) - set(listed))
    assert not unlisted, f"{name} defines public names missing from __all__: {unlisted}"


def test_package_reexports_are_public_modules():
    """Nothing public lives only in a private module (STYLE)."""
    for name in meanfield.__all__:
        obj = getattr(meanfield, name)
        home = getattr(obj, "__module__", getattr(obj, "__name__", "meanfield"))
        assert not any(part.startswith("_") and part != "__init__" for part in home.split(".")), (
            name,
            home,
        )


def test_continuum_is_public():
    """The mean-field limit (issue 19) is a public module with its entry points."""
    assert (
        "continuum" in meanfield.__all__ and meanfield.continuum.__name__ == "meanfield.continuum"
    )
    expected = {
        "growth_rates",
        "most_unstable_mode",
        "solve",
        "Solution",
        "grid",
        "Grid",
        "mode_perturbation",
        "sample_perturbation",
        "project_particles",
        "w1_circle",
        "mmd_sphere",
    }
    assert expected <= set(meanfield.continuum.__all__)
