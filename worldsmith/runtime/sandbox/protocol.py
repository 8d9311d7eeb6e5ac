"""Framing between the parent and a sandbox worker. Stdlib only.

A frame is a 4-byte big-endian length, a JSON header of that length, then the raw bytes of
each blob whose length the header lists under "blobs".
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any, BinaryIO

_LEN = struct.Struct(">I")
MAX_HEADER = 64 * 1024 * 1024


class ProtocolClosed(EOFError):
    """The other side closed the pipe."""


class ProtocolTimeout(TimeoutError):
    """No complete frame arrived before the deadline."""


def encode(header: dict[str, Any], blobs: list[bytes] | tuple[bytes, ...] = ()) -> bytes:
    header = dict(header, blobs=[len(b) for b in blobs])
    data = json.dumps(header, separators=(",", ":"), default=str).encode()
    return b"".join([_LEN.pack(len(data)), data, *blobs])


def write_frame(stream: BinaryIO, header: dict[str, Any], blobs: list[bytes] | tuple[bytes, ...] = ()) -> None:
    stream.write(encode(header, blobs))
    stream.flush()


class FrameReader:
    """Reads frames from a file descriptor through a buffer (one read call per frame, usually)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = bytearray()

    def _fill(self, size: int, deadline: float | None) -> None:
        while len(self._buffer) < size:
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0 or not select.select([self.fd], [], [], wait)[0]:
                    raise ProtocolTimeout(f"no reply within the deadline ({size - len(self._buffer)} bytes missing)")
            chunk = os.read(self.fd, max(size - len(self._buffer), 1 << 16))
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
        if length > MAX_HEADER:
            raise ProtocolClosed(f"frame header of {length} bytes is too large")
        header = json.loads(self._take(length, deadline))
        blobs = [self._take(n, deadline) for n in header.pop("blobs", [])]
        return header, blobs
