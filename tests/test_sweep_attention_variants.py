"""Sweeps over the attention variants of issue 28 (masks on every model, ``sa``'s attention
normalisations, heads and random weights): the optional ``[model]`` keys keep the hashes of
older specs, ``weight_seed`` is an integer grid axis of one compilation, a masked kernel has no
energy, and the points equal ``mf.simulate`` of the registry's model (docs/sweeps.md, "Masks and
attention variants")."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import sweep

ROOT = Path(__file__).resolve().parents[1]

#: The hashes of these specs as parsed at commit 084d8db~1, before the optional parameters
#: existed (measured in a `git worktree` of that commit): the stores written then still resume.
OLD_HASHES = {
    "sweeps/smoke.toml": "3ed94be9685477e8a2172533258be5b737b0742be7b1934b2164746be8cc9df9",
    "sweeps/usa_av_fig2.toml": "ecbe7ae24ee37998c38fd6f95651a9203150856203d6656715b7e588d9687ca0",
    "sweeps/usa_reference_steps.toml": "96d790875bd2a1c32629d4d0e4b733857cc8c7326f4b5a5a7f012067cf95ae65",
    "sweeps/attention_fig3_grid.toml": "1ee115aa1d260705b07cbd8875896e70bd9221c231fef6fe6a5629d270adaeee",
}
OLD_INLINE = {
    '[model]\nkind = "sa"\nnormalized = true\n[grid]\nn = [8]\nbeta = [1.0, 2.0]\nseeds = 2\n'
    "[time]\nt1 = 1.0\ndt = 0.1\n": "2fe3c1782fcc817a70f82765d6ccb8e29c02bec3197e9737ab892a8e5cca76fd",
    '[model]\nkind = ["usa", "distance-bias"]\nlam = [0.5, 1.0]\n[grid]\nn = [8]\nbeta = [1.0]\n'
    'seeds = 2\n[time]\nt1 = 1.0\ndt = 0.1\nsolver = "euler"\nstep = "renormalize"\n': (
        "5d7679ab4f182eb027d264c45a2c9e3cf4756f1f1063fc6726fad6107bbdc92e"
    ),
    '[model]\nkind = "gauge"\namplitude = [0.3, 0.6]\n[grid]\nn = [8]\nbeta = [1.0]\nseeds = 2\n'
    "[time]\nt1 = 1.0": "b29246461319c3eadd01c42677614212484941fbf41e889d6faf2bf076f1e80a",
}

GRID = "[grid]\nn = [6]\nbeta = [0.5, 1.0]\nseeds = 2\n[time]\nt1 = 0.5\ndt = 0.05\nsave = 3\n"


def _spec(model: str, rest: str = GRID) -> sweep.Spec:
    return sweep.parse_spec("[model]\n" + model + "\n" + rest)


def _direct(params: dict, name: str, seed: int, ts: np.ndarray) -> mf.Trajectory:
    x0 = mf.sphere.uniform(jax.random.key(seed), 6, 3)
    return mf.simulate(
        mf.kernels.make(name, d=3, **params),
        x0,
        t1=float(ts[-1]),
        dt=0.05,
        solver="rk2",
        ts=ts,
        save_states=False,
    )


@pytest.mark.parametrize("path", sorted(OLD_HASHES))
def test_shipped_specs_keep_their_hash(path):
    assert sweep.load_spec(ROOT / path).hash == OLD_HASHES[path]


def test_inline_specs_keep_their_hash():
    for text, h in OLD_INLINE.items():
        spec = sweep.parse_spec(text)
        assert spec.hash == h, text
        assert not set(spec.data["model"]) & {p.name for p in mf.masks.MASK_PARAMS}


def test_defaults_given_explicitly_are_the_same_spec():
    plain = _spec('kind = "sa"')
    explicit = _spec(
        'kind = "sa"\nmask = "none"\nattention = "softmax"\nheads = 1\nweights = "identity"\n'
        'value = "identity"\nweight_seed = 0\nregen_period = 0.0'
    )
    assert explicit.hash == plain.hash and explicit.params == plain.params
    other = _spec('kind = "sa"\nheads = 2')
    assert other.hash != plain.hash and other.data["model"]["heads"] == 2


@pytest.mark.parametrize(
    "model, match",
    [
        (
            'kind = "usa"\nslope = 0.5',
            "model.slope = 0.5 applies with model.mask = 'alibi', not 'none'",
        ),
        (
            'kind = "usa"\nmask = "causal"\nwidth = 2',
            "model.width = 2 applies with model.mask = 'window'",
        ),
        (
            'kind = "usa"\ninclude_self = false',
            "model.include_self = False applies with model.mask",
        ),
        (
            'kind = "sa"\nsinkhorn_iters = 3',
            "model.sinkhorn_iters = 3 applies with model.attention = 'sinkhorn'",
        ),
        (
            'kind = "sa"\nattention = "sinkhorn"\ntie_tol = 0.1',
            "model.tie_tol = 0.1 applies with model.attention = 'hardmax'",
        ),
        (
            'kind = "sa"\nalpha = 0.5',
            "model.alpha = 0.5 applies with model.normalization = 'ngpt'",
        ),
        (
            'kind = "usa"\nmask = "causal"\nwindow_causal = true',
            "model.window_causal = True applies with model.mask = 'window'",
        ),
        (
            'kind = "sa"\nweight_seed = [0, 2147483648]',
            "model.weight_seed = 2147483648 must be <= 2147483647",
        ),
        ('kind = "sa"\nheads = 0', "model.heads must be >= 1"),
        ('kind = "sa"\nheads = [1, 1]', "model.heads values must be distinct"),
        ('kind = "sa"\nheads = []', "model.heads must be a value or a non-empty list"),
        ('kind = "usa"\nmask = "nope"', "model.mask"),
        ('kind = "usa"\nattention = "sinkhorn"', "unknown key 'attention' in [model]"),
    ],
)
def test_bad_variant_keys(model, match):
    with pytest.raises((ValueError, TypeError), match=re.escape(match)):
        _spec(model)


@pytest.mark.parametrize(
    "model, output, match",
    [
        (
            'kind = "usa"\nmask = "alibi"',
            '["energy"]',
            "unknown observable 'energy' for kind 'usa' with model.mask = 'alibi' (meanfield defines no pair energy for a masked interaction (causal and ALiBi masks and row-normalised weights are not symmetric: no gradient flow))",
        ),
        (
            'kind = "rope"\nmask = "window"',
            '["num_plateaus"]',
            "unknown observable 'num_plateaus' for kind 'rope' with model.mask = 'window'",
        ),
        (
            'kind = ["usa", "sa"]',
            '["energy"]',
            "unknown observable 'energy' for kind 'sa'; accepted",
        ),
    ],
)
def test_energy_observables_of_a_masked_kernel_are_refused(model, output, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        _spec(model, GRID + f"[output]\nobservables = {output}\n")


def test_early_stop_of_a_masked_kernel_is_refused():
    with pytest.raises(
        ValueError, match=re.escape("kind 'usa' with model.mask = 'causal' has none")
    ):
        _spec('kind = "usa"\nmask = "causal"', GRID + "early_stop = 1e-6\n")


def test_masked_default_observables_have_no_energy():
    assert _spec('kind = "usa"').observables == ("collapse_gap", "energy")
    assert _spec('kind = "usa"\nmask = "causal"').observables == ("collapse_gap",)


def test_weight_seed_axis_compiles_once_and_equals_simulate(tmp_path, monkeypatch):
    """3 weight_seeds x 2 betas x 2 seeds, chunked into many chunks: one trace of the point
    program, every point the registry's model with that integer seed."""
    import meanfield.integrate as integrate

    spec = _spec('kind = "sa"\nweights = "gaussian"\nvalue = "gaussian"\nweight_seed = [0, 1, 7]')
    assert spec.axes["weight_seed"].dtype.kind == "i"
    calls: list[int] = []
    real = integrate.simulate
    monkeypatch.setattr(integrate, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    plan = sweep.run_sweep(spec, tmp_path / "ws.zarr", memory="1B", quiet=True)
    assert len(plan.groups) == 1 and len(plan.chunks) > 1
    assert len(calls) == 1  # one compilation for the (beta, weight_seed, seed) grid
    ds = sweep.load(tmp_path / "ws.zarr")
    assert ds["collapse_gap"].dims == ("n", "beta", "weight_seed", "seed", "time")
    np.testing.assert_array_equal(ds["weight_seed"].values, [0, 1, 7])
    np.testing.assert_array_equal(ds["status"].values, sweep.OK)
    ts = ds["time"].values
    finals = []
    for ws in (0, 1, 7):
        for beta in (0.5, 1.0):
            params = {"beta": beta, "weights": "gaussian", "value": "gaussian", "weight_seed": ws}
            tr = real(
                mf.kernels.make("sa", d=3, **params),
                mf.sphere.uniform(jax.random.key(1), 6, 3),
                t1=0.5,
                dt=0.05,
                solver="rk2",
                ts=ts,
                save_states=False,
            )
            point = ds["collapse_gap"].sel(n=6, beta=beta, weight_seed=ws, seed=1).values
            np.testing.assert_allclose(point, tr.collapse_gap, rtol=2e-5, atol=1e-6)
        finals.append(ds["collapse_gap"].sel(n=6, beta=1.0, seed=1, weight_seed=ws).values[-1])
    assert len(set(np.round(finals, 5))) == 3  # the weights differ across weight seeds


def test_masked_usa_sweep_runs_and_records_no_energy(tmp_path):
    spec = _spec('kind = "usa"\nmask = "alibi"\nslope = [0.5, 4.0]')
    assert spec.axes["slope"].tolist() == [0.5, 4.0]
    sweep.run_sweep(spec, tmp_path / "alibi.zarr", quiet=True)
    ds = sweep.load(tmp_path / "alibi.zarr")
    assert "energy" not in ds.data_vars and ds.attrs["model.mask"] == "alibi"
    np.testing.assert_array_equal(ds["status"].values, sweep.OK)
    ts = ds["time"].values
    for slope in (0.5, 4.0):
        tr = _direct({"beta": 1.0, "mask": "alibi", "slope": slope}, "usa", 0, ts)
        assert tr.energy is None
        np.testing.assert_allclose(
            ds["collapse_gap"].sel(n=6, beta=1.0, slope=slope, seed=0).values,
            tr.collapse_gap,
            rtol=2e-5,
            atol=1e-6,
        )


def test_ngpt_alpha_axis_with_a_causal_window_equals_simulate(tmp_path):
    spec = _spec(
        'kind = "sa"\nnormalization = "ngpt"\nalpha = [0.1, 0.5]\nmask = "window"\nwidth = 2\n'
        "window_causal = true"
    )
    assert spec.axes["alpha"].tolist() == [0.1, 0.5]
    sweep.run_sweep(spec, tmp_path / "ngpt.zarr", quiet=True)
    ds = sweep.load(tmp_path / "ngpt.zarr")
    assert ds.attrs["model.normalization"] == "ngpt" and ds.attrs["model.window_causal"]
    np.testing.assert_array_equal(ds["status"].values, sweep.OK)
    ts = ds["time"].values
    gaps = []
    for alpha in (0.1, 0.5):
        params = {"beta": 1.0, "normalization": "ngpt", "alpha": alpha, "mask": "window"}
        tr = _direct({**params, "width": 2, "window_causal": True}, "sa", 0, ts)
        got = ds["collapse_gap"].sel(n=6, beta=1.0, alpha=alpha, seed=0).values
        np.testing.assert_allclose(got, tr.collapse_gap, rtol=2e-5, atol=1e-6)
        gaps.append(got[-1])
    assert gaps[1] < gaps[0]  # a larger step factor collapses faster


@pytest.mark.parametrize(
    "model, params, name",
    [
        ('kind = "usa"\nmask = "causal"', {"mask": "causal"}, "usa"),
        (
            'kind = "sa"\nattention = "sinkhorn"\nsinkhorn_iters = 5\nheads = 2\nweights = "gaussian"',
            {"attention": "sinkhorn", "sinkhorn_iters": 5, "heads": 2, "weights": "gaussian"},
            "sa",
        ),
    ],
)
def test_causal_usa_and_sinkhorn_sa_sweeps_equal_simulate(tmp_path, model, params, name):
    spec = _spec(model)
    assert spec.observables == ("collapse_gap",)
    sweep.run_sweep(spec, tmp_path / "v.zarr", quiet=True)
    ds = sweep.load(tmp_path / "v.zarr")
    assert "energy" not in ds.data_vars
    np.testing.assert_array_equal(ds["status"].values, sweep.OK)
    ts = ds["time"].values
    for beta in (0.5, 1.0):
        tr = _direct({"beta": beta, **params}, name, 1, ts)
        np.testing.assert_allclose(
            ds["collapse_gap"].sel(n=6, beta=beta, seed=1).values,
            tr.collapse_gap,
            rtol=2e-5,
            atol=1e-6,
        )


def test_model_refusal_is_one_line_exit_2(tmp_path, capsys):
    """A combination the model refuses (hardmax is normalised) stops the sweep before anything
    runs: one line, status 2."""
    from meanfield.sweep import cli as sweep_cli

    path = tmp_path / "hard.toml"
    path.write_text('[model]\nkind = "sa"\nattention = "hardmax"\nnormalized = false\n' + GRID)
    rc = sweep_cli.console([str(path), "--out", str(tmp_path / "x.zarr")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "hardmax" in err, err
    assert not (tmp_path / "x.zarr").exists()


def test_docs_table_lists_every_optional_parameter():
    """docs/sweeps.md's table of optional keys: every optional parameter of the registry, each
    with its registry default."""
    text = (ROOT / "docs" / "sweeps.md").read_text()
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(\w+)` \|[^|]*\|([^|]*)\|", text, flags=re.MULTILINE)
    }
    optional = {p.name: p for e in mf.kernels.MODELS.values() for p in e.params if p.optional}
    assert set(optional) <= set(rows), set(optional) - set(rows)
    for name, p in optional.items():
        if p.kind == "choice":
            shown = f'`"{p.default}"`'
        elif p.kind == "bool":
            shown = str(p.default).lower()
        else:
            shown = f"{p.default:g}"
        assert f"({shown}" in rows[name], (name, shown, rows[name])
