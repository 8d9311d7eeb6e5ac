"""Strict isolation: the processes a worker forks to serve requests, and their pipes. Stdlib only.

Under strict isolation the worker (the zygote) runs no generated code and never opens an episode's
database: every request of `worker.RUN_OPS` is served by a process forked from it
(`ForkedProcesses.serve`). Tool calls, snapshots and diffs go to their episode's own process, kept
between requests (no more than `episode_processes` alive, those handed to the parent counted: the
least recently used kept one stopped first, `_make_room`) and, where the parent asks, handed to the
parent (its pipes over the channel socket) so that its next requests skip the worker; every other request gets a process of its own, gone with its answer. One process at a
time has an episode's database open. A process past the request's deadline, dead, or answering
outside the reply contract is stopped and the request is a `Failure` (env_error, with its limit).

The worker lends the table two things: what a freshly forked process does to become the request's
process (`become`: drop what is not its own, confine itself) and how it answers a request (`handle`);
the forked process then serves over its pipes (`_serve_requests`) until the worker closes them.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Container
from dataclasses import dataclass

from worldsmith.runtime.sandbox.failure import Failure
from worldsmith.runtime.sandbox.messages import Reply, Request, WorkerConfig, as_request, episode_of
from worldsmith.runtime.sandbox.protocol import (
    EPISODE_OPS,
    FrameReader,
    ProtocolClosed,
    ProtocolTimeout,
    ProtocolViolation,
    accepted_reply,
    encode,
    process_failure,
    process_wait,
    send_within,
    write_frame,
)

#: A request's handler: its reply and the reply's blobs (`worker.Worker.handle`).
Handler = Callable[[Request, list[bytes]], tuple[Reply, list[bytes]]]


@dataclass
class RunProcess:
    """A process forked to serve requests (strict isolation): the worker reads its replies, and writes
    requests to `requests` if it serves more than the one it was forked for."""

    pid: int
    replies: FrameReader
    requests: int | None = None


class ForkedProcesses:
    """The processes forked from the worker (strict isolation; none under fast isolation): the episode
    processes it keeps (`live`), those handed to the parent (`handed`) and how those found ended did."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        strict: bool,
        become: Callable[[Request, tuple[int, int]], None],
        handle: Handler,
    ):
        self.config = config
        self._become = become  # in a forked process: make it the request's (keeping the two pipe ends given)
        self._handle = handle
        self.live: dict[str, RunProcess] = {}  # episode id -> its process (strict), least recently used first
        # strict: the socket to the parent over which episode processes' pipes are handed to it, and the
        # pids of those handed (the parent speaks to them directly; the worker still stops and reaps them)
        channel_fd = config.get("channel_fd")
        self.channel = socket.socket(fileno=channel_fd) if strict and isinstance(channel_fd, int) else None
        self.handed: dict[str, int] = {}
        self.ended: dict[str, str] = {}  # how handed processes found ended (`sweep_handed`) ended, until reaped

    def serve(self, request: Request, blobs: list[bytes], open_episodes: Container[str]) -> tuple[Reply, list[bytes]]:
        """Serve a request of `worker.RUN_OPS` in a process forked from this worker (which runs no generated
        code itself and stays clean) and return its checked reply. Tool calls, snapshots and diffs go to
        their episode's own process, forked at its first request and kept (no more than
        `episode_processes` alive: `_make_room`); every other request (verification above all) gets a
        process of its own, gone with its answer (the episode's own process is stopped first: one process
        at a time has an episode's database open, and keeps it locked). A process past the request's
        deadline, dead, or answering outside the reply contract is stopped and the request is an
        env_error; its episode's next call forks a fresh one. The reply of an episode's process carries its
        `pid` (the parent counts what it holds: runtime/totals.py). `open_episodes`: the worker's, by id."""
        episode_id = episode_of(request)
        self.sweep_handed()
        self.reap_handed(episode_id)  # the parent gave its channel up: the process goes before another opens
        if request.get("op") in EPISODE_OPS and episode_id is not None and episode_id in open_episodes:
            process = self.live.pop(episode_id, None)
            if process is not None and not self._send(process, request, blobs):
                _stop(process)  # gone since its last call: its next one starts afresh
                process = None
            if process is None:
                self._make_room()
                direct = request.get("direct") is True
                process = self._spawn(request, blobs, persistent=True, unserved=direct)
                if direct and self._hand_over(episode_id, process):  # the parent sends it the request itself
                    return {"status": "ok", "channel": True, "unserved": True, "pid": process.pid}, []
                if direct and not self._send(process, request, blobs):
                    _stop(process)
                    raise Failure("env_error", process_failure("crash", "ended before its request"), "crash")
            try:
                reply, reply_blobs = self._answer(process, request)
            except Failure:
                _stop(process)
                raise
            if reply.pop("retire", False):  # it ran code that broke a limit: its next call starts afresh
                _stop(process)
            elif request.get("direct") is True and self._hand_over(episode_id, process):
                reply["channel"], reply["pid"] = True, process.pid
            else:
                self.live[episode_id] = process
                reply["pid"] = process.pid
            return reply, reply_blobs
        if episode_id in self.live:  # it holds the episode's database (locked): it goes, its next call forks anew
            self.stop_episode_process(episode_id)
        self._make_room()
        process = self._spawn(request, blobs, persistent=False)
        try:
            reply, reply_blobs = self._answer(process, request)
            reply.pop("retire", None)
            return reply, reply_blobs
        finally:
            _stop(process)

    def _make_room(self) -> None:
        """Before forking: no more than `episode_processes` processes alive, ever (those handed to the
        parent counted, the ended ones reaped first): kept ones stopped, the least recently used
        first. Handed ones are the parent's to give up: it does so before it asks for a fork that needs
        their room (runtime/worker_handle.py), so a busy one is never stopped here; one it gave up
        exits at the end of its pipe, and is waited for up to the grace period. Past that, the request
        is an env_error naming the limit."""
        self.sweep_handed()
        cap = max(int(self.config.get("episode_processes", 128)), 1)
        deadline = time.monotonic() + float(self.config.get("grace_s", 2.0))
        while len(self.live) + len(self.handed) >= cap:
            if self.stop_least_recent():
                continue
            if self.handed and time.monotonic() < deadline:
                time.sleep(0.002)
                self.sweep_handed()
            else:
                raise Failure(
                    "env_error",
                    f"sandbox limit processes: the worker's {cap} episode processes are all in use "
                    "(WORLDSMITH_SANDBOX_EPISODE_PROCESSES)",
                    "processes",
                )

    def stop_least_recent(self) -> bool:
        """Stop the episode process used least recently; False if none is kept."""
        if not self.live:
            return False
        _stop(self.live.pop(next(iter(self.live))))
        return True

    def stop_episode_process(self, episode_id: str) -> None:
        process = self.live.pop(episode_id, None)
        if process is not None:
            _stop(process)
        self.reap_handed(episode_id)

    def _hand_over(self, episode_id: str, process: RunProcess) -> bool:
        """Give the parent `process`'s pipes (SCM_RIGHTS over the channel socket, tagged with the
        episode id): its next requests go to it directly. The worker keeps only its pid, to stop and
        reap it when the parent gives the channel up. False (the worker keeps the process) when there
        is no channel, or the process wrote more than its reply (the parent must not inherit that)."""
        if self.channel is None or process.requests is None or process.replies.pending():
            return False
        try:
            socket.send_fds(self.channel, [episode_id.encode()], [process.replies.fd, process.requests])
        except OSError:
            return False
        for fd in (process.replies.fd, process.requests):
            os.close(fd)
        self.handed[episode_id] = process.pid
        return True

    def reap_handed(self, episode_id: str | None, grace_s: float = 0.0, only: int | None = None) -> str | None:
        """Stop the process of `episode_id` handed to the parent (if any; with `only`, if it is still that
        pid: a later one is the episode's next process), given `grace_s` to end by itself; returns how it
        ended (also when `sweep_handed` found it ended)."""
        if not isinstance(episode_id, str) or (only is not None and self.handed.get(episode_id, only) != only):
            return None
        pid = self.handed.pop(episode_id, None)
        ended = self.ended.pop(episode_id, None)
        return ended if pid is None else _ending(_end(pid, grace_s))

    def sweep_handed(self) -> None:
        """Reap the handed processes that ended (their channel given up, or dead): no zombie waits for
        its episode's next request; how each ended is kept for `reap`."""
        for episode_id, pid in list(self.handed.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del self.handed[episode_id]
                self.ended[episode_id] = _ending(status)

    def _spawn(self, request: Request, blobs: list[bytes], *, persistent: bool, unserved: bool = False) -> RunProcess:
        """Fork a process that serves `request` (and, if `persistent`, the requests sent to it after;
        `unserved`: it becomes `request`'s process but waits for its requests, that one included, on its
        pipe: it is handed to the parent at once, so that this worker never waits for a call).
        Short of descriptors or processes, kept episode processes are stopped (least recent first)
        until it can; failing that the request is an env_error."""
        while True:
            opened: list[int] = []
            try:
                replies_r, replies_w = os.pipe()
                opened += (replies_r, replies_w)
                requests_r, requests_w = os.pipe() if persistent else (-1, -1)
                opened += (requests_r, requests_w)
                pid = os.fork()
                break
            except OSError as exc:
                for fd in opened:
                    if fd >= 0:
                        os.close(fd)
                if not self.stop_least_recent():
                    raise Failure(
                        "env_error", f"sandbox worker cannot start a process for the request: {exc}"
                    ) from None
        if pid == 0:  # the request's process: never returns
            code = 0
            try:
                os.close(replies_r)
                if persistent:
                    os.close(requests_w)
                self._become(request, (replies_w, requests_r))
                first = None if unserved else request
                _serve_requests(self._handle, first, blobs, replies_w, requests_r if persistent else None)
            except BaseException:  # noqa: BLE001 - the worker reports the missing reply
                code = 70
            finally:
                os._exit(code)
        os.close(replies_w)
        if persistent:
            os.close(requests_r)
            os.set_blocking(requests_w, False)  # `_send` waits for room itself, up to the request's deadline
        reader = FrameReader(replies_r, max_blobs=self.config["memory_mb"] * 1024 * 1024)
        return RunProcess(pid=pid, replies=reader, requests=requests_w if persistent else None)

    def _send(self, process: RunProcess, request: Request, blobs: list[bytes]) -> bool:
        """Write a request to a live episode process; False if it is gone or does not take it in time."""
        assert process.requests is not None
        return send_within(process.requests, encode(request, blobs), time.monotonic() + self._wait(request)) is None

    def _wait(self, request: Request) -> float:
        """How long a request's process may take: the parent's deadline less half the grace."""
        return process_wait(
            request.get("timeout_s"), float(self.config.get("grace_s", 2.0)), self.config["call_timeout_s"]
        )

    def _answer(self, process: RunProcess, request: Request) -> tuple[Reply, list[bytes]]:
        """The reply `process` writes, checked (`accepted_reply`); Failure past the deadline, on its
        death, or for a reply outside the contract."""
        wait = self._wait(request)
        try:
            frame, blobs = process.replies.read(time.monotonic() + wait)
            return accepted_reply(frame, request.get("id")), blobs
        except ProtocolTimeout:
            raise Failure("env_error", process_failure("timeout", f"{wait:g} s"), "timeout") from None
        except ProtocolClosed:
            ending = _ending(_stop(process, grace_s=1.0))
            raise Failure("env_error", process_failure("crash", ending), "crash") from None
        except ProtocolViolation as exc:
            raise Failure("env_error", process_failure("protocol", str(exc)), "protocol") from None

    def inherited_fds(self) -> list[int]:
        """In a freshly forked process: forget every process and the channel socket, and return the
        descriptors they hold there (for the caller to close: generated code never reaches them)."""
        fds = []
        if self.channel is not None:  # generated code never reaches the socket the parent takes pipes from
            fds.append(self.channel.detach())
            self.channel = None
        self.handed, self.ended = {}, {}
        for process in self.live.values():
            fds += [fd for fd in (process.requests, process.replies.fd) if fd is not None]
        self.live = {}
        return fds

    def pids(self) -> dict[str, int]:
        """The pid of each episode's process, kept or handed, by episode id."""
        return {episode: process.pid for episode, process in self.live.items()} | self.handed


def _serve_requests(
    handle: Handler, request: Request | None, blobs: list[bytes], out_fd: int, in_fd: int | None
) -> None:
    """In a forked process: answer the request it was forked for (None: none yet), then (persistent)
    each request its requester sends, until the pipe is closed."""
    out = os.fdopen(out_fd, "wb")
    requests = FrameReader(in_fd) if in_fd is not None else None
    while True:
        if request is not None:
            reply, reply_blobs = handle(request, blobs)
            write_frame(out, reply, reply_blobs)
        if requests is None:
            return
        try:
            frame, blobs = requests.read()
        except ProtocolClosed:
            return
        request = as_request(frame)


def _ending(status: int) -> str:
    """How a request's process that closed its pipe without a whole reply ended, from its wait status."""
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)} without an answer"


def _stop(process: RunProcess, grace_s: float = 0.0) -> int:
    """End a request's process: its pipes closed, given up to `grace_s` to exit by itself, then
    killed; returns its wait status."""
    for fd in (process.requests, process.replies.fd):
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    return _end(process.pid, grace_s)


def _end(pid: int, grace_s: float) -> int:
    """Wait up to `grace_s` for child `pid` to exit by itself, then kill it; returns its wait status."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.002)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return os.waitpid(pid, 0)[1]
