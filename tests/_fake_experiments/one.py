import os

from . import body


def run(out_dir, *, quick=False, quiet=False, **options):
    return body("one", out_dir, quick, wait_s=float(os.environ.get("FAKE_WAIT_S", "60")))
