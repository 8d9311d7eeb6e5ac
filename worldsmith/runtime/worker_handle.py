"""The parent's handle on one sandbox worker process (`SandboxWorker`).

A worker is one confined child process serving one request at a time; callers on many threads share
it through a lock (`request`). Under strict isolation an episode's calls, snapshots and diffs go to
the episode's own process directly once the worker has handed its pipes over (runtime/channel.py;
`episode_request`), so they neither wait for the worker nor pass through it; such a process that
fails a request is stopped by the worker, which goes on. Before a request that may fork, room is made
within `episode_processes` (`_make_room`), and what the worker and its episodes hold is counted in
`totals` (runtime/totals.py). A request to the worker that overruns its
deadline gets the worker killed; a worker whose reply says it ran code that broke a limit is retired
right after; either way `WorkerLost` says why, and the pool (runtime/pool.py) starts a fresh worker
in its place. Nothing a worker sends can grow the parent without bound: frames are checked against
size limits before they are read (a worker breaking them is killed), and its stderr is kept as a
short tail of capped lines (runtime/worker_launch.py).
"""

from __future__ import annotations

import collections
import itertools
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import cast

import psutil

from worldsmith.runtime.channel import ChannelBroken, EpisodeChannel
from worldsmith.runtime.errors import RuntimeFault, WorkerLost
from worldsmith.runtime.limits import SandboxLimits
from worldsmith.runtime.sandbox.messages import (
    EpisodeRequest,
    Hello,
    ReapRequest,
    Reply,
    Request,
    as_reply,
    episode_of,
)
from worldsmith.runtime.sandbox.protocol import (
    EPISODE_OPS,
    MAX_REPLY_HEADER,
    FrameReader,
    ProtocolClosed,
    ProtocolTimeout,
    ProtocolViolation,
    process_failure,
    process_wait,
    reply_blob_limit,
    write_frame,
)
from worldsmith.runtime.totals import WorldTotals
from worldsmith.runtime.worker_launch import StderrTail, launch_worker


class SandboxWorker:
    """One confined worker process."""

    def __init__(self, limits: SandboxLimits, scratch_root: Path, *, frameworks: bool = False):
        self.limits = limits
        self.frameworks = frameworks
        self.name = uuid.uuid4().hex[:12]
        self.scratch = scratch_root / self.name
        self.loaded_envs: set[str] = set()
        self.env: str | None = None  # the one environment (runtime key) this worker may run; see WorkerPool
        self.episodes = 0
        self.handed_out = 0  # when the pool last handed it out (a count): the least recent goes first
        self.layers: dict[str, str] = {}
        self.dead_reason: str | None = None
        self._lock = threading.Lock()
        self._requests = itertools.count(1)
        self._stderr = StderrTail()
        # strict isolation: the socket over which the worker hands episode processes' pipes over, and
        # the direct channels held (episode id -> channel, least recently used first; at most
        # `limits.episode_processes`, as the worker keeps processes)
        self._handover: socket.socket | None = None
        self._direct: collections.OrderedDict[str, EpisodeChannel] = collections.OrderedDict()
        self._direct_lock = threading.Lock()
        self._forks = 0  # requests under way that may fork a process (`_make_room`)
        self._adopted: dict[str, EpisodeChannel] = {}  # channels adopted held for their first request
        theirs: socket.socket | None = None
        if limits.isolation == "strict":
            self._handover, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._handover.settimeout(limits.grace_s)
        self.process = launch_worker(
            limits, self.scratch, frameworks=frameworks, channel_fd=theirs.fileno() if theirs is not None else None
        )
        if theirs is not None:
            theirs.close()
        assert self.process.stderr is not None and self.process.stdout is not None
        threading.Thread(
            target=self._stderr.drain,
            args=(self.process.stderr.fileno(),),
            daemon=True,
            name=f"sandbox-stderr-{self.name}",
        ).start()
        # a worker cannot legitimately send more than its address space holds
        self._reader = FrameReader(
            self.process.stdout.fileno(), max_header=MAX_REPLY_HEADER, max_blobs=limits.memory_mb * 1024 * 1024
        )
        try:
            frame, _ = self._reader.read(time.monotonic() + limits.start_timeout_s)
        except (ProtocolClosed, ProtocolTimeout, ProtocolViolation) as exc:
            self.kill(f"failed to start: {exc}")
            raise RuntimeFault(f"sandbox worker failed to start: {exc}; stderr: {self.stderr_tail()}") from None
        hello = cast(Hello, frame)  # written before the worker ran any generated code
        self.pid = hello["pid"]
        self.layers = hello["layers"]
        # what this worker and its episodes hold, in total (runtime/totals.py)
        self.totals = WorldTotals(limits, self.scratch, self.pid, strict=limits.isolation == "strict")
        self.totals.measure_worker()

    def stderr_tail(self, lines: int = 5) -> str:
        return self._stderr.tail(lines)

    @property
    def alive(self) -> bool:
        return self.dead_reason is None and self.process.poll() is None

    def _death(self) -> str:
        """Why the worker went away; one still running after a short grace (blocked or silent) is killed."""
        try:
            code = self.process.wait(timeout=self.limits.grace_s)
        except subprocess.TimeoutExpired:
            self._stop()
            return "sandbox worker closed its reply channel but did not exit; killed"
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        tail = self.stderr_tail()
        return f"sandbox worker {how}" + (f" ({tail})" if tail else "")

    def request(
        self, request: Request, blobs: list[bytes] | tuple[bytes, ...] = (), *, timeout: float
    ) -> tuple[Reply, list[bytes]]:
        """Send one request and wait for its reply; raises `WorkerLost` if the worker is or goes away."""
        with self._lock:
            # no wait(2) per request: a worker that died unnoticed fails the write below (EPIPE) the same way
            if self.dead_reason is not None or self.process.returncode is not None:
                raise WorkerLost(self.dead_reason or "sandbox worker is gone", in_flight=False)
            number = next(self._requests)
            assert self.process.stdin is not None  # launched with a pipe
            try:
                write_frame(self.process.stdin, {**request, "id": number, "timeout_s": timeout}, blobs)
            except (BrokenPipeError, OSError):
                reason = self._death()
                self.kill(reason)
                raise WorkerLost(reason, in_flight=False) from None
            try:
                frame, reply_blobs = self._reader.read(
                    time.monotonic() + timeout, max_blobs=reply_blob_limit(request.get("op"))
                )
            except ProtocolTimeout:
                reason = f"sandbox limit timeout: no reply within {timeout:g} s; worker killed and replaced"
                self.kill(reason)
                raise WorkerLost(reason, in_flight=True, limit="timeout") from None
            except ProtocolClosed:
                reason = self._death()
                self.kill(reason)
                raise WorkerLost(f"{reason}; worker replaced", in_flight=True, limit="crash") from None
            except ProtocolViolation as exc:
                reason = f"sandbox limit protocol: the worker sent an invalid reply ({exc}); worker killed and replaced"
                self.kill(reason)
                raise WorkerLost(reason, in_flight=True, limit="protocol") from None
            if frame.get("id") != number:  # a frame written by generated code, not the worker's answer
                reason = (
                    f"sandbox limit protocol: the worker sent an invalid reply (an answer to request "
                    f"{frame.get('id')!r}, not {number}); worker killed and replaced"
                )
                self.kill(reason)
                raise WorkerLost(reason, in_flight=True, limit="protocol")
            reply = as_reply(frame)
            handed = reply.pop("channel", False) is True and request.get("direct") is True
            pid = reply.pop("pid", None)  # the worker's word: a process's own `pid` is dropped (RUNTIME_FIELDS)
            episode_id = episode_of(request)
            if reply.get("retire"):
                self.kill("retired after running code that broke a sandbox limit")
            elif handed and episode_id is not None:  # handed over only for an open episode's request
                self._adopt(episode_id, pid if isinstance(pid, int) else None, held=reply.get("unserved") is True)
            self.totals.measure_worker()
            if episode_id is not None and isinstance(pid, int):
                self.totals.process(episode_id, pid)
            return reply, reply_blobs

    def spares_at_rest(self, timeout: float) -> bool:
        """Strict isolation: wait until the worker's spares are forked and ready (a `ping` that settles
        them) and done with their warm-up (each asleep, waiting on its pipe to be claimed, at two looks
        in a row 2 ms apart), up to `timeout` in all. Whether it has spares and all came to rest in time.
        For measuring a first call at rest (bench/, tests)."""
        deadline = time.monotonic() + timeout
        reply, _ = self.request({"op": "ping", "settle": True}, timeout=timeout)
        spares = [pid for pid in reply.get("spares") or [] if isinstance(pid, int)]
        for pid in spares:
            asleep = 0
            while asleep < 2:
                if time.monotonic() > deadline:
                    return False
                try:
                    sleeping = psutil.Process(pid).status() == psutil.STATUS_SLEEPING
                except psutil.NoSuchProcess:
                    return False  # gone
                asleep = asleep + 1 if sleeping else 0
                time.sleep(0.002)
        return bool(spares)

    # -- direct channels (strict isolation) -------------------------------------------------------
    def episode_request(
        self, episode_id: str, request: EpisodeRequest, blobs: list[bytes] | tuple[bytes, ...] = (), *, timeout: float
    ) -> tuple[Reply, list[bytes]]:
        """A request of episode `episode_id`: a call, snapshot or diff on the episode's direct channel
        when it has one (else through the worker, which hands the channel over with its reply);
        anything else through the worker once the channel is given up. Raises `WorkerLost` as
        `request` does, also for a process that died with its worker."""
        if self._handover is None:
            return self.request(request, blobs, timeout=timeout)
        if request.get("op") not in EPISODE_OPS:
            self._give_up(episode_id)
            if request.get("op") == "verify":  # a process of its own
                return self._forking(request, blobs, timeout)
            return self.request(request, blobs, timeout=timeout)
        with self._direct_lock:
            channel = self._direct.get(episode_id)
            if channel is not None and channel.closed:  # closed to keep the cap: its process exited
                del self._direct[episode_id]
                channel = None
            if channel is not None:
                self._direct.move_to_end(episode_id)
        if channel is not None:
            with channel.lock:
                if not channel.closed:
                    answered = self._on_channel(episode_id, channel, request, blobs, timeout)
                    if answered is not None:
                        return answered
        direct = request.copy()
        direct["direct"] = True  # the worker hands the episode process's pipes over with its reply
        reply, reply_blobs = self._forking(direct, blobs, timeout)
        if reply.pop("unserved", False) is not True:
            return reply, reply_blobs
        # a process forked for it and handed over before it served it (the worker waits for no call): the
        # request goes on its channel, held since it was adopted; where it was not, through the worker
        with self._direct_lock:
            channel = self._adopted.pop(episode_id, None)
        if channel is not None:
            try:
                answered = self._on_channel(episode_id, channel, request, blobs, timeout)
            finally:
                channel.lock.release()
            if answered is not None:
                return answered
        return self._forking(request, blobs, timeout)

    def _forking(
        self, request: EpisodeRequest, blobs: list[bytes] | tuple[bytes, ...], timeout: float
    ) -> tuple[Reply, list[bytes]]:
        """`request` through the worker, which may fork a process for it: room made first (`_make_room`)."""
        admitted = self._make_room(time.monotonic() + timeout)
        try:
            return self.request(request, blobs, timeout=timeout)
        finally:
            if admitted:
                with self._direct_lock:
                    self._forks -= 1

    def _make_room(self, deadline: float) -> bool:
        """Before a request that may fork a process (an episode's, which has no channel; a
        verification's): wait until the channels held and the forks admitted leave room for one more
        within `episode_processes`, giving idle channels up (the least recently used first; the worker
        stops and reaps their processes) and otherwise waiting for a request to end, until `deadline`.
        True once admitted (counted in `_forks` until its request ends); False at the deadline, when the
        worker, which never forks past the cap (sandbox/processes.py), answers the request itself."""
        cap = max(self.limits.episode_processes, 1)
        while True:
            idle: tuple[str, EpisodeChannel] | None = None
            with self._direct_lock:
                for key in [key for key, c in self._direct.items() if c.closed]:
                    del self._direct[key]
                if len(self._direct) + self._forks < cap:
                    self._forks += 1
                    return True
                for key, channel in self._direct.items():
                    if channel.lock.acquire(blocking=False):
                        idle = key, channel
                        break
            if idle is not None:
                self._give_back(*idle)
            elif time.monotonic() < deadline:
                time.sleep(0.002)  # every process is in a request: the first to end makes room
            else:
                return False

    def _give_back(self, episode_id: str, channel: EpisodeChannel) -> None:
        """Close `channel` (its lock held here, released after) and have the worker stop and reap its process."""
        try:
            closed = channel.closed
            self._drop(episode_id, channel)
        finally:
            channel.lock.release()
        if not closed:
            self._reap(episode_id, limit=None, pid=channel.pid)

    def _on_channel(
        self,
        episode_id: str,
        channel: EpisodeChannel,
        request: EpisodeRequest,
        blobs: list[bytes] | tuple[bytes, ...],
        timeout: float,
    ) -> tuple[Reply, list[bytes]] | None:
        """The reply on `channel` (held), or a failure reply worded as the worker words it; None when
        the request is to go through the worker (the process was gone before it, or stopped by it)."""
        limits = self.limits
        wait = process_wait(timeout, limits.grace_s, limits.call_timeout_s)
        timed = request.copy()
        timed["timeout_s"] = timeout
        try:
            reply, reply_blobs = channel.request(timed, blobs, wait, number=next(self._requests))
        except ChannelBroken as broken:
            self._drop(episode_id, channel)
            if not broken.delivered:  # gone before it: the request goes through the worker (a fresh process)
                self._reap(episode_id, limit=None)
                return None
            ending = self._reap(episode_id, grace_s=1.0 if broken.limit == "crash" else 0.0, limit=broken.limit)
            detail = (ending or "ended without an answer") if broken.limit == "crash" else broken.detail
            return {"status": "env_error", "error": process_failure(broken.limit, detail), "limit": broken.limit}, []
        if reply.pop("retire", False):  # its code broke a limit: the episode's next call gets a fresh process
            self._drop(episode_id, channel)
            try:
                self._reap(episode_id, limit=None)
            except WorkerLost:
                pass  # this reply stands; the episode moves to a fresh worker at its next request
        return reply, reply_blobs

    def _reap(self, episode_id: str, *, grace_s: float = 0.0, limit: str | None, pid: int | None = None) -> str | None:
        """Have the worker stop and reap the process of `episode_id` whose channel was given up (with
        `pid`: only if it is still that one); how it ended (None: not known, the worker had reaped it
        before). A dead worker took its processes with it: WorkerLost, in flight with `limit` (the
        request's failure; None: the request never reached the process, or was answered)."""
        reap: ReapRequest = {"op": "reap", "episode": episode_id, "grace_s": grace_s}
        if pid is not None:
            reap["pid"] = pid
        try:
            reply, _ = self.request(reap, timeout=grace_s + self.limits.grace_s + 5)
        except WorkerLost as lost:
            raise WorkerLost(lost.reason, in_flight=limit is not None, limit=limit) from None
        ending = reply.get("ending")
        return ending if isinstance(ending, str) else None

    def channel_pid(self, episode_id: str) -> int | None:
        """The pid of the process on episode `episode_id`'s direct channel, if it has one."""
        with self._direct_lock:
            channel = self._direct.get(episode_id)
        return channel.pid if channel is not None and not channel.closed else None

    def _adopt(self, episode_id: str, pid: int | None, *, held: bool) -> None:
        """Take the pipes the worker just handed over for `episode_id`, of its process `pid` (under the
        request lock; `held`: its channel's lock taken for the caller, who sends it its first request); a
        hand-over that is not exactly that is a protocol violation of the worker (killed)."""
        assert self._handover is not None
        fds: list[int] = []
        flags = 0
        problem: str | None
        try:
            message, fds, flags, _ = socket.recv_fds(self._handover, 256, 2, socket.MSG_CMSG_CLOEXEC)
        except OSError as exc:
            message, problem = b"", f"no pipes came with it ({exc})"
        else:
            problem = None if message == episode_id.encode() else "pipes of another episode"
        if problem is None and len(fds) != 2:
            for fd in fds:
                os.close(fd)
            if flags & socket.MSG_CTRUNC:  # this process is out of descriptors: the episode goes on without
                return  # (its process, cut off, exits; the worker reaps it at the episode's next request)
            problem, fds = f"{len(fds)} pipes", []
        if problem is not None:
            for fd in fds:
                os.close(fd)
            reason = f"sandbox limit protocol: the worker handed over a channel badly ({problem}); worker killed"
            self.kill(reason)
            raise WorkerLost(reason, in_flight=True, limit="protocol")
        # a snapshot is of the episode's database: a file under the file size limit
        channel = EpisodeChannel(
            fds[0],
            fds[1],
            max_blobs=self.limits.memory_mb * 1024 * 1024,
            database_bytes=(self.limits.file_size_mb + 1) * 1024 * 1024,
        )
        channel.pid = pid
        if held:
            channel.lock.acquire()
        with self._direct_lock:
            if held:
                self._adopted[episode_id] = channel  # room was made before the fork (`_make_room`)
            old = self._direct.pop(episode_id, None)
            self._direct[episode_id] = channel
        if old is not None:
            old.close()

    def _give_up(self, episode_id: str) -> None:
        """Close `episode_id`'s direct channel, if it has one (the worker stops its process before
        serving the episode's next request)."""
        with self._direct_lock:
            channel = self._direct.pop(episode_id, None)
        if channel is not None:
            with channel.lock:
                channel.close()
            self.totals.process(episode_id, None)

    def _drop(self, episode_id: str, channel: EpisodeChannel) -> None:
        """Close `channel` (held by the caller) and forget it."""
        channel.close()
        self._forget(episode_id, channel)

    def _forget(self, episode_id: str, channel: EpisodeChannel) -> None:
        with self._direct_lock:
            current = self._direct.get(episode_id) is channel
            if current:
                del self._direct[episode_id]
        if current:
            self.totals.process(episode_id, None)

    def _stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)

    def kill(self, reason: str) -> None:
        """Stop the process (if running) and remember why; its scratch directory is removed."""
        if self.dead_reason is None:
            self.dead_reason = reason
        self._stop()
        with self._direct_lock:  # its episode processes died with it
            channels, self._direct = list(self._direct.values()), collections.OrderedDict()
        for channel in channels:  # one in use: its holder closes it on failure, the collector on success
            if channel.lock.acquire(blocking=False):
                try:
                    channel.close()
                finally:
                    channel.lock.release()
        if self._handover is not None:
            self._handover.close()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:  # launched with pipes: always
                    stream.close()
            except OSError:
                pass
        shutil.rmtree(self.scratch, ignore_errors=True)
