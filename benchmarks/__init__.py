"""Benchmarks of meanfield against reference implementations (NumPy, plain JAX, PyTorch CPU).

Run ``python -m benchmarks`` (``--quick`` for a smoke run); it writes ``BENCHMARKS.md``.
Needs the ``bench`` extra (``torch``). Benchmarks are never tests: nothing here asserts a time.
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``, else ``"?"``."""
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu
