"""The inner loop (docs/testing.md): ``pytest -m fast -n 2`` runs the tests recorded under
``FAST_SECONDS`` in tests/durations.json, and the tests not recorded yet."""

from __future__ import annotations

from pathlib import Path

import pytest
from _durations import node_id
from conftest import FAST_SECONDS, recorded_durations

HERE = Path(__file__).resolve().parent

# worker seconds the fast tests may add up to, as recorded (a full run under CI's load): two
# workers then finish the loop in under two minutes with start-up (95 s measured, docs/testing.md)
BUDGET_S = 150.0


def test_the_record_names_tests_of_this_suite():
    times = recorded_durations()
    assert len(times) > 1000
    files = {p.name for p in HERE.glob("test_*.py")}
    known = [k for k in times if k.split("::")[0].removeprefix("tests/") in files]
    # a renamed or removed test file leaves entries behind until the next refresh; most must match
    assert len(known) >= 0.95 * len(times)
    assert all(isinstance(v, float) and v >= 0.0 for v in times.values())


def test_the_fast_set_fits_the_loop_budget_and_spans_the_modules():
    times = recorded_durations()
    fast = {k: v for k, v in times.items() if v < FAST_SECONDS}
    assert sum(fast.values()) < BUDGET_S, sum(fast.values())
    modules = {k.split("::")[0] for k in times}
    covered = {k.split("::")[0] for k in fast}
    assert len(covered) >= 0.9 * len(modules), sorted(modules - covered)


def test_marks_follow_the_record(request):
    """This test is not slow and was either recorded fast or not recorded: it carries ``fast``."""
    t = recorded_durations().get(request.node.nodeid)
    assert t is None or t < FAST_SECONDS or request.node.get_closest_marker("fast") is None
    if t is None or t < FAST_SECONDS:
        assert request.node.get_closest_marker("fast") is not None


@pytest.mark.parametrize(
    "classname,name,expected",
    [
        ("tests.test_sweep", "test_plot_main", "tests/test_sweep.py::test_plot_main"),
        ("tests.test_kernels", "test_x[usa-3]", "tests/test_kernels.py::test_x[usa-3]"),
        ("tests.test_a", "test_b[a\nb]", "tests/test_a.py::test_b[a\nb]"),
    ],
)
def test_junit_names_become_node_ids(classname, name, expected):
    assert node_id(classname, name) == expected


def test_every_xla_default_test_is_in_the_third_call_of_ci():
    """Tests marked ``xla_default`` are skipped under the suite's -O0 flags (tests/conftest.py); CI's
    third pytest call runs them, finding their files by ``grep -l "pytest.mark.xla_default"``: a
    marker spelled another way would leave its test run nowhere."""
    import re

    root = Path(__file__).resolve().parents[1]
    run = (root / ".ci" / "run").read_text()
    assert re.search(r"MEANFIELD_TEST_XLA_DEFAULT=1 [^\n]*-m xla_default", run)
    assert 'grep -l "pytest.mark.xla_default" tests/test_*.py' in run
    files = [p for p in sorted((root / "tests").glob("test_*.py")) if p.name != Path(__file__).name]
    mentioned = {p.name for p in files if "xla_default" in p.read_text()}
    found = {p.name for p in files if "pytest.mark.xla_default" in p.read_text()}
    assert len(found) >= 10 and mentioned == found
