"""Issue 47, items 3, 7 and 9 (backend side): ``backend="auto"`` decided once per sweep store and
recorded with it; ``backend="native"`` where the kernel cannot run is one ValueError (before a
sweep's store exists); a hostile crossover record is absent, never a crash; the engine leaves a
user's jitted functions alone.

Two kernel caches whose crossover records differ only in their times are two directories with the
same libraries (``_exp_state["paths"]`` pointed at each, as ``$MEANFIELD_CACHE_DIR`` does in a new
process) and a record each: in one the kernel wins at every shape, in the other XLA does.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import _native, sweep
from meanfield._native import _exp
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import run as sweep_run
from meanfield.sweep import store as sweep_store

SPEC = """
dtype = "float32"
[model]
kind = "usa"
{backend}
[grid]
n = [24]
d = 3
beta = [0.5, 2.0]
seeds = 2
[time]
t1 = 0.5
dt = 0.05
save = 3
[output]
observables = ["collapse_gap", "energy"]
"""

native = pytest.mark.native


def _spec(backend: str | None = None) -> str:
    return SPEC.format(backend="" if backend is None else f"backend = {backend!r}")


def _cache(root: Path, name: str, kernel_wins: bool) -> dict:
    """Paths of the exp kernel's libraries in a cache directory ``root/name`` holding a crossover
    record whose times say the kernel (or XLA) is faster at every measured shape."""
    real = _exp._exp_state["paths"]
    d = root / name
    d.mkdir(mode=0o700)
    paths = {k: d / v.name for k, v in real.items()}
    t = [1e-4, 2e-4] if kernel_wins else [2e-4, 1e-4]
    record = {
        "recipe": _exp._PLAN.recipe,
        "times": {f"{n} x {dd}": t for n, dd in _exp._PLAN.shapes()},
        "seconds": 1.0,
    }
    path = paths["float32"].with_suffix(".crossover.json")
    path.write_text(json.dumps(record))
    os.chmod(path, 0o600)
    return paths


@pytest.fixture
def two_caches(tmp_path, monkeypatch):
    """``use("a")`` / ``use("b")``: this process reads the crossover of cache a (kernel faster)
    or b (XLA faster), as a new process with ``MEANFIELD_CACHE_DIR`` there would; the sweep's
    compiled programs are forgotten at each switch (a new process)."""
    if not _native.exp_library().available:
        pytest.skip("the fused kernel is not available")
    caches = {"a": _cache(tmp_path, "a", True), "b": _cache(tmp_path, "b", False)}
    monkeypatch.setitem(_exp._exp_state, "paths", _exp._exp_state["paths"])
    monkeypatch.setitem(_exp._exp_state, "crossover", None)
    monkeypatch.setattr(sweep_run, "_PROGRAMS", type(sweep_run._PROGRAMS)())

    def use(name: str) -> None:
        _exp._exp_state["paths"] = caches[name]
        _exp._exp_state["crossover"] = None
        sweep_run._PROGRAMS.clear()

    return use


def _values(out) -> dict:
    ds = sweep.load(out)
    return {k: np.asarray(ds[k].values) for k in ds.data_vars}


def _assert_identical(a, b) -> None:
    va, vb = _values(a), _values(b)
    assert va.keys() == vb.keys()
    for k in va:
        np.testing.assert_array_equal(va[k], vb[k], err_msg=k)


@native
@pytest.mark.slow
def test_auto_sweep_is_bit_identical_across_caches_and_after_kill_and_resume(two_caches, tmp_path):
    """The same ``backend = "auto"`` sweep under two caches whose crossovers disagree: the two
    stores are bit-identical and record the same decision; a store killed under one (chunks
    never computed) and resumed under the other equals both, and ``--verify`` says sound."""
    text = _spec("auto")
    two_caches("a")
    assert mf.kernels.resolve_backend("auto", 24, 3, np.float32) == "native"
    sweep.run_sweep(text, tmp_path / "a.zarr", memory="1B", quiet=True)
    two_caches("b")
    assert mf.kernels.resolve_backend("auto", 24, 3, np.float32) == "xla"  # the caches disagree
    sweep.run_sweep(text, tmp_path / "b.zarr", memory="1B", quiet=True)
    _assert_identical(tmp_path / "a.zarr", tmp_path / "b.zarr")
    for name in ("a", "b"):
        assert sweep_store.recorded_backends(tmp_path / f"{name}.zarr") == {
            "usa n=24 d=3": "native"
        }
        assert json.loads(sweep.load(tmp_path / f"{name}.zarr").attrs["backends"]) == {
            "usa n=24 d=3": "native"
        }
    # killed under b after one chunk (the other chunks never computed), resumed under a, and back
    for first, then in (("b", "a"),):
        out = tmp_path / f"killed-{first}.zarr"
        shutil.copytree(tmp_path / f"{first}.zarr", out)
        for cid in (1, 2, 3):
            sweep_store.discard(out, cid)
        two_caches(then)
        sweep.run_sweep(text, out, memory="1B", quiet=True, resume=True)
        _assert_identical(out, tmp_path / "a.zarr")
        assert sweep_cli.main(["--verify", str(out)]) == 0


@pytest.mark.slow
def test_recorded_decision_is_checked_by_verify(tmp_path, capsys):
    """The record of the backends: an attribute edited (repairable, restored by ``--resume``), a
    record edited in the bookkeeping too (every chunk's digest fails), or one that contradicts
    an explicit ``model.backend`` (not repairable) is damage that ``--verify`` reports."""
    out = tmp_path / "x.zarr"
    sweep.run_sweep(_spec("xla"), out, memory="1B", quiet=True)
    assert sweep_store.recorded_backends(out) == {"usa n=24 d=3": "xla"}
    assert sweep_cli.main(["--verify", str(out)]) == 0
    assert "xla for usa n=24 d=3" in capsys.readouterr().out

    root = json.loads((out / "zarr.json").read_text())
    root["attributes"]["backends"] = json.dumps({"usa n=24 d=3": "native"})
    (out / "zarr.json").write_text(json.dumps(root))
    assert sweep_cli.main(["--verify", str(out)]) == 1
    assert "metadata differs from the store's creation (backends)" in capsys.readouterr().err
    sweep.run_sweep(_spec("xla"), out, memory="1B", quiet=True, resume=True)  # repairs it
    capsys.readouterr()
    assert sweep_cli.main(["--verify", str(out)]) == 0

    info_path = out / "_sweep" / "initialized"
    info = json.loads(info_path.read_text())
    info["backends"] = {"usa n=24 d=3": "native"}  # contradicts model.backend = "xla"
    info_path.write_text(json.dumps(info))
    assert sweep_cli.main(["--verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert "disagrees with the spec's model.backend = 'xla'" in err
    with pytest.raises(ValueError, match="disagrees with the spec's model.backend"):
        sweep.run_sweep(_spec("xla"), out, memory="1B", quiet=True, resume=True)


@pytest.mark.slow
def test_a_record_edited_everywhere_fails_every_chunk(tmp_path, capsys):
    """A record of the backends changed consistently in the bookkeeping and the attribute (an
    ``"auto"`` store claiming the other path) no longer matches any chunk's digest."""
    out = tmp_path / "auto.zarr"
    sweep.run_sweep(_spec(), out, memory="1B", quiet=True)
    rec = sweep_store.recorded_backends(out)
    assert rec is not None and set(rec.values()) <= {"native", "xla"}
    other = {k: "xla" if v == "native" else "native" for k, v in rec.items()}
    info_path = out / "_sweep" / "initialized"
    info = json.loads(info_path.read_text())
    info["backends"] = other
    info["metadata"]["zarr.json"]["attributes"]["backends"] = json.dumps(other)
    info_path.write_text(json.dumps(info))
    root = json.loads((out / "zarr.json").read_text())
    root["attributes"]["backends"] = json.dumps(other)
    (out / "zarr.json").write_text(json.dumps(root))
    damages = sweep_store.verify(out)
    assert sorted({d.chunk for d in damages}) == [0, 1, 2, 3]
    assert all("digest" in d.reason for d in damages)


def _native_off(monkeypatch):
    """The fused kernel unavailable, as with ``MEANFIELD_NATIVE=0`` (a library that failed)."""
    monkeypatch.setitem(_exp._exp_state, "prepared", True)
    monkeypatch.setitem(_exp._exp_state, "lib", None)
    monkeypatch.setitem(_exp._exp_state, "error", "disabled by MEANFIELD_NATIVE=0")


@pytest.mark.slow
def test_native_where_it_cannot_run_is_one_value_error(monkeypatch, tmp_path, capsys):
    """``backend="native"`` without the kernel: one ValueError naming the backend, why and what
    is accepted, at the call (nothing traced); a sweep refuses it before creating its store (one
    line, exit 2); a store that recorded the kernel is not resumed where it cannot run."""
    made = tmp_path / "made.zarr"
    sweep.run_sweep(_spec(), made, memory="1B", quiet=True)
    info_path = made / "_sweep" / "initialized"
    _native_off(monkeypatch)
    x = mf.sphere.uniform(jax.random.key(0), 8, 3)
    want = (
        r"^backend='native': the fused C kernel is not available \(disabled by "
        r"MEANFIELD_NATIVE=0\); use backend='xla' or 'auto'$"
    )
    k = mf.kernels.USA(1.0)
    for call in (
        lambda: mf.field(k, x, backend="native"),
        lambda: mf.velocity(k, x, backend="native"),
        lambda: mf.energy(k, x, backend="native"),
        lambda: mf.simulate(k, x, t1=0.1, dt=0.1, backend="native"),
    ):
        with pytest.raises(ValueError, match=want) as e:
            call()
        assert isinstance(e.value, mf.kernels.BackendUnavailable)
        assert isinstance(e.value, RuntimeError)  # what earlier versions raised
    with pytest.raises(ValueError, match="supports d <= 64, got d = 65"):
        mf.kernels.resolve_backend("native", 8, 65, np.float32)

    spec = tmp_path / "native.toml"
    spec.write_text(_spec("native"))
    out = tmp_path / "native.zarr"
    assert sweep_cli.main([str(spec), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("meanfield sweep: error: model.backend = 'native' cannot run usa")
    assert not out.exists()
    assert sweep_cli.main([str(spec), "--out", str(out), "--dry-run"]) == 2  # the plan says so too
    assert not out.exists()
    # "auto" without the kernel: XLA, recorded
    sweep.run_sweep(_spec("auto"), tmp_path / "auto.zarr", memory="1B", quiet=True)
    assert sweep_store.recorded_backends(tmp_path / "auto.zarr") == {"usa n=24 d=3": "xla"}

    # a store whose record names the kernel (made where it ran): not resumed here (one line)
    info = json.loads(info_path.read_text())
    info["backends"] = {"usa n=24 d=3": "native"}
    info["metadata"]["zarr.json"]["attributes"]["backends"] = json.dumps(info["backends"])
    info_path.write_text(json.dumps(info))
    root = json.loads((made / "zarr.json").read_text())
    root["attributes"]["backends"] = json.dumps(info["backends"])
    (made / "zarr.json").write_text(json.dumps(root))
    sweep_store.discard(made, 3)
    capsys.readouterr()
    with pytest.raises(
        ValueError, match="was computed with the fused C kernel .* resume where it runs"
    ):
        sweep.run_sweep(_spec(), made, memory="1B", quiet=True, resume=True)


# ----------------------------------------------------------------------------------------------
# item 7: a hostile crossover record (or manifest, or failure record) is absent, never a crash
# ----------------------------------------------------------------------------------------------

_DEEP = "[" * 100000 + "]" * 100000


@pytest.mark.parametrize(
    "text",
    [
        _DEEP,
        '{"recipe": ' + _DEEP + "}",
        "not json",
        "[1, 2]",
        '{"recipe": "%s", "times": %s, "seconds": 1.0}',  # times filled below: wrong shapes
        '{"recipe": "%s", "times": "nan", "seconds": 1.0}',
    ],
    ids=["nested", "nested-value", "text", "list", "other-shapes", "times-text"],
)
def test_malformed_crossover_record_is_measured_again(tmp_path, capsys, monkeypatch, text):
    """``Plan.read`` of a malformed record: ``None`` and one line on stderr (once per record and
    process); ``Plan.obtain`` then measures and replaces it with a sound record."""
    from meanfield._native import _crossover

    monkeypatch.setattr(_crossover, "_ignored", set())
    plan = _exp._PLAN
    if "%s" in text:
        text = text.replace("%s", plan.recipe, 1).replace("%s", json.dumps({"3 x 3": [1, 2]}))
    path = tmp_path / "k.crossover.json"
    path.write_text(text)
    assert plan.read(path) is None
    assert plan.read(path) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"meanfield: ignored the malformed crossover record {path}"
    ), err
    times = {f"{n} x {d}": [1e-4, 2e-4] for n, d in plan.shapes()}
    got = plan.obtain(path, lambda shapes: times)
    assert got.recorded == str(path) and got.prefers_native(64, 3)
    assert plan.read(path) == got


def test_nonpositive_times_are_malformed(tmp_path, capsys, monkeypatch):
    from meanfield._native import _crossover

    monkeypatch.setattr(_crossover, "_ignored", set())
    plan = _exp._PLAN
    for bad in (0.0, -1.0, float("inf")):
        times = {f"{n} x {d}": [bad, 1e-4] for n, d in plan.shapes()}
        path = tmp_path / f"{bad}.crossover.json"
        path.write_text(json.dumps({"recipe": plan.recipe, "times": times, "seconds": 1.0}))
        assert plan.read(path) is None
    assert len(capsys.readouterr().err.strip().splitlines()) == 3


def test_nested_manifest_and_failure_record_are_unreadable_not_a_crash(tmp_path):
    from meanfield._native import _cache

    lib = tmp_path / "k.so"
    lib.write_bytes(b"\x7fELF" + b"\0" * 60)
    _cache._manifest(lib).write_text(_DEEP)
    assert _cache._damage(lib) == f"unreadable manifest {_cache._manifest(lib).name}"
    marker = tmp_path / "k.failed"
    marker.write_text(_DEEP)
    assert _cache._recorded_failure(marker, {"compiler": "cc"}) is None
    assert not marker.exists()  # an unreadable record is removed: the build is tried again


# ----------------------------------------------------------------------------------------------
# item 9: the engine leaves a user's jitted functions alone
# ----------------------------------------------------------------------------------------------

_TRACES = r"""
import json
import jax
import meanfield as mf

count = {"user": 0, "other": 0}
x = mf.sphere.uniform(jax.random.key(0), 16, 3)
k = mf.kernels.USA(1.0)


@jax.jit
def other(y):
    count["other"] += 1
    return 2 * y


@jax.jit
def user(y):
    count["user"] += 1
    return mf.velocity(k, y)


other(x)
user(x)
user(x)  # the first engine call happened inside user's first trace
after_first = dict(count)
for backend in ("xla", "auto", "native", "xla"):
    mf.velocity(k, x, backend=backend)
    mf.field(k, x, backend=backend)
    mf.energy(k, x, backend=backend)
    mf.simulate(k, x, t1=0.1, dt=0.1, backend=backend)
    other(x)
    user(x)
with mf.kernels.use_backend("xla"):  # a user's scope: traced again there, by design
    user(x)
print(json.dumps({"after_first": after_first, "end": count}))
"""


@pytest.mark.slow
def test_engine_calls_leave_a_users_jitted_functions_alone():
    """In a fresh process (the engine's first call is what is tested): the first engine call
    inside a user's ``jax.jit`` traces that function once, and engine calls with every backend
    never make an unrelated jitted function (or the user's) trace again; only the user's own
    ``use_backend`` scope traces again, once. A Python side-effect counter counts the traces."""
    import subprocess
    import sys

    env = {**os.environ, "MEANFIELD_NATIVE_QUIET": "1"}
    if not _native.exp_library().available:
        env["MEANFIELD_NATIVE"] = "0"
        script = _TRACES.replace('"native", ', "")
    else:
        script = _TRACES
    p = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["after_first"] == {"user": 1, "other": 1}, got
    assert got["end"] == {"user": 2, "other": 1}, got


def test_simulate_records_the_backend_it_decided_and_a_rerun_with_it_is_identical(tmp_path, capsys):
    """``meanfield simulate --backend auto`` decides the path once and records it
    (``backend_resolved``); rerunning with that backend named gives the same numbers bit for bit."""
    from meanfield import cli

    small = [
        "--kernel",
        "usa",
        "--n",
        "6",
        "--t1",
        "0.1",
        "--dt",
        "0.05",
        "--saves",
        "3",
        "--no-plots",
    ]
    runs = {}
    for name, backend in (("auto", "auto"), ("again", None)):
        if backend is None:
            backend = runs["auto"][0]["backend_resolved"]
        out = tmp_path / name
        assert cli.main(["simulate", *small, "--backend", backend, "--out", str(out)]) == 0
        capsys.readouterr()
        summary = json.loads((out / "summary.json").read_text())
        runs[name] = (summary, sweep.load(out))  # the run's store, run.zarr
    auto, again = runs["auto"][0], runs["again"][0]
    assert auto["backend"] == "auto" and auto["backend_resolved"] in ("native", "xla")
    assert again["backend"] == again["backend_resolved"] == auto["backend_resolved"]
    for key in ("x", "energy", "collapse_gap"):  # x: every saved state, the final one included
        np.testing.assert_array_equal(runs["auto"][1][key].values, runs["again"][1][key].values)
