"""Run cost and resource limits (meanfield._resources): the estimate, the policy, the step rule."""

import doctest
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import _resources as R
from meanfield.kernels import DEFAULT_BLOCK, DENSE_MAX
from meanfield.metrics import CLUSTER_BLOCK

MiB = 2**20


def cost(**kw):
    base = dict(n=256, d=3, t1=20.0, dt=0.01, saves=101, itemsize=4)
    base.update(kw)
    base.setdefault("footprint", mf.kernels.USA(1.0).footprint(base["n"], base["d"]))
    return R.run_cost(**base)


# ------------------------------------------------------------------- the estimate


def test_steps_and_saves_follow_the_step_grid():
    # floor(t1 / dt) grid points merged with the saves, plus t1
    assert cost().steps == 2000 + 101 + 1
    assert cost(t1=1.0, dt=0.1, saves=2).steps == 10 + 2 + 1
    assert cost(t1=1.0, dt=0.3, saves=5).steps == 3 + 5 + 1
    assert cost().saves == 101
    # adaptive solvers: the max_steps bound, no host grid
    c = cost(solver="tsit5")
    assert c.steps == 100_000
    assert cost(solver="dopri5", max_steps=500).steps == 500


def test_memory_terms_are_the_engine_allocations():
    base = cost(clusters=False, save_states=False, step_grid=False)
    # the host step grid: GRID_BYTES_PER_STEP a step
    assert (
        cost(clusters=False, save_states=False).bytes - base.bytes
        == R.GRID_BYTES_PER_STEP * base.steps
    )
    # saved states: saves x n x d x itemsize
    assert cost(clusters=False, step_grid=False).bytes - base.bytes == 101 * 256 * 3 * 4

    # dense pairwise working set up to DENSE_MAX, then tiles of block x 2 block
    def pairs(n, model=None, block_size=None):
        model = mf.kernels.USA(1.0) if model is None else model
        c0 = R.run_cost(
            n=n,
            d=3,
            t1=1.0,
            dt=0.5,
            saves=2,
            itemsize=4,
            clusters=False,
            step_grid=False,
            footprint=model.footprint(n, 3, block_size=block_size),
        )
        rk2 = (2 * 2 + 6) * n * 3 + 2 * (n * 3 + 3 + 1)
        assert c0.point_bytes == (
            c0.bytes - MiB
        )  # one point, no host grid: all of it is the point's
        return (c0.bytes - MiB - R.POINT_OVERHEAD_BYTES) // 4 - rk2

    usa = mf.kernels.USA(1.0)
    dense, tiles = usa.dense_arrays, usa.tile_arrays  # XLA:CPU's measured peaks, with a margin
    assert pairs(DENSE_MAX) == dense * DENSE_MAX**2
    assert pairs(DENSE_MAX + 1) == tiles * DEFAULT_BLOCK * 2 * DEFAULT_BLOCK
    assert pairs(4096, block_size=4096) == dense * 4096**2  # block >= n: dense
    assert pairs(4096, block_size=100) == tiles * 100 * 200
    assert (
        pairs(4096, mf.kernels.DistanceBias(1.0, 1.0))
        == (tiles + 1) * DEFAULT_BLOCK * 2 * DEFAULT_BLOCK
    )
    assert pairs(1024, mf.models.SelfAttention(1.0)) == 2.5 * 1024**2  # self-attention: dense
    assert pairs(2048, mf.models.SelfAttention(1.0)) == 1.5 * 2048**2
    # XLA fuses the small-d products into loops, but the CPU runtime allocates the (n, n) product
    # of the logits outside them (tests/test_cost_model.py): one array and a quarter
    assert pairs(8192, mf.models.SelfAttention(1.0)) == 1.25 * 8192**2
    assert pairs(4096, mf.kernels.Toeplitz(1.0)) == 4 * 4096  # rank 2: O(n)
    # the gauge kernels hold (d, d) matrices and gauge-frame states per particle
    assert pairs(
        4096, mf.kernels.RoPE(1.0, 1.0)
    ) == tiles * DEFAULT_BLOCK * 2 * DEFAULT_BLOCK + 2 * 4096 * (9 + 3)
    # the same tiles as the evaluation itself (one dense-or-tiled rule)
    for n, b in ((256, None), (4096, None), (4096, 100), (4096, 4096)):
        rows, cols = mf.kernels.tile_shape(n, b)
        assert pairs(n, block_size=b) == (dense if rows == n else tiles) * rows * cols
    # the clusters observable: its own tile, never n x n
    c = R.run_cost(
        n=300_000,
        d=3,
        t1=1.0,
        dt=0.5,
        saves=2,
        itemsize=4,
        step_grid=False,
        footprint=mf.kernels.USA(1.0).footprint(300_000, 3),
    )
    assert c.bytes < 64 * MiB
    assert c.bytes > 3 * CLUSTER_BLOCK * 2 * CLUSTER_BLOCK * 4


def test_batch_scales_the_points_not_the_grid():
    one, four = cost(), cost(batch=4)
    grid = R.GRID_BYTES_PER_STEP * one.steps
    assert four.bytes - grid - MiB == 4 * (one.bytes - grid - MiB)
    overhead = R.STEP_OVERHEAD_FLOP * one.steps
    assert four.work - overhead == pytest.approx(4 * (one.work - overhead), rel=1e-12)
    assert four.batch == 4 and "for 4 points" in four.describe()
    assert "per point" in one.describe()


def test_work_formula():
    overhead = R.STEP_OVERHEAD_FLOP * 2102
    pairs_flop = (2102 * 2 + 101) * 256**2 * (4 * 3 + 8)  # field at every stage, energy at saves
    assert cost(clusters=False).work == pytest.approx(pairs_flop + overhead, rel=1e-12)
    clusters_flop = 101 * 256**2 * (4 * 3 + 8)
    assert cost().work == pytest.approx(pairs_flop + clusters_flop + overhead, rel=1e-12)
    assert cost(solver="rk4").work > cost(solver="rk2").work > cost(solver="euler").work
    # toeplitz: rank 2, O(n) a step
    toe = cost(footprint=mf.kernels.Toeplitz(1.0).footprint(256, 3), clusters=False).work - overhead
    assert toe == pytest.approx((2102 * 2 + 101) * 256 * (4 * 3 + 8), rel=1e-12)


@pytest.mark.parametrize(
    "kw",
    [
        dict(t1=1e9),  # the issue's 745 GiB grid
        dict(dt=1e-12),
        dict(dt=1e-300),
        dict(t1=1e300, dt=1e-300),  # t1 / dt overflows to inf
        dict(saves=100_000_000),
        dict(n=10**20),
        dict(n=10**400, d=10**400),  # beyond float range
        dict(d=10**8),
        dict(batch=10**30),
    ],
)
def test_huge_inputs_give_huge_estimates_never_an_error(kw):
    c = cost(**kw)
    assert isinstance(c.steps, int) and isinstance(c.bytes, int) and isinstance(c.work, float)
    assert c.bytes > 100 * 2**30 or c.work > R.WORK_LIMIT
    line = c.describe()
    assert "\n" not in line and "steps" in line
    with pytest.raises(R.ResourceLimitError):
        R.check_cost(c, memory=2**34, total=2**35)


def test_the_issue_step_grid_is_refused():
    # simulate --t1 1e9 (dt = 1e-2): 1e11 steps, far beyond any machine
    c = cost(t1=1e9)
    assert c.steps == pytest.approx(1e11, rel=1e-6)
    assert c.bytes >= 745 * 2**30


@pytest.mark.parametrize(
    "bad", [dict(n=math.nan), dict(dt=-1.0), dict(t1="1"), dict(n=True), dict(solver="rk9")]
)
def test_bad_arguments_are_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        cost(**bad)


# ------------------------------------------------------------------- the policy


def test_check_cost_policy():
    c = R.Cost(steps=10, saves=2, bytes=5000, work=1e3)
    R.check_cost(c, memory=10_000, total=20_000)  # fits
    with pytest.raises(R.ResourceLimitError, match=r"--force") as e:
        R.check_cost(c, memory=4000, total=20_000, what="simulate")
    assert "\n" not in str(e.value) and str(e.value).startswith("simulate needs")
    assert "4.88 KiB" in str(e.value)  # the estimate is in the message
    R.check_cost(c, memory=4000, total=20_000, force=True)  # the user means it
    # past the machine's total memory: refused even with force, no --force hint
    with pytest.raises(R.ResourceLimitError) as e:
        R.check_cost(c, memory=4000, total=4500, force=True)
    assert "--force" not in str(e.value) and "in total" in str(e.value)
    # the work bound
    w = R.Cost(steps=10, saves=2, bytes=10, work=2e15)
    with pytest.raises(R.ResourceLimitError, match="flop"):
        R.check_cost(w, memory=10**9, total=10**9)
    R.check_cost(w, memory=10**9, total=10**9, force=True)
    R.check_cost(w, memory=10**9, total=10**9, max_work=1e16)
    with pytest.raises(R.ResourceLimitError, match="flop"):  # an infinite estimate too
        R.check_cost(R.Cost(1, 1, 1, math.inf), memory=10**9, total=10**9)
    assert issubclass(R.ResourceLimitError, ValueError)
    # a sweep names its own flag (or none)
    with pytest.raises(R.ResourceLimitError, match="--yes"):
        R.check_cost(c, memory=4000, total=20_000, force_hint="--yes")


def test_default_simulate_fits_any_machine():
    c = cost()
    assert c.bytes < 16 * MiB and c.work < 1e11
    R.check_cost(c)


def test_machine_memory():
    avail, total = R.machine_memory(), R.machine_memory(total=True)
    assert 0 < avail <= total
    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert total <= phys * 1.01


def test_format_bytes():
    assert R.format_bytes(0) == "0 B"
    assert R.format_bytes(1536) == "1.5 KiB"
    assert R.format_bytes(745 * 2**30) == "745 GiB"
    assert "PiB" in R.format_bytes(1e300) and "PiB" in R.format_bytes(10**400)


# ------------------------------------------------------------------- the step rule


def _rate(kind, b, **params):
    """The interaction rate of registered model ``kind`` over the betas ``b`` (the sweep plan's way)."""
    return mf.kernels.MODELS[kind].over_grid(params, 3, beta=np.atleast_1d(b)).interaction_rate()


def test_interaction_rate_closed_forms():
    b = np.array([0.5, 1.0, 4.0, 10.0])
    np.testing.assert_allclose(_rate("usa", b), np.sqrt(b) * np.exp(b - 0.5), rtol=1e-14)
    np.testing.assert_allclose(
        _rate("rope", b, rescaled=True), np.sqrt(b) * np.exp(-0.5), rtol=1e-14
    )
    np.testing.assert_allclose(_rate("sa", b), b)
    np.testing.assert_allclose(_rate("sa", b, normalized=False), np.sqrt(b) * np.exp(b - 0.5))
    np.testing.assert_array_equal(mf.kernels.Toeplitz(2.0).interaction_rate(), 0.0)
    # one model, concrete and traced: the same law in NumPy and in JAX
    for beta in (0.5, 4.0):
        assert float(mf.kernels.USA(beta).interaction_rate()) == pytest.approx(
            math.sqrt(beta) * math.exp(beta - 0.5)
        )
        traced = jax.jit(lambda v: mf.kernels.RoPE(v, 1.0).interaction_rate())(jnp.float32(beta))
        assert float(traced) == pytest.approx(math.sqrt(beta) * math.exp(beta - 0.5), rel=1e-6)
    assert np.isinf(_rate("usa", 1e4))  # overflow: an infinite rate, no error
    w = R.step_warning(_rate("usa", 1e4)[0], 0.01, rescaled_hint="--rescaled")
    assert w.endswith("use --rescaled")  # no "dt <= 0" advice


def test_reference_step_is_the_published_rule_overflow_free():
    """dt(beta) = base_dt / max(sqrt(beta) e^(beta - 1/2), 1) (GLPR's reference code), evaluated in
    log space: no overflow at beta = 1e3, and equal to the phase diagrams' step."""
    b = np.array([0.25, 1.0, 2.0, 8.0, 50.0])
    got = mf.kernels.MODELS["usa"].over_grid({}, 3, beta=b).reference_step(0.1)
    np.testing.assert_allclose(got, 0.1 / np.maximum(np.sqrt(b) * np.exp(b - 0.5), 1.0), rtol=1e-13)
    np.testing.assert_array_equal(got, mf.phase_diagram.usa_step_size(b, 0.1))
    assert 0.0 <= float(mf.kernels.USA(700.0).reference_step(0.1)) < 1e-300
    sa = mf.models.SelfAttention(4.0)  # normalised self-attention: rate beta
    assert float(sa.reference_step(0.1)) == pytest.approx(0.025)


def test_step_warning_rule():
    usa = lambda beta, **kw: mf.kernels.USA(beta, **kw).interaction_rate()  # noqa: E731
    # the default run is fine; the issue's `--n 32 --beta 10 --t1 0.2` is not
    assert R.step_warning(usa(1.0), 0.01) is None
    w = R.step_warning(usa(10.0), 0.01, dt_name="--dt", rescaled_hint="--rescaled")
    ratio = 0.01 * math.sqrt(10) * math.exp(9.5)
    assert f"{ratio:.3g}" in w and "--rescaled" in w and "\n" not in w
    assert f"--dt <= {0.01 / ratio:.3g}" in w
    # exactly at the measured boundary (beta = 4, dt = 0.05: dt x rate = 3.3 lost energy)
    assert R.step_ratios(usa(4.0), 0.05) == pytest.approx(0.05 * 2 * math.exp(3.5))
    assert R.step_warning(usa(4.0), 0.05) is not None
    assert R.step_warning(usa(4.0), 0.05 / 3.4) is None
    assert R.step_warning(usa(10.0, rescaled=True), 0.01) is None
    assert R.step_warning(usa(10.0), 0.01, solver="tsit5") is None  # adaptive: its own steps
    assert R.step_warning(mf.kernels.Toeplitz(10.0).interaction_rate(), 1.0) is None
    many = R.step_warning(_rate("usa", [1.0, 4.0, 10.0]), 0.05)
    assert "2 beta value(s)" in many
    text = R.step_warning_text(
        [0.5, 3.0], 0.05, dt_name="time.dt", rescaled_hint="model.rescaled = true"
    )
    assert text.startswith("warning: time.dt = 0.05 is long for 1 (shape, beta) pair(s)")
    assert R.step_warning_text([0.5, 1.0], 0.05) is None


def test_docstring_examples():
    result = doctest.testmod(R, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 5 and result.failed == 0
