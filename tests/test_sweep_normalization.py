"""The normalisation schemes (issue 29, ``mf.normalization``) in sweeps and phase diagrams: one
behaviour per name. A sweep point with ``model.normalization`` equals ``mf.simulate`` of the
registry's model; ``alpha`` and ``switch_time`` are traced grid axes; the radius is recorded as
``mean_radius``; the optional keys keep older hashes. ``sa_phase_diagram(normalization=)`` steps
as ``mf.simulate(solver="euler")`` of ``mf.models.SelfAttention(normalization=)``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import phase_diagram as pd
from meanfield import sweep


def _spec(kind: str, model: str = "", output: str = "", time: str = "") -> str:
    return (
        f"[model]\nkind = {kind}\n{model}\n[grid]\nn = [6]\nbeta = [1.0]\nseeds = 2\n"
        f"[time]\nt1 = 0.4\ndt = 0.1\nsave = 3\n{time}\n{output}"
    )


def test_optional_keys_keep_the_hash_and_are_recorded_when_set():
    plain = sweep.parse_spec(_spec('"usa"'))
    post = sweep.parse_spec(_spec('"usa"', 'normalization = "post"\nalpha = 0.2'))
    assert plain.hash == post.hash and "normalization" not in plain.data["model"]
    mix = sweep.parse_spec(_spec('"sa"', 'normalization = "mix"\nswitch_time = [0.1, 0.3]'))
    assert mix.data["model"]["normalization"] == "mix"
    assert mix.data["model"]["switch_time"] == [0.1, 0.3]
    assert list(mix.axes) == ["beta", "switch_time"] and mix.hash != plain.hash


@pytest.mark.parametrize(
    "kind, model, output, time, needle",
    [
        ('"usa"', 'normalization = ["pre", "pre"]', "", "", "values must be distinct"),
        ('"usa"', 'normalization = "bogus"', "", "", "model.normalization"),
        ('"usa"', "alpha = 0.5", "", "", "model.alpha = 0.5 applies with model.normalization"),
        ('"usa"', 'normalization = "pre"\nswitch_time = 2.0', "", "", "model.switch_time = 2.0"),
        ('"usa"', 'normalization = "pre"\nalpha = [0.1, 0.3]', "", "", "model.alpha"),
        ('"toeplitz"', 'normalization = "pre"', "", "", "normalization"),
        (
            '"usa"',
            "",
            '[output]\nobservables = ["mean_radius"]',
            "",
            "'mean_radius' needs tokens with a radius: model.normalization = 'pre' or 'mix' or "
            "'peri', not 'post'",
        ),
        (
            '["usa", "toeplitz"]',
            'normalization = "pre"',
            '[output]\nobservables = ["mean_radius"]',
            "",
            "kind 'toeplitz' takes no model.normalization",
        ),
        (
            '"usa"',
            'normalization = "peri"',
            "",
            'solver = "euler"\nstep = "renormalize"',
            "model.normalization = 'peri' has a radius",
        ),
    ],
)
def test_bad_specs_are_one_clear_error(kind, model, output, time, needle):
    with pytest.raises((ValueError, TypeError)) as e:
        sweep.parse_spec(_spec(kind, model, output, time))
    assert needle in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


@pytest.mark.parametrize(
    "kind, model, params",
    [
        ("usa", 'normalization = "pre"', {"normalization": "pre"}),
        ("sa", 'normalization = "mix"\nswitch_time = [0.15, 0.25]', {"normalization": "mix"}),
        ("rope", 'normalization = "ngpt"\nalpha = [0.1, 0.3]', {"normalization": "ngpt"}),
        ("usa", 'normalization = "scaling"', {"normalization": "scaling"}),
    ],
)
def test_sweep_points_equal_simulate(kind, model, params, tmp_path):
    """Every point (and ``mean_radius`` for the schemes with a radius) equals ``mf.simulate``
    of ``mf.kernels.make(kind, ...)`` from the same seed, to float32 rounding."""
    radial = params["normalization"] in mf.normalization.RADIAL
    obs = '["collapse_gap", "mean_radius"]' if radial else '["collapse_gap"]'
    spec = sweep.parse_spec(_spec(f'"{kind}"', model, f"[output]\nobservables = {obs}"))
    sweep.run_sweep(spec, tmp_path / "s.zarr", quiet=True)
    ds = sweep.load(tmp_path / "s.zarr")
    assert np.all(ds["status"].values == sweep.OK)
    axis = next((a for a in ("switch_time", "alpha") if a in spec.axes), None)
    for value in spec.axes[axis] if axis else [None]:
        extra = {} if axis is None else {axis: float(value)}
        sel = {"n": 6, "beta": 1.0, **({} if axis is None else {axis: value})}
        m = mf.kernels.make(kind, d=3, beta=1.0, **params, **extra)
        for seed in (0, 1):
            x0 = mf.sphere.uniform(jax.random.key(seed), 6, 3)
            traj = mf.simulate(m, x0, t1=0.4, dt=0.1, ts=spec.ts)
            got = ds["collapse_gap"].sel(seed=seed, **sel).values
            np.testing.assert_allclose(got, np.asarray(traj.collapse_gap), rtol=1e-5, atol=1e-6)
            if radial:
                r = ds["mean_radius"].sel(seed=seed, **sel).values
                np.testing.assert_allclose(r, np.asarray(traj.radius).mean(axis=1), rtol=1e-5)
                assert r[0] == pytest.approx(1.0, rel=1e-6) and r[-1] > r[0]  # Pre-LN: r grows


# ------------------------------------------------------------------ phase diagrams


def _diagram_states(x0, scheme: dict, t1: float, dt: float, r0=None):
    """Final directions of ``sa_phase_diagram(normalization=...)`` (its private sweep)."""
    N, h, idx = pd.checkpoint_steps(t1, dt, 3)
    x = jnp.asarray(x0) if r0 is None else jnp.asarray(x0) * r0
    attn = pd._Systems(mf.models.SelfAttention(1.5, **scheme))
    _, xs = pd._sweep(
        x, np.array([1.5]), [h], [N], [idx], 0.999, True, False, None,
        states=True, backend="xla", systems=attn,
    )  # fmt: skip
    return xs[0], N


@pytest.mark.parametrize(
    "scheme, r0",
    [
        ({"normalization": "pre"}, 2.0),
        ({"normalization": "mix", "switch_time": 0.3}, None),
        ({"normalization": "peri"}, None),
        ({"normalization": "ngpt", "alpha": 0.5}, None),
        ({"normalization": "scaling"}, None),
    ],
)
def test_phase_diagram_steps_as_simulate_euler(x64, scheme, r0):
    """The diagram's Euler iterates of each scheme equal ``mf.simulate(solver="euler")`` of
    ``SelfAttention(normalization=...)`` (float64, to rounding); Mix-LN's switch time on the grid."""
    x0 = np.asarray(mf.sphere.uniform(jax.random.key(3), 5, 3, jnp.float64))[None]
    xs, N = _diagram_states(x0, scheme, t1=0.6, dt=0.1, r0=r0)
    model = mf.models.SelfAttention(1.5, **scheme)
    traj = mf.simulate(
        model, jnp.asarray(x0[0]), t1=0.6, dt=0.1, solver="euler", ts=[0.0, 0.6], r0=r0
    )
    assert N == 6
    np.testing.assert_allclose(xs[0], np.asarray(traj.xs[-1]), rtol=0, atol=1e-12)


def test_sa_phase_diagram_takes_the_schemes_and_refuses_bad_combinations():
    key = jax.random.key(0)
    kw = dict(n=6, d=3, seeds=2, t1=0.5, checkpoints=3)
    post = pd.sa_phase_diagram(key, [1.0], **kw)
    for scheme in ({"normalization": "pre", "r0": 2.0}, {"normalization": "ngpt", "alpha": 0.3}):
        frac = pd.sa_phase_diagram(key, [1.0], **kw, **scheme)
        assert frac.shape == post.shape and np.all((frac >= 0) & (frac <= 1))
    bad = [
        ({"normalization": "pre", "step": "renormalize"}, "has a radius: use step='projected'"),
        ({"r0": 2.0}, "r0 is the initial radius of the schemes with one"),
        ({"normalization": "peri", "r0": -1.0}, "r0"),
        ({"alpha": 0.5}, "alpha = 0.5 applies with normalization = 'ngpt'"),
        (
            {"normalization": "pre", "backend": "native"},
            "normalization='pre' run(s) the engine's XLA",
        ),
        ({"normalization": "bogus"}, "normalization"),
    ]
    for extra, needle in bad:
        with pytest.raises(ValueError, match=None) as e:
            pd.sa_phase_diagram(key, [1.0], **kw, **extra)
        assert needle in str(e.value), (extra, str(e.value))
