"""One run description (``mf.integrate.RunTime``): ``mf.simulate``'s time keywords, a sweep's
``[time]`` table and ``meanfield simulate``'s flags are one object with one set of rules, each rule
one text spelt as the surface spells its settings."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import cli, sweep
from meanfield._spelling import say_cli, say_python, say_spec
from meanfield.integrate import RunTime

SPEC = (
    '[model]\nkind = "usa"\n[grid]\nn = [6]\nd = 3\nbeta = [1.0]\nseeds = 1\n'
    "[time]\nt1 = 0.5\ndt = 0.1\nsave = [0.0, 0.2, 0.5]\n"
)


def test_keywords_and_the_object_are_one_run():
    x0 = mf.sphere.uniform(jax.random.key(0), 6, 3)
    model = mf.kernels.USA(1.0)
    flat = mf.simulate(model, x0, t1=0.5, dt=0.1, ts=[0.0, 0.2, 0.5])
    obj = mf.simulate(model, x0, time=RunTime(0.5, 0.1, ts=[0.0, 0.2, 0.5]))
    np.testing.assert_array_equal(np.asarray(flat.xs), np.asarray(obj.xs))
    with pytest.raises(TypeError, match="takes the run's time once"):
        mf.simulate(model, x0, time=RunTime(0.5), dt=0.2)
    with pytest.raises(TypeError, match="needs the final time t1"):
        mf.simulate(model, x0)
    # a sweep's [time] is that object: its points are these runs
    spec = sweep.parse_spec(SPEC)
    assert spec.run_time.t1 == 0.5 and spec.run_time.solver == "rk2"
    np.testing.assert_array_equal(spec.run_time.check(), [0.0, 0.2, 0.5])
    via_spec = mf.simulate(model, x0, time=spec.run_time)
    np.testing.assert_array_equal(np.asarray(flat.xs), np.asarray(via_spec.xs))


@pytest.mark.parametrize(
    "run, text",
    [
        (
            RunTime(1.0, solver="tsit5"),
            "{solver_tsit5} is adaptive: give both {rtol} and {atol} (no silent defaults)",
        ),
        (
            RunTime(1.0, rtol=1e-6, atol=1e-8),
            "{rtol}/{atol} apply to the adaptive solvers tsit5, dopri5, heun, not {solver_rk2}",
        ),
        (
            RunTime(1.0, ts=[0.0, 2.0]),
            "{ts} must lie in [0, {t1}] = [0, 1], got range [0, 2]",
        ),
        (RunTime(1.0, ts=[0.5, 0.2]), "{ts} must be strictly increasing"),
        (RunTime(0.5, 2.0), "{dt} = 2 must be <= {t1} = 0.5"),
    ],
    ids=["adaptive", "fixed", "range", "order", "dt"],
)
def test_each_rule_is_one_text_in_each_spelling(run, text):
    for say in (say_python, say_spec, say_cli):
        with pytest.raises(ValueError) as e:
            run.check(say=say)
        assert str(e.value) == text.format(
            solver_tsit5=say("solver", "tsit5"),
            solver_rk2=say("solver", "rk2"),
            rtol=say.name("rtol"),
            atol=say.name("atol"),
            ts=say.name("ts"),
            t1=say.name("t1"),
            dt=say.name("dt"),
        )
    assert say_spec.name("ts") == "time.save" and say_cli.name("ts") == "--saves"


def test_the_surfaces_give_the_rules_texts(tmp_path, capsys):
    """A fixed-step solver refuses tolerances in Python, in a spec and on the command line alike."""
    x0 = mf.sphere.uniform(jax.random.key(0), 6, 3)
    with pytest.raises(ValueError) as e:
        mf.simulate(mf.kernels.USA(1.0), x0, t1=0.5, rtol=1e-6, atol=1e-8)
    assert (
        str(e.value)
        == "rtol/atol apply to the adaptive solvers tsit5, dopri5, heun, not solver='rk2'"
    )
    with pytest.raises(ValueError) as e:
        sweep.parse_spec(SPEC + "rtol = 1e-6\natol = 1e-8\n")
    assert str(e.value) == (
        "time.rtol/time.atol apply to the adaptive solvers tsit5, dopri5, heun, not time.solver = 'rk2'"
    )
    status = cli.main(
        ["simulate", "--n", "6", "--t1", "0.2", "--rtol", "1e-6", "--atol", "1e-8", "--no-plots"]
        + ["--out", str(tmp_path)]
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].endswith(
        "--rtol/--atol apply to the adaptive solvers tsit5, dopri5, heun, not --solver rk2"
    )


def test_a_step_longer_than_the_run_is_one_text_everywhere(tmp_path, capsys):
    """dt > t1: refused by mf.simulate (it used to take one step of t1), a spec and the command
    line, one rule (``RunTime.check``) spelt three ways."""
    x0 = mf.sphere.uniform(jax.random.key(0), 6, 3)
    with pytest.raises(ValueError) as e:
        mf.simulate(mf.kernels.USA(1.0), x0, t1=0.5, dt=2.0)
    assert str(e.value) == "dt = 2 must be <= t1 = 0.5"
    with pytest.raises(ValueError) as e:
        sweep.parse_spec(SPEC.replace("dt = 0.1", "dt = 2.0"))
    assert str(e.value) == "time.dt = 2 must be <= time.t1 = 0.5"
    status = cli.main(
        ["simulate", "--n", "6", "--t1", "0.5", "--dt", "2", "--no-plots", "--out", str(tmp_path)]
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].endswith("--dt = 2 must be <= --t1 = 0.5")
    # an adaptive solver's dt is its first step, clipped to the run: no rule about it
    RunTime(0.005, solver="tsit5", rtol=1e-6, atol=1e-8).check()
