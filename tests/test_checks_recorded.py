"""Every in-program check still raises in a library call, and is recorded in meanfield's own processes.

meanfield checks traced values inside the compiled program with ``equinox.error_if``
(``meanfield._checks``: ``traced_positive``, ``traced_states``, ``traced_finite``,
``traced_labels``; ``Kernel.check_traced_energy``; the continuum's ``ell``/``beta`` checks;
``meanfield.sphere.sample_density``'s run-time errors). Under equinox's default
(``EQX_ON_ERROR=raise``, what ``import meanfield`` in a notebook gets) a failed check stops the
call with an error naming it. meanfield's own processes run with ``EQX_ON_ERROR=nan``
(``meanfield.compilation_cache.configure_process``: programs with host callbacks are never
written to JAX's persistent cache): a failed check turns its value into NaN, which a run records
as failed (``Trajectory.failed``) and a function returns as NaN. ``CASES`` lists every check,
each with a good and a bad value of the traced argument; this module runs them in this process
(they raise) and in a process with ``EQX_ON_ERROR=nan`` (they are recorded), and a test keeps the
list complete against the sources.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: The checks, one case each: ``name: (function of the traced value, good value, bad value, the
#: check's message)``. Each function is called under ``jax.jit`` (``sample_density`` is jitted
#: itself); it returns a ``Trajectory`` (recorded: ``failed``) or arrays (recorded: NaN).
CASES_SOURCE = r'''
import jax, jax.numpy as jnp, numpy as np
import meanfield as mf
from meanfield import continuum, phase_diagram, sphere

x0 = sphere.uniform(jax.random.key(0), 6, 3)
gauges = mf.kernels.random_gauges(jax.random.key(1), 2, 3)
labels = jnp.array([0, 0, 0, 1, 1, 1])
run = dict(t1=0.1, dt=0.05, save_states=False)


def _density(log_bound, max_rounds):
    return lambda: sphere.sample_density(jax.random.key(2), 64, 3, lambda x: 4 * x[2], log_bound=log_bound,
                                         batch=16, max_rounds=max_rounds)


CASES = {
    # Model.check_traced (meanfield.models): traced beta <= 0 or non-finite
    "simulate: traced beta <= 0": (lambda b: mf.simulate(mf.kernels.USA(b), x0, **run), 1.0, -1.0,
                                   "beta must be > 0"),
    "simulate: traced non-finite beta (vmap)": (
        lambda b: jax.vmap(lambda bb: mf.simulate(mf.kernels.USA(bb), x0, **run))(b),
        jnp.array([1.0, 2.0]), jnp.array([1.0, jnp.inf]), "beta must be > 0"),
    "energy: traced beta <= 0": (lambda b: mf.energy(mf.kernels.USA(b), x0), 1.0, -1.0, "beta must be > 0"),
    # Model.check_traced: a traced declared float parameter out of its kind's range
    "field: traced lam < 0 (DistanceBias)": (lambda v: mf.field(mf.kernels.DistanceBias(1.0, v), x0), 1.0,
                                             -1.0, "lam must be >= 0 and finite"),
    "energy: traced non-finite omega (PhaseField)": (
        lambda v: mf.energy(mf.kernels.PhaseField(1.0, mf.kernels.FourierPhase(v, 0.5, 2)), x0), 1.0, jnp.nan,
        "omega must be finite"),
    # traced_states (meanfield.energy.check_states): states off the sphere or non-finite
    "simulate: traced x0 off the sphere": (lambda x: mf.simulate(mf.kernels.USA(1.0), x, **run), x0, 2 * x0,
                                           "x0 must be finite with unit rows"),
    "simulate: traced non-finite x0": (lambda x: mf.simulate(mf.kernels.USA(1.0), x, **run), x0,
                                       x0.at[0, 0].set(jnp.nan), "x0 must be finite with unit rows"),
    "energy: traced x off the sphere": (lambda x: mf.energy(mf.kernels.USA(1.0), x), x0, 2 * x0,
                                        "x must be finite with unit rows"),
    "field: traced x off the sphere": (lambda x: mf.field(mf.kernels.USA(1.0), x), x0, 2 * x0,
                                       "x must be finite with unit rows"),
    # traced_finite (check_states, geometry="euclidean"): tokens in R^d, any norm, finite
    "simulate: traced non-finite x0 in R^d": (
        lambda x: mf.simulate(mf.models.SelfAttention(1.0, geometry="euclidean"), x, **run), 2 * x0,
        x0.at[0, 0].set(jnp.nan), "x0 must be finite"),
    # simulate's r0 (a radius: normalization pre, mix, peri): traced r0 <= 0 or non-finite
    "simulate: traced r0 <= 0": (
        lambda r: mf.simulate(mf.models.SelfAttention(1.0, normalization="pre"), x0, r0=r, **run),
        jnp.ones(6), jnp.ones(6).at[1].set(-1.0), "r0: every radius must be finite and > 0"),
    # traced_finite of a traced real aux (positions)
    "energy: traced non-finite aux": (lambda a: mf.energy(mf.kernels.RoPE(1.0, 1.0), x0, a),
                                      jnp.arange(6.0), jnp.arange(6.0).at[2].set(jnp.nan), "aux must be finite"),
    # ToeplitzSeries.check_traced: traced non-finite c_hat
    "energy: traced non-finite c_hat": (lambda c: mf.energy(mf.kernels.ToeplitzSeries(c), x0),
                                        jnp.array([1.0, 0.5]), jnp.array([1.0, jnp.nan]), "c_hat must be finite"),
    # Prompt.check_traced (traced_labels): labels out of range
    "simulate: traced Prompt labels out of range": (
        lambda a: mf.simulate(mf.kernels.Prompt(1.0, gauges), x0, a, **run), labels, labels.at[0].set(2),
        "Prompt labels must lie in [0, 1]"),
    "energy: traced Prompt labels out of range": (lambda a: mf.energy(mf.kernels.Prompt(1.0, gauges), x0, a),
                                                  labels, labels.at[5].set(-1), "Prompt labels must lie in [0, 1]"),
    # _ExpKernel.check_traced_energy: traced beta past the overflow bound of exp (float32: 88.7)
    "energy: traced beta past the overflow bound": (lambda b: mf.energy(mf.kernels.USA(b), x0), 1.0, 100.0,
                                                    "beta overflows exp"),
    "field: traced beta past the overflow bound": (lambda b: mf.field(mf.kernels.USA(b), x0), 1.0, 100.0,
                                                   "beta overflows exp"),
    "velocity: traced beta past the overflow bound": (lambda b: mf.velocity(mf.kernels.USA(b), x0), 1.0, 100.0,
                                                      "beta overflows exp"),
    # meanfield.continuum._traced_rate_checks: traced beta <= 0, ell < 0, beta past e^beta's overflow
    "continuum.growth_rates: traced beta <= 0": (lambda b: continuum.growth_rates(b, 3, jnp.arange(1, 4)), 1.0,
                                                 -1.0, "beta must be > 0"),
    "continuum.growth_rates: traced ell < 0": (lambda ell: continuum.growth_rates(1.0, 3, ell), jnp.arange(1, 4),
                                               jnp.array([1, -1, 3]), "ell must be >= 0"),
    "continuum.growth_rates: traced beta past the overflow bound": (
        lambda b: continuum.growth_rates(b, 3, jnp.arange(1, 4)), 1.0, 100.0, "beta overflows e^beta"),
    # Model.check_traced: a traced declared integer parameter < 0 (a seed of drawn weights)
    "field: traced weight_seed < 0 (SelfAttention)": (
        lambda s: mf.field(mf.models.SelfAttention(1.0, weights="gaussian", weight_seed=s), x0), 3, -1,
        "weight_seed must be >= 0"),
    # Mask.check_traced (meanfield.masks.ALiBi), called by Model.check_traced: a traced slope < 0 or NaN
    "field: traced ALiBi slope < 0 (USA)": (
        lambda v: mf.field(mf.kernels.USA(1.0, mask=mf.masks.ALiBi(v)), x0), 0.5, -1.0,
        "slope must be >= 0 and finite"),
    # meanfield.phase_diagram.usa_step_size: traced beta or base_dt <= 0
    "phase_diagram.usa_step_size: traced beta <= 0": (lambda b: phase_diagram.usa_step_size(b), jnp.asarray(1.0),
                                                      jnp.asarray(-1.0), "beta must be > 0"),
    "phase_diagram.usa_step_size: traced base_dt <= 0": (
        lambda h: phase_diagram.usa_step_size(jnp.asarray(1.0), h), jnp.asarray(0.1), jnp.asarray(-0.1),
        "base_dt must be > 0"),
    # meanfield.sphere.sample_density: a proposal above log_bound; max_rounds before n points
    "sphere.sample_density: log_density exceeded log_bound": (None, _density(4.0, 1000), _density(1.0, 1000),
                                                              "log_density exceeded log_bound"),
    "sphere.sample_density: max_rounds reached": (None, _density(4.0, 1000), _density(4.0, 1),
                                                  "max_rounds reached"),
}


def leaves(out):
    """(``failed`` flags or None, the float leaves) of a case's output."""
    failed = None
    if isinstance(out, mf.Trajectory):
        failed = np.asarray(out.failed).tolist()
    arrays = [np.asarray(v) for v in jax.tree_util.tree_leaves(out)]
    return failed, [a for a in arrays if np.issubdtype(a.dtype, np.floating)]


def call(name, which):
    fn, good, bad, _ = CASES[name]
    value = good if which == "good" else bad
    if fn is None:  # sample_density: the compiled program is the library's own
        return value()
    return jax.jit(fn)(value)


def recorded(name):
    """In a process with EQX_ON_ERROR=nan: how the good and the bad value came out."""
    result = {}
    for which in ("good", "bad"):
        try:
            failed, arrays = leaves(call(name, which))
        except Exception as e:  # noqa: BLE001 -- reported, the test says it should not raise
            result[which] = {"raised": f"{type(e).__name__}: {e}"[:500]}
            continue
        result[which] = {"failed": failed, "nan": any(bool(np.isnan(a).any()) for a in arrays),
                         "finite": all(bool(np.isfinite(a).all()) for a in arrays)}
    return result
'''

_SCRIPT = (
    CASES_SOURCE
    + r"""
import equinox._config, json, sys
assert equinox._config.EQX_ON_ERROR == "nan", equinox._config.EQX_ON_ERROR
print("RESULT " + json.dumps({name: recorded(name) for name in CASES}))
"""
)


def _namespace() -> dict:
    ns: dict = {}
    exec(compile(CASES_SOURCE, "<checks cases>", "exec"), ns)  # noqa: S102 -- this module's own source
    return ns


CASE_NAMES = list(_namespace()["CASES"])


@pytest.fixture(scope="module")
def cases():
    return _namespace()


@pytest.fixture(scope="module")
def recorded_in_nan_mode():
    env = {k: v for k, v in os.environ.items() if k != "MEANFIELD_COMPILATION_CACHE"}
    env["EQX_ON_ERROR"] = "nan"
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=1200
    )
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.slow
@pytest.mark.parametrize("name", CASE_NAMES)
def test_check_raises_in_a_library_call(cases, name):
    """Default library mode (this process, ``EQX_ON_ERROR`` unset): the good value runs, the bad one
    raises equinox's run-time error with the check's message."""
    import equinox._config

    if equinox._config.EQX_ON_ERROR != "raise":
        pytest.skip(f"this process runs with EQX_ON_ERROR={equinox._config.EQX_ON_ERROR}")
    message = cases["CASES"][name][3]
    failed, arrays = cases["leaves"](cases["call"](name, "good"))
    assert all(bool(a.size == 0 or __import__("numpy").isfinite(a).all()) for a in arrays)
    assert failed is None or not any(failed if isinstance(failed, list) else [failed])
    with pytest.raises(Exception, match=re.escape(message)):
        cases["leaves"](cases["call"](name, "bad"))


@pytest.mark.slow
@pytest.mark.parametrize("name", CASE_NAMES)
def test_check_is_recorded_under_eqx_on_error_nan(recorded_in_nan_mode, name):
    """meanfield's own processes (``EQX_ON_ERROR=nan``): nothing raises; the good value gives finite
    numbers, the bad one NaN, and a ``Trajectory`` says ``failed``."""
    good, bad = recorded_in_nan_mode[name]["good"], recorded_in_nan_mode[name]["bad"]
    assert "raised" not in good and "raised" not in bad, (good, bad)
    assert good["finite"] and not good["nan"], good
    assert bad["nan"], bad
    if bad["failed"] is not None:  # a Trajectory (under vmap: one flag per run)
        flags = bad["failed"] if isinstance(bad["failed"], list) else [bad["failed"]]
        good_flags = good["failed"] if isinstance(good["failed"], list) else [good["failed"]]
        assert any(flags) and not any(good_flags), (good, bad)
        if name.endswith("(vmap)"):
            # equinox reduces a check's condition over the vmapped batch (as a raised error stops
            # the whole call): every run of the batch is recorded as failed, not only the bad one
            assert flags == [True, True]


_CALLS = re.compile(
    r"\b(traced_positive|traced_states|traced_finite|traced_labels|_error_if|eqx\.error_if|"
    r"check_traced_energy|check_traced)\("
)


def test_every_check_site_has_a_case():
    """The sources hold the in-program checks listed here (a new ``error_if`` needs a case above)."""
    root = Path(__file__).resolve().parents[1] / "meanfield"
    sites = {}
    for path in sorted(root.rglob("*.py")):
        if path.name == "_checks.py":  # the helpers themselves
            continue
        for line in path.read_text().splitlines():
            code = line.split("#")[0]
            if code.lstrip().startswith(("def ", ">>>")):
                continue
            for m in _CALLS.finditer(code):
                key = f"{path.relative_to(root.parent)}:{m.group(1)}"
                sites[key] = sites.get(key, 0) + 1
    # where each check is attached, and the cases above that exercise it
    expected = {
        "meanfield/models.py:traced_positive": 1,  # Model.check_traced: beta, float>0 parameters
        # Model.check_traced: float>=0 parameters (lam); integer parameters >= 0 (weight_seed)
        "meanfield/models.py:_error_if": 2,
        # Model.check_traced: float parameters (omega); check_states: aux, tokens in R^d
        "meanfield/models.py:traced_finite": 3,
        "meanfield/integrate.py:eqx.error_if": 1,  # simulate: a traced r0 <= 0 or non-finite
        "meanfield/models.py:traced_states": 1,  # check_states (simulate's x0, energy/field/velocity's x)
        "meanfield/models.py:check_traced": 2,  # check_states: the model's own; the mask's (ALiBi)
        "meanfield/masks.py:_error_if": 1,  # ALiBi.check_traced: a slope < 0 or not finite
        "meanfield/energy.py:check_traced_energy": 2,  # energy; field and velocity
        "meanfield/kernels/_exp.py:_error_if": 1,  # _ExpKernel.check_traced_energy: overflow
        "meanfield/kernels/_toeplitz.py:traced_finite": 1,  # ToeplitzSeries: c_hat
        "meanfield/kernels/_gauge.py:traced_labels": 1,  # Prompt: labels
        "meanfield/kernels/_toeplitz.py:check_traced": 1,  # ToeplitzSeries calls the parent's
        "meanfield/kernels/_gauge.py:check_traced": 1,  # Prompt calls the parent's
        "meanfield/continuum.py:traced_positive": 1,  # beta
        "meanfield/continuum.py:_error_if": 2,  # ell < 0; beta past e^beta's overflow
        "meanfield/phase_diagram.py:traced_positive": 2,  # beta, base_dt
        "meanfield/sphere.py:eqx.error_if": 2,  # sample_density: bound, rounds
    }
    found = {
        k: v
        for k, v in sites.items()
        if not k.endswith((":check_traced", ":check_traced_energy"))
        or k.startswith(("meanfield/energy.py", "meanfield/models.py", "meanfield/kernels/"))
    }
    assert found == expected, (
        f"in-program checks changed: {found} (add or remove cases in CASES_SOURCE)"
    )
    # each kind of check has at least one case
    names = " ".join(CASE_NAMES)
    for phrase in (
        "beta <= 0",
        "off the sphere",
        "non-finite x0",
        "non-finite aux",
        "non-finite c_hat",
        "lam < 0",
        "non-finite omega",
        "Prompt labels",
        "overflow bound",
        "ell < 0",
        "base_dt <= 0",
        "log_bound",
        "max_rounds",
    ):
        assert phrase in names
