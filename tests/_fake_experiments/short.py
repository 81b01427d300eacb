"""A stand-in experiment for ``tests/test_reproduce_streaming.py`` that finishes at once."""

from meanfield.reproduce._common import check, write_summary


def run(out_dir, *, quick=False, quiet=False, **options):
    return write_summary(
        out_dir / "short", "short", quick=quick, settings={}, checks=[check("short", 1.0, 1.0)]
    )
