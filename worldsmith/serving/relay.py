"""An ASGI request relayed over HTTP/1.1 to another gateway process's Unix socket, its answer streamed back.

What `Affinity` (serving/affinity.py) uses to hand a request to the process owning its session. Both ends
are gateway processes of this package (uvicorn), so HTTP/1.1 is spoken directly on asyncio streams: the
request head and its body (read whole: MCP messages are small, and bounded as the SDK bounds them), then
the answer's head and its body passed on as it comes (by Content-Length, chunks or until the connection
closes), so a GET's SSE stream goes through and ends when its client leaves. Connections are kept alive
and reused, one request at a time; a reused one found closed before any answer came is replaced, once, by a
new one.
An HTTP client library does the same for about 2 ms of CPU a request, twice a whole tool call
(docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from worldsmith.errors import WorldsmithError
from worldsmith.serving import hotpath

#: Headers of one hop (RFC 9110 7.6.1): not relayed either way.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"proxy-connection"}
)
#: Request headers this side already acted on, or sets itself.
_NOT_RELAYED = HOP_BY_HOP | {b"content-length", b"expect"}
#: Answer headers this side's server writes itself.
_NOT_RETURNED = HOP_BY_HOP | {b"date", b"server"}
_CHUNK = 65536
_KEPT = 64  # idle connections kept per owner


class OwnerGone(WorldsmithError):
    """The owner's socket cannot be reached (the process is gone, or was never there)."""


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Relay:
    """Requests relayed to the gateway process serving Unix socket `path`."""

    def __init__(self, path: Path):
        self.path = path
        self._idle: list[Stream] = []

    async def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the request as the owner does; OwnerGone (nothing sent) if it cannot be reached."""
        try:
            body = await hotpath.read_body(receive, DEFAULT_MAX_REQUEST_BODY_SIZE)
        except hotpath.BodyTooLarge:
            await Response("Request body too large", status_code=413)(scope, receive, send)
            return
        if body is None:  # the client left: nobody to answer
            return
        request = _request_head(scope, len(body)) + body
        for reuse in (True, False):  # a reused connection found closed: once more on a new one
            stream, reused = await self._connection(reuse)
            try:
                stream[1].write(request)
                head = await stream[0].readuntil(b"\r\n\r\n")
                break
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                stream[1].close()
                if not reused:
                    raise OwnerGone(str(self.path)) from None
            except BaseException:
                stream[1].close()
                raise
        try:
            keep = await self._answer(head, stream[0], scope, receive, send)
        except BaseException:
            stream[1].close()
            raise
        if keep and len(self._idle) < _KEPT:
            self._idle.append(stream)
        else:
            stream[1].close()

    async def _connection(self, reuse: bool) -> tuple[Stream, bool]:
        """A connection to the owner and whether it was reused (an idle one still open, when `reuse`)."""
        while reuse and self._idle:
            stream = self._idle.pop()
            if not stream[1].is_closing() and not stream[0].at_eof():
                return stream, True
            stream[1].close()
        try:
            return await asyncio.open_unix_connection(str(self.path), limit=_CHUNK), False
        except OSError:
            raise OwnerGone(str(self.path)) from None

    async def _answer(
        self, head: bytes, reader: asyncio.StreamReader, scope: Scope, receive: Receive, send: Send
    ) -> bool:
        """Send the answer whose head is `head` on; whether the connection can serve another request.
        OwnerGone (nothing sent) when the owner leaves before a body of known length is read whole."""
        status_line, *lines = head[:-4].split(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers = [(name.strip().lower(), value.strip()) for name, _, value in (line.partition(b":") for line in lines)]
        fields = dict(headers)
        keep = fields.get(b"connection", b"").lower() != b"close"
        start = {
            "type": "http.response.start",
            "status": status,
            "headers": [h for h in headers if h[0] not in _NOT_RETURNED],
        }
        if scope["method"] == "HEAD" or status in (204, 304) or 100 <= status < 200:
            await send(start)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return keep
        if b"content-length" in fields and b"chunked" not in fields.get(b"transfer-encoding", b""):
            try:
                body = await reader.readexactly(int(fields[b"content-length"]))
            except (OSError, asyncio.IncompleteReadError):
                raise OwnerGone(str(self.path)) from None
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return keep
        await send(start)
        chunked = b"chunked" in fields.get(b"transfer-encoding", b"")
        completed = False
        async with anyio.create_task_group() as group:  # a stream: it ends when either side does
            group.start_soon(_cancel_at_disconnect, receive, group.cancel_scope)
            try:
                async for piece in _chunks(reader) if chunked else _until_closed(reader):
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                completed = chunked
            except (OSError, asyncio.IncompleteReadError, ValueError):
                pass  # the owner went away mid-stream: the stream ends here
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            group.cancel_scope.cancel()
        return keep and completed


def _request_head(scope: Scope, length: int) -> bytes:
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    lines = [scope["method"].encode() + b" " + target + b" HTTP/1.1"]
    lines += [k + b": " + v for k, v in scope["headers"] if k not in _NOT_RELAYED]
    if not any(k == b"host" for k, _ in scope["headers"]):  # HTTP/1.0 asks none; HTTP/1.1 servers require one
        lines.append(b"host: gateway")
    if length or scope["method"] not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(b"content-length: " + str(length).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The chunks of a chunked body (its trailers read and dropped)."""
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        yield await reader.readexactly(size)
        await reader.readexactly(2)
    while await reader.readuntil(b"\r\n") != b"\r\n":
        pass


async def _until_closed(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while piece := await reader.read(_CHUNK):
        yield piece


async def _cancel_at_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel `scope` (a relayed stream) once the client is gone."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
