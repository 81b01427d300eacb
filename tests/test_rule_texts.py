"""A rule that several surfaces check has one text, spelled by each surface (issue 46, item 3).

"X applies with Y" (``meanfield._spelling.applies_problem``): a model's constructor, a variant
(``Scheme.coerce``), the registry (``mf.kernels.make``), a sweep spec and the command line each
refused it with a text of their own; the energy of a masked kernel (``mf.masks.energy_problem``)
and the observables of tokens in R^d (``Geometry.observables_problem``) were decided again by name
in the sweep spec. Each refusal below is compared with the rule's own text in that surface's
spelling, character for character."""

import re

import jax
import pytest

import meanfield as mf
from meanfield import cli, sweep
from meanfield._spelling import applies_problem, say_cli, say_python, say_spec

GRID = "[grid]\nn = [6]\nbeta = [0.5]\nseeds = 1\n[time]\nt1 = 0.2\ndt = 0.05\nsave = 3\n"
SLOPE = [("mask", ("alibi",))]
ALPHA = [("normalization", ("ngpt",))]


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    return str(e.value)


def test_applies_with_is_one_text_in_python_the_registry_and_a_spec():
    # the constructor of a model and of its variant: the owner named
    got = _message(mf.models.SelfAttention, 1.0, alpha=0.5)
    assert got == applies_problem(
        "alpha", 0.5, ALPHA, {"normalization": "post"}, owner="SelfAttention"
    ), got
    assert got == (
        "alpha = 0.5 applies with normalization = 'ngpt', not 'post' (SelfAttention would not use it)"
    )
    # the registry's flat parameters
    got = _message(mf.kernels.make, "usa", beta=1.0, slope=2.0)
    assert got == applies_problem("slope", 2.0, SLOPE, {"mask": "none"}, say=say_python), got
    # a sweep spec's [model]
    got = _message(sweep.parse_spec, '[model]\nkind = "usa"\nslope = 2.0\n' + GRID)
    assert got == applies_problem("slope", 2.0, SLOPE, {"mask": "none"}, say=say_spec), got
    assert got == "model.slope = 2.0 applies with model.mask = 'alibi', not 'none'"
    # a value at its default changes nothing there, and is not refused
    mf.kernels.make("usa", beta=1.0, slope=1.0)


def test_applies_with_is_one_text_on_the_command_line(tmp_path, capsys):
    argv = ["simulate", "--kernel", "usa", "--n", "6", "--t1", "0.1", "--dt", "0.05"]
    for flags, key, value, rule, current in (
        (["--slope", "2"], "slope", 2.0, SLOPE, {"mask": "none"}),
        (["--kernel", "sa", "--alpha", "0.5"], "alpha", 0.5, ALPHA, {"normalization": "post"}),
    ):
        assert cli.main(argv + flags + ["--out", str(tmp_path / "bad")]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        text = applies_problem(key, value, rule, current, say=say_cli)
        assert len(err) == 1 and err[0].endswith(text), (err, text)
    assert not (tmp_path / "bad").exists()
    # a flag given on the command line acts or is refused, even at its default value, rules of two
    # switches too (drawn weights: --weights or --value)
    assert (
        cli.main(argv + ["--kernel", "sa", "--weight-seed", "0", "--out", str(tmp_path / "b")]) == 2
    )
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].endswith(
        "--weight-seed = 0 applies with --weights = 'gaussian' or 'symmetric' or 'gpt2' or "
        "--value = 'gaussian' or '+qk' or '-qk', not --weights = 'identity' and --value = 'identity'"
    ), err


def test_applies_problem_names_every_switch_it_knows():
    two = [("mask", ("window",)), ("attention", ("softmax",))]
    text = applies_problem(
        "width", 3, two, {"mask": "causal", "attention": "hardmax"}, say=say_spec
    )
    assert text == (
        "model.width = 3 applies with model.mask = 'window' or model.attention = 'softmax', "
        "not model.mask = 'causal' and model.attention = 'hardmax'"
    )
    # a sweep's static axis: none of its values (the spec's refusal of a list)
    axis = applies_problem(
        "slope",
        0.5,
        [("mask", ("alibi",))],
        {"mask": ["none", "causal"]},
        axes=["mask"],
        say=say_spec,
    )
    assert axis == (
        "model.slope = 0.5 applies with model.mask = 'alibi'; no value of "
        "model.mask = ['none', 'causal'] is one"
    )
    with pytest.raises(ValueError) as e:
        sweep.parse_spec('[model]\nkind = "usa"\nmask = ["none", "causal"]\nslope = 0.5\n' + GRID)
    assert str(e.value) == axis
    one = {"mask": ["none", "alibi"]}
    assert applies_problem("slope", 0.5, [("mask", ("alibi",))], one, axes=["mask"]) is None
    # one switch it needs is set: it acts; no switch known: nothing to say
    assert applies_problem("width", 3, two, {"mask": "window", "attention": "hardmax"}) is None
    assert applies_problem("width", 3, two, {}) is None


def test_a_masked_kernel_has_no_energy_in_one_text():
    why = mf.masks.energy_problem(mf.masks.ALiBi(1.0))
    assert why is not None and mf.masks.energy_problem(None) is None
    model = mf.kernels.USA(1.0, mask=mf.masks.Causal())
    with pytest.raises(TypeError) as e:
        mf.energy(model, mf.sphere.uniform(jax.random.key(0), 4, 3))
    assert why in str(e.value) and "USA with mask=Causal" in str(e.value), str(e.value)
    # the spec decides by the mask the registry builds (mf.masks.from_params), and says why
    with pytest.raises(ValueError) as e:
        sweep.parse_spec(
            '[model]\nkind = "usa"\nmask = ["none", "causal"]\n'
            + GRID.replace("[time]\n", '[output]\nobservables = ["energy"]\n[time]\n')
        )
    assert f"({why})" in str(e.value), str(e.value)
    # mf.simulate's energy-plateau stop gives the same reason
    with pytest.raises(
        TypeError, match=re.escape(f"early_stop needs an energy; USA has none ({why})")
    ):
        mf.simulate(
            model, mf.sphere.uniform(jax.random.key(0), 4, 3), t1=0.1, dt=0.05, early_stop=1e-6
        )
    assert not model.has_energy and mf.kernels.USA(1.0).has_energy
    # without a mask the energy is there
    spec = sweep.parse_spec(
        '[model]\nkind = "usa"\nmask = "none"\n'
        + GRID.replace("[time]\n", '[output]\nobservables = ["energy"]\n[time]\n')
    )
    assert "energy" in spec.observables


def test_the_geometry_states_which_observables_it_has():
    euclid, sphere_ = mf.geometry.Euclidean, mf.geometry.Sphere
    names = list(mf.geometry.SPHERE_OBSERVABLES)
    assert sphere_.observables_problem(names) is None
    assert euclid.observables_problem(["collapse_gap"]) is None
    text = euclid.observables_problem(["collapse_gap", "order_parameter"], say=say_cli)
    assert text is not None and text.startswith(
        "'order_parameter' is an observable of tokens on the sphere; --geometry euclidean"
    )
    # the spec's refusal is this text in its spelling
    with pytest.raises(ValueError) as e:
        sweep.parse_spec(
            '[model]\nkind = "sa"\ngeometry = "euclidean"\n'
            + GRID.replace("[time]\n", '[output]\nobservables = ["clusters"]\n[time]\n')
        )
    assert str(e.value) == "output.observables " + euclid.observables_problem(
        ["clusters"], say=say_spec
    )
