"""meanfield's cache directory, with no import beyond the standard library (no JAX, no NumPy):
read by ``meanfield._native`` (the native kernels) and ``meanfield.compilation_cache`` (JAX's
persistent compilation cache, in its ``xla`` subdirectory), which must run before JAX is imported."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["cache_root", "ownership_problem", "open_parent"]


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
