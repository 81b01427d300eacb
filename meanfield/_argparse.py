"""The argument parser of every ``meanfield`` command: errors are one line, exit status 2."""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["OneLineParser"]


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are ONE line on stderr (``prog: error: message``, no usage dump)
    and exit status 2; ``meanfield.cli.main`` turns the exit into its return value."""

    def error(self, message: str) -> NoReturn:
        first = (
            str(message).strip().splitlines()[0] if str(message).strip() else "invalid arguments"
        )
        self.exit(2, f"{self.prog}: error: {first}\n")
