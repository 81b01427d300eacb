"""The distribution's name: ``meanfield-transformers`` (``meanfield`` on PyPI is an unrelated
project), installing the package ``meanfield`` and the command ``meanfield``; the version the
package reports is the installed distribution's."""

import importlib.metadata
import tomllib
from pathlib import Path

import meanfield

ROOT = Path(__file__).resolve().parents[1]
NAME = "meanfield-transformers"


def _dist() -> importlib.metadata.Distribution:
    return importlib.metadata.distribution(NAME)


def test_pyproject_names_the_distribution():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == NAME
    assert meanfield._DISTRIBUTION == NAME
    # the package and the command keep their names
    assert project["scripts"] == {"meanfield": "meanfield.cli:main"}


def test_the_installed_distribution_is_this_one():
    dist = _dist()
    assert dist.metadata["Name"] == NAME
    assert (
        dist.version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    )
    scripts = [e for e in dist.entry_points if e.group == "console_scripts"]
    assert [(e.name, e.value) for e in scripts] == [("meanfield", "meanfield.cli:main")]


def test_version_is_the_metadata_version():
    assert meanfield.__version__ == importlib.metadata.version(NAME) == _dist().version
    assert meanfield.__version__ != "0.0.0"  # the fallback of a source tree without metadata
