"""meanfield's cache directory, with no import beyond the standard library (no JAX, no NumPy):
read by ``meanfield._native`` (the native kernels) and ``meanfield.compilation_cache`` (JAX's
persistent compilation cache, in its ``xla`` subdirectory), which must run before JAX is imported."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$MEANFIELD_CACHE_DIR``, else ``$XDG_CACHE_HOME/meanfield`` or ``~/.cache/meanfield``."""
    if os.environ.get("MEANFIELD_CACHE_DIR"):
        return Path(os.environ["MEANFIELD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meanfield"
