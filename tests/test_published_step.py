"""The published step rule (``step="renormalize"``) against the published simulation loop.

The published code (github.com/borjanG/2023-transformers-rotf, ``phase-diagrams.py``:
``simu_xform.step_1`` and ``do_single_beta``) is written out below in plain NumPy, float64,
independently of meanfield: a batch of systems, ``SM = softmax(beta M M^T)`` (SA, row maximum
subtracted as ``torch.nn.functional.softmax`` does) or ``exp(beta M M^T) / n`` (USA, step
``0.1 / max(sqrt(beta) e^(beta - 1/2), 1)``), ``M <- normalize(M + eta SM M)``, the time
accumulated as ``cur_time + eta``, and checkpoint ``k`` recorded after the first step with
``cur_time >= times[k]`` (fraction of ordered pairs ``i != j`` with ``<x_i, x_j> > 0.999``).

The sweeps (``sa_phase_diagram`` / ``usa_phase_diagram`` with ``step="renormalize"``,
``schedule="published"``), ``simulate(..., solver="euler", step="renormalize")`` and a sweep
with ``time.step = "renormalize"`` are compared with it from the same initial particles. The
states agree to rounding (``STATE_ATOL``); a clustering count can only differ through a pair
whose inner product lies within rounding of the threshold, so every fraction is checked to lie
between the published counts at ``threshold +- MARGIN`` (in practice: equal).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import phase_diagram as pd
from meanfield import sweep

#: states of meanfield and of the NumPy loop after the whole run (measured: below 1e-14 here)
STATE_ATOL = 1e-10
#: a pair closer than this to the clustering threshold may be counted either way (rounding)
MARGIN = 1e-9
THRESHOLD = 0.999


# ----------------------------------------------------------------------------
# the published loop, written out in NumPy
# ----------------------------------------------------------------------------


def _normalize(v):
    # torch.nn.functional.normalize(v, dim=2): v / max(||v||, 1e-12)
    return v / np.maximum(np.linalg.norm(v, axis=2, keepdims=True), 1e-12)


def _fractions(M, threshold):
    """Per system: fraction of ordered pairs i != j with <x_i, x_j> > threshold."""
    n = M.shape[1]
    ip = M @ np.swapaxes(M, 1, 2)
    off = ~np.eye(n, dtype=bool)
    return np.array([np.sum(g[off] > threshold) for g in ip]) / (n * (n - 1))


def published_loop(x0, beta, *, use_softmax, step=0.1, maxtime, checkpoints):
    """The published ``do_single_beta`` for one beta: ``(fractions (S, C), fractions at
    threshold +- MARGIN, final states, number of steps)``."""
    S, n, _ = x0.shape
    eta = step if use_softmax else step / max(np.sqrt(beta) * np.exp(beta - 1 / 2), 1)
    times = np.linspace(0, maxtime, checkpoints)
    M = np.array(x0, dtype=np.float64)
    dens = np.zeros((S, checkpoints))
    lo = np.zeros((S, checkpoints))
    hi = np.zeros((S, checkpoints))
    cur_ckpt, cur_time, steps = 0, 0.0, 0
    while True:
        SM = beta * (M @ np.swapaxes(M, 1, 2))
        if use_softmax:
            SM = np.exp(SM - SM.max(axis=2, keepdims=True))
            SM = SM / SM.sum(axis=2, keepdims=True)
        else:
            SM = np.exp(SM) / n
        M2 = (SM @ M) * eta + M
        M = _normalize(M2)
        cur_time = cur_time + eta
        steps += 1
        if cur_time >= times[cur_ckpt]:
            f = _fractions(M, THRESHOLD)
            f_lo, f_hi = _fractions(M, THRESHOLD + MARGIN), _fractions(M, THRESHOLD - MARGIN)
            while cur_time >= times[cur_ckpt]:
                dens[:, cur_ckpt], lo[:, cur_ckpt], hi[:, cur_ckpt] = f, f_lo, f_hi
                cur_ckpt += 1
                if cur_ckpt >= checkpoints:
                    break
        if cur_time >= maxtime:
            break
    return dens, (lo, hi), M, steps


def _x0(S, n, d, seed):
    keys = jax.random.split(jax.random.key(seed), S)
    return np.asarray(jax.vmap(lambda k: mf.sphere.uniform(k, n, d, jnp.float64))(keys))


def _check_fractions(ours, ref, bounds, n=32):
    """Equal pair counts (fractions times n (n - 1), rounded: the two divide differently in the
    last bit), and any difference only through pairs within MARGIN of the threshold."""
    count = lambda f: np.rint(np.asarray(f) * n * (n - 1)).astype(np.int64)  # noqa: E731
    lo, hi = bounds
    assert np.all(count(lo) <= count(ours)) and np.all(count(ours) <= count(hi)), (
        "a count differs beyond pairs at the threshold"
    )
    np.testing.assert_array_equal(count(ours), count(ref))


# ----------------------------------------------------------------------------
# the phase-diagram sweeps
# ----------------------------------------------------------------------------


def test_sa_phase_diagram_renormalize_equals_published_loop(x64):
    S, n, d, t1, C = 6, 32, 2, 10.0, 200
    betas = [0.5, 3.0, 9.0]
    x0 = _x0(S, n, d, seed=3)
    out = pd.sa_phase_diagram(
        None,
        betas,
        x0=x0,
        dt=0.1,
        t1=t1,
        checkpoints=C,
        per_seed=True,
        step="renormalize",
        schedule="published",
    )
    N, h, idx = pd.published_checkpoint_steps(t1, 0.1, C)
    for bi, b in enumerate(betas):
        ref, bounds, M, steps = published_loop(x0, b, use_softmax=True, maxtime=t1, checkpoints=C)
        assert steps == out.steps[bi] == N == 101  # 100 x 0.1 accumulates to 9.99999999999998 < 10
        _check_fractions(out.per_seed[bi], ref, bounds)
        # the published density: the batch mean of the pair indicator (equal system sizes)
        np.testing.assert_allclose(out.fraction[bi], ref.mean(axis=0), rtol=0, atol=1e-15)
        _, xs = pd._sweep(
            jnp.asarray(x0),
            np.array([b]),
            [h],
            [N],
            [idx],
            THRESHOLD,
            True,
            False,
            None,
            states=True,
            backend="auto",
            step="renormalize",
        )
        np.testing.assert_allclose(xs[0], M, rtol=0, atol=STATE_ATOL)
    assert out.fraction[-1, -1] > 0.2  # clusters form: the comparison is not trivial
    # the projected default from the same particles is another discretisation: other numbers
    proj = pd.sa_phase_diagram(
        None, betas, x0=x0, dt=0.1, t1=t1, checkpoints=C, schedule="published"
    )
    assert np.abs(proj - out.fraction).max() > 0.01


def test_usa_phase_diagram_renormalize_equals_published_loop(x64):
    S, n, d, t1, C = 6, 32, 2, 0.25, 50
    betas = [0.5, 2.0, 4.5]
    x0 = _x0(S, n, d, seed=4)
    out = pd.usa_phase_diagram(
        None,
        betas,
        x0=x0,
        t1=t1,
        checkpoints=C,
        per_seed=True,
        step="renormalize",
        schedule="published",
    )
    for bi, b in enumerate(betas):
        ref, bounds, M, steps = published_loop(x0, b, use_softmax=False, maxtime=t1, checkpoints=C)
        assert steps == out.steps[bi]
        _check_fractions(out.per_seed[bi], ref, bounds)
        N, h, idx = pd.published_checkpoint_steps(t1, pd.usa_step_size(b), C)
        _, xs = pd._sweep(
            jnp.asarray(x0),
            np.array([b]),
            [h],
            [N],
            [idx],
            THRESHOLD,
            False,
            False,
            None,
            states=True,
            backend="auto",
            step="renormalize",
        )
        np.testing.assert_allclose(xs[0], M, rtol=0, atol=STATE_ATOL)
    assert out.fraction.max() > 0.05


def test_published_checkpoint_steps_matches_the_loop():
    """The schedule alone: the loop's step indices at its checkpoints."""
    for t1, dt, C in [(10.0, 0.1, 200), (0.25, float(pd.usa_step_size(3.0)), 200), (1.0, 0.3, 7)]:
        N, h, idx = pd.published_checkpoint_steps(t1, dt, C)
        times = np.linspace(0, t1, C)
        tau, j, want = 0.0, 0, []
        while len(want) < C:
            tau, j = tau + dt, j + 1
            want += [j] * int(np.sum(times[len(want) :] <= tau))
        assert h == dt and idx.tolist() == want and N == want[-1] and idx[0] == 1
    assert pd.published_checkpoint_steps(1.0, 0.3, 2)[0] == 4  # 4 x 0.3 >= 1
    with pytest.raises(ValueError, match="dt"):
        pd.published_checkpoint_steps(1.0, 0.0, 3)


def test_step_and_schedule_bad_values():
    with pytest.raises(ValueError, match="step"):
        pd.sa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=2, t1=0.2, step="tangent")
    with pytest.raises(ValueError, match="schedule"):
        pd.usa_phase_diagram(jax.random.key(0), [1.0], n=4, seeds=2, schedule="paper")
    with pytest.raises(ValueError, match="renormalize"):
        pd.sa_phase_diagram(
            jax.random.key(0), [1.0], n=4, seeds=2, t1=0.2, step="renormalize", backend="native"
        )
    with pytest.raises(ValueError, match="step"):
        pd.euler_step(jnp.eye(2), 1.0, 0.1, step="Renormalize")


# ----------------------------------------------------------------------------
# simulate and the sweep key
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "use_softmax"), [("sa", True), ("usa", False)])
def test_simulate_renormalize_equals_published_loop(kind, use_softmax, x64):
    n, d, beta, steps = 32, 2, 2.0, 30
    x0 = _x0(1, n, d, seed=5)
    eta = 0.1 if use_softmax else 0.1 / max(np.sqrt(beta) * np.exp(beta - 0.5), 1)
    _, _, M, N = published_loop(
        x0, beta, use_softmax=use_softmax, maxtime=steps * eta * (1 - 1e-9), checkpoints=2
    )
    assert N == steps
    model = mf.kernels.make(kind, beta=beta, d=d, dtype=jnp.float64)
    tr = mf.simulate(model, x0[0], t1=steps * eta, dt=eta, solver="euler", step="renormalize")
    assert int(tr.num_steps) == steps
    np.testing.assert_allclose(tr.xs[-1], M[0], rtol=0, atol=STATE_ATOL)
    # the dense reference step of phase_diagram too
    x = jnp.asarray(x0[0])
    for _ in range(steps):
        x = pd.euler_step(x, beta, eta, normalized=use_softmax, step="renormalize")
    np.testing.assert_allclose(x, M[0], rtol=0, atol=STATE_ATOL)
    proj = mf.simulate(model, x0[0], t1=steps * eta, dt=eta, solver="euler")
    assert (
        np.abs(np.asarray(proj.xs[-1]) - M[0]).max() > 1e-4
    )  # the projected rule is another scheme


def test_simulate_step_bad_values():
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 2)
    model = mf.kernels.USA(1.0)
    with pytest.raises(ValueError, match=r"solver='euler'.*'rk2'"):
        mf.simulate(model, x0, t1=0.1, dt=0.05, step="renormalize")
    with pytest.raises(ValueError, match="step"):
        mf.simulate(model, x0, t1=0.1, dt=0.05, solver="euler", step="published")


SPEC = """
name = "renorm"
dtype = "float64"
[model]
kind = "sa"
[grid]
n = 12
d = 2
beta = [3.0]
seeds = 1
seed = 7
[time]
t1 = 2.0
dt = 0.1
solver = "euler"
save = 5
step = "renormalize"
[output]
observables = ["collapse_gap", "clusters"]
"""


@pytest.mark.xla_default
def test_sweep_step_key_equals_simulate(tmp_path, x64):
    spec = sweep.parse_spec(SPEC)
    assert spec.step == "renormalize" and spec.data["time"]["step"] == "renormalize"
    projected = sweep.parse_spec(SPEC.replace('step = "renormalize"\n', ""))
    assert (
        projected.step == "projected" and "step" not in projected.data["time"]
    )  # default: hash unchanged
    assert spec.hash != projected.hash
    assert "step: renormalize" in sweep.make_plan(spec, "2GB", devices=1).describe()
    sweep.run_sweep(spec, tmp_path / "r.zarr", quiet=True)
    ds = sweep.load(tmp_path / "r.zarr")
    x0 = mf.sphere.uniform(jax.random.key(7), 12, 2, jnp.float64)
    model = mf.kernels.make("sa", beta=3.0, d=2, dtype=jnp.float64)
    tr = mf.simulate(model, x0, t1=2.0, dt=0.1, solver="euler", ts=spec.ts, step="renormalize")
    got = ds["collapse_gap"].values.reshape(-1)
    np.testing.assert_allclose(got, tr.collapse_gap, rtol=1e-12, atol=1e-15)
    trp = mf.simulate(model, x0, t1=2.0, dt=0.1, solver="euler", ts=spec.ts)
    assert np.abs(np.asarray(trp.collapse_gap) - got).max() > 1e-6  # the key changes the run


def test_sweep_step_key_validation():
    with pytest.raises(ValueError, match=r"time.step.*'rk2'"):  # one error naming both
        sweep.parse_spec(SPEC.replace('solver = "euler"', 'solver = "rk2"'))
    with pytest.raises(ValueError, match="time.step"):
        sweep.parse_spec(SPEC.replace('step = "renormalize"', 'step = "tangent"'))
    with pytest.raises(TypeError, match="time.step"):
        sweep.parse_spec(SPEC.replace('step = "renormalize"', "step = 1"))


# ----------------------------------------------------------------------------
# both rules are consistent: O(h^2) apart per step
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("normalized", [True, False])
def test_projected_and_renormalized_differ_by_h_squared(normalized, x64):
    r"""One step from the same state: $\|x_P - x_R\| = h^2 |\langle F, x\rangle| \|P_x F\| + O(h^3)$
    per particle (the renormalised step is the projected one of length $h / (1 + h \langle F, x\rangle)$):
    the fitted order of the difference is 2 and the leading coefficient is the closed form."""
    x = mf.sphere.uniform(jax.random.key(11), 16, 3, jnp.float64)
    beta = 1.5
    hs = np.logspace(-1.5, -3.5, 6)
    diff = np.array(
        [
            np.asarray(
                jnp.linalg.norm(
                    pd.euler_step(x, beta, h, normalized=normalized)
                    - pd.euler_step(x, beta, h, normalized=normalized, step="renormalize"),
                    axis=1,
                )
            )
            for h in hs
        ]
    )  # (h, n)
    W = jnp.exp(beta * (x @ x.T))
    F = W @ x / (jnp.sum(W, axis=1, keepdims=True) if normalized else x.shape[0])
    a = jnp.sum(F * x, axis=1)
    coef = np.abs(np.asarray(a)) * np.asarray(jnp.linalg.norm(F - a[:, None] * x, axis=1))
    slope = np.polyfit(np.log(hs), np.log(diff.max(axis=1)), 1)[0]
    assert 1.95 < slope < 2.05
    # relative correction of the leading term: h |<F, x>| (h' = h / (1 + h <F, x>)), x3 for margin
    np.testing.assert_allclose(
        diff[-1] / hs[-1] ** 2, coef, rtol=3 * hs[-1] * float(np.abs(a).max())
    )
