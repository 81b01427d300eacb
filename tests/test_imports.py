"""The import graph of the package (STYLE.md: two modules that import each other are one
module or a missing third; DESIGN.md: the sweep's store imports nothing from plan/run).

Read from the source with ``ast``, every ``import`` statement counted, at module level or
inside functions, relative imports resolved. A package's ``__init__`` importing its own
submodules is allowed (a submodule's import of its package runs that ``__init__`` first
in any case).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "meanfield"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imports_of(name: str) -> set[str]:
    """The modules of the package that module ``name`` imports (anywhere in its source)."""
    package = name if _is_package(name) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                # `import a.b.c` imports a, a.b and a.b.c
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            parts = target.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts)))  # its parents
            found.add(target)
            for alias in node.names:  # `from pkg import submodule`
                found.add(f"{target}.{alias.name}")
    return {m for m in found if m in MODULES and m != name}


def import_graph() -> dict[str, set[str]]:
    """Edges of the package's import graph, without a package's imports of its own
    submodules and a module's imports of its parent packages (both run anyway)."""
    graph = {}
    for name in MODULES:
        edges = set()
        for target in imports_of(name):
            if _is_package(name) and target.startswith(name + "."):
                continue  # a package importing its own submodules from __init__
            if name.startswith(target + "."):
                continue  # a module importing (a name of) its parent package
            edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return stack[stack.index(v) :] + [v]
            if v not in state and (cycle := visit(v)):
                return cycle
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (cycle := visit(u)):
            return cycle
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_imports_are_resolved():
    """Relative, function-level and `from package import submodule` imports are all seen."""
    run = imports_of("meanfield.sweep.run")
    assert {"meanfield.sweep.store", "meanfield.sweep.plan", "meanfield.sweep.spec"} <= run
    # function-level imports of the particles sweep kind
    assert {"meanfield.kernels", "meanfield.integrate"} <= imports_of("meanfield.sweep._particles")
    assert "meanfield" in imports_of(
        "meanfield.sweep.run"
    )  # `from .. import __version__` in a function
    assert "meanfield.sweep" in imports_of("meanfield.cli")  # `from . import sweep` inside main()
    assert "meanfield.sweep._diff" in imports_of("meanfield.sweep.store")


def test_no_import_cycle_in_meanfield():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_sweep_package_has_no_cycle():
    inside = lambda m: m.startswith("meanfield.sweep")  # noqa: E731
    graph = {m: {t for t in e if inside(t)} for m, e in import_graph().items() if inside(m)}
    assert set(graph) >= {
        f"meanfield.sweep.{m}" for m in ("spec", "plan", "run", "store", "plot", "cli")
    }
    assert find_cycle(graph) is None


@pytest.mark.parametrize("module", ["store", "_diff"])
def test_sweep_store_imports_nothing_from_spec_plan_run(module):
    """The store reads what it needs from the store itself (attributes written at creation)."""
    got = imports_of(f"meanfield.sweep.{module}")
    assert not got & {f"meanfield.sweep.{m}" for m in ("spec", "plan", "run", "plot", "cli")}, got


def test_the_old_modules_are_gone():
    assert not (PACKAGE / "store.py").exists() and not (PACKAGE / "sweep.py").exists()
    assert "meanfield.sweep.store" in MODULES
