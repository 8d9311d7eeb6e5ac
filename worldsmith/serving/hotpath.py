"""The gateway's hot path: a `tools/call` request in an established session, recognised on the wire.

The MCP SDK serves each request through a memory stream, a dispatcher task, its middleware and a
response stream (about 1 ms of CPU a call in JSON-response mode, 2-4 ms with SSE answers:
docs/benchmarks.md); an agent's session is almost only `tools/call`. The gateway answers those
itself (serving/gateway.py) when the request is exactly what the SDK would have accepted: a POST
whose headers the SDK's transport accepts in JSON-response mode (content type, Accept, a
handshake-era protocol version or none), and a body holding one JSON-RPC request `tools/call` with a
tool name and an argument object. Anything else, or anything odd, goes to the SDK unchanged (the body
read here replayed to it), which answers it as it always does.
"""

from __future__ import annotations

import json

from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, check_accept_headers
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from worldsmith.bundle.jsonvalues import TooDeep, check_nesting
from worldsmith.errors import WorldsmithError
from worldsmith.jsonvalue import JsonObject

#: The header naming a session (bytes, as ASGI carries headers).
SESSION_HEADER = MCP_SESSION_ID_HEADER.encode()
_PROTOCOL_HEADER = b"mcp-protocol-version"
_CONTENT_TYPE = b"content-type"
_CONTENT_LENGTH = b"content-length"


def header(scope: Scope, name: bytes) -> str | None:
    """The value of request header `name` (lower-case bytes), or None."""
    for key, value in scope["headers"]:
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None


def answerable_headers(scope: Scope) -> bool:
    """Whether the SDK's transport would accept this POST's headers in JSON-response mode."""
    version = header(scope, _PROTOCOL_HEADER)
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return False
    content_type = header(scope, _CONTENT_TYPE)
    if content_type is None or not content_type.lower().startswith("application/json"):
        return False
    length = header(scope, _CONTENT_LENGTH)
    if length is None or not length.isdigit() or int(length) > DEFAULT_MAX_REQUEST_BODY_SIZE:
        return False
    has_json, _ = check_accept_headers(Request(scope))
    return has_json


class BodyTooLarge(WorldsmithError):
    """A request body past the size `read_body` was given."""


async def read_body(receive: Receive, limit: int | None = None) -> bytes | None:
    """The whole request body, or None when the client left before sending it all (`http.disconnect`);
    BodyTooLarge once it passes `limit` bytes (unset: no bound; the caller checked the Content-Length)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` with the body already read handed out first (for the SDK, when the hot path declines)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def tool_call(body: bytes) -> tuple[int | str, str, JsonObject] | None:
    """(id, tool name, arguments) of a body holding exactly one JSON-RPC `tools/call` request, or None."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or message.get("method") != "tools/call":
        return None
    request_id, params = message.get("id"), message.get("params")
    if isinstance(request_id, bool) or not isinstance(request_id, int | str) or not isinstance(params, dict):
        return None
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
        return None
    try:
        check_nesting(arguments)
    except TooDeep:
        return None  # answered on the SDK's path, as any odd request is
    return request_id, name, arguments or {}


async def send_result(send: Send, session_id: str, request_id: int | str, result: JsonObject) -> None:
    """The JSON-RPC response carrying `result`, as the SDK's transport writes it in JSON-response mode."""
    await _send(send, session_id, {"jsonrpc": "2.0", "id": request_id, "result": result})


async def send_error(send: Send, session_id: str, request_id: int | str, code: int, message: str) -> None:
    """The JSON-RPC error response `code` saying `message`, as the SDK's transport writes an MCPError."""
    await _send(send, session_id, {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})


async def _send(send: Send, session_id: str, response: JsonObject) -> None:
    body = json.dumps(response, separators=(",", ":")).encode()
    await _start(send, session_id, len(body))
    await send({"type": "http.response.body", "body": body})


#: A JSON text's bytes that a JSON string must escape, and their escapes (the text is checked ASCII:
#: no other control character is in it, serving/jsontext.py).
_ESCAPES = ((b"\\", b"\\\\"), (b'"', b'\\"'), (b"\n", b"\\n"), (b"\r", b"\\r"), (b"\t", b"\\t"))
#: The most bytes of a value written at once.
_PIECE = 64 * 1024


def _escaped(text: bytes) -> bytes:
    for raw, escape in _ESCAPES:
        text = text.replace(raw, escape)
    return text


async def send_text_result(send: Send, session_id: str, request_id: int | str, text: bytes, wrapped: bool) -> None:
    """The JSON-RPC response carrying a successful tool result whose value has the checked JSON text
    `text` (serving/mcp_results.py `JsonAnswer`): the text as a JSON string in its text content, the
    value itself (in `{"result": ...}` when `wrapped`) as its structured content; as the SDK writes a
    `CallToolResult`, up to whitespace inside the value. Written in pieces of at most `_PIECE` bytes
    of the value: the value is held once, not copied whole."""
    head = (
        b'{"jsonrpc":"2.0","id":' + json.dumps(request_id).encode() + b',"result":{"content":[{"type":"text","text":"'
    )
    middle = b'"}],"structuredContent":' + (b'{"result":' if wrapped else b"")
    tail = (b"}" if wrapped else b"") + b',"isError":false,"resultType":"complete"}}'
    escaped = len(text) + sum(text.count(raw) for raw, _ in _ESCAPES)
    length = len(head) + escaped + len(middle) + len(text) + len(tail)
    await _start(send, session_id, length)
    if length <= _PIECE:
        await send({"type": "http.response.body", "body": b"".join([head, _escaped(text), middle, text, tail])})
        return
    pieces = range(0, len(text), _PIECE)
    await send({"type": "http.response.body", "body": head, "more_body": True})
    for at in pieces:
        await send({"type": "http.response.body", "body": _escaped(text[at : at + _PIECE]), "more_body": True})
    await send({"type": "http.response.body", "body": middle, "more_body": True})
    for at in pieces:
        await send({"type": "http.response.body", "body": text[at : at + _PIECE], "more_body": True})
    await send({"type": "http.response.body", "body": tail})


async def _start(send: Send, session_id: str, length: int) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(length).encode()),
        (SESSION_HEADER, session_id.encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
