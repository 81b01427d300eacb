"""Several processes for real: ``meanfield sweep ... --coordinator localhost:PORT --num-processes 2
--process-id I`` runs one sweep as two cooperating processes (``jax.distributed``, gloo CPU
collectives, one ``Mesh`` over the two processes' devices; process 0 writes the store).

The reference is the same spec run by ONE process over two local devices
(``--xla_force_host_platform_device_count=2``): the same mesh size, so the same per-device
program, and the stores must agree value for value. Every process is a real subprocess with a
timeout (a hung collective fails the test, never CI), on a free localhost port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from meanfield import sweep
from meanfield.sweep import store as sweep_store

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
name = "distributed"
[model]
kind = "usa"
[grid]
n = [6, 8]
beta = [1.0, 2.0]
seeds = 8
[time]
t1 = 2.0
dt = 0.01
save = 3
"""

CHUNKS = 16  # 2 n x 2 beta x 8 seeds, two points (one per device) per chunk

TIMEOUT = (
    300  # seconds per process: generous for 2 loaded cores; a hang fails instead of blocking CI
)

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def _values(store) -> dict:
    ds = sweep.load(store)
    return {k: np.asarray(ds[k].values) for k in ds.data_vars}


def _assert_same(store, ref) -> None:
    a, b = _values(store), _values(ref)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _popen(cmd, env) -> subprocess.Popen:
    """A subprocess whose output goes to unnamed temporary files, not pipes: a process that logs
    more than a pipe holds (JAX's coordination service under load) never blocks on a full pipe."""
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True, env=env)
    _ERR[p.pid] = err
    return p


_ERR: dict = {}


def _stderr(p: subprocess.Popen) -> str:
    f = _ERR[p.pid]
    f.seek(0)
    return f.read()


def _sweep(*args, env) -> subprocess.Popen:
    return _popen([sys.executable, "-m", "meanfield", "sweep", *map(str, args)], env)


def _group(spec, out, *extra, env, processes=2) -> list[subprocess.Popen]:
    """``processes`` processes of one distributed sweep (process 0 first)."""
    port = _free_port()
    return [
        _sweep(
            spec,
            "--out",
            out,
            "--coordinator",
            f"localhost:{port}",
            "--num-processes",
            processes,
            "--process-id",
            i,
            "--heartbeat-timeout",
            5,
            *extra,
            env=env,
        )
        for i in range(processes)
    ]


def _finish(procs, timeout=TIMEOUT) -> list[tuple[int, str]]:
    """Exit status and stderr of each process; all are killed if one overruns ``timeout``."""
    deadline = time.monotonic() + timeout
    try:
        try:
            return [(p.wait(max(1.0, deadline - time.monotonic())), _stderr(p)) for p in procs]
        except subprocess.TimeoutExpired:
            tails = [_stderr(p)[-2000:] for p in procs]
            raise AssertionError(
                f"a process overran {timeout} s; the stderr tails: {tails}"
            ) from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return dict(
        os.environ, OMP_NUM_THREADS="1", MEANFIELD_CACHE_DIR=str(cache), MEANFIELD_NATIVE_QUIET="0"
    )


@pytest.fixture(scope="module")
def ref(tmp_path_factory, env):
    """One process, two local CPU devices, two points per chunk (``--memory 1B``): 16 chunks."""
    base = tmp_path_factory.mktemp("distributed")
    spec = base / "distributed.toml"
    spec.write_text(SPEC)
    out = base / "ref.zarr"
    # the suite's XLA flags kept (tests/conftest.py): the stores are compared bit for bit
    local = dict(
        env, XLA_FLAGS=f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
    )
    [(rc, err)] = _finish([_sweep(spec, "--out", out, "--memory", "1B", "--quiet", env=local)])
    assert rc == 0, err
    ds = sweep.load(out)
    assert ds.attrs["chunks_total"] == CHUNKS and ds.attrs["process_count"] == 1
    return spec, out


def test_two_processes_write_the_single_process_store(ref, tmp_path, env):
    spec, ref_store = ref
    out = tmp_path / "two.zarr"
    outs = _finish(_group(spec, out, "--memory", "1B", "--quiet", env=env))
    assert [rc for rc, _ in outs] == [0, 0], outs
    for _, err in outs:  # every process ran the same program (no process fell back to another path)
        assert "native CPU kernels unavailable" not in err, err
    ds = sweep.load(out)  # verified: every chunk written once, soundly
    assert ds.attrs["process_count"] == 2 and ds.attrs["devices"].startswith("2 x cpu")
    assert ds.attrs["chunks_done"] == ds.attrs["chunks_total"] == CHUNKS
    _assert_same(out, ref_store)

    # an error of process 0 (the store exists) stops both processes with one line each
    outs = _finish(_group(spec, out, "--memory", "1B", "--quiet", env=env))
    assert [rc for rc, _ in outs] == [2, 2], outs
    lines = [
        [ln for ln in err.splitlines() if ln.startswith("meanfield sweep:")] for _, err in outs
    ]
    assert all(len(ls) == 1 and "already exists" in ls[0] for ls in lines), outs
    assert "process 0 stopped the sweep" in lines[1][0]


def test_killed_process_then_resume(ref, tmp_path, env):
    """SIGKILL of process 1 mid-run: process 0 stops by itself (heartbeat timeout 5 s) instead
    of hanging; every chunk completed before is kept as it was; a 2-process resume (the Python
    launcher of docs/sweeps.md) computes only the rest and the store equals the single-process
    one value for value."""
    spec, ref_store = ref
    out = tmp_path / "killed.zarr"
    procs = _group(spec, out, "--memory", "1B", "--quiet", env=env)
    done = out / "_sweep" / "done"
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            if done.is_dir() and any(n.isdigit() for n in os.listdir(done)):
                break
            time.sleep(0.005)
        ended = [(p.returncode, _stderr(p)) for p in procs if p.poll() is not None]
        assert not ended, f"the sweep ended before a process could be killed: {ended}"
        procs[1].send_signal(signal.SIGKILL)
        rc0 = procs[0].wait(
            120
        )  # the survivor notices (collective error or missed heartbeats) and stops
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert rc0 != 0
    before = {n: (done / n).read_text() for n in os.listdir(done) if n.isdigit()}
    assert 1 <= len(before) < CHUNKS, len(before)
    kept = {n: _chunk_files(out, n) for n in before}

    # the resume runs the Python launcher of docs/sweeps.md (resume=True), as printed there
    launcher = tmp_path / "run_sweep_multihost.py"
    launcher.write_text(_launcher())
    port = _free_port()
    here = dict(
        env, PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    )  # this checkout's meanfield
    procs = [
        _popen(
            [sys.executable, str(launcher), f"localhost:{port}", "2", str(i), str(spec), str(out)],
            here,
        )
        for i in range(2)
    ]
    outs = _finish(procs)
    assert [rc for rc, _ in outs] == [0, 0], outs
    for _, err in outs:
        assert "native CPU kernels unavailable" not in err, err
    # nothing finished is lost or recomputed: the marks and data files of those chunks are untouched
    for n, text in before.items():
        assert (done / n).read_text() == text
        assert _chunk_files(out, n) == kept[n]
    assert sweep_store.verify(out) == []
    _assert_same(out, ref_store)


def _launcher() -> str:
    """The Python launcher of docs/sweeps.md (the code block that starts ``# run_sweep_multihost.py``)."""
    text = (ROOT / "docs" / "sweeps.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    [code] = [b for b in blocks if b.startswith("# run_sweep_multihost.py")]
    return code


def _chunk_files(out: Path, name: str) -> dict:
    """``path -> (mtime_ns, bytes)`` of every zarr chunk file of sweep chunk ``name`` (its mark's region)."""
    import json

    import zarr

    rec = json.loads((out / "_sweep" / "done" / name).read_text())
    region = [(i, i + 1) for i in rec["index"]] + [tuple(s) for s in rec["slices"]]
    variables = json.loads((out / "_sweep" / "initialized").read_text())["variables"]
    root = zarr.open_group(out, mode="r", use_consolidated=False)
    found = {}
    for var in variables:
        arr = root[var]
        for c in sweep_store._block_coords(arr.shape, arr.chunks, region):
            p = out / var / arr.metadata.encode_chunk_key(c)
            found[str(p)] = (p.stat().st_mtime_ns, p.read_bytes())
    assert len(found) >= len(variables), name
    return found
