"""Execute the example notebooks in place, and check that their stored outputs are current.

``python -m meanfield.notebooks --execute`` runs every ``notebooks/*.ipynb`` of the current
directory (or the notebooks given as arguments) top to bottom in a fresh Jupyter kernel
(``nbclient``, kernel ``python3``) and writes each back with its outputs: text, and every figure
as a PNG image (matplotlib's inline backend; ``MPLBACKEND`` is removed from the kernel's
environment so that a CI setting such as ``MPLBACKEND=Agg`` cannot hide the figures). The
notebook's metadata then records ``meanfield.source_sha256``, the SHA-256 of its code cells
(``source_hash``): outputs are *stale* when that hash differs from the hash of the current code,
whatever the numbers in them (numeric noise between runs never counts).
``python -m meanfield.notebooks --check`` reports stale, unexecuted or failed notebooks (exit
status 1) without running anything.

An edge module: nothing in the core imports it, and it needs the ``test`` extra (``nbclient``,
``nbformat``, ``ipykernel``), imported when a function runs.

Example:
    >>> from meanfield import notebooks
    >>> notebooks.source_hash({"cells": [{"cell_type": "code", "source": "1 + 1"}]})[:12]
    '0964994e28a0'
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "METADATA_KEY",
    "WIDGET_PLACEHOLDER",
    "source_hash",
    "image_count",
    "error_outputs",
    "problems",
    "execute",
    "find_notebooks",
    "main",
]

#: key of the notebook-level metadata written by ``execute`` (``{"source_sha256": ...}``)
METADATA_KEY = "meanfield"

_IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: the text stored for a widget's output (shown where no widget manager runs: code hosts, the site)
WIDGET_PLACEHOLDER = "[interactive ipywidgets panel: run the notebook in Jupyter to use it]"


def _source(cell: Mapping[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def source_hash(nb: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the notebook's code: the source of every code cell, in order.

    Markdown cells and outputs do not enter it, so editing prose or re-running with different
    rounding leaves it unchanged; any change of code changes it. Each cell's source has its
    trailing whitespace stripped and is length-prefixed, so cell boundaries count.
    """
    h = hashlib.sha256()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = _source(cell).rstrip().encode()
            h.update(f"{len(src)}:".encode() + src)
    return h.hexdigest()


def image_count(nb: Mapping[str, Any]) -> int:
    """Number of image outputs (PNG, JPEG or SVG) over the notebook's code cells."""
    return sum(
        1
        for cell in nb.get("cells", [])
        if cell.get("cell_type") == "code"
        for out in cell.get("outputs", [])
        if any(t in out.get("data", {}) for t in _IMAGE_TYPES)
    )


def error_outputs(nb: Mapping[str, Any]) -> list[str]:
    """``"ename: evalue"`` of every error output stored in the notebook."""
    return [
        f"{out.get('ename', '?')}: {out.get('evalue', '')}"
        for cell in nb.get("cells", [])
        if cell.get("cell_type") == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]


def problems(nb: Mapping[str, Any]) -> list[str]:
    """What is wrong with a notebook's *stored* outputs (empty when they are current).

    Outputs are current when the notebook was written by ``execute`` from its present code
    (``metadata.meanfield.source_sha256 == source_hash(nb)``), every code cell ran, no output
    is an error and at least one figure was stored.
    """
    found = []
    stored = nb.get("metadata", {}).get(METADATA_KEY, {}).get("source_sha256")
    if stored is None:
        found.append("never executed by `python -m meanfield.notebooks --execute`")
    elif stored != source_hash(nb):
        found.append("stale outputs: the code changed since they were stored")
    unrun = [
        i
        for i, c in enumerate(nb.get("cells", []))
        if c.get("cell_type") == "code" and _source(c).strip() and c.get("execution_count") is None
    ]
    if unrun:
        found.append(f"code cells without outputs from a run: {unrun}")
    found += [f"error output {e}" for e in error_outputs(nb)]
    if image_count(nb) == 0:
        found.append("no figure among the outputs")
    return found


def _kernel_env() -> dict[str, str]:
    # Without MPLBACKEND, ipykernel selects matplotlib's inline backend (figures as images).
    return {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}


_POLL_S = 1.0  # longest single wait on a kernel channel (see _client_class)


def _chunked(get_msg: Any) -> Any:
    """``get_msg`` that waits in slices of at most ``_POLL_S`` seconds up to ``timeout``.

    One long ``socket.poll`` of jupyter_client's async channels can miss a message that arrived
    while it waited (zmq's edge-triggered descriptor; jupyter/nbclient#312): a widget cell's
    ``execute_reply`` was then found only when the cell's whole timeout ran out (600 s). A new
    poll sees a message already queued, so short polls find it at once.
    """
    from queue import Empty

    async def get(timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            try:
                return await get_msg(timeout=max(0.0, left))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return get


def _client_class(base: Any) -> Any:
    """``nbclient.NotebookClient`` whose kernel client polls its shell and IOPub channels in
    short slices (``_chunked``); nothing else changes."""

    class _Client(base):  # type: ignore[misc, valid-type]
        async def async_start_new_kernel_client(self) -> Any:
            kc = await super().async_start_new_kernel_client()
            for channel in (kc.shell_channel, kc.iopub_channel):
                channel.get_msg = _chunked(channel.get_msg)
            return kc

    return _Client


def execute(
    path: str | os.PathLike, *, write: bool = True, timeout: int = 600, kernel_name: str = "python3"
) -> Any:
    """Run the notebook at ``path`` top to bottom in a fresh kernel; return it with its outputs.

    The kernel starts in the notebook's directory, without ``MPLBACKEND`` in its environment
    (so figures are stored as PNG images). With ``write=True`` the notebook is written back in
    place, with ``metadata.meanfield.source_sha256 = source_hash(nb)``; no timing or widget
    state is stored (a widget's output keeps its view and, as text, ``WIDGET_PLACEHOLDER``), so
    re-executing unchanged code changes only numbers, images and widget ids.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        nbclient.exceptions.CellExecutionError: a cell raised (nothing is written).
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no notebook at {str(path)!r}")
    nb = nbformat.read(path, as_version=4)
    client = _client_class(NotebookClient)(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(path.resolve().parent)}},
        record_timing=False,
        store_widget_state=True,  # (False fails on Output widgets in nbclient 0.11)
    )
    client.execute(env=_kernel_env())
    nb.metadata.pop("widgets", None)  # live widgets need a kernel: no stale state on disk
    for cell in nb.cells:  # what a page without a live kernel shows for a widget
        for out in cell.get("outputs", []):
            if _WIDGET_VIEW in out.get("data", {}):
                out["data"]["text/plain"] = WIDGET_PLACEHOLDER
    nb.metadata[METADATA_KEY] = {"source_sha256": source_hash(nb)}
    if write:
        nbformat.write(nb, path)
    return nb


def find_notebooks(root: str | os.PathLike = ".") -> list[Path]:
    """The notebooks ``root/notebooks/*.ipynb``, sorted (``FileNotFoundError`` if none)."""
    found = sorted((Path(root) / "notebooks").glob("*.ipynb"))
    if not found:
        raise FileNotFoundError(
            f"no notebooks/*.ipynb under {str(Path(root).resolve())!r}; run from the repository "
            "root or name the notebooks"
        )
    return found


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line on stderr, exit status 2 (no usage block)
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m meanfield.notebooks (--execute | --check) [NOTEBOOK ...]``.

    Exit status 0 when every notebook ran (``--execute``) or is current (``--check``), 1 when
    one failed or is stale, 2 for a usage error (one line on stderr).
    """
    p = _Parser(
        prog="python -m meanfield.notebooks",
        description="Re-execute the notebooks in place with their outputs, or check that the "
        "stored outputs are current.",
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--execute", action="store_true", help="run each notebook and write it back")
    mode.add_argument("--check", action="store_true", help="report stale or unexecuted notebooks")
    p.add_argument("notebooks", nargs="*", help="notebook files (default: notebooks/*.ipynb)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = p.parse_args(argv)
    if args.timeout <= 0:
        print(f"error: --timeout must be > 0, got {args.timeout}", file=sys.stderr)
        return 2
    try:
        paths = [Path(a) for a in args.notebooks] or find_notebooks()
        for path in paths:
            if path.suffix != ".ipynb" or not path.is_file():
                raise FileNotFoundError(f"not a notebook file: {str(path)!r}")
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import nbformat

    status = 0
    for path in paths:
        if args.check:
            found = problems(nbformat.read(path, as_version=4))
            print(f"{path}: {'ok' if not found else '; '.join(found)}")
            status |= bool(found)
            continue
        t0 = time.perf_counter()
        try:
            nb = execute(path, timeout=args.timeout)
        except Exception as e:  # a failing cell: report it and go on with the others
            last = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            print(f"{path}: FAILED ({last})")
            status = 1
            continue
        size = path.stat().st_size / 1024
        print(f"{path}: {image_count(nb)} figures, {size:.0f} kB, {time.perf_counter() - t0:.0f} s")
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
