"""Progress and foresight of ``meanfield simulate``: the bar over simulated time for a long run
(``--quiet`` hides it), the estimate line before a run estimated past ``ESTIMATE_NOTICE_S``, and
the same numbers with and without the bar (``mf.simulate(progress=True)``).

"Long" is forced by lowering the thresholds (module constants of ``meanfield.cli``) in this
process: the runs themselves stay tiny (``n = 16``, a few dozen steps).
"""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import cli, integrate

_RUN = ["simulate", "--n", "16", "--t1", "0.5", "--dt", "0.02", "--saves", "3", "--no-plots"]
_BAR = re.compile(r"simulate: +100%\|.*\| t = 0\.5/0\.5")
_ESTIMATE = re.compile(
    r"meanfield: estimate: ~[0-9.e+-]+ (s|min|h|days) and ~[0-9.]+ (B|KiB|MiB|GiB) of memory "
    r"\(\d+ steps, 3 saves, .* flop; [0-9.e+-]+ flop/s (measured on this machine|assumed)\)"
)


def _forced(monkeypatch: pytest.MonkeyPatch, *, bar: bool, notice: bool) -> None:
    """Every run "long" for the bar and/or the estimate line (negative thresholds)."""
    monkeypatch.setattr(cli, "PROGRESS_BAR_S", -1.0 if bar else 1e30)
    monkeypatch.setattr(cli, "ESTIMATE_NOTICE_S", -1.0 if notice else 1e30)


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main([*_RUN, *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_bar_on_stderr_for_a_long_run(monkeypatch, capsys, tmp_path):
    _forced(monkeypatch, bar=True, notice=False)
    rc, out, err = _main(capsys, "--out", str(tmp_path))
    assert rc == 0, err
    assert _BAR.search(err), err  # ends at the run's end time t1 = 0.5
    assert "estimate:" not in err
    assert "simulate:" not in out and json.loads(out)["failed"] is False  # stdout: the JSON only
    assert integrate._BARS == {}  # closed and forgotten once the run is over


def test_quiet_hides_the_bar(monkeypatch, capsys, tmp_path):
    _forced(monkeypatch, bar=True, notice=False)
    rc, out, err = _main(capsys, "--out", str(tmp_path), "--quiet")
    assert rc == 0, err
    assert "simulate:" not in err and "%|" not in err
    assert json.loads(out)["failed"] is False


def test_short_run_has_no_bar_and_no_estimate_line(capsys, tmp_path):
    rc, out, err = _main(capsys, "--out", str(tmp_path))
    assert rc == 0, err
    assert "simulate:" not in err and "estimate:" not in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert 0 < summary["estimated_time_s"] < cli.PROGRESS_BAR_S


def test_estimate_line_before_the_run_states_time_and_memory(monkeypatch, capsys, tmp_path):
    _forced(monkeypatch, bar=True, notice=True)
    before_run: list[str] = []
    simulate = integrate.simulate

    def spy(*args, **kwargs):  # what stderr holds when the run is started
        before_run.append(capsys.readouterr().err)
        return simulate(*args, **kwargs)

    monkeypatch.setattr(integrate, "simulate", spy)
    rc, _, after = _main(capsys, "--out", str(tmp_path))
    assert rc == 0, after
    (err_before,) = before_run
    assert len(_ESTIMATE.findall(err_before)) == 1, err_before  # one line, before the run
    assert "simulate:" not in err_before and _BAR.search(after)  # the bar comes after it
    assert "estimate:" not in after
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = re.search(r"\((\d+) steps", err_before)
    assert steps is not None and summary["estimate"].startswith(f"{steps.group(1)} steps")


def test_estimate_of_an_adaptive_run_is_a_bound(monkeypatch, capsys, tmp_path):
    _forced(monkeypatch, bar=False, notice=True)
    tolerances = ["--solver", "tsit5", "--rtol", "1e-5", "--atol", "1e-7"]
    rc, _, err = _main(capsys, "--out", str(tmp_path), *tolerances)
    assert rc == 0, err
    # the step count is max_steps (100000 + saves), not what the run takes
    assert re.search(r"meanfield: estimate: up to ~.* of memory \(100000 steps", err), err


def test_same_numbers_with_and_without_the_bar(monkeypatch, capsys, tmp_path):
    _forced(monkeypatch, bar=True, notice=False)
    runs = {}
    for name, extra in (("bar", []), ("quiet", ["--quiet"])):
        rc, out, err = _main(capsys, "--out", str(tmp_path / name), *extra)
        assert rc == 0, err
        assert bool(_BAR.search(err)) == (name == "bar")
        ds = mf.sweep.load(tmp_path / name)  # the run's store: every number simulate writes
        runs[name] = (json.loads(out), {k: ds[k].values for k in (*ds.data_vars, *ds.coords)})
    (s_bar, a_bar), (s_quiet, a_quiet) = runs["bar"], runs["quiet"]
    assert sorted(a_bar) == sorted(a_quiet) and {"x", "x0", "time"} <= set(a_bar)
    for key in a_bar:  # bit for bit
        assert a_bar[key].dtype == a_quiet[key].dtype, key
        assert a_bar[key].tobytes() == a_quiet[key].tobytes(), key
    for key in ("final_collapse_gap", "final_energy", "final_clusters", "num_steps", "stop_time"):
        assert s_bar[key] == s_quiet[key], key


@pytest.mark.parametrize(
    "solver, tolerances",
    [
        ("rk2", {}),
        ("euler", {}),
        # two more compilations of the adaptive loop: 3-7 s
        pytest.param("tsit5", {"rtol": 1e-5, "atol": 1e-7}, marks=pytest.mark.slow),
    ],
)
def test_simulate_progress_changes_no_number(solver, tolerances, capsys):
    x0 = mf.sphere.uniform(jax.random.key(3), 16, 3)
    kw = dict(t1=1.0, dt=0.05, ts=np.linspace(0.0, 1.0, 5), solver=solver, **tolerances)
    kw["observables"] = {"clusters": lambda x: mf.metrics.num_clusters(x, 0.1)}
    plain = mf.simulate(mf.kernels.USA(1.0), x0, **kw)
    shown = mf.simulate(mf.kernels.USA(1.0), x0, progress=True, **kw)
    leaves = jax.tree.leaves(plain), jax.tree.leaves(shown)
    assert len(leaves[0]) == len(leaves[1])
    for a, b in zip(*leaves):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    err = capsys.readouterr().err
    assert re.search(r"simulate: +100%\|.*\| t = 1/1", err), err
    assert integrate._BARS == {}


def test_simulate_progress_refusals():
    x0 = mf.sphere.uniform(jax.random.key(0), 8, 3)
    with pytest.raises(TypeError, match="progress"):
        mf.simulate(mf.kernels.USA(1.0), x0, t1=0.1, dt=0.05, progress="yes")
    with pytest.raises(TypeError, match="progress=True .* outside jit/vmap"):
        jax.jit(lambda x: mf.simulate(mf.kernels.USA(1.0), x, t1=0.1, dt=0.05, progress=True))(x0)
    assert integrate._BARS == {}


def test_format_seconds():
    assert [cli._format_seconds(s) for s in (0.5, 45.0, 720.0, 8640.0, 3 * 86400.0)] == [
        "0.5 s",
        "45 s",
        "12 min",
        "2.4 h",
        "3 days",
    ]
    assert cli._format_seconds(float("inf")) == "forever"
