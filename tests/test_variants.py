"""Variants as objects (issue 46, item 1): the normalisation schemes are ``mf.normalization.Scheme``
members that hold their parameters and facts; the strings stay accepted (converted once); a scheme
defined here, outside meanfield, and registered runs in ``mf.simulate``, a sweep, the command line
and a phase diagram with no edit to meanfield.

The scheme of this module, ``Damped``, is Post-LN at a constant speed ``rate`` (a parameter of its
own): its flow is Post-LN's flow at time ``rate * t``, which every check below uses as its closed
form (the projected Euler step of speed ``rate`` and step ``h`` is the Post-LN step of ``rate h``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import cli, sweep
from meanfield import phase_diagram as pd
from meanfield.normalization import NGPT, Mix, Post, Pre, Scheme


class Damped(Scheme):
    """Post-LN at the constant speed ``rate``."""

    name: ClassVar[str | None] = "damped-test"
    rate: Any = mf.models.param(0.5, kind="float>0", optional=True, doc="speed factor (test)")

    def scale_velocity(self, v, t):
        return v * jnp.asarray(self.rate, v.dtype)

    def speed(self, t, dtype=None):
        return self.rate


def _registered(family, member):
    """``member`` registered in ``family`` for one test (unregistered after it)."""
    family.register(member)
    try:
        yield member
    finally:
        family.unregister(member.name)


@pytest.fixture
def damped():
    yield from _registered(Scheme, Damped)


def _x0(seed=0, n=6, d=3, dtype=jnp.float64):
    return mf.sphere.uniform(jax.random.key(seed), n, d, dtype=dtype)


# ---------------------------------------------------------------- the objects and their spellings
def test_strings_and_objects_are_one_value():
    assert mf.models.SelfAttention(1.0, normalization="ngpt", alpha=0.3) == mf.models.SelfAttention(
        1.0, normalization=NGPT(alpha=0.3)
    )
    usa = mf.kernels.USA(2.0, normalization="mix", switch_time=0.7)
    assert usa.normalization == Mix(switch_time=0.7) and usa.switch_time == 0.7
    assert mf.kernels.USA(2.0).normalization == Post()
    assert mf.kernels.make("rope", normalization="pre").normalization == Pre()
    assert Scheme.names()[:6] == mf.normalization.NORMALIZATIONS
    assert mf.normalization.RADIAL == ("pre", "mix", "peri")


@pytest.mark.parametrize(
    "build, needle",
    [
        (
            lambda: mf.models.SelfAttention(1.0, alpha=0.5),
            "alpha = 0.5 applies with normalization = 'ngpt', not 'post'",
        ),
        (
            lambda: mf.kernels.USA(1.0, normalization="pre", switch_time=2.0),
            "switch_time = 2.0 applies with",
        ),
        (lambda: mf.kernels.USA(1.0, normalization="bogus"), "normalization must be one of 'post'"),
        (
            lambda: mf.models.SelfAttention(1.0, normalization=NGPT(0.3), alpha=0.4),
            "alpha is given twice",
        ),
        (
            lambda: mf.kernels.make("usa", alpha=0.5),
            "alpha = 0.5 applies with normalization = 'ngpt'",
        ),
        (
            lambda: mf.models.SelfAttention(1.0, normalization=NGPT(-1.0)),
            "alpha must be > 0, got -1.0",
        ),
    ],
)
def test_one_refusal_per_rule(build, needle):
    with pytest.raises(ValueError) as e:
        build()
    assert needle in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_attributes_of_another_scheme_are_none_not_a_default():
    """``model.switch_time`` of nGPT is None (not Mix-LN's default 1), and None is what the
    constructor reads as "not given": ``dataclasses.replace`` round-trips every model."""
    m = mf.models.SelfAttention(1.0, normalization="ngpt", alpha=0.3)
    assert m.alpha == 0.3 and m.switch_time is None and m.sinkhorn_iters is None
    assert dataclasses.replace(m, beta=2.0) == mf.models.SelfAttention(
        2.0, normalization=NGPT(alpha=0.3)
    )
    assert dataclasses.replace(mf.kernels.USA(1.0), beta=3.0) == mf.kernels.USA(3.0)
    k = mf.kernels.make("prompt", normalization="mix", switch_time=0.5)
    assert k.normalization == Mix(0.5)


def test_a_subclass_of_a_builtin_is_not_the_builtin_flow():
    """A registered subclass of ``Post`` (or ``Softmax``) does not inherit ``post_ln`` (``softmax``):
    the fast paths that skip the scheme's methods do not take it."""

    class Half(Post):
        name: ClassVar[str | None] = "half-subclass-test"

        def speed(self, t, dtype=None):
            return 0.5

    class Flat(mf.models.Softmax):
        name: ClassVar[str | None] = "flat-subclass-test"

    assert Post.post_ln and not Half.post_ln and not Flat.softmax
    x0 = _x0(dtype=jnp.float32)
    half = mf.simulate(
        mf.kernels.USA(1.0, normalization=Half()), x0, t1=0.4, dt=0.1, solver="euler"
    )
    post = mf.simulate(mf.kernels.USA(1.0), x0, t1=0.2, dt=0.05, solver="euler")
    np.testing.assert_allclose(np.asarray(half.xs[-1]), np.asarray(post.xs[-1]), atol=1e-6)
    with pytest.raises(ValueError, match="runs the Post-LN flow"):
        mf.normalization.require_post(mf.kernels.USA(1.0, normalization=Half()), "simulate_long")


def test_a_clashing_parameter_is_refused():
    class Other(Scheme):
        name: ClassVar[str | None] = "clash-test"
        alpha: Any = mf.models.param(0.5, kind="float>0", optional=True, doc="another alpha")

    with pytest.raises(ValueError, match="clashes with alpha of normalization 'ngpt'"):
        Scheme.register(Other)
    assert "clash-test" not in Scheme.names()


def test_phase_diagram_takes_variant_objects():
    kw: dict[str, Any] = dict(n=6, d=3, seeds=2, t1=0.5, dt=0.1, checkpoints=2, backend="xla")
    a = pd.sa_phase_diagram(jax.random.key(0), [2.0], normalization=NGPT(0.5), **kw)
    b = pd.sa_phase_diagram(jax.random.key(0), [2.0], normalization="ngpt", alpha=0.5, **kw)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_schemes_parameters_are_traced_leaves():
    """``alpha`` is a leaf of the model (vmap and grad over it), the scheme's class is structure."""
    with jax.enable_x64(True):
        x = _x0()

        def field(alpha):
            return mf.models.SelfAttention(1.0, normalization="ngpt", alpha=alpha).field(x)

        F = jax.vmap(field)(jnp.array([0.2, 0.4]))
        np.testing.assert_allclose(
            np.asarray(F[1]), 2 * np.asarray(F[0]), rtol=1e-14
        )  # alpha A / |A|
        g = jax.grad(lambda a: jnp.sum(field(a) ** 2))(0.3)  # |F_i| = alpha: d/da (n a^2) = 2 n a
        assert float(g) == pytest.approx(2 * 6 * 0.3, rel=1e-12)


def test_flat_parameters_derive_from_the_registered_schemes(damped):
    names = [p.name for p in mf.models.SelfAttention.params()]
    i = names.index("normalization")
    assert names[i : i + 4] == ["normalization", "alpha", "rate", "switch_time"]
    rate = mf.kernels.MODELS["usa"].param("rate")
    assert rate.applies == (("normalization", ("damped-test",)),) and rate.traced
    assert "damped-test" in mf.kernels.MODELS["sa"].param("normalization").choices
    # the command line's generated schema holds meanfield's own schemes only
    from meanfield import _cli_schema

    block = _cli_schema.derive_models(builtin=True)
    usa = next(m for m in block if m.name == "usa")
    assert "damped-test" not in next(p for p in usa.params if p.name == "normalization").choices
    assert all(p.name != "rate" for p in usa.params)


# ---------------------------------------------------------------- a scheme of this module everywhere
def test_own_scheme_in_simulate_is_post_ln_at_its_speed(damped):
    """Euler with ``dt`` under ``Damped(rate)`` equals Post-LN Euler with ``rate * dt``, step by step."""
    x0 = _x0(dtype=jnp.float32)
    own = mf.simulate(
        mf.kernels.USA(1.0, normalization="damped-test"), x0, t1=0.4, dt=0.1, solver="euler"
    )
    post = mf.simulate(mf.kernels.USA(1.0), x0, t1=0.2, dt=0.05, solver="euler")
    np.testing.assert_allclose(np.asarray(own.xs[-1]), np.asarray(post.xs[-1]), rtol=0, atol=1e-6)
    obj = mf.simulate(
        mf.kernels.USA(1.0, normalization=Damped(rate=0.5)), x0, t1=0.4, dt=0.1, solver="euler"
    )
    np.testing.assert_array_equal(np.asarray(obj.xs), np.asarray(own.xs))


def test_own_scheme_in_a_sweep_equals_simulate(damped, tmp_path):
    text = (
        '[model]\nkind = "usa"\nnormalization = "damped-test"\nrate = [0.25, 0.5]\n'
        "[grid]\nn = [6]\nbeta = [1.0]\nseeds = 1\n[time]\nt1 = 0.4\ndt = 0.1\nsave = 3\n"
        '[output]\nobservables = ["collapse_gap"]\n'
    )
    spec = sweep.parse_spec(text)
    sweep.run_sweep(spec, tmp_path / "s.zarr", quiet=True)
    ds = sweep.load(tmp_path / "s.zarr")
    assert np.all(ds["status"].values == sweep.OK)
    for rate in (0.25, 0.5):
        m = mf.kernels.make("usa", d=3, beta=1.0, normalization="damped-test", rate=rate)
        traj = mf.simulate(
            m, mf.sphere.uniform(jax.random.key(0), 6, 3), t1=0.4, dt=0.1, ts=spec.ts
        )
        got = ds["collapse_gap"].sel(seed=0, n=6, beta=1.0, rate=rate).values
        np.testing.assert_allclose(got, np.asarray(traj.collapse_gap), rtol=1e-5, atol=1e-6)


def test_own_scheme_on_the_command_line(damped, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    common = ["simulate", "--n", "6", "--d", "3", "--t1", "0.2", "--dt", "0.05", "--no-plots"]
    assert (
        cli.main(
            [
                *common,
                "--normalization",
                "damped-test",
                "--rate",
                "0.5",
                "--out",
                str(tmp_path / "a"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    status = cli.main([*common, "--rate", "0.5", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert status == 2 and "--rate = 0.5 applies with --normalization = 'damped-test'" in err


def test_own_scheme_in_a_phase_diagram(damped):
    """The phase diagram's Euler loop under ``Damped`` (rate 1/2, step h) is Post-LN's with step h/2."""
    kw: dict[str, Any] = dict(n=8, d=3, seeds=2, t1=1.0, dt=0.1, checkpoints=3, backend="xla")
    own = pd.sa_phase_diagram(jax.random.key(1), [1.0, 2.0], normalization="damped-test", **kw)
    assert np.all(np.isfinite(np.asarray(own)))
    post = pd.sa_phase_diagram(jax.random.key(1), [1.0, 2.0], **{**kw, "t1": 0.5, "dt": 0.05})
    np.testing.assert_allclose(np.asarray(own), np.asarray(post), atol=1e-6)


# ---------------------------------------------------------------- an attention kind of this module
class Uniform(mf.models.AttentionKind):
    """Every admitted token weighs alike: $A_{ij} = 1/n$ ($\\beta$ plays no role)."""

    name: ClassVar[str | None] = "uniform-test"
    beta_free: ClassVar[bool] = True

    def weights(self, scores, beta, mask):
        return jnp.full(scores.shape, 1.0 / scores.shape[-1], scores.dtype)


@pytest.fixture
def uniform():
    yield from _registered(mf.models.AttentionKind, Uniform)


def _uniform_euler(x0, dt, steps):
    """The closed form of one projected Euler step of uniform attention (Q = K = V = I): every
    token moves towards the mean, x <- normalize(x + dt P_x xbar)."""
    x = np.asarray(x0, np.float64)
    for _ in range(steps):
        m = x.mean(axis=0)
        v = m[None, :] - np.sum(x * m[None, :], axis=1, keepdims=True) * x
        x = x + dt * v
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x


def test_own_attention_kind_everywhere(uniform, tmp_path, capsys, monkeypatch):
    """``attention="uniform-test"`` in ``mf.simulate`` (the closed-form step), a sweep (equal to
    simulate), the command line (its run store equal to simulate) and a phase diagram (no beta
    dependence: the kind is ``beta_free``)."""
    x0 = _x0(seed=2, n=6, d=3, dtype=jnp.float32)
    m = mf.models.SelfAttention(2.0, attention="uniform-test")
    assert m.attention == Uniform() and float(m.interaction_rate()) == 1.0
    traj = mf.simulate(m, x0, t1=0.3, dt=0.1, solver="euler")
    np.testing.assert_allclose(np.asarray(traj.xs[-1]), _uniform_euler(x0, 0.1, 3), atol=2e-6)

    text = (
        '[model]\nkind = "sa"\nattention = ["softmax", "uniform-test"]\n'
        "[grid]\nn = [6]\nbeta = [2.0]\nseeds = 1\n[time]\nt1 = 0.3\ndt = 0.1\nsave = 2\n"
        '[output]\nobservables = ["collapse_gap"]\n'
    )
    spec = sweep.parse_spec(text)
    sweep.run_sweep(spec, tmp_path / "s.zarr", quiet=True)
    ds = sweep.load(tmp_path / "s.zarr")
    for kind in ("softmax", "uniform-test"):
        model = mf.kernels.make("sa", d=3, beta=2.0, attention=kind)
        want = mf.simulate(
            model, mf.sphere.uniform(jax.random.key(0), 6, 3), t1=0.3, dt=0.1, ts=spec.ts
        )
        got = ds["collapse_gap"].sel(seed=0, n=6, beta=2.0, attention=kind).values
        np.testing.assert_allclose(got, np.asarray(want.collapse_gap), rtol=1e-5, atol=1e-6)

    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    out = tmp_path / "cli"
    args = ["--kernel", "sa", "--attention", "uniform-test", "--n", "6", "--d", "3", "--beta", "2"]
    args += [
        "--t1",
        "0.3",
        "--dt",
        "0.1",
        "--saves",
        "4",
        "--solver",
        "euler",
        "--seed",
        "2",
        "--no-plots",
    ]
    assert cli.main(["simulate", *args, "--out", str(out)]) == 0, capsys.readouterr().err
    stored = sweep.load(out).load()
    np.testing.assert_allclose(stored["x"].values[-1], _uniform_euler(x0, 0.1, 3), atol=2e-6)

    kw: dict[str, Any] = dict(n=8, d=3, seeds=2, t1=1.0, dt=0.1, checkpoints=3, backend="xla")
    frac = np.asarray(
        pd.sa_phase_diagram(jax.random.key(1), [0.5, 4.0], attention="uniform-test", **kw)
    )
    assert np.all(np.isfinite(frac))
    np.testing.assert_array_equal(frac[0], frac[1])  # beta plays no role


# ---------------------------------------------------------------- step rules
class EulerProjected(mf.steps.Projected):
    """The projected step, defined for Euler only (a rule of this module)."""

    name: ClassVar[str | None] = "euler-projected-test"
    solvers: ClassVar[tuple[str, ...] | None] = ("euler",)


@pytest.fixture
def euler_projected():
    yield from _registered(mf.steps.StepRule, EulerProjected)


def test_step_rules_are_objects_with_their_facts():
    S = mf.steps
    assert S.StepRule.coerce("projected") == S.Projected() and S.STEPS == mf.integrate.STEPS
    assert [S.StepRule.coerce(n).tangent for n in S.STEPS] == [True, False]
    assert S.Renormalize().solvers == ("euler",) and S.Projected().solvers is None
    with pytest.raises(ValueError, match="step must be one of 'projected', 'renormalize'"):
        S.StepRule.coerce("sideways")
    # an object and its name are one value: the same numbers
    model, x0 = mf.kernels.USA(1.0), _x0()
    kw = dict(t1=0.3, dt=0.1, solver="euler")
    a = mf.simulate(model, x0, step="renormalize", **kw)
    b = mf.simulate(model, x0, step=S.Renormalize(), **kw)
    np.testing.assert_array_equal(np.asarray(a.xs), np.asarray(b.xs))
    np.testing.assert_array_equal(
        np.asarray(pd.euler_step(x0, 1.0, 0.1, step=S.Renormalize())),
        np.asarray(pd.euler_step(x0, 1.0, 0.1, step="renormalize")),
    )


@pytest.mark.parametrize(
    "check, text",
    [
        (
            dict(solver="rk2"),
            "{step} needs {euler}, not {rk2} (its update: x + h F(x), then normalise)",
        ),
        (
            dict(scheme=Pre),
            "{step} renormalises to the sphere; {pre} has a radius: use {projected}",
        ),
        (
            dict(geometry=mf.geometry.Euclidean()),
            "{step} renormalises to the sphere; {euclidean} has no sphere: use {projected}",
        ),
    ],
    ids=["solver", "radius", "geometry"],
)
def test_one_refusal_text_in_each_spelling(check, text):
    """``StepRule.check`` is one text; Python, a sweep spec and the command line spell the settings."""
    from meanfield._spelling import say_cli, say_python, say_spec

    for say in (say_python, say_spec, say_cli):
        with pytest.raises(ValueError) as e:
            mf.steps.Renormalize().check(**check, say=say)
        want = text.format(
            step=say("step", "renormalize"),
            euler=say("solver", "euler"),
            rk2=say("solver", "rk2"),
            pre=say("normalization", "pre"),
            euclidean=say("geometry", "euclidean"),
            projected=say("step", "projected"),
        )
        assert str(e.value) == want
    assert say_spec("step", "renormalize") == "time.step = 'renormalize'"
    assert say_cli("step", "renormalize") == "--step renormalize"


def test_own_step_rule_everywhere(euler_projected, tmp_path, capsys, monkeypatch):
    """A rule registered here runs in ``mf.simulate`` (the projected Euler numbers), is refused
    with another solver by its own declaration in Python, a sweep spec and the command line, and
    steps a phase diagram."""
    model, x0 = mf.kernels.USA(1.0), _x0()
    kw: dict[str, Any] = dict(t1=0.3, dt=0.1, solver="euler")
    own = mf.simulate(model, x0, step="euler-projected-test", **kw)
    ref = mf.simulate(model, x0, step="projected", **kw)
    np.testing.assert_array_equal(np.asarray(own.xs), np.asarray(ref.xs))
    with pytest.raises(ValueError) as e:
        mf.simulate(model, x0, t1=0.3, dt=0.1, solver="rk2", step="euler-projected-test")
    assert str(e.value).startswith(
        "step='euler-projected-test' needs solver='euler', not solver='rk2'"
    )
    text = (
        '[model]\nkind = "usa"\n[grid]\nn = [6]\nbeta = [1.0]\nseeds = 1\n'
        '[time]\nt1 = 0.3\ndt = 0.1\nsave = 2\nsolver = "rk2"\nstep = "euler-projected-test"\n'
    )
    with pytest.raises(ValueError) as e:
        sweep.parse_spec(text)
    assert str(e.value).startswith(
        "time.step = 'euler-projected-test' needs time.solver = 'euler', not time.solver = 'rk2'"
    )
    spec = sweep.parse_spec(text.replace('"rk2"', '"euler"'))
    assert spec.step == "euler-projected-test" and spec.step_variant == EulerProjected()
    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")
    status = cli.main(
        ["simulate", "--n", "6", "--t1", "0.2", "--dt", "0.1", "--no-plots"]
        + ["--step", "euler-projected-test", "--solver", "rk2", "--out", str(tmp_path)]
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1, lines
    assert "--step euler-projected-test needs --solver euler, not --solver rk2" in lines[0]
    kw2: dict[str, Any] = dict(n=6, d=3, seeds=2, t1=0.3, dt=0.1, checkpoints=2, backend="xla")
    np.testing.assert_array_equal(
        np.asarray(
            pd.sa_phase_diagram(jax.random.key(2), [1.0], step="euler-projected-test", **kw2)
        ),
        np.asarray(pd.sa_phase_diagram(jax.random.key(2), [1.0], **kw2)),
    )


# ---------------------------------------------------------------- a model's size rules, one text
@pytest.mark.parametrize(
    "kind, flags, spec_model, grid, key",
    [
        ("prompt", ["--prompts", "9"], "prompts = 9", "n = [8]", "prompts"),
        ("rope", ["--plane", "0,3"], "plane = [0, 3]", "d = 3", "plane"),
        ("gauge", ["--d", "4"], "", "d = 4", "d"),
    ],
    ids=["prompts", "plane", "dimension"],
)
def test_size_rules_are_one_text_in_three_spellings(kind, flags, spec_model, grid, key, capsys):
    """``prompts <= n``, ``plane < d`` and a model's own ``d``: one rule (``meanfield._spelling.
    size_problem``), refused by the command line (before JAX), a sweep spec and ``mf.kernels.make``
    in the same words, each surface spelling the settings its own way."""
    from meanfield._spelling import say_cli, say_python, say_spec, size_problem

    params = {"prompts": 9} if key == "prompts" else {"plane": (0, 3)} if key == "plane" else {}
    need = 3 if kind == "gauge" else None
    n, d = (8, 3) if key != "d" else (8, 4)
    texts = {
        s: size_problem(params, n=n, d=d, required_d=need, model=kind, say=s)
        for s in (say_python, say_cli, say_spec)
    }
    assert all(texts.values()) and len(set(texts.values())) == 3
    assert (
        f"--{key}" in texts[say_cli]
        and f"{'grid' if key == 'd' else 'model'}.{key}" in texts[say_spec]
    )
    # the command line, before its run
    status = cli.main(
        ["simulate", "--kernel", kind, "--n", "8", "--t1", "0.1", "--no-plots", *flags]
        + ([] if key == "d" else ["--d", "3"])
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].endswith(texts[say_cli]), lines
    # a sweep spec
    text = (
        f'[model]\nkind = "{kind}"\n{spec_model}\n[grid]\n'
        + ("n = [8]\nd = 3" if key == "prompts" else "n = [8]\n" + grid)
        + "\nbeta = [1.0]\nseeds = 1\n[time]\nt1 = 0.1\n"
    )
    with pytest.raises(ValueError) as e:
        sweep.parse_spec(text)
    assert str(e.value) == texts[say_spec]
    # Python (the registry): the dimension and plane rules (prompts need n, which make has not)
    if key != "prompts":
        with pytest.raises(ValueError) as e:
            mf.kernels.make(kind, d=d, **({"plane": (0, 3)} if key == "plane" else {}))
        assert str(e.value) == texts[say_python]
