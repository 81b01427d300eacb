"""``meanfield info`` and what ``import meanfield`` may do to a process.

Importing meanfield changes no process-wide state the user chose (STYLE.md): the matplotlib
backend stays, no JAX backend is initialised (``XLA_FLAGS`` set afterwards still apply). The C
compiler runs at import (once per machine, cached) and never while a function is traced.
"""

import contextlib
import doctest
import io
import json
import os
import subprocess
import sys

import pytest

from meanfield import _native, info

_BUILD_LINE = "meanfield: building the native CPU kernels"

# every module of the package (the ``__main__`` entry points excepted), under a matplotlib
# backend chosen first; then an XLA flag set after the import must still take effect
_IMPORT_ALL = r"""
import os, pkgutil, importlib, json
import matplotlib
matplotlib.use("svg")
import meanfield
names = [m.name for m in pkgutil.walk_packages(meanfield.__path__, "meanfield.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
from jax._src import xla_bridge
from meanfield import _native
initialised = xla_bridge.backends_are_initialized()
loaded = _native._exp_state["lib"] is not None
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=3"
import jax
print(json.dumps({"modules": len(names), "backend": matplotlib.get_backend(), "initialised": initialised,
                  "loaded": loaded, "reason": _native._exp_state["error"], "cpus": len(jax.devices("cpu")),
                  "available": _native.exp_library().available}))
"""


def _run(code, *args, env=None, timeout=600):
    full = {**os.environ, "MEANFIELD_NATIVE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def imported_all():
    r = _run(_IMPORT_ALL)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_keeps_the_matplotlib_backend(imported_all):
    """No module calls ``matplotlib.use`` at import (the CLI chooses Agg for its own runs)."""
    assert imported_all["modules"] > 20
    assert imported_all["backend"].lower() == "svg"


@pytest.mark.slow
def test_import_initialises_no_jax_backend(imported_all):
    """The native kernel is loaded and its FFI targets registered at import, yet no JAX backend
    exists: an ``XLA_FLAGS`` set after ``import meanfield`` applies (3 CPU devices), and the
    kernel still passes its self-test afterwards."""
    assert not imported_all["initialised"]
    assert imported_all["cpus"] == 3
    if _native._cache._compiler() is not None:
        assert imported_all["loaded"] and imported_all["available"], imported_all["reason"]


@pytest.mark.slow
def test_cold_cache_builds_at_import_once(cold_cache):
    """A fresh cache: the first ``import meanfield.kernels`` compiles (one line on stderr, two
    libraries, loaded when the import returns: ``cold_cache``), the second finds them and prints
    nothing about a build."""
    cache, first = cold_cache
    code = (
        "import meanfield.kernels, meanfield._native as n; print(n._exp_state['lib'] is not None)"
    )
    second = _run(code, env={"MEANFIELD_CACHE_DIR": str(cache)})
    assert second.returncode == 0, second.stderr
    built = [ln for ln in first.stderr.splitlines() if ln.startswith("meanfield: ")]
    assert built == [f"{_BUILD_LINE} (once, cached in {cache}) ..."], first.stderr
    assert first.stdout.strip().splitlines()[-1].split()[0] == "True", first.stdout  # loaded
    assert second.stdout.split() == ["True"]
    assert "meanfield: " not in second.stderr, second.stderr
    assert sorted(p.name.split("-")[0] for p in cache.glob("*.so")) == [
        "exp_kernel",
        "exp_kernel",
    ]


# the first use of the kernel (self-test included) inside a jit trace, with every way of running
# the compiler watched: a call of _compile, or any process started with the compiler's path
_TRACE = r"""
import subprocess, sys, jax, jax.numpy as jnp
import meanfield as mf
import meanfield.kernels  # the engine's import builds the library (import meanfield is lazy)
from meanfield import _native
calls = []
cc = _native._cache._compiler()
real_run, real_popen = subprocess.run, subprocess.Popen
def run(args, *a, **k):
    if cc is not None and args and args[0] == cc:
        calls.append(args)
    return real_run(args, *a, **k)
def popen(args, *a, **k):
    if cc is not None and args and args[0] == cc:
        calls.append(args)
    return real_popen(args, *a, **k)
def compile_(*a, **k):
    calls.append(a)
    raise AssertionError("the C compiler ran during a trace")
subprocess.run, subprocess.Popen, _native._cache._compile = run, popen, compile_
loaded = _native._exp_state["lib"] is not None  # built (or found) and loaded at import
assert not _native._exp_state["tested"]  # the first use is the trace below
x = mf.sphere.uniform(jax.random.key(0), 16, 3)
f = jax.jit(lambda x: mf.energy(mf.kernels.USA(1.0), x))
hlo = f.lower(x).as_text()
e = float(f(x))
lib = _native.exp_library()  # "auto": the kernel where the crossover (measured in the trace above) prefers it
want = lib.available and lib.crossover.prefers_native(16, 3)
print(loaded, len(calls), lib.available, ("meanfield_exp" in hlo) == want, e > 0, "|", lib.reason)
"""


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory):
    """``_TRACE`` in a process with a fresh cache: the kernel is built at import (the clean build
    of ``test_cold_cache_builds_at_import_once``), then first used inside a trace
    (``test_no_compiler_runs_inside_a_trace``)."""
    if _native._cache._compiler() is None:
        pytest.skip("no C compiler")
    cache = tmp_path_factory.mktemp("cold")
    r = _run(_TRACE, env={"MEANFIELD_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr
    return cache, r


def _check_trace(r, built):
    loaded, calls, available, path_as_measured, positive, *_ = (
        r.stdout.strip().splitlines()[-1].split()
    )
    assert calls == "0" and positive == "True" and path_as_measured == "True"
    assert available == loaded == str(built), r.stdout
    if not built:
        assert "C compiler failed" in r.stdout


@pytest.mark.slow
def test_no_compiler_runs_inside_a_trace(cold_cache):
    """Tracing ``mf.energy`` (the kernel's first use: its self-test and the crossover measurement
    of ``backend="auto"`` run then) starts no compiler when the library was built at import (in a
    fresh cache: ``cold_cache``)."""
    _check_trace(cold_cache[1], built=True)


@pytest.mark.slow
def test_no_compiler_runs_inside_a_trace_after_a_failed_build(tmp_path):
    """The same when the build failed at import: the XLA path, with the reason."""
    r = _run(_TRACE, env={"MEANFIELD_CACHE_DIR": str(tmp_path / "cache"), "CC": "false"})
    assert r.returncode == 0, r.stderr
    _check_trace(r, built=False)


def test_exp_library_never_compiles(monkeypatch):
    """``exp_library()`` only reports (the build happened at import)."""
    monkeypatch.setattr(_native._cache, "_compile", lambda *a, **k: pytest.fail("the compiler ran"))
    assert _native.exp_library().available == (_native.exp_library().reason is None)


def test_summary_keys_and_json(capsys):
    d = info.summary()
    assert sorted(d) == [
        "compilation_cache",
        "jax",
        "meanfield",
        "native",
        "packages",
        "platform",
        "plugins",
        "python",
    ]
    assert sorted(d["packages"]) == sorted(info.PACKAGES) and d["packages"]["jax"]
    assert sorted(d["jax"]) == ["backend", "devices", "x64"] and d["jax"]["devices"]
    nat = d["native"]
    assert {
        "disabled",
        "cache_dir",
        "compiler",
        "compiler_version",
        "threads",
        "exp_threads",
        "exp_kernel",
        "phase_kernel",
    } <= set(nat)
    for key in ("exp_kernel", "phase_kernel"):
        k = nat[key]
        assert k["available"] == (k["reason"] is None)
        assert len(k["libraries"]) == (2 if k["available"] else 0)
    import jax

    from meanfield import phase_diagram

    measured = {  # what "auto" follows, measured on this machine, shown by `meanfield info`
        "exp_kernel": lambda: _native.exp_library().crossover,
        "phase_kernel": lambda: phase_diagram._phase_crossover(
            jax.dtypes.canonicalize_dtype(float)
        ),
    }
    for key, crossover_now in measured.items():
        crossover = nat[key]["crossover"]
        assert (crossover is not None) == nat[key]["available"]
        if crossover is not None:
            assert crossover["rule"] == crossover_now().describe()
            assert set(crossover["times"]) and all(
                a > 0 and b > 0 for a, b in crossover["times"].values()
            )
    assert nat["cache_dir"] == str(_native._cache._cache_dir())
    assert info.main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(info.summary()))
    assert info.main([]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"meanfield {d['meanfield']} (Python ") and "exp kernel: " in text
    assert ("exp kernel: available" in text) == nat["exp_kernel"]["available"]
    assert text.count("backend='auto': ") == sum(
        nat[key]["available"] for key in ("exp_kernel", "phase_kernel")
    )
    if nat["phase_kernel"]["available"]:  # the phase kernel's line: its own measurement
        rule = nat["phase_kernel"]["crossover"]["rule"]
        assert f"backend='auto': {rule}" in text and "per sweep of" in rule


def test_format_summary_says_why_not():
    d = info.summary()
    d["native"].update(disabled=True, exp_threads=None)
    d["native"]["exp_kernel"] = {
        "available": False,
        "reason": "disabled by MEANFIELD_NATIVE=0",
        "libraries": [],
        "crossover": None,
    }
    d["native"]["phase_kernel"] = {**d["native"]["exp_kernel"]}
    text = info.format_summary(d)
    assert "exp kernel: not available: disabled by MEANFIELD_NATIVE=0" in text
    assert "switched off (MEANFIELD_NATIVE=0)" in text and "backend='auto'" not in text


def test_docstring_examples():
    result = doctest.testmod(info, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


_REBUILD = r"""
import sys, meanfield.info
sys.exit(meanfield.info.main(["--json", "--rebuild-native"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("disabled", [False, True])
def test_rebuild_native(tmp_path, monkeypatch, disabled):
    """``--rebuild-native`` compiles both kernels again over remembered failures (exit 0); with
    ``MEANFIELD_NATIVE=0`` nothing is built and it exits 1 with the reason."""
    if _native._cache._compiler() is None and not disabled:
        pytest.skip("no C compiler")
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {"MEANFIELD_CACHE_DIR": str(cache), "MEANFIELD_NATIVE": "0" if disabled else "1"}
    if not disabled:
        # every flag set of both kernels recorded as rejected by this compiler: no process builds
        monkeypatch.setenv("MEANFIELD_CACHE_DIR", str(cache))
        cc, version = _native._cache._toolchain()
        for source, include in (
            (_native.EXP_SOURCE, [_native._exp._exp_include()]),
            (_native.SOURCE, []),
        ):
            digest = _native._cache._source_digest(source, include)
            for _, defines, _, _ in _native._cache._BUILDS:
                for flags, path in _native._cache._library_paths(
                    cc, version, source, defines, include
                ):
                    record = {
                        "identity": _native._cache._identity(cc, version, flags, digest),
                        "error": "stale failure",
                    }
                    path.with_suffix(".failed").write_text(json.dumps(record))
        code = "from meanfield import _native; print(_native.exp_library().available, _native.exp_library().reason)"
        r = _run(code, env=env)
        assert r.returncode == 0 and r.stdout.startswith("False") and "stale failure" in r.stdout, (
            r.stderr
        )
        said = [ln for ln in r.stderr.splitlines() if ln.startswith("meanfield: ")]
        assert len(said) == 1 and "stale failure" in said[0] and "--rebuild-native" in said[0], (
            r.stderr
        )
        assert not list(cache.glob("*.so"))
    r = _run(_REBUILD, env=env)
    assert r.returncode == (1 if disabled else 0), r.stderr
    nat = json.loads(r.stdout)["native"]
    if disabled:
        assert nat["exp_kernel"]["reason"] == "disabled by MEANFIELD_NATIVE=0" and nat["disabled"]
        assert not list(cache.iterdir())
        return
    assert nat["exp_kernel"]["available"] and nat["phase_kernel"]["available"]
    assert nat["exp_kernel"]["crossover"]["recorded"].startswith(
        str(cache)
    )  # measured again, beside it
    assert (
        sorted(p.name.split("-")[0] for p in cache.glob("*.so"))
        == ["exp_kernel"] * 2 + ["phase_kernel"] * 2
    )
    assert not list(cache.glob("*.failed"))
    # a manifest per library, the crossover record of each kernel (the phase kernel's: float32,
    # JAX's default float, beside that library)
    assert len(list(cache.glob("*.json"))) == 6
    assert sorted(p.name.split("-")[0] for p in cache.glob("*.crossover.json")) == [
        "exp_kernel",
        "phase_kernel",
    ]
    assert nat["phase_kernel"]["crossover"]["recorded"].startswith(str(cache))
    assert (
        "building the native CPU kernels" in r.stderr
        and "building the native phase-diagram kernel" in r.stderr
    )


def test_main_rejects_unknown_options():
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()):
        info.main(["--nope"])
    assert e.value.code == 2
