"""Fused CPU kernels, compiled once per machine and cached: the phase-diagram sweep (``phase_kernel.c``, called
through ctypes) and the exp-kernel field (``exp_kernel.c``, an XLA FFI custom call that
``meanfield.kernels`` places inside any jitted, vmapped or differentiated program on the CPU).

Exp-kernel field (``exp_field_xla``; ``exp_field`` is the same code on NumPy arrays): XLA runs
``exp(beta X X^T) X`` as a matmul, an exponential pass over the ``n x n`` weights and a second
matmul, with all ``n^2`` exponentials and an ``n x n`` temporary per system. ``exp_kernel.c``
evaluates only the pairs ``i <= j`` (the weights are symmetric) in one pass over blocks of
rows, memory O(n d) per thread. Its tangent along ``dy`` (``exp_tangent``, FFI targets
``EXP_TANGENT_TARGETS``) is again a symmetric pair sum, evaluated the same way; the map
``dy -> dF`` is symmetric (a Hessian), so reverse mode runs the same kernel. ``meanfield.kernels``
wraps the field in a ``custom_jvp`` whose tangents use it, and in ``jax.lax.platform_dependent``
(the tangent: a primitive with a CPU lowering), so that other platforms run the XLA formulation. It needs jaxlib's FFI headers
(``jax.ffi.include_dir()``), checked by a self-test call through XLA at first use.

Phase-diagram sweep:

XLA:CPU runs the phase-diagram step as several passes over the ``(seeds, n, n)`` weights
(Gram matmul, exp, row sums, count, field matmul); at ``n = 32`` those passes, not the
exponentials, dominate. ``phase_kernel.c`` does one pass over the pairs ``i < j`` (half
the exponentials; ``w_ij`` is symmetric before the row normalisation) with the seeds in
SIMD lanes and the whole time loop of a block of seeds in L1 cache, threads over blocks
(OpenMP). BENCHMARKS.md has the measured speed-up. This is a CPU fast path for one
non-differentiable sweep, written by hand because no library fuses it;
``meanfield.phase_diagram``'s XLA kernel stays the reference it is tested against.

Both are the deliberate exceptions to "everything is JAX": CPU fast paths for the two hot loops,
each tested against the XLA formulation it replaces.

Each source is compiled once per machine and dtype (float64; float32 with ``-DMF_FLOAT32``)
with the system C compiler (``$CC``, else ``cc``/``gcc``/``clang``):
``-O3 -march=native -ffast-math -fopenmp`` (vectorised exponentials from glibc's libmvec;
no OpenMP: one thread), then linked without ``-ffast-math`` (GCC's ``crtfastmath.o`` would set
flush-to-zero for the whole process when the library loads), into a cache directory
(``$MEANFIELD_CACHE_DIR``, else ``$XDG_CACHE_HOME/meanfield`` or ``~/.cache/meanfield``) under a
name hashing the source, the flags, the compiler's version, the CPU and ``BUILD_RECIPE``.
Without a compiler, or with ``MEANFIELD_NATIVE=0``, ``available()`` and ``exp_available()`` are
``False``: ``meanfield.phase_diagram`` uses its XLA kernel (``backend="auto"``) and
``meanfield.kernels`` the XLA formulation of the fields.

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

Threads: at most ``exp_default_threads()`` per exp-kernel call (``set_exp_threads``); each call
with more than one system or more than 512 particles takes no more threads than the CPUs of
this process that other processes left idle (``exp_threads_now``: the non-idle time of those
CPUs in ``/proc/stat`` minus this process's own CPU time, over the last >= 100 ms). On a loaded
machine a team of threads waits at the end of a call for its member that waits for a CPU, and
fewer threads finish sooner (BENCHMARKS.md, contention); work is handed out dynamically, one
system or 128 rows at a time. A long call (about 8 ms of one CPU or more) takes all its threads:
a late thread then delays its end by one chunk, and each thread is a share of a loaded machine. The phase kernel does the same per call (``threads_now``). No
library call sets an environment variable (``OMP_*`` included).

When the compiler runs: the exp kernel at ``import meanfield.kernels`` (``prepare()``:
``build_exp()`` if it is not cached, then load and register the FFI targets, with one line on
stderr when it compiles), never while a function is being traced: ``exp_available()``, read by
``meanfield.kernels`` at trace time, only reports. ``prepare()`` initialises no JAX backend
(``XLA_FLAGS`` and ``jax.config`` set after ``import meanfield`` still apply); the self-test
through XLA runs at the first ``exp_available()``. The phase kernel, called outside any
trace, is built at its first use (``available()``, ``build_phase()``). ``meanfield info``
reports both, and ``meanfield info --rebuild-native`` rebuilds them.

Numbers (phase kernel): the same operations as the XLA kernel, in another order, with libmvec's
exponential (within a few ulp of the correctly rounded value). In float64 the states agree
with the XLA kernel and with the plain reference loop to 1e-11 or better and the clustering
fractions are equal (tests/test_phase_diagram.py: n = 32, d = 2, 100 steps at beta up to 9;
d = 2, 3, 5); in float32 the states agree to float32 rounding amplified by the dynamics
(tested to 2e-4) and a pair within that distance of the threshold can count differently.
"""

from __future__ import annotations

import contextlib
import ctypes
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
from pathlib import Path
from typing import Any

import numpy as np

from .._paths import cache_root, open_parent, ownership_problem

try:
    import fcntl
except ImportError:  # not POSIX: no lock between processes (the builds stay atomic)
    fcntl = None  # type: ignore[assignment]

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

__all__ = ["available", "unavailable_reason", "phase_run", "default_threads", "LANES", "DTYPES", "MAX_D", "SOURCE",
           "exp_available", "exp_unavailable_reason", "exp_field", "exp_field_xla", "exp_tangent",
           "EXP_TANGENT_TARGETS", "set_exp_threads", "EXP_SOURCE",
           "EXP_TARGETS", "EXP_LANES", "EXP_MAX_D", "exp_default_threads", "exp_threads", "exp_threads_now",
           "threads_now", "prepare", "RefusedPath", "BuildFailed", "LONG_CALL",
           "build_exp", "build_phase", "FLAGS", "BUILD_RECIPE",
           "CC_TIMEOUT", "LOAD_CHECK_TIMEOUT", "LOCK_MARGIN", "VERSION_TIMEOUT"]

#: seeds per SIMD block of the kernel, by dtype (``S`` is padded to a multiple)
LANES = {"float64": 8, "float32": 16}
#: dtypes with a kernel: the C source compiled once per dtype (float32 with ``-DMF_FLOAT32``)
DTYPES = ("float64", "float32")
#: largest dimension the kernel accepts
MAX_D = 64
#: the C source
SOURCE = Path(__file__).with_name("phase_kernel.c")
#: compiler flags, tried in order (the second without OpenMP: one thread)
FLAGS = (
    ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared"],
    ["-O3", "-march=native", "-ffast-math", "-fPIC", "-shared"],
)

#: how a library is built and cached (part of its cache name): compile, then link without
#: -ffast-math; a manifest (size, sha256) beside each library
BUILD_RECIPE = "compile -c, link -shared without -ffast-math; validated (ELF, child load); manifest v2"

_state: dict = {"lib": None, "error": None, "tried": False}
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
        hint = ", or set MEANFIELD_CACHE_DIR to a private directory" if what == "cache directory" else ""
        raise RefusedPath(f"refused the native kernel {what} {path}: {problem[0]}; fix: {problem[1]}{hint}")


def _private_dir(create: bool) -> Path:
    """The cache directory, symbolic links resolved (what is checked is what is loaded from):
    created with mode 0700 if missing and ``create``; ``RefusedPath`` unless it is a directory
    owned by this user and not writable by group or others; RuntimeError if it is missing."""
    path = Path(os.path.realpath(_cache_dir()))
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            raise RuntimeError(f"cannot create the native kernel cache directory {path}: {e.strerror} "
                               "(set MEANFIELD_CACHE_DIR to a writable private directory)") from None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RuntimeError(f"not built (no cache directory {path}; meanfield.kernels builds the kernels "
                           "at import, `meanfield info --rebuild-native` too)") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RefusedPath(f"refused the native kernel cache directory {path}: not a directory; "
                          "fix: remove it, or set MEANFIELD_CACHE_DIR to a private directory")
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
        raise RefusedPath(f"refused the native kernel cache directory {path}: its parent {parent} is writable "
                          f"by others without the sticky bit (mode {mode:o}), so anyone "
                          f"can replace the cache; fix: chmod o-w {parent} (or chmod +t {parent}), "
                          "or set MEANFIELD_CACHE_DIR to a private directory")


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
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _disabled() -> bool:
    return os.environ.get("MEANFIELD_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def _quiet() -> bool:
    return os.environ.get("MEANFIELD_NATIVE_QUIET", "0").strip().lower() not in ("", "0", "false", "no", "off")


def _warn_unavailable(reason: str) -> None:
    """One line on stderr, once per process, when a native kernel is unavailable and the XLA path
    runs instead: why. Not when the user switched the kernels off (``MEANFIELD_NATIVE=0``) or
    silenced the line (``MEANFIELD_NATIVE_QUIET=1``); ``meanfield info`` always says why."""
    if _warned or _disabled() or _quiet():
        return
    _warned.append(reason)
    text = " ".join(reason.split())
    text = text if len(text) <= 500 else text[:497] + "..."
    print(f"meanfield: native CPU kernels unavailable, the XLA path runs instead: {text} "
          "(`meanfield info` for details; MEANFIELD_NATIVE_QUIET=1 silences this line)", file=sys.stderr, flush=True)


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
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=group)

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
    except BaseException:  # KeyboardInterrupt: the compiler has its own session, so it is ended here
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
                _versions[cc] = RuntimeError(f"the C compiler's version probe `{cc} --version` ran past {e.seconds:g} s "
                                             "(killed; MEANFIELD_CC_VERSION_TIMEOUT sets the limit)")
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


def _library_paths(cc: str, version: str, source_path: Path, defines: list[str],
                   include: tuple[str, ...] | list[str] = ()) -> list[tuple[list[str], Path]]:
    """``(flags, cached library)`` of each flag set of ``FLAGS``, in the order they are tried.

    The cache name hashes the source, the headers it includes from ``include`` (their bytes),
    the flags, the compiler's version, the CPU and the build recipe."""
    source = source_path.read_bytes()
    headers = b"".join(sorted(p.read_bytes() for d in include for p in Path(d).rglob("c_api.h")))
    out = []
    for flags in FLAGS:
        flags = [*flags, *defines, *(f"-I{d}" for d in include)]
        tag = hashlib.sha256(b"\0".join([source, headers, " ".join(flags).encode(), version.encode(),
                                         _cpu_tag().encode(), BUILD_RECIPE.encode()])).hexdigest()[:16]
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
                raise RuntimeError(f"the native kernel lock file {lock} was held by another process for more than "
                                   f"{limit:g} s (MEANFIELD_CACHE_LOCK_TIMEOUT sets the limit); fix: end that "
                                   "process, or set MEANFIELD_CACHE_DIR to another private directory") from None
            time.sleep(0.05)


@contextlib.contextmanager
def _file_lock(target: Path):
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
            raise RefusedPath(f"refused the native kernel lock file {lock}: a symbolic link; fix: remove it") from None
        if e.errno not in _READ_ONLY:
            raise RuntimeError(f"cannot open the native kernel lock file {lock}: {e.strerror}") from None
        yield False  # a read-only cache directory: read only
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RefusedPath(f"refused the native kernel lock file {lock}: not a regular file; fix: remove it")
        if fcntl is not None:
            _flock_bounded(fd, lock)
        yield os.access(target.parent, os.W_OK)
    finally:
        os.close(fd)  # releases the lock


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
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
        raise RefusedPath(f"refused the native kernel {what} {path}: {_kind(st.st_mode)}, not a regular file; "
                          f"fix: remove it")
    try:  # O_NONBLOCK: a FIFO put there after the lstat does not block the open
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | _O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        if os.path.islink(path):
            raise RefusedPath(f"refused the native kernel {what} {path}: a symbolic link; fix: remove it") from None
        raise RuntimeError(f"cannot read the native kernel {what} {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedPath(f"refused the native kernel {what} {path}: {_kind(st.st_mode)}, not a regular file; "
                              f"fix: remove it")
        _check_private(path, st, what)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise RuntimeError(f"cannot read the native kernel {what} {path}: {e.strerror}") from None
    finally:
        os.close(fd)


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
        record = json.loads(raw)
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
            raise RuntimeError(f"the cached library {target} is {'missing' if damage == 'missing' else 'damaged'}"
                               f"{'' if damage == 'missing' else f' ({damage})'}; it is rebuilt at the next "
                               "import of meanfield.kernels, or run `meanfield info --rebuild-native`")
        return ctypes.CDLL(str(target))


def _identity(cc: str, version: str, flags: list[str], digest: bytes) -> dict[str, Any]:
    """What a failed build is recorded with: the compiler (path and ``--version``), the flags and
    the source's hash. A recorded failure whose identity differs from the current one is retried."""
    return {"compiler": cc, "version": version, "flags": flags, "source_sha256": digest.hex()}


#: compiler messages of a failure that says nothing about the source or the flags (a killed
#: compiler, a full disk, no memory): never recorded, the next import tries again
_TRANSIENT = re.compile(r"signal terminated program|unable to execute command|\bkilled\b|no space left on device|"
                        r"cannot allocate memory|out of memory|resource temporarily unavailable", re.IGNORECASE)


#: signals of a compiler that crashed (recorded like any failure), unlike one that was killed
#: (SIGKILL by the out-of-memory killer, SIGTERM, SIGINT: not recorded)
_CRASHES = frozenset(int(getattr(signal, name)) for name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")
                     if hasattr(signal, name))


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
        record = json.loads(data)
        same = isinstance(record, dict) and record.get("identity") == identity
    except ValueError:
        same = False
    if not same:
        with contextlib.suppress(OSError):  # a read-only cache directory: ignored all the same
            marker.unlink(missing_ok=True)
        return None
    return str(record.get("error", ""))


def _build_one(cc: str, version: str, source_path: Path, defines: list[str],
               include: tuple[str, ...] | list[str] = (), *, force: bool = False, announce=None,
               may_compile: bool = True) -> Path:
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
                for stale in (target, _manifest(target), target.with_suffix(".failed")):
                    try:
                        stale.unlink(missing_ok=True)
                    except OSError as e:
                        raise RuntimeError(f"cannot remove {stale} to rebuild it: {e.strerror}"
                                           f"{'' if writable else ' (a read-only cache directory)'}; fix: make "
                                           f"{target.parent} writable, or set MEANFIELD_CACHE_DIR to another "
                                           "private directory") from None
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
                raise RuntimeError(f"not built ({target.name} is {damage} in {target.parent}; meanfield.kernels "
                                   "builds it at import, `meanfield info --rebuild-native` too)" if damage == "missing"
                                   else f"the cached library {target} is damaged ({damage}); it is rebuilt at "
                                   "the next import of meanfield.kernels, or run `meanfield info --rebuild-native`")
            if not writable:
                raise RuntimeError(f"the cache directory {target.parent} is read-only and {target.name} is "
                                   f"{damage} there; fix: make it writable, or set MEANFIELD_CACHE_DIR to a "
                                   "writable private directory")
            _raise_if_timed_out(cc, version, target.parent, head, force)
            if announce is not None:
                announce(None if damage == "missing"
                         else f"meanfield: the cached native library {target} is damaged ({damage}); rebuilding it")
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
    tail = ("recorded with the compiler's identity: retried when it changes, or run `meanfield info --rebuild-native`"
            if recorded_any else "not recorded (a killed compiler or a full disk): the next import retries")
    first = next((ln.strip() for e in errors for ln in e.split(": ", 1)[-1].splitlines() if ln.strip()), "")
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
        _write_atomic(_compiler_record(cc, version, directory),
                      json.dumps({"identity": {"compiler": cc, "version": version}, "error": error}).encode())


def _raise_if_timed_out(cc: str, version: str, directory: Path, head: str, force: bool) -> None:
    """``BuildFailed`` without running the compiler when it ran past its timeout in this process,
    or (unless ``force``) in an earlier one (its record in the cache directory)."""
    error = _timed_out.get((cc, version))
    marker = _compiler_record(cc, version, directory)
    if error is None and not force:
        error = _recorded_failure(marker, {"compiler": cc, "version": version})
    if error is None:
        return
    tail = (f"recorded in {marker} with the compiler's identity: not run again until it changes, or run "
            "`meanfield info --rebuild-native`")
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
        raise RuntimeError(f"cannot write to the native kernel cache directory {target.parent}: {e.strerror}; "
                           "fix: make it writable, or set MEANFIELD_CACHE_DIR to a writable private directory") from None
    os.close(fd)
    try:
        try:
            r = _compile_and_link(cc, flags, source_path, tmp, limit)
        except _Timeout:
            return (f"the compiler ran past {limit:g} s (killed with the processes it started; "
                    "MEANFIELD_CC_TIMEOUT sets the limit)"), "timeout"
        except OSError as e:
            return f"cannot run the compiler: {e}", "recorded"
        if r.returncode < 0 and -r.returncode in _CRASHES:  # the compiler itself crashed: as deterministic
            name = signal.Signals(-r.returncode).name  # as an internal compiler error, so recorded
            return f"the compiler crashed ({name}){': ' + r.stderr.strip() if r.stderr.strip() else ''}", "recorded"
        if r.returncode != 0:
            error = r.stderr.strip() or f"exit status {r.returncode}"
            return error, "transient" if r.returncode < 0 or _TRANSIENT.search(error) else "recorded"
        with open(tmp, "rb") as f:
            data = f.read()
        problem = _validate(tmp, data)
        if problem is not None:
            return f"the compiler exited 0 but wrote no usable library: {problem}", "recorded"
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)
        _write_atomic(_manifest(target), json.dumps({"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                                     "compiler": cc, "flags": flags,
                                                     "validated": "ELF headers, loaded in a child process"}).encode())
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
        r = _run_bounded([sys.executable, "-I", "-S", "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", path],
                         LOAD_CHECK_TIMEOUT)
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


def _compile_and_link(cc: str, flags: list[str], source_path: Path, out: str,
                      limit: float) -> subprocess.CompletedProcess:
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
            r = _run_bounded([cc, *link_flags, "-o", out, obj, "-lm"], max(0.001, deadline - time.monotonic()))
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
            print(message or f"meanfield: building the native {what} (once, cached in {_cache_dir()}) ...",
                  file=sys.stderr, flush=True)

    return {name: _build_one(cc, version, source_path, defines, include, force=force, announce=announce)
            for name, defines, _, _ in _BUILDS}


def _reason(e: Exception) -> str:
    return str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"


def _summary(e: Exception) -> str:
    """``_reason(e)`` in one line (a build failure: its summary)."""
    return e.summary if isinstance(e, BuildFailed) else _reason(e)


#: the builds of each source: (dtype, -D flags, suffix of the entry points, C type of the reals)
_BUILDS: tuple[tuple[str, list[str], str, Any], ...] = (
    ("float64", [], "_f64", ctypes.c_double), ("float32", ["-DMF_FLOAT32"], "_f32", ctypes.c_float))


def build_phase(force: bool = False) -> dict[str, Path]:
    """Compile both dtypes of ``phase_kernel.c`` into the cache, unless they are there already.

    Runs the C compiler only for a library missing from the cache (or every one with ``force``,
    which first removes this source's cached libraries and failure marks for the current
    compiler), printing one line to stderr first. ``available()`` builds on its first call.

    Returns:
        ``{dtype name: path of the shared library}``.

    Raises:
        RuntimeError: disabled (``MEANFIELD_NATIVE=0``), no compiler, the compiler failed
        (``BuildFailed``), or the cache directory or a library in it is refused because others
        can write it (``RefusedPath``); the message says which.
    """
    return _build_all("phase-diagram kernel", SOURCE, [], force)


def _build() -> dict:
    """``{dtype name: (entry point, ctypes pointer type of its reals)}`` for ``DTYPES``."""
    paths = build_phase()
    kernels = {}
    ip = ctypes.POINTER(ctypes.c_int)
    dp = ctypes.POINTER(ctypes.c_double)
    for name, _, suffix, ctype in _BUILDS:
        lib = _load_library(paths[name])
        fn = getattr(lib, "mf_phase_run" if name == "float64" else f"mf_phase_run{suffix}")
        rp = ctypes.POINTER(ctype)
        fn.argtypes = [rp, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_double,
                       ctypes.c_double, ctypes.c_int, ip, ctypes.c_int, ctypes.c_double, ctypes.c_int,
                       dp, rp, ctypes.c_int]
        fn.restype = ctypes.c_int
        lanes = int(lib.mf_lanes())
        if lanes != LANES[name]:
            raise RuntimeError(f"the {name} build has {lanes} lanes, expected {LANES[name]}")
        kernels[name] = (fn, rp)
    return kernels


def _library() -> dict | None:
    return _once(_state, _build)


def _once(state: dict, build) -> dict | None:
    """``build()`` on the first call (its error kept in ``state``), thread-safe."""
    with _lock:
        if not state["tried"]:
            state["tried"] = True
            try:
                state["lib"] = build()
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                state["error"] = _reason(e)
                _warn_unavailable(f"phase-diagram kernel: {_summary(e)}")
        return state["lib"]


def available() -> bool:
    """Whether the native kernel is built and loaded (builds it on the first call).

    Example:
        >>> from meanfield import _native
        >>> _native.available() == (_native.unavailable_reason() is None)
        True
    """
    return _library() is not None


def unavailable_reason() -> str | None:
    """Why ``available()`` is ``False`` (``None`` when it is available)."""
    _library()
    return _state["error"]


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
                    others = max(0.0, (busy - _load["busy"] - (own - _load["own"])) / (now - _load["wall"]))
                    _load["idle"] = max(1, int(cpus - others + 0.5))
                _load.update(wall=now, busy=busy, own=own, cpus=cpus)
        idle = _load["idle"]
    return most if idle is None else min(most, idle)


def _phase_threads(S: int, n: int, d: int, nsteps: int) -> int:
    """The phase kernel's threads: all (``default_threads()``) for a long run, else ``threads_now``."""
    work = float(S) * n * (n + 1) / 2 * (2 * d + 4) * max(1, nsteps)
    return default_threads() if work > LONG_CALL else threads_now(default_threads())


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


def phase_run(x0, beta: float, shift: float, step: float, nsteps: int, ckpt, threshold: float,
              normalized: bool, threads: int | None = None):
    """Run ``nsteps`` Euler steps of every seed of ``x0`` with the native kernel.

    Args:
        x0: ``(S, n, d)`` float64 or float32 array (any ``S``; padded internally to a multiple
            of ``LANES[dtype]``); the kernel computes in that dtype.
        beta, shift: weights ``exp(beta <x_i, x_j> - shift)``; step: Euler step in that scale.
        nsteps: number of steps; ckpt: distinct sorted step indices in ``[0, nsteps]`` whose
            state's clustering fraction is returned; threshold: on ``<x_i, x_j>``.
        normalized: SA (row-normalised) or USA (``1/n``) field.
        threads: OpenMP threads (default ``default_threads()``; for a short run, under about
            8 ms of one CPU, ``threads_now(default_threads())``: fewer on a machine loaded by
            other processes). The results do not depend on it.

    Returns:
        ``(fractions (S, len(ckpt)), final states (S, n, d))``: NumPy arrays, float64 fractions,
        states in the dtype of ``x0``.

    Example:
        >>> import numpy as np
        >>> from meanfield import _native
        >>> x0 = np.tile([[1.0, 0.0], [0.0, 1.0]], (3, 1, 1))  # 3 seeds of two orthogonal particles
        >>> fr, xs = _native.phase_run(x0, 1.0, 0.0, 0.5, 40, [0, 40], 0.9, True)
        >>> fr.shape, xs.shape, fr[0].tolist()  # they meet: <x_1, x_2> > 0.9 at step 40
        ((3, 2), (3, 2, 2), [0.0, 1.0])
    """
    kernels = _library()
    if kernels is None:
        raise RuntimeError(f"the native phase-diagram kernel is not available: {_state['error']}")
    dtype = np.asarray(x0).dtype
    if dtype.name not in DTYPES:
        raise ValueError(f"x0 must be float64 or float32 for the native kernel, got dtype {dtype}")
    fn, rp = kernels[dtype.name]
    x0 = np.ascontiguousarray(x0)
    if x0.ndim != 3 or x0.shape[1] < 2 or not 1 <= x0.shape[2] <= MAX_D:
        raise ValueError(f"x0 must have shape (S, n, d) with n >= 2 and 1 <= d <= {MAX_D}, got {x0.shape}")
    S, n, d = x0.shape
    if isinstance(nsteps, bool) or not isinstance(nsteps, int | np.integer) or nsteps < 0:
        raise ValueError(f"nsteps must be an integer >= 0, got {nsteps!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    pad = (-S) % LANES[dtype.name]
    xp = np.concatenate([x0, np.repeat(x0[:1], pad, axis=0)]) if pad else x0
    ck = np.ascontiguousarray(ckpt, dtype=np.intc)
    if ck.ndim != 1 or (ck.size and (ck.min() < 0 or ck.max() > nsteps or np.any(np.diff(ck) <= 0))):
        raise ValueError(f"ckpt must be distinct sorted steps in [0, {nsteps}], got {ck.tolist()}")
    Sp = xp.shape[0]
    frac = np.zeros((Sp, ck.size))
    xout = np.empty_like(xp)
    rc = fn(
        xp.ctypes.data_as(rp), Sp, n, d, float(beta), float(shift), float(step), int(nsteps),
        ck.ctypes.data_as(ctypes.POINTER(ctypes.c_int)), ck.size, float(threshold), int(bool(normalized)),
        frac.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), xout.ctypes.data_as(rp),
        int(threads or _phase_threads(Sp, n, d, nsteps)),
    )
    if rc != 0:
        raise RuntimeError(f"the native phase-diagram kernel failed (S={S}, n={n}, d={d})")
    return frac[:S], xout[:S]


# ----------------------------------------------------------------------------
# the exp-kernel field (exp_kernel.c), an XLA FFI custom call
# ----------------------------------------------------------------------------

#: the C source of the fused exp-kernel field (``meanfield.kernels``' CPU fast path)
EXP_SOURCE = Path(__file__).with_name("exp_kernel.c")
#: XLA FFI targets by dtype: (field and sum, sum only)
EXP_TARGETS = {"float64": ("meanfield_exp_fs_f64", "meanfield_exp_s_f64"),
               "float32": ("meanfield_exp_fs_f32", "meanfield_exp_s_f32")}
#: XLA FFI targets of the field's tangent (``exp_tangent``), by dtype
EXP_TANGENT_TARGETS = {"float64": "meanfield_exp_t_f64", "float32": "meanfield_exp_t_f32"}
#: columns per SIMD vector of the exp kernel, by dtype
EXP_LANES = {"float64": 8, "float32": 16}
#: largest dimension the exp kernel accepts
EXP_MAX_D = 64

_exp_state: dict = {"lib": None, "error": None, "prepared": False, "tested": False, "threads": None,
                    "adaptive": True}


def _exp_include() -> str:
    import jax.ffi

    return jax.ffi.include_dir()


def build_exp(force: bool = False) -> dict[str, Path]:
    """Compile both dtypes of ``exp_kernel.c`` into the cache, unless they are there already.

    Runs the C compiler only for a library missing from the cache (or every one with ``force``,
    which first removes this source's cached libraries and failure marks for the current
    compiler and FFI headers), printing one line to stderr first. ``prepare()`` calls it when
    ``meanfield.kernels`` is imported, so that the compiler never runs while a function is
    being traced. Initialises no JAX backend.

    Returns:
        ``{dtype name: path of the shared library}``.

    Raises:
        RuntimeError: disabled (``MEANFIELD_NATIVE=0``), no compiler, the compiler failed
        (``BuildFailed``), or the cache directory or a library in it is refused because others
        can write it (``RefusedPath``); the message says which.

    Example:
        >>> from meanfield import _native
        >>> if _native.exp_available():  # built (at import), so found in the cache: no compiler runs
        ...     print(sorted(_native.build_exp()))
        ... else:
        ...     print(['float32', 'float64'])
        ['float32', 'float64']
    """
    return _build_all("CPU kernels", EXP_SOURCE, [_exp_include()], force)


def _load_exp(paths: dict[str, Path]) -> dict:
    """dlopen the exp-kernel libraries and register their FFI targets with XLA (for the CPU).

    Registration initialises no JAX backend: ``xla_client.register_custom_call_target`` adds
    the handlers to XLA's process-wide table of targets, which needs no client (tested in
    tests/test_info.py: ``XLA_FLAGS`` set after ``import meanfield`` still apply)."""
    import jax.ffi

    libs = {}
    for name, _, suffix, ctype in _BUILDS:
        lib = _load_library(paths[name])
        lanes = int(getattr(lib, f"mf_exp_lanes{suffix}")())
        if lanes != EXP_LANES[name]:
            raise RuntimeError(f"the {name} exp kernel has {lanes} lanes, expected {EXP_LANES[name]}")
        fn = getattr(lib, f"mf_exp_field{suffix}")
        rp = ctypes.POINTER(ctype)
        fn.argtypes = [rp, rp, rp, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int, rp, rp]
        fn.restype = ctypes.c_int
        threads = getattr(lib, f"mf_exp_set_threads{suffix}")
        threads.argtypes = [ctypes.c_int]
        adaptive = getattr(lib, f"mf_exp_set_adaptive{suffix}")
        adaptive.argtypes = [ctypes.c_int]
        now = getattr(lib, f"mf_exp_threads_now{suffix}")
        now.argtypes, now.restype = [ctypes.c_double], ctypes.c_int
        tangent = getattr(lib, f"mf_exp_tangent{suffix}")
        tangent.argtypes = [rp, rp, rp, ctypes.c_int64, ctypes.c_int, ctypes.c_int, rp]
        tangent.restype = ctypes.c_int
        libs[name] = (lib, fn, rp, (threads, adaptive, now), tangent)
    for name, (lib, *_) in libs.items():
        for target in (*EXP_TARGETS[name], EXP_TANGENT_TARGETS[name]):
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, target)), platform="cpu")
    return {name: rest for name, (_, *rest) in libs.items()}


def _prepare(may_compile: bool) -> bool:
    with _lock:
        if not _exp_state["prepared"]:
            _exp_state["prepared"] = True
            try:
                if may_compile:
                    paths = build_exp()
                else:
                    cc, version = _toolchain()
                    paths = {name: _build_one(cc, version, EXP_SOURCE, defines, [_exp_include()], may_compile=False)
                             for name, defines, _, _ in _BUILDS}
                _exp_state["lib"] = _load_exp(paths)
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                _exp_state["error"] = _reason(e)
                _warn_unavailable(_summary(e))
        return _exp_state["lib"] is not None


def prepare() -> bool:
    """Build the exp kernel if it is not cached (``build_exp``), load it and register its XLA
    FFI targets; once per process (later calls return the first answer). ``meanfield.kernels``
    calls it at import, so the C compiler runs there and never inside a traced function.

    No exception: a failure (``MEANFIELD_NATIVE=0``, no compiler, a compiler error) is kept as
    ``exp_unavailable_reason()`` and the fields use the XLA formulation. Initialises no JAX
    backend and reads no JAX configuration, so ``XLA_FLAGS`` and ``jax.config`` set after
    ``import meanfield`` still apply. The self-test through XLA runs at the first use
    (``exp_available()``).

    Returns:
        Whether the library is loaded (not yet self-tested).

    Example:
        >>> from meanfield import _native
        >>> _native.prepare() or _native.exp_unavailable_reason() is not None
        True
    """
    return _prepare(may_compile=True)


def _self_test() -> None:
    """One small call of each FFI target against NumPy (a handler XLA rejects fails here, not later)."""
    import jax

    # may run while a caller's function is being traced, and on a machine whose default device
    # is an accelerator: evaluate now, on the CPU
    with jax.ensure_compile_time_eval(), jax.default_device(jax.local_devices(backend="cpu")[0]):
        _self_test_eager(jax)


def _self_test_eager(jax) -> None:
    """Through ``_partitioned_call``, the path ``meanfield.kernels`` traces (an FFI handler or a
    JAX API that this JAX lacks fails here, at first use, and leaves the XLA formulation)."""
    x = np.array([[[1.0, 0.0], [0.6, 0.8], [0.0, -1.0]]])
    beta = np.array([1.5])
    G = np.array([[[0.0, -1.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [[0.6, -0.8], [0.8, 0.6]]])
    y = np.einsum("nac,nc->na", G, x[0])
    Wx, Wy = np.exp(beta[0] * (x[0] @ x[0].T - 1.0)), np.exp(beta[0] * (y @ y.T - 1.0))
    Fy = np.einsum("nac,na->nc", G, Wy @ y / 3)
    dx = np.array([[[0.3, -0.2], [0.1, 0.5], [-0.4, 0.2]]])
    C = beta[0] * Wx * (dx[0] @ x[0].T + x[0] @ dx[0].T)
    dF = (C @ x[0] + Wx @ dx[0]) / 3
    for name in EXP_TARGETS:
        if name == "float64" and not jax.config.read("jax_enable_x64"):
            continue  # float64 arrays do not exist in this process (yet): float32 checks the handler
        xt, bt, Gt = x.astype(name), beta.astype(name), G.astype(name)
        F, S = jax.jit(_partitioned_call(name, True, "none"))(xt, bt)
        S2 = jax.jit(_partitioned_call(name, False, "none"))(xt, bt)
        Fg, Sg = jax.jit(_partitioned_call(name, True, "shared"))(xt, bt, Gt)
        t = jax.ffi.ffi_call(EXP_TANGENT_TARGETS[name], jax.ShapeDtypeStruct(xt.shape, xt.dtype))
        dFt = jax.jit(t)(xt, dx.astype(name), bt)
        tol = 1e-5 if name == "float32" else 1e-12
        close = lambda a, b, t=tol: np.allclose(np.asarray(a), b, rtol=t, atol=t)  # noqa: E731
        if not (close(F[0], Wx @ x[0] / 3) and close(S, Wx.sum()) and close(S2, Wx.sum())
                and close(Fg[0], Fy) and close(Sg, Wy.sum()) and close(dFt[0], dF)):
            raise RuntimeError(f"the {name} exp kernel failed its self-test through XLA")


def _exp_library() -> dict | None:
    """The loaded exp kernel, self-tested on the first call (which sets its threads), or ``None``.
    Never runs the compiler: without ``prepare()`` it looks in the cache only."""
    if not _exp_state["prepared"]:
        _prepare(may_compile=False)
    with _lock:
        if _exp_state["lib"] is not None and not _exp_state["tested"]:
            _exp_state["tested"] = True
            try:
                _set_threads(_exp_state["lib"], exp_default_threads(), adaptive=True)
                _self_test()
            except Exception as e:  # noqa: BLE001 - any failure leaves the XLA path, with the reason
                _exp_state["lib"], _exp_state["error"] = None, _reason(e)
                _warn_unavailable(_summary(e))
        return _exp_state["lib"]


def _set_threads(libs: dict, threads: int, adaptive: bool) -> None:
    for _, _, (set_threads, set_adaptive, _), _ in libs.values():
        set_threads(threads)
        set_adaptive(int(adaptive))
    _exp_state["threads"], _exp_state["adaptive"] = threads, adaptive


def exp_available() -> bool:
    """Whether the exp-kernel FFI targets are built, registered and pass their self-test.

    Never runs the C compiler (``prepare()``, at the import of ``meanfield.kernels``, built the
    kernel or recorded why not); the first call runs the self-test through XLA.

    Example:
        >>> from meanfield import _native
        >>> _native.exp_available() == (_native.exp_unavailable_reason() is None)
        True
    """
    return _exp_library() is not None


def exp_unavailable_reason() -> str | None:
    """Why ``exp_available()`` is ``False`` (``None`` when it is available)."""
    _exp_library()
    return _exp_state["error"]


def _forget_failures() -> None:
    """After a rebuild (``meanfield info --rebuild-native``): kernels that failed to build are
    tried again at their next use (a loaded library stays: its FFI targets are registered)."""
    with _lock:
        if _exp_state["lib"] is None and not _exp_state["tested"]:  # not loaded (a failed self-test stays)
            _exp_state.update(error=None, prepared=False)
        if _state["lib"] is None:
            _state.update(error=None, tried=False)


def exp_default_threads() -> int:
    """Threads of one exp-kernel call: ``$OMP_NUM_THREADS`` if set, else the CPUs of this process
    divided by its CPU devices (with ``--xla_force_host_platform_device_count`` or
    ``jax_num_cpu_devices`` a sharded batch runs one call per device at once), at least 1."""
    import jax

    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        devices = max(1, len(jax.devices("cpu")))
    except RuntimeError:
        devices = 1
    return max(1, default_threads() // devices)


def exp_threads() -> int:
    """The most threads of later exp-kernel calls (``set_exp_threads``)."""
    if _exp_library() is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    return int(_exp_state["threads"])


def exp_threads_now(B: int = 1, n: int = 2048, d: int = 3) -> int:
    """The threads an exp-kernel call on ``B`` systems of ``n`` particles in dimension ``d`` would
    use now: ``exp_threads()``, or fewer on a loaded machine while adaptive (``set_exp_threads``):
    no more than the CPUs of this process that other processes left idle over the last >= 100 ms
    (``threads_now``, computed in C), at least 1; a long call (``B n (n + 1) / 2 (2 d + 4)`` above
    1.2e8, about 8 ms of one CPU) takes them all."""
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    if B <= 1 and n <= 512:
        return 1  # one small system: one thread, whatever the setting
    return int(next(iter(libs.values()))[2][2](float(B) * n * (n + 1) / 2 * (2 * d + 4)))


def set_exp_threads(threads: int | None = None, *, adaptive: bool = True) -> None:
    """Threads of later exp-kernel calls: at most ``threads`` (default ``exp_default_threads()``).

    ``adaptive`` (default): each call that runs more than one system, or one system of more than
    512 particles, takes no more threads than the CPUs of this process that other processes left
    idle over the last >= 100 ms (``exp_threads_now``): on a machine loaded by other processes a
    team of threads waits for its slowest member, and one thread finishes sooner (BENCHMARKS.md,
    contention); a long call (about 8 ms of one CPU or more) takes them all (each thread is a
    share of a loaded machine, and a late one delays the end by one chunk of work).
    ``adaptive=False``: always ``threads``. Batches run whole systems per thread
    (bit-identical for any thread count); one large system split over threads sums its rows in
    another order (rounding, ``tests/test_kernels_native.py``). Sets no environment variable.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if not isinstance(adaptive, bool):
        raise TypeError(f"adaptive must be True or False, got {adaptive!r}")
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    _set_threads(libs, int(threads or exp_default_threads()), adaptive)


def exp_field(x, beta, field: bool = True, gauge=None):
    """``(F, S)`` of the exp kernel on NumPy arrays (through ctypes, outside XLA).

    ``F_i = (1/n) sum_j exp(beta (<x_i, x_j> - 1)) x_j`` and ``S = sum_ij exp(beta (<x_i, x_j> - 1))``
    for every system of ``x`` ``(B, n, d)`` with ``beta`` ``(B,)``; ``F`` is ``None`` when
    ``field`` is ``False``. With orthogonal ``gauge`` matrices ``Psi_i`` (``(n, d, d)`` shared,
    or ``(B, n, d, d)``) the weights are those of ``y_i = Psi_i x_i`` and
    ``F_i = Psi_i^T (1/n) sum_j w_ij y_j`` (an exp-gauge kernel in its gauge frame).
    ``meanfield.kernels`` calls the same code through XLA's FFI.

    Example:
        >>> import numpy as np
        >>> from meanfield import _native
        >>> x = np.array([[[1.0, 0.0], [0.0, 1.0]]])  # two orthogonal unit vectors
        >>> F, S = _native.exp_field(x, np.array([2.0]))
        >>> bool(np.isclose(S[0], 2 + 2 * np.exp(-2.0))), bool(np.allclose(F[0, 0], [0.5, 0.5 * np.exp(-2.0)]))
        (True, True)
    """
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    x = np.ascontiguousarray(x)
    if x.dtype.name not in EXP_TARGETS:
        raise ValueError(f"x must be float64 or float32 for the native kernel, got dtype {x.dtype}")
    if x.ndim != 3 or x.shape[1] < 1 or not 1 <= x.shape[2] <= EXP_MAX_D:
        raise ValueError(f"x must have shape (B, n, d) with n >= 1 and 1 <= d <= {EXP_MAX_D}, got {x.shape}")
    beta = np.ascontiguousarray(beta, dtype=x.dtype)
    if beta.shape != x.shape[:1]:
        raise ValueError(f"beta must have shape {x.shape[:1]}, got {beta.shape}")
    fn, rp, _, _ = libs[x.dtype.name]
    B, n, d = x.shape
    G = None
    if gauge is not None:
        G = np.ascontiguousarray(gauge, dtype=x.dtype)
        if G.shape not in ((n, d, d), (B, n, d, d)):
            raise ValueError(f"gauge must have shape {(n, d, d)} or {(B, n, d, d)}, got {G.shape}")
    F = np.empty_like(x) if field else None
    S = np.empty(B, x.dtype)
    rc = fn(x.ctypes.data_as(rp), beta.ctypes.data_as(rp), G.ctypes.data_as(rp) if G is not None else None,
            int(G is not None and G.ndim == 3), B, n, d,
            F.ctypes.data_as(rp) if F is not None else None, S.ctypes.data_as(rp))
    if rc != 0:
        raise RuntimeError(f"the native exp kernel failed (B={B}, n={n}, d={d}, code {rc})")
    return F, S


def exp_tangent(y, dy, beta):
    r"""The tangent of the exp-kernel field along ``dy`` on NumPy arrays (through ctypes).

    For every system of ``y``, ``dy`` ``(B, n, d)`` with ``beta`` ``(B,)``:

    $$dF_i = \frac1n \sum_j \left[\beta w_{ij} (\langle dy_i, y_j\rangle + \langle y_i, dy_j\rangle) y_j + w_{ij}\, dy_j\right], \quad w_{ij} = e^{\beta (\langle y_i, y_j\rangle - 1)},$$

    the derivative of ``exp_field``'s $F$ along ``dy`` (one pass over the pairs $i \le j$: both
    weights are symmetric). The map $dy \mapsto dF$ is the Hessian of $S / (2 \beta n)$, so it is
    symmetric: its own transpose. ``meanfield.kernels`` calls the same code through XLA's FFI
    (``EXP_TANGENT_TARGETS``) for ``jax.jvp``, ``jax.grad`` and Hessian-vector products.

    Example:
        >>> import numpy as np
        >>> from meanfield import _native
        >>> y, dy = np.array([[[1.0, 0.0], [1.0, 0.0]]]), np.array([[[0.0, 1.0], [0.0, 0.0]]])
        >>> _native.exp_tangent(y, dy, np.array([2.0]))[0].tolist()   # (dy_0 + dy_1) / 2 per row
        [[0.0, 0.5], [0.0, 0.5]]
    """
    libs = _exp_library()
    if libs is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    y, dy = np.ascontiguousarray(y), np.ascontiguousarray(dy)
    if y.dtype.name not in EXP_TARGETS or dy.dtype != y.dtype:
        raise ValueError(f"y and dy must be float64 or float32 arrays of one dtype, got {y.dtype} and {dy.dtype}")
    if y.ndim != 3 or y.shape[1] < 1 or not 1 <= y.shape[2] <= EXP_MAX_D or dy.shape != y.shape:
        raise ValueError(f"y and dy must have one shape (B, n, d) with n >= 1 and 1 <= d <= {EXP_MAX_D}, "
                         f"got {y.shape} and {dy.shape}")
    beta = np.ascontiguousarray(beta, dtype=y.dtype)
    if beta.shape != y.shape[:1]:
        raise ValueError(f"beta must have shape {y.shape[:1]}, got {beta.shape}")
    _, rp, _, fn = libs[y.dtype.name]
    B, n, d = y.shape
    dF = np.empty_like(y)
    rc = fn(y.ctypes.data_as(rp), dy.ctypes.data_as(rp), beta.ctypes.data_as(rp), B, n, d, dF.ctypes.data_as(rp))
    if rc != 0:
        raise RuntimeError(f"the native exp tangent failed (B={B}, n={n}, d={d}, code {rc})")
    return dF


def exp_field_xla(x, beta, field: bool = True, gauge=None):
    """``(F, S)`` of ``exp_field`` as an XLA FFI call on JAX arrays (CPU only; ``F`` is ``None``
    when ``field`` is ``False``). ``x``: ``(..., n, d)``, ``beta``: ``(...)``, float32 or float64;
    ``gauge``: ``None``, ``(n, d, d)`` (shared) or ``(..., n, d, d)``.

    Not differentiable by itself: ``meanfield.kernels`` wraps it in a ``custom_jvp``. Sharded
    inputs (``jax.sharding``: a sweep's batch axis over several devices) stay sharded: a
    ``custom_partitioning`` rule runs the call on each device's systems (batch axes split,
    ``n`` and ``d`` whole) instead of gathering the batch on every device."""
    if _exp_library() is None:
        raise RuntimeError(f"the native exp kernel is not available: {_exp_state['error']}")
    mode = "none" if gauge is None else ("shared" if gauge.ndim == 3 else "batched")
    args = (x, beta) if gauge is None else (x, beta, gauge)
    out = _partitioned_call(np.dtype(x.dtype).name, bool(field), mode)(*args)
    return (out[0], out[1]) if field else (None, out)


@functools.cache
def _tangent_call(name: str):
    """The FFI call of the tangent ``(y, dy, beta) -> dF`` with the sharding rule of
    ``_partitioned_call``: batch axes as ``y``'s, ``n`` and ``d`` whole (a sharded batch runs
    on each device's systems, no all-gather)."""
    import jax
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    def call(y, dy, beta):
        return jax.ffi.ffi_call(EXP_TANGENT_TARGETS[name], jax.ShapeDtypeStruct(y.shape, y.dtype))(y, dy, beta)

    def shardings(mesh, arg_shapes):
        ys = arg_shapes[0]
        batch_rank = len(ys.shape) - 2
        sh = ys.sharding
        spec = tuple(sh.spec)[:batch_rank] if isinstance(sh, NamedSharding) else ()
        spec = spec + (None,) * (batch_rank - len(spec))
        mesh = sh.mesh if isinstance(sh, NamedSharding) else mesh
        return NamedSharding(mesh, PartitionSpec(*spec, None, None)), NamedSharding(mesh, PartitionSpec(*spec))

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[0]

    def partition(mesh, arg_shapes, result_shape):
        y_sh, b_sh = shardings(mesh, arg_shapes)
        return mesh, call, y_sh, (y_sh, y_sh, b_sh)

    wrapped = custom_partitioning(call)
    wrapped.def_partition(partition=partition, infer_sharding_from_operands=infer,
                          sharding_rule="... n d, ... n d, ... -> ... n d", need_replication_factors=("n", "d"))
    return wrapped


def _local_call(name: str, field: bool, *args):
    import jax

    x, beta = args[0], args[1]
    fs, s_only = EXP_TARGETS[name]
    s_shape = jax.ShapeDtypeStruct(beta.shape, x.dtype)
    if field:
        return jax.ffi.ffi_call(fs, (jax.ShapeDtypeStruct(x.shape, x.dtype), s_shape))(*args)
    return jax.ffi.ffi_call(s_only, s_shape)(*args)


@functools.cache
def _partitioned_call(name: str, field: bool, mode: str):
    """The FFI call with a sharding rule: batch axes as the input's, ``n`` and ``d`` replicated
    (``mode``: no gauge, a shared ``(n, d, d)`` gauge, replicated, or a batched one)."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import NamedSharding, PartitionSpec

    def call(*args):
        return _local_call(name, field, *args)

    def shardings(mesh, arg_shapes):
        xs = arg_shapes[0]
        batch_rank = len(xs.shape) - 2
        sh = xs.sharding
        spec = tuple(sh.spec)[:batch_rank] if isinstance(sh, NamedSharding) else ()
        spec = spec + (None,) * (batch_rank - len(spec))
        mesh = sh.mesh if isinstance(sh, NamedSharding) else mesh
        x_sh = NamedSharding(mesh, PartitionSpec(*spec, None, None))
        b_sh = NamedSharding(mesh, PartitionSpec(*spec))
        g_sh = {"none": (), "shared": (NamedSharding(mesh, PartitionSpec()),),
                "batched": (NamedSharding(mesh, PartitionSpec(*spec, None, None, None)),)}[mode]
        return x_sh, b_sh, g_sh

    def infer(mesh, arg_shapes, result_shape):
        x_sh, b_sh, _ = shardings(mesh, arg_shapes)
        return (x_sh, b_sh) if field else b_sh

    def partition(mesh, arg_shapes, result_shape):
        x_sh, b_sh, g_sh = shardings(mesh, arg_shapes)
        return mesh, call, ((x_sh, b_sh) if field else b_sh), (x_sh, b_sh, *g_sh)

    wrapped = custom_partitioning(call)
    g_rule = {"none": "", "shared": ", n d e", "batched": ", ... n d e"}[mode]
    rule = f"... n d, ...{g_rule} -> " + ("... n d, ..." if field else "...")
    wrapped.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                          need_replication_factors=("n", "d") if mode == "none" else ("n", "d", "e"))
    return wrapped
