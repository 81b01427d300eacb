"""Property tests of `meanfield simulate`'s argument handling (issue 17, item 6).

Generated command lines (bad numbers, huge and tiny numbers, NaN/inf strings, negative values,
unknown flags, flags of another model, missing values) must end in one of three ways:
exit 0 with valid outputs, exit 1 with the outputs of a failed run recorded as failed, or
exit 2 with exactly one line on stderr; never a traceback, an exception out of ``main`` or a
hang. Sizes stay tiny: every generated value is either small or far past the resource limits
(refused before anything is allocated).
"""

import json

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from meanfield import cli, sweep

BAD_TEXT = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "",
    "abc",
    "1e",
    "0x10",
    "--",
    "1,2",
    "١",
    "1_0",
]
HUGE = ["1e20", "1e300", "1e400", "-1e300", str(2**64), str(10**30), "1e-300", "-0", "0"]

# value strategies per flag: small values that run fast, or values far past the limits
small_n = st.sampled_from(["2", "3", "8", "12", "16"])
small_d = st.sampled_from(["2", "3", "4"])
small_t1 = st.sampled_from(["0.02", "0.05", "0.1"])
small_dt = st.sampled_from(["0.01", "0.02", "0.05", "0.1"])
small_saves = st.sampled_from(["2", "3", "5"])
number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(BAD_TEXT + HUGE),
)
refused_size = st.sampled_from(["1e12", str(10**20), "1e400", "-3", "1", "0", "nan", "2.5", "abc"])
refused_time = st.sampled_from(["1e12", "1e300", "inf", "-1", "0", "nan", "abc"])
refused_step = st.sampled_from(["1e-14", "1e-300", "0", "-0.1", "inf", "nan", "abc"])

FLAGS = {
    "--n": st.one_of(small_n, refused_size),
    "--d": st.one_of(small_d, refused_size),
    "--t1": st.one_of(small_t1, refused_time),
    "--dt": st.one_of(small_dt, refused_step),
    "--saves": st.one_of(small_saves, st.sampled_from(["1e10", "1", "0", "-5", "abc", "inf"])),
    "--seed": number,
    "--beta": st.one_of(
        number, st.sampled_from(["0.5", "2", "60", "88.7", "88.72"])
    ),  # 88.7: a failed run
    "--lam": number,
    "--m": number,
    "--omega": number,
    "--amplitude": number,
    "--k": number,
    "--frequency": number,
    "--prompts": st.one_of(st.sampled_from(["1", "2", "3"]), number),
    "--gauge-seed": number,
    "--plane": st.sampled_from(["0,1", "1,2", "0,0", "5,1", "a,b", "-1,2", "0,1,2"]),
    "--kernel": st.sampled_from(
        [
            "usa",
            "distance-bias",
            "toeplitz",
            "rope",
            "phase-field",
            "gauge",
            "prompt",
            "sa",
            "attention",  # a sweep kind, not a model: an invalid choice
            "nope",
        ]
    ),
    "--solver": st.sampled_from(["euler", "rk2", "rk4", "tsit5", "rk9"]),
    "--rtol": number,
    "--atol": number,
    "--early-stop": number,
}
SWITCHES = [
    "--rescaled",
    "--no-rescaled",
    "--normalized",
    "--no-normalized",
    "--force",
    "--bogus",
    "-x",
    "--out",
    "--n",
]  # the last two: a flag without its value (at the end of the line)


@st.composite
def argvs(draw):
    items = draw(st.lists(st.sampled_from(sorted(FLAGS) + SWITCHES), max_size=6))
    argv = ["simulate"]
    for flag in items:
        if flag in FLAGS:
            argv += [flag, draw(FLAGS[flag])]
        else:
            argv.append(flag)
    return argv


def _outputs_valid(out, failed: bool):
    summary = json.loads(
        (out / "summary.json").read_text(), parse_constant=lambda t: pytest.fail(t)
    )
    assert summary["failed"] is failed
    assert (summary["failure"] is not None) == failed
    # the numbers: the run's store, opened and verified as a sweep store is
    ds = sweep.load(out)
    assert {"x", "x0", "collapse_gap"} <= set(ds.data_vars) and ds.sizes["time"] >= 1
    assert int(ds["status"]) == (sweep.FAILED if failed else sweep.OK)


@pytest.mark.slow
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(argv=argvs())
@example(argv=["simulate", "--beta", "88.7"])  # a failed run: exit 1, outputs recorded
@example(argv=["simulate", "--t1", "1e9"])
@example(argv=["simulate", "--kernel", "toeplitz", "--beta", "2"])
def test_simulate_command_lines_end_cleanly(argv, tmp_path_factory, capsys, monkeypatch):
    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")
    out = tmp_path_factory.mktemp("out")
    # small defaults first (argparse keeps the last value of a repeated flag), --out last unless
    # the generated line ends with a flag that lacks its value
    base = ["--n", "8", "--t1", "0.05", "--saves", "3"]
    line = [argv[0], *base, *argv[1:]]
    if line[-1] not in ("--out", "--n"):
        line += ["--out", str(out)]
    try:
        status = cli.main(line)
    except SystemExit as e:  # pragma: no cover - would be a bug: main returns a status
        pytest.fail(f"SystemExit({e.code}) escaped main for {line}")
    _, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, (line, err)
    assert status in (0, 1, 2), (line, status)
    event(f"exit {status}")
    if status == 2:
        assert len(lines) == 1, (line, lines)
        assert "error" in lines[0]
    elif "--out" in line and line[-2] == "--out":
        _outputs_valid(out, failed=status == 1)


@pytest.mark.parametrize("flag", ["--n", "--d", "--saves", "--seed", "--prompts", "--k"])
@given(value=st.integers(min_value=-(2**80), max_value=2**80))
@settings(max_examples=25, deadline=None)
def test_integer_flags_never_overflow(flag, value):
    # parse only (no run): an integer of any size is accepted in its range or refused in one line
    parser = cli.build_parser()
    try:
        args = parser.parse_args(["simulate", flag, str(value)])
    except SystemExit as e:
        assert e.code == 2
        return
    name = flag[2:].replace("-", "_")
    assert getattr(args, name) == value


@given(text=st.text(max_size=12))
@settings(max_examples=80, deadline=None)
def test_number_parsers_accept_or_refuse_any_text(text):
    parsers = (
        cli._arg("float>0"),
        cli._arg("float>=0"),
        cli._arg("float", magnitude=cli.PARAM_LIMIT),
        cli._arg("int", minimum=0, maximum=10),
        cli._arg("plane"),
    )
    for parse in parsers:
        try:
            v = parse(text)
        except Exception as e:  # only argparse's type error: a one-line message
            assert type(e).__name__ == "ArgumentTypeError", (text, e)
            assert "\n" not in str(e)
        else:
            assert all(
                u == u and abs(u) != float("inf") for u in (v if isinstance(v, tuple) else (v,))
            )  # finite


def test_console_script_exists():
    # the entry point the property test stands for (`meanfield` is cli.main)
    import importlib.metadata

    eps = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "meanfield"
    ]
    assert eps and eps[0].value.startswith("meanfield.cli:main")
