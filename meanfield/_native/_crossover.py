"""The crossover of a native kernel: where it was measured faster than the XLA formulation it
replaces, on this machine. Shared by the exp kernel (``_exp``) and the phase-diagram kernel
(``_phase``): each has a ``Plan`` (its shapes, the recipe of its record, how it times the two
paths), and ``Plan.obtain`` reads the record beside the kernel's library or measures it and
writes it there.

A measurement times both paths at a few shapes: ``n`` in ``Plan.ns`` at ``d = Plan.n_axis_d``,
and ``d`` in ``Plan.ds`` at ``n = Plan.d_axis_n``; at each shape the median of ``reps`` calls of
each, alternated (``alternate``) so that a change of the machine's load hits both. The rule
(``Plan.rule``, ``Crossover``) keeps, along each axis, the measured range where the kernel won at
every measured point: from ``min_n`` up in ``n`` and up to ``max_d`` in ``d``. The record
(``NAME.crossover.json`` beside the library, written atomically; a read-only cache keeps it for
the process) holds the recipe, the times and how long the measurement took; a record of another
recipe is measured again, and ``meanfield info --rebuild-native`` removes it with the library.
No fixed rule tuned on another CPU.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ._cache import Crossover, RefusedPath, _json, _read_private, _write_atomic

#: the records this process found malformed and said so (one line each, then measured again)
_ignored: set[str] = set()

__all__ = ["Crossover", "Plan", "alternate"]


def alternate(
    kernel: Callable[[], object],
    xla: Callable[[], object],
    reps: int,
    stat: Callable[[list[float]], float] = statistics.median,
) -> list[float]:
    """``[kernel seconds, XLA seconds]``: ``stat`` (the median, or ``min``) of ``reps`` calls of
    each (each called once first, untimed: compilation, first touch), alternated so that a change
    of load hits both."""
    kernel()
    xla()
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(reps):
        for f, out in ((kernel, ta), (xla, tb)):
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)
    return [stat(ta), stat(tb)]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one kernel's crossover is measured and recorded.

    Attributes:
        recipe: what the record depends on besides the library (a record of another recipe is
            measured again).
        ns: ``n`` of the measurement at ``d = n_axis_d``, increasing.
        n_axis_d: ``d`` of the measurement over ``n``.
        ds: ``d`` of the measurement at ``n = d_axis_n``, increasing (``n_axis_d`` among them).
        d_axis_n: ``n`` of the measurement over ``d``.
        top_d: the kernel's largest ``d`` (``max_d`` when it won at every measured ``d``).
        unit: what one timed call is (``Crossover.unit``).

    Example:
        >>> from meanfield._native._crossover import Plan
        >>> plan = Plan("demo", ns=(8, 32), n_axis_d=2, ds=(2, 16), d_axis_n=32, top_d=64, unit="")
        >>> plan.shapes()
        [(8, 2), (32, 2), (32, 16)]
        >>> plan.rule({"8 x 2": [2.0, 1.0], "32 x 2": [1.0, 2.0], "32 x 16": [1.0, 2.0]})
        (64, 32)
    """

    recipe: str
    ns: tuple[int, ...]
    n_axis_d: int
    ds: tuple[int, ...]
    d_axis_n: int
    top_d: int
    unit: str

    def shapes(self) -> list[tuple[int, int]]:
        """The measured ``(n, d)``, each once: the ``n`` axis, then the rest of the ``d`` axis."""
        out = [(n, self.n_axis_d) for n in self.ns]
        out += [(self.d_axis_n, d) for d in self.ds if (self.d_axis_n, d) not in out]
        return out

    def rule(self, times: dict[str, list[float]]) -> tuple[int, int | None]:
        """``(max_d, min_n)`` of measured ``times`` (see ``Crossover``)."""
        faster = {key: a < b for key, (a, b) in times.items()}
        max_d = 0
        for d in self.ds:
            if not faster[f"{self.d_axis_n} x {d}"]:
                break
            max_d = d
        else:
            max_d = self.top_d
        min_n: int | None = None
        for n in reversed(self.ns):
            if not faster[f"{n} x {self.n_axis_d}"]:
                break
            min_n = n
        if min_n == self.ns[0]:
            min_n = 2
        return max_d, min_n

    def crossover(
        self, times: dict[str, list[float]], seconds: float, recorded: str | None
    ) -> Crossover:
        """The ``Crossover`` of measured ``times``."""
        return Crossover(*self.rule(times), times, seconds, recorded, self.unit)

    def read(self, path: Path) -> Crossover | None:
        """The crossover recorded at ``path``, or ``None`` (missing, unreadable, refused, another
        recipe or other shapes). A malformed record (not JSON, nested past the recursion limit,
        times that are not pairs of positive numbers, shapes other than ``shapes()``) is absent:
        one line on stderr, once per record and process, says it is measured again."""
        try:
            raw = _read_private(path, "crossover record")
        except (RefusedPath, RuntimeError):
            return None
        if raw is None:
            return None
        try:
            record = _json(raw)
            if record.get("recipe") != self.recipe:
                return None
            times = {str(k): [float(a), float(b)] for k, (a, b) in record["times"].items()}
            want = {f"{n} x {d}" for n, d in self.shapes()}
            if set(times) != want:
                raise ValueError(f"times of {sorted(times)[:4]}, not of {sorted(want)}")
            if not all(0 < t < float("inf") for pair in times.values() for t in pair):
                raise ValueError("times that are not positive finite seconds")
            return self.crossover(times, float(record["seconds"]), str(path))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if str(path) not in _ignored:
                _ignored.add(str(path))
                what = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                print(
                    f"meanfield: ignored the malformed crossover record {path} ({what}); "
                    "measuring the crossover again",
                    file=sys.stderr,
                    flush=True,
                )
            return None

    def obtain(
        self,
        path: Path | None,
        measure: Callable[[Sequence[tuple[int, int]]], dict[str, list[float]]],
    ) -> Crossover:
        """The crossover recorded at ``path``, else ``measure(self.shapes())`` now (on the CPU,
        eagerly even inside a trace) and recorded at ``path`` when its directory can be written.
        The caller holds the lock of its kernel's state and keeps the result."""
        found = None if path is None else self.read(path)
        if found is not None:
            return found
        import jax

        start = time.perf_counter()
        with (
            jax.ensure_compile_time_eval(),
            jax.default_device(jax.local_devices(backend="cpu")[0]),
        ):
            times = measure(self.shapes())
        seconds = time.perf_counter() - start
        recorded = None
        if path is not None:
            try:
                _write_atomic(
                    path,
                    json.dumps(
                        {"recipe": self.recipe, "times": times, "seconds": seconds}
                    ).encode(),
                )
                recorded = str(path)
            except OSError:  # a read-only cache directory: kept for this process
                pass
        return self.crossover(times, seconds, recorded)
