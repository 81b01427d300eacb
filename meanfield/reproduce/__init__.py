"""``meanfield reproduce``: one experiment per paper, theory beside every number.

Each experiment module exposes ``run(out_dir, *, quick=False, quiet=False, **options) -> dict``
which writes ``out_dir/<name>/`` (figures, data, ``summary.json``) and returns the summary.
"""

from __future__ import annotations

import importlib

__all__ = ["EXPERIMENTS", "PAPERS", "get"]

EXPERIMENTS: dict[str, str] = {
    "usa-av": "meanfield.reproduce.usa_av",
    "attention": "meanfield.reproduce.attention",
    "depth": "meanfield.reproduce.depth",
    "prototypes": "meanfield.reproduce.prototypes",
    "design": "meanfield.reproduce.design",
    "continuum": "meanfield.reproduce.continuum",
    "metastability": "meanfield.reproduce.metastability",
}

#: The reproductions that ``meanfield reproduce`` (no name) runs and reports: the four papers and
#: the mean-field limit they share (``continuum``, MATH.md Sec. 5).
PAPERS: tuple[str, ...] = ("usa-av", "attention", "depth", "prototypes", "continuum")


def get(name: str):
    """The experiment module for ``name`` (one of ``EXPERIMENTS``)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; accepted: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[name])
