"""One cost model (issue 26, item 3): the estimate of memory per point and work per step
(``meanfield._resources.run_cost`` on the model's ``footprint``) is the one the sweep chunker, the
plan's refusals and ``meanfield simulate``'s refusal use, and it bounds XLA's own peak
(``compiled.memory_analysis()``) within 2x, for the XLA formulation of USA, RoPE and SA at
n = 256, 2048 and 8192 (dense, tiled; SA's fused regime past n^2 = 2^24, whose (n, n) product
the CPU runtime allocates outside XLA's buffers: counted here as the footprint counts it)."""

from __future__ import annotations

import argparse

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import _resources, cli, sweep
from meanfield.sweep import plan as sweep_plan
from meanfield.sweep import run as sweep_run

OBSERVABLES = {
    "usa": '["collapse_gap", "energy", "clusters"]',
    "rope": '["collapse_gap", "energy"]',
    "sa": '["collapse_gap", "clusters"]',
}


def _spec(kind: str, n: int, observables: str | None = None):
    obs = OBSERVABLES[kind] if observables is None else observables
    return sweep.parse_spec(
        f"[model]\nkind = '{kind}'\nbackend = 'xla'\n[grid]\nn = [{n}]\nd = 3\nbeta = [1.0]\nseeds = 1\n"
        f"[time]\nt1 = 0.5\ndt = 0.1\nsave = 3\n[output]\nobservables = {obs}\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["usa", "rope", "sa"])
@pytest.mark.parametrize("n", [256, 2048, 8192])
def test_estimate_within_2x_of_xla_peak(kind, n):
    spec = _spec(kind, n)
    plan = sweep.make_plan(spec, "64GB", devices=1)
    g = plan.groups[0]
    _, _, sl = plan.chunks[0]
    params, seeds = sweep_run.chunk_inputs(spec, g, sl, plan.padded_size(g))
    compiled = (
        jax.jit(jax.vmap(sweep_run.point_program(spec, kind, n, 3))).lower(params, seeds).compile()
    )
    m = compiled.memory_analysis()
    xla = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
    if kind == "sa" and n * n >= 2**24:  # the logits' (n, n) product the CPU runtime allocates
        xla += plan.padded_size(g) * n * n * 4  # outside XLA's buffers (SelfAttention.footprint)
    estimate = g.point_bytes * plan.padded_size(g)
    assert xla <= estimate <= 2 * xla, (kind, n, estimate, xla, estimate / xla)


def test_one_estimate_serves_the_chunker_the_plan_and_simulate():
    spec = _spec("rope", 2048)
    plan = sweep.make_plan(spec, "2GB", devices=1)
    g = plan.groups[0]
    # the chunker's bytes per point are the plan's cost of one point
    assert (
        g.point_bytes
        == sweep_plan.point_memory(spec, "rope", 2048, 3)
        == plan.cost(g, 1).point_bytes
    )
    # and both are run_cost with the model's footprint, as meanfield simulate computes it
    model = sweep_plan.grid_model(spec, "rope", 2048, 3)
    direct = _resources.run_cost(
        n=2048,
        d=3,
        t1=0.5,
        dt=0.1,
        saves=3,
        itemsize=4,
        footprint=model.footprint(2048, 3),
        save_states=False,
        observables=len(spec.observables) + 2,
        clusters=False,
        step_grid=True,
    )
    assert direct.point_bytes == g.point_bytes
    args = argparse.Namespace(n=2048, d=3, t1=0.5, dt=0.1, saves=3, solver="rk2")
    sim = cli._simulate_cost(args, mf.kernels.make("rope", beta=1.0))
    assert (
        sim.point_bytes
        == _resources.run_cost(
            n=2048, d=3, t1=0.5, dt=0.1, saves=3, itemsize=4, footprint=model.footprint(2048, 3)
        ).point_bytes
    )


@pytest.mark.parametrize(
    "n, block, dense",
    [(1024, None, True), (1025, None, False), (4096, 4096, True), (4096, 100, False)],
)
def test_footprint_follows_the_kernels_own_tile_rule(n, block, dense):
    """The estimate's dense-or-tiled rule is the evaluation's (``tile_shape``; the plan once assumed
    n = 2048 ran dense while the kernel tiled it)."""
    rows, cols = mf.kernels.tile_shape(n, block)
    assert (rows == cols == n) == dense
    usa = mf.kernels.USA(1.0)
    k = usa.dense_arrays if dense else usa.tile_arrays
    assert usa.footprint(n, 3, block_size=block).entries == k * rows * cols
    bias = mf.kernels.DistanceBias(1.0, 1.0).footprint(n, 3, block_size=block)
    assert bias.entries == (k + 1) * rows * cols  # the log-bias tile
    assert mf.kernels.Toeplitz(1.0).footprint(n, 3).entries == 4 * n  # rank 2
    assert np.isinf(usa.footprint(10**400, 3).pairs)  # huge: a huge estimate, never an error


def test_self_attention_past_the_machine_is_refused_not_a_runtime_allocation_failure():
    """n = 200,000 normalised self-attention: the (n, n) product the CPU runtime allocates
    (160 GB in float32) is counted, so ``mf.simulate`` refuses in one line before anything is
    allocated instead of failing inside XLA's runtime ("allocate failed")."""
    import jax.numpy as jnp

    model = mf.models.SelfAttention(1.0)
    n = 200_000
    assert model.footprint(n, 3).entries >= n * n
    x0 = jnp.zeros((n, 3), jnp.float32).at[:, 0].set(1.0)
    with pytest.raises(_resources.ResourceLimitError, match=r"simulate needs ~\d+ GiB of memory"):
        mf.simulate(model, x0, t1=0.1, dt=0.1)
