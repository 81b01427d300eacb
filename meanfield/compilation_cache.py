"""JAX's persistent compilation cache, in meanfield's cache directory.

A fresh process spends most of a small run compiling (``meanfield simulate`` with its defaults:
seconds of compilation for a fraction of a second of integration). JAX can keep compiled programs
on disk and load them in the next process, but it refuses to write a program that contains a
host callback, and every ``equinox.error_if`` check (meanfield's in-program checks of traced
values, diffrax's own checks of ``ts`` and ``dt0``) is one under equinox's default
``EQX_ON_ERROR=raise``. With ``EQX_ON_ERROR=nan`` in the environment before equinox is
imported, a check is no callback: a failed check turns the checked value into NaN (the run ends
non-finite: a ``Trajectory`` with ``failed`` set, a sweep point recorded as failed) instead of
raising, and the programs can be cached. Under ``vmap`` equinox reduces a check's condition over
the batch, so one bad value marks every run of that call as failed (as a raised error stops the
whole call).

meanfield's own processes (the ``meanfield`` command, ``python -m meanfield``,
``python -m meanfield.sweep``) call ``configure_process()`` before JAX is imported: it sets
``EQX_ON_ERROR=nan`` and points JAX's cache at ``cache_dir()``, through environment variables
(``JAX_COMPILATION_CACHE_DIR``, ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``,
``JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0``), each only where the user has not set it (a
user's own setting wins; they are inherited by the processes a sweep starts). ``import
meanfield`` sets nothing: a notebook or script opts in with ``enable()``.

The cache holds executables this process loads, so its directory follows the native kernel
cache's rules (``meanfield._native``): ``cache_dir()`` and the meanfield cache directory above it
are created with mode 0700 and used only when owned by this user and not writable by group or
others, under parents not writable by others (unless sticky, as ``/tmp``). Otherwise, or when
the directory cannot be created, ``configure_process()`` prints one line on stderr
(``meanfield: compilation cache off: <reason>``) and the process runs without the cache.

Environment: ``MEANFIELD_COMPILATION_CACHE=0`` (or ``false``, ``no``, ``off``) turns it off
(``configure_process()`` then sets nothing, ``EQX_ON_ERROR`` included, and ``enable()`` returns
``None``); ``MEANFIELD_CACHE_DIR`` moves it with the native kernels (``$MEANFIELD_CACHE_DIR/xla``).
``meanfield info`` shows the cache and ``meanfield info --clear-cache`` empties it.

This module imports no JAX (nor NumPy) at import time.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from ._paths import cache_root, open_parent, ownership_problem

__all__ = [
    "cache_dir",
    "disabled",
    "configure_process",
    "enable",
    "info",
    "clear",
    "CacheRefused",
    "ENV_SWITCH",
    "JAX_ENV",
]

#: the environment variable that turns the cache off (``0``, ``false``, ``no`` or ``off``)
ENV_SWITCH = "MEANFIELD_COMPILATION_CACHE"
_OFF = ("0", "false", "no", "off")
#: what ``configure_process()`` sets (with ``setdefault``) for JAX to read at its import; the
#: directory is added when it passes its checks
JAX_ENV = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
_SUFFIX = "-cache"  # JAX's LRU cache: one KEY-cache file per entry (and a KEY-atime beside it)
_HINT = "or set MEANFIELD_CACHE_DIR to a private directory"


class CacheRefused(ValueError):
    """A compilation cache directory that is not private to this user, or cannot be created:
    never used (the message names the path and the fix)."""


def cache_dir() -> Path:
    """Where the cache lives: ``xla`` in meanfield's cache directory (``$MEANFIELD_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/meanfield`` or ``~/.cache/meanfield``), beside the native kernels.

    Example:
        >>> from meanfield import compilation_cache
        >>> compilation_cache.cache_dir().name
        'xla'
    """
    return cache_root() / "xla"


def disabled() -> bool:
    """True when ``MEANFIELD_COMPILATION_CACHE`` is ``0``, ``false``, ``no`` or ``off`` (any case)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() in _OFF


def _check_private(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise CacheRefused(f"{path} is not a directory; fix: remove it, {_HINT}")
    problem = ownership_problem(path, st)
    if problem is not None:
        raise CacheRefused(f"{path} is {problem[0]}; fix: {problem[1]}, {_HINT}")


def _check_parents(path: Path) -> None:
    """A parent writable by others without the sticky bit lets anyone put their own cache in
    place of ours (``meanfield._paths.open_parent``: the native kernels' rule)."""
    found = open_parent(path)
    if found is not None:
        parent, mode = found
        raise CacheRefused(
            f"{path}: its parent {parent} is writable by others without the sticky bit "
            f"(mode {mode:o}); fix: chmod o-w {parent}, {_HINT}"
        )


def _checked_dir(path: Path, *, create: bool, private_parent: bool) -> Path:
    """``path`` with symbolic links resolved (what is checked is what JAX reads), created with
    mode 0700 if missing and ``create`` (its parent too, when ``private_parent``: meanfield's
    cache directory); ``CacheRefused`` unless it (and that parent) is private to this user.
    With ``create=False`` a missing directory is not an error (what exists above it is checked)."""
    real = Path(os.path.realpath(path))
    if create:
        try:
            if private_parent:
                os.makedirs(real.parent, mode=0o700, exist_ok=True)
            os.makedirs(real, mode=0o700, exist_ok=True)
        except FileExistsError:  # something else in its place: refused below
            pass
        except OSError as e:
            raise CacheRefused(f"cannot create {real}: {e.strerror}; {_HINT}") from None
    for where in (real, real.parent) if private_parent else (real,):
        try:
            st = os.stat(where)
        except FileNotFoundError:
            if create:
                raise CacheRefused(f"{where} vanished after it was created; {_HINT}") from None
            continue
        except OSError as e:
            raise CacheRefused(f"cannot read {where}: {e.strerror}; {_HINT}") from None
        _check_private(where, st)
    _check_parents(real)
    return real


def _warn(reason: object) -> None:
    print(f"meanfield: compilation cache off: {reason}", file=sys.stderr)


def configure_process() -> None:
    """Set up a meanfield-owned process (the ``meanfield`` command, ``python -m meanfield``,
    ``python -m meanfield.sweep``); call it before JAX and equinox are imported.

    Unless ``disabled()``: ``EQX_ON_ERROR=nan`` (in-program checks become NaN outputs, which a
    run records as failed, instead of host callbacks that raise: programs with callbacks are
    never cached), and JAX's persistent cache in ``cache_dir()`` with no minimum compile time or
    entry size, all through environment variables that JAX reads at import and only where the
    user has not set them. A directory that is refused or cannot be created: one line on stderr
    (``meanfield: compilation cache off: <reason>``) and the process runs without the cache. If
    JAX is already imported, the cache is set through ``jax.config`` (``enable()``) unless a
    cache directory is already configured; ``EQX_ON_ERROR`` then applies only if equinox is
    not imported yet. Library code never calls this.
    """
    if disabled():
        return
    os.environ.setdefault("EQX_ON_ERROR", "nan")
    if "jax" in sys.modules:
        import jax

        if getattr(jax.config, "jax_compilation_cache_dir", None):  # the user's own cache
            return
        try:
            enable()
        except CacheRefused as e:
            _warn(e)
        return
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        try:
            path = _checked_dir(cache_dir(), create=True, private_parent=True)
        except CacheRefused as e:
            _warn(e)
            return
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)
    for key, value in JAX_ENV.items():
        os.environ.setdefault(key, value)


def enable(path: object = None) -> Path | None:
    """Turn JAX's persistent compilation cache on in this process (the opt-in for notebooks and
    scripts; ``import meanfield`` never does it): ``path`` (default ``cache_dir()``), checked
    like the native kernel cache (created with mode 0700; refused unless owned by this user and
    not writable by group or others), set as ``jax_compilation_cache_dir`` with no minimum
    compile time or entry size. Returns the directory (symbolic links resolved), or ``None``
    when ``MEANFIELD_COMPILATION_CACHE=0``.

    Only programs without host callbacks are written to the cache, and every in-program check
    of meanfield and diffrax (``equinox.error_if``) is a host callback unless ``EQX_ON_ERROR=nan``
    is in the environment before equinox is first imported (``import meanfield`` imports it):
    set it in the shell, or ``os.environ["EQX_ON_ERROR"] = "nan"`` before any import. That is a
    trade: a failed in-program check (a traced ``beta <= 0``, states off the sphere, Prompt labels
    out of range, ...) then gives NaN outputs, recorded as a failed run (``Trajectory.failed``, a
    failed sweep point), instead of raising an error that names the check. Checks of concrete
    values (before the program runs) raise either way. Without it, ``enable()`` caches only the
    programs with no checks.

    Raises ``CacheRefused`` (a ``ValueError``) for a directory that is refused or cannot be
    created, ``TypeError`` for a ``path`` that is not a string or path.

    Example:
        >>> import os, tempfile
        >>> from meanfield import compilation_cache
        >>> d = tempfile.mkdtemp()
        >>> compilation_cache.enable(os.path.join(d, "xla")).name
        'xla'
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"path must be a str or os.PathLike (a directory), got {path!r} of type "
            f"{type(path).__name__}"
        )
    if path is not None and not os.fspath(path):
        raise ValueError("path must name a directory, got ''")
    if disabled():
        return None
    target = cache_dir() if path is None else Path(os.fspath(path))
    real = _checked_dir(target, create=True, private_parent=path is None)
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    jax.config.update("jax_compilation_cache_dir", str(real))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax_cache.reset_cache()  # a process that compiled before reads the new setting at its next compile
    return real


def _eqx_on_error() -> str:
    """equinox's error mode in this process: as imported, else as the environment will make it."""
    cfg = sys.modules.get("equinox._config")
    if cfg is not None:
        return str(getattr(cfg, "EQX_ON_ERROR", "raise"))
    return os.environ.get("EQX_ON_ERROR", "raise")


def _contents(real: Path) -> tuple[int, int]:
    """``(entries, bytes)`` of the cache directory (subdirectories included, links not followed)."""
    entries = size = 0
    for root, _dirs, files in os.walk(real):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:  # removed meanwhile
                continue
            size += st.st_size
            entries += root == str(real) and name.endswith(_SUFFIX)
    return entries, size


def info() -> dict[str, Any]:
    """The cache as a dictionary (JSON-serialisable): ``enabled`` (meanfield's processes use it:
    not ``disabled()`` and the directory not refused), ``dir`` (``cache_dir()``), ``entries``
    (compiled programs stored), ``bytes`` (their size on disk), ``eqx_on_error`` (equinox's
    error mode in this process: ``nan`` where checks can be cached) and ``problem`` (why the
    directory is refused; ``None`` when it is fine or not created yet). Creates nothing.

    Example:
        >>> from meanfield import compilation_cache
        >>> sorted(compilation_cache.info())
        ['bytes', 'dir', 'enabled', 'entries', 'eqx_on_error', 'problem']
    """
    path = cache_dir()
    problem = None
    try:
        real = _checked_dir(path, create=False, private_parent=True)
    except CacheRefused as e:
        problem, real = str(e), Path(os.path.realpath(path))
    entries, size = _contents(real) if real.is_dir() else (0, 0)
    return {
        "enabled": not disabled() and problem is None,
        "dir": str(path),
        "entries": entries,
        "bytes": size,
        "eqx_on_error": _eqx_on_error(),
        "problem": problem,
    }


def clear() -> int:
    """Remove everything in ``cache_dir()`` (the compiled programs, not the native kernels, which
    live in the directory above); returns how many entries (compiled programs) were removed.
    A missing directory: 0. ``OSError`` when a file cannot be removed.

    Example:
        >>> from meanfield import compilation_cache
        >>> compilation_cache.clear() >= 0
        True
    """
    real = Path(os.path.realpath(cache_dir()))
    if not real.is_dir():
        return 0
    removed = 0
    for entry in os.scandir(real):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
            continue
        try:
            os.unlink(entry.path)
        except FileNotFoundError:  # another process evicted it
            continue
        removed += entry.name.endswith(_SUFFIX)
    return removed
