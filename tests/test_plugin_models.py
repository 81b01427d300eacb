"""A model from outside meanfield (issue 26): a kernel defined in a package that is not meanfield,
declared in the entry-point group ``meanfield.models`` and installed into a temporary site
directory, runs from Python (``mf.kernels.make``), ``meanfield simulate`` and a sweep with equal
numbers; its parameters are validated (one message) and listed in ``--help``; its
``interaction_rate`` drives the dt warning of ``meanfield simulate`` and of the sweep plan; the
cost estimate takes it. Every step runs in a fresh process, as a user's would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

PLUGIN = '''
"""A third-party kernel: h = (1 + gamma <x, y>) exp(beta <x, y>) / beta."""
import jax.numpy as jnp
import meanfield as mf


class Tilted(mf.kernels.Kernel):
    """The tilted exp kernel (1 + gamma <x, y>) exp(beta <x, y>) / beta, for the plugin test."""

    name = "tilted"
    beta: float = mf.kernels.param(1.0, kind="float>0", doc="inverse temperature of the tilt")
    gamma: float = mf.kernels.param(0.5, kind="float>=0", doc="tilt strength gamma")

    def __call__(self, x, xi, y, zeta):
        c = jnp.dot(x, y)
        return (1.0 + self.gamma * c) * jnp.exp(self.beta * c) / self.beta

    def interaction_rate(self):
        # a rate of its own (not the exp kernels'): 10 beta, so the warning is this class's
        return 10.0 * self.beta
'''

N, SEED, T1, DT, SAVES = 10, 2, 0.4, 0.05, 5


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A site directory holding the package ``tilted_plugin`` and its distribution metadata with
    the entry point ``tilted = tilted_plugin:Tilted`` in the group ``meanfield.models``."""
    root = tmp_path_factory.mktemp("site")
    (root / "tilted_plugin").mkdir()
    (root / "tilted_plugin" / "__init__.py").write_text(PLUGIN)
    info = root / "tilted_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tilted-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[meanfield.models]\ntilted = tilted_plugin:Tilted\n")
    return root


def _env(site: Path) -> dict:
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, MEANFIELD_NATIVE_QUIET="1", OMP_NUM_THREADS="1")


def _run(site, args, *, check=True):
    proc = subprocess.run(args, env=_env(site), capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _meanfield(site, *argv, check=True):
    return _run(site, [sys.executable, "-m", "meanfield", *argv], check=check)


def test_plugin_runs_from_python_simulate_and_a_sweep_with_equal_numbers(site, tmp_path):
    # Python: the registry has it, its parameters come from the declarations, values are validated
    script = textwrap.dedent(f"""
        import json, sys
        import jax, numpy as np
        import meanfield as mf
        entry = mf.kernels.MODELS["tilted"]
        assert "tilted" in mf.kernels.MODEL_NAMES and entry.has_energy
        assert [(p.name, p.kind, p.default) for p in entry.params] == [
            ("beta", "float>0", 1.0), ("gamma", "float>=0", 0.5)] + [
            (p.name, p.kind, p.default) for p in mf.masks.MASK_PARAMS]  # a kernel takes a mask
        try:
            mf.kernels.make("tilted", gamma=-1.0)
        except ValueError as e:
            bad = str(e)
        k = mf.kernels.make("tilted", beta=1.5, gamma=0.3)
        x0 = mf.sphere.uniform(jax.random.key({SEED}), {N}, 3)
        traj = mf.simulate(k, x0, t1={T1}, dt={DT}, ts=np.linspace(0, {T1}, {SAVES}))
        json.dump({{"energy": np.asarray(traj.energy).tolist(), "gap": np.asarray(traj.collapse_gap).tolist(),
                   "bad": bad, "type": type(k).__module__}}, sys.stdout)
    """)
    py = json.loads(_run(site, [sys.executable, "-c", script]).stdout)
    assert py["bad"] == "gamma must be >= 0, got -1.0" and py["type"] == "tilted_plugin"

    # meanfield simulate: the flag, its help, the same numbers
    help_text = _meanfield(site, "simulate", "--help").stdout
    assert "--gamma" in help_text and "tilt strength gamma" in help_text and "tilted" in help_text
    out = tmp_path / "cli"
    _meanfield(
        site,
        "simulate",
        "--kernel",
        "tilted",
        "--beta",
        "1.5",
        "--gamma",
        "0.3",
        "--n",
        str(N),
        "--t1",
        str(T1),
        "--dt",
        str(DT),
        "--saves",
        str(SAVES),
        "--seed",
        str(SEED),
        "--out",
        str(out),
        "--no-plots",
    )
    # its numbers: the run's store, read in a fresh process as the sweep's below
    script = (
        f"import json, numpy as np, meanfield.sweep as s; ds = s.load({str(out)!r}); "
        "print(json.dumps({k: np.asarray(ds[k].values).tolist() for k in ('energy', 'collapse_gap')}))"
    )
    cli = {
        k: np.asarray(v)
        for k, v in json.loads(_run(site, [sys.executable, "-c", script]).stdout).items()
    }
    assert not (out / "observables.npz").exists()  # run.zarr is the one numeric format
    tol = dict(rtol=2e-5, atol=2e-6)  # float32 rounding
    np.testing.assert_allclose(cli["energy"], py["energy"], **tol)
    np.testing.assert_allclose(cli["collapse_gap"], py["gap"], **tol)
    assert np.ptp(py["gap"]) > 0  # the flow moved: the comparison is not vacuous

    # a sweep of kind = "tilted"
    spec = tmp_path / "tilted.toml"
    spec.write_text(
        f'name = "plugin"\n[model]\nkind = "tilted"\ngamma = 0.3\n[grid]\nn = [{N}]\nd = 3\n'
        f"beta = [1.5]\nseeds = 1\nseed = {SEED}\n[time]\nt1 = {T1}\ndt = {DT}\nsave = {SAVES}\n"
        '[output]\nobservables = ["collapse_gap", "energy"]\n'
    )
    store = tmp_path / "tilted.zarr"
    _meanfield(site, "sweep", str(spec), "--out", str(store), "--quiet")
    script = (
        f"import json, numpy as np, meanfield.sweep as s; ds = s.load({str(store)!r}); "
        f"print(json.dumps(np.asarray(ds['energy'].values).reshape(-1).tolist()))"
    )
    energy = json.loads(_run(site, [sys.executable, "-c", script]).stdout)
    np.testing.assert_allclose(energy, py["energy"], **tol)


def test_plugin_parameters_validated_and_its_rate_drives_the_dt_warning(site, tmp_path):
    # a bad value: one line on stderr, exit status 2, the registry's message
    bad = _meanfield(
        site,
        "simulate",
        "--kernel",
        "tilted",
        "--gamma",
        "-1",
        "--out",
        str(tmp_path / "x"),
        check=False,
    )
    lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert (
        bad.returncode == 2 and len(lines) == 1 and "--gamma: must be >= 0, got -1" in lines[0]
    ), bad.stderr
    # the class's own rate (10 beta): dt = 0.5 at beta = 1 gives dt x rate = 5 > 1, a warning that the
    # exp kernels' rate (sqrt(beta) e^(beta - 1/2) = 1.65: dt x rate = 0.82) would not give
    run = _meanfield(
        site,
        "simulate",
        "--kernel",
        "tilted",
        "--beta",
        "1",
        "--n",
        "6",
        "--t1",
        "1",
        "--dt",
        "0.5",
        "--saves",
        "3",
        "--out",
        str(tmp_path / "w"),
        "--no-plots",
    )
    assert (
        "warning: --dt = 0.5 is long for the interaction rate (dt x rate up to 5 > 1" in run.stderr
    ), run.stderr
    # the sweep plan: the same rate, and the cost estimate of this kind
    spec = tmp_path / "warn.toml"
    spec.write_text(
        'name = "warn"\n[model]\nkind = "tilted"\n[grid]\nn = [8, 16]\nd = 3\nbeta = [1.0, 2.0]\n'
        "seeds = 2\n[time]\nt1 = 1.0\ndt = 0.5\nsave = 3\n"
    )
    plan = _meanfield(site, "sweep", str(spec), "--out", str(tmp_path / "warn.zarr"), "--dry-run")
    assert (
        "tilted" in plan.stdout
        and "warning: time.dt = 0.5 is long for 4 (shape, beta) pair(s)" in plan.stdout
    ), plan.stdout + plan.stderr
    assert "estimate:" in plan.stdout


def test_register_in_process_rules():
    """``register``: a new name, its class again (a notebook cell run twice) replaces it, another class
    under a taken name, an abstract class, a bad name or a reserved parameter name is one clear error;
    ``unregister`` removes it (meanfield's own models stay)."""
    import jax.numpy as jnp

    import meanfield as mf

    def define():
        class Scaled(mf.kernels.Kernel):
            name = "scaled-test"
            scale: float = mf.kernels.param(1.0, kind="float>0", doc="scale")

            def __call__(self, x, xi, y, zeta):
                return self.scale * jnp.dot(x, y)

        return Scaled

    first, again = define(), define()
    try:
        assert mf.kernels.register(first) is first and "scaled-test" in mf.kernels.MODEL_NAMES
        mf.kernels.register(again)  # the same class defined again: replaces it
        assert mf.kernels.MODELS["scaled-test"].cls is again
        with pytest.raises(ValueError, match="scale must be > 0, got -1"):
            mf.kernels.make("scaled-test", scale=-1)

        class Other(mf.kernels.Kernel):
            name = "scaled-test"

            def __call__(self, x, xi, y, zeta):
                return jnp.dot(x, y)

        with pytest.raises(ValueError, match="a model named 'scaled-test' is already registered"):
            mf.kernels.register(Other)
    finally:
        mf.kernels.unregister("scaled-test")
    assert "scaled-test" not in mf.kernels.MODELS and "scaled-test" not in mf.kernels.MODEL_NAMES
    with pytest.raises(TypeError, match="is abstract"):
        mf.kernels.register(mf.kernels.GaugeKernel)
    with pytest.raises(TypeError, match="subclass of meanfield.models.Model"):
        mf.kernels.register(int)

    class BadName(mf.kernels.Kernel):
        name = "Bad Name"

        def __call__(self, x, xi, y, zeta):
            return jnp.dot(x, y)

    with pytest.raises(ValueError, match="lower-case name"):
        mf.kernels.register(BadName)

    class Reserved(mf.kernels.Kernel):
        name = "reserved-test"
        dt: float = mf.kernels.param(1.0, kind="float>0", doc="clashes with --dt")

        def __call__(self, x, xi, y, zeta):
            return jnp.dot(x, y)

    with pytest.raises(ValueError, match="clash with the command line's own flags"):
        mf.kernels.register(Reserved)
    with pytest.raises(ValueError, match="cannot be unregistered"):
        mf.kernels.unregister("usa")
    with pytest.raises(ValueError, match="kind must be one of"):
        mf.kernels.param(1.0, kind="float>1", doc="x")
