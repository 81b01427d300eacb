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
        with pytest.raises(
            RuntimeError, match="backend='native': the fused C kernel is not available"
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
