"""``meanfield reproduce`` prints each verdict the moment its experiment finishes (issue 50, item A),
with real processes and the stand-ins of ``tests/_fake_experiments``: ``long`` runs until the test
releases it, so the test can see ``short``'s verdict while ``long`` still runs (no timing)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from meanfield import reproduce

_DRIVER = """
import sys
from meanfield import cli, reproduce
reproduce.EXPERIMENTS = {"short": "_fake_experiments.short", "long": "_fake_experiments.long"}
reproduce.PAPERS = ("long", "short")
sys.exit(cli.main(["reproduce", "--quick", "--jobs", "2", "--out", sys.argv[1]]))
"""


def _start(out: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        FAKE_WAIT_S="120",
    )
    return subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(stream) -> queue.Queue:
    """The lines of ``stream`` as they come (None at its end), read by a thread."""
    q: queue.Queue = queue.Queue()

    def read():
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=read, daemon=True).start()
    return q


def _next(lines: queue.Queue, what: str, timeout: float = 90.0):
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"no line on stdout in {timeout:g} s: {what}")


def test_the_short_verdict_is_printed_while_the_long_experiment_runs(tmp_path):
    proc = _start(tmp_path)
    try:
        lines = _lines(proc.stdout)
        # `long` runs until released below: a run that prints its verdicts only when every
        # experiment has finished prints nothing here
        first = _next(lines, "short's verdict, while long still runs")
        assert first is not None and first.startswith("short: 1/1 checks pass in "), first
        assert not (tmp_path / "long" / "summary.json").exists()  # `long` still runs
        (tmp_path / "release").write_text("")
        rest = []
        while (line := _next(lines, "long's verdict and the report line")) is not None:
            rest.append(line)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        (tmp_path / "release").write_text("")  # the worker ends even when the test fails
        proc.kill()
    assert rest[0].startswith("long: 1/1 checks pass in "), rest
    long = json.loads((tmp_path / "long" / "summary.json").read_text())
    assert long["settings"]["released"]  # it finished because the test saw `short` first
    # the report keeps PAPERS's order, not the order of finishing
    report = (tmp_path / "REPORT.md").read_text()
    assert report.index("(`long`)") < report.index("(`short`)")
    # stderr is a pipe here, not a terminal: start lines only, no bar redrawn with \r
    err = proc.stderr.read()
    assert "[meanfield 1/2] reproduce long (quick)" in err
    assert "[meanfield 2/2] reproduce short (quick)" in err
    assert "\r" not in err and not long["settings"]["bars"]


def test_the_line_of_running_experiments():
    assert reproduce._running_text({}, 0.0) == "starting"
    assert (
        reproduce._running_text({"depth": 100.0, "continuum": 0.0}, 725.0)
        == "running: continuum 12:05, depth 10:25"
    )


def test_live_progress_only_on_a_terminal(tmp_path):
    with open(tmp_path / "log", "w") as f:
        assert not reproduce._live(f)

    class Tty:
        def isatty(self):
            return True

    assert reproduce._live(Tty())
