"""Issue 47, the surface: output paths that would block (item 4), plugins that take over (item 6),
``animate``'s arguments (item 8) and the command line's line for ``--backend native`` where the
fused kernel cannot run (item 7). Every case ends in a one-line error (CLI: exit status 2), a
recorded failure (a plugin skipped with one warning line, listed by ``meanfield info``) or a
correct value; none hangs.

Plugins are fake distributions in a temporary site directory put on ``sys.path`` in this
process (``importlib.metadata`` finds their ``entry_points.txt``), loaded by
``mf.kernels.load_entry_points()``; nothing is installed."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meanfield as mf
from meanfield import _paths, cli, info, plotting
from meanfield.kernels import _registry

K = mf.kernels


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("MEANFIELD_NATIVE_QUIET", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")


#: The one line a process prints when it builds a native kernel into an empty cache (once per cache:
#: whichever command of the run comes first, so it depends on the order the tests run in).
_BUILD_NOTICE = "meanfield: building the native "


def run(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(_BUILD_NOTICE)]
    return status, out, lines


def one_line_error(capsys, *argv, needle=None):
    status, out, lines = run(capsys, *argv)
    assert status == 2 and len(lines) == 1, (status, out, lines)
    assert "Traceback" not in lines[0] and lines[0].startswith("meanfield"), lines
    if needle is not None:
        assert needle in lines[0], lines[0]
    return lines[0]


def within(fn, seconds=120.0):
    """``fn()`` in a thread: a call still blocked after ``seconds`` fails the test (a hang guard,
    not a timing: the calls here take milliseconds or block forever)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{fn} blocked")
    if "error" in box:
        raise box["error"]
    return box.get("value")


SMALL = ("--n", "6", "--t1", "0.1", "--dt", "0.05", "--saves", "3")


# ------------------------------------------------------------------ item 4: paths that block


def _special(kind: str, path: Path) -> None:
    """Put a file of ``kind`` at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/null")
    elif kind == "fifo-link":
        os.mkfifo(path.with_name(path.name + ".target"))
        path.symlink_to(path.with_name(path.name + ".target"))
    else:
        raise AssertionError(kind)


REASONS = {
    "fifo": "a FIFO, not a regular file",
    "fifo-link": "a FIFO, not a regular file",
    "directory": "a directory, not a regular file",
    "device": "a character device, not a regular file",
}


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_output_problem_refuses_without_opening(kind, tmp_path):
    target = tmp_path / "x.json"
    _special(kind, target)
    assert within(lambda: _paths.output_problem(target)) == REASONS[kind]
    with pytest.raises(ValueError, match=f"cannot be written \\({REASONS[kind]}\\)"):
        within(lambda: _paths.check_output(target, "--out file"))
    with pytest.raises(ValueError, match=REASONS[kind]):
        within(lambda: _paths.open_output(target, "--out file"))


def test_output_problem_accepts_regular_new_and_linked_files(tmp_path):
    (tmp_path / "old.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "old.json")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    for name in ("old.json", "new.json", "link.json", "dangling.json"):
        assert _paths.output_problem(tmp_path / name) is None, name
    # the probe leaves the files as they were: none created, none truncated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.json", "link.json", "old.json"]
    assert (tmp_path / "old.json").read_text() == "old"
    assert _paths.output_problem(tmp_path / "missing" / "x.json") == "No such file or directory"
    with _paths.open_output(tmp_path / "link.json", "--out file") as f:
        f.write(b"new")
    assert (tmp_path / "old.json").read_text() == "new"  # truncated, then written


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_simulate_movie_on_a_special_file_is_one_line_before_the_run(kind, tmp_path, capsys):
    movie = tmp_path / "m.gif"
    _special(kind, movie)
    out = tmp_path / "out"
    line = within(
        lambda: one_line_error(capsys, "simulate", *SMALL, "--out", out, "--movie", movie)
    )
    assert (
        line == f"meanfield: error: movie path {str(movie)!r} cannot be written ({REASONS[kind]})"
    )
    assert list(out.iterdir()) == []  # refused before the run: nothing written


@pytest.mark.parametrize("name", cli._OUTPUT_FILES)
@pytest.mark.parametrize("kind", ["fifo", "fifo-link", "directory", "device"])
def test_simulate_out_holding_a_special_file_is_one_line_before_the_run(
    name, kind, tmp_path, capsys
):
    out = tmp_path / "out"
    out.mkdir()
    _special(kind, out / name)
    line = within(lambda: one_line_error(capsys, "simulate", *SMALL, "--out", out))
    assert line == (
        f"meanfield: error: --out file {str(out / name)!r} cannot be written ({REASONS[kind]})"
    )
    # refused before the run: nothing written beside what was there
    assert {p.name for p in out.iterdir()} <= {name, name + ".target"}


@pytest.mark.parametrize("kind", ["fifo", "fifo-link", "device"])
def test_reproduce_out_holding_a_special_file_is_one_line_before_any_experiment(
    kind, tmp_path, capsys
):
    (tmp_path / "depth").mkdir()
    _special(kind, tmp_path / "depth" / "summary.json")
    line = within(
        lambda: one_line_error(capsys, "reproduce", "depth", "--quick", "--out", tmp_path)
    )
    assert line == (
        f"meanfield: error: --out {tmp_path} holds {REASONS[kind].split(',')[0]} at "
        f"{tmp_path / 'depth' / 'summary.json'}, not a regular file: meanfield reproduce writes "
        "regular files there; remove it or choose another --out"
    )
    assert {p.name for p in (tmp_path / "depth").iterdir()} <= {
        "summary.json",
        "summary.json.target",
    }


def test_savefig_refuses_a_fifo_and_names_the_file_matplotlib_writes(tmp_path):
    from matplotlib.figure import Figure

    os.mkfifo(tmp_path / "fig.png")
    with pytest.raises(ValueError, match=r"figure path .*fig\.png' cannot be written \(a FIFO"):
        within(lambda: plotting.savefig(Figure(), tmp_path / "fig.png"))
    (tmp_path / "bare.png").mkdir()  # matplotlib writes "bare" as bare.png
    with pytest.raises(ValueError, match=r"bare\.png' cannot be written \(a directory"):
        within(lambda: plotting.savefig(Figure(), str(tmp_path / "bare")))
    assert plotting.savefig(Figure(figsize=(1, 1)), tmp_path / "ok.png") == str(tmp_path / "ok.png")
    assert (tmp_path / "ok.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ item 6: plugins


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """``install(module, source, {entry point: value})``: a distribution in a site directory on
    ``sys.path`` declaring the entry points in ``meanfield.models``. Afterwards: the models it
    registered unregistered, its modules forgotten, ``PLUGIN_FAILURES`` as before."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    models, failures = set(K.MODELS), dict(_registry.PLUGIN_FAILURES)
    modules: list[str] = []

    def install(module: str, source: str, entries: dict[str, str]) -> None:
        (site / module).mkdir()
        (site / module / "__init__.py").write_text(textwrap.dedent(source))
        meta = site / f"{module}-0.1.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (meta / "entry_points.txt").write_text(
            "[meanfield.models]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
        )
        modules.append(module)
        importlib.invalidate_caches()

    yield install
    for name in set(K.MODELS) - models:
        K.unregister(name)
    for module in modules:
        sys.modules.pop(module, None)
    _registry.PLUGIN_FAILURES.clear()
    _registry.PLUGIN_FAILURES.update(failures)


GOOD = """
import jax.numpy as jnp
import meanfield as mf


class Good(mf.kernels.Kernel):
    name = "{name}"
    scale: float = mf.kernels.param(1.0, kind="float>0", doc="scale")

    def __call__(self, x, xi, y, zeta):
        return self.scale * jnp.exp(jnp.dot(x, y))
"""


def load(*, expect_warnings: int):
    """``load_entry_points()``: the names registered and the warnings' messages (each one line)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = K.load_entry_points()
    msgs = [w for w in caught if issubclass(w.category, _registry.PluginWarning)]
    assert len(msgs) == expect_warnings, [str(w.message) for w in caught]
    for w in msgs:  # one line as Python prints it: no source line under it
        text = warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
        assert text.count("\n") == 1, text
    return done, [str(w.message) for w in msgs]


TAKEOVERS = {
    # module: (source, what the failure record says)
    "exits_zero": ("import sys\nsys.exit(0)\n", "SystemExit(0) at import"),
    "exits_text": (
        "raise SystemExit('plugin says bye')\n",
        "SystemExit('plugin says bye') at import",
    ),
    "runs_argparse": (
        "import argparse\np = argparse.ArgumentParser(prog='takeover')\n"
        "p.add_argument('command')\np.parse_args()\n",
        "SystemExit(2) at import (it printed: usage: takeover [-h] command)",
    ),
    "odd_base": (
        "class Odd(BaseException):\n    pass\nraise Odd('not an Exception')\n",
        "Odd: not an Exception",
    ),
    "plain_error": ("raise ImportError('no such dependency')\n", "ImportError: no such dependency"),
}


def test_plugins_that_exit_or_parse_argv_at_import_are_skipped_and_recorded(
    plugins, monkeypatch, capsys
):
    for module, (source, _) in TAKEOVERS.items():
        plugins(module, source, {module.replace("_", "-"): f"{module}:Model"})
    plugins("good_plugin", GOOD.format(name="good-plugin"), {"good": "good_plugin:Good"})
    argv = ["meanfield", "simulate", "--n", "4"]
    monkeypatch.setattr(sys, "argv", argv)
    done, messages = load(expect_warnings=len(TAKEOVERS))
    assert done == ["good-plugin"] and "good-plugin" in K.MODEL_NAMES
    assert sys.argv is argv and sys.argv == ["meanfield", "simulate", "--n", "4"]
    assert capsys.readouterr() == ("", "")  # what the plugins printed was held back
    for module, (_, error) in TAKEOVERS.items():
        ep = module.replace("_", "-")
        assert _registry.PLUGIN_FAILURES[ep] == {"value": f"{module}:Model", "error": error}
        assert (
            f"the model entry point {ep!r} ({module}:Model) was not registered: {error}" in messages
        )
    # meanfield info lists them, with their errors, beside the model that loaded
    listed = info._plugins()
    assert {"name": "good-plugin", "class": "good_plugin.Good"} in listed["models"]
    for module, (_, error) in TAKEOVERS.items():
        ep = module.replace("_", "-")
        assert {"entry_point": ep, "value": f"{module}:Model", "error": error} in listed["failed"]
    lines = info._format_plugins(listed)
    assert lines[0].startswith("plugins (meanfield.models): ") and "good_plugin.Good" in lines[0]
    assert "  not registered: 'exits-zero' (exits_zero:Model): SystemExit(0) at import" in lines


def test_meanfield_info_with_a_plugin_that_exits_still_reports(plugins, capsys):
    """``meanfield info`` exited 0 silently; now it prints its report, the plugin's error in it."""
    plugins("exits_zero", "import sys\nsys.exit(0)\n", {"exits": "exits_zero:Model"})
    load(expect_warnings=1)
    status, out, lines = run(capsys, "info", "--json")
    assert status == 0 and lines == []
    failed = json.loads(out)["plugins"]["failed"]
    assert {
        "entry_point": "exits",
        "value": "exits_zero:Model",
        "error": "SystemExit(0) at import",
    } in failed


def test_a_plugin_sees_its_own_argv_and_no_stdin_at_import(plugins, monkeypatch, capsys):
    """A plugin that parses ``sys.argv`` at import (without required arguments) loads: it sees
    ``[its entry point name]``, not meanfield's command line, and reads an empty stdin."""
    source = GOOD.format(name="argv-plugin") + textwrap.dedent("""
        import argparse, sys
        parser = argparse.ArgumentParser()
        parser.add_argument("--verbose", action="store_true")
        ARGS = parser.parse_args()  # meanfield's argv would be "unrecognized arguments": exit 2
        SEEN = list(sys.argv)
        READ = sys.stdin.read()
        print("hello from the plugin")
        """)
    plugins("argv_plugin", source, {"argv-ep": "argv_plugin:Good"})
    monkeypatch.setattr(sys, "argv", ["meanfield", "simulate", "--kernel", "argv-plugin"])
    done, _ = load(expect_warnings=0)
    module = sys.modules["argv_plugin"]
    assert done == ["argv-plugin"] and module.SEEN == ["argv-ep"] and module.READ == ""
    assert capsys.readouterr() == ("", "")
    assert sys.argv == ["meanfield", "simulate", "--kernel", "argv-plugin"]


def test_keyboard_interrupt_in_a_plugin_still_interrupts(plugins, monkeypatch):
    plugins("interrupts", "raise KeyboardInterrupt\n", {"interrupts": "interrupts:Model"})
    argv, stdout = sys.argv, sys.stdout
    with pytest.raises(KeyboardInterrupt):
        K.load_entry_points()
    assert sys.argv is argv and sys.stdout is stdout  # restored on the way out


BOOM = """
import jax.numpy as jnp
import meanfield as mf


class Boom(mf.kernels.Kernel):
    name = "boom-plugin"
    scale: float = mf.kernels.param(1.0, kind="float>0", doc="scale")

    def __call__(self, x, xi, y, zeta):
        {call}

    def interaction_rate(self):
        {rate}
"""
FINE_CALL = "return self.scale * jnp.exp(jnp.dot(x, y))"
FINE_RATE = "return 1.0"


@pytest.mark.parametrize(
    "where, raise_",
    [
        ("call", "raise ZeroDivisionError('the plugin divided by zero')"),
        ("call", "raise ValueError('a value the plugin did not like')"),
        ("call", "return {}['missing']"),
        ("rate", "raise RuntimeError('no rate today')"),
        ("rate", "raise TypeError('rate of the wrong type')"),
        ("call", "raise SystemExit(0)"),  # not a silent exit 0
    ],
)
def test_a_plugin_that_raises_while_it_runs_is_one_line_naming_it(
    where, raise_, plugins, tmp_path, capsys
):
    source = BOOM.format(
        call=raise_ if where == "call" else FINE_CALL, rate=raise_ if where == "rate" else FINE_RATE
    )
    plugins("boom_plugin", source, {"boom": "boom_plugin:Boom"})
    assert load(expect_warnings=0)[0] == ["boom-plugin"]
    line = one_line_error(capsys, "simulate", "--kernel", "boom-plugin", *SMALL, "--out", tmp_path)
    exc = raise_.split("(")[0].split()[-1] if raise_.startswith("raise") else "KeyError"
    assert line.startswith(
        "meanfield: error: --kernel boom-plugin (the model boom_plugin.Boom, not one of "
        f"meanfield's) failed: {exc}"
    ), line
    assert _registry.plugin_error("usa", ZeroDivisionError()) is None  # meanfield's own: a bug


@pytest.mark.slow
def test_a_plugin_runs_with_a_shared_flag_and_meanfields_own_refusals(plugins, tmp_path, capsys):
    """The one run of this file: a plugin whose ``beta`` has usa's kind shares ``--beta`` (one
    flag) and runs; meanfield's own refusal of its parameter keeps meanfield's line (not the
    plugin's); and with ``--no-plots`` a FIFO named like a figure is no output of the run."""
    source = GOOD.format(name="good-plugin") + textwrap.dedent("""
        class Shared(Good):
            name = "shared-plugin"
            beta: float = mf.kernels.param(2.0, kind="float>0", doc="as usa's beta")
        """)
    plugins("good_plugin", source, {"good": "good_plugin:Good", "shared": "good_plugin:Shared"})
    assert load(expect_warnings=0)[0] == ["good-plugin", "shared-plugin"]
    line = one_line_error(
        capsys, "simulate", "--kernel", "good-plugin", "--scale", "-1", *SMALL, "--out", tmp_path
    )
    assert line == "meanfield simulate: error: argument --scale: must be > 0, got -1"
    os.mkfifo(tmp_path / "configuration.png")
    status, out, lines = within(
        lambda: run(
            capsys,
            "simulate",
            "--kernel",
            "shared-plugin",
            "--beta",
            "1.5",
            *SMALL,
            "--out",
            tmp_path,
            "--no-plots",
        )
    )
    assert status == 0 and lines == [], lines
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["kernel"] == "shared-plugin" and summary["beta"] == 1.5
    assert summary["num_steps"] == 2 and summary["failed"] is False


def _kernel(name: str, **fields):
    """A kernel class ``name`` with parameters ``fields``: ``{param: (default, kind, choices)}``."""
    annotations, ns = {}, {"name": name}
    for p, (default, kind, choices) in fields.items():
        annotations[p] = object
        ns[p] = K.param(default, kind=kind, doc=p, **({"choices": choices} if choices else {}))
    ns["__annotations__"] = annotations
    ns["__call__"] = lambda self, x, xi, y, zeta: jnp.dot(x, y)
    ns["__module__"] = __name__
    return type("Plugin", (K.Kernel,), ns)


@contextlib.contextmanager
def registered(cls):
    K.register(cls)
    try:
        yield
    finally:
        K.unregister(cls.name)


@pytest.mark.parametrize("name", _registry.RESERVED_MODEL_NAMES)
def test_register_refuses_the_sweep_kinds_names(name):
    with pytest.raises(ValueError) as e:
        K.register(_kernel(name))
    assert str(e.value) == (
        f"Plugin.name {name!r} is reserved (the sweep kinds of their own: attention, continuum); "
        "choose another name"
    )
    from meanfield.sweep import spec

    named = {k.name for k in spec.sweep_kinds().values() if k.name != "particles"}
    assert named == set(_registry.RESERVED_MODEL_NAMES)  # the reserved set is the sweep's


@pytest.mark.parametrize(
    "fields, needle",
    [
        (
            {"weights": (1.0, "float>0", ())},
            "would share the flag --weights with the parameter 'weights' of model 'sa' (a choice of 'identity'",
        ),
        (
            {"beta": (1.0, "float", ())},
            "would share the flag --beta with the parameter 'beta' of model 'usa' (float>0)",
        ),
        (
            {"rescaled": (1.0, "float>0", ())},
            "--rescaled with the parameter 'rescaled' of model 'usa' (bool)",
        ),
        (
            {"no_rescaled": (True, "bool", ())},
            "takes the flag --no-rescaled, already model 'usa''s parameter 'rescaled'",
        ),
        (
            {"plots": (True, "bool", ())},
            "parameter(s) no_plots clash with the command line's own flags",
        ),
        (
            {"movie": (1.0, "float>0", ())},
            "parameter(s) movie clash with the command line's own flags",
        ),
    ],
)
def test_register_refuses_a_parameter_the_command_line_would_parse_as_another(fields, needle):
    with pytest.raises(ValueError) as e:
        K.register(_kernel("flag-test", **fields))
    assert needle in str(e.value) and str(e.value).startswith("Plugin"), str(e.value)
    assert "flag-test" not in K.MODELS


KIND_VALUES = {
    "float>0": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3)),
    "float>=0": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3)),
    "float": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=2)),
    "int>=1": st.one_of(st.integers(-3, 3), st.floats(-3, 3), st.booleans()),
    "int>=0": st.one_of(st.integers(-3, 3), st.floats(-3, 3)),
    "bool": st.one_of(st.booleans(), st.integers(0, 1), st.text(max_size=2)),
    "choice": st.sampled_from(["a", "b", "c", 1, None]),
}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kind=st.sampled_from(sorted(KIND_VALUES)))
def test_register_accepts_a_default_exactly_when_its_kind_does(data, kind):
    default = data.draw(KIND_VALUES[kind], label="default")
    choices = ("a", "b") if kind == "choice" else ()
    try:
        _registry.Param("x", default, True, kind, "", choices).validate(default)
        valid = True
    except (TypeError, ValueError):
        valid = False
    cls = _kernel("default-test", gamma=(default, kind, choices))
    if valid:
        with registered(cls):
            assert "default-test" in K.MODELS
    else:
        with pytest.raises(ValueError, match=r"^Plugin\.gamma's default must be .*\(declared kind"):
            K.register(cls)
        assert "default-test" not in K.MODELS


# ------------------------------------------------------------------ item 7 (CLI): native unavailable


def test_backend_native_unavailable_is_one_line(tmp_path, capsys, monkeypatch):
    from meanfield import _native

    class Unavailable:
        available = False
        reason = "switched off for this test"
        crossover = None

    monkeypatch.setattr(_native, "exp_library", lambda *a, **k: Unavailable())
    line = one_line_error(
        capsys,
        "simulate",
        "--n",
        "7",
        "--d",
        "5",
        "--t1",
        "0.1",
        "--dt",
        "0.05",
        "--saves",
        "2",
        "--backend",
        "native",
        "--out",
        tmp_path,
        "--no-plots",
    )
    assert "backend='native'" in line and "switched off for this test" in line, line


# ------------------------------------------------------------------ item 8: animate's arguments


def _pair(n=5, d=3, T=3):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(T, n, d))
    return np.linspace(0.0, 1.0, T), xs / np.linalg.norm(xs, axis=-1, keepdims=True)


NUMBER_BAD = st.one_of(
    st.sampled_from([float("nan"), float("inf"), -float("inf"), "2", None, True, [1.0]]),
    st.floats(max_value=0.0),
)
BAD = {
    "fps": st.one_of(st.integers(max_value=0), st.integers(min_value=1001), st.floats(0.1, 30.5).filter(lambda v: not v.is_integer()), st.sampled_from(["24", None, True, float("nan")])),
    "dpi": st.one_of(NUMBER_BAD, st.floats(1e4, 1e9), st.floats(1e-3, 1.0)),
    "size": st.one_of(st.sampled_from(["big", (1.0,), (1, 2, 3), None, 5.0]), st.tuples(NUMBER_BAD, st.just(3.0)), st.tuples(st.just(3.0), st.floats(200.0, 1e6))),
    "trail": st.one_of(st.integers(max_value=-1), st.sampled_from([1.5, "2", None, float("inf")])),
    "elev": st.sampled_from([float("nan"), float("inf"), "north", None, [20.0]]),
    "azim": st.sampled_from([float("nan"), -float("inf"), "east", None]),
    "marker_size": NUMBER_BAD.filter(lambda v: v is not None),
    "color": st.sampled_from(["not-a-colour", "clusters", np.ones(6), np.ones((5, 2)), np.full((5, 3), 2.0), np.array(["a"] * 5), object()]),
    "threshold": st.sampled_from([0.0, -1.0, 4.0, float("nan"), "0.1", None]),
    "path": st.sampled_from([3, None, ["m.gif"], "movie.avi", "movie", "missing-dir/m.gif"]),
    "traj": st.sampled_from([5, "run", None, (np.zeros(3),), (np.zeros(0), np.zeros((0, 4, 3))), (np.zeros(2), np.zeros((3, 4, 3))), (np.zeros(3), np.full((3, 4, 3), "a"))]),
}  # fmt: skip
NAMES = {"path": "movie path"}  # how a message names the argument (else: by its name)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), arg=st.sampled_from(sorted(BAD)))
def test_animate_names_the_bad_argument_and_writes_nothing(data, arg, tmp_path):
    value = data.draw(BAD[arg], label=arg)
    kwargs = {"traj": _pair(), "path": tmp_path / "m.gif", arg: value}
    if arg == "path" and isinstance(value, str):
        kwargs["path"] = tmp_path / value
    before = set(tmp_path.rglob("*"))
    with pytest.raises((TypeError, ValueError)) as e:
        plotting.animate(kwargs.pop("traj"), kwargs.pop("path"), **kwargs)
    text = str(e.value)
    subject = text.split(" must ")[0]  # "fps must be ...", "movie path '...' cannot be written"
    assert "\n" not in text and NAMES.get(arg, arg) in subject, (arg, value, text)
    assert set(tmp_path.rglob("*")) == before  # nothing written, no probe left behind


def test_run_experiments_refuses_an_out_dir_holding_a_fifo_before_any_experiment(tmp_path):
    """The Python entry of ``meanfield reproduce`` refuses, before running anything, an output
    directory holding a FIFO (writing it would wait for a reader forever)."""
    from meanfield import reproduce

    (tmp_path / "usa-av").mkdir()
    os.mkfifo(tmp_path / "usa-av" / "summary.json")
    with pytest.raises(ValueError, match=r"holds .*summary\.json.*a FIFO"):
        reproduce.run_experiments(["usa-av"], tmp_path, quick=True, jobs=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["usa-av"]


def test_write_output_refuses_a_fifo_and_writes_a_regular_file(tmp_path):
    """``_paths.write_output`` (summary.json, REPORT.md, report.html of a reproduction): a FIFO is
    one ValueError without blocking; a regular file is replaced by the text."""
    os.mkfifo(tmp_path / "REPORT.md")
    with pytest.raises(ValueError, match=r"report .*REPORT\.md.* \(a FIFO, not a regular file\)"):
        _paths.write_output(tmp_path / "REPORT.md", "x", "report")
    f = tmp_path / "summary.json"
    f.write_text("old and longer")
    _paths.write_output(f, "new", "summary")
    assert f.read_text() == "new"
