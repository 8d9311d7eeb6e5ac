"""Framing between the parent and a sandbox worker. Stdlib only.

A frame is a 4-byte big-endian length, a JSON header of that length, then the raw bytes of
each blob whose length the header lists under "blobs". A reader checks every declared size against
its limits before it reads (and reads in chunks, never allocating what was only declared), so a
forged or oversized frame is a `ProtocolViolation`, not a memory error.
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time
from typing import Any, BinaryIO

_LEN = struct.Struct(">I")
MAX_HEADER = 64 * 1024 * 1024
#: The most bytes one frame's blobs may hold together, unless a reader is given another limit.
MAX_BLOBS = 4 * 1024 * 1024 * 1024
_CHUNK = 1 << 20


class ProtocolClosed(EOFError):
    """The other side closed the pipe."""


class ProtocolTimeout(TimeoutError):
    """No complete frame arrived before the deadline."""


class ProtocolViolation(ValueError):
    """The other side sent a frame that breaks the framing or its size limits; the stream cannot be
    trusted any more (the sender is to be stopped)."""


def truncated(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters of its own, marked with how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[truncated {len(text) - limit} characters]"


def encode(header: dict[str, Any], blobs: list[bytes] | tuple[bytes, ...] = ()) -> bytes:
    header = dict(header, blobs=[len(b) for b in blobs])
    data = json.dumps(header, separators=(",", ":"), default=str).encode()
    return b"".join([_LEN.pack(len(data)), data, *blobs])


def write_frame(stream: BinaryIO, header: dict[str, Any], blobs: list[bytes] | tuple[bytes, ...] = ()) -> None:
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
        self._fill(size, deadline)
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def read(self, deadline: float | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """The next frame, waiting at most until `deadline` (monotonic seconds; None: forever)."""
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
        if sum(sizes) > self.max_blobs:
            raise ProtocolViolation(f"frame declares {sum(sizes)} bytes of blobs, over the limit of {self.max_blobs}")
        blobs = [self._take(n, deadline) for n in sizes]
        return header, blobs
