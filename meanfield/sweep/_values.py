"""Value checks of sweep specs shared by ``spec`` and ``_continuum`` (one-line errors)."""

from __future__ import annotations

import math

__all__: list[str] = []


def _unknown(table: str, got: dict, accepted) -> None:
    bad = sorted(set(got) - set(accepted))
    if bad:
        where = f"[{table}]" if table else "top level"
        raise ValueError(
            f"unknown key{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} in {where}; "
            f"accepted keys: {', '.join(accepted)}"
        )


def _is_num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _float(name: str, v, kind: str = "float") -> float:
    if not _is_num(v):
        raise TypeError(f"{name} must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v!r}")
    if kind == "float>0" and v <= 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    if kind == "float>=0" and v < 0:
        raise ValueError(f"{name} must be >= 0, got {v!r}")
    return v


def _int(name: str, v, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        hint = " (write it without a decimal point or exponent)" if isinstance(v, float) and v.is_integer() else ""
        raise TypeError(f"{name} must be an integer{hint}, got {v!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {v}")
    return int(v)
