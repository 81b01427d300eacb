"""``import meanfield`` loads nothing heavy; every public name loads its module at first use
(issue 31: lean imports, PEP 562).

Each check runs in a fresh interpreter (the test process has imported everything already).
"""

import json
import subprocess
import sys

import pytest

import meanfield

#: what ``import meanfield`` must not import (the optional and heavy dependencies, the engine)
HEAVY = (
    "jax",
    "equinox",
    "diffrax",
    "scipy",
    "optax",
    "matplotlib",
    "xarray",
    "zarr",
    "s2fft",
    "sklearn",
    "meanfield.reproduce",
)


def _fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints one JSON object as its last line."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


_LOADED = """
import json, sys
def loaded(names):
    return sorted(n for n in names if n in sys.modules)
"""


def test_import_meanfield_imports_no_dependency_and_no_submodule():
    got = _fresh(
        _LOADED
        + f"""
import meanfield, meanfield.sweep
print(json.dumps({{"heavy": loaded({HEAVY!r}),
                  "submodules": sorted(m for m in sys.modules if m.startswith("meanfield."))}}))
"""
    )
    assert got["heavy"] == []
    assert got["submodules"] == ["meanfield.sweep"]  # the sweep package alone, lazy in turn


def test_each_name_loads_its_dependencies_at_first_use():
    """The engine (``mf.kernels``) brings JAX but no integrator, optimiser, plotting or store;
    ``mf.simulate`` brings diffrax, ``mf.depth`` optax, ``mf.continuum`` scipy."""
    got = _fresh(
        _LOADED
        + f"""
import meanfield as mf
steps = {{}}
mf.kernels.USA
steps["kernels"] = loaded({HEAVY!r})
mf.simulate
steps["simulate"] = loaded({HEAVY!r})
mf.depth
steps["depth"] = loaded({HEAVY!r})
mf.continuum
steps["continuum"] = loaded({HEAVY!r})
print(json.dumps(steps))
"""
    )
    assert got["kernels"] == ["equinox", "jax"]
    assert got["simulate"] == ["diffrax", "equinox", "jax"]
    assert set(got["depth"]) - set(got["simulate"]) == {"optax"}
    assert "scipy" in got["continuum"]
    for names in got.values():
        assert not {
            "matplotlib",
            "xarray",
            "zarr",
            "s2fft",
            "sklearn",
            "meanfield.reproduce",
        } & set(names)


def test_public_names_and_import_paths_work_in_a_fresh_process():
    got = _fresh("""
import json, types
import meanfield as mf
from meanfield import Trajectory, energy, positions, simulate
import meanfield.sweep
from meanfield.sweep import run_sweep
import meanfield.energy
import meanfield.continuum as continuum_module
out = {
    "energy_is_function": isinstance(mf.energy, types.FunctionType) and mf.energy is energy,
    "energy_module": type(__import__("sys").modules["meanfield.energy"]).__name__,
    "homes": [mf.simulate.__module__, Trajectory.__module__, positions.__module__, mf.field.__module__,
              mf.velocity.__module__, run_sweep.__module__],
    "continuum": continuum_module is mf.continuum,
    "all": all(hasattr(mf, n) for n in mf.__all__),
    "dir": sorted(set(mf.__all__) - set(dir(mf))),
    "usa": mf.kernels.USA.__name__, "version": mf.__version__,
}
print(json.dumps(out))
""")
    assert got["energy_is_function"], (
        "mf.energy must stay the function when meanfield.energy is imported"
    )
    assert got["energy_module"] == "module"
    assert got["homes"] == [
        "meanfield.integrate",
        "meanfield.integrate",
        "meanfield.models",
        "meanfield.energy",
        "meanfield.energy",
        "meanfield.sweep.run",
    ]
    assert got["continuum"] and got["all"] and got["dir"] == []
    assert got["usa"] == "USA" and got["version"] == meanfield.__version__


def test_energy_stays_the_function_whatever_imports_its_module():
    """Importing the submodule ``meanfield.energy`` (the import system then sets the package's
    attribute) leaves ``mf.energy`` the function, as the eager package did."""
    import importlib

    importlib.import_module("meanfield.energy")
    assert callable(meanfield.energy) and meanfield.energy.__name__ == "energy"
    assert meanfield.energy is sys.modules["meanfield.energy"].energy


def test_unknown_names_raise_attribute_error_naming_them():
    with pytest.raises(AttributeError, match="'no_such_name'"):
        meanfield.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="'__main__'"):  # never runs the command line
        meanfield.__main__  # noqa: B018
    from meanfield import sweep

    with pytest.raises(AttributeError, match="'no_such_name'"):
        sweep.no_such_name  # noqa: B018


def test_sweep_names_are_those_of_their_modules():
    import importlib

    import meanfield.sweep as sweep

    assert set(sweep._HOMES) == set(sweep.__all__)
    for name, home in sweep._HOMES.items():
        assert getattr(sweep, name) is getattr(
            importlib.import_module(f"meanfield.sweep.{home}"), name
        ), name
