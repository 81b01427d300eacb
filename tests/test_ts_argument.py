"""Save times, end time and step grid reach the compiled ``simulate`` program as data (issue 31).

``ts``, ``t1`` and the fixed-step grid are arguments of ``integrate._simulate``, not static
tuples that XLA constant-folds: a new ``ts`` of the same length, or a nearby ``t1``, reuses
the compiled program; the fixed-step grid steps exactly where ``diffrax.StepTo`` stepped.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import integrate, sphere
from meanfield.energy import check_states
from meanfield.kernels import use_backend

K = mf.kernels


def _stepto_reference(model, x0, *, t1, dt, ts, solver, step="projected"):
    """The run the fixed-step path made before issue 31: ``diffrax.StepTo`` on the
    unpadded ``_step_grid``, ``diffeqsolve`` ending at the static ``t1``, no event."""
    model = jax.tree.map(
        lambda leaf: (
            jnp.asarray(leaf)
            if isinstance(leaf, (int, float)) and not isinstance(leaf, bool)
            else leaf
        ),
        model,
    )
    x0, aux = check_states(model, x0, None, "x0")
    dtype = x0.dtype
    grid = integrate._step_grid(float(t1), float(dt), np.asarray(ts, np.float64))
    args = integrate._Args(model, aux, jnp.zeros((), dtype), None, True, False, step == "projected")
    y0 = (x0, jnp.zeros(4, dtype))

    @jax.jit
    def run(x0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(integrate._vector_field),
            integrate._PostStepSolver(integrate._inner_solver(solver)),
            t0=0.0,
            t1=float(t1),
            dt0=None,
            y0=(x0, y0[1]),
            args=args,
            saveat=diffrax.SaveAt(
                ts=jnp.asarray(ts, dtype), fn=lambda t, y, a: sphere.normalize(y[0])
            ),
            stepsize_controller=diffrax.StepTo(ts=jnp.asarray(grid, dtype)),
            max_steps=len(grid) + 1,
            throw=False,
        )
        return sol.ys, sol.stats["num_accepted_steps"], sol.result == diffrax.RESULTS.successful

    with use_backend("xla"):
        return run(x0)


@pytest.mark.parametrize(
    "solver, step, t1, dt, ts",
    [
        ("rk2", "projected", 0.37, 0.05, [0.0, 0.013, 0.1, 0.2501, 0.37]),
        ("rk4", "projected", 1.3, 0.1, np.geomspace(0.01, 1.3, 9)),
        ("euler", "renormalize", 0.9, 0.07, [0.05, 0.3, 0.31, 0.62]),
    ],
)
def test_grid_steps_equal_diffrax_stepto(solver, step, t1, dt, ts):
    """The padded grid argument and ``_GridSteps`` step where ``diffrax.StepTo`` stepped on
    the same ``_step_grid``: the same step counts and saves, the states equal to float32
    rounding (bit for bit for rk2 and rk4 here; the Euler update of a separately compiled
    program can round differently, as ``simulate`` before issue 31 did against it too)."""
    x0 = mf.sphere.uniform(jax.random.key(3), 6, 3)
    model = K.USA(2.5)
    ref_xs, ref_steps, ref_ok = _stepto_reference(
        model, x0, t1=t1, dt=dt, ts=ts, solver=solver, step=step
    )
    assert bool(ref_ok)
    r = mf.simulate(model, x0, t1=t1, dt=dt, ts=ts, solver=solver, step=step, backend="xla")
    assert not bool(r.failed) and not bool(r.stopped)
    assert float(r.stop_time) == np.float32(t1)
    assert (
        int(r.num_steps)
        == int(ref_steps)
        == len(integrate._step_grid(t1, dt, np.asarray(ts, float))) - 1
    )
    np.testing.assert_array_equal(np.asarray(r.ts), np.asarray(ts, np.float32))
    # same steps; the two programs may fuse the update differently (XLA), hence 1 ulp
    np.testing.assert_allclose(np.asarray(r.xs), np.asarray(ref_xs), rtol=0, atol=1e-6)


def test_grid_is_padded_to_a_bucket_with_t1():
    """The grid argument: ``_step_grid`` cast to the state's dtype, padded with ``t1`` to
    the next power of two; nearby ``t1`` share the length (hence the program)."""
    for t1, dt, ts in [
        (1.0, 0.1, np.array([0.0, 1.0])),
        (1.2, 0.1, np.array([0.0, 0.55, 1.2])),
        (20.0, 0.01, None),
    ]:
        ts = np.array([0.0, t1]) if ts is None else ts
        grid = integrate._step_grid(t1, dt, ts)
        arg = integrate._grid_argument(grid, t1, dt, np.float32)
        assert arg.dtype == np.float32 and len(arg) == integrate._grid_bucket(len(grid))
        assert (
            len(arg) >= len(grid)
            and len(arg) & (len(arg) - 1) == 0
            and len(arg) < 2 * max(len(grid), 8)
        )
        np.testing.assert_array_equal(arg[: len(grid)], grid.astype(np.float32))
        assert np.all(arg[len(grid) - 1 :] == np.float32(t1))
    assert integrate._grid_bucket(11) == integrate._grid_bucket(14) == 16
    assert integrate._grid_bucket(2001) == 2048


def test_coinciding_float32_step_points_are_refused_before_compiling(monkeypatch):
    """A save time within float32 resolution of a step point (but more than dt / 1000 from it,
    so ``_step_grid`` keeps both) was a run-time ``StepTo`` error; it is a ValueError now."""

    def boom(*args, **kwargs):
        raise AssertionError("reached compilation")

    monkeypatch.setattr(integrate, "_simulate", boom)
    x0 = mf.sphere.uniform(jax.random.key(0), 4, 3)
    with pytest.raises(ValueError, match="coincide in float32"):
        mf.simulate(K.USA(1.0), x0, t1=20.0, dt=1e-4, ts=[0.0, 10.0 + 2e-7, 20.0])


class _Compiles(logging.Handler):
    """Counts the compilations of ``_simulate`` (``jax.log_compiles`` messages; a program
    found in a persistent cache counts too: it was a new program for this process)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Compiling jit(_simulate)"):
            self.count += 1


@pytest.fixture
def compiles():
    handler = _Compiles()
    logger = logging.getLogger("jax")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with jax.log_compiles():
            yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_same_length_ts_and_nearby_t1_compile_once(compiles):
    """Two runs with different save times of one length and different t1 (grids of 11 and
    13 points, one bucket): one trace of ``_simulate``; a different length traces again."""
    x0 = mf.sphere.uniform(jax.random.key(1), 5, 3)
    # a fresh observable: a static argument no other test shares, so the first call must compile
    obs = {"m0": lambda x: x[:, 0].mean()}
    a = mf.simulate(K.USA(1.0), x0, t1=1.0, dt=0.1, ts=np.linspace(0.0, 1.0, 6), observables=obs)
    assert compiles.count == 1
    b = mf.simulate(
        K.USA(1.0), x0, t1=1.2, dt=0.1, ts=[0.0, 0.1, 0.3, 0.6, 1.0, 1.2], observables=obs
    )
    assert compiles.count == 1
    np.testing.assert_array_equal(np.asarray(b.ts), np.float32([0.0, 0.1, 0.3, 0.6, 1.0, 1.2]))
    assert float(a.stop_time) == 1.0 and float(b.stop_time) == np.float32(1.2)
    assert int(a.num_steps) == 10 and int(b.num_steps) == 12
    # the shared saves agree (same steps up to t = 1)
    np.testing.assert_array_equal(np.asarray(a.xs)[[0, 5]], np.asarray(b.xs)[[0, 4]])
    mf.simulate(K.USA(1.0), x0, t1=1.0, dt=0.1, ts=np.linspace(0.0, 1.0, 7), observables=obs)
    assert compiles.count == 2


def test_traced_step_and_adaptive_take_ts_as_data(compiles):
    """The traced-step (``_UniformSteps``) and adaptive paths: same-length ts and a new t1
    reuse the program; runs end at t1 with every save reached."""
    x0 = mf.sphere.uniform(jax.random.key(2), 5, 3)
    obs = {"m1": lambda x: x[:, 1].mean()}
    h = jnp.float32([0.1, 0.05])
    for t1, ts in [(1.0, (0.0, 0.25, 1.0)), (1.5, (0.0, 0.7, 1.4))]:
        r = mf.simulate(
            K.USA(1.0),
            x0,
            t1=t1,
            dt=0.05,
            ts=ts,
            solver="tsit5",
            rtol=1e-6,
            atol=1e-8,
            observables=obs,
        )
        assert not bool(r.failed) and float(r.stop_time) == np.float32(t1)
        assert np.all(np.isfinite(np.asarray(r.xs)))
    assert compiles.count == 1
    for t1, ts in [(1.0, (0.0, 0.25, 1.0)), (1.5, (0.0, 0.7, 1.4))]:
        r = jax.vmap(
            lambda h, t1=t1, ts=ts: mf.simulate(
                K.USA(1.0), x0, t1=t1, dt=h, ts=ts, max_steps=64, observables=obs
            )
        )(h)
        assert not np.any(r.failed) and np.all(r.stop_time == np.float32(t1))
        # the grid k h merged with the saves: the concrete-dt grid's step count
        for i, hi in enumerate([0.1, 0.05]):
            assert int(r.num_steps[i]) == len(integrate._step_grid(t1, hi, np.asarray(ts))) - 1
    assert compiles.count == 2


_CACHE_SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys
    import jax
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    hits = []
    class H(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if "Persistent compilation cache hit" in msg and "jit__simulate" in msg:
                hits.append(msg)
    lg = logging.getLogger("jax._src.compiler")
    lg.addHandler(H())
    lg.setLevel(logging.DEBUG)
    import numpy as np
    import meanfield as mf
    from meanfield import integrate
    x0 = mf.sphere.uniform(jax.random.key(0), 16, 3)
    ts = np.concatenate([[0.0], np.geomspace(0.01, float(sys.argv[2]), 40)])
    cap = {}
    orig = integrate._simulate
    def spy(*a, **kw):
        cap["a"], cap["kw"] = a, kw
        return orig(*a, **kw)
    integrate._simulate = spy
    r = mf.simulate(mf.kernels.USA(1.0), x0, t1=float(sys.argv[2]), dt=0.1, ts=ts)
    text = orig.lower(*cap["a"], **cap["kw"]).as_text()
    entries = sorted(e for e in os.listdir(sys.argv[1]) if e.startswith("jit__simulate"))
    print(json.dumps({"entries": entries, "hits": len(hits), "callbacks": text.count("callback"),
                      "failed": bool(r.failed), "stop_time": float(r.stop_time)}))
    """
)


@pytest.mark.slow
def test_simulate_program_has_no_host_callback_and_is_cached(tmp_path):
    """Under ``EQX_ON_ERROR=nan`` the ``_simulate`` program of a default-ish call (rk2,
    concrete dt, a 41-point log grid of save times) has no host callback: JAX writes it to
    the persistent cache, and a second process with another t1 in the same grid bucket
    (and other save times of the same length) loads it instead of compiling."""
    script = tmp_path / "run.py"
    script.write_text(_CACHE_SCRIPT)
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {
        **os.environ,
        "EQX_ON_ERROR": "nan",
        "MEANFIELD_COMPILATION_CACHE": "0",
        "JAX_PLATFORMS": "cpu",
    }
    env.pop("JAX_COMPILATION_CACHE_DIR", None)

    def run(t1):
        out = subprocess.run(
            [sys.executable, str(script), str(cache), str(t1)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run(2.0)
    assert first["callbacks"] == 0
    assert not first["failed"] and first["stop_time"] == 2.0
    assert len(first["entries"]) == 1, first
    assert first["hits"] == 0
    second = run(2.3)  # 21 + 40 vs 24 + 40 step points: one bucket (128)
    assert second["callbacks"] == 0
    assert second["entries"] == first["entries"]
    assert second["hits"] == 1
    assert not second["failed"] and second["stop_time"] == pytest.approx(2.3)


# --------------------------------------------------------------------------- dense save grids
# (issue 47, item 1) The step grid keeps one point of each run of points closer than dt / 1000 to
# their predecessor; save times that close to each other removed the step points too, silently
# (100,002 save times on [0, 1] with dt = 0.01 left one step). Such a grid is refused, in one line,
# by simulate, the CLI and a sweep spec alike.

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def test_dense_save_times_are_refused_not_stepped_over():
    x0 = sphere.uniform(jax.random.key(0), 8, 3)
    with pytest.raises(ValueError, match=r"closer than dt / 1000 .* steps would exceed dt"):
        mf.simulate(K.USA(1.0), x0, t1=1.0, dt=0.01, ts=np.linspace(0.0, 1.0, 100_002))
    # just above the rounding tolerance every save time is a step point: honoured
    ts = np.linspace(0.0, 0.1, 5001)  # 2e-5 apart, dt / 1000 = 1e-5
    assert integrate.step_grid_problem(0.1, 0.01, ts) is None
    grid = integrate._step_grid(0.1, 0.01, ts)
    # each save time is a grid point, up to the rounding of a coinciding step point (k * dt)
    assert np.max(np.min(np.abs(ts[:, None] - grid[None, :]), axis=1)) < 1e-15


@settings(max_examples=200, deadline=None)
@given(
    t1=st.floats(0.05, 10.0),
    steps=st.integers(1, 400),
    saves=st.integers(2, 3000),
)
def test_the_step_grid_never_steps_longer_than_dt_nor_loses_a_save(t1, steps, saves):
    """Whatever the save grid: refused, or a grid whose steps are at most dt (up to the rounding
    tolerance) that holds every save time within dt / 1000."""
    dt = t1 / steps
    ts = np.linspace(0.0, t1, saves)
    if integrate.step_grid_problem(t1, dt, ts) is not None:
        with pytest.raises(ValueError, match="dt / 1000"):
            integrate._step_grid(t1, dt, ts)
        return
    grid = integrate._step_grid(t1, dt, ts)
    assert grid[0] == 0.0 and grid[-1] == t1
    assert np.all(np.diff(grid) > 0) and np.max(np.diff(grid)) <= dt * (1 + 1e-3)
    nearest = np.min(np.abs(ts[:, None] - grid[None, :]), axis=1) if saves * len(grid) < 4e6 else 0
    assert np.all(nearest <= dt * 1e-3)


def test_dense_save_times_are_one_line_from_the_cli_and_the_sweep(tmp_path, capsys):
    from meanfield import cli
    from meanfield.sweep import cli as sweep_cli

    rc = cli.main(["simulate", "--n", "8", "--t1", "0.3", "--dt", "0.05", "--saves", "7000",
                   "--out", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "dt / 1000" in err[0], err
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[model]\nkind = "usa"\n[grid]\nn = [8]\nbeta = [1.0]\nseeds = 2\n'
        "[time]\nt1 = 1.0\ndt = 0.01\nsave = 200001\n"
    )
    rc = sweep_cli.main([str(spec), "--out", str(tmp_path / "s.zarr")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "time.save" in err[0] and "dt / 1000" in err[0], err
    assert not (tmp_path / "s.zarr").exists()


def _grid_before_issue_47(t1, dt, ts):
    """The step grid as it was built before dense save grids were refused (git 73fd898)."""
    k = int(np.floor(t1 / dt + 1e-9))
    grid = np.union1d(np.arange(k + 1) * dt, np.append(ts, t1))
    grid = grid[np.concatenate([[True], np.diff(grid) > dt * 1e-3])]
    grid[-1] = t1
    return grid


@settings(max_examples=300, deadline=None)
@given(
    t1=st.floats(0.05, 10.0),
    steps=st.integers(1, 400),
    ts=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
)
def test_every_grid_that_is_accepted_is_the_grid_of_before(t1, steps, ts):
    """Fixed-step runs whose save grid was honoured step exactly as before (same grid, bit for bit)."""
    dt = t1 / steps
    ts = np.unique(np.append(np.asarray(ts) * t1, 0.0))
    if integrate.step_grid_problem(t1, dt, ts) is None:
        assert np.array_equal(integrate._step_grid(t1, dt, ts), _grid_before_issue_47(t1, dt, ts))
