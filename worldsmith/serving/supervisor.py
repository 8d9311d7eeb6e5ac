"""`env serve --processes N`: N gateway processes on one port, each with its own runtime.

The supervisor (the `env serve` process itself) starts N member processes, each running the command it
is given with `--member INDEX/N@PID:RUN_DIR` appended (PID: the supervisor's; serving/affinity.py
`Member`). Each member binds its own listening socket on HOST:PORT with SO_REUSEPORT (the kernel
spreads connections over them) and its Unix socket `RUN_DIR/gateway-INDEX.sock` (where the others
forward the requests of its sessions), and serves the gateway app behind `Affinity`. The supervisor
relays the members' output, forwards SIGINT/SIGTERM/SIGHUP to them as SIGTERM, and stops them all when
one exits; a member that exits before it answers is the supervisor's one-line failure (its output shown
first when it said more than a line). Members leave by themselves when their supervisor is gone, even
before they serve (they watch that their parent is still the supervisor their `--member` names).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import uvicorn
from starlette.types import ASGIApp

from worldsmith.failures import UserFixable
from worldsmith.serving.access import Access
from worldsmith.serving.affinity import Affinity, Member

#: The option naming a member process, appended to the command the supervisor runs.
MEMBER_OPTION = "--member"


class PortUnavailable(UserFixable):
    """The port cannot be bound (the message names it)."""


def _address(host: str, port: int, host_option: str = "--host") -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise PortUnavailable(f"cannot bind {host}:{port}: {exc.strerror}; choose another {host_option}") from None
    return family, address


def _tcp_socket(family: socket.AddressFamily) -> socket.socket:
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so (else Nagle's algorithm and
    # delayed ACKs hold each answer, written as head then body, for 40 ms)
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)


def _unbindable(host: str, port: int, exc: OSError, port_option: str, host_option: str) -> PortUnavailable:
    """Why HOST:PORT cannot be bound, naming the option to change."""
    option = f"{host_option} (an address of this machine)" if exc.errno == errno.EADDRNOTAVAIL else port_option
    busy = " (another program listens there)" if exc.errno == errno.EADDRINUSE else ""
    return PortUnavailable(f"cannot bind {host}:{port}: {exc.strerror}{busy}; choose another {option}")


def check_port_free(host: str, port: int, port_option: str = "--port", host_option: str = "--host") -> None:
    """PortUnavailable unless HOST:PORT can be bound now (by anyone: another server, or another
    supervisor's members, which a SO_REUSEPORT socket would otherwise join); the message names the
    options to change."""
    _bound(host, port, shared=False, port_option=port_option, host_option=host_option).close()


def listener(host: str, port: int, port_option: str = "--port", host_option: str = "--host") -> socket.socket:
    """A socket listening on HOST:PORT (port 0: a free port the system chooses; `getsockname()` says
    which), for a server to serve on: it listens before the server says where it serves. PortUnavailable
    (a busy port, an address not of this machine) naming the option to change."""
    sock = _bound(host, port, shared=False, port_option=port_option, host_option=host_option)
    sock.listen(4096)
    return sock


def shared_listener(host: str, port: int) -> socket.socket:
    """A socket bound to HOST:PORT with SO_REUSEPORT (listened on by uvicorn)."""
    return _bound(host, port, shared=True)


def _bound(
    host: str, port: int, *, shared: bool, port_option: str = "--port", host_option: str = "--host"
) -> socket.socket:
    """A TCP socket bound to HOST:PORT (`shared`: with SO_REUSEPORT); PortUnavailable naming the option to change."""
    family, address = _address(host, port, host_option)
    sock = _tcp_socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise _unbindable(host, port, exc, port_option, host_option) from None
    return sock


def _unix_listener(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    path.chmod(0o600)
    return sock


def serve_member(
    app: ASGIApp, member: Member, host: str, port: int, *, access: Access | None = None, log_level: str = "info"
) -> None:
    """Serve `app` as gateway process `member` on HOST:PORT (shared) and on its Unix socket, until
    SIGINT/SIGTERM (raised again once stopped, as `uvicorn.run` does) or until its parent is gone.
    `access`: who may call, checked before a request is forwarded to its session's owner."""
    sockets = [shared_listener(host, port), _unix_listener(member.socket_path())]
    front = Affinity(app, member)
    config = uvicorn.Config(
        access.guard(front) if access is not None else front,
        log_level=log_level,
        access_log=False,
        backlog=4096,
        lifespan="on",
        timeout_graceful_shutdown=5,  # open streams (forwarded ones too) do not hold a stopping member
    )
    server = uvicorn.Server(config)
    parent = member.supervisor if member.supervisor is not None else os.getppid()

    def watch_parent() -> None:  # from the start: a supervisor gone while this member was starting counts
        while not server.should_exit:
            if os.getppid() != parent:
                server.should_exit = True
            time.sleep(1.0)

    threading.Thread(target=watch_parent, daemon=True, name="worldsmith-parent-watch").start()
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
        member.socket_path().unlink(missing_ok=True)


def _answers(path: Path) -> bool:
    """Whether a gateway answers `/healthz` on Unix socket `path` (its app started, its sockets listening)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(path))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _piped(stream: IO[bytes] | None) -> IO[bytes]:
    """The pipe of a member's output (members are started with stdout=PIPE: never None)."""
    assert stream is not None
    return stream


class _Output:
    """A member's output (its log: uvicorn's lines) copied line by line to this process's stderr, held back
    until `release`."""

    def __init__(self, stream: IO[bytes]):
        self.held: list[bytes] | None = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True, name="worldsmith-member-output")
        self._thread.start()

    def _copy(self, stream: IO[bytes]) -> None:
        for line in stream:
            with self._lock:
                if self.held is not None:
                    self.held.append(line)
                    continue
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()

    def release(self) -> None:
        with self._lock:
            held, self.held = self.held or [], None
            sys.stderr.buffer.write(b"".join(held))
            sys.stderr.buffer.flush()

    def failure(self) -> str | None:
        """The last line the member wrote (its one-line failure), once its output ended; the whole output
        released first when it is more than that line (a traceback: a bug stays debuggable)."""
        self._thread.join(timeout=5)
        lines = [line for line in (line.decode(errors="replace").strip() for line in self.held or []) if line]
        if len(lines) > 1:
            self.release()
        return lines[-1] if lines else None


def supervise(
    command: list[str],
    processes: int,
    *,
    run_dir: Path | None = None,
    on_ready: Callable[[], None] | None = None,
    start_s: float = 300.0,
) -> int:
    """Run `processes` members of `command` until SIGINT/SIGTERM/SIGHUP or until one exits; return the exit
    status (128 + the signal when stopped by one). A member that exits (or does not answer within
    `start_s`) before all answer stops the others and raises UserFixable with its last line.
    `on_ready` runs once every member answers. `run_dir` (default: a temporary directory, removed at
    the end) holds the members' Unix sockets."""
    owned = run_dir is None
    run_dir = Path(tempfile.mkdtemp(prefix="worldsmith-gateway-")) if run_dir is None else run_dir
    members = [Member(i, processes, run_dir, os.getpid()) for i in range(processes)]
    stop: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.append(signum)) for sig in _STOPPING}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for member in members:  # a session of their own: a terminal's Ctrl-C reaches them once, through here
            procs.append(
                subprocess.Popen(
                    [*command, MEMBER_OPTION, member.argument()],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        relays = [_Output(_piped(proc.stdout)) for proc in procs]
        _wait_until_ready(members, procs, relays, stop, time.monotonic() + start_s)
        for relay in relays:
            relay.release()
        if stop:
            return 128 + stop[0]
        if on_ready is not None:
            on_ready()
        while not stop:
            exited = [(m, p.returncode) for m, p in zip(members, procs, strict=True) if p.poll() is not None]
            if exited:
                member, code = exited[0]
                print(f"gateway process {member.index} exited ({_status(code)}): stopping the others", file=sys.stderr)
                return code if code > 0 else 1
            time.sleep(0.2)
        return 128 + stop[0]
    finally:
        _stop(procs)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if owned:
            shutil.rmtree(run_dir, ignore_errors=True)


_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _wait_until_ready(
    members: list[Member], procs: list[subprocess.Popen[bytes]], relays: list[_Output], stop: list[int], deadline: float
) -> None:
    waiting = set(range(len(members)))
    while waiting and not stop:
        for i in sorted(waiting):
            if procs[i].poll() is not None:
                line = relays[i].failure() or f"it exited ({_status(procs[i].returncode)})"
                code = procs[i].returncode if procs[i].returncode in (1, 2) else 1
                raise UserFixable(f"gateway process {i} of {len(members)} could not start: {line}", exit_code=code)
            if _answers(members[i].socket_path()):
                waiting.discard(i)
        if time.monotonic() > deadline:
            for relay in relays:
                relay.release()
            raise UserFixable(
                f"gateway processes {sorted(waiting)} did not answer in time: see their output above", exit_code=1
            )
        time.sleep(0.05)


def _status(code: int) -> str:
    """A member's exit status in words: `status N`, or the signal that ended it (a negative return code)."""
    if code >= 0:
        return f"status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _stop(procs: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """SIGTERM every member still running, then SIGKILL those still there after `grace_s`."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
