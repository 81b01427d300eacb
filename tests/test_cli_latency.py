"""The command line's edges (issue 31): ``--help`` and argument errors return before JAX is
imported; ``simulate`` writes its numbers before its figures and ``--no-plots`` draws none;
only the ``meanfield`` process itself sets up the process (``configure_process``); the
parser's copy of the registry (``meanfield._cli_schema``) is the registry's."""

import json
import os
import re
import subprocess
import sys

import pytest

from meanfield import _cli_schema, cli
from meanfield.sweep import cli as sweep_cli

# `main()` as the console script `meanfield` calls it (argv None: the process itself), then
# whether JAX (and NumPy, matplotlib) were imported, as the last line of stdout
_PROCESS = """
import json, sys
from meanfield.{module} import {entry}
sys.argv = ["meanfield", *json.loads(sys.argv[1])]
rc = {entry}()
print(json.dumps({{"rc": rc, "loaded": sorted(m for m in ("jax", "jaxlib", "equinox", "matplotlib") if m in sys.modules)}}))
"""


def _process(args, module="cli", entry="main", env=None):
    code = _PROCESS.format(module=module, entry=entry)
    p = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    result = json.loads(p.stdout.strip().splitlines()[-1])
    return result["rc"], result["loaded"], p


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["simulate", "--help"],
        ["reproduce", "--help"],
        ["sweep", "--help"],
        ["plot", "--help"],
        ["info", "--help"],
        [],
    ],
)
def test_help_imports_no_jax(args):
    rc, loaded, p = _process(args)
    assert rc == (2 if not args else 0), p.stderr
    assert "usage: meanfield" in p.stdout
    assert loaded == []


@pytest.mark.parametrize(
    "args, needle",
    [
        (["simulate", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["simulate", "--n", "1"], "argument --n: must be >= 2, got 1"),
        (["simulate", "--beta", "-1"], "argument --beta: must be > 0, got -1"),
        (["simulate", "--kernel", "nope"], "argument --kernel: invalid choice: 'nope'"),
        (["simulate", "--lam", "2"], "--lam is not a parameter of --kernel usa"),
        (
            ["simulate", "--kernel", "prompt", "--prompts", "5", "--n", "4"],
            "--prompts must be <= --n = 4",
        ),
        (["simulate", "--step", "renormalize"], "--step renormalize needs --solver euler"),
        (["reproduce", "nope"], "argument experiment: invalid choice: 'nope'"),
        (["reproduce", "--quick", "--full"], "--quick and --full exclude each other"),
        (["sweep", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["plot"], "the following arguments are required: store"),
        (["no-such-command"], "invalid choice: 'no-such-command'"),
    ],
)
def test_argument_errors_are_one_line_before_jax(args, needle):
    rc, loaded, p = _process(args)
    assert rc == 2
    assert p.stderr.count("\n") == 1 and needle in p.stderr, p.stderr
    assert loaded == []


def test_python_m_meanfield_sweep_help_imports_no_jax():
    rc, loaded, p = _process(["--help"], module="sweep.cli", entry="console")
    assert rc == 0 and "usage: meanfield sweep" in p.stdout
    assert loaded == []


def test_simulate_help_from_the_schema_equals_the_registry_s(capsys, monkeypatch):
    """A fresh process parses from ``meanfield._cli_schema``; this one (the registry imported)
    from the registry itself: the same flags, choices, defaults and help."""
    env = {**os.environ, "COLUMNS": "160"}
    rc, loaded, p = _process(["simulate", "--help"], env=env)
    assert rc == 0 and loaded == []
    monkeypatch.setenv("COLUMNS", "160")
    assert "meanfield.kernels" in sys.modules
    assert cli.main(["simulate", "--help"]) == 0
    assert capsys.readouterr().out == p.stdout.rsplit("\n", 2)[0] + "\n"


def test_the_schema_is_what_the_registry_derives_now():
    """``python -m meanfield._cli_schema --write`` regenerates it after a change of the registry."""
    derived = _cli_schema.derive()
    assert _cli_schema.MODELS == derived["MODELS"]
    assert _cli_schema.SOLVERS == derived["SOLVERS"] and _cli_schema.STEPS == derived["STEPS"]
    text = open(_cli_schema.__file__).read()
    assert _cli_schema.render(derived) in text
    assert _cli_schema.main(["--check"]) == 0


def test_the_schema_check_fails_on_drift(monkeypatch, capsys):
    m = _cli_schema.MODELS[0]
    drifted = m._replace(params=(m.params[0]._replace(default=2.0), *m.params[1:]))
    monkeypatch.setattr(
        _cli_schema, "derive_models", lambda **kw: (drifted, *_cli_schema.MODELS[1:])
    )
    assert _cli_schema.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def test_a_model_registered_at_run_time_gets_its_flags(monkeypatch, tmp_path, capsys):
    """With the registry imported, the parser reads it (not the schema): a new model's new
    parameter is a flag of `simulate`."""
    import dataclasses

    from meanfield import kernels

    usa = kernels.MODELS["usa"]
    extra = kernels.Param("zeta", 0.5, True, "float>0", "a parameter of no shipped model")
    monkeypatch.setitem(
        kernels.MODELS,
        "usa-extra",
        dataclasses.replace(usa, name="usa-extra", params=(*usa.params, extra)),
    )
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["simulate", "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"--zeta ZETA\s+a parameter of no shipped model \(usa-extra; default 0.5\)", out
    ), out
    assert cli.main(["simulate", "--zeta", "1", "--out", str(tmp_path)]) == 2
    assert "--zeta is not a parameter of --kernel usa" in capsys.readouterr().err


class _Calls:
    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1


@pytest.fixture
def configure_calls(monkeypatch):
    """``configure_process`` replaced by a counter (no process-wide setting in the tests)."""
    from meanfield import compilation_cache

    calls = _Calls()
    monkeypatch.setattr(compilation_cache, "configure_process", calls)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return calls


def test_only_the_process_itself_is_configured(configure_calls, monkeypatch, tmp_path):
    """``main()`` (the console script) configures the process once its arguments parse;
    ``main(argv)`` from Python never does, and neither does ``--help`` or a bad argument."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    run = [
        "simulate",
        "--n",
        "8",
        "--out",
        str(blocked / "out"),
    ]  # parses; fails at --out, before the run
    assert cli.main(run) == 2 and configure_calls.n == 0
    for args in (["--help"], ["simulate", "--n", "1"], ["simulate", "--lam", "1"]):
        monkeypatch.setattr(sys, "argv", ["meanfield", *args])
        assert cli.main() in (0, 2)
        assert configure_calls.n == 0, args
    monkeypatch.setattr(sys, "argv", ["meanfield", *run])
    assert cli.main() == 2 and configure_calls.n == 1

    missing = str(tmp_path / "missing.zarr")
    assert cli.main(["sweep", "--verify", missing]) == 2 and configure_calls.n == 1
    assert (
        sweep_cli.main(["--verify", missing]) == 2 and sweep_cli.console(["--verify", missing]) == 2
    )
    assert configure_calls.n == 1
    for argv in (["meanfield", "sweep", "--verify", missing], ["meanfield", "--verify", missing]):
        monkeypatch.setattr(sys, "argv", argv)
        assert (cli.main() if argv[1] == "sweep" else sweep_cli.console()) == 2
    assert configure_calls.n == 3
    monkeypatch.setattr(sys, "argv", ["meanfield", "sweep", "--no-such-flag"])
    assert cli.main() == 2 and configure_calls.n == 3


_SMALL = ["simulate", "--n", "12", "--t1", "0.2", "--dt", "0.05", "--saves", "3"]


def test_simulate_writes_the_numbers_before_the_figures(monkeypatch, tmp_path):
    seen = []

    def figures(out, *args):
        seen.append(sorted(p.name for p in out.iterdir() if not p.name.startswith(".")))

    monkeypatch.setattr(cli, "_simulate_figures", figures)
    assert cli.main([*_SMALL, "--out", str(tmp_path)]) == 0
    assert seen == [["run.zarr", "summary.json"]]  # the numbers (no observables.npz any more)


@pytest.mark.slow
def test_no_plots_draws_no_figure_and_imports_no_matplotlib(tmp_path):
    """A fresh process (the figures' import is visible): the numbers, no PNG, no matplotlib."""
    code = _PROCESS.format(module="cli", entry="main").replace(
        "rc = main()", "rc = main(sys.argv[1:])"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, json.dumps([*_SMALL, "--out", str(tmp_path), "--no-plots"])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, p.stderr
    assert "matplotlib" not in result["loaded"] and "jax" in result["loaded"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["run.zarr", "summary.json"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n"] == 12 and summary["failed"] is False
