"""The native kernels' cache under attack (issue 17): a damaged library, a planted one, a failed
build, and the line on stderr that says when the XLA path runs instead.

Every case runs ``import meanfield`` in a subprocess with its own cache directory
(``MEANFIELD_CACHE_DIR``): the process must exit 0, compute the same field as the XLA path, and
say on stderr, in one line, what it did (rebuilt, refused, fell back). A planted library
writes a marker file from its constructor: the marker must never appear.
"""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from meanfield import _native

# the field through the default path (native if it loads) against the XLA path, and the state
_FIELD = r"""
import json, jax, numpy as np
import meanfield as mf
from meanfield import _native
x = mf.sphere.uniform(jax.random.key(0), 40, 3)
k = mf.kernels.USA(1.3)  # imports meanfield.kernels: the kernel is built (or not) here
b = "native" if _native.exp_library().available else "auto"  # "auto" runs XLA where it is unavailable
v = jax.jit(lambda x: mf.velocity(k, x, backend=b))(x)
vx = jax.jit(lambda x: mf.velocity(mf.kernels.USA(1.3), x, backend="xla"))(x)
print(json.dumps({"available": _native.exp_library().available, "reason": _native.exp_library().reason,
                  "diff": float(np.abs(np.asarray(v) - np.asarray(vx)).max()),
                  "scale": float(np.abs(np.asarray(vx)).max())}))
"""

_FAKE_CC = """#!/bin/sh
# a C compiler that fails every build (identity: its path and this --version text)
if [ "$1" = "--version" ]; then {version}; exit 0; fi
echo "$0 $*" >> "{log}"
{body}
"""


def _env(cache, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "MEANFIELD_NATIVE_QUIET")}
    return {**env, "MEANFIELD_CACHE_DIR": str(cache), "MEANFIELD_NATIVE": "1", **extra}


def _run(code, cache, timeout=600, **extra):
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(cache, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr  # never a crash (SIGBUS would be -7)
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("meanfield: ")]
    return json.loads(r.stdout.strip().splitlines()[-1]), said


def _same_as_xla(out):
    assert out["diff"] <= 2e-6 * out["scale"], out


def _needs_compiler():
    if _native._cache._compiler() is None:
        pytest.skip("no C compiler")


def _exp_libraries(cache):
    """The float64 and float32 exp-kernel libraries (first flag set) the current compiler gives."""
    old = os.environ.get("MEANFIELD_CACHE_DIR")
    os.environ["MEANFIELD_CACHE_DIR"] = str(cache)
    try:
        cc, version = _native._cache._toolchain()
        return [
            _native._cache._library_paths(
                cc, version, _native.EXP_SOURCE, defines, [_native._exp._exp_include()]
            )[0][1]
            for _, defines, _, _ in _native._cache._BUILDS
        ]
    finally:
        if old is None:
            del os.environ["MEANFIELD_CACHE_DIR"]
        else:
            os.environ["MEANFIELD_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache with both exp-kernel libraries built (copied into each test's own cache): a clean
    build into a cache directory that did not exist (``test_new_cache_directory_is_private``
    checks what it created)."""
    _needs_compiler()
    cache = tmp_path_factory.mktemp("template") / "new" / "cache"
    out, said = _run(_FIELD, cache)
    assert out["available"], out
    _same_as_xla(out)
    assert len(said) == 1 and said[0].startswith("meanfield: building"), said
    return cache


def _copy(built, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(built, cache, ignore=shutil.ignore_patterns("*.lock"))
    return cache


def _manifest(lib):
    return json.loads(lib.with_suffix(".json").read_text())


def _fake_compiler(tmp_path, name="fakecc", version="echo fakecc 1.0", body="exit 1"):
    path = tmp_path / name
    path.write_text(_FAKE_CC.format(version=version, log=tmp_path / "compiler.log", body=body))
    path.chmod(0o700)
    return path


def _compiles(tmp_path):
    log = tmp_path / "compiler.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


# ---------------------------------------------------------------------------------------------
# a damaged library: rebuilt once, with one line saying so; never loaded


def _damage(lib, how):
    data = lib.read_bytes()
    if how == "4096 bytes":
        lib.write_bytes(data[:4096])
    elif how == "half":
        lib.write_bytes(data[: len(data) // 2])
    elif how == "random bytes":
        lib.write_bytes(os.urandom(len(data)))  # the recorded size, other bytes
    elif how == "no manifest":
        lib.with_suffix(".json").unlink()
    elif how == "bad manifest":
        lib.with_suffix(".json").write_text("{not json")


@pytest.mark.slow
@pytest.mark.parametrize(
    "how", ["4096 bytes", "half", "random bytes", "no manifest", "bad manifest"]
)
def test_damaged_library_is_rebuilt(built, tmp_path, how):
    cache = _copy(built, tmp_path)
    lib = _exp_libraries(cache)[1]  # the float32 build: the one the field below runs
    good = _manifest(lib)
    _damage(lib, how)
    out, said = _run(_FIELD, cache)
    assert out["available"], out
    _same_as_xla(out)
    assert len(said) == 1, said
    assert f"the cached native library {lib} is damaged" in said[0] and said[0].endswith(
        "rebuilding it"
    ), said
    assert (
        _native._cache._damage(lib) is None
        and _manifest(lib)["size"] == lib.stat().st_size > good["size"] // 2
    )
    if how == "4096 bytes":  # (the others: `_damage` above is None, the check every load makes)
        # and the rebuilt cache is used as it is by the next process: nothing said
        out, said = _run(_FIELD, cache)
        assert out["available"] and said == [], said


@pytest.mark.slow
def test_damaged_library_that_cannot_be_rebuilt_falls_back(built, tmp_path):
    """A truncated library and a compiler that fails (with the real one's version, so the same
    cache names): the XLA path, one line naming the failure, exit 0."""
    cache = _copy(built, tmp_path)
    for lib in _exp_libraries(cache):
        _damage(lib, "half")
    real = _native._cache._compiler()
    cc = _fake_compiler(tmp_path, version=f'exec "{real}" --version')
    out, said = _run(_FIELD, cache, CC=str(cc))
    assert not out["available"] and "C compiler failed" in out["reason"], out
    _same_as_xla(out)
    assert len(said) == 2, said  # the rebuild, then why the XLA path runs
    assert "is damaged" in said[0] and said[1].startswith(
        "meanfield: native CPU kernels unavailable"
    ), said
    assert "MEANFIELD_NATIVE_QUIET=1" in said[1]


# ---------------------------------------------------------------------------------------------
# a planted library: refused before it is loaded (its constructor never runs)

_PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("MF_PLANTED_MARKER"), "w");
    if (f) { fputs("the planted constructor ran\n", f); fclose(f); }
}
"""


@pytest.fixture(scope="module")
def planted_library(tmp_path_factory):
    _needs_compiler()
    d = tmp_path_factory.mktemp("planted")
    (d / "planted.c").write_text(_PLANTED)
    r = subprocess.run(
        [
            _native._cache._compiler(),
            "-shared",
            "-fPIC",
            "-o",
            str(d / "planted.so"),
            str(d / "planted.c"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot build the planted library: {r.stderr}")
    # the constructor does run when the library is loaded: the marker below can appear
    marker = d / "check"
    subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(d / 'planted.so')!r})"],
        check=True,
        env={**os.environ, "MF_PLANTED_MARKER": str(marker)},
        timeout=120,
    )
    assert marker.exists()
    return d / "planted.so"


def _plant(planted_library, cache):
    """The planted library under the names of both exp-kernel libraries, with matching manifests
    (the worst case: whoever can write there can write a manifest too)."""
    cache.mkdir(exist_ok=True)
    libs = _exp_libraries(cache)
    data = planted_library.read_bytes()
    for lib in libs:
        lib.write_bytes(data)
        lib.chmod(0o700)
        lib.with_suffix(".json").write_text(
            json.dumps({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        )
        lib.with_suffix(".json").chmod(0o600)
    return libs


_ATTACKS = [
    "directory writable by others",
    "directory writable by group",
    "library writable by others",
    "manifest writable by group",
    "library owned by another user",
    "directory owned by another user",
    "library is a symbolic link",
]


@pytest.mark.parametrize("attack", _ATTACKS)
def test_planted_library_is_refused(planted_library, tmp_path, attack):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    libs = _plant(planted_library, cache)
    target, fix = libs[0], "chmod go-w"
    if "owned by another user" in attack:
        if os.geteuid() != 0:
            pytest.skip("changing a file's owner needs root")
        target, fix = (libs[0] if attack.startswith("library") else cache), "remove it"
        os.chown(target, 65534, 65534)
    elif attack.startswith("directory"):
        target = cache
        cache.chmod(0o777 if "others" in attack else 0o770)
    elif attack.startswith("library writable"):
        libs[0].chmod(0o702)
    elif attack.startswith("manifest"):
        target = libs[0].with_suffix(".json")
        target.chmod(0o620)
    else:  # a symbolic link to the planted library
        libs[0].unlink()
        libs[0].symlink_to(planted_library)
        fix = "remove it"
    marker = tmp_path / "constructor-ran"
    out, said = _run(_FIELD, cache, MF_PLANTED_MARKER=str(marker))
    assert not marker.exists(), "the planted library's constructor ran"
    assert not out["available"] and "refused" in out["reason"] and str(target) in out["reason"], out
    _same_as_xla(out)
    assert len(said) == 1, said
    assert "refused" in said[0] and str(target) in said[0] and fix in said[0], said
    for lib in libs:  # and nothing was rebuilt over them
        assert (
            not lib.exists() or lib.is_symlink() or lib.read_bytes() == planted_library.read_bytes()
        )


def test_new_cache_directory_is_private(built):
    """A cache directory that does not exist is created with mode 0700, its files not writable
    by group or others (the clean build of the ``built`` fixture: available, one line saying it
    builds; its cache is only read by the other tests, which copy it)."""
    assert stat.S_IMODE(built.stat().st_mode) & 0o077 == 0
    files = list(built.iterdir())
    assert sorted(p.name.split("-")[0] for p in built.glob("*.so")) == ["exp_kernel"] * 2, files
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) & 0o022 == 0, f


# ---------------------------------------------------------------------------------------------
# a failed build: recorded with the compiler identity, retried when it changes or when asked

_BOTH = _FIELD.replace(
    'print(json.dumps({"available"',
    'phase = _native.phase_library().available\nprint(json.dumps({"phase": phase, "available"',
)


def test_failed_build_is_recorded_and_retried(tmp_path):
    cache = tmp_path / "cache"
    cc = _fake_compiler(tmp_path)
    out, said = _run(_BOTH, cache, CC=str(cc))
    first = _compiles(tmp_path)
    assert first > 0 and not out["available"] and not out["phase"], out
    _same_as_xla(out)
    # a line for each kernel saying it builds, one (only one, for both kernels) saying why the XLA path runs
    building = [ln for ln in said if ln.startswith("meanfield: building")]
    unavailable = [ln for ln in said if ln.startswith("meanfield: native CPU kernels unavailable")]
    assert len(building) == 2 and len(unavailable) == 1 and len(said) == 3, said
    assert "C compiler failed" in unavailable[0] and str(cc) in unavailable[0], (
        said
    )  # the compiler identity
    records = [json.loads(p.read_text()) for p in cache.glob("*.failed")]
    assert records and all(
        r["identity"]["compiler"] == str(cc)
        and r["identity"]["version"] == "fakecc 1.0\n"
        and r["identity"]["source_sha256"]
        for r in records
    )

    # the same compiler: not run again, the recorded failure said in one line
    out, said = _run(_BOTH, cache, CC=str(cc))
    assert _compiles(tmp_path) == first and not out["available"], out
    assert (
        len(said) == 1
        and "recorded with the compiler's identity" in said[0]
        and "--rebuild-native" in said[0]
    )
    assert "recorded in" in out["reason"], out  # the full reason: the record's path

    # another compiler identity (same --version, another path): tried again
    other = _fake_compiler(tmp_path, name="othercc")
    out, said = _run(_BOTH, cache, CC=str(other))
    second = _compiles(tmp_path)
    assert second > first and not out["available"], out

    # and on request, by the same compiler
    rebuild = (
        "import sys, meanfield.info; sys.exit(meanfield.info.main(['--rebuild-native', '--json']))"
    )
    r = subprocess.run(
        [sys.executable, "-c", rebuild],
        env=_env(cache, CC=str(other)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1, r.stderr  # asked to build, and the build failed
    assert _compiles(tmp_path) > second
    nat = json.loads(r.stdout)["native"]
    assert "C compiler failed" in nat["exp_kernel"]["reason"] and nat["compiler"] == str(other)


@pytest.mark.parametrize(
    "body",
    ["kill -9 $$", 'echo "cc1: fatal error: Killed signal terminated program cc1" >&2; exit 1'],
)
def test_killed_compiler_is_not_recorded(tmp_path, body):
    """A compiler killed once (by a signal, or a child killed: GCC's message) says nothing about
    the source: no record, the next process tries again."""
    cache = tmp_path / "cache"
    cc = _fake_compiler(tmp_path, body=body)
    out, said = _run(_FIELD, cache, CC=str(cc))
    assert not out["available"] and len(said) == 2 and "not recorded" in said[1], said
    assert not list(cache.glob("*.failed"))
    first = _compiles(tmp_path)
    _run(_FIELD, cache, CC=str(cc))
    assert _compiles(tmp_path) > first


# ---------------------------------------------------------------------------------------------
# the line on stderr: once per process, silenced by MEANFIELD_NATIVE_QUIET, not when switched off

_MANY = (
    _BOTH
    + r"""
for beta in (0.5, 2.0):
    jax.jit(lambda x: mf.energy(mf.kernels.USA(beta), x))(x).block_until_ready()
_native.phase_library().available, _native.exp_library().available, _native.prepare()
print(json.dumps({"diff": 0.0, "scale": 1.0, "available": _native.exp_library().available, "reason": None}))
"""
)


@pytest.mark.parametrize("setting", ["default", "quiet", "switched off"])
def test_unavailable_line_once_per_process(tmp_path, setting):
    cache = tmp_path / "cache"
    cc = _fake_compiler(tmp_path)
    extra = {"CC": str(cc)}
    if setting == "quiet":
        extra["MEANFIELD_NATIVE_QUIET"] = "1"
    elif setting == "switched off":
        extra["MEANFIELD_NATIVE"] = "0"
    out, said = _run(_MANY, cache, **extra)
    assert not out["available"]
    unavailable = [ln for ln in said if ln.startswith("meanfield: native CPU kernels unavailable")]
    assert len(unavailable) == (1 if setting == "default" else 0), said
    if setting == "switched off":
        assert said == [] and _compiles(tmp_path) == 0


# ---------------------------------------------------------------------------------------------
# threads under contention


def test_threads_follow_the_load():
    """With more busy processes than CPUs (the CPUs of this process are all busy with others' work),
    a short call of the exp kernel (and of the phase kernel) takes one thread while adaptive; a
    long call and fixed thread counts take them all."""
    if not _native.exp_library().available:
        pytest.skip(f"no native kernel: {_native.exp_library().reason}")
    most = max(2, _native.exp_default_threads())
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 1) + 1)
    ]
    try:
        time.sleep(0.5)  # started
        _native.set_exp_threads(most)
        _native.exp_threads_now(), _native.threads_now(most)  # samples of the load at the start ...
        time.sleep(0.5)
        loaded = (
            _native.exp_threads_now(),
            _native.threads_now(most),
        )  # ... and over the 0.5 s since
        long_call = _native.exp_threads_now(1, 4096, 16)  # about 20 ms of one CPU: all threads
        _native.set_exp_threads(most, adaptive=False)
        fixed = _native.exp_threads_now()
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
        _native.set_exp_threads()
    assert loaded == (1, 1) and fixed == most and long_call == most
    _native.set_exp_threads(1)
    try:
        assert _native.exp_threads_now() == 1 and 1 <= _native.threads_now(most) <= most
    finally:
        _native.set_exp_threads()


def test_no_environment_variable_is_set():
    """Loading and configuring the kernels sets no OMP_* (or any) environment variable."""
    code = textwrap.dedent("""
        import os, json
        before = dict(os.environ)
        import meanfield as mf, jax
        from meanfield import _native
        _native.exp_library().available; _native.phase_library().available
        if _native.exp_library().available:
            _native.set_exp_threads(1); _native.set_exp_threads()
        mf.velocity(mf.kernels.USA(1.0), mf.sphere.uniform(jax.random.key(0), 600, 3)).block_until_ready()
        print(json.dumps({"changed": sorted(k for k in set(before) | set(os.environ)
                                            if before.get(k) != os.environ.get(k))}))
    """)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith("OMP_")},
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["changed"] == []


@pytest.mark.slow
def test_concurrent_first_imports_compile_each_library_once(tmp_path):
    """Three processes importing meanfield at once on an empty cache: every one loads the kernel
    and each library is compiled once (a lock per library), none reads a half-written one."""
    _needs_compiler()
    real = _native._cache._compiler()
    cc = _fake_compiler(
        tmp_path, name="wrapcc", version=f'exec "{real}" --version', body=f'exec "{real}" "$@"'
    )
    cache = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _FIELD],
            env=_env(cache, CC=str(cc)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result["available"], result
        _same_as_xla(result)
        assert "damaged" not in err, err
    assert _compiles(tmp_path) == 4  # 2 libraries (float64, float32) x (compile, link)
