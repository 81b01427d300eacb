"""Property tests of sweep specs (issue 17, item 6): generated bad and edge-case specs give
a clear error (``ValueError``/``TypeError``/``TOMLDecodeError`` with a one-line message; on
the CLI one line and status 2) or a valid plan whose checks pass or refuse with the
estimate -- never another exception, a traceback or a hang."""

from __future__ import annotations

import json
import math
import tomllib

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from meanfield import kernels, sweep
from meanfield._resources import ResourceLimitError
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import spec as sweep_spec
from meanfield.sweep.plan import store_layout

EXPECTED = (ValueError, TypeError, tomllib.TOMLDecodeError)


def toml_value(v) -> str:
    """A Python value as a TOML value (inline tables for dicts). JSON strings are TOML basic
    strings; floats include TOML's inf and nan."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def toml_text(spec: dict) -> str:
    """A spec dictionary (top-level scalars, then one table per dict) as TOML text."""
    lines = [
        f"{json.dumps(k)} = {toml_value(v)}" for k, v in spec.items() if not isinstance(v, dict)
    ]
    for table, body in spec.items():
        if isinstance(body, dict):
            lines.append(f"[{json.dumps(table)}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- strategies

text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=6)
junk = st.one_of(text, st.booleans(), st.just([]), st.just({}), st.just([[1]]), st.just({"x": 1}))
edge_int = st.one_of(st.integers(-3, 1), st.sampled_from([10**7 + 1, 2**31 - 1, 2**31, 2**63 - 1]))
small_int = st.one_of(st.integers(2, 40), st.integers(2, 40), st.integers(2, 40), edge_int)
positive = st.one_of(
    st.floats(0.05, 10), st.sampled_from([1e-12, 1e-300, 1e12, 1e39, 1e300, 88.7, 200.0])
)
real = st.one_of(
    positive,
    positive,
    st.floats(-10, 10, allow_nan=False),
    st.sampled_from([0.0, math.inf, -math.inf, math.nan]),
    st.integers(-3, 10),
)


def listed(strategy, max_size=3):
    return st.one_of(
        strategy,
        st.lists(strategy, min_size=1, max_size=max_size),
        st.lists(strategy, max_size=max_size),
    )


beta = st.one_of(
    st.lists(positive, min_size=1, max_size=3),
    st.lists(real, max_size=3),
    st.fixed_dictionaries({"critical": listed(positive)}),
    st.fixed_dictionaries({"c": listed(positive), "p": st.one_of(st.floats(-2, 2), real)}),
    st.dictionaries(st.sampled_from(["critical", "c", "p", "gamma"]), listed(real), max_size=3),
)


def often(draw, good, bad, p_bad: int = 12):
    """``good`` most of the time, ``bad`` about once in ``p_bad`` draws."""
    return draw(bad) if draw(st.integers(0, p_bad - 1)) == p_bad - 1 else draw(good)


@st.composite
def base(draw) -> dict:
    """A spec dictionary whose values are mostly valid and sometimes at or past the edges."""
    names = [*kernels.MODELS, "attention"]  # the registry's models and the attention sweep kind
    kind = draw(st.sampled_from(names))
    kind_value = often(
        draw,
        st.just(kind),
        st.one_of(st.lists(st.sampled_from(names), min_size=1, max_size=2), st.just("transformer")),
    )
    model: dict = {"kind": kind_value}
    params = sweep_spec.kind_of(kind).model_params(kind)
    pars = [p for p in params if p.name != "beta"]
    for p in (
        draw(st.lists(st.sampled_from(pars), unique_by=lambda p: p.name, max_size=2))
        if pars
        else []
    ):
        if p.choices:
            good = st.sampled_from(list(p.choices))
        elif isinstance(p.default, bool):
            good = st.booleans()
        elif p.kind == "plane":
            good = st.just([0, 1])
        elif isinstance(p.default, int):
            good = st.integers(1, 4)
        else:
            good = st.one_of(
                positive, st.lists(st.floats(0.1, 2.0), min_size=1, max_size=2, unique=True)
            )
        model[p.name] = often(draw, good, st.one_of(real, st.lists(real, max_size=2), junk))
    has_beta = any(p.name == "beta" for p in params)
    grid: dict = {
        "n": often(
            draw,
            st.lists(st.integers(2, 40), min_size=1, max_size=2, unique=True),
            listed(small_int),
        ),
        "seeds": often(draw, st.integers(1, 4), small_int),
    }
    if draw(st.booleans()):
        grid["d"] = often(
            draw,
            st.integers(2, 5),
            st.one_of(
                st.lists(st.integers(2, 5), min_size=1, max_size=2),
                st.integers(-1, 1),
                st.just(2**31),
            ),
        )
    if has_beta and draw(st.integers(0, 9)) < 9:
        grid["beta"] = draw(beta)
    if draw(st.integers(0, 3)) == 3:
        grid["seed"] = draw(small_int)
    spec: dict = {"model": model, "grid": grid}
    if sweep_spec.kind_of(kind).timed or draw(st.integers(0, 5)) == 5:
        solver = often(
            draw,
            st.sampled_from(["euler", "rk2", "rk4"]),
            st.sampled_from(["tsit5", "dopri5", "leapfrog"]),
        )
        t: dict = {"t1": often(draw, st.floats(0.1, 2.0), real), "solver": solver}
        if draw(st.booleans()):
            t["dt"] = often(draw, st.floats(0.01, 0.1), real)
        if draw(st.booleans()):
            t["save"] = often(
                draw, st.integers(2, 6), st.one_of(small_int, st.lists(real, max_size=4))
            )
        if solver in ("tsit5", "dopri5") and draw(st.integers(0, 3)) < 3:
            t["rtol"], t["atol"] = draw(positive), draw(positive)
        for key, strat in (
            ("early_stop", real),
            ("max_steps", small_int),
            ("step_rule", st.sampled_from(["fixed", "reference", "adaptive"])),
        ):
            if draw(st.integers(0, 4)) == 4:
                t[key] = draw(strat)
        spec["time"] = t
    if draw(st.booleans()):
        obs = list(
            sweep_spec.SIM_OBSERVABLES
            if sweep_spec.kind_of(kind).timed
            else sweep_spec.ATTENTION_OBSERVABLES
        )
        out: dict = {
            "observables": often(
                draw,
                st.lists(st.sampled_from(obs), min_size=1, max_size=3, unique=True),
                st.lists(st.sampled_from(list(sweep.OBSERVABLES) + ["entropy"]), max_size=3),
            )
        }
        if draw(st.booleans()):
            out["cluster_threshold"] = often(draw, positive, real)
        if draw(st.booleans()):
            out["top_k"] = often(draw, st.integers(1, 4), small_int)
        spec["output"] = out
    if draw(st.integers(0, 3)) == 3:
        spec["dtype"] = often(draw, st.sampled_from(["float32", "float64"]), st.just("float16"))
    if draw(st.integers(0, 3)) == 3:
        spec["name"] = often(draw, st.text(alphabet="abc_-1", min_size=1, max_size=6), text)
    return spec


@st.composite
def specs(draw) -> dict:
    """A spec dictionary, mostly well-formed; sometimes one value replaced by a value of the
    wrong kind, one key added that does not exist, or a table dropped."""
    spec = draw(base())
    what = draw(st.sampled_from(["none"] * 6 + ["junk", "key", "drop"]))
    table = draw(st.sampled_from(sorted(k for k, v in spec.items() if isinstance(v, dict))))
    if what == "junk" and spec[table]:
        spec[table][draw(st.sampled_from(sorted(spec[table])))] = draw(junk)
    elif what == "key":
        spec[table][draw(st.sampled_from(["colour", "repeats", "t0", "beta", "kind"]))] = draw(junk)
    elif what == "drop":
        spec.pop(table)
    return spec


# --------------------------------------------------------------------------- properties


def _one_line(e: BaseException) -> None:
    text = str(e)
    assert text.strip(), f"{type(e).__name__} without a message"
    if not isinstance(e, tomllib.TOMLDecodeError):
        assert len(text.strip().splitlines()) == 1, text


def _check_spec_text(text: str) -> None:
    try:
        spec = sweep.parse_spec(text)
    except EXPECTED as e:
        _one_line(e)
        event("spec error")
        return
    plan = sweep.make_plan(spec, "2GB", devices=1)
    assert plan.num_chunks >= len(plan.groups) >= 1
    assert isinstance(plan.describe(), str)
    try:
        plan.check(device_memory=(2**34, 2**34))
    except ResourceLimitError as e:
        event("plan refused")
        _one_line(e)
        assert "~" in str(e) or "steps per point" in str(e) or "chunks" in str(e)  # the estimate
        return
    event("valid plan")
    # a plan that passes its checks: every beta of the grid is a finite positive number of its dtype
    for g in plan.groups:
        b = spec.beta_values(g.n, g.d)
        if b is not None:
            assert np.all(np.isfinite(np.asarray(b, spec.dtype))) and np.all(np.asarray(b) > 0)
    if spec.grid_size <= 10**4:
        layout = store_layout(plan)
        assert layout["chunks_total"] == plan.num_chunks == len(plan.chunks)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_generated_specs_give_a_clear_error_or_a_valid_plan(spec):
    _check_spec_text(toml_text(spec))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_spec_text_gives_a_clear_error_or_a_valid_plan(data):
    """Random edits of a valid spec's text (insertions, deletions, replacements)."""
    text = (
        '[model]\nkind = "usa"\n[grid]\nn = [8]\nbeta = [1.0]\nseeds = 2\n'
        "[time]\nt1 = 0.5\ndt = 0.1\nsave = 3\n"
    )
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 4)))
        text = (
            text[:i]
            + data.draw(st.text(alphabet="[]{}=,.\"'-+e0123456789 \nabc_", max_size=4))
            + text[j:]
        )
    _check_spec_text(text)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(spec=specs())
def test_generated_specs_on_the_cli_are_one_line_or_a_dry_run(spec, tmp_path, capsys):
    path = tmp_path / "gen.toml"
    path.write_text(toml_text(spec))
    out = tmp_path / "never.zarr"
    rc = sweep_cli.main([str(path), "--out", str(out), "--dry-run"])
    cap = capsys.readouterr()
    assert rc in (0, 2), rc
    if rc == 2:
        lines = cap.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("meanfield sweep: error: "), cap.err
    else:
        assert cap.out.startswith("sweep ")
    assert not out.exists()


def test_the_toml_writer_round_trips():
    spec = {
        "name": "x",
        "model": {"kind": ["usa", "rope"], "omega": [0.5, 1.0]},
        "grid": {"n": [8], "beta": {"c": [1.0], "p": -0.5}, "seeds": 2},
        "time": {"t1": math.inf},
    }
    assert tomllib.loads(toml_text(spec)) == spec
