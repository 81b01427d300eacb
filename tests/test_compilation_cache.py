"""JAX's persistent compilation cache in meanfield's cache directory (``meanfield.compilation_cache``).

The end-to-end test runs meanfield's own process set-up (``configure_process()``, then the CLI's
``main``) in fresh processes and counts compilations through JAX's log and the cache's entries:
a second process compiles nothing for a small ``meanfield simulate`` and a one-point sweep.
The unit tests check the environment a process gets, the directory rules (those of the native
kernel cache), ``MEANFIELD_COMPILATION_CACHE=0`` and ``meanfield info --clear-cache``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from meanfield import _native, compilation_cache, info

#: environment variables that would change what the processes under test do
_CLEARED = (
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
    "JAX_ENABLE_COMPILATION_CACHE",
    "EQX_ON_ERROR",
    "MEANFIELD_COMPILATION_CACHE",
    "XDG_CACHE_HOME",
)

#: a meanfield-owned process (what the ``meanfield`` command does before JAX is imported), with
#: JAX's compiler log on stderr; then ``main(argv)`` once per command, commands separated by ``--then``
_RUNNER = r"""
import sys
from meanfield.compilation_cache import configure_process
configure_process()
import logging
logging.basicConfig(format="LOG %(name)s: %(message)s")
logging.getLogger("jax._src.compiler").setLevel(logging.DEBUG)
from meanfield.cli import main
argv, commands = sys.argv[1:], [[]]
for a in argv:
    commands.append([]) if a == "--then" else commands[-1].append(a)
for command in commands:
    status = main(command)
    if status:
        sys.exit(status)
import json, jax, equinox._config
print("RUNNER " + json.dumps({"cache_dir": jax.config.jax_compilation_cache_dir,
                              "eqx_on_error": equinox._config.EQX_ON_ERROR}), file=sys.stderr)
"""

#: one point of the smoke sweep (sweeps/smoke.toml), shorter
_ONE_POINT = """
name = "one-point"
description = "one point of the smoke sweep"
dtype = "float32"

[model]
kind = "usa"

[grid]
n = [8]
d = 3
beta = [1.0]
seeds = 1
seed = 0

[time]
t1 = 0.5
dt = 0.05
solver = "rk2"
save = 3

[output]
observables = ["collapse_gap", "energy"]
"""

_MISS = "PERSISTENT COMPILATION CACHE MISS"
_NOT_WRITTEN = "Not writing persistent cache entry"


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(MEANFIELD_CACHE_DIR=str(cache), MPLBACKEND="Agg", **extra)
    return env


def _seed_native(cache: Path) -> None:
    """Copy this process's built native kernels (libraries and manifests) into ``cache``, so that
    the processes under test load them instead of compiling them again (a build takes seconds)."""
    cache.mkdir(mode=0o700, exist_ok=True)
    source = Path(os.path.realpath(_native._cache._cache_dir()))
    if not source.is_dir():
        return
    for path in source.iterdir():
        if path.suffix in (".so", ".json") and path.is_file() and not path.is_symlink():
            shutil.copy2(path, cache / path.name)


def _run(cache: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900):
    return subprocess.run(
        [sys.executable, "-c", _RUNNER, *args],
        env=env or _env(cache),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _state(r) -> dict:
    """What the runner reports at its end: JAX's cache directory and equinox's error mode."""
    return json.loads(next(ln for ln in r.stderr.splitlines() if ln.startswith("RUNNER "))[7:])


def _entries(cache: Path) -> set[str]:
    xla = cache / "xla"
    return {p.name for p in xla.iterdir()} if xla.is_dir() else set()


# ------------------------------------------------------------------ a second process compiles nothing


@pytest.mark.slow
def test_second_process_compiles_nothing(tmp_path, monkeypatch, capsys):
    """``meanfield simulate`` (small) and a one-point ``meanfield sweep`` in one process, then the same
    in a second process: the first writes every program it compiles to the cache (no program is
    refused for a host callback), the second reads them all (no miss, no new entry). Then
    ``meanfield info --clear-cache`` empties the cache and says how many entries it removed."""
    cache = tmp_path / "cache"
    _seed_native(cache)
    spec = tmp_path / "one.toml"
    spec.write_text(_ONE_POINT)

    def commands(k: int) -> list[str]:
        return [
            "simulate",
            "--n",
            "32",
            "--t1",
            "1",
            "--saves",
            "5",
            "--no-plots",
            "--out",
            str(tmp_path / f"sim{k}"),
            "--then",
            "sweep",
            str(spec),
            "--out",
            str(tmp_path / f"sweep{k}.zarr"),
        ]

    first = _run(cache, *commands(1))
    assert first.returncode == 0, first.stderr[-3000:]
    written = _entries(cache)
    assert first.stderr.count(_MISS) > 0 and any(
        name.startswith("jit__simulate") for name in written
    )
    assert _NOT_WRITTEN not in first.stderr, [
        ln for ln in first.stderr.splitlines() if _NOT_WRITTEN in ln
    ]
    assert len([name for name in written if name.endswith("-cache")]) >= first.stderr.count(_MISS)
    assert (tmp_path / "sim1").is_dir() and (tmp_path / "sweep1.zarr").is_dir()
    assert _state(first) == {"cache_dir": os.path.realpath(cache / "xla"), "eqx_on_error": "nan"}
    native = sorted(p.name for p in cache.glob("*.so"))

    second = _run(cache, *commands(2))
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "sim2").is_dir() and (tmp_path / "sweep2.zarr").is_dir()
    misses = [ln for ln in second.stderr.splitlines() if _MISS in ln]
    assert not misses, misses
    assert _entries(cache) == written
    # the two runs computed the same numbers (the second from the cached programs)
    r1, r2 = (json.loads(r.stdout.strip().splitlines()[0]) for r in (first, second))
    keys = ("final_collapse_gap", "final_energy", "num_steps", "failed")
    assert [r1[k] for k in keys] == [r2[k] for k in keys] and r1["failed"] is False

    # meanfield info --clear-cache (in this process, pointed at this cache)
    monkeypatch.setattr(compilation_cache, "cache_dir", lambda: cache / "xla")
    before = compilation_cache.info()
    assert (
        before["entries"] == len([n for n in written if n.endswith("-cache")])
        and before["bytes"] > 0
    )
    assert info.main(["--clear-cache"]) == 0
    out = capsys.readouterr().out
    assert (
        out.splitlines()[0]
        == f"removed {before['entries']} compilation cache entries from {cache / 'xla'}"
    )
    assert f"compilation cache: on, {cache / 'xla'}, 0 entries, 0 B" in out
    assert _entries(cache) == set() and (cache / "xla").is_dir()
    assert sorted(p.name for p in cache.glob("*.so")) == native  # the native kernels stay


@pytest.mark.slow
def test_refused_directory_warns_once_and_runs(tmp_path):
    """A cache directory writable by others: one line on stderr, the run succeeds, nothing written."""
    cache = tmp_path / "cache"
    _seed_native(cache)
    (cache / "xla").mkdir()
    os.chmod(cache / "xla", 0o777)
    r = _run(
        cache,
        "simulate",
        "--n",
        "8",
        "--t1",
        "0.2",
        "--saves",
        "2",
        "--no-plots",
        "--out",
        str(tmp_path / "sim"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    said = [
        ln for ln in r.stderr.splitlines() if ln.startswith("meanfield: compilation cache off: ")
    ]
    assert len(said) == 1, r.stderr[-3000:]
    assert "writable by group or others" in said[0] and f"chmod go-w {cache / 'xla'}" in said[0]
    assert (
        _entries(cache) == set() and json.loads(r.stdout.strip().splitlines()[0])["failed"] is False
    )
    assert _state(r) == {"cache_dir": None, "eqx_on_error": "nan"}


@pytest.mark.slow
def test_switched_off_writes_nothing(tmp_path):
    """``MEANFIELD_COMPILATION_CACHE=0``: no cache directory, no entry, no line; checks raise as in a library."""
    cache = tmp_path / "cache"
    _seed_native(cache)
    env = _env(cache, MEANFIELD_COMPILATION_CACHE="0")
    r = _run(
        cache,
        "simulate",
        "--n",
        "8",
        "--t1",
        "0.2",
        "--saves",
        "2",
        "--no-plots",
        "--out",
        str(tmp_path / "sim"),
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (cache / "xla").exists() and "compilation cache" not in r.stderr
    assert _state(r) == {"cache_dir": None, "eqx_on_error": "raise"}


@pytest.mark.slow
def test_enable_in_a_library_process_and_docstring_examples(tmp_path):
    """``configure_process()`` after JAX and equinox are imported sets the cache through ``jax.config``
    (equinox keeps the error mode it was imported with, and ``info`` says so); ``enable()`` (a
    notebook's opt-in, after ``import meanfield``) writes a jitted program to the cache; the
    module's examples run (in a process of their own: they enable and clear a cache)."""
    cache = tmp_path / "cache"
    _seed_native(cache)
    code = r"""
import doctest, json, jax, jax.numpy as jnp, equinox
import meanfield as mf
from meanfield import compilation_cache as cc
cc.configure_process()
configured = jax.config.jax_compilation_cache_dir
path = cc.enable()
jax.jit(lambda x: jnp.sin(x) * 2)(jnp.arange(3.0)).block_until_ready()
written = cc.info()
result = doctest.testmod(cc, optionflags=doctest.ELLIPSIS)
print(json.dumps({"path": str(path), "info": written, "examples": [result.attempted, result.failed],
                  "dir": jax.config.jax_compilation_cache_dir, "configured": configured}))
"""
    r = subprocess.run(
        [sys.executable, "-c", code], env=_env(cache), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["path"] == out["configured"] == os.path.realpath(cache / "xla")
    assert (
        out["info"]["entries"] >= 1
        and out["info"]["eqx_on_error"] == "raise"
        and out["info"]["enabled"]
    )
    attempted, failed = out["examples"]
    assert attempted > 0 and failed == 0
    # the last example enabled the cache in a directory of its own
    assert out["dir"] != out["path"] and out["dir"].endswith("xla")


# ------------------------------------------------------------------ the process's environment


@pytest.fixture(autouse=True)
def no_leaked_setting():
    """Every test leaves this process as it found it: the environment variables a meanfield process
    sets up and JAX's compilation cache directory (a leak would put later tests of this worker, and
    the processes they start, under EQX_ON_ERROR=nan or a persistent cache)."""
    import jax

    env = {key: os.environ.get(key) for key in _CLEARED}
    cache = jax.config.jax_compilation_cache_dir
    yield
    assert {key: os.environ.get(key) for key in _CLEARED} == env
    assert jax.config.jax_compilation_cache_dir == cache


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No cache settings in the environment, ``MEANFIELD_CACHE_DIR`` in ``tmp_path``, and JAX
    looking not imported (``configure_process`` then only sets environment variables)."""
    for key in _CLEARED:
        # setenv first: monkeypatch then restores the key's state before the test (absent or not)
        # at teardown, also when configure_process() set it in between (no leak into later tests
        # of this worker or the processes they start)
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setenv("MEANFIELD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delitem(sys.modules, "jax")
    return tmp_path / "cache"


def test_cache_dir_is_beside_the_native_kernels(monkeypatch, tmp_path):
    for key, value, expected in (
        ("MEANFIELD_CACHE_DIR", str(tmp_path / "c"), tmp_path / "c"),
        ("XDG_CACHE_HOME", str(tmp_path / "x"), tmp_path / "x" / "meanfield"),
    ):
        monkeypatch.delenv("MEANFIELD_CACHE_DIR", raising=False)
        monkeypatch.setenv(key, value)
        assert (
            compilation_cache.cache_dir() == expected / "xla" == _native._cache._cache_dir() / "xla"
        )


@pytest.mark.parametrize(
    "value, off",
    [
        ("0", True),
        ("off", True),
        ("FALSE", True),
        (" no ", True),
        ("1", False),
        ("", False),
        ("on", False),
    ],
)
def test_disabled(monkeypatch, value, off):
    monkeypatch.setenv("MEANFIELD_COMPILATION_CACHE", value)
    assert compilation_cache.disabled() is off


def test_configure_process_sets_the_environment(clean_env, capsys):
    compilation_cache.configure_process()
    xla = clean_env / "xla"
    assert os.environ["EQX_ON_ERROR"] == "nan"
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == os.path.realpath(xla)
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "0"
    for path in (xla, clean_env):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert capsys.readouterr().err == ""


def test_configure_process_leaves_the_users_settings(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("EQX_ON_ERROR", "raise")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "2")
    compilation_cache.configure_process()
    assert os.environ["EQX_ON_ERROR"] == "raise"
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "mine")
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "2"
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "0"
    assert not clean_env.exists()  # meanfield's directory is not needed


def test_configure_process_switched_off(clean_env, monkeypatch):
    monkeypatch.setenv("MEANFIELD_COMPILATION_CACHE", "off")
    compilation_cache.configure_process()
    assert not any(k in os.environ for k in _CLEARED if k != "MEANFIELD_COMPILATION_CACHE")
    assert not clean_env.exists()
    assert compilation_cache.enable() is None


@pytest.mark.parametrize(
    "case", ["group-writable", "parent-writable", "not-a-directory", "parent-group-writable"]
)
def test_configure_process_refuses_a_directory_others_control(clean_env, capsys, case):
    xla = clean_env / "xla"
    if case == "parent-writable":  # writable by others, no sticky bit
        clean_env.parent.chmod(0o777)
    else:
        clean_env.mkdir(mode=0o700)
        if case == "not-a-directory":
            xla.write_text("")
        elif case == "parent-group-writable":
            clean_env.chmod(0o770)
        else:
            xla.mkdir()
            xla.chmod(0o775)
    try:
        compilation_cache.configure_process()
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("meanfield: compilation cache off: "), lines
        assert "MEANFIELD_CACHE_DIR" in lines[0]
        assert "JAX_COMPILATION_CACHE_DIR" not in os.environ
        assert os.environ["EQX_ON_ERROR"] == "nan"  # the same checks as a process with a cache
        problem = compilation_cache.info()["problem"]
        assert (
            problem is not None and problem in lines[0] and not compilation_cache.info()["enabled"]
        )
        with pytest.raises(compilation_cache.CacheRefused, match="writable|not a directory"):
            compilation_cache.enable()
    finally:
        clean_env.parent.chmod(0o700)


def test_sticky_world_writable_parent_is_fine(clean_env):
    clean_env.parent.chmod(0o1777)
    try:
        compilation_cache.configure_process()
    finally:
        clean_env.parent.chmod(0o700)
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == os.path.realpath(clean_env / "xla")


def test_enable_rejects_bad_paths():
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        compilation_cache.enable(3)
    with pytest.raises(ValueError, match="path must name a directory"):
        compilation_cache.enable("")


def test_info_and_clear(monkeypatch, tmp_path):
    """``info`` counts the entries (one ``KEY-cache`` file each) and all their bytes; ``clear``
    removes everything in the directory and returns the entries removed."""
    monkeypatch.setenv("MEANFIELD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MEANFIELD_COMPILATION_CACHE", raising=False)
    d = compilation_cache.info()
    assert d == {
        "enabled": True,
        "dir": str(tmp_path / "cache" / "xla"),
        "entries": 0,
        "bytes": 0,
        "eqx_on_error": d["eqx_on_error"],
        "problem": None,
    }
    assert (
        not (tmp_path / "cache").exists() and compilation_cache.clear() == 0
    )  # info creates nothing
    xla = tmp_path / "cache" / "xla"
    xla.mkdir(parents=True, mode=0o700)
    (tmp_path / "cache").chmod(0o700)
    (xla / "jit_f-abc-cache").write_bytes(b"x" * 100)
    (xla / "jit_f-abc-atime").write_bytes(b"y" * 8)
    (xla / "jit_g-def-cache").write_bytes(b"z" * 50)
    (xla / "xla_gpu_per_fusion_autotune_cache_dir").mkdir()
    (xla / "xla_gpu_per_fusion_autotune_cache_dir" / "a").write_bytes(b"w" * 10)
    (tmp_path / "cache" / "exp_kernel-0.so").write_bytes(b"native")
    d = compilation_cache.info()
    assert (d["entries"], d["bytes"], d["enabled"]) == (2, 168, True)
    monkeypatch.setenv("MEANFIELD_COMPILATION_CACHE", "0")
    assert not compilation_cache.info()["enabled"]
    assert compilation_cache.clear() == 2
    assert (
        list(xla.iterdir()) == []
        and (tmp_path / "cache" / "exp_kernel-0.so").read_bytes() == b"native"
    )


def test_info_reports_the_cache(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(compilation_cache, "cache_dir", lambda: tmp_path / "xla")
    monkeypatch.delenv("MEANFIELD_COMPILATION_CACHE", raising=False)
    (tmp_path / "xla").mkdir(mode=0o700)
    (tmp_path / "xla" / "k-cache").write_bytes(b"x" * 3000)
    d = info.summary()
    assert d["compilation_cache"] == compilation_cache.info()
    assert f"compilation cache: on, {tmp_path / 'xla'}, 1 entries, 3 KiB" in info.format_summary(d)
    # --json: stdout stays JSON, the count goes to stderr
    assert info.main(["--json", "--clear-cache"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["compilation_cache"]["entries"] == 0
    assert captured.err.strip() == f"removed 1 compilation cache entry from {tmp_path / 'xla'}"
    monkeypatch.setenv("MEANFIELD_COMPILATION_CACHE", "0")
    assert "compilation cache: off (MEANFIELD_COMPILATION_CACHE=0)" in info.format_summary(
        info.summary()
    )


def test_clear_cache_failure_is_one_line(monkeypatch, tmp_path):
    def refuse():
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(compilation_cache, "clear", refuse)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert info.main(["--clear-cache"]) == 1
    assert err.getvalue().startswith("meanfield info: error: cannot empty the compilation cache ")
    assert len(err.getvalue().splitlines()) == 1


def test_module_imports_no_jax():
    code = (
        "import sys; import meanfield.compilation_cache as c; c.cache_dir(); c.disabled(); c.info(); "
        "print(sorted(m for m in ('jax', 'numpy', 'equinox') if m in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k not in _CLEARED},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_info_checks_what_exists_above_a_missing_directory(monkeypatch, tmp_path):
    """Before the first run (no ``xla`` yet) ``info`` already reports a meanfield cache directory
    that others can write, and creates nothing."""
    monkeypatch.delenv("MEANFIELD_COMPILATION_CACHE", raising=False)
    monkeypatch.setenv("MEANFIELD_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir(mode=0o700)
    assert compilation_cache.info()["problem"] is None
    (tmp_path / "cache").chmod(0o770)
    d = compilation_cache.info()
    assert (
        not d["enabled"]
        and "writable by group or others" in d["problem"]
        and str(tmp_path / "cache") in d["problem"]
    )
    assert not (tmp_path / "cache" / "xla").exists()
