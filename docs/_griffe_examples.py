"""Griffe extension of the documentation site (mkdocs.yml: mkdocstrings ``extensions``).

meanfield's docstrings title their doctest section ``Example:`` (Google style allows it); griffe's
Google parser knows only ``Examples:`` as the examples section and would render ``Example:`` as
an admonition whose ``>>>`` lines read as nested quotes. This extension renames the title
before parsing, so the examples render as Python console blocks. The docstrings themselves, and
``help()``, are unchanged.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_TITLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """``Example:`` section titles read as ``Examples:``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub(r"\1Examples:", obj.docstring.value)
