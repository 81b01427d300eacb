"""A sweep kind defined outside meanfield: a new kind is a new module (here, this test module),
not branches in spec, plan, run or plot (meanfield/sweep/spec.py, ``SweepKind``).

The toy kind ``toy-mean`` draws ``n`` uniform points on $S^{d-1}$ per seed
(``mf.sphere.uniform(jax.random.key(seed), n, d)``) and records ``scaled_norm``
$= \\beta \\|\\frac1n \\sum_i x_i\\|$ and ``top_coords``, the ``top_k`` largest first
coordinates in decreasing order (a ``rank`` dimension): both recomputed here per point.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import sweep
from meanfield._params import Param
from meanfield._resources import Cost
from meanfield.sweep import spec as sweep_spec
from meanfield.sweep.spec import ParticleGrid, PointProgram, Spec, register_kind

_OBSERVABLES = ("scaled_norm", "top_coords")


class ToyMean(ParticleGrid):
    """``beta`` times the norm of the mean of ``n`` uniform points, and their top first coordinates."""

    name: ClassVar[str] = "toy-mean"
    summary: ClassVar[str] = "a test kind"
    timed: ClassVar[bool] = False
    ranked: ClassVar[bool] = True
    descriptions: ClassVar[dict[str, str]] = {
        "scaled_norm": "beta |mean of the points|",
        "top_coords": "largest first coordinates x_(1..k)",
    }

    def spec_names(self) -> tuple[str, ...]:
        return (self.name,)

    def model_params(self, model: str) -> tuple[Param, ...]:
        return (Param("beta", 1.0, True, "float>0", "the scale"),)

    def observables(self, kinds: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return _OBSERVABLES, ("scaled_norm",)

    def point_memory(self, spec: Spec, model: str, n: int, d: int) -> int:
        return 4 * (3 * n * d + 2 * n) + 256

    def cost(self, spec: Spec, model: str, n: int, d: int, batch: int, point_bytes: int) -> Cost:
        return Cost(
            steps=0, saves=0, bytes=point_bytes * batch, work=4.0 * batch * n * d, batch=batch
        )

    def point_program(self, spec: Spec, model: str, n: int, d: int) -> PointProgram:
        from meanfield.sweep import store

        dtype = jnp.dtype(spec.dtype)
        k = spec.top_k

        def toy(params: dict[str, Any], seed: Any) -> dict[str, Any]:
            x = mf.sphere.uniform(jax.random.key(seed), n, d, dtype)
            out = {
                "scaled_norm": params["beta"].astype(dtype) * jnp.linalg.norm(x.mean(axis=0)),
                "top_coords": jax.lax.top_k(x[:, 0], k)[0],
            }
            out = {o: out[o] for o in spec.observables}
            ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in out.values()]))
            out["status"] = jnp.where(ok, store.OK, store.FAILED).astype(jnp.int8)
            return out

        return toy

    def output_layout(self, spec: Spec) -> dict[str, tuple[str, ...]]:
        return {o: (("rank",) if o == "top_coords" else ()) for o in spec.observables}

    def point_store_bytes(self, spec: Spec) -> int:
        return sum(spec.top_k if o == "top_coords" else 1 for o in spec.observables) * 4 + 1

    def describe_notes(self, spec: Spec) -> list[str]:
        return ["toy-mean: beta |mean of n uniform points|"]


SPEC = """
name = "toy"
[model]
kind = "toy-mean"
[grid]
n = [5, 16]
d = 3
beta = [0.5, 2.0, 3.0]
seeds = 3
seed = 7
[output]
observables = ["scaled_norm", "top_coords"]
top_k = 4
"""


@pytest.fixture
def toy_kind():
    """The toy kind, registered for one test and removed after it (other tests never see it)."""
    sweep_spec.sweep_kinds()  # meanfield's own kinds loaded first
    assert "toy-mean" not in sweep_spec.kind_names()
    kind = register_kind(ToyMean())
    try:
        yield kind
    finally:
        del sweep_spec._KINDS[kind.name]
    assert "toy-mean" not in sweep_spec.kind_names()


def _reference(n: int, d: int, seed: int, k: int) -> tuple[float, np.ndarray]:
    """``|mean|`` and the top ``k`` first coordinates of the points of ``seed``, in NumPy."""
    x = np.asarray(mf.sphere.uniform(jax.random.key(seed), n, d), np.float64)
    return float(np.linalg.norm(x.mean(axis=0))), np.sort(x[:, 0])[::-1][:k]


def test_outside_kind_end_to_end(toy_kind, tmp_path, capsys):
    spec = sweep.parse_spec(SPEC)
    assert spec.sweep_kind is toy_kind and sweep_spec.kind_of("toy-mean") is toy_kind
    assert spec.grid_size == 2 * 3 * 3 and spec.time is None

    # the plan (meanfield sweep --dry-run) asks the kind
    plan = sweep.make_plan(spec, "2GB", devices=1)
    text = plan.describe()
    assert "model toy-mean, 18 points (n=2 x beta=3 x seed=3)" in text
    assert "toy-mean: beta |mean of n uniform points|" in text
    assert {(g.kind, g.n, g.d) for g in plan.groups} == {("toy-mean", 5, 3), ("toy-mean", 16, 3)}
    dry = sweep.run_sweep(SPEC, tmp_path / "never.zarr", dry_run=True, quiet=True)
    assert dry.describe() == text and not (tmp_path / "never.zarr").exists()
    (tmp_path / "toy.toml").write_text(SPEC)
    code = sweep.main(
        [str(tmp_path / "toy.toml"), "--out", str(tmp_path / "never.zarr"), "--dry-run"]
    )
    assert code == 0 and "model toy-mean, 18 points" in capsys.readouterr().out
    assert not (tmp_path / "never.zarr").exists()

    # run it, open the store, compare every point with its recomputation
    out = tmp_path / "toy.zarr"
    sweep.run_sweep(SPEC, out, quiet=True)
    ds = sweep.load(out)
    assert ds.attrs["model"] == "toy-mean" and ds.attrs["chunks_done"] == ds.attrs["chunks_total"]
    assert ds["scaled_norm"].dims == ("n", "beta", "seed")
    assert ds["top_coords"].dims == ("n", "beta", "seed", "rank")
    assert ds["scaled_norm"].dtype == np.float32
    np.testing.assert_array_equal(ds["rank"].values, [1, 2, 3, 4])
    np.testing.assert_array_equal(ds["seed"].values, [7, 8, 9])
    assert ds["scaled_norm"].attrs["description"] == "beta |mean of the points|"
    assert np.all(ds["status"].values == sweep.OK)
    checked = 0
    for n in (5, 16):
        for seed in (7, 8, 9):
            norm, top = _reference(n, 3, seed, 4)
            for beta in (0.5, 2.0, 3.0):
                point = ds.sel(n=n, beta=beta, seed=seed)
                np.testing.assert_allclose(
                    float(point["scaled_norm"]), beta * norm, rtol=2e-6, atol=1e-7
                )
                np.testing.assert_allclose(point["top_coords"].values, top, rtol=2e-6, atol=1e-7)
                checked += 1
    assert checked == spec.grid_size
    # the numbers are not trivially the same across seeds or sizes (the check can fail)
    values = ds["scaled_norm"].sel(beta=2.0).values
    assert len(np.unique(np.round(values, 6))) == values.size

    # the standard figures of the store draw without a built-in kind
    figs = sweep.plot_store(out, tmp_path / "figs")
    assert figs and all(p.exists() for p in figs)


def test_outside_kind_in_errors(toy_kind):
    with pytest.raises(ValueError, match="toy-mean") as err:
        sweep.parse_spec("[model]\nkind = 'no-such-kind'\n[grid]\nn = [8]\nseeds = 1")
    assert "attention" in str(err.value) and "continuum" in str(err.value)
    # its own schema: no [time] (timed = False), top_k <= n (ranked), its observables
    with pytest.raises(ValueError, match=r"\[time\] does not apply to kind 'toy-mean'"):
        sweep.parse_spec(SPEC + "[time]\nt1 = 1.0\n")
    with pytest.raises(ValueError, match="top_k = 6 must be <= the smallest n = 5"):
        sweep.parse_spec(SPEC.replace("top_k = 4", "top_k = 6"))
    with pytest.raises(ValueError, match="accepted: scaled_norm, top_coords"):
        sweep.parse_spec(SPEC.replace('"top_coords"]', '"top_weight"]'))
    # a kind is either of the toy or of meanfield, not both in one sweep
    with pytest.raises(ValueError, match="cannot share a sweep"):
        sweep.parse_spec(SPEC.replace('kind = "toy-mean"', 'kind = ["toy-mean", "usa"]'))


def test_registry_is_restored():
    """Without the fixture the toy kind is unknown (the fixture removed it)."""
    assert "toy-mean" not in sweep_spec.kind_names()
    with pytest.raises(ValueError, match="usa"):
        sweep.parse_spec(SPEC)


def test_spec_name_survives_axes():
    """The spec's name is its own, not the last grid axis's (a loop once rebound it)."""
    assert (
        sweep.parse_spec(
            SPEC.replace('kind = "toy-mean"', 'kind = "usa"')
            .replace("[output]", "[time]\nt1 = 1.0\n[output]")
            .replace('observables = ["scaled_norm", "top_coords"]\n', "")
        ).name
        == "toy"
    )
