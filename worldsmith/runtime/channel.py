"""An episode's direct channel (strict isolation): the parent's own pipes to the episode's process.

A worker serves one request at a time. Under strict isolation it forks each episode's process at the
episode's first call and, when the parent asks (`direct`), hands the parent that process's pipes before
the process serves anything (SCM_RIGHTS over a socket pair made when the worker starts,
runtime/worker_handle.py): the episode's calls, snapshots and diffs (`EPISODE_OPS`), that first one
included, go to the process directly, the worker waiting for none of them, without the worker's read,
re-encode and relay, and episodes of one worker run their calls side by side. The parent holds those
replies to the same contract as the worker does (`protocol.accepted_reply`, the request's id, the frame
size limits, the same deadline). A process that times out, dies, breaks the contract or reports that
its code broke a limit loses its channel, and its worker stops and reaps it (`reap`); a process
that is gone before a request reached it costs nothing (the request goes through the worker, which
forks a fresh one). Every other request of the episode (verification, restore, close) goes through
the worker after the channel is given up: one process at a time has the episode's database open.
"""

from __future__ import annotations

import os
import threading
import time

from worldsmith.errors import WorldsmithError
from worldsmith.runtime.sandbox.messages import EpisodeRequest, Reply
from worldsmith.runtime.sandbox.protocol import (
    MAX_ERROR_CHARS,
    MAX_REPLY_HEADER,
    FrameReader,
    ProtocolClosed,
    ProtocolTimeout,
    ProtocolViolation,
    accepted_reply,
    encode,
    reply_blob_limit,
    send_within,
    truncated,
)


class ChannelBroken(WorldsmithError):
    """A request on a direct channel that got no acceptable reply. `limit`: timeout, crash or protocol
    (`detail` says what broke); `delivered` False when the request never reached the process."""

    def __init__(self, limit: str, detail: str = "", *, delivered: bool = True):
        super().__init__(detail)
        self.limit, self.detail, self.delivered = limit, detail, delivered


class EpisodeChannel:
    """The pipes to one episode's process (received close-on-exec): requests written within the
    deadline, replies read and checked (`max_blobs`: the most bytes a reply's blobs may hold;
    `database_bytes`: the most a snapshot's may). `lock` is held for each request (and by whoever
    gives the channel up)."""

    def __init__(self, replies_fd: int, requests_fd: int, *, max_blobs: int, database_bytes: int):
        self.reader = FrameReader(replies_fd, max_header=MAX_REPLY_HEADER, max_blobs=max_blobs)
        self.database_bytes = database_bytes
        self.requests = requests_fd
        os.set_blocking(requests_fd, False)  # a process that stops reading cannot block the parent
        self.lock = threading.Lock()
        self.closed = False
        self.pid: int | None = None  # the process's, as its worker said when it handed the pipes over

    def request(
        self, request: EpisodeRequest, blobs: list[bytes] | tuple[bytes, ...], wait: float, *, number: int
    ) -> tuple[Reply, list[bytes]]:
        """The process's checked reply to request `number` (unique in its worker: a frame the code wrote
        for an earlier or another request does not pass), within `wait` seconds; ChannelBroken otherwise."""
        deadline = time.monotonic() + wait
        unsent = send_within(self.requests, encode({**request, "id": number}, blobs), deadline)
        if unsent == "gone":
            raise ChannelBroken("crash", "gone before the request", delivered=False)
        if unsent == "late":  # it stopped reading its requests
            raise ChannelBroken("timeout", f"{wait:g} s")
        if unsent == "broken":  # it died while reading the request
            raise ChannelBroken("crash")
        try:
            limit = reply_blob_limit(request.get("op"), database_bytes=self.database_bytes)
            frame, reply_blobs = self.reader.read(deadline, max_blobs=limit)
            reply = accepted_reply(frame, number)
        except ProtocolTimeout:
            raise ChannelBroken("timeout", f"{wait:g} s") from None
        except ProtocolClosed:
            raise ChannelBroken("crash") from None
        except ProtocolViolation as exc:
            raise ChannelBroken("protocol", str(exc)) from None
        error = reply.get("error")
        if isinstance(error, str):  # as the worker cut a relayed reply's
            reply["error"] = truncated(error, MAX_ERROR_CHARS + 64)
        return reply, reply_blobs

    def __del__(self) -> None:  # a channel forgotten while in use (its worker killed meanwhile)
        self.close()

    def close(self) -> None:
        """Give the pipes up (idempotent): an idle process reads the end of its requests and exits."""
        if self.closed:
            return
        self.closed = True
        for fd in (self.requests, self.reader.fd):
            try:
                os.close(fd)
            except OSError:
                pass
