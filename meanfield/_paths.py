"""meanfield's cache directory and the check of its output files, with no import beyond the
standard library (no JAX, no NumPy): the cache directory is read by ``meanfield._native`` (the
native kernels) and ``meanfield.compilation_cache`` (JAX's persistent compilation cache, in its
``xla`` subdirectory), which must run before JAX is imported; ``output_problem``,
``check_output`` and ``open_output`` are the one rule of which paths meanfield writes: a regular
file or a new one, never a FIFO, socket, device or directory (opening a FIFO to write blocks
until a reader comes: forever, for a command nobody reads)."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

__all__ = [
    "cache_root",
    "ownership_problem",
    "open_parent",
    "output_problem",
    "check_output",
    "open_output",
    "write_output",
    "special_file_under",
]


def cache_root() -> Path:
    """``$MEANFIELD_CACHE_DIR``, else ``$XDG_CACHE_HOME/meanfield`` or ``~/.cache/meanfield``."""
    if os.environ.get("MEANFIELD_CACHE_DIR"):
        return Path(os.environ["MEANFIELD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meanfield"


def ownership_problem(path: Path, st: os.stat_result) -> tuple[str, str] | None:
    """Why ``path`` (status ``st``) is not private to this user, and the fix: ``None`` when it is
    owned by this user and not writable by group or others (always on a system without owners).
    Anyone who can write a cache could make meanfield load their code or programs."""
    if not hasattr(os, "geteuid"):  # not POSIX: no owners to check
        return None
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})", "remove it"
    if st.st_mode & 0o022:
        return (
            f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})",
            f"chmod go-w {path}",
        )
    return None


def open_parent(path: Path) -> tuple[Path, int] | None:
    """The first directory above ``path`` writable by others without the sticky bit, with its
    mode (whoever can write there can put their own cache in place of ours; ``/tmp``'s 1777 is
    fine, and so is a group-writable parent: many home directories are writable by their
    owner's private group); ``None`` when there is none."""
    if not hasattr(os, "geteuid"):
        return None
    for parent in path.parents:
        try:
            st = os.stat(parent)
        except OSError:
            continue
        if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            return parent, stat.S_IMODE(st.st_mode)
    return None


def output_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not a file meanfield may write, or ``None`` when it may: it exists and is a
    regular file (a symbolic link is followed), or it does not exist and its directory does (a
    link to a missing file: its target's directory).

    Nothing here blocks: an existing path is first looked at with ``stat`` (a FIFO, socket,
    device or directory is refused without being opened: opening a FIFO to write waits for a
    reader, forever), then opened without blocking (``O_NONBLOCK``) and without truncating it,
    to learn whether it can be written; a file the probe created is removed again.

    Example:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     os.mkfifo(os.path.join(d, "fifo.json"))
        ...     for name in ("new.json", "fifo.json", "."):
        ...         print(name, output_problem(os.path.join(d, name)))
        new.json None
        fifo.json a FIFO, not a regular file
        . a directory, not a regular file
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return e.strerror or type(e).__name__
    if st is not None and not stat.S_ISREG(st.st_mode):
        return f"{_file_kind(st.st_mode)}, not a regular file"
    if st is None and os.path.islink(p):  # a link to a missing file: writing creates its target
        target = os.path.realpath(p)
        return None if target == p else output_problem(target)
    flags = os.O_WRONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if st is None:
        flags |= os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(p, flags, 0o666)
    except FileExistsError:  # created by another process since the stat
        return "created by another process meanwhile"
    except OSError as e:
        return e.strerror or type(e).__name__
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    if st is None:
        try:
            os.unlink(p)
        except OSError:
            pass
    if not stat.S_ISREG(mode):  # replaced between the stat and the open
        return f"{_file_kind(mode)}, not a regular file"
    return None


def check_output(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a ``Path`` where ``output_problem`` finds nothing wrong, else ``ValueError``:
    ``"{what} {path!r} cannot be written ({why})"`` (one line). Every output file of the command
    line goes through it before any work is done.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     check_output(d, "--out file")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: --out file '...' cannot be written (a directory, not a regular file)
    """
    why = output_problem(path)
    if why is not None:
        raise ValueError(f"{what} {os.fspath(path)!r} cannot be written ({why})")
    return Path(path)


def open_output(path: str | os.PathLike[str], what: str) -> io.BufferedWriter:
    """``path`` opened to write (binary, truncated), refusing what is not a regular file without
    blocking on it (``ValueError`` as ``check_output``): the file is opened with ``O_NONBLOCK``
    and checked with ``fstat`` before it is truncated, so a FIFO or device put in its place after
    ``check_output`` is refused rather than waited on."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"{what} {p!r} cannot be written ({_file_kind(st.st_mode)}, not a regular file)"
        )
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(p, flags | getattr(os, "O_BINARY", 0), 0o666)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(
                f"{what} {p!r} cannot be written ({_file_kind(mode)}, not a regular file)"
            )
        os.ftruncate(fd, 0)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def write_output(path: str | os.PathLike[str], text: str, what: str) -> None:
    """``text`` written (UTF-8) to ``path`` through ``open_output``: a FIFO, device or directory in
    its place is one ``ValueError``, never a wait (the plain ``Path.write_text`` of a FIFO blocks
    until a reader comes)."""
    with open_output(path, what) as f:
        f.write(text.encode("utf-8"))


def special_file_under(directory: str | os.PathLike[str]) -> tuple[str, str] | None:
    """The first entry under ``directory`` (walked without following links to directories) that
    is neither a regular file nor a directory, links followed (a FIFO, socket or device, or a link
    to one), as ``(path, what it is)``; ``None`` when there is none. For a command that writes
    many files under one directory (``meanfield reproduce``): refused before it starts rather
    than blocked on one of them.

    Example:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     os.makedirs(os.path.join(d, "depth"))
        ...     os.mkfifo(os.path.join(d, "depth", "summary.json"))
        ...     path, kind = special_file_under(d)
        ...     os.path.relpath(path, d), kind
        ('depth/summary.json', 'a FIFO')
    """
    for root, dirs, files in os.walk(directory):
        for name in sorted(dirs) + sorted(files):
            p = os.path.join(root, name)
            try:
                mode = os.stat(p).st_mode
            except OSError:  # a dangling link: writing it creates its target
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return p, _file_kind(mode)
    return None


def _file_kind(mode: int) -> str:
    """``"a FIFO"``, ``"a directory"``, ... : what a non-regular file is, for a message."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"
