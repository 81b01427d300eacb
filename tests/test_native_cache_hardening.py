"""The native kernels' cache against broken compilers and odd files (issue 27, items 3 and 5).

A compiler that exits 0 after writing a truncated library, a poisoned library with a matching
manifest, a FIFO or a directory in place of a cached file, a compiler (or its ``--version``) that
hangs, a read-only cache directory holding an intact cache, a parent directory writable by
others. Each case runs ``import meanfield`` (or ``meanfield info``) in a real process with its
own cache directory (``MEANFIELD_CACHE_DIR``) and a time limit: the process exits by itself (no
signal, no hang), and says on stderr, in one line, what it did.
"""

import ctypes
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meanfield import _native

_STATE = r"""
import json, time
t0 = time.monotonic()
import meanfield.kernels  # the engine's import builds the exp kernel (import meanfield is lazy)
from meanfield import _native
t1 = time.monotonic()
phase = _native.phase_library().available  # the phase kernel, built (or not) at its first use
print(json.dumps({"available": _native.exp_library().available, "reason": _native.exp_library().reason,
                  "phase": phase, "phase_reason": _native.phase_library().reason,
                  "import_s": t1 - t0, "phase_s": time.monotonic() - t1}))
"""

# the exp kernel only (built at import): the phase kernel is never asked for
_EXP_ONLY = _STATE.replace("phase = _native.phase_library().available", "phase = None").replace(
    '"phase_reason": _native.phase_library().reason', '"phase_reason": None'
)

_REBUILD = (
    "import sys, meanfield.info; sys.exit(meanfield.info.main(['--rebuild-native', '--json']))"
)


def _env(cache, **extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "CC",
            "MEANFIELD_NATIVE_QUIET",
            "MEANFIELD_CC_TIMEOUT",
            "MEANFIELD_CC_VERSION_TIMEOUT",
            "MEANFIELD_CACHE_LOCK_TIMEOUT",
        )
    }
    return {**env, "MEANFIELD_CACHE_DIR": str(cache), "MEANFIELD_NATIVE": "1", **extra}


def _proc(code, cache, timeout=300, preexec_fn=None, **extra):
    """``python -c code``: never killed by a signal, never past ``timeout`` (TimeoutExpired fails)."""
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(cache, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec_fn,
    )
    assert r.returncode >= 0, f"killed by signal {-r.returncode}: {r.stderr[-2000:]}"
    return r


def _run(code, cache, **kw):
    r = _proc(code, cache, **kw)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("meanfield: ")]
    return json.loads(r.stdout.strip().splitlines()[-1]), said


def _needs_compiler():
    if _native._cache._compiler() is None:
        pytest.skip("no C compiler")


def _exp_libraries(cache):
    """The float64 and float32 exp-kernel libraries (first flag set) of the real compiler's version
    (in ``cache``; ``None``: this process's cache directory)."""
    old = os.environ.get("MEANFIELD_CACHE_DIR")
    if cache is not None:
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
        if cache is None:
            pass
        elif old is None:
            del os.environ["MEANFIELD_CACHE_DIR"]
        else:
            os.environ["MEANFIELD_CACHE_DIR"] = old


def _fake_cc(tmp_path, body, version=None, name="fakecc"):
    """A compiler script: ``--version`` runs ``version`` (default: the real compiler's, so that the
    cache names are the real ones), anything else is logged and runs ``body``."""
    real = _native._cache._compiler()
    version = version or (f'exec "{real}" --version' if real else "echo fakecc 1.0")
    log = tmp_path / f"{name}.log"
    path = tmp_path / name
    path.write_text(f"""#!/bin/sh
if [ "$1" = "--version" ]; then echo version >> "{log}.version"; {version}; exit 0; fi
echo "$*" >> "{log}"
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
{body}
""")
    path.chmod(0o700)
    return path


def _calls(tmp_path, name="fakecc", suffix=""):
    log = tmp_path / f"{name}.log{suffix}"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _shared_library():
    """A real shared library of this machine (the interpreter's ``_ctypes`` extension)."""
    import _ctypes

    data = open(_ctypes.__file__, "rb").read()
    if data[:4] != b"\x7fELF":
        pytest.skip("not an ELF platform")
    return _ctypes.__file__, data


# ---------------------------------------------------------------------------------------------
# item 3: a truncated library is never recorded, never loaded


def test_elf_check_accepts_a_library_and_names_each_defect():
    path, data = _shared_library()
    assert _native._cache._elf_problem(data) is None
    assert _native._cache._elf_problem(data[:4096]).startswith("truncated: ")
    assert _native._cache._elf_problem(b"#!/bin/sh\nexit 0\n" * 10) == "not an ELF file (170 bytes)"
    exe = open(os.path.realpath(sys.executable), "rb").read(64)
    if exe[16] == 2:  # a non-PIE executable: ELF, but not a shared object
        assert "not a shared object" in _native._cache._elf_problem(exe + data[64:])
    other = bytearray(data)
    other[18:20] = (0x1234).to_bytes(2, "little" if data[5] == 1 else "big")
    assert _native._cache._elf_problem(bytes(other)).startswith(
        "ELF machine 4660, this process runs on machine "
    )


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 1.0, exclude_max=True))
def test_elf_check_rejects_every_truncation(fraction):
    """Whatever the cut, a truncated library is rejected (its section headers are at its end)."""
    _, data = _shared_library()
    cut = int(fraction * len(data))
    assert _native._cache._elf_problem(data[:cut]) is not None


_TRUNCATE = 'head -c 4096 "{lib}" > "$out"; exit 0'


@pytest.mark.slow
def test_crashing_compiler_is_recorded_not_retried_at_every_import(tmp_path):
    """A compiler that dies by SIGSEGV (not killed from outside): a recorded failure naming the
    signal, so the next import does not run it again (a SIGKILL stays unrecorded:
    tests/test_native_cache.py)."""
    cc = _fake_cc(tmp_path, "kill -SEGV $$")
    cache = tmp_path / "cache"
    out, said = _run(_EXP_ONLY, cache, timeout=120, CC=str(cc))
    assert not out["available"] and "the compiler crashed (SIGSEGV)" in out["reason"], out
    assert "recorded with the compiler's identity" in out["reason"], out
    assert len(said) == 2 and "the compiler crashed (SIGSEGV)" in said[1], (
        said
    )  # building ..., unavailable
    calls = _calls(tmp_path)
    assert calls >= 1
    out, said = _run(_EXP_ONLY, cache, timeout=120, CC=str(cc))
    assert (
        not out["available"] and "the compiler crashed (SIGSEGV) (recorded in " in out["reason"]
    ), out
    assert _calls(tmp_path) == calls  # not run again


@pytest.mark.slow
def test_truncated_compiler_output_is_recorded_and_never_loaded(tmp_path):
    """A compiler that exits 0 after writing a 4 KiB truncated library: no manifest, a recorded
    failure naming the defect, the XLA path with exit status 0; the next import does not run
    the compiler again; ``meanfield info --rebuild-native`` runs, says why, exits 1."""
    _needs_compiler()
    lib, _ = _shared_library()
    cc = _fake_cc(tmp_path, _TRUNCATE.format(lib=lib))
    cache = tmp_path / "cache"
    out, said = _run(_STATE, cache, CC=str(cc))
    assert not out["available"] and not out["phase"], out
    assert "wrote no usable library: truncated: " in out["reason"], out
    unavailable = [ln for ln in said if ln.startswith("meanfield: native CPU kernels unavailable")]
    assert len(said) == 3 and len(unavailable) == 1, (
        said
    )  # building each kernel, and why the XLA path runs
    assert "wrote no usable library: truncated" in unavailable[0], said
    assert "recorded with the compiler's identity" in unavailable[0], said
    assert not list(cache.glob("*.json")), "a manifest was written for a truncated library"
    records = [json.loads(p.read_text()) for p in cache.glob("*.failed")]
    # 2 kernels x 2 flag sets of the first dtype (a kernel whose first dtype fails stops there)
    assert len(records) == 4 and all("truncated" in r["error"] for r in records)
    first = _calls(tmp_path)

    out, said = _run(_STATE, cache, CC=str(cc))
    assert _calls(tmp_path) == first and not out["available"], out
    assert len(said) == 1 and "recorded" in said[0] and "truncated" in said[0], said

    r = _proc(_REBUILD, cache, CC=str(cc))
    assert r.returncode == 1, r.stderr[-2000:]
    assert _calls(tmp_path) > first
    nat = json.loads(r.stdout)["native"]
    assert (
        "truncated" in nat["exp_kernel"]["reason"] and "truncated" in nat["phase_kernel"]["reason"]
    ), nat


@pytest.mark.slow
def test_poisoned_library_with_matching_manifest_is_rebuilt_not_loaded(tmp_path):
    """What an earlier version recorded for such a compiler: a 4 KiB library with a matching
    manifest, under the current names. ``import meanfield`` and ``meanfield info
    --rebuild-native`` (the documented fix) see it is damaged and rebuild it, never load it (a
    load dies by SIGBUS); the rebuilt kernel is available."""
    _needs_compiler()
    _, data = _shared_library()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    libs = _exp_libraries(cache)
    for lib in libs:
        lib.write_bytes(data[:4096])
        lib.chmod(0o700)
        lib.with_suffix(".json").write_text(
            json.dumps({"size": 4096, "sha256": hashlib.sha256(data[:4096]).hexdigest()})
        )
        lib.with_suffix(".json").chmod(0o600)
    real = _native._cache._compiler()
    failing = _fake_cc(tmp_path, "exit 1")  # the real version: the same names; fails every build
    out, said = _run(_STATE, cache, CC=str(failing))
    assert not out["available"], out
    assert (
        f"the cached native library {libs[0]} is damaged (not a valid shared library: truncated"
        in said[0]
    ), said

    for lib in libs:  # poisoned again, then the documented fix with a working compiler
        lib.write_bytes(data[:4096])
        lib.with_suffix(".json").write_text(
            json.dumps({"size": 4096, "sha256": hashlib.sha256(data[:4096]).hexdigest()})
        )
    r = _proc(_REBUILD, cache, CC=real)
    assert r.returncode == 0, r.stderr[-2000:]
    nat = json.loads(r.stdout)["native"]
    assert nat["exp_kernel"]["available"] and nat["phase_kernel"]["available"], nat
    assert all(_native._cache._damage(lib) is None for lib in libs)
    assert all(len(lib.read_bytes()) > 4096 for lib in libs)


# ---------------------------------------------------------------------------------------------
# item 5: odd files in the cache are refused, naming their path, without blocking


@pytest.mark.parametrize("kind", ["FIFO", "directory"])
def test_library_replaced_by_fifo_or_directory_is_refused_without_hanging(tmp_path, kind):
    _needs_compiler()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    libs = _exp_libraries(cache)
    for lib in libs:
        if kind == "FIFO":
            os.mkfifo(lib, 0o600)
        else:
            lib.mkdir(mode=0o700)
    code = _EXP_ONLY
    out, said = _run(code, cache, timeout=120)
    what = "a FIFO" if kind == "FIFO" else "a directory"
    expected = (
        f"refused the native kernel library {libs[0]}: {what}, not a regular file; fix: remove it"
    )
    assert not out["available"] and out["reason"] == expected, out
    assert len(said) == 1 and expected in said[0], said


_ODD = r"""
import json, os, signal, sys
from pathlib import Path
from meanfield import _native
signal.alarm(60)  # a blocking open would end here, by SIGALRM: the test sees the signal
d = Path(sys.argv[1])
out = {}
for what, call in (("manifest", lambda: _native._cache._read_private(d / "x.json", "manifest")),
                   ("failure record", lambda: _native._cache._recorded_failure(d / "x.failed", {})),
                   ("lock file", lambda: _native._cache._file_lock(d / "x.so").__enter__())):
    try:
        call()
        out[what] = None
    except RuntimeError as e:
        out[what] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def test_other_cache_files_replaced_by_fifos_are_refused_without_hanging(tmp_path):
    for name in ("x.json", "x.failed", "x.lock"):
        os.mkfifo(tmp_path / name, 0o600)
    r = subprocess.run(
        [sys.executable, "-c", _ODD, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    for what, name in (
        ("manifest", "x.json"),
        ("failure record", "x.failed"),
        ("lock file", "x.lock"),
    ):
        assert out[what] == (
            f"RefusedPath: refused the native kernel {what} {tmp_path / name}: "
            f"{'a FIFO, ' if what != 'lock file' else ''}not a regular file; fix: remove it"
        ), out


# ---------------------------------------------------------------------------------------------
# item 5: a hanging compiler, a hanging --version: bounded, killed, said


@pytest.mark.slow
def test_hanging_compiler_is_killed_recorded_and_not_waited_for_again(tmp_path):
    pids = tmp_path / "pids"
    cc = _fake_cc(tmp_path, f'sleep 1000 & echo $! >> "{pids}"; wait')
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    out, said = _run(_STATE, cache, timeout=120, CC=str(cc), MEANFIELD_CC_TIMEOUT="1")
    assert time.monotonic() - t0 < 90
    assert not out["available"] and not out["phase"], out
    assert (
        "the compiler ran past 1 s" in out["reason"] and "MEANFIELD_CC_TIMEOUT" in out["reason"]
    ), out
    # one build waited for; the others of the process (the phase kernel's included) did not run it
    assert _calls(tmp_path) == 1
    assert "ran past 1 s" in out["phase_reason"], out
    assert len(said) == 2 and "ran past 1 s" in said[1] and "recorded in" in said[1], said
    for pid in pids.read_text().split():  # the compiler's own child was killed with it
        assert (
            not os.path.exists(f"/proc/{pid}")
            or "zombie" in open(f"/proc/{pid}/status").read().lower()
        )
    assert len(list(cache.glob("compiler-*.failed"))) == 1

    # the next process: the record, no wait, one line naming it and the fix
    out, said = _run(_STATE, cache, timeout=120, CC=str(cc), MEANFIELD_CC_TIMEOUT="1")
    assert _calls(tmp_path) == 1 and not out["available"], out
    assert len(said) == 1 and "ran past 1 s" in said[0] and "--rebuild-native" in said[0], said


@pytest.mark.slow
def test_hanging_version_probe_is_bounded_and_probed_once(tmp_path):
    cc = _fake_cc(tmp_path, "exit 1", version="sleep 1000")
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    out, said = _run(_STATE, cache, timeout=120, CC=str(cc), MEANFIELD_CC_VERSION_TIMEOUT="1")
    assert time.monotonic() - t0 < 90
    assert not out["available"] and not out["phase"], out
    assert out["reason"] == (
        f"the C compiler's version probe `{cc} --version` ran past 1 s "
        "(killed; MEANFIELD_CC_VERSION_TIMEOUT sets the limit)"
    ), out
    assert out["phase_reason"] == out["reason"], out
    assert _calls(tmp_path, suffix=".version") == 1  # once per process, not per kernel
    assert _calls(tmp_path) == 0 and len(said) == 1 and "version probe" in said[0], said


@pytest.mark.parametrize(
    "name,value",
    [
        ("MEANFIELD_CC_TIMEOUT", "soon"),
        ("MEANFIELD_CC_TIMEOUT", "-1"),
        ("MEANFIELD_CC_VERSION_TIMEOUT", "0"),
        ("MEANFIELD_CC_TIMEOUT", "inf"),
    ],
)
def test_bad_timeout_setting_is_named(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(
        RuntimeError, match=f"^{name} must be a number of seconds > 0, got '{value}'$"
    ):
        _native._cache._timeout(name, 1.0)


def test_lock_timeout(monkeypatch):
    """A build and its load check, and a margin; a bad MEANFIELD_CC_TIMEOUT does not stop an intact cache."""
    for name in ("MEANFIELD_CC_TIMEOUT", "MEANFIELD_CACHE_LOCK_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    assert _native._cache._lock_timeout() == 120.0 + 60.0 + 30.0
    monkeypatch.setenv("MEANFIELD_CC_TIMEOUT", "10")
    assert _native._cache._lock_timeout() == 100.0
    monkeypatch.setenv("MEANFIELD_CC_TIMEOUT", "soon")
    assert _native._cache._lock_timeout() == 210.0
    monkeypatch.setenv("MEANFIELD_CACHE_LOCK_TIMEOUT", "5")
    assert _native._cache._lock_timeout() == 5.0


def test_timeouts_default():
    assert _native._cache._timeout("MEANFIELD_TEST_UNSET_TIMEOUT", 120.0) == 120.0
    assert _native.CC_TIMEOUT == 120.0 and _native.VERSION_TIMEOUT == 10.0


# ---------------------------------------------------------------------------------------------
# item 5: a read-only cache directory with an intact cache is used; a parent writable by others


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache with both exp-kernel libraries built and validated: those this process built (or
    found) at import, with their manifests, copied (what these tests check is their use, not the
    build: the rebuilds above compile); built in a subprocess if this process has none intact."""
    _needs_compiler()
    cache = tmp_path_factory.mktemp("template") / "cache"
    cache.mkdir(mode=0o700)
    source = _exp_libraries(None)
    for lib in source:
        if _native._cache._damage(lib) is None:
            for path in (lib, lib.with_suffix(".json")):
                shutil.copy2(path, cache / path.name)
    if not all(_native._cache._damage(lib) is None for lib in _exp_libraries(cache)):
        out, said = _run(_EXP_ONLY, cache)
        assert out["available"], out
    return cache


def _without_dac_override():
    """In a child process of root, before ``exec``: drop the capabilities that let root write
    where the permission bits say no (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``) from the
    bounding set, so that a read-only directory is read-only for the program it runs."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # PR_CAPBSET_DROP = 24
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            os._exit(97)


@pytest.mark.slow
def test_read_only_cache_directory_with_intact_cache_is_used(built, tmp_path):
    """No lock file can be created there: the intact, validated libraries are loaded all the
    same (read only), with nothing on stderr; a missing one is an error naming the directory.
    (Root runs the process without the capability to write anywhere.)"""
    drop = None
    if os.geteuid() == 0:
        drop = _without_dac_override
        r = subprocess.run([sys.executable, "-c", "pass"], preexec_fn=drop, timeout=60)
        if r.returncode == 97:
            pytest.skip(
                "root cannot drop CAP_DAC_OVERRIDE here: a read-only directory is writable for it"
            )
    cache = tmp_path / "cache"
    shutil.copytree(built, cache, ignore=shutil.ignore_patterns("*.lock"))
    cache.chmod(0o500)
    try:
        out, said = _run(_EXP_ONLY, cache, timeout=120, preexec_fn=drop)
        assert out["available"], out
        assert said == [], said
        assert not list(cache.glob("*.lock"))
        # a library missing there: not compiled, one line naming the directory and the fix
        cache.chmod(0o700)
        _exp_libraries(cache)[1].unlink()
        cache.chmod(0o500)
        out, said = _run(_EXP_ONLY, cache, timeout=120, preexec_fn=drop)
        lib = _exp_libraries(cache)[1]
        assert not out["available"] and out["reason"] == (
            f"the cache directory {cache} is read-only and {lib.name} is missing there; fix: make it writable, "
            "or set MEANFIELD_CACHE_DIR to a writable private directory"
        ), out
        assert len(said) == 1 and "is read-only" in said[0], said
    finally:
        cache.chmod(0o700)


@pytest.mark.slow
def test_lock_held_by_another_process_is_waited_for_within_its_bound(built, tmp_path):
    """A process that holds a library's lock and never lets it go (a stuck process, another
    program): the import waits ``MEANFIELD_CACHE_LOCK_TIMEOUT`` seconds (1 here), then runs the XLA
    path with one line naming the lock file; once the lock is free the cache is used."""
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)
    lock = _exp_libraries(cache)[0].with_suffix(".lock")
    lock.touch(mode=0o600)  # as a process that loaded the library leaves it
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True); time.sleep(600)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        t0 = time.monotonic()
        out, said = _run(_EXP_ONLY, cache, timeout=120, MEANFIELD_CACHE_LOCK_TIMEOUT="1")
        assert 1 <= out["import_s"] and time.monotonic() - t0 < 90, out
        assert not out["available"] and out["reason"] == (
            f"the native kernel lock file {lock} was held by another process for more than 1 s "
            "(MEANFIELD_CACHE_LOCK_TIMEOUT sets the limit); fix: end that process, or set MEANFIELD_CACHE_DIR to "
            "another private directory"
        ), out
        assert len(said) == 1 and str(lock) in said[0], said
    finally:
        holder.kill()
        holder.wait()
    out, said = _run(_EXP_ONLY, cache, timeout=120, MEANFIELD_CACHE_LOCK_TIMEOUT="1")
    assert out["available"] and said == [], (out, said)
    out, _ = _run(_EXP_ONLY, cache, timeout=120, MEANFIELD_CACHE_LOCK_TIMEOUT="0")
    assert (
        out["reason"] == "MEANFIELD_CACHE_LOCK_TIMEOUT must be a number of seconds > 0, got '0'"
    ), out


def test_parent_writable_by_others_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cache = shared / "cache"
    code = _EXP_ONLY
    out, said = _run(code, cache, timeout=120)
    assert not out["available"] and out["reason"].startswith(
        f"refused the native kernel cache directory {cache}: its parent {shared} is writable by others without the "
        "sticky bit (mode 777)"
    ), out
    assert f"fix: chmod o-w {shared}" in out["reason"], out
    assert len(said) == 1 and f"its parent {shared}" in said[0], said
    assert not any(cache.glob("*.so"))


def test_sticky_parent_writable_by_others_is_accepted(tmp_path, monkeypatch):
    """Like ``/tmp`` (mode 1777): nobody but the owner can rename what is in it."""
    shared = tmp_path / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("MEANFIELD_CACHE_DIR", str(shared / "cache"))
    assert _native._cache._private_dir(create=True) == shared / "cache"
    assert stat.S_IMODE((shared / "cache").stat().st_mode) == 0o700
