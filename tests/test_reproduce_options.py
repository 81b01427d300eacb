"""Every reproduction declares its options and steps once (``EXPERIMENT``, an ``_common.Experiment``):
an unknown option is one ``ValueError`` of the same form in every experiment, raised before any work;
a value of another kind is a ``TypeError``; valid options replace the declared values; the three
sizes (``MODES``) and the steps' progress and timings come from the declaration (issue 26, item 7)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from meanfield import reproduce
from meanfield.reproduce._common import MODES, Experiment, Option


@pytest.fixture(params=list(reproduce.EXPERIMENTS))
def experiment(request):
    return request.param, reproduce.get(request.param)


def test_every_experiment_declares_itself(experiment):
    name, module = experiment
    E = module.EXPERIMENT
    assert isinstance(E, Experiment) and E.name == name
    assert E.options and E.steps
    params = inspect.signature(module.run).parameters
    for arg in ("quick", "full", "quiet", "options"):
        assert arg in params, (name, arg)
    for mode in MODES:  # every size resolves, with every declared option and nothing else
        assert list(E.settings(mode)) == list(E.options)


def test_unknown_option_is_one_error_naming_it(experiment, tmp_path):
    name, module = experiment
    accepted = ", ".join(sorted(module.EXPERIMENT.options))
    with pytest.raises(ValueError) as err:
        module.run(tmp_path, quick=True, quiet=True, bogus=1)
    assert str(err.value) == f"unknown option 'bogus' for reproduce {name}; accepted: {accepted}"
    with pytest.raises(ValueError) as err:
        module.run(tmp_path, quick=True, quiet=True, bogus=1, other=2)
    assert (
        str(err.value)
        == f"unknown options 'bogus', 'other' for reproduce {name}; accepted: {accepted}"
    )
    with pytest.raises(
        ValueError
    ) as err:  # full is a size, in every experiment (``meanfield reproduce --full``)
        module.run(tmp_path, full=True, quiet=True, bogus=1)
    assert str(err.value) == f"unknown option 'bogus' for reproduce {name}; accepted: {accepted}"
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_option_of_another_kind(experiment, tmp_path):
    name, module = experiment
    option = next(iter(module.EXPERIMENT.options))
    with pytest.raises(TypeError, match=f"option '{option}' of reproduce {name} must be "):
        module.run(tmp_path, quick=True, quiet=True, **{option: object()})
    assert not any(tmp_path.iterdir())


def test_quick_and_full_exclude_each_other(experiment, tmp_path):
    _, module = experiment
    with pytest.raises(ValueError, match="choose at most one of quick and full"):
        module.run(tmp_path, quick=True, full=True, quiet=True)


def test_valid_options_replace_the_declared_values(experiment):
    _, module = experiment
    E = module.EXPERIMENT
    for k, opt in E.options.items():
        quick = E.settings("quick")
        new = {
            "bool": lambda v: not v,
            "int": lambda v: v + 1,
            "float": lambda v: v * 2 + 1,
            "str": lambda v: v + "!",
            "list": lambda v: list(v)[:1],
            "dict": lambda v: {},
        }[opt.kind](quick[k])
        s = E.settings("quick", **{k: new})
        assert s[k] == new and {j: v for j, v in s.items() if j != k} == {
            j: v for j, v in quick.items() if j != k
        }
        assert list(s) == list(quick)


def test_settings_are_fresh_copies():
    from meanfield.reproduce import usa_av

    s = usa_av.EXPERIMENT.settings("quick")
    s["toeplitz_fourier"]["kernels"]["m0"].append(9.0)
    s["stop_times"] = {}
    assert usa_av.EXPERIMENT.settings("quick")["toeplitz_fourier"]["kernels"]["m0"] == [
        0.5,
        0.2,
        0.1,
        0.05,
    ]
    assert "stop_times" not in usa_av.settings_for(True)


def test_modes():
    E = Experiment("toy", {"n": Option(512, quick=64, full=4096), "seed": Option(0)}, steps=("a",))
    assert [E.settings(m)["n"] for m in MODES] == [64, 512, 4096]
    assert [
        E.mode(quick=q, full=f) for q, f in ((True, False), (False, False), (False, True))
    ] == list(MODES)
    assert Option(8, quick=2).value("full") == 8  # no full size: the default's
    with pytest.raises(ValueError, match="mode must be one of quick, default, full, got 'huge'"):
        E.settings("huge")
    with pytest.raises(TypeError, match="not of its default's kind int"):
        Option(8, quick="2")
    assert E.settings("default", n=3)["n"] == 3
    with pytest.raises(TypeError, match="option 'n' of reproduce toy must be int, got 3.5"):
        E.settings("default", n=3.5)
    F = Experiment(
        "toy", {"t1": Option(1.0), "ns": Option([1, 2]), "on": Option(True)}, steps=("a",)
    )
    assert F.settings("default", t1=2)["t1"] == 2  # an int is a float
    assert F.settings("default", t1=np.float32(0.5), ns=np.arange(3), on=np.bool_(False))[
        "ns"
    ].tolist() == [0, 1, 2]
    for bad in ({"ns": 3}, {"on": 1}, {"t1": "1"}, {"t1": None}):
        with pytest.raises(TypeError):
            F.settings("default", **bad)


def test_steps_time_tick_and_keep_their_order():
    E = Experiment("toy", {}, steps=("a", "b", "c", "d"), timings_suffix="_s", untimed=("c",))
    steps = E.start(quiet=False)
    with steps("a") as part:
        part.update()
        part.set_postfix_str("half")
    with steps("c"):
        pass
    with pytest.raises(ValueError, match="step 'b' of reproduce toy is not one of its next steps"):
        with steps("b"):
            pass
    with steps("d"):
        pass
    steps.close()
    assert list(steps.timings) == ["a_s", "d_s"] and all(v >= 0 for v in steps.timings.values())
    assert steps._bar.n == 3
    with pytest.raises(ValueError, match="steps must be distinct"):
        Experiment("toy", {}, steps=("a", "a"))
    with pytest.raises(ValueError, match="include the untimed ones"):
        Experiment("toy", {}, steps=("a",), untimed=("b",))


def test_common_doctests():
    import doctest

    from meanfield.reproduce import _common

    result = doctest.testmod(_common)
    assert result.attempted >= 4 and result.failed == 0
