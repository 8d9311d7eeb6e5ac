"""Framing between the parent, a sandbox worker and the processes it forks. Stdlib only.

A frame is a 4-byte big-endian length, a JSON header of that length, then the raw bytes of
each blob whose length the header lists under "blobs". A reader checks every declared size against
its limits before it reads (and reads in chunks, never allocating what was only declared), so a
forged or oversized frame is a `ProtocolViolation`, not a memory error. A header carries metadata:
a reply's is bounded tightly (`MAX_REPLY_HEADER`: decoding JSON makes objects many times its size),
and the bytes that can be large travel as blobs (a tool's value as its JSON text, a diff, a
verifier's evidence), each reply's blobs bounded by what its request can legitimately answer
(`reply_blob_limit`). A large blob is read straight into a buffer of its size, not copied after.

What a frame's header says is typed in `messages` (requests, replies). Replies of a request's process
(strict isolation) are read by whoever sent the request: the worker, or the parent on an episode's
direct channel (runtime/channel.py). Both hold them to one contract (`reply_problem`, through
`accepted_reply`) and word a failed request alike (`process_failure`).
"""

from __future__ import annotations

import io
import json
import math
import os
import select
import struct
import time
from collections.abc import Mapping
from typing import IO, cast, get_args

from worldsmith.errors import WorldsmithError
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.sandbox.messages import Reply, Status

_LEN = struct.Struct(">I")
#: Requests an episode's own process serves (strict isolation): they run its tools or read only its
#: data, which its tools can change anyway. Every other request for an episode (verification above
#: all: a verdict never meets memory the episode's tools ran in) gets a process of its own.
EPISODE_OPS = frozenset({"call", "snapshot", "diff"})
#: The largest header of a request (written by the runtime itself: an environment's code included).
MAX_HEADER = 64 * 1024 * 1024
#: The largest header of a reply: its status, a cut error or stdout (`MAX_ERROR_CHARS` characters, at
#: most 12 bytes each as JSON escapes them), a verdict, an app's routes. What a reply's code returns
#: comes as a blob; a header beyond this was not written by the runtime.
MAX_REPLY_HEADER = 1024 * 1024
#: The most bytes one frame's blobs may hold together, unless a reader is given another limit.
MAX_BLOBS = 4 * 1024 * 1024 * 1024
#: The largest value of a tool call, as JSON text: the one blob of its reply.
MAX_RESULT_BYTES = 4 * 1024 * 1024
#: A blob past this size is read straight into the bytes object that holds it.
_CHUNK = 1 << 20
#: The error text of a reply is cut (and marked) beyond this many characters.
MAX_ERROR_CHARS = 64 * 1024


class ProtocolClosed(WorldsmithError, EOFError):
    """The other side closed the pipe."""


class ProtocolTimeout(WorldsmithError, TimeoutError):
    """No complete frame arrived before the deadline."""


class ProtocolViolation(WorldsmithError, ValueError):
    """The other side sent a frame that breaks the framing or its size limits; the stream cannot be
    trusted any more (the sender is to be stopped)."""


def truncated(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters of its own, marked with how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[truncated {len(text) - limit} characters]"


def encode(header: Mapping[str, object], blobs: list[bytes] | tuple[bytes, ...] = ()) -> bytes:
    header = dict(header, blobs=[len(b) for b in blobs])
    data = json.dumps(header, separators=(",", ":"), default=str).encode()
    return b"".join([_LEN.pack(len(data)), data, *blobs])


def write_frame(stream: IO[bytes], header: Mapping[str, object], blobs: list[bytes] | tuple[bytes, ...] = ()) -> None:
    stream.write(encode(header, blobs))
    stream.flush()


def ready(fd: int, seconds: float, events: int = select.POLLIN) -> bool:
    """Whether `fd` is ready for `events` (or hung up) within `seconds`. `poll`, not `select`: any
    descriptor number works (a parent serving thousands of connections has pipes past 1024)."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(max(math.ceil(seconds * 1000), 0)))


class FrameReader:
    """Reads frames from a file descriptor through a buffer (one read call per frame, usually)."""

    def __init__(self, fd: int, *, max_header: int = MAX_HEADER, max_blobs: int = MAX_BLOBS):
        self.fd = fd
        self.max_header = max_header
        self.max_blobs = max_blobs
        self._buffer = bytearray()

    def pending(self) -> bool:
        """Whether bytes beyond the frames read so far are buffered."""
        return bool(self._buffer)

    def _fill(self, size: int, deadline: float | None) -> None:
        while len(self._buffer) < size:
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0 or not ready(self.fd, wait):
                    raise ProtocolTimeout(f"no reply within the deadline ({size - len(self._buffer)} bytes missing)")
            chunk = os.read(self.fd, min(max(size - len(self._buffer), 1 << 16), _CHUNK))
            if not chunk:
                raise ProtocolClosed("pipe closed")
            self._buffer += chunk

    def _take(self, size: int, deadline: float | None) -> bytes:
        if size > _CHUNK and size > len(self._buffer):
            return self._take_large(size, deadline)
        self._fill(size, deadline)
        with memoryview(self._buffer) as view:
            data = bytes(view[:size])
        del self._buffer[:size]
        return data

    def _take_large(self, size: int, deadline: float | None) -> bytes:
        """`size` bytes read straight into the bytes object that holds them (what is buffered first):
        one copy of a large blob in memory, not three. A `BytesIO` of that size lends its own buffer
        to `readinto` and then hands it over as its value (CPython copies nothing when the sizes match)."""
        held = io.BytesIO()
        held.seek(size - 1)
        held.write(b"\0")
        have = len(self._buffer)
        with held.getbuffer() as view:
            view[:have] = self._buffer
            self._buffer.clear()
            while have < size:
                if deadline is not None:
                    wait = deadline - time.monotonic()
                    if wait <= 0 or not ready(self.fd, wait):
                        raise ProtocolTimeout(f"no reply within the deadline ({size - have} bytes missing)")
                got = os.readv(self.fd, [view[have : have + _CHUNK]])
                if not got:
                    raise ProtocolClosed("pipe closed")
                have += got
        return held.getvalue()

    def read(
        self, deadline: float | None = None, *, max_blobs: int | None = None
    ) -> tuple[dict[str, object], list[bytes]]:
        """The next frame, waiting at most until `deadline` (monotonic seconds; None: forever): its
        header (a JSON object, not yet read as a message of `messages`) and its blobs, together at
        most `max_blobs` bytes (default: the reader's limit)."""
        (length,) = _LEN.unpack(self._take(_LEN.size, deadline))
        if length > self.max_header:
            raise ProtocolViolation(f"frame header of {length} bytes exceeds the limit of {self.max_header}")
        try:
            header = json.loads(self._take(length, deadline).decode())  # UTF-8 (ASCII, as written)
        except (ValueError, RecursionError) as exc:
            raise ProtocolViolation(f"frame header is not valid JSON: {type(exc).__name__}") from None
        sizes = header.pop("blobs", []) if isinstance(header, dict) else None
        if not isinstance(sizes, list) or not all(type(n) is int and n >= 0 for n in sizes):
            raise ProtocolViolation("frame header does not declare its blobs as a list of sizes")
        limit = self.max_blobs if max_blobs is None else min(max_blobs, self.max_blobs)
        if sum(sizes) > limit:
            raise ProtocolViolation(f"frame declares {sum(sizes)} bytes of blobs, over the limit of {limit}")
        blobs = [self._take(n, deadline) for n in sizes]
        return header, blobs


def reply_blob_limit(op: object, *, database_bytes: int | None = None) -> int | None:
    """The most bytes of blobs a reply to a request of `op` may declare (None: the reader's own limit):
    a call's one blob is its value's JSON text; a snapshot's is the episode's database, where the
    requester knows how large that can be (`database_bytes`: a file under the file size limit)."""
    if op == "call":
        return MAX_RESULT_BYTES
    return database_bytes if op == "snapshot" else None


def send_within(fd: int, data: bytes, deadline: float) -> str | None:
    """Write all of `data` to the non-blocking descriptor `fd` by `deadline` (monotonic seconds): None
    when written; "gone" if its reader is (EPIPE before any of it was taken), "broken" if the reader
    went away after taking part of it, "late" if the reader does not take it all in time. A request
    that fits the pipe takes one write and no wait."""
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view[: 1 << 16]) :]
                continue
            except BlockingIOError:
                pass
            wait = deadline - time.monotonic()
            if wait <= 0 or not ready(fd, wait, select.POLLOUT):
                return "late"
    except OSError:
        return "gone" if len(view) == len(data) else "broken"
    return None


#: The type of every field of a request process's reply that the parent reads (`messages.Reply`;
#: tests/runtime/test_protocol_messages.py holds the two together).
_REPLY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "status": str,
    "error": (str, type(None)),
    "limit": (str, type(None)),
    "refused_module": (str, type(None)),
    "stdout": str,
    "changed": bool,
    "verdict": str,
    "tools": list,
    "stand_in_reads": list,
    "retire": bool,
}
_STATUSES = frozenset(get_args(Status))
_VERDICTS = frozenset(verdict.value for verdict in Verdict)


#: Reply fields of the runtime's own (the requester's), not the process's: dropped once a reply is accepted.
RUNTIME_FIELDS = ("seconds", "id", "channel", "unserved", "pid")


def reply_problem(reply: Mapping[str, object], request_id: int | None) -> str | None:
    """What breaks the reply contract in a request process's reply to request `request_id` (None:
    nothing): a forged reply ends its own request and its process, never the worker or the parent."""
    for key, expected in _REPLY_FIELDS.items():
        if key in reply and not isinstance(reply[key], expected):
            return f"{key} is a {type(reply[key]).__name__}"
    if reply.get("status") not in _STATUSES:
        return "no valid status"
    if "verdict" in reply and reply["verdict"] not in _VERDICTS:
        return f"unknown verdict {truncated(str(reply['verdict']), 40)!r}"
    if reply.get("id") != request_id:  # a frame written by the code, not the runtime
        return f"an answer to request {truncated(str(reply.get('id')), 40)}, not {request_id}"
    return None


def accepted_reply(frame: dict[str, object], request_id: int | None) -> Reply:
    """A request process's reply to request `request_id` (a frame's header) as a `Reply`, less the
    runtime's fields; `ProtocolViolation` saying what breaks the reply contract (`reply_problem`)."""
    problem = reply_problem(frame, request_id)
    if problem is not None:
        raise ProtocolViolation(problem)
    for key in RUNTIME_FIELDS:
        frame.pop(key, None)
    return cast(Reply, frame)


def process_wait(timeout_s: object, grace_s: float, call_timeout_s: float) -> float:
    """How long a request's process may take: the parent's deadline for the request (`timeout_s`)
    less half the grace, so its requester answers before the parent gives up on it."""
    wait = float(timeout_s) - grace_s / 2 if isinstance(timeout_s, (int, float)) else call_timeout_s * 2
    return max(wait, 0.5)


def process_failure(limit: str, detail: str) -> str:
    """The error of a request whose process failed it: `timeout` (detail: how long it had), `crash`
    (detail: how it ended) or `protocol` (detail: what broke the reply contract)."""
    if limit == "timeout":
        return f"sandbox limit timeout: the request's process did not answer within {detail}; killed and replaced"
    if limit == "crash":
        return f"sandbox limit crash: the request's process {detail}"
    return f"sandbox limit protocol: the request's process sent an invalid reply ({detail}); killed and replaced"
