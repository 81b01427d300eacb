"""A stand-in experiment for ``tests/test_reproduce_streaming.py`` that runs until the test writes
``out_dir/release`` (at most ``FAKE_WAIT_S`` seconds), with a progress bar as the real ones have; it
records whether it was released and whether its bar was drawn (``quiet`` false)."""

import os
import time

from meanfield.reproduce._common import check, progress, write_summary


def run(out_dir, *, quick=False, quiet=False, **options):
    release = out_dir / "release"
    deadline = time.monotonic() + float(os.environ.get("FAKE_WAIT_S", "60"))
    with progress(total=1, desc="long", disable=quiet) as bar:
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        bar.update()
    return write_summary(
        out_dir / "long",
        "long",
        quick=quick,
        settings={"released": release.exists(), "bars": not quiet},
        checks=[check("long", 1.0, 1.0)],
    )
