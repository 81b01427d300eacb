"""Issue 47, the sweep side of items 4 and 6: a plugin model whose field raises is one line from
``meanfield sweep`` and leaves its store sound; no path of the sweep or its plots opens a FIFO so
as to block (refused up front, one line, exit 2)."""

from __future__ import annotations

import os

import jax.numpy as jnp
import pytest

import meanfield as mf
from meanfield import sweep
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import run as sweep_run
from meanfield.sweep import store as sweep_store

SPEC = """
[model]
kind = "usa"
[grid]
n = [8]
beta = [1.0]
seeds = 2
[time]
t1 = 0.2
dt = 0.1
save = 3
"""


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture
def failing_plugin():
    """A registered model whose field raises ``error`` (set by the test) when traced."""
    raised: dict = {"error": ZeroDivisionError("plugin bug")}

    class Failing(mf.kernels.Kernel):
        name = "failing-test"
        scale: float = mf.kernels.param(1.0, kind="float>0", doc="strength")

        def __call__(self, x, xi, y, zeta):
            return self.scale * jnp.dot(x, y)

        def field(self, x, aux, *, block_size=None):
            raise raised["error"]

    mf.kernels.register(Failing)
    try:
        yield raised
    finally:
        mf.kernels.unregister("failing-test")


@pytest.mark.parametrize(
    "error",
    [ZeroDivisionError("plugin bug"), KeyError("w"), RuntimeError("x\ny"), SystemExit(0)],
    ids=["ZeroDivisionError", "KeyError", "multi-line", "SystemExit"],
)
def test_a_plugin_whose_field_raises_is_one_line_and_the_store_stays_sound(
    failing_plugin, tmp_path, capsys, error
):
    failing_plugin["error"] = error
    spec = tmp_path / "p.toml"
    spec.write_text(
        SPEC.replace('kind = "usa"', 'kind = "failing-test"\nscale = 2.0').replace(
            "beta = [1.0]\n", ""
        )
    )
    out = tmp_path / "p.zarr"
    assert sweep_cli.main([str(spec), "--out", str(out), "--quiet"]) == 2
    line = _one_line(capsys)
    assert line.startswith(
        "meanfield sweep: error: model 'failing-test' failed at n = 8, d = 3 (chunk 0 of "
    ), line
    assert f"not written): {type(error).__name__}" in line
    assert sweep_store.verify(out) == [] and sweep_store.done_chunks(out) == set()
    assert sweep_cli.main(["--verify", str(out)]) == 0
    with pytest.raises(sweep_run.PointProgramError) as e:  # the Python API: the cause chained
        sweep.run_sweep(spec, out, resume=True, quiet=True)
    assert e.value.__cause__ is error


@pytest.mark.slow
def test_no_sweep_path_opens_a_fifo(tmp_path, capsys):
    """A FIFO as the store (create, resume, part, verify, status), as the spec, or in place of a
    figure of ``meanfield plot``: one line and exit 2, at once."""
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    fifo = tmp_path / "o.zarr"
    os.mkfifo(fifo)
    for argv in (
        [str(spec), "--out", str(fifo), "--quiet"],
        [str(spec), "--out", str(fifo), "--quiet", "--resume"],
        [str(spec), "--out", str(fifo), "--quiet", "--part", "1/2"],
        ["--verify", str(fifo)],
        ["--status", "--out", str(fifo)],
        [str(fifo), "--out", str(tmp_path / "x.zarr")],
    ):
        assert sweep_cli.main(argv) == 2, argv
        assert str(fifo) in _one_line(capsys)
    out = tmp_path / "ok.zarr"
    sweep.run_sweep(spec, out, quiet=True)
    plots = tmp_path / "plots"
    plots.mkdir()
    os.mkfifo(plots / "collapse_gap_vs_time.png")
    assert sweep_cli.plot_main([str(out), "--out", str(plots)]) == 2
    line = _one_line(capsys)
    assert line == (
        f"meanfield plot: error: figure '{plots / 'collapse_gap_vs_time.png'}' cannot be written "
        "(a FIFO, not a regular file)"
    )
