"""Experiments for ``tests/test_reproduce_jobs.py``: each records the process that ran it and whether
it ran while the other one was running (a two-stage file handshake, no timing), then writes its summary."""

from __future__ import annotations

import os
import time
from pathlib import Path

from meanfield.reproduce._common import check, write_summary

PEERS = {"one": "two", "two": "one"}


def body(name: str, out_dir, quick: bool, wait_s: float = 60.0) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    met = _handshake(out, "started", name, wait_s) and _handshake(out, "seen", name, wait_s)
    summary = write_summary(
        out / name,
        name,
        quick=quick,
        settings={"pid": os.getpid(), "met_peer": met},
        checks=[check(f"{name} check", 1.0, theory=1.0, tolerance=0.0)],
    )
    return summary


def _handshake(out: Path, stage: str, name: str, wait_s: float) -> bool:
    """Write ``stage-name`` and wait (at most ``wait_s``) for the peer's ``stage-peer``."""
    (out / f"{stage}-{name}").write_text(str(os.getpid()))
    peer = out / f"{stage}-{PEERS[name]}"
    deadline = time.monotonic() + wait_s
    while not peer.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return peer.exists()
