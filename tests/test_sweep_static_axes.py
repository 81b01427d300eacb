"""Static settings as sweep axes (issue 46, item 5): ``mask``, ``normalization``, ``heads``, ...
given as lists compile once per value, the value a coordinate of the store, each point equal
to the separate single-valued run; and the plan built once per run (item 6)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from meanfield import sweep
from meanfield.sweep import plan as sweep_plan
from meanfield.sweep import run as sweep_run

USA = """
[model]
kind = "usa"
{model}
[grid]
n = [6]
beta = [1.0, 2.0]
seeds = 2
[time]
t1 = 0.3
dt = 0.1
save = 3
"""

SA = """
[model]
kind = "sa"
{model}
[grid]
n = [4]
beta = [1.0]
seeds = 2
[time]
t1 = 0.2
dt = 0.1
save = 2
"""


def _run(tmp_path, text: str, name: str):
    sweep.run_sweep(sweep.parse_spec(text), tmp_path / f"{name}.zarr", quiet=True)
    return sweep.load(tmp_path / f"{name}.zarr")


def test_mask_axis_equals_three_separate_runs(tmp_path):
    both = _run(
        tmp_path, USA.format(model='mask = ["none", "causal", "alibi"]\nslope = 0.5'), "all"
    )
    assert list(both.collapse_gap.dims[:2]) == ["mask", "n"]
    assert [str(m) for m in both["mask"].values] == ["none", "causal", "alibi"]
    for mask in ("none", "causal", "alibi"):
        # slope applies with alibi only: the other points are the runs without it
        one = _run(
            tmp_path,
            USA.format(model=f'mask = "{mask}"' + ("\nslope = 0.5" if mask == "alibi" else "")),
            mask,
        )
        for var in ("collapse_gap", "stop_time", "num_steps", "status"):
            np.testing.assert_array_equal(both[var].sel(mask=mask).values, one[var].values)
    causal, free = both.collapse_gap.sel(mask="causal"), both.collapse_gap.sel(mask="none")
    assert not np.array_equal(causal.values, free.values)  # the axis changes the dynamics


def test_normalization_and_heads_axes_equal_separate_runs(tmp_path):
    both = _run(tmp_path, SA.format(model='normalization = ["post", "pre"]\nheads = [1, 2]'), "nh")
    assert list(both.collapse_gap.dims[:3]) == ["heads", "normalization", "n"]  # declared order
    assert both["heads"].values.tolist() == [1, 2]
    for scheme in ("post", "pre"):
        for heads in (1, 2):
            one = _run(
                tmp_path,
                SA.format(model=f'normalization = "{scheme}"\nheads = {heads}'),
                f"{scheme}{heads}",
            )
            got = both.collapse_gap.sel(normalization=scheme, heads=heads).values
            np.testing.assert_array_equal(got, one.collapse_gap.values)


def test_spec_of_a_static_axis():
    spec = sweep.parse_spec(USA.format(model='mask = ["none", "alibi"]\nslope = 0.5'))
    assert spec.statics == {"mask": ("none", "alibi")} and spec.grid_size == 2 * 2 * 2
    assert spec.data["model"]["mask"] == ["none", "alibi"]
    assert "slope" in spec.at((("mask", "none"),)).inert_for("usa")
    assert spec.at((("mask", "alibi"),)).params["slope"] == 0.5
    # single values keep the normalised spec, so stores written before keep their hash
    plain = sweep.parse_spec(USA.format(model=""))
    assert plain.statics == {} and plain.settings == [()] and plain.at(()) is plain
    assert sweep.parse_spec(USA.format(model='mask = "none"')).hash == plain.hash
    plan = sweep.make_plan(spec, devices=1)
    assert [g.setting for g in plan.groups] == [(("mask", "none"),), (("mask", "alibi"),)]
    assert "mask=2" in plan.describe() and "usa mask=alibi n=6" in plan.describe()
    layout = sweep_plan.store_layout(plan)
    assert layout["dims"][:2] == ["mask", "n"] and layout["coords"]["mask"] == ["none", "alibi"]
    assert "model.mask" not in layout["attrs"]


@pytest.mark.parametrize(
    "model, output, match",
    [
        (
            'mask = ["none", "causal"]\nslope = 0.5',
            "",
            "model.slope = 0.5 applies with model.mask = 'alibi'; no value of model.mask = "
            "['none', 'causal'] is one",
        ),
        (
            'mask = ["none", "causal"]',
            '[output]\nobservables = ["energy"]',
            "unknown observable 'energy'",
        ),
        (
            'normalization = ["post", "pre"]',
            '[output]\nobservables = ["mean_radius"]',
            "not 'post'",
        ),
        ('mask = ["none", "none"]', "", "model.mask values must be distinct"),
        ('mask = ["none", "nope"]', "", "model.mask[1] must be one of"),
    ],
)
def test_static_axis_refusals(model, output, match):
    with pytest.raises((ValueError, TypeError), match=re.escape(match)):
        sweep.parse_spec(USA.format(model=model) + output)


def test_static_axis_resumes_what_a_dead_sweep_left(tmp_path):
    text = USA.format(model='mask = ["none", "causal", "alibi"]')
    full = _run(tmp_path, text, "full")
    out = tmp_path / "parts.zarr"
    sweep.run_sweep(text, out, quiet=True, part="2/3")  # a sweep that did a third, then died
    assert len(sweep.store.done_chunks(out)) == 1
    sweep.run_sweep(text, out, quiet=True, resume=True)
    np.testing.assert_array_equal(sweep.load(out).collapse_gap.values, full.collapse_gap.values)


def test_a_run_plans_once_and_asks_the_kind_once_per_group(tmp_path, monkeypatch):
    spec = sweep.parse_spec(USA.format(model='mask = ["none", "causal"]'))
    plans, asked = [], []
    make_plan, estimate = sweep_run.make_plan, type(spec.sweep_kind).estimate
    monkeypatch.setattr(
        sweep_run, "make_plan", lambda *a, **k: plans.append(1) or make_plan(*a, **k)
    )
    monkeypatch.setattr(
        type(spec.sweep_kind),
        "estimate",
        lambda self, *a: asked.append(a[1:]) or estimate(self, *a),
    )
    sweep.run_sweep(spec, tmp_path / "once.zarr", quiet=True)
    assert len(plans) == 1 and asked == [("usa", 6, 3), ("usa", 6, 3)]
    plan = sweep.make_plan(spec, devices=1)
    g = plan.groups[0]
    assert plan.cost(g, 3) == spec.sweep_kind.cost(spec.at(g.setting), "usa", 6, 3, 3, 0)


@pytest.mark.parametrize(
    "kinds, model, needle",
    [
        (
            '["usa", "sa"]',
            'rescaled = true\nmask = ["none", "causal"]',
            "model.rescaled = True applies with",
        ),
        (
            '["sa", "usa"]',
            'rescaled = true\nmask = ["none", "causal"]',
            "model.rescaled = True applies with",
        ),
        ('["rope", "prompt"]', 'plane = [0, 2]\nmask = ["none", "causal"]', "model.plane"),
        ('["prompt", "rope"]', "plane = [0, 2]", "model.plane"),
    ],
)
def test_each_kind_applies_its_own_rules_whatever_the_order(kinds, model, needle):
    """The rules are each kind's own (its parameters' declared ``applies``), checked per kind: a
    several-kind sweep refuses a value one of its kinds would not use, in either order."""
    text = USA.replace('kind = "usa"', f"kind = {kinds}").format(model=model)
    with pytest.raises(ValueError, match=re.escape(needle)):
        sweep.parse_spec(text)
