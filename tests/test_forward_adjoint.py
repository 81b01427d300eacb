"""Sweeps and `meanfield simulate` trace a cheaper loop, without changing a number.

The sweep's point program and ``meanfield simulate`` integrate with ``diffrax.ForwardMode()``
(no reverse-mode gradients are wanted there, and its plain loop traces faster than the default
``RecursiveCheckpointAdjoint``'s checkpointed one): the stored numbers must be bit-identical to
those of the default adjoint."""

from __future__ import annotations

from collections import OrderedDict

import diffrax
import numpy as np
import pytest

from meanfield import cli, integrate, sweep
from meanfield.sweep import run as sweep_run

TINY = """
name = "tiny_fwd"
[model]
kind = "usa"
[grid]
n = [7]
d = 3
beta = [1.5, 4.0]
seeds = 2
seed = 3
[time]
t1 = 0.6
dt = 0.1
solver = "{solver}"
save = 4{tol}
[output]
observables = ["collapse_gap", "energy", "clusters"]
"""


def _recording(monkeypatch, *, default: bool) -> list:
    """Patch ``integrate.simulate`` to record the adjoint each call asks for; with ``default``,
    drop it (the default adjoint runs instead)."""
    seen: list = []
    real = integrate.simulate

    def simulate(*args, **kwargs):
        seen.append(kwargs.get("adjoint"))
        if default:
            kwargs.pop("adjoint", None)
        return real(*args, **kwargs)

    monkeypatch.setattr(integrate, "simulate", simulate)
    monkeypatch.setattr(
        sweep_run, "_PROGRAMS", OrderedDict()
    )  # no program memoised across the two runs
    return seen


# the adaptive solver (its step controller runs inside the forward loop too); a fixed-step
# integration under ForwardMode is bit-identical in test_cli_simulate_forward_mode_is_bit_identical
# below (meanfield simulate's fixed step), which is the same integrate.simulate call as a sweep's
# (an "rk2" sweep here as well was trimmed to keep CI under 30 minutes)
@pytest.mark.parametrize("solver", ["dopri5"])
def test_sweep_forward_mode_is_bit_identical(tmp_path, monkeypatch, solver):
    spec = TINY.format(
        solver=solver, tol="\nrtol = 1e-4\natol = 1e-6" if solver == "dopri5" else ""
    )
    stores = {}
    for default in (False, True):
        with monkeypatch.context() as m:
            seen = _recording(m, default=default)
            out = tmp_path / f"{'default' if default else 'forward'}.zarr"
            sweep.run_sweep(spec, out, quiet=True)
        assert seen and all(isinstance(a, diffrax.ForwardMode) for a in seen), seen
        stores[default] = sweep.load(out)
    fwd, ref = stores[False], stores[True]
    assert sorted(fwd.data_vars) == sorted(ref.data_vars)
    assert (np.asarray(fwd["status"]) == sweep_run.store.OK).all()
    for name in fwd.data_vars:
        a, b = np.asarray(fwd[name]), np.asarray(ref[name])
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_cli_simulate_forward_mode_is_bit_identical(tmp_path, monkeypatch):
    args = [
        "simulate",
        "--n",
        "12",
        "--d",
        "3",
        "--beta",
        "2",
        "--t1",
        "0.5",
        "--dt",
        "0.05",
        "--saves",
        "6",
        "--no-plots",
    ]
    outs = {}
    for default in (False, True):
        with monkeypatch.context() as m:
            seen = _recording(m, default=default)
            out = tmp_path / ("default" if default else "forward")
            assert cli.main([*args, "--out", str(out)]) == 0
        assert len(seen) == 1 and isinstance(seen[0], diffrax.ForwardMode), seen
        ds = sweep.load(out)  # the run's store: every number simulate writes
        outs[default] = {k: ds[k].values for k in (*ds.data_vars, *ds.coords)}
    fwd, ref = outs[False], outs[True]
    assert sorted(fwd) == sorted(ref) and {"x", "x0", "time"} <= set(fwd)
    for name in fwd:
        np.testing.assert_array_equal(fwd[name], ref[name], err_msg=name)
