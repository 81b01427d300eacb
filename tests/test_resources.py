"""Run cost and resource limits (meanfield._resources): the estimate, the policy, the step rule."""

import doctest
import math
import os

import numpy as np
import pytest

from meanfield import _resources as R
from meanfield.kernels import DEFAULT_BLOCK, DENSE_MAX
from meanfield.metrics import CLUSTER_BLOCK

MiB = 2**20


def cost(**kw):
    base = dict(n=256, d=3, t1=20.0, dt=0.01, saves=101, itemsize=4)
    base.update(kw)
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
    assert cost(clusters=False, save_states=False).bytes - base.bytes == R.GRID_BYTES_PER_STEP * base.steps
    # saved states: saves x n x d x itemsize
    assert cost(clusters=False, step_grid=False).bytes - base.bytes == 101 * 256 * 3 * 4
    # dense pairwise working set up to DENSE_MAX, then tiles of block x 2 block
    def pairs(n, **kw):
        c0 = R.run_cost(n=n, d=3, t1=1.0, dt=0.5, saves=2, itemsize=4, clusters=False, step_grid=False, **kw)
        rk2 = (2 * 2 + 6) * n * 3 + 2 * (n * 3 + 3 + 4)
        return (c0.bytes - MiB) // 4 - rk2

    assert pairs(DENSE_MAX) == 3 * DENSE_MAX**2
    assert pairs(DENSE_MAX + 1) == 3 * DEFAULT_BLOCK * 2 * DEFAULT_BLOCK
    assert pairs(4096, block_size=4096) == 3 * 4096**2  # block >= n: dense
    assert pairs(4096, block_size=100) == 3 * 100 * 200
    assert pairs(4096, kind="distance-bias") == 4 * DEFAULT_BLOCK * 2 * DEFAULT_BLOCK
    assert pairs(4096, kind="sa") == 3 * 4096**2  # self-attention is always dense
    assert pairs(4096, kind="toeplitz") == 4 * 4096  # rank 2: O(n)
    # the gauge kernels hold a (d, d) matrix per particle
    assert pairs(4096, kind="rope") == 3 * DEFAULT_BLOCK * 2 * DEFAULT_BLOCK + 4096 * 9
    # the clusters observable: its own tile, never n x n
    c = R.run_cost(n=300_000, d=3, t1=1.0, dt=0.5, saves=2, itemsize=4, step_grid=False)
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
    toe = cost(kind="toeplitz", clusters=False).work - overhead
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


@pytest.mark.parametrize("bad", [dict(n=math.nan), dict(dt=-1.0), dict(t1="1"), dict(n=True), dict(solver="rk9")])
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


def test_interaction_rate_closed_forms():
    b = np.array([0.5, 1.0, 4.0, 10.0])
    np.testing.assert_allclose(R.interaction_rate("usa", b), np.sqrt(b) * np.exp(b - 0.5), rtol=1e-14)
    np.testing.assert_allclose(R.interaction_rate("rope", b, rescaled=True), np.sqrt(b) * np.exp(-0.5), rtol=1e-14)
    np.testing.assert_allclose(R.interaction_rate("sa", b), b)
    np.testing.assert_allclose(R.interaction_rate("sa", b, normalized=False), np.sqrt(b) * np.exp(b - 0.5))
    np.testing.assert_array_equal(R.interaction_rate("toeplitz", b), 0.0)
    assert np.isinf(R.interaction_rate("usa", 1e4))  # overflow: an infinite rate, no error
    w = R.step_warning("usa", 1e4, 0.01, rescaled_hint="--rescaled")
    assert w.endswith("use --rescaled")  # no "dt <= 0" advice


def test_step_warning_rule():
    # the default run is fine; the issue's `--n 32 --beta 10 --t1 0.2` is not
    assert R.step_warning("usa", 1.0, 0.01) is None
    w = R.step_warning("usa", 10.0, 0.01, dt_name="--dt", rescaled_hint="--rescaled")
    ratio = 0.01 * math.sqrt(10) * math.exp(9.5)
    assert f"{ratio:.3g}" in w and "--rescaled" in w and "\n" not in w
    assert f"--dt <= {0.01 / ratio:.3g}" in w
    # exactly at the measured boundary (beta = 4, dt = 0.05: dt x rate = 3.3 lost energy)
    assert R.step_ratios("usa", 4.0, 0.05) == pytest.approx(0.05 * 2 * math.exp(3.5))
    assert R.step_warning("usa", 4.0, 0.05) is not None
    assert R.step_warning("usa", 4.0, 0.05 / 3.4) is None
    assert R.step_warning("usa", 10.0, 0.01, rescaled=True) is None
    assert R.step_warning("usa", 10.0, 0.01, solver="tsit5") is None  # adaptive: its own steps
    assert R.step_warning("toeplitz", 10.0, 1.0) is None
    many = R.step_warning("usa", [1.0, 4.0, 10.0], 0.05)
    assert "2 beta value(s)" in many
    text = R.step_warning_text([0.5, 3.0], 0.05, dt_name="time.dt", rescaled_hint="model.rescaled = true")
    assert text.startswith("warning: time.dt = 0.05 is long for 1 (shape, beta) pair(s)")
    assert R.step_warning_text([0.5, 1.0], 0.05) is None


def test_docstring_examples():
    result = doctest.testmod(R, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 5 and result.failed == 0
