"""Joining ``jax.distributed`` for a sweep, and checking that the processes agree.

``join`` is what ``meanfield sweep --coordinator HOST:PORT --num-processes N --process-id I``
(or ``--distributed``) runs before any JAX computation; ``agree`` is what ``run_sweep`` runs
first under ``jax.distributed`` (``jax.process_count() > 1``), before process 0 touches the store.

The ways the join fails end in one line and a bounded time, not in a signal (the exceptions
are listed last):

- the arguments are checked before JAX is touched (``check_args``): ``N`` in
  ``1 .. MAX_PROCESSES``, ``I`` in ``0 .. N-1``, a ``HOST:PORT`` that resolves, timeouts in
  ``1 .. MAX_TIMEOUT`` seconds;
- process 0 binds exactly ``HOST:PORT`` first and holds it until its coordinator service has
  bound it (``reserve_port``): a port in use (another program, another process 0), or a host
  that is not an address of this machine, is a ``ValueError`` (JAX's service would crash the
  process with ``SIGSEGV``). The service binds that address only
  (``coordinator_bind_address``; JAX's default is every interface, ``[::]``);
- the join is bounded by ``join_timeout`` seconds (``join``): JAX's own bound
  (``initialization_timeout``) ends the process with a C++ abort (``SIGABRT``, status 134),
  so a watchdog thread fires first, writes one line on stderr and ends the process with
  status 2 (``os._exit``: the main thread is blocked inside JAX's C++ connect and cannot be
  interrupted). JAX's bound is set ``_JAX_MARGIN`` seconds later, so it never fires first.
  This covers a process 0 alone, a process ``I > 0`` without a process 0, and the processes
  left waiting when another one fails.

- before JAX is joined, each process ``I > 0`` checks in with process 0 on the coordinator
  port (``check_in``: one line, its ``N`` and ``I``), and process 0 (``gather``, on the port
  it holds) answers all of them ``ok`` once ids ``1 .. N-1`` have each checked in: a process
  with another ``--num-processes`` than process 0's, or an id already checked in by a process
  still connected, is refused at once with one line (JAX's coordinator would abort it,
  ``SIGABRT``, JAX's error callback not being exposed by ``jax.distributed.initialize``).

What is left: a process arriving after all ``N`` have checked in reaches JAX's service, not the
handshake, and stops with one line (``HandshakeError``); a process that dies between its
check-in and its join leaves the others to the join timeout. When the port
still has connections of an earlier run in ``TIME_WAIT``, ``reserve_port`` binds with
``SO_REUSEADDR``, and two processes 0 started within the same milliseconds can both pass it
(then the join timeout).
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import sys
import threading
import time
from typing import Any

import numpy as np

__all__ = [
    "MAX_PROCESSES",
    "MAX_TIMEOUT",
    "check_args",
    "split_address",
    "reserve_port",
    "check_in",
    "gather",
    "release",
    "join",
    "agree",
    "DisagreementError",
    "HandshakeError",
]

#: The largest ``--num-processes`` accepted (a sanity bound far above any real cluster).
MAX_PROCESSES = 65536

#: The largest ``--join-timeout`` / ``--heartbeat-timeout`` accepted, in seconds (one day).
MAX_TIMEOUT = 86400

#: Seconds between the join timeout (the watchdog's one line, status 2) and JAX's own
#: ``initialization_timeout`` (a C++ abort), so that the watchdog always fires first.
_JAX_MARGIN = 30


class DisagreementError(ValueError):
    """The processes of one distributed sweep were started with different specs (or one with
    ``--dry-run`` and another without); raised on every process before anything is written."""


def split_address(coordinator: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:PORT"`` for IPv6) as ``(host, port)``; ``ValueError`` otherwise."""
    host, sep, port = str(coordinator).rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(
            f"--coordinator must be HOST:PORT with a port in 1 .. 65535 (e.g. localhost:12345), "
            f"got {coordinator!r}"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _addresses(host: str, port: int) -> list[tuple]:
    """``getaddrinfo`` of the coordinator (TCP); ``ValueError`` naming the host if it does not resolve."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"--coordinator host {host!r} does not resolve: {e}") from None


def check_args(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    *,
    join_timeout: int,
    heartbeat_timeout: int,
) -> None:
    """Check the distributed arguments before JAX is touched (``ValueError`` naming the value
    and what is accepted). ``coordinator`` etc. None: ``--distributed`` (from the cluster's
    environment), only the timeouts are checked."""
    for name, value in (
        ("--join-timeout", join_timeout),
        ("--heartbeat-timeout", heartbeat_timeout),
    ):
        if not 1 <= value <= MAX_TIMEOUT:
            raise ValueError(f"{name} must be in 1 .. {MAX_TIMEOUT} seconds, got {value}")
    if num_processes is None or process_id is None or coordinator is None:
        return
    if not 1 <= num_processes <= MAX_PROCESSES:
        raise ValueError(f"--num-processes must be in 1 .. {MAX_PROCESSES}, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(
            f"--process-id must be in 0 .. {num_processes - 1} (--num-processes {num_processes}), "
            f"got {process_id}"
        )
    host, port = split_address(coordinator)
    _addresses(host, port)


def reserve_port(coordinator: str) -> list[socket.socket]:
    """Process 0: bind exactly ``HOST:PORT`` (every address ``HOST`` resolves to) and hold it for
    the coordinator service: the sockets, to be closed once ``jax.distributed.initialize`` has
    returned. ``ValueError`` when the port is in use (by another program, or another process 0
    of this sweep) or ``HOST`` is not an address of this machine (process 0 must run where
    ``--coordinator`` points).

    JAX's service crashes the process (``SIGSEGV``) when it cannot bind, so the port is held
    from this check until the service has bound it: after the bind, ``SO_REUSEPORT`` lets
    the service (gRPC sets it too, same user) share the address while a program that does not
    set it is refused. Without ``SO_REUSEPORT`` (not Linux or BSD) the port is released at once.
    """
    host, port = split_address(coordinator)
    held: list[socket.socket] = []
    unavailable: list[str] = []
    seen, bound = set(), 0
    for family, kind, proto, _, addr in _addresses(host, port):
        if (family, addr) in seen:
            continue
        seen.add((family, addr))
        try:
            s = _bind(family, kind, proto, addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                release(held)
                raise ValueError(
                    f"coordinator port {port} on {host} is in use (another program, or another "
                    f"process 0 of this sweep): choose another --coordinator port"
                ) from None
            unavailable.append(f"{addr[0]}: {e.strerror or e}")
            continue
        bound += 1
        if hasattr(socket, "SO_REUSEPORT"):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            held.append(s)
        else:  # pragma: no cover - no SO_REUSEPORT: checked only
            s.close()
    if not bound:
        raise ValueError(
            f"process 0 cannot bind the coordinator address {coordinator} ({'; '.join(unavailable)}): "
            "run process 0 on the machine --coordinator names"
        )
    return held


def _bind(family: int, kind: int, proto: int, addr: Any) -> socket.socket:
    """A socket bound to ``addr``: without ``SO_REUSEADDR`` (then a second process 0, which
    binds the same way, is refused), or, when that fails, with it (connections of an earlier
    run in ``TIME_WAIT`` do not count; a socket listening on the port still refuses the bind)."""
    for reuse in (False, True):
        s = socket.socket(family, kind, proto)
        try:
            if reuse:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
            return s
        except OSError as e:
            s.close()
            if reuse or e.errno != errno.EADDRINUSE:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def release(held: list[socket.socket]) -> None:
    """Close the sockets of ``reserve_port``."""
    for s in held:
        s.close()
    held.clear()


def _reachable(coordinator: str) -> bool:
    """Whether something accepts TCP connections at ``coordinator`` now (1 s per address)."""
    host, port = split_address(coordinator)
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _timeout_message(
    coordinator: str | None, num_processes: int | None, process_id: int | None, join_timeout: int
) -> str:
    """The one line of a join that did not complete within ``join_timeout``."""
    head = f"the distributed sweep did not assemble within --join-timeout {join_timeout} s"
    if coordinator is None:
        return f"{head} (--distributed: from the cluster's environment)"
    if process_id == 0:
        return (
            f"{head}: process 0 (the coordinator, at {coordinator}) did not hear from all {num_processes} "
            f"processes (start ids 0 .. {int(num_processes or 0) - 1} once each, with the same --coordinator "
            "and --num-processes)"
        )
    if not _reachable(coordinator):
        return f"{head}: process {process_id} found no coordinator listening at {coordinator} (is process 0 running?)"
    return (
        f"{head}: process {process_id} reached {coordinator} but the sweep did not start (a process of ids "
        f"0 .. {int(num_processes or 0) - 1} missing, or one that stopped after it checked in)"
    )


def join(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    *,
    join_timeout: int,
    heartbeat_timeout: int,
    prog: str = "meanfield sweep",
) -> None:
    """Join ``jax.distributed`` (all of ``coordinator``, ``num_processes``, ``process_id``, or
    none: the cluster's environment), bounded by ``join_timeout`` seconds.

    For a process's own entry point only (the CLI), never a library call: when the join does
    not complete in time, a watchdog thread writes ``{prog}: error: ...`` (one line) on stderr
    and ends this process with status 2 (``os._exit``), because JAX would abort it
    (``SIGABRT``). Argument errors, a port in use, an unresolvable host and JAX's own
    exceptions are ``ValueError`` (one line).
    """
    check_args(
        coordinator,
        num_processes,
        process_id,
        join_timeout=join_timeout,
        heartbeat_timeout=heartbeat_timeout,
    )
    bind, held = None, []
    if coordinator is not None and process_id == 0:
        held = reserve_port(coordinator)
        bind = coordinator  # only the address given, not every interface
    import jax

    deadline = time.monotonic() + join_timeout  # the watchdog's, for the handshake before JAX

    lock = threading.Lock()
    joined = False

    def expire() -> None:
        with lock:
            if joined:
                return
            msg = _timeout_message(coordinator, num_processes, process_id, join_timeout)
            try:
                sys.stderr.write(f"{prog}: error: {msg}\n")
                sys.stderr.flush()
            finally:
                os._exit(2)

    watchdog = threading.Timer(join_timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        if (
            coordinator is not None
            and num_processes is not None
            and process_id is not None
            and num_processes > 1
            and hasattr(socket, "SO_REUSEPORT")
        ):  # (without it the port cannot be shared with JAX's service)
            try:  # before JAX: JAX aborts a process whose id its coordinator does not expect
                if process_id == 0:
                    held = gather(held, coordinator, num_processes, deadline)
                else:
                    check_in(coordinator, num_processes, process_id, deadline)
            except TimeoutError:
                raise HandshakeError(
                    _timeout_message(coordinator, num_processes, process_id, join_timeout)
                ) from None
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=join_timeout + _JAX_MARGIN,
            heartbeat_timeout_seconds=heartbeat_timeout,
            coordinator_bind_address=bind,
        )
    except HandshakeError:
        raise
    except (RuntimeError, ValueError, TypeError) as e:
        where = f" at {coordinator}" if coordinator else ""
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if coordinator is None and isinstance(e, ValueError):  # JAX's "... should be defined"
            text = (
                f"--distributed found no cluster environment (Slurm, Open MPI, Kubernetes, TPU) to take the "
                f"coordinator, process count and id from ({text}); give --coordinator, --num-processes "
                "and --process-id"
            )
        raise ValueError(f"cannot join the distributed sweep{where}: {text}") from None
    finally:
        with lock:
            joined = True
        watchdog.cancel()
        release(held)


class HandshakeError(ValueError):
    """A process refused by process 0's handshake (``check_in``), or a coordinator that does not
    answer it: one line, before JAX is joined."""


#: The first words of a process's request to process 0 (``check_in``), before JAX is joined.
_HELLO = "meanfield-join 1"


def _hold(family: int, addr: tuple) -> socket.socket:
    """A socket bound to ``addr`` with ``SO_REUSEPORT`` (not listening): it keeps the port from
    other programs until JAX's coordinator service (``SO_REUSEPORT`` too) has bound it."""
    for reuse in (
        False,
        True,
    ):  # SO_REUSEADDR only if connections of the handshake are in TIME_WAIT
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if reuse:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
            return s
        except OSError:
            s.close()
            if reuse:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def gather(
    held: list[socket.socket], coordinator: str, num_processes: int, deadline: float
) -> list[socket.socket]:
    """Process 0, before JAX: listen on the sockets of ``reserve_port`` until processes
    ``1 .. num_processes-1`` have each checked in once (``check_in``) with the same
    ``num_processes``, answering ``ok`` to all of them together; a process with another
    ``--num-processes``, or an id already checked in (by a process still connected), is
    answered with one line saying so (``HandshakeError`` there) and this one keeps waiting.
    JAX's coordinator would abort the process (``SIGABRT``) for either. Returns sockets bound to
    the same addresses, not listening, that hold the port until JAX's service binds it;
    ``TimeoutError`` past ``deadline`` (``time.monotonic()``)."""
    sel = selectors.DefaultSelector()
    for s in held:
        s.listen(64)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, None)
    pending: dict[socket.socket, bytes] = {}
    joined: dict[int, socket.socket] = {}

    def drop(conn: socket.socket, reply: str | None = None) -> None:
        if reply is not None:
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.settimeout(1.0)
                conn.sendall(f"refused: {reply}\n".encode())
        sel.unregister(conn)
        conn.close()
        pending.pop(conn, None)
        for i, c in list(joined.items()):
            if c is conn:
                del joined[i]

    try:
        while len(joined) < num_processes - 1:
            if time.monotonic() > deadline:
                raise TimeoutError
            for key, _ in sel.select(0.2):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                if key.data is None:  # a listener: a new connection
                    with contextlib.suppress(OSError):
                        new, _ = conn.accept()
                        new.setblocking(False)
                        sel.register(new, selectors.EVENT_READ, "conn")
                        pending[new] = b""
                    continue
                try:
                    chunk = conn.recv(512)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:  # closed: a process that gave up or was stopped, a probe of the port
                    drop(conn)
                    continue
                if conn not in pending:  # a process already checked in says nothing more
                    continue
                pending[conn] += chunk
                if b"\n" not in pending[conn]:
                    if len(pending[conn]) > 512:
                        drop(
                            conn,
                            f"not a meanfield join request (process 0 of a meanfield sweep is at {coordinator})",
                        )
                    continue
                words = pending.pop(conn).split(b"\n")[0].decode(errors="replace").split()
                if (
                    len(words) != 4
                    or " ".join(words[:2]) != _HELLO
                    or not all(w.isdigit() for w in words[2:])
                ):
                    drop(
                        conn,
                        f"not a meanfield join request (process 0 of a meanfield sweep is at {coordinator})",
                    )
                    continue
                n, i = int(words[2]), int(words[3])
                if n != num_processes:
                    drop(
                        conn,
                        f"process 0 (at {coordinator}) runs --num-processes {num_processes}, process {i} "
                        f"was started with --num-processes {n}: give every process the same --num-processes",
                    )
                elif not 1 <= i < num_processes:
                    drop(
                        conn,
                        f"process id {i} is not one process 0 (at {coordinator}) waits for: give each "
                        f"process its own --process-id in 1 .. {num_processes - 1} (0 is the coordinator)",
                    )
                elif i in joined:
                    drop(
                        conn,
                        f"process id {i} has already joined process 0 (at {coordinator}) from another "
                        f"process: give each process its own --process-id in 0 .. {num_processes - 1}",
                    )
                else:
                    joined[i] = conn
        for conn in joined.values():  # all here: each closes first (no TIME_WAIT on the port here)
            conn.setblocking(True)
            conn.settimeout(1.0)
            with contextlib.suppress(OSError):
                conn.sendall(b"ok\n")
        for conn in joined.values():
            with contextlib.suppress(OSError):
                conn.recv(1)
            conn.close()
        holders = [_hold(s.family, s.getsockname()) for s in held]
        return holders
    finally:
        for key in list(sel.get_map().values()):
            if key.data is not None:
                key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
        release(held)


def check_in(coordinator: str, num_processes: int, process_id: int, deadline: float) -> None:
    """Process ``process_id > 0``, before JAX: tell process 0 (``gather``) this process's
    ``num_processes`` and id, and wait for its answer (it comes once every process has checked
    in). Nothing listening yet: retried every 0.2 s. ``HandshakeError`` with process 0's reason
    when it refuses this process, or when what answers is not a meanfield sweep's process 0
    waiting for its processes; ``TimeoutError`` past ``deadline`` (``time.monotonic()``)."""
    host, port = split_address(coordinator)
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        try:
            conn = socket.create_connection((host, port), timeout=1.0)
        except OSError:
            time.sleep(0.2)
            continue
        reply = b""
        with conn:
            try:
                conn.sendall(f"{_HELLO} {num_processes} {process_id}\n".encode())
                conn.settimeout(0.5)
                while b"\n" not in reply and len(reply) <= 4096:
                    if time.monotonic() > deadline:
                        raise TimeoutError
                    try:
                        chunk = conn.recv(4096)
                    except TimeoutError:
                        continue
                    if not chunk:
                        break
                    reply += chunk
            except TimeoutError:
                raise
            except OSError:
                pass
        line = reply.split(b"\n")[0].decode(errors="replace")
        if line == "ok":
            return
        if line.startswith("refused: "):
            raise HandshakeError(line[len("refused: ") :])
        raise HandshakeError(
            f"the coordinator at {coordinator} did not answer as process 0 of a meanfield sweep "
            "waiting for its processes (its sweep has started with all its processes, or it is "
            "another program)"
        )


#: int32 words exchanged per process by ``agree``: the spec hash (32 bytes, one per word),
#: the grid size and the ``dry_run`` flag.
_WORDS = 34


def _fingerprint(spec_hash: str, grid_size: int, dry_run: bool) -> np.ndarray:
    digest = np.frombuffer(bytes.fromhex(spec_hash), np.uint8).astype(np.int32)
    return np.concatenate([digest, np.asarray([min(grid_size, 2**31 - 1), int(dry_run)], np.int32)])


def agree(
    spec_hash: str, grid_size: int, dry_run: bool
) -> None:  # pragma: no cover - several processes
    """Check that every process of ``jax.distributed`` runs the spec of process 0 (its hash and
    grid size) and the same ``dry_run``: one collective of a fixed shape
    (``process_allgather``), so processes with different specs or grid shapes reach it alike.
    On a mismatch every process raises ``DisagreementError`` naming the processes that differ,
    before anything is written."""
    from jax.experimental import multihost_utils

    mine = _fingerprint(spec_hash, grid_size, dry_run)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, _WORDS)
    ref = every[0]
    specs = [i for i, row in enumerate(every) if not np.array_equal(row[:33], ref[:33])]
    if specs:

        def label(row: np.ndarray) -> str:
            return f"hash {bytes(row[:32].astype(np.uint8)).hex()[:12]}, {int(row[32])} points"

        shown = ", ".join(f"process {i} ({label(every[i])})" for i in specs[:5])
        more = f" and {len(specs) - 5} more" if len(specs) > 5 else ""
        raise DisagreementError(
            f"the processes run different specs: {shown}{more} against process 0 "
            f"({label(ref)}); start every process with the same spec"
        )
    runs = [i for i, row in enumerate(every) if row[33] != ref[33]]
    if runs:
        which = "with" if ref[33] else "without"
        raise DisagreementError(
            f"process 0 was started {which} --dry-run but process(es) "
            f"{', '.join(map(str, runs[:10]))} not: give every process the same flags"
        )
