"""Refresh ``tests/durations.json``, the recorded time of every test, from JUnit XML reports.

``python tests/_durations.py REPORT.xml [REPORT.xml ...]`` (the reports of one full run, e.g.
``python -m pytest -n 2 --junitxml=run.xml``): each test's node id and its seconds, rounded to
0.01 s. ``tests/conftest.py`` marks a test ``fast`` when its recorded time is under
``FAST_SECONDS`` (and a test not recorded yet, until the next refresh): ``pytest -m fast -n 2`` is
the inner loop (docs/testing.md). The times are a worker's wall time under CI's load (two
workers on two cores), so they rank the tests; they are not a benchmark.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "durations.json"


def node_id(classname: str, name: str) -> str:
    """pytest's node id of a JUnit test case (module-level tests: ``tests.test_x`` + ``test_y[id]``)."""
    name = name.split("@tests/", 1)[0]  # `--dist loadgroup` appends an xdist group to an id
    parts = classname.split(".")
    module = "/".join(parts[:2]) + ".py"  # tests.test_x -> tests/test_x.py
    return "::".join([module, *parts[2:], name])


def read(reports: list[str]) -> dict[str, float]:
    times: dict[str, float] = {}
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            nid = node_id(case.get("classname", ""), case.get("name", ""))
            times[nid] = max(times.get(nid, 0.0), round(float(case.get("time", 0.0)), 2))
    return times


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    times = read(argv)
    OUT.write_text(json.dumps(dict(sorted(times.items())), indent=0) + "\n")
    print(f"{OUT}: {len(times)} tests, {sum(times.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
