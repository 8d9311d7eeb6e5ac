"""Strict isolation: the processes a worker has its template fork to serve requests, and their pipes. Stdlib only.

Under strict isolation the worker (the zygote) runs no generated code and never opens an episode's
database: every request of `worker.RUN_OPS` is served by a process forked for it. The worker never
forks these itself: its template (`template.py`, forked once, right after the environment was loaded
and before any episode's request) does, so that a process inherits nothing the worker decoded for
other episodes. A process gets its episode's identity and then its requests on its own pipe from the
worker (`_run_child`); requests and answers never pass through the template.

Tool calls, snapshots and diffs go to their episode's own process, kept between requests and, where
the parent asks, handed to the parent (its pipes over the channel socket) as soon as it is forked,
before it serves anything, so that its requests, the first included, skip the worker; every other
request gets a process of its own, gone with its answer. No more than `episode_processes` are alive at
once, those handed to the parent counted (`_make_room`: the least recently used kept one stopped
first). One process at a time has an episode's
database open. A process past the request's deadline, dead, or answering outside the reply contract
is stopped and the request is a `Failure` (env_error, with its limit).

The worker lends the table two things: what a freshly forked process does to become the request's
process (`become`: confine itself to its episode) and how it answers a request (`handle`); the
forked process then serves over its pipes (`_serve_requests`) until the worker closes them.

Spares (`refill`, `claim`): a few processes per worker (`spare_processes`) forked ahead, before any
episode asks, so that an episode's first call finds its process started, its database made and open
and its confinement done. A spare is forked by the template like any other process (it has seen no
episode), told only its environment and a fresh directory (128 random bits, drawn for it), and then
confines itself to that directory, says it is ready (one frame) and waits. An episode opened afresh
takes one once it is ready (`claim`, `_until_ready`): the spare's directory becomes the episode's, and the spare is told whose it is (the episode's id and clock skew)
and becomes that episode's process, stopped with it like any other: a spare serves one episode, never
another. Spares count against `episode_processes` and go first when room is needed; unclaimed, they
die with the template (their directories with the worker's scratch directory) or are discarded with
their files (`discard_spares`). For an imported app, a probe forked like a spare at load (never
claimed, holding no episode) tells which pages a first call writes, and each spare writes them ahead
once it is unclaimed and warm (`start_probe`, `end_probe`, firstpages.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from worldsmith.runtime.sandbox import episodedb, firstpages, kernel, standin
from worldsmith.runtime.sandbox.failure import Failure
from worldsmith.runtime.sandbox.messages import (
    Reply,
    Request,
    RunIdentity,
    SpareClaim,
    WorkerConfig,
    as_request,
    env_of,
    episode_of,
)
from worldsmith.runtime.sandbox.protocol import (
    EPISODE_OPS,
    MAX_REPLY_HEADER,
    FrameReader,
    ProtocolClosed,
    ProtocolTimeout,
    ProtocolViolation,
    accepted_reply,
    encode,
    process_failure,
    process_wait,
    ready,
    reply_blob_limit,
    send_within,
    write_frame,
)
from worldsmith.runtime.sandbox.records import OpenEpisode, database_path
from worldsmith.runtime.sandbox.template import TemplateProcess, start_template

#: The syscalls that make processes: denied to the worker once its template runs (`start_template`).
FORKS = frozenset({"clone", "fork", "vfork"})

#: How long the probe of a world's first calls may take (`start_probe`): past it, spares go without.
PROBE_S = 2.0

#: A request's handler: its reply and the reply's blobs (`worker.Worker.handle`).
Handler = Callable[[Request, list[bytes]], tuple[Reply, list[bytes]]]


@dataclass
class RunProcess:
    """A process forked to serve requests (strict isolation): the worker writes its requests to
    `requests` and reads its replies; `serial` is the template's name for it."""

    pid: int
    serial: int
    replies: FrameReader
    requests: int
    fresh: bool = False  # a spare claimed by its episode that has served nothing yet (`claim`)


@dataclass
class Spare:
    """A process forked ahead of any episode (`ForkedProcesses.refill`), confined to `directory`."""

    process: RunProcess
    directory: str
    ready: bool = False  # its readiness frame read (`_until_ready`): confined, its database open


class ForkedProcesses:
    """The processes the worker's template forked for it (strict isolation; none under fast
    isolation): the episode processes it keeps (`live`), those handed to the parent (`handed`) and
    how those found ended did."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        strict: bool,
        control: tuple[socket.socket, socket.socket] | None,
        become: Callable[[RunIdentity], None],
        claimed: Callable[[SpareClaim], None],
        warm: Callable[[], None],
        probe: Callable[[], None],
        handle: Handler,
    ):
        self.config = config
        self._control = control  # strict: the socket pair to the template, made before the worker confined itself
        self._become = become  # in a forked process: make it the identity's (confined to its episode)
        self._claimed = claimed  # in a spare: make it its episode's (`claim`)
        self._warm = warm  # in a spare that no episode waits for yet: what its first request would build
        self._probe = probe  # in the probe (`start_probe`): its stand-in calls
        self._handle = handle
        self.template: TemplateProcess | None = None  # strict: once the environment is loaded
        self.live: dict[str, RunProcess] = {}  # episode id -> its process (strict), least recently used first
        # strict: the socket to the parent over which episode processes' pipes are handed to it, and the
        # (pid, serial) of those handed (the parent speaks to them directly; the worker still stops them)
        channel_fd = config.get("channel_fd")
        self.channel = socket.socket(fileno=channel_fd) if strict and isinstance(channel_fd, int) else None
        self.handed: dict[str, tuple[int, int]] = {}
        self.ended: dict[str, str] = {}  # how handed processes found ended (`sweep_handed`) ended, until reaped
        self.spares: list[Spare] = []  # strict: forked ahead, no episode's yet (`refill`, `claim`)
        self.prober: Spare | None = None  # the probe whose pages the parent has yet to read (`start_probe`)
        self.first_pages = b""  # what each spare makes its own ahead (`firstpages`; b"": nothing)

    def start_template(self, prepare: Callable[[], None]) -> None:
        """Fork the template every process will be forked from (`template.py`); the worker calls this
        once, with its one environment loaded and before any episode's request. `prepare` runs in the
        template first (it drops the worker's channels)."""
        if self._control is None:
            raise Failure("env_error", "sandbox worker fault: no socket to a template (strict isolation only)")
        prepare_s = self.config["call_timeout_s"]  # the app's build (`Operations.build_shared`)
        if self.config.get("frameworks") and self.config.get("stand_in_reads", True):
            prepare_s += standin.BUDGET_S  # and its stand-in reads
        self.template = start_template(self._control, prepare, self._run_child, prepare_s)
        try:  # the worker forks nothing more (its heap is no clean source): a filter on top of its own
            kernel.seccomp(kernel.ZYGOTE_ALLOWED - FORKS)
        except OSError:
            pass  # no seccomp here (its layer reports it off): the worker's code forks nothing anyway

    def _template(self) -> TemplateProcess:
        if self.template is None:
            raise Failure("env_error", "no environment is loaded in this worker")
        return self.template

    def serve(
        self, request: Request, blobs: list[bytes], open_episodes: Mapping[str, OpenEpisode]
    ) -> tuple[Reply, list[bytes]]:
        """Serve a request of `worker.RUN_OPS` in a process forked by the template (which runs
        generated code only before it forks, and never sees a request) and return its checked reply. Tool calls, snapshots
        and diffs go to their episode's own process, forked at its first request and kept (no more than
        `episode_processes` alive: `_make_room`); where the request asks for a `direct` channel, the
        process is handed to the parent before it serves anything, and the reply says so (`unserved`):
        the parent sends it the request itself, so the worker waits for no call. Every other request
        (verification above all) gets a process of its own, gone with its answer (the episode's own
        process is stopped first: one process at a time has an episode's database open, and keeps it
        locked). A process past the request's deadline, dead, or answering outside the reply contract is
        stopped and the request is an env_error; its episode's next call forks a fresh one. The reply of
        an episode's process carries its `pid` (the parent counts what it holds: runtime/totals.py).
        `open_episodes`: the worker's, by id."""
        episode_id = episode_of(request)
        self.reap_handed(episode_id)  # the parent gave its channel up: the process goes before another opens
        episode = open_episodes.get(episode_id) if episode_id is not None else None
        if request.get("op") in EPISODE_OPS and episode is not None:
            process = self.live.pop(episode.id, None)
            direct = request.get("direct") is True
            if process is not None and process.fresh and direct and self._hand_over(episode.id, process):
                return {"status": "ok", "channel": True, "unserved": True, "pid": process.pid}, []  # a claimed spare
            if process is not None:
                process.fresh = False
            if process is not None and not self._send(process, request, blobs):
                self._stop(process)  # gone since its last call: its next one starts afresh
                process = None
            if process is None:
                self._make_room()
                process = self._spawn(request, blobs, episode, unserved=direct)
                if direct and self._hand_over(episode.id, process):  # the parent sends it the request itself
                    return {"status": "ok", "channel": True, "unserved": True, "pid": process.pid}, []
                if direct and not self._send(process, request, blobs):
                    self._stop(process)
                    raise Failure("env_error", process_failure("crash", "ended before its request"), "crash")
            try:
                reply, reply_blobs = self._answer(process, request)
            except Failure:
                self._stop(process)
                raise
            if reply.pop("retire", False):  # it ran code that broke a limit: its next call starts afresh
                self._stop(process)
            elif request.get("direct") is True and self._hand_over(episode.id, process):
                reply["channel"], reply["pid"] = True, process.pid
            else:
                self.live[episode.id] = process
                reply["pid"] = process.pid
            return reply, reply_blobs
        if episode_id in self.live:  # it holds the episode's database (locked): it goes, its next call forks anew
            self.stop_episode_process(episode_id)
        self._make_room()
        process = self._spawn(request, blobs, episode)
        try:
            reply, reply_blobs = self._answer(process, request)
            reply.pop("retire", None)
            return reply, reply_blobs
        finally:
            self._stop(process)

    def _make_room(self) -> None:
        """Before forking: no more than `episode_processes` processes alive, ever (those handed to the
        parent counted, the ended ones forgotten first): kept ones stopped, the least recently used
        first. Handed ones are the parent's to give up: it does so before it asks for a fork that needs
        their room (runtime/worker_handle.py), so a busy one is never stopped here; one it gave up
        exits at the end of its pipe, and is waited for up to the grace period. Past that, the request
        is an env_error naming the limit."""
        cap = self._cap()
        if self.alive() < cap:
            return
        self.sweep_handed()  # asks the template: only when the cap is reached
        deadline = time.monotonic() + float(self.config.get("grace_s", 2.0))
        while self.alive() >= cap:
            if self.prober is not None:  # the probe first: its pages are only a speed-up
                self.end_probe()
                continue
            if self.spares:  # spares go first: no episode's process is stopped for one
                self._discard(self.spares.pop())
                continue
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

    def _cap(self) -> int:
        return max(int(self.config.get("episode_processes", 128)), 1)

    def alive(self) -> int:
        """The processes the template forked for this worker and it has not stopped: kept, handed, spare,
        the probe."""
        return len(self.live) + len(self.handed) + len(self.spares) + (self.prober is not None)

    # -- spares ---------------------------------------------------------------------------
    def refill(
        self, env_key: str, new_directory: Callable[[], str], waiting: Callable[[], bool], *, settle: bool = False
    ) -> None:
        """Fork spares of `env_key` (the worker's one environment) until `spare_processes` wait, within
        `episode_processes` (room for episodes first: none is forked at the cap). Each gets a fresh
        directory (`new_directory`) that it makes, with its database from the world, and confines
        itself to before it says it is ready (one frame) and waits for an episode (`claim`). The worker
        calls this after a reply is sent, and it stops as soon as `waiting()` says a request waits (the
        next reply refills), so that no request waits for a fork; a spare that cannot be forked is simply
        not there. `settle` (a `ping` that asks for it): fork them all and wait until each is ready,
        so that what the reply says holds until the next episode opens."""
        target = max(int(self.config.get("spare_processes", 0)), 0) if self.prober is None else 0
        if settle and self.handed:
            self.sweep_handed()
        while self.template is not None and len(self.spares) < target and self.alive() < self._cap():
            if waiting():
                return
            directory = new_directory()
            identity: RunIdentity = {"env": env_key, "episode": None, "directory": directory, "skew_s": 0.0}
            try:
                process = self._fork()
            except OSError:
                return
            data = encode(identity, [self.first_pages] if self.first_pages else [])
            if send_within(process.requests, data, time.monotonic() + self._wait(None)) is not None:
                self._discard(Spare(process, directory))
                return
            self.spares.append(Spare(process, directory))
        if settle:
            self.spares = [spare for spare in list(self.spares) if self._until_ready(spare)]

    def _until_ready(self, spare: Spare) -> bool:
        """Wait (up to a request's deadline) for `spare`'s readiness frame: it made its directory, opened
        its database and confined itself. False (and it is discarded) if it ended or said anything else."""
        if spare.ready:
            return True
        try:
            frame, _ = spare.process.replies.read(time.monotonic() + self._wait(None), max_blobs=0)
            spare.ready = frame.get("ready") is True
        except (ProtocolTimeout, ProtocolClosed, ProtocolViolation):
            spare.ready = False
        if not spare.ready:
            self._discard(spare)
        return spare.ready

    def claim(self, episode_id: str, skew_s: object) -> str | None:
        """Make a spare `episode_id`'s process: it is told whose it is (the id, the clock skew) and kept
        as the episode's process, which has served nothing yet. Returns its directory (the episode's
        from now on), or None when no spare could take it (the episode gets a directory of its own)."""
        while self.spares:
            spare = self.spares.pop(0)  # the oldest: the most likely to be ready
            if not self._until_ready(spare):  # ready before it is the episode's: the open's reply vouches for it
                continue
            claim = encode({"episode": episode_id, "skew_s": skew_s})
            if send_within(spare.process.requests, claim, time.monotonic() + self._wait(None)) is None:
                spare.process.fresh = True
                self.live[episode_id] = spare.process
                return spare.directory
            self._discard(spare)  # gone since it was forked
        return None

    def hand_over_fresh(self, episode_id: str) -> int | None:
        """Hand the parent the pipes of `episode_id`'s claimed spare, which has served nothing yet (a
        `direct` open); its pid, or None where it stays with the worker."""
        process = self.live.get(episode_id)
        if process is None or not process.fresh or not self._hand_over(episode_id, process):
            return None
        del self.live[episode_id]
        return process.pid

    def discard_spares(self) -> None:
        """Stop every spare and remove its files (the environment goes)."""
        while self.spares:
            self._discard(self.spares.pop())

    def _discard(self, spare: Spare) -> None:
        """Stop an unclaimed spare and remove its directory and database (nothing followed)."""
        self._stop(spare.process)
        shutil.rmtree(spare.directory, ignore_errors=True)
        episodedb.remove_db(database_path(spare.directory))

    # -- the probe of a world's first calls (firstpages.py) --------------------------------------
    def start_probe(self, env_key: str, directory: str) -> int | None:
        """Fork the probe of `env_key` (`firstpages`): confined to `directory` like a spare, it makes its
        stand-in calls, says so and waits while the parent reads which pages it wrote (`end_probe`). No
        spare is forked until then. Its pid, or None (and it is gone) if it did not say so in time."""
        self.end_probe()
        identity: RunIdentity = {"env": env_key, "episode": None, "directory": directory, "skew_s": 0.0, "probe": True}
        try:
            self.prober = Spare(self._fork(), directory)
        except OSError:
            return None
        deadline = time.monotonic() + min(self._wait(None), PROBE_S)
        try:
            if send_within(self.prober.process.requests, encode(identity), deadline) is None:
                frame, _ = self.prober.process.replies.read(deadline, max_blobs=0)
                if frame.get("probed") is True:
                    return self.prober.process.pid
        except (ProtocolTimeout, ProtocolClosed, ProtocolViolation):
            pass
        self.end_probe()
        return None

    def end_probe(self, written: bytes = b"") -> None:
        """The probe and its files go; the pages the parent read from it (`written`, as
        `firstpages.written_pages` gives them; b"": none) are what spares forked from now on make their
        own ahead. ValueError if `written` is no list of page ranges."""
        if self.prober is not None:
            self._discard(self.prober)
            self.prober = None
        if written:
            self.first_pages = firstpages.pack(firstpages.ranges(written))

    def stop_least_recent(self) -> bool:
        """Stop the episode process used least recently; False if none is kept."""
        if not self.live:
            return False
        self._stop(self.live.pop(next(iter(self.live))))
        return True

    def stop_episode_process(self, episode_id: str) -> None:
        process = self.live.pop(episode_id, None)
        if process is not None:
            self._stop(process)
        self.reap_handed(episode_id)

    def _hand_over(self, episode_id: str, process: RunProcess) -> bool:
        """Give the parent `process`'s pipes (SCM_RIGHTS over the channel socket, tagged with the
        episode id): its next requests go to it directly. The worker keeps only its pid and serial, to
        stop it when the parent gives the channel up. False (the worker keeps the process) when there
        is no channel, or the process wrote more than its reply (the parent must not inherit that)."""
        if self.channel is None or process.replies.pending():
            return False
        try:
            socket.send_fds(self.channel, [episode_id.encode()], [process.replies.fd, process.requests])
        except OSError:
            return False
        for fd in (process.replies.fd, process.requests):
            os.close(fd)
        self.handed[episode_id] = (process.pid, process.serial)
        return True

    def reap_handed(self, episode_id: str | None, grace_s: float = 0.0, only: int | None = None) -> str | None:
        """Stop the process of `episode_id` handed to the parent (if any; with `only`, if it is still that
        pid: a later one is the episode's next process), given `grace_s` to end by itself; returns how it
        ended (also when `sweep_handed` found it ended)."""
        if not isinstance(episode_id, str):
            return None
        if only is not None and episode_id in self.handed and self.handed[episode_id][0] != only:
            return None
        handed = self.handed.pop(episode_id, None)
        ended = self.ended.pop(episode_id, None)
        return ended if handed is None else _ending(self._template().end(handed[1], grace_s))

    def sweep_handed(self) -> None:
        """Forget the handed processes that ended (their channel given up, or dead; the template reaped
        them); how each ended is kept for `reap_handed`."""
        if not self.handed:
            return
        statuses = self._template().ended(serial for _, serial in self.handed.values())
        for episode_id, (_, serial) in list(self.handed.items()):
            if serial in statuses:
                del self.handed[episode_id]
                self.ended[episode_id] = _ending(statuses[serial])

    def _spawn(
        self, request: Request, blobs: list[bytes], episode: OpenEpisode | None, *, unserved: bool = False
    ) -> RunProcess:
        """A process forked by the template, told whose it is (`episode`'s, else the request's
        environment's) and given `request` (`unserved`: not given it; it waits for its requests, that
        one included, on its pipe: it is handed to the parent at once, so that this worker never waits
        for a call). Short of descriptors or processes, kept episode processes are stopped (least
        recent first) until it can; failing that the request is an env_error."""
        while True:
            try:
                process = self._fork()
                break
            except OSError as exc:
                if self.spares:
                    self._discard(self.spares.pop())
                elif not self.stop_least_recent():
                    raise Failure(
                        "env_error", f"sandbox worker cannot start a process for the request: {exc}"
                    ) from None
        identity: RunIdentity = {
            "env": episode.env.key if episode is not None else env_of(request),
            "episode": episode.id if episode is not None else None,
            "directory": episode.directory if episode is not None else None,
            "skew_s": request.get("skew_s"),
        }
        data = encode(identity) + (b"" if unserved else encode(request, blobs))
        if send_within(process.requests, data, time.monotonic() + self._wait(request)) == "late":
            self._stop(process)
            raise Failure("env_error", process_failure("timeout", f"{self._wait(request):g} s"), "timeout")
        return process  # a process gone before it took the request: its reply's read says how it ended

    def _fork(self) -> RunProcess:
        """A process freshly forked by the template, waiting for whose it is; OSError if it could not be."""
        spawned = self._template().spawn()
        os.set_blocking(spawned.requests, False)  # `send_within` waits for room itself, up to the deadline
        reader = FrameReader(
            spawned.replies, max_header=MAX_REPLY_HEADER, max_blobs=self.config["memory_mb"] * 1024 * 1024
        )
        return RunProcess(pid=spawned.pid, serial=spawned.serial, replies=reader, requests=spawned.requests)

    def _send(self, process: RunProcess, request: Request, blobs: list[bytes]) -> bool:
        """Write a request to a live episode process; False if it is gone or does not take it in time."""
        return send_within(process.requests, encode(request, blobs), time.monotonic() + self._wait(request)) is None

    def _wait(self, request: Request | None) -> float:
        """How long a request's process may take: the parent's deadline less half the grace (None: a
        frame that is no request, a spare's, timed as a request without a deadline of its own)."""
        return process_wait(
            request.get("timeout_s") if request is not None else None,
            float(self.config.get("grace_s", 2.0)),
            self.config["call_timeout_s"],
        )

    def _answer(self, process: RunProcess, request: Request) -> tuple[Reply, list[bytes]]:
        """The reply `process` writes, checked (`accepted_reply`); Failure past the deadline, on its
        death, or for a reply outside the contract."""
        wait = self._wait(request)
        try:
            frame, blobs = process.replies.read(time.monotonic() + wait, max_blobs=reply_blob_limit(request.get("op")))
            return accepted_reply(frame, request.get("id")), blobs
        except ProtocolTimeout:
            raise Failure("env_error", process_failure("timeout", f"{wait:g} s"), "timeout") from None
        except ProtocolClosed:
            ending = _ending(self._stop(process, grace_s=1.0))
            raise Failure("env_error", process_failure("crash", ending), "crash") from None
        except ProtocolViolation as exc:
            raise Failure("env_error", process_failure("protocol", str(exc)), "protocol") from None

    def _stop(self, process: RunProcess, grace_s: float = 0.0) -> int:
        """End a request's process: its pipes closed, given up to `grace_s` to exit by itself, then
        killed (by the template, its parent); returns its wait status."""
        for fd in (process.requests, process.replies.fd):
            try:
                os.close(fd)
            except OSError:
                pass
        return self._template().end(process.serial, grace_s)

    def _run_child(self, requests_fd: int, replies_fd: int) -> None:
        """In a process the template forked: read whose it is (the worker's first frame), become it
        (`become`: confined to its episode), then serve the requests the worker sends until it closes
        the pipe."""
        requests = FrameReader(requests_fd)
        identity, pages = requests.read()
        self._become(cast(RunIdentity, identity))
        if identity.get("probe") is True:  # its calls made, it waits until the parent has read its pages
            self._probe()
            _write_all(replies_fd, encode({"probed": True}))
            with contextlib.suppress(ProtocolClosed):
                requests.read()
            return
        if identity.get("episode") is None and identity.get("directory") is not None:  # a spare: whose, later
            _write_all(replies_fd, encode({"ready": True}))  # confined, its database open (`_until_ready`)

            def claimed() -> bool:
                return requests.pending() or ready(requests_fd, 0.0)

            if not claimed():  # no episode waits for it yet
                self._warm()
                with contextlib.suppress(ValueError):
                    firstpages.write_ahead(pages[0] if pages else b"", claimed)
            claim, _ = requests.read()
            self._claimed(cast(SpareClaim, claim))
        _serve_requests(self._handle, requests, replies_fd)

    def inherited_fds(self) -> list[int]:
        """In the template: forget every process and the channel socket, and return the descriptors
        they hold there (for the caller to close: generated code never reaches them)."""
        fds = []
        if self.channel is not None:  # generated code never reaches the socket the parent takes pipes from
            fds.append(self.channel.detach())
            self.channel = None
        self.handed, self.ended = {}, {}
        for process in [*self.live.values(), *(spare.process for spare in self.spares)]:
            fds += [process.requests, process.replies.fd]
        self.live, self.spares = {}, []
        return fds

    def pids(self) -> dict[str, int]:
        """The pid of each episode's process, kept or handed, by episode id."""
        return {episode: process.pid for episode, process in self.live.items()} | {
            episode: pid for episode, (pid, _) in self.handed.items()
        }


def _serve_requests(handle: Handler, requests: FrameReader, out_fd: int) -> None:
    """In a forked process: answer each request the worker sends, until it closes the pipe."""
    out = os.fdopen(out_fd, "wb")
    while True:
        try:
            frame, blobs = requests.read()
        except ProtocolClosed:
            return
        reply, reply_blobs = handle(as_request(frame), blobs)
        write_frame(out, reply, reply_blobs)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to the blocking descriptor `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _ending(status: int) -> str:
    """How a request's process that closed its pipe without a whole reply ended, from its wait status."""
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)} without an answer"
