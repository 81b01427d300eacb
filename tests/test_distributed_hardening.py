"""Start-up of ``meanfield sweep --coordinator ... --num-processes N --process-id I`` when it goes
wrong (``meanfield.sweep._distributed``): every case is a real process that ends with one line
on stderr and exit status 2, within its stated bound (``--join-timeout``), never by a signal.

- a coordinator port in use, and a second process 0 on the same port: "in use", at once;
- process 1 alone, process 0 alone: the join timeout (JAX would abort after its own);
- ``--num-processes 3000000000``: refused before JAX is touched;
- processes started with different specs (other values, another grid shape): refused on
  every process before the store exists;
- process 0's coordinator listens on the address given only (not every interface);
- a process with another ``--num-processes`` than process 0's, or an id given twice: refused
  at once by process 0's handshake before JAX (JAX aborted it, SIGABRT).

Join timeouts are 3-4 s here; the bound checked on each process's run time adds the start-up
of Python and JAX on loaded CI cores (``SLACK``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from meanfield.sweep import _distributed

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
name = "hardening"
[model]
kind = "usa"
[grid]
n = [6]
beta = {beta}
seeds = 2
[time]
t1 = 0.2
dt = 0.05
save = 2
"""

SLACK = 90  # seconds: Python + JAX start-up on 2 loaded cores; a hang past it fails the test


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def env():
    return dict(os.environ, OMP_NUM_THREADS="1", MEANFIELD_NATIVE_QUIET="0")


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text(SPEC.format(beta="[1.0, 2.0]"))
    return path


class _Proc:
    """``python -m meanfield sweep ...`` with stderr in an unnamed file (never a full pipe)."""

    def __init__(self, args, env):
        self.err = tempfile.TemporaryFile("w+")
        self.start = time.monotonic()
        self.p = subprocess.Popen(
            [sys.executable, "-m", "meanfield", "sweep", *map(str, args)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.err,
            text=True,
            env=env,
        )

    def finish(self, timeout: float = SLACK) -> tuple[int, list[str], float]:
        """Exit status, stderr lines and seconds run; killed (and the test failed) past ``timeout``."""
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError(
                f"the process overran {timeout} s: {self.stderr()[-2000:]}"
            ) from None
        return rc, self.stderr().splitlines(), time.monotonic() - self.start

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()


def _dist(spec, out, port, n, i, *extra, env, host="127.0.0.1") -> _Proc:
    return _Proc(
        [
            spec,
            "--out",
            out,
            "--coordinator",
            f"{host}:{port}",
            "--num-processes",
            n,
            "--process-id",
            i,
            "--quiet",
            *extra,
        ],
        env,
    )


def _one_error(lines: list[str]) -> str:
    """The single ``meanfield sweep: error: ...`` line of a process (and no traceback)."""
    errors = [ln for ln in lines if ln.startswith("meanfield sweep: error: ")]
    assert len(errors) == 1, lines
    assert not any("Traceback" in ln or "Check failure" in ln for ln in lines), lines
    return errors[0]


def _wait_listening(port: int, proc: _Proc, timeout: float = SLACK) -> None:
    """Until something accepts connections on 127.0.0.1:port (process 0's coordinator)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.p.poll() is None, proc.stderr()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"no coordinator listening on {port} after {timeout} s")


# --------------------------------------------------------------------------- arguments and ports


def test_num_processes_out_of_range_is_refused_before_jax(spec, tmp_path, env):
    out = tmp_path / "o.zarr"
    rc, lines, _ = _dist(spec, out, _free_port(), 3000000000, 0, env=env).finish()
    assert rc == 2
    assert _one_error(lines) == (
        f"meanfield sweep: error: --num-processes must be in 1 .. "
        f"{_distributed.MAX_PROCESSES}, got 3000000000"
    )
    assert not out.exists()


def test_coordinator_port_in_use_is_one_line(spec, tmp_path, env):
    """Another program listens on the port: process 0 says so at once (JAX's service crashed
    the process with SIGSEGV)."""
    out = tmp_path / "o.zarr"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, lines, _ = _dist(spec, out, port, 2, 0, "--join-timeout", 60, env=env).finish()
    assert rc == 2
    assert _one_error(lines) == (
        f"meanfield sweep: error: coordinator port {port} on 127.0.0.1 is in use (another "
        "program, or another process 0 of this sweep): choose another --coordinator port"
    )
    assert not out.exists()


def test_check_args_and_reserve_port():
    with pytest.raises(
        ValueError, match=r"--process-id must be in 0 \.\. 1 \(--num-processes 2\), got -1"
    ):
        _distributed.check_args("127.0.0.1:1", 2, -1, join_timeout=5, heartbeat_timeout=5)
    with pytest.raises(ValueError, match="--join-timeout must be in 1 .. 86400 seconds, got 0"):
        _distributed.check_args(None, None, None, join_timeout=0, heartbeat_timeout=5)
    with pytest.raises(
        ValueError, match="--heartbeat-timeout must be in 1 .. 86400 seconds, got 3000000000"
    ):
        _distributed.check_args(None, None, None, join_timeout=5, heartbeat_timeout=3000000000)
    with pytest.raises(ValueError, match="HOST:PORT with a port in 1 .. 65535"):
        _distributed.check_args("127.0.0.1:70000", 2, 0, join_timeout=5, heartbeat_timeout=5)
    with pytest.raises(ValueError, match="does not resolve"):
        _distributed.check_args(
            "no-such-host.invalid:1234", 2, 0, join_timeout=5, heartbeat_timeout=5
        )
    assert _distributed.split_address("[::1]:1234") == ("::1", 1234)

    port = _free_port()
    held = _distributed.reserve_port(f"127.0.0.1:{port}")
    try:
        assert len(held) == 1 and held[0].getsockname() == ("127.0.0.1", port)
        with (
            socket.socket() as other,
            pytest.raises(OSError),
        ):  # held: another program cannot take it
            other.bind(("127.0.0.1", port))
        with pytest.raises(ValueError, match=f"coordinator port {port} on 127.0.0.1 is in use"):
            _distributed.reserve_port(f"127.0.0.1:{port}")  # a second process 0
    finally:
        _distributed.release(held)
    assert held == []
    with socket.socket() as other:  # released
        other.bind(("127.0.0.1", port))
    with pytest.raises(ValueError, match="run process 0 on the machine --coordinator names"):
        _distributed.reserve_port("192.0.2.1:1234")  # TEST-NET-1: never an address of this machine


def test_distributed_without_a_cluster_environment_is_one_line(spec, tmp_path, env):
    clean = {
        k: v
        for k, v in env.items()
        if not k.startswith(
            ("SLURM_", "OMPI_", "PMI_", "KUBERNETES_", "TPU_", "CLOUD_TPU", "JAX_", "MEGASCALE")
        )
    }
    rc, lines, _ = _Proc(
        [spec, "--out", tmp_path / "o.zarr", "--distributed", "--join-timeout", 5], clean
    ).finish()
    assert rc == 2
    assert _one_error(lines).startswith(
        "meanfield sweep: error: cannot join the distributed sweep: --distributed "
        "found no cluster environment"
    )


# --------------------------------------------------------------------------- the join timeout


def test_process_one_alone_times_out_with_one_line(spec, tmp_path, env):
    """Nothing listens at the coordinator: exit 2 after --join-timeout (JAX: silent for 300 s, then SIGABRT)."""
    port = _free_port()
    rc, lines, took = _dist(
        spec, tmp_path / "o.zarr", port, 2, 1, "--join-timeout", 3, env=env
    ).finish()
    assert rc == 2
    assert _one_error(lines) == (
        f"meanfield sweep: error: the distributed sweep did not assemble within "
        f"--join-timeout 3 s: process 1 found no coordinator listening at 127.0.0.1:{port} "
        "(is process 0 running?)"
    )
    assert 3 <= took < 3 + SLACK


@pytest.mark.slow
def test_process_zero_alone_and_a_second_process_zero(spec, tmp_path, env):
    """Process 0 waits for process 1 until --join-timeout, then exit 2; a second process 0 on the
    same port meanwhile is refused at once (the port is in use); the coordinator listens on the
    address given (127.0.0.1), not on every interface."""
    port = _free_port()
    out = tmp_path / "o.zarr"
    first = _dist(spec, out, port, 2, 0, "--join-timeout", 12, env=env)
    try:
        _wait_listening(port, first)
        if sys.platform.startswith(
            "linux"
        ):  # 127.0.0.2 is loopback too: bound to all interfaces it would answer
            with socket.socket() as probe:
                probe.settimeout(2.0)
                assert probe.connect_ex(("127.0.0.2", port)) != 0
        rc2, lines2, _ = _dist(spec, out, port, 2, 0, "--join-timeout", 12, env=env).finish()
        rc, lines, took = first.finish()
    finally:
        if first.p.poll() is None:
            first.p.kill()
            first.p.wait()
    assert rc2 == 2
    assert f"coordinator port {port} on 127.0.0.1 is in use" in _one_error(lines2)
    assert rc == 2
    assert _one_error(lines) == (
        f"meanfield sweep: error: the distributed sweep did not assemble within "
        f"--join-timeout 12 s: process 0 (the coordinator, at 127.0.0.1:{port}) did not "
        "hear from all 2 processes (start ids 0 .. 1 once each, with the same --coordinator "
        "and --num-processes)"
    )
    assert 12 <= took < 12 + SLACK
    assert not out.exists()


# --------------------------------------------------------------------------- the processes agree


@pytest.mark.slow
@pytest.mark.parametrize(
    "beta, points", [("[1.0, 3.0]", 4), ("[1.0, 2.0, 3.0]", 6)], ids=["values", "shape"]
)
def test_processes_with_different_specs_are_refused(spec, tmp_path, env, beta, points):
    """Process 1 runs beta = [1, 3] (or a grid of another shape) against process 0's [1, 2]: both
    stop with one line naming the hashes, before the store exists (it used to hold process 1's
    results under process 0's labels, or abort both in gloo)."""
    other = tmp_path / "b.toml"
    other.write_text(SPEC.format(beta=beta))
    out = tmp_path / "o.zarr"
    port = _free_port()
    procs = [
        _dist(s, out, port, 2, i, "--join-timeout", 60, env=env, host="localhost")
        for i, s in enumerate([spec, other])
    ]
    try:
        outs = [p.finish() for p in procs]
    finally:
        for p in procs:
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()
    from meanfield.sweep import load_spec

    h0, h1 = load_spec(spec).hash[:12], load_spec(other).hash[:12]
    expected = (
        f"meanfield sweep: error: the processes run different specs: process 1 (hash {h1}, {points} points) "
        f"against process 0 (hash {h0}, 4 points); start every process with the same spec"
    )
    for rc, lines, _ in outs:
        assert rc == 2
        assert _one_error(lines) == expected
    assert not out.exists()


def test_fingerprint_words():
    """What ``agree`` exchanges: the 32 bytes of the spec hash, the grid size, the dry-run flag."""
    h = "ab" * 32
    f = _distributed._fingerprint(h, 12, True)
    assert f.shape == (_distributed._WORDS,) and f.dtype == np.int32
    assert f[:32].tolist() == [0xAB] * 32 and f[32] == 12 and f[33] == 1


# --------------------------------------------------------------------------- the handshake before JAX


def test_handshake_refuses_another_num_processes_and_an_id_given_twice():
    """Process 0's handshake (``gather``) before JAX: an id already checked in and another
    ``--num-processes`` are refused with one line each (JAX aborted that process, SIGABRT);
    a request that is not meanfield's is refused; the others get ``ok`` together; the port
    stays held (bound, not listening) for JAX's service."""
    port = _free_port()
    coordinator = f"127.0.0.1:{port}"
    held = _distributed.reserve_port(coordinator)
    deadline = time.monotonic() + 30
    served: dict = {}
    server = threading.Thread(
        target=lambda: served.update(holders=_distributed.gather(held, coordinator, 3, deadline))
    )
    server.start()
    try:
        for _ in range(300):  # until the server thread listens
            with contextlib.suppress(ConnectionRefusedError):
                first = socket.create_connection(
                    ("127.0.0.1", port), timeout=30
                )  # process 1, checked in first
                break
            time.sleep(0.05)
        first.sendall(b"meanfield-join 1 3 1\n")
        with pytest.raises(_distributed.HandshakeError) as e:
            _distributed.check_in(coordinator, 3, 1, deadline)
        assert str(e.value) == (
            f"process id 1 has already joined process 0 (at {coordinator}) from another "
            "process: give each process its own --process-id in 0 .. 2"
        )
        with pytest.raises(_distributed.HandshakeError) as e:
            _distributed.check_in(coordinator, 4, 2, deadline)
        assert str(e.value) == (
            f"process 0 (at {coordinator}) runs --num-processes 3, process 2 was started with "
            "--num-processes 4: give every process the same --num-processes"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=30) as stranger:
            stranger.sendall(b"GET / HTTP/1.1\r\n\r\n")
            assert (
                stranger.makefile("rb").readline()
                == (
                    f"refused: not a meanfield join request (process 0 of a meanfield sweep is at {coordinator})\n"
                ).encode()
            )
        _distributed.check_in(coordinator, 3, 2, deadline)  # the last one: everybody hears ok
        assert first.makefile("rb").readline() == b"ok\n"
        first.close()
        server.join(30)
        assert not server.is_alive()
        holders = served["holders"]
        assert [s.getsockname() for s in holders] == [("127.0.0.1", port)]
        with socket.socket() as other, pytest.raises(OSError):  # still held from other programs
            other.bind(("127.0.0.1", port))
        with socket.socket() as probe:  # and no longer listening: JAX's service takes it over
            assert probe.connect_ex(("127.0.0.1", port)) != 0
        _distributed.release(holders)
    finally:
        _distributed.release(held)
        server.join(60)


def test_handshake_is_bounded_by_the_deadline():
    port = _free_port()
    coordinator = f"127.0.0.1:{port}"
    held = _distributed.reserve_port(coordinator)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):  # process 0 alone
        _distributed.gather(held, coordinator, 2, t0 + 0.5)
    assert held == [] and time.monotonic() - t0 < 10
    t0 = time.monotonic()
    with pytest.raises(
        TimeoutError
    ):  # process 1 alone: nothing listens, retried until the deadline
        _distributed.check_in(coordinator, 2, 1, t0 + 0.5)
    assert time.monotonic() - t0 < 10


@pytest.mark.slow
def test_process_with_another_num_processes_is_refused_at_once(spec, tmp_path, env):
    """Process 1 started with --num-processes 3 against process 0's 2: one line and exit 2 at
    once, before JAX (JAX's coordinator aborted it: SIGABRT, exit 134); process 0 keeps waiting
    for a right process 1 (until its join timeout: test_process_zero_alone_...)."""
    out = tmp_path / "o.zarr"
    port = _free_port()
    first = _dist(spec, out, port, 2, 0, "--join-timeout", 120, env=env)
    try:
        _wait_listening(port, first)
        rc, lines, took = _dist(spec, out, port, 3, 1, "--join-timeout", 120, env=env).finish()
        assert first.p.poll() is None  # still waiting
    finally:
        first.p.kill()
        first.p.wait()
    assert rc == 2 and took < SLACK
    assert _one_error(lines) == (
        f"meanfield sweep: error: process 0 (at 127.0.0.1:{port}) runs --num-processes 2, "
        "process 1 was started with --num-processes 3: give every process the same "
        "--num-processes"
    )
    assert not out.exists()
