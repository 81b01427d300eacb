"""The one ``backend`` option (``"auto" | "native" | "xla"``, ``mf.kernels.BACKENDS``): every entry
point accepts the three values and rejects anything else with one ValueError naming the value and
the accepted ones; a sweep's ``[model] backend`` is hashed only when given, and a sweep with
``backend = "xla"`` gives the numbers of the native run (float32, 1e-5)."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import _native, phase_diagram, sweep
from meanfield.sweep import run as sweep_run

K = mf.kernels
ACCEPTED = "must be one of 'auto', 'native', 'xla', got 'gpu'"
_x = mf.sphere.uniform(jax.random.key(0), 12, 3)


def _entry_points(backend):
    k = K.USA(1.0)
    return {
        "field": lambda: mf.field(k, _x, backend=backend),
        "velocity": lambda: mf.velocity(k, _x, backend=backend),
        "energy": lambda: mf.energy(k, _x, backend=backend),
        "simulate": lambda: mf.simulate(k, _x, t1=0.2, dt=0.1, backend=backend).collapse_gap,
        "simulate_long": lambda: (
            mf.metastability.simulate_long(
                K.USA(2.0, rescaled=True),
                _x,
                t1=1.0,
                rtol=1e-4,
                atol=1e-6,
                num_saves=3,
                backend=backend,
            ).energy
        ),
        "sa_phase_diagram": lambda: phase_diagram.sa_phase_diagram(
            jax.random.key(0), [1.0], n=6, d=2, seeds=2, t1=0.3, checkpoints=2, backend=backend
        ),
        "usa_phase_diagram": lambda: phase_diagram.usa_phase_diagram(
            jax.random.key(0), [1.0], n=6, d=2, seeds=2, t1=0.05, checkpoints=2, backend=backend
        ),
        "use_backend": lambda: K.use_backend(backend).__enter__(),
    }


@pytest.mark.parametrize("name", sorted(_entry_points("auto")))
def test_every_entry_point_rejects_an_unknown_backend(name):
    with pytest.raises(ValueError, match=f"^backend {ACCEPTED}$"):
        _entry_points("gpu")[name]()


@pytest.mark.parametrize("backend", K.BACKENDS)
@pytest.mark.parametrize("name", sorted(set(_entry_points("auto")) - {"use_backend"}))
def test_every_entry_point_accepts_the_backends(name, backend):
    """The three values run; ``"native"`` where the kernel is unavailable is one error saying why."""
    available = (_native.phase_library() if "phase" in name else _native.exp_library()).available
    if backend == "native" and not available:
        # BackendUnavailable: a ValueError (one line from the CLI), a RuntimeError for older callers
        with pytest.raises(
            ValueError, match="backend='native': the fused C kernel is not available"
        ):
            _entry_points(backend)[name]()
        return
    out = np.asarray(_entry_points(backend)[name]())
    assert np.all(np.isfinite(out))


def test_the_values_mean_one_thing():
    """One tuple, one check: the field's, the phase diagrams', the CLI's and the sweep's."""
    assert K.BACKENDS == phase_diagram.BACKENDS == _native.BACKENDS == ("auto", "native", "xla")
    assert K.check_backend is _native.check_backend


def test_cli_rejects_an_unknown_backend(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "meanfield", "simulate", "--backend", "gpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].endswith(f"--backend {ACCEPTED}")


_SPEC = """
dtype = "float32"
[model]
kind = "usa"
{backend}
[grid]
n = [24]
d = 3
beta = [0.5, 2.0]
seeds = 3
[time]
t1 = 1.0
dt = 0.05
save = 5
[output]
observables = ["collapse_gap", "energy", "clusters"]
"""


def _spec(backend=None):
    return sweep.parse_spec(
        _SPEC.format(backend="" if backend is None else f"backend = {backend!r}")
    )


def test_sweep_spec_backend_key():
    """Accepted values, one error otherwise; hashed into the store only when given (a spec without
    the key keeps its hash)."""
    plain = _spec()
    assert plain.backend == "auto" and "backend" not in plain.data["model"]
    assert _spec("auto").hash != plain.hash  # given: recorded, even with the default value
    assert len({_spec(b).hash for b in K.BACKENDS}) == 3
    assert _spec("xla").backend == "xla"
    with pytest.raises(ValueError, match=f"^model.backend {ACCEPTED}$"):
        _spec("gpu")


def _run_points(spec):
    plan = sweep.make_plan(spec, "2GB", devices=1)
    g = plan.groups[0]
    _, _, sl = plan.chunks[0]
    params, seeds = sweep_run.chunk_inputs(spec, g, sl, plan.padded_size(g))
    f = jax.jit(jax.vmap(sweep_run.point_program(spec, "usa", 24, 3)))
    return f(params, seeds), f.lower(params, seeds).as_text()


@pytest.mark.native
def test_sweep_with_backend_xla_equals_the_native_run():
    """The same sweep with ``backend = "xla"`` and ``"native"``: the programs differ (the fused
    kernel's FFI call in the native one only) and the numbers agree to 1e-5 in float32."""
    xla, xla_hlo = _run_points(_spec("xla"))
    native, native_hlo = _run_points(_spec("native"))
    assert "meanfield_exp" in native_hlo and "meanfield_exp" not in xla_hlo
    assert np.all(np.asarray(native["status"]) == np.asarray(xla["status"]))
    for key in ("collapse_gap", "energy", "clusters"):
        a, b = np.asarray(native[key]), np.asarray(xla[key])
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=key)


def test_resolve_backend_native_needs_a_kernel_that_takes_the_states():
    with pytest.raises(ValueError, match="backend='native' supports d <= 64, got d = 65"):
        K.resolve_backend("native", 10, 65, jnp.float32)
    with pytest.raises(ValueError, match="backend='native' runs float32 and float64, got float16"):
        K.resolve_backend("native", 10, 3, jnp.float16)
    assert K.resolve_backend("auto", 10, 65, jnp.float32) == "xla"


# ----------------------------------------------------------------------------
# the phase diagrams' "auto": a crossover measured on this machine (issue 26, item 5)
# ----------------------------------------------------------------------------


@pytest.mark.native
def test_phase_crossover_is_measured_on_this_machine():
    """Both paths timed at the shapes of the plan, in each dtype, a second or two, kept for the
    process (a second call is the same object) and recorded beside that dtype's library."""
    for dtype in _native.DTYPES:
        with jax.enable_x64(dtype == "float64"):
            c = phase_diagram._phase_crossover(dtype)
            assert phase_diagram._phase_crossover(np.dtype(dtype)) is c
        shapes = {(n, 2) for n in _native.PHASE_CROSSOVER_NS} | {
            (_native.PHASE_CROSSOVER_N, d) for d in _native.PHASE_CROSSOVER_DS
        }
        assert set(c.times) == {f"{n} x {d}" for n, d in shapes}
        # a second or two on a quiet machine; under 20 s on a loaded one (the CI runners, 2 cores)
        assert all(a > 0 and b > 0 for a, b in c.times.values()) and c.seconds < 20
        assert c.max_d in (0, *_native.PHASE_CROSSOVER_DS, _native.MAX_D)
        assert c.min_n in (None, 2, *_native.PHASE_CROSSOVER_NS[1:])
        assert c.recorded is None or c.recorded == str(
            _native._state["paths"][dtype].with_suffix(".crossover.json")
        )
        assert dtype in c.describe() and ("XLA at every" in c.describe()) == (c.min_n is None)


@pytest.mark.native
def test_phase_crossover_is_recorded_and_read_back(tmp_path, monkeypatch):
    """The first call measures and writes the record beside the library; later calls in the
    process do not measure again, nor does a fresh process (its state emptied here): it reads the
    record. A record of another recipe is measured again."""
    assert _native.phase_library().available
    calls = []

    def measure(dtype, xla_sweep, shapes):
        calls.append(list(shapes))
        return {f"{n} x {d}": [1.0, 2.0] if n >= 32 else [2.0, 1.0] for n, d in shapes}

    lib = tmp_path / "phase_kernel-test.so"
    monkeypatch.setitem(_native._state, "paths", {"float64": lib, "float32": lib})
    monkeypatch.setitem(_native._state, "crossover", {})
    monkeypatch.setattr(_native._phase, "_measure", measure)
    first = _native.phase_crossover("float32", phase_diagram._xla_sweep)
    assert len(calls) == 1 and first.recorded == str(lib.with_suffix(".crossover.json"))
    assert (first.max_d, first.min_n) == (_native.MAX_D, 32)
    assert _native.phase_crossover("float32", phase_diagram._xla_sweep) is first
    _native._state["crossover"].clear()  # a new process
    again = _native.phase_crossover("float32", phase_diagram._xla_sweep)
    assert len(calls) == 1 and again == first
    record = lib.with_suffix(".crossover.json")
    data = __import__("json").loads(record.read_text())
    record.write_text(__import__("json").dumps({**data, "recipe": "another"}))
    _native._state["crossover"].clear()
    _native.phase_crossover("float32", phase_diagram._xla_sweep)
    assert len(calls) == 2
    with pytest.raises(ValueError, match="dtype must be one of float64, float32, got 'float16'"):
        _native.phase_crossover("float16", phase_diagram._xla_sweep)


@pytest.mark.native
def test_phase_auto_follows_the_crossover(monkeypatch):
    """``"auto"`` runs the fused kernel exactly where the crossover (put in its place here) says it
    is faster, at the states' ``(n, d)``; the numbers are those of the backend it picks."""
    from meanfield._native import Crossover

    ran = []
    real = _native.phase_run
    monkeypatch.setattr(_native, "phase_run", lambda *a, **k: ran.append(1) or real(*a, **k))
    kw = dict(t1=0.5, checkpoints=3, dtype=jnp.float32)
    x8 = np.asarray(
        jax.vmap(lambda k: mf.sphere.uniform(k, 8, 2))(jax.random.split(jax.random.key(3), 4))
    )
    x32 = np.asarray(
        jax.vmap(lambda k: mf.sphere.uniform(k, 32, 2))(jax.random.split(jax.random.key(4), 4))
    )
    native = {
        n: phase_diagram.sa_phase_diagram(None, [1.0, 4.0], x0=x, backend="native", **kw)
        for n, x in ((8, x8), (32, x32))
    }
    xla = {
        n: phase_diagram.sa_phase_diagram(None, [1.0, 4.0], x0=x, backend="xla", **kw)
        for n, x in ((8, x8), (32, x32))
    }
    for crossover, want in (
        (Crossover(max_d=8, min_n=16, times={}, seconds=0.0), {8: "xla", 32: "native"}),
        (Crossover(max_d=64, min_n=2, times={}, seconds=0.0), {8: "native", 32: "native"}),
        (Crossover(max_d=0, min_n=None, times={}, seconds=0.0), {8: "xla", 32: "xla"}),
    ):
        monkeypatch.setitem(_native._state, "crossover", {"float32": crossover})
        for n, x in ((8, x8), (32, x32)):
            assert phase_diagram._resolve_backend("auto", jnp.asarray(x), False) == want[n]
            ran.clear()
            got = phase_diagram.sa_phase_diagram(None, [1.0, 4.0], x0=x, backend="auto", **kw)
            assert bool(ran) == (want[n] == "native"), (crossover, n)
            expected = native[n] if want[n] == "native" else xla[n]
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
        x16 = jnp.asarray(np.tile(x32[..., :1], (1, 1, 16)) / 4.0)  # d = 16 > max_d = 8
        assert phase_diagram._resolve_backend("auto", x16, False) == (
            "native" if crossover.max_d >= 16 and crossover.min_n is not None else "xla"
        )
    # the measurement never overrides what the states need: packed, renormalize, float16 run XLA
    monkeypatch.setitem(_native._state, "crossover", {"float32": Crossover(64, 2, {}, 0.0)})
    assert phase_diagram._resolve_backend("auto", jnp.asarray(x32), True) == "xla"
    assert phase_diagram._resolve_backend("auto", jnp.asarray(x32), False, project=False) == "xla"
    assert phase_diagram._resolve_backend("auto", jnp.asarray(x32, jnp.float16), False) == "xla"
