"""What a tool result costs the gateway: frame headers bounded before anything is allocated, and a
result of a few MiB held about once (never decoded into objects many times its size), measured with
tracemalloc in the gateway's own process against the result's size."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import tracemalloc
from urllib.parse import urlsplit

import anyio
import httpx
import mcp_types as types
import pytest
from support.bundles import with_tools
from support.limits import FAST_LIMITS, PATIENT_LIMITS, isolated

from worldsmith.localserver import BackgroundServer
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.sandbox.protocol import (
    MAX_REPLY_HEADER,
    MAX_RESULT_BYTES,
    FrameReader,
    ProtocolViolation,
    encode,
    reply_blob_limit,
)
from worldsmith.serving import hotpath
from worldsmith.serving.gateway import Gateway

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
PROTOCOL = "2025-06-18"
#: A tool returning about 3.5 MiB of rows (`-> list`: structured content wraps it) and one returning
#: a string of quotes and backslashes (its text content escapes nearly every byte).
LARGE_TOOLS = """
def many_rows(conn) -> list:
    return [{"id": i, "name": "customer %d" % i, "email": "c%d@example.com" % i, "points": i * 7, "active": True}
            for i in range(36000)]

def escaped_text(conn) -> dict:
    return {"text": '"\\\\' * 1000000}
"""


def _pipe_holding(data: bytes) -> tuple[int, int, threading.Thread]:
    """A pipe whose reader sees `data`, written by a thread as the reader takes it (as a process writes)."""
    read, write = os.pipe()

    def feed() -> None:
        try:
            os.write(write, data)
        except OSError:
            pass  # the reader closed its end (it refused the frame)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    return read, write, writer


def _traced(run):
    """`run()` and the peak of memory traced while it ran, above what was traced before it."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        value = run()
        return value, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.unit
def test_a_reply_header_past_its_bound_is_refused_before_it_is_read():
    forged = struct.pack(">I", 24 * 2**20) + b"[" * (24 * 2**20)
    read, write, writer = _pipe_holding(forged)
    try:
        reader = FrameReader(read, max_header=MAX_REPLY_HEADER)
        with pytest.raises(ProtocolViolation, match="frame header of 25165824 bytes exceeds the limit of 1048576"):
            _, peak = _traced(lambda: reader.read(time.monotonic() + 5))
    finally:
        os.close(read)
        os.close(write)
        writer.join(5)


@pytest.mark.unit
def test_a_call_reply_declaring_more_than_a_result_can_hold_is_refused_before_it_is_read():
    frame = encode({"status": "ok", "id": 1}, [b"x" * (MAX_RESULT_BYTES + 1)])
    read, write, writer = _pipe_holding(frame)
    try:
        with pytest.raises(ProtocolViolation, match="over the limit of 4194304"):
            FrameReader(read).read(time.monotonic() + 5, max_blobs=reply_blob_limit("call"))
    finally:
        os.close(read)
        os.close(write)
        writer.join(5)


@pytest.mark.unit
def test_a_large_blob_is_read_into_one_bytes_object_of_its_size():
    blob = os.urandom(3 * 2**20)
    read, write, writer = _pipe_holding(encode({"status": "ok"}, [b"small", blob]))
    try:
        (header, blobs), peak = _traced(lambda: FrameReader(read).read(time.monotonic() + 30))
    finally:
        os.close(read)
        os.close(write)
        writer.join(5)
    assert header == {"status": "ok"} and blobs == [b"small", blob] and type(blobs[1]) is bytes
    assert peak < 1.2 * len(blob)


def _sdk_answer(text: bytes, wrapped: bool) -> dict:
    value = json.loads(text)
    result = types.CallToolResult(
        content=[types.TextContent(text=json.dumps(value))], structured_content={"result": value} if wrapped else value
    )
    return {"jsonrpc": "2.0", "id": "r-1", "result": result.model_dump(by_alias=True, mode="json", exclude_none=True)}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "wrapped"),
    [({"a": 'q"\\\n\t\r', "b": [1, 2.5, None]}, False), ([1, "two"], True), ({"rows": ["x\\y" * 40_000]}, True)],
    ids=["object", "wrapped_list", "many_pieces"],
)
def test_a_result_written_around_its_json_text_is_the_sdk_s_answer(value, wrapped):
    text = json.dumps(value).encode()
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    anyio.run(hotpath.send_text_result, send, "s1", "r-1", text, wrapped)
    body = b"".join(m["body"] for m in sent[1:])
    assert sent[0]["status"] == 200 and dict(sent[0]["headers"])[b"content-length"] == str(len(body)).encode()
    assert json.loads(body) == _sdk_answer(text, wrapped)
    assert all(len(m["body"]) <= 2 * 64 * 1024 + 200 for m in sent[1:])  # written in pieces
    assert not sent[-1].get("more_body", False) and all(m.get("more_body") for m in sent[1:-1])


def _initialize(url: str) -> dict[str, str]:
    """A session of the gateway at `url` (its MCP endpoint): the headers its requests carry."""
    init = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bounds", "version": "1"}}
    opened = httpx.post(url, headers=HEADERS, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
    assert opened.status_code == 200, opened.text
    headers = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": PROTOCOL}
    httpx.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return headers


def _call(url: str, headers: dict[str, str], tool: str, arguments: dict | None = None) -> dict:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments or {}}}
    answer = httpx.post(url, headers=headers, json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:500]
    return answer.json()["result"]


def _drained_call(url: str, headers: dict[str, str], tool: str) -> int:
    """The length of the answer to a call of `tool`, read off a socket into one small buffer: the
    client allocates next to nothing, so what tracemalloc sees is the gateway's."""
    parts = urlsplit(url)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": {}}})
    head = [f"POST {parts.path} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    buffer = bytearray(1 << 16)
    with socket.create_connection((parts.hostname, parts.port), timeout=120) as sock:
        sock.sendall(("\r\n".join([*head, "", ""]) + body).encode())
        got = sock.recv_into(buffer)
        end = bytes(buffer[:got]).index(b"\r\n\r\n") + 4
        status = bytes(buffer[:end]).split(b" ", 2)[1]
        length = int(bytes(buffer[:end]).lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        left = length - (got - end)
        while left > 0:
            got = sock.recv_into(buffer)
            assert got, "the gateway closed the connection mid-answer"
            left -= got
    assert status == b"200"
    return length


@pytest.mark.sandbox
@pytest.mark.parametrize("tool", ["many_rows", "escaped_text"])
def test_a_result_of_megabytes_costs_the_gateway_at_most_twice_its_size(golden, tool):
    world = with_tools(golden, LARGE_TOOLS, ["many_rows", "escaped_text"])
    with Runtime(limits=PATIENT_LIMITS, workers=1) as rt, BackgroundServer(Gateway(rt, [world]).app()) as server:
        url = f"{server.url}/envs/{world.env_id}/mcp"
        headers = _initialize(url)
        result = _call(url, headers, tool)  # the answer as a client reads it (untraced), and the world warm
        size = len(result["content"][0]["text"])
        assert not result["isError"] and 3 * 2**20 < size <= MAX_RESULT_BYTES
        assert json.loads(result["content"][0]["text"]) == (
            result["structuredContent"]["result"] if tool == "many_rows" else result["structuredContent"]
        )
        length, peak = _traced(lambda: _drained_call(url, headers, tool))
    assert length > 2 * size  # the value twice: as text content (escaped) and as structured content
    assert peak <= 2 * size, f"{peak / size:.2f}x the result's size"


@pytest.mark.sandbox
def test_a_forged_reply_header_of_24_mib_is_an_env_error_before_the_gateway_allocates_it(golden):
    """A reply header is metadata: one declaring 24 MiB (it held a whole result, or nothing a runtime
    wrote) is refused on its length, the call answered as an environment error, and the session goes on."""
    limits = isolated(FAST_LIMITS, "fast")  # the reply comes over the worker's own pipe
    with Runtime(limits=limits, workers=1) as rt, BackgroundServer(Gateway(rt, [golden]).app()) as server:
        url = f"{server.url}/envs/{golden.env_id}/mcp"
        headers = _initialize(url)
        assert not _call(url, headers, "get_customer", {"customer_id": 1})[
            "isError"
        ]  # the episode is open on its worker
        worker = rt.pool.workers()[0]
        forged = struct.pack(">I", 24 * 2**20) + b'{"status": "ok", "value": [' + b"[]," * (8 * 2**20)
        read, write, writer = _pipe_holding(forged)
        worker._reader = FrameReader(read, max_header=MAX_REPLY_HEADER, max_blobs=limits.memory_mb * 2**20)
        try:
            result, peak = _traced(lambda: _call(url, headers, "get_customer", {"customer_id": 1}))
        finally:
            os.close(read)
            os.close(write)
            writer.join(5)
        text = result["content"][0]["text"]
        assert result["isError"] and text.startswith("environment error: "), text
        assert "frame header of 25165824 bytes exceeds the limit" in text
        assert peak < 2 * 2**20, f"{peak / 2**20:.1f} MiB traced"
        after = _call(
            url, headers, "get_customer", {"customer_id": 1}
        )  # on a fresh worker, the episode's state replayed
        assert not after["isError"] and not worker.alive
