"""The machine's memory and the refusal a run past it gets (shared by ``_resources`` and the models).

A module of its own so that ``meanfield.kernels`` can refuse a configuration by memory without
importing ``meanfield._resources`` (which reads the kernels' dense/tiled rule: no import cycle).
"""

from __future__ import annotations

import os

__all__ = ["ResourceLimitError", "check_memory", "format_bytes", "machine_memory"]

_HUGE = 1e300  # cap of float estimates turned into ints (int(inf) raises)


class ResourceLimitError(ValueError):
    """A run refused before it starts: its estimated memory or work exceeds the limits.

    A ``ValueError``, so the CLI reports it as one line with exit status 2.
    """


def format_bytes(b: int | float) -> str:
    """``"745 GiB"``-style size (binary units), safe for huge values.

    Example:
        >>> format_bytes(3 * 2**30), format_bytes(512)
        ('3 GiB', '512 B')
    """
    b = float(min(b, _HUGE))
    for unit, f in (
        ("PiB", 2.0**50),
        ("TiB", 2.0**40),
        ("GiB", 2.0**30),
        ("MiB", 2.0**20),
        ("KiB", 2.0**10),
    ):
        if b >= f:
            return f"{b / f:.3g} {unit}" if b / f < 1e6 else f"{b / f:.2g} {unit}"
    return f"{int(b)} B"


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:  # "max": no limit
        return None


def _cgroup_limit() -> tuple[int | None, int | None]:
    """``(limit, usage)`` of this process's memory cgroup (v2, then v1), ``None`` when unlimited."""
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        limit = _read_int(limit_path)
        if limit is not None and limit < 2**60:  # v1 reports "no limit" as a huge number
            return limit, _read_int(usage_path)
    return None, None


def machine_memory(*, total: bool = False) -> int:
    """Bytes of memory this process can use: available now (default) or in total.

    ``total=False``: ``MemAvailable`` of ``/proc/meminfo`` (physical memory from
    ``os.sysconf`` where there is no ``/proc``), or what remains under the cgroup memory limit
    when that is smaller. ``total=True``: physical memory, or the cgroup limit when smaller.

    Example:
        >>> machine_memory() <= machine_memory(total=True)
        True
    """
    phys: int | None
    try:
        phys = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        phys = None
    phys = _meminfo("MemTotal") or phys
    limit, usage = _cgroup_limit()
    if total:
        values = [v for v in (phys, limit) if v]
    else:
        avail = _meminfo("MemAvailable") or phys
        values = [v for v in (avail, (limit - (usage or 0)) if limit else None, phys) if v]
    return int(min(values)) if values else 2**63 - 1


def check_memory(what: str, need: float, fix: str) -> None:
    """Refuse, before allocating, work whose estimated memory ``need`` (bytes) exceeds what this
    machine has available (``machine_memory``): one-line ``ResourceLimitError`` (a ``ValueError``)
    naming ``what`` (the argument and its value), the estimate and the limit, then ``fix``."""
    avail = machine_memory()
    if not need <= avail:
        raise ResourceLimitError(
            f"{what} needs ~{format_bytes(need)} of memory, more than the {format_bytes(avail)} "
            f"available; {fix}"
        )
