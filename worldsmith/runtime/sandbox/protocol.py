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


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise ProtocolTimeout(f"no reply within the deadline ({remaining} of {size} bytes missing)")
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise ProtocolClosed("pipe closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> tuple[dict[str, Any], list[bytes]]:
    """Read one frame from file descriptor `fd`, waiting at most until `deadline` (monotonic)."""
    (length,) = _LEN.unpack(_read_exact(fd, _LEN.size, deadline))
    if length > MAX_HEADER:
        raise ProtocolClosed(f"frame header of {length} bytes is too large")
    header = json.loads(_read_exact(fd, length, deadline))
    blobs = [_read_exact(fd, n, deadline) for n in header.pop("blobs", [])]
    return header, blobs
