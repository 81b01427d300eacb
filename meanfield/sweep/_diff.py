"""Keys where two nested dictionaries differ (shared by the spec and the store; imports nothing)."""

from __future__ import annotations

__all__ = ["key_differences"]


def key_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys where two nested dictionaries differ, sorted.

    Example:
        >>> key_differences({"grid": {"n": [8], "seeds": 2}}, {"grid": {"n": [8], "seeds": 3}, "x": 1})
        ['grid.seeds', 'x']
    """
    diffs = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        name = f"{prefix}{k}"
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs += key_differences(va, vb, name + ".")
        elif va != vb:
            diffs.append(name)
    return diffs
