"""The build cache of the native kernels: each C source compiled once per machine and dtype,
validated, and loaded only from a private directory.

Each source is compiled once per machine and dtype (float64; float32 with ``-DMF_FLOAT32``)
with the system C compiler (``$CC``, else ``cc``/``gcc``/``clang``):
``-O3 -march=native -ffast-math -fopenmp`` (vectorised exponentials from glibc's libmvec;
no OpenMP: one thread), then linked without ``-ffast-math`` (GCC's ``crtfastmath.o`` would set
flush-to-zero for the whole process when the library loads), into a cache directory
(``$MEANFIELD_CACHE_DIR``, else ``$XDG_CACHE_HOME/meanfield`` or ``~/.cache/meanfield``) under a
name hashing the source, the flags, the compiler's version, the CPU and ``BUILD_RECIPE``.
Without a compiler, or with ``MEANFIELD_NATIVE=0`` (read when a library loads), a kernel is
unavailable with its reason (``meanfield._native.exp_library()``, ``phase_library()``) and the
XLA formulation runs.

The cache is code this process runs, so (``tests/test_native_cache.py``):

- a library is written atomically (compiled into a temporary file in the cache directory, then
  renamed) with a manifest beside it (``NAME.json``: its size and sha256, written the same way),
  under a per-library lock (``flock``), so that concurrent first imports compile once;
- what the compiler wrote is validated before it gets a manifest: its ELF headers (magic, class,
  byte order and machine of this interpreter, a shared object, every loadable segment and the
  section headers inside the file), then a ``ctypes.CDLL`` of it in a child process (at most
  ``LOAD_CHECK_TIMEOUT`` = 60 s); a compiler that exits 0 after writing a truncated or unloadable
  library is a recorded failure, never a cached library;
- before every ``ctypes.CDLL`` the library is checked against its manifest and its ELF headers: a
  truncated or overwritten library, or a missing manifest, is rebuilt once (one line on stderr
  saying so), never loaded (a truncated library crashes the process inside ``dlopen``), so
  ``meanfield info --rebuild-native`` works whatever the cache holds;
- only the cache directory (symbolic links resolved, created with mode 0700) and files in it
  that are owned by this user and not writable by group or others are used, in a directory
  whose parents are not writable by others (unless sticky, as ``/tmp``); otherwise the kernel
  is refused (``RefusedPath``: the path and the fix, ``chmod go-w PATH`` or remove it) and the
  XLA path runs; a symbolic link, a FIFO, a directory or a device in place of a library,
  manifest, lock or failure record is refused (naming its path), never followed or opened so
  as to block;
- a read-only cache directory holding an intact cache is used as it is (read only, no lock: no
  process can write there); a library missing from it is an error naming the directory;
- a failed build is recorded (``NAME.failed``: the compiler's path and ``--version``, the flags,
  the source's sha256 and the error) and retried when any of these changes, and by
  ``meanfield info --rebuild-native``; a compiler that crashes (``SIGSEGV``, ``SIGBUS``,
  ``SIGILL``, ``SIGFPE``, ``SIGABRT``) is recorded like any failure, a killed compiler
  (``SIGKILL``, ``SIGTERM``) or a full disk is not (the next import tries again);
- no wait on the compiler outlives its time limit: a build (compile and link of one library)
  gets ``$MEANFIELD_CC_TIMEOUT`` seconds (default ``CC_TIMEOUT`` = 120), then the compiler and
  every process it started are killed, and the timeout is recorded for the compiler's identity
  (``compiler-HASH.failed``): no later build waits for it again until the compiler changes or
  ``meanfield info --rebuild-native`` (which waits once); ``cc --version`` gets
  ``$MEANFIELD_CC_VERSION_TIMEOUT`` seconds (default ``VERSION_TIMEOUT`` = 10), probed once per
  compiler and process (a timeout leaves the XLA path for the process, with its line); the lock
  of a cached library is waited for at most ``$MEANFIELD_CACHE_LOCK_TIMEOUT`` seconds (default:
  the build's limit + ``LOAD_CHECK_TIMEOUT`` + ``LOCK_MARGIN`` = 210 s: what another process's
  build may hold it), then the XLA path runs, with its line naming the lock file;
- when a kernel is unavailable for any reason but ``MEANFIELD_NATIVE=0``, one line on stderr,
  once per process, says why and that the XLA path runs; ``MEANFIELD_NATIVE_QUIET=1`` silences
  it (``meanfield info`` always shows the reason).

Threads (``threads_now``, ``default_threads``): no library call sets an environment variable
(``OMP_*`` included).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._paths import cache_root, open_parent, ownership_problem

try:
    import fcntl
except ImportError:  # not POSIX: no lock between processes (the builds stay atomic)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "BUILD_RECIPE",
    "BuildFailed",
    "CC_TIMEOUT",
    "Crossover",
    "FLAGS",
    "LOAD_CHECK_TIMEOUT",
    "LOCK_MARGIN",
    "LONG_CALL",
    "Library",
    "RefusedPath",
    "VERSION_TIMEOUT",
    "default_threads",
    "threads_now",
]

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

#: compiler flags, tried in order (the second without OpenMP: one thread)
FLAGS = (
    ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared"],
    ["-O3", "-march=native", "-ffast-math", "-fPIC", "-shared"],
)

#: how a library is built and cached (part of its cache name): compile, then link without
#: -ffast-math; a manifest (size, sha256) beside each library
BUILD_RECIPE = (
    "compile -c, link -shared without -ffast-math; validated (ELF, child load); manifest v2"
)

_lock = threading.RLock()
#: whether this process printed its line about the native path being unavailable
_warned: list[str] = []


class RefusedPath(RuntimeError):
    """A cache directory or library that is not private to this user: never loaded (its message
    names the path and the fix)."""


class BuildFailed(RuntimeError):
    """The C compiler failed for every flag set: the message has each error; ``summary`` is one
    line (the compiler, the first error, whether the failure is recorded)."""

    def __init__(self, message: str, summary: str):
        super().__init__(message)
        self.summary = summary


def _cache_dir() -> Path:
    return cache_root()  # meanfield._paths: shared with meanfield.compilation_cache (jax-free)


def _check_private(path: Path, st: os.stat_result, what: str) -> None:
    """``RefusedPath`` unless ``st`` (of ``path``) is owned by this user and not writable by group
    or others (``meanfield._paths.ownership_problem``, the compilation cache's rule too): anyone
    who can write there could make this process run their code."""
    problem = ownership_problem(path, st)
    if problem is not None:
        hint = (
            ", or set MEANFIELD_CACHE_DIR to a private directory"
            if what == "cache directory"
            else ""
        )
        raise RefusedPath(
            f"refused the native kernel {what} {path}: {problem[0]}; fix: {problem[1]}{hint}"
        )


def _private_dir(create: bool) -> Path:
    """The cache directory, symbolic links resolved (what is checked is what is loaded from):
    created with mode 0700 if missing and ``create``; ``RefusedPath`` unless it is a directory
    owned by this user and not writable by group or others; RuntimeError if it is missing."""
    path = Path(os.path.realpath(_cache_dir()))
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            raise RuntimeError(
                f"cannot create the native kernel cache directory {path}: {e.strerror} "
                "(set MEANFIELD_CACHE_DIR to a writable private directory)"
            ) from None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RuntimeError(
            f"not built (no cache directory {path}; meanfield.kernels builds the kernels "
            "at import, `meanfield info --rebuild-native` too)"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise RefusedPath(
            f"refused the native kernel cache directory {path}: not a directory; "
            "fix: remove it, or set MEANFIELD_CACHE_DIR to a private directory"
        )
    _check_private(path, st, "cache directory")
    _check_parents(path)
    return path


def _check_parents(path: Path) -> None:
    """``RefusedPath`` when a directory above ``path`` is writable by others without the sticky
    bit (``meanfield._paths.open_parent``; ``/tmp``'s mode 1777 is fine): whoever can write there
    can rename the cache directory and put their own in its place."""
    found = open_parent(path)
    if found is not None:
        parent, mode = found
        raise RefusedPath(
            f"refused the native kernel cache directory {path}: its parent {parent} is writable "
            f"by others without the sticky bit (mode {mode:o}), so anyone "
            f"can replace the cache; fix: chmod o-w {parent} (or chmod +t {parent}), "
            "or set MEANFIELD_CACHE_DIR to a private directory"
        )


def _compiler() -> str | None:
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"].split()[0])
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


@functools.cache
def _cpu_tag() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [
            ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))
        ]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _disabled() -> bool:
    return os.environ.get("MEANFIELD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def _quiet() -> bool:
    return os.environ.get("MEANFIELD_NATIVE_QUIET", "0").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
        "off",
    )


def _warn_unavailable(reason: str) -> None:
    """One line on stderr, once per process, when a native kernel is unavailable and the XLA path
    runs instead: why. Not when the user switched the kernels off (``MEANFIELD_NATIVE=0``) or
    silenced the line (``MEANFIELD_NATIVE_QUIET=1``); ``meanfield info`` always says why."""
    if _warned or _disabled() or _quiet():
        return
    _warned.append(reason)
    text = " ".join(reason.split())
    text = text if len(text) <= 500 else text[:497] + "..."
    print(
        f"meanfield: native CPU kernels unavailable, the XLA path runs instead: {text} "
        "(`meanfield info` for details; MEANFIELD_NATIVE_QUIET=1 silences this line)",
        file=sys.stderr,
        flush=True,
    )


#: default seconds one build (compile and link of one library) may take: ``$MEANFIELD_CC_TIMEOUT``
CC_TIMEOUT = 120.0
#: default seconds ``cc --version`` may take: ``$MEANFIELD_CC_VERSION_TIMEOUT``
VERSION_TIMEOUT = 10.0
#: seconds the child process that loads a freshly built library may take
LOAD_CHECK_TIMEOUT = 60.0
#: seconds beyond a build and its load check that a process waits for another one's lock of a
#: cached library (``$MEANFIELD_CACHE_LOCK_TIMEOUT`` replaces the whole wait)
LOCK_MARGIN = 30.0


def _timeout(name: str, default: float) -> float:
    """Seconds from the environment variable ``name`` (``default`` when unset); RuntimeError
    naming the value when it is not a number > 0."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise RuntimeError(f"{name} must be a number of seconds > 0, got {raw!r}")
    return value


class _Timeout(Exception):
    """A child process ran past its time and was killed with every process it started."""

    def __init__(self, seconds: float):
        super().__init__(f"ran past {seconds:g} s")
        self.seconds = seconds


def _run_bounded(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(args)`` (output captured as text) in a session of its own, killed with
    every process it started after ``timeout`` seconds (``_Timeout``): a grandchild that keeps
    the pipes open (a compiler's ``cc1``, a ``sleep``) cannot make the wait outlive the timeout."""
    group = hasattr(os, "killpg")
    p = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )

    def kill() -> None:  # the child and every process it started (its session's process group)
        with contextlib.suppress(OSError):
            if group:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.communicate(timeout=5)  # the pipes close once the whole group is gone
        p.kill()
        p.wait()

    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill()
        raise _Timeout(timeout) from None
    except (
        BaseException
    ):  # KeyboardInterrupt: the compiler has its own session, so it is ended here
        kill()
        raise
    return subprocess.CompletedProcess(args, p.returncode, out, err)


#: ``cc --version`` by compiler, or the RuntimeError of its probe: one probe per compiler and process
_versions: dict[str, str | RuntimeError] = {}


def _compiler_version(cc: str) -> str:
    """``cc --version`` (part of every cache name): probed once per compiler and process, within
    ``$MEANFIELD_CC_VERSION_TIMEOUT`` seconds (default ``VERSION_TIMEOUT``); RuntimeError (kept for
    the process: no second wait) when it runs past that or cannot run."""
    with _lock:
        if cc not in _versions:
            try:
                limit = _timeout("MEANFIELD_CC_VERSION_TIMEOUT", VERSION_TIMEOUT)
                _versions[cc] = _run_bounded([cc, "--version"], limit).stdout
            except _Timeout as e:
                _versions[cc] = RuntimeError(
                    f"the C compiler's version probe `{cc} --version` ran past {e.seconds:g} s "
                    "(killed; MEANFIELD_CC_VERSION_TIMEOUT sets the limit)"
                )
            except OSError as e:
                _versions[cc] = RuntimeError(f"cannot run the C compiler {cc}: {e.strerror or e}")
            except RuntimeError as e:
                _versions[cc] = e
        found = _versions[cc]
    if isinstance(found, RuntimeError):
        raise RuntimeError(str(found))
    return found


def _toolchain() -> tuple[str, str]:
    """``(compiler, its --version text)``; RuntimeError when disabled or missing."""
    if _disabled():
        raise RuntimeError("disabled by MEANFIELD_NATIVE=0")
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install cc/gcc/clang)")
    return cc, _compiler_version(cc)


def _source_digest(source_path: Path, include: tuple[str, ...] | list[str]) -> bytes:
    """The bytes a build depends on besides the flags: the source and the FFI headers it includes."""
    headers = b"".join(sorted(p.read_bytes() for d in include for p in Path(d).rglob("c_api.h")))
    return hashlib.sha256(source_path.read_bytes() + b"\0" + headers).digest()


def _library_paths(
    cc: str,
    version: str,
    source_path: Path,
    defines: list[str],
    include: tuple[str, ...] | list[str] = (),
) -> list[tuple[list[str], Path]]:
    """``(flags, cached library)`` of each flag set of ``FLAGS``, in the order they are tried.

    The cache name hashes the source, the headers it includes from ``include`` (their bytes),
    the flags, the compiler's version, the CPU and the build recipe."""
    source = source_path.read_bytes()
    headers = b"".join(sorted(p.read_bytes() for d in include for p in Path(d).rglob("c_api.h")))
    out = []
    for flags in FLAGS:
        flags = [*flags, *defines, *(f"-I{d}" for d in include)]
        tag = hashlib.sha256(
            b"\0".join(
                [
                    source,
                    headers,
                    " ".join(flags).encode(),
                    version.encode(),
                    _cpu_tag().encode(),
                    BUILD_RECIPE.encode(),
                ]
            )
        ).hexdigest()[:16]
        out.append((flags, Path(os.path.realpath(_cache_dir())) / f"{source_path.stem}-{tag}.so"))
    return out


def _manifest(target: Path) -> Path:
    """The sidecar of a cached library: its size and sha256, written with it."""
    return target.with_suffix(".json")


_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


def _lock_timeout() -> float:
    """Seconds a process waits for the lock of a cached library: ``$MEANFIELD_CACHE_LOCK_TIMEOUT``,
    else what a build by another process may hold it (``$MEANFIELD_CC_TIMEOUT`` for the build,
    ``LOAD_CHECK_TIMEOUT`` for its load check) and ``LOCK_MARGIN`` more."""
    if os.environ.get("MEANFIELD_CACHE_LOCK_TIMEOUT", "").strip():
        return _timeout("MEANFIELD_CACHE_LOCK_TIMEOUT", CC_TIMEOUT)
    try:
        build = _timeout("MEANFIELD_CC_TIMEOUT", CC_TIMEOUT)
    except RuntimeError:  # named where a build needs it, not in the way of an intact cache
        build = CC_TIMEOUT
    return build + LOAD_CHECK_TIMEOUT + LOCK_MARGIN


def _flock_bounded(fd: int, lock: Path) -> None:
    """``flock(fd, LOCK_EX)`` within ``_lock_timeout()`` seconds (polled every 50 ms): a lock held
    by a process that never lets it go (a stuck process, another program) is a RuntimeError
    naming the lock file, never an import that blocks for ever."""
    limit = _lock_timeout()
    deadline = time.monotonic() + limit
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"the native kernel lock file {lock} was held by another process for more than "
                    f"{limit:g} s (MEANFIELD_CACHE_LOCK_TIMEOUT sets the limit); fix: end that "
                    "process, or set MEANFIELD_CACHE_DIR to another private directory"
                ) from None
            time.sleep(0.05)


@contextlib.contextmanager
def _file_lock(target: Path) -> Iterator[bool]:
    """An exclusive lock (``flock``) of one cached library across processes: a library is checked,
    built and loaded by one process at a time, so that no process reads a half-written pair of
    library and manifest, and concurrent first imports compile once. Yields whether the cache
    directory can be written: in a read-only one (no lock file can be created there, so no
    other process can write it either) the library is only read, without a lock.
    ``RefusedPath`` for a lock file that is not a regular file (never opened so as to block)."""
    lock = target.with_suffix(".lock")
    flags = os.O_CLOEXEC | _O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | flags, 0o600)
    except OSError as e:
        if os.path.islink(lock):
            raise RefusedPath(
                f"refused the native kernel lock file {lock}: a symbolic link; fix: remove it"
            ) from None
        if e.errno not in _READ_ONLY:
            raise RuntimeError(
                f"cannot open the native kernel lock file {lock}: {e.strerror}"
            ) from None
        yield False  # a read-only cache directory: read only
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RefusedPath(
                f"refused the native kernel lock file {lock}: not a regular file; fix: remove it"
            )
        if fcntl is not None:
            _flock_bounded(fd, lock)
        yield os.access(target.parent, os.W_OK)
    finally:
        os.close(fd)  # releases the lock


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _read_private(path: Path, what: str) -> bytes | None:
    """The bytes of a regular file owned by this user and not writable by group or others
    (``RefusedPath`` otherwise, naming the path: a symbolic link is refused, not followed, and a
    FIFO, a directory or a device is refused without being opened so as to block); ``None`` if
    missing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RuntimeError(f"cannot read the native kernel {what} {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise RefusedPath(
            f"refused the native kernel {what} {path}: {_kind(st.st_mode)}, not a regular file; "
            f"fix: remove it"
        )
    try:  # O_NONBLOCK: a FIFO put there after the lstat does not block the open
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | _O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        if os.path.islink(path):
            raise RefusedPath(
                f"refused the native kernel {what} {path}: a symbolic link; fix: remove it"
            ) from None
        raise RuntimeError(f"cannot read the native kernel {what} {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedPath(
                f"refused the native kernel {what} {path}: {_kind(st.st_mode)}, not a regular file; "
                f"fix: remove it"
            )
        _check_private(path, st, what)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise RuntimeError(f"cannot read the native kernel {what} {path}: {e.strerror}") from None
    finally:
        os.close(fd)


def _json(raw: bytes | str) -> Any:
    """``json.loads(raw)``; ``ValueError`` for any document it cannot take, one nested past the
    interpreter's recursion limit included (a hostile record nested 100000 levels would raise
    ``RecursionError`` from ``json``): a cache record is data, never a crash."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None


@functools.cache
def _host_elf() -> tuple[int, int, int] | None:
    """``(class, byte order, machine)`` of this interpreter's ELF executable: what a library
    loaded into this process must have; ``None`` where the executable is not ELF (macOS,
    Windows: no structural check there, the load in a child process still runs)."""
    try:
        with open(os.path.realpath(sys.executable), "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    order = "<" if head[5] == 1 else ">"
    return head[4], head[5], struct.unpack(order + "H", head[18:20])[0]


def _elf_problem(data: bytes) -> str | None:
    """Why ``data`` is not a whole shared library for this machine (``None`` when it is): the
    ELF magic, class, byte order, type (shared object) and machine of this interpreter, and
    every loadable segment, the program headers and the section headers inside the file (a
    truncated library maps pages past its end: the process dies by SIGBUS inside ``dlopen``)."""
    host = _host_elf()
    if host is None:
        return None
    if len(data) < 52 or data[:4] != b"\x7fELF":
        return f"not an ELF file ({len(data)} bytes)"
    cls, order_byte, machine = host
    if (data[4], data[5]) != (cls, order_byte):
        return f"ELF class {data[4]} byte order {data[5]}, this process has class {cls} byte order {order_byte}"
    o = "<" if order_byte == 1 else ">"
    wide = cls == 2
    if wide and len(data) < 64:
        return f"truncated ELF header ({len(data)} bytes)"
    e_type, e_machine = struct.unpack_from(o + "HH", data, 16)
    if e_type != 3:
        return f"ELF type {e_type}, not a shared object (3)"
    if e_machine != machine:
        return f"ELF machine {e_machine}, this process runs on machine {machine}"
    if wide:
        phoff, shoff = struct.unpack_from(o + "QQ", data, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(o + "HHHH", data, 54)
    else:
        phoff, shoff = struct.unpack_from(o + "II", data, 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(o + "HHHH", data, 42)
    size = len(data)
    if phentsize < (56 if wide else 32):
        return f"program header entries of {phentsize} bytes"
    if phnum == 0 or phoff + phnum * phentsize > size:
        return f"truncated: program headers end at byte {phoff + phnum * phentsize}, the file has {size}"
    if shnum and shoff + shnum * shentsize > size:
        return f"truncated: section headers end at byte {shoff + shnum * shentsize}, the file has {size}"
    for i in range(phnum):
        at = phoff + i * phentsize
        if wide:
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(o + "IIQQQQ", data, at)
        else:
            p_type, p_offset, _, _, p_filesz = struct.unpack_from(o + "IIIII", data, at)
        if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD
            return f"truncated: a loadable segment ends at byte {p_offset + p_filesz}, the file has {size}"
    return None


def _damage(target: Path) -> str | None:
    """Why the cached library ``target`` must not be loaded (``"missing"``, or how it differs
    from its manifest), or ``None`` when it is intact: the size and sha256 recorded when it was
    built. ``RefusedPath`` for a library or manifest that is not private to this user.
    Checked before every ``ctypes.CDLL``: a truncated library would crash the process there."""
    data = _read_private(target, "library")
    if data is None:
        return "missing"
    raw = _read_private(_manifest(target), "manifest")
    if raw is None:
        return f"no manifest {_manifest(target).name}"
    try:
        record = _json(raw)
        size, digest = int(record["size"]), str(record["sha256"])
    except (ValueError, KeyError, TypeError):
        return f"unreadable manifest {_manifest(target).name}"
    if len(data) != size:
        return f"{len(data)} bytes, {size} recorded"
    if hashlib.sha256(data).hexdigest() != digest:
        return "sha256 differs from the one recorded"
    problem = _elf_problem(data)
    if problem is not None:
        return f"not a valid shared library: {problem}"
    return None


def _load_library(target: Path) -> ctypes.CDLL:
    """``ctypes.CDLL`` of a cached library, after checking (under its lock) that it and the cache
    directory are private to this user and that it matches its manifest."""
    with _file_lock(target):
        damage = _damage(target)  # the manifest is written only after a child process loaded it
        if damage is not None:
            raise RuntimeError(
                f"the cached library {target} is {'missing' if damage == 'missing' else 'damaged'}"
                f"{'' if damage == 'missing' else f' ({damage})'}; it is rebuilt at the next "
                "import of meanfield.kernels, or run `meanfield info --rebuild-native`"
            )
        return ctypes.CDLL(str(target))


def _identity(cc: str, version: str, flags: list[str], digest: bytes) -> dict[str, Any]:
    """What a failed build is recorded with: the compiler (path and ``--version``), the flags and
    the source's hash. A recorded failure whose identity differs from the current one is retried."""
    return {"compiler": cc, "version": version, "flags": flags, "source_sha256": digest.hex()}


#: compiler messages of a failure that says nothing about the source or the flags (a killed
#: compiler, a full disk, no memory): never recorded, the next import tries again
_TRANSIENT = re.compile(
    r"signal terminated program|unable to execute command|\bkilled\b|no space left on device|"
    r"cannot allocate memory|out of memory|resource temporarily unavailable",
    re.IGNORECASE,
)


#: signals of a compiler that crashed (recorded like any failure), unlike one that was killed
#: (SIGKILL by the out-of-memory killer, SIGTERM, SIGINT: not recorded)
_CRASHES = frozenset(
    int(getattr(signal, name))
    for name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")
    if hasattr(signal, name)
)


def _recorded_failure(marker: Path, identity: dict[str, Any]) -> str | None:
    """The error of a failed build recorded in ``marker`` for this ``identity``; ``None`` when there
    is none. A record of another compiler identity (or an unreadable one) is removed: that build
    is tried again."""
    try:
        data = _read_private(marker, "failure record")
    except RefusedPath:
        raise
    except RuntimeError:
        data = b""
    if data is None:
        return None
    try:
        record = _json(data)
        same = isinstance(record, dict) and record.get("identity") == identity
    except ValueError:
        same = False
    if not same:
        with contextlib.suppress(OSError):  # a read-only cache directory: ignored all the same
            marker.unlink(missing_ok=True)
        return None
    return str(record.get("error", ""))


def _build_one(
    cc: str,
    version: str,
    source_path: Path,
    defines: list[str],
    include: tuple[str, ...] | list[str] = (),
    *,
    force: bool = False,
    announce: Callable[[str | None], None] | None = None,
    may_compile: bool = True,
) -> Path:
    """The cached library of one build of a source, compiled (``_compile``) with the first flag
    set that works if it is not in the cache (or is damaged: then rebuilt, with one line on
    stderr). A flag set the compiler rejected is recorded (``.failed``, with the compiler
    identity) and not tried again by this compiler; ``force`` removes the libraries and records
    first. ``may_compile=False`` only looks in the cache. ``announce(message=None)`` is called
    before compiling. ``RefusedPath`` for a cache directory or library not private to this user.

    A compiler that runs past ``$MEANFIELD_CC_TIMEOUT`` seconds (``CC_TIMEOUT``) is killed and
    recorded for its identity (``compiler-HASH.failed``): no other build of this process or of
    later ones waits for it again, until the compiler changes or ``force`` (which waits once).
    In a read-only cache directory an intact library is used as it is (no lock: nobody can
    write there); a missing or damaged one is an error naming the directory."""
    _private_dir(create=may_compile)
    paths = _library_paths(cc, version, source_path, defines, include)
    digest = _source_digest(source_path, include)
    if force:
        for _, target in paths:
            with _file_lock(target) as writable:
                for stale in (
                    target,
                    _manifest(target),
                    target.with_suffix(".failed"),
                    target.with_suffix(".crossover.json"),
                ):
                    try:
                        stale.unlink(missing_ok=True)
                    except OSError as e:
                        raise RuntimeError(
                            f"cannot remove {stale} to rebuild it: {e.strerror}"
                            f"{'' if writable else ' (a read-only cache directory)'}; fix: make "
                            f"{target.parent} writable, or set MEANFIELD_CACHE_DIR to another "
                            "private directory"
                        ) from None
    errors: list[str] = []
    recorded_any = False
    head = f"the C compiler failed ({cc}, {version.strip().splitlines()[0] if version.strip() else 'no --version'})"
    for flags, target in paths:
        identity = _identity(cc, version, flags, digest)
        marker = target.with_suffix(".failed")
        with _file_lock(target) as writable:
            recorded = _recorded_failure(marker, identity)
            if recorded is not None:
                errors.append(f"{' '.join(flags)}: {recorded[-500:]} (recorded in {marker})")
                recorded_any = True
                continue
            damage = _damage(target)
            if damage is None:
                return target
            if not may_compile:
                raise RuntimeError(
                    f"not built ({target.name} is {damage} in {target.parent}; meanfield.kernels "
                    "builds it at import, `meanfield info --rebuild-native` too)"
                    if damage == "missing"
                    else f"the cached library {target} is damaged ({damage}); it is rebuilt at "
                    "the next import of meanfield.kernels, or run `meanfield info --rebuild-native`"
                )
            if not writable:
                raise RuntimeError(
                    f"the cache directory {target.parent} is read-only and {target.name} is "
                    f"{damage} there; fix: make it writable, or set MEANFIELD_CACHE_DIR to a "
                    "writable private directory"
                )
            _raise_if_timed_out(cc, version, target.parent, head, force)
            if announce is not None:
                announce(
                    None
                    if damage == "missing"
                    else f"meanfield: the cached native library {target} is damaged ({damage}); rebuilding it"
                )
            error, kind = _compile(cc, flags, source_path, target)
            if error is None:
                with contextlib.suppress(OSError):
                    _compiler_record(cc, version, target.parent).unlink(missing_ok=True)
                return target
            if kind == "timeout":
                _record_timeout(cc, version, target.parent, error)
                _raise_if_timed_out(cc, version, target.parent, head, False)
            errors.append(f"{' '.join(flags)}: {error[-500:]}")
            if kind == "recorded":
                _write_atomic(marker, json.dumps({"identity": identity, "error": error}).encode())
                recorded_any = True
    tail = (
        "recorded with the compiler's identity: retried when it changes, or run `meanfield info --rebuild-native`"
        if recorded_any
        else "not recorded (a killed compiler or a full disk): the next import retries"
    )
    first = next(
        (ln.strip() for e in errors for ln in e.split(": ", 1)[-1].splitlines() if ln.strip()), ""
    )
    first = first if len(first) <= 160 else first[:157] + "..."
    raise BuildFailed(f"{head}; {tail}: " + " | ".join(errors), f"{head}: {first}; {tail}")


#: compilers that ran past their timeout in this process: ``{(compiler, version): error}``
_timed_out: dict[tuple[str, str], str] = {}


def _compiler_record(cc: str, version: str, directory: Path) -> Path:
    """Where a compiler that ran past its timeout is recorded (one file per compiler identity)."""
    tag = hashlib.sha256(cc.encode() + b"\0" + version.encode()).hexdigest()[:16]
    return directory / f"compiler-{tag}.failed"


def _record_timeout(cc: str, version: str, directory: Path, error: str) -> None:
    with _lock:
        _timed_out[(cc, version)] = error
    with contextlib.suppress(OSError):
        _write_atomic(
            _compiler_record(cc, version, directory),
            json.dumps({"identity": {"compiler": cc, "version": version}, "error": error}).encode(),
        )


def _raise_if_timed_out(cc: str, version: str, directory: Path, head: str, force: bool) -> None:
    """``BuildFailed`` without running the compiler when it ran past its timeout in this process,
    or (unless ``force``) in an earlier one (its record in the cache directory)."""
    error = _timed_out.get((cc, version))
    marker = _compiler_record(cc, version, directory)
    if error is None and not force:
        error = _recorded_failure(marker, {"compiler": cc, "version": version})
    if error is None:
        return
    tail = (
        f"recorded in {marker} with the compiler's identity: not run again until it changes, or run "
        "`meanfield info --rebuild-native`"
    )
    raise BuildFailed(f"{head}: {error}; {tail}", f"{head}: {error}; {tail}")


def _write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``path`` holds ``data`` or what it held before, never a part: a temporary file in the same
    directory, flushed, then renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile(cc: str, flags: list[str], source_path: Path, target: Path) -> tuple[str | None, str]:
    """Run the C compiler: ``source_path`` with ``flags`` into ``target``, atomically (a temporary
    file in the cache directory renamed, then its manifest, written the same way: size and
    sha256), after validating what it wrote (``_validate``: a compiler that exits 0 after
    writing a truncated library must not get a manifest). Returns ``(None, "")``, or the error
    and its kind: ``"recorded"`` (the source, the flags or the compiler's output),
    ``"transient"`` (a killed compiler, a full disk: not recorded) or ``"timeout"``."""
    limit = _timeout("MEANFIELD_CC_TIMEOUT", CC_TIMEOUT)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".so", dir=target.parent)
    except OSError as e:
        raise RuntimeError(
            f"cannot write to the native kernel cache directory {target.parent}: {e.strerror}; "
            "fix: make it writable, or set MEANFIELD_CACHE_DIR to a writable private directory"
        ) from None
    os.close(fd)
    try:
        try:
            r = _compile_and_link(cc, flags, source_path, tmp, limit)
        except _Timeout:
            return (
                f"the compiler ran past {limit:g} s (killed with the processes it started; "
                "MEANFIELD_CC_TIMEOUT sets the limit)"
            ), "timeout"
        except OSError as e:
            return f"cannot run the compiler: {e}", "recorded"
        if (
            r.returncode < 0 and -r.returncode in _CRASHES
        ):  # the compiler itself crashed: as deterministic
            name = signal.Signals(-r.returncode).name  # as an internal compiler error, so recorded
            return (
                f"the compiler crashed ({name}){': ' + r.stderr.strip() if r.stderr.strip() else ''}",
                "recorded",
            )
        if r.returncode != 0:
            error = r.stderr.strip() or f"exit status {r.returncode}"
            return error, "transient" if r.returncode < 0 or _TRANSIENT.search(
                error
            ) else "recorded"
        with open(tmp, "rb") as f:
            data = f.read()
        problem = _validate(tmp, data)
        if problem is not None:
            return f"the compiler exited 0 but wrote no usable library: {problem}", "recorded"
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)
        _write_atomic(
            _manifest(target),
            json.dumps(
                {
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "compiler": cc,
                    "flags": flags,
                    "validated": "ELF headers, loaded in a child process",
                }
            ).encode(),
        )
        return None, ""
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _validate(path: str, data: bytes) -> str | None:
    """Why the freshly built library ``path`` (holding ``data``) must not be recorded, or ``None``:
    its ELF headers (``_elf_problem``), then a ``ctypes.CDLL`` of it in a child process (within
    ``LOAD_CHECK_TIMEOUT`` seconds): a library that crashes or fails when loaded does so there,
    never in this process."""
    problem = _elf_problem(data)
    if problem is not None:
        return problem
    if not sys.executable:
        return None
    try:
        r = _run_bounded(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                "import ctypes, sys; ctypes.CDLL(sys.argv[1])",
                path,
            ],
            LOAD_CHECK_TIMEOUT,
        )
    except _Timeout as e:
        return f"loading it in a child process ran past {e.seconds:g} s"
    except OSError as e:
        return f"cannot start a child process to load it: {e.strerror or e}"
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f"signal {-r.returncode}"
        return f"loading it in a child process killed that process ({name})"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return f"loading it in a child process failed: {last}"
    return None


def _compile_and_link(
    cc: str, flags: list[str], source_path: Path, out: str, limit: float
) -> subprocess.CompletedProcess:
    """Compile with ``flags``, then link as a shared library WITHOUT ``-ffast-math``: linked
    with it, GCC adds ``crtfastmath.o``, whose constructor sets flush-to-zero for the whole
    process when the library is loaded (every subnormal in NumPy/JAX would become 0). Both
    steps together within ``limit`` seconds (``_Timeout`` after)."""
    obj = out + ".o"
    compile_flags = [f for f in flags if f != "-shared"]
    link_flags = ["-shared", *(f for f in flags if f in ("-fopenmp", "-fPIC"))]
    deadline = time.monotonic() + limit
    try:
        r = _run_bounded([cc, *compile_flags, "-c", "-o", obj, str(source_path)], limit)
        if r.returncode == 0:
            r = _run_bounded(
                [cc, *link_flags, "-o", out, obj, "-lm"], max(0.001, deadline - time.monotonic())
            )
        return r
    finally:
        if os.path.exists(obj):
            os.unlink(obj)


def _build_all(what: str, source_path: Path, include: list[str], force: bool) -> dict[str, Path]:
    """Every dtype of ``_BUILDS`` of one source; one line on stderr when the compiler runs (the
    reason for a rebuild, or that it builds)."""
    cc, version = _toolchain()
    said: list[bool] = []

    def announce(message: str | None = None) -> None:
        if not said:
            said.append(True)
            print(
                message
                or f"meanfield: building the native {what} (once, cached in {_cache_dir()}) ...",
                file=sys.stderr,
                flush=True,
            )

    return {
        name: _build_one(cc, version, source_path, defines, include, force=force, announce=announce)
        for name, defines, _, _ in _BUILDS
    }


def _reason(e: Exception) -> str:
    return str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"


def _summary(e: Exception) -> str:
    """``_reason(e)`` in one line (a build failure: its summary)."""
    return e.summary if isinstance(e, BuildFailed) else _reason(e)


#: the builds of each source: (dtype, -D flags, suffix of the entry points, C type of the reals)
_BUILDS: tuple[tuple[str, list[str], str, Any], ...] = (
    ("float64", [], "_f64", ctypes.c_double),
    ("float32", ["-DMF_FLOAT32"], "_f32", ctypes.c_float),
)


#: the last sample of the load (``threads_now``): wall time, busy and own CPU seconds, CPUs, estimate
_load: dict = {"wall": None, "busy": 0.0, "own": 0.0, "cpus": 0, "idle": None}


def _busy_seconds() -> tuple[float, int] | None:
    """Non-idle seconds since boot of the CPUs this process may run on (``/proc/stat``), and how
    many CPUs; ``None`` where unknown."""
    try:
        cpus = os.sched_getaffinity(0)
        hz = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            lines = [ln.split() for ln in f if ln.startswith("cpu") and ln[3:4].isdigit()]
    except (OSError, AttributeError, ValueError):
        return None
    busy, seen = 0, 0
    for fields in lines:
        if int(fields[0][3:]) in cpus:
            v = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
            busy += sum(v) - v[3] - v[4]
            seen += 1
    return (busy / hz, len(cpus)) if seen == len(cpus) and hz > 0 else None


def threads_now(most: int) -> int:
    """At most ``most`` threads, no more than the CPUs of this process that other processes left
    idle (at least 1): the non-idle time of those CPUs (``/proc/stat``) minus this process's own
    CPU time, over the time since the previous sample (taken at most every 100 ms), rounded.
    ``most`` until a first interval is measured, or where ``/proc/stat`` is missing. What the
    phase kernel runs with unless told; the exp kernel does the same in C at each call.

    Example:
        >>> from meanfield import _native
        >>> 1 <= _native.threads_now(4) <= 4
        True
    """
    if most <= 1:
        return max(1, most)
    now = time.monotonic()
    with _lock:
        if _load["wall"] is None or now - _load["wall"] >= 0.1:
            sample, own = _busy_seconds(), time.process_time()
            if sample is None:
                _load.update(wall=now, idle=None)
            else:
                busy, cpus = sample
                if _load["wall"] is not None and cpus == _load["cpus"]:
                    others = max(
                        0.0, (busy - _load["busy"] - (own - _load["own"])) / (now - _load["wall"])
                    )
                    _load["idle"] = max(1, int(cpus - others + 0.5))
                _load.update(wall=now, busy=busy, own=own, cpus=cpus)
        idle = _load["idle"]
    return most if idle is None else min(most, idle)


#: work (pairs x (2 d + 4)) above which a call takes all its threads whatever the load: about
#: 8 ms of one CPU (``exp_kernel.c``'s ``LONG_CALL``)
LONG_CALL = 1.2e8


def default_threads() -> int:
    """Threads of the kernel: ``$OMP_NUM_THREADS`` if set, else the CPUs this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class Crossover:
    """Where a fused kernel was faster than XLA's formulation on this machine.

    Attributes:
        max_d: the largest measured ``d`` (along the ``d`` axis of the measurement) up to which
            the kernel was faster at every measured ``d``; the kernel's largest ``d`` when it was
            faster at all of them, 0 when at none.
        min_n: the smallest measured ``n`` (along the ``n`` axis) from which the kernel was faster
            at every larger measured ``n`` (2 when at all of them); ``None`` when at none.
        times: ``{"n x d": [kernel seconds, XLA seconds]}``, the medians measured.
        seconds: how long the measurement took.
        recorded: where it is recorded (``None``: kept for this process only).
        unit: what one timed call is (``describe`` says it).

    Example:
        >>> from meanfield._native import Crossover
        >>> c = Crossover(max_d=8, min_n=128, times={}, seconds=0.0)
        >>> c.prefers_native(1024, 3), c.prefers_native(1024, 16), c.prefers_native(32, 3)
        (True, False, False)
    """

    max_d: int
    min_n: int | None
    times: dict[str, list[float]]
    seconds: float
    recorded: str | None = None
    unit: str = "per call"

    def prefers_native(self, n: int, d: int) -> bool:
        """Whether ``backend="auto"`` takes the fused kernel for systems of ``n`` particles in dimension ``d``."""
        return self.min_n is not None and n >= self.min_n and d <= self.max_d

    def describe(self) -> str:
        """One line: the rule and the measured times."""
        if self.min_n is None or self.max_d == 0:
            rule = "XLA at every measured shape"
        else:
            rule = f"the fused kernel for d <= {self.max_d} and n >= {self.min_n}, else XLA"
        times = ", ".join(
            f"{k}: {1e3 * a:.3g} vs {1e3 * b:.3g} ms" for k, (a, b) in self.times.items()
        )
        return f"{rule} (measured in {self.seconds:.2f} s, kernel vs XLA {self.unit}: {times})"


class Library:
    """One native kernel as this process sees it (``meanfield._native.exp_library()``,
    ``phase_library()``): whether it runs, and if not why; for the exp kernel, where it is
    faster than XLA on this machine.

    Attributes (each evaluated at first use, then kept for the process):
        available: built, loaded (and for the exp kernel, self-tested through XLA).
        reason: why it is not available (``None`` when it is): ``MEANFIELD_NATIVE=0``, no
            compiler, a compiler error, a refused cache directory.
        crossover: the exp kernel's measured crossover (``meanfield._native.Crossover``), or
            ``None`` (not available; the phase kernel's, one per dtype, timed against the XLA
            sweep kernel of ``meanfield.phase_diagram``, is ``phase_crossover(dtype, xla_sweep)``).
    """

    def __init__(
        self,
        name: str,
        load: Callable[[], object | None],
        reason: Callable[[], str | None],
        crossover: Callable[[], Crossover] | None = None,
    ):
        self.name = name
        self._load, self._reason, self._crossover = load, reason, crossover

    @property
    def available(self) -> bool:
        return self._load() is not None

    @property
    def reason(self) -> str | None:
        self._load()
        return self._reason()

    @property
    def crossover(self) -> Crossover | None:
        if self._crossover is None or self._load() is None:
            return None
        return self._crossover()

    def __repr__(self) -> str:
        return f"<meanfield native {self.name}: " + (
            "available>" if self.available else f"unavailable: {self.reason}>"
        )
