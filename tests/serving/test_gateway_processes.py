"""`env serve --processes N`: gateway processes sharing one port, each session kept by the process that
opened it whatever connection its requests arrive on (serving/affinity.py, serving/supervisor.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import psutil
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from support.paths import GOLDEN
from support.patience import MOMENTS_S, PROCESS_S, wait_until
from test_gateway import serve_process
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.failures import UserFixable
from worldsmith.localserver import free_port
from worldsmith.serving.affinity import Member, owner_of
from worldsmith.serving.relay import OwnerGone, Relay
from worldsmith.serving.supervisor import MEMBER_OPTION, serve_member, supervise

pytestmark = pytest.mark.unit

PROTOCOL = "2025-11-25"
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _members(proc: subprocess.Popen) -> list[Member]:
    """The gateway processes of supervisor `proc`, as their command lines name them."""
    members = []
    for child in psutil.Process(proc.pid).children():
        command = child.cmdline()
        if MEMBER_OPTION in command:  # not yet, between its fork and its exec
            members.append(Member.parse(command[command.index(MEMBER_OPTION) + 1]))
    return sorted(members, key=lambda m: m.index)


def _http(url: str, uds: Path | None) -> httpx.Client:
    """A client with fresh connections to the shared port, or to one gateway process's Unix socket."""
    if uds is None:
        return httpx.Client(base_url=url, timeout=MOMENTS_S)
    return httpx.Client(base_url="http://gateway", transport=httpx.HTTPTransport(uds=str(uds)), timeout=MOMENTS_S)


def _get_order(url: str, session_id: str | bytes, order_id: int, uds: Path | None = None) -> httpx.Response:
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    call["params"] = {"name": "get_order", "arguments": {"order_id": order_id}}
    headers = {**HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": PROTOCOL}
    with _http(url, uds) as http:
        return http.post("/envs/retail_store/mcp", json=call, headers=headers)


def _http_1_0_get_order(uds: Path, session_id: str) -> bytes:
    """The answer to `get_order` sent as HTTP/1.0 (no Host header) to the gateway process at `uds`."""
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    call["params"] = {"name": "get_order", "arguments": {"order_id": 1}}
    body = json.dumps(call).encode()
    head = [f"{k}: {v}" for k, v in {**HEADERS, "mcp-session-id": session_id, "content-length": len(body)}.items()]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(MOMENTS_S)
        sock.connect(str(uds))
        sock.sendall("\r\n".join(["POST /envs/retail_store/mcp HTTP/1.0", *head, "", ""]).encode() + body)
        return b"".join(iter(lambda: sock.recv(65536), b""))  # HTTP/1.0: the answer ends with the connection


def _index(url: str, uds: Path | None = None) -> dict[str, Any]:
    with _http(url, uds) as http:
        return http.get("/envs").json()


def _process_at(url: str, uds: Path) -> int | None:
    """The index the gateway process at `uds` reports, or None while it does not answer yet."""
    try:
        return _index(url, uds)["process"]
    except httpx.TransportError:
        return None


def test_env_serve_refuses_fewer_than_one_process_in_one_line():
    result = CliRunner().invoke(app, ["env", "serve", str(GOLDEN), "--processes", "0"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "--processes 0" in lines[0], result.output


def test_a_session_id_names_its_owner_only_as_a_member_index_written():
    assert [owner_of(f"{index}-abc", 12) for index in ("0", "1", "11")] == [0, 1, 11]
    for forged in ("12-abc", "01-abc", "+1-abc", " 1-abc", "\u00b2-abc", "\u0661-abc", "9" * 5000 + "-abc", "1-", "1"):
        assert owner_of(forged, 12) is None, forged


@pytest.mark.sandbox
def test_a_member_crashing_at_start_is_one_line_after_its_traceback(capfd, tmp_path):
    """The supervisor's one line names the member's last line, its whole output (the traceback) shown before."""
    crash = [sys.executable, "-c", "1 / 0"]
    with pytest.raises(UserFixable) as crashed:
        supervise(crash, 1, run_dir=tmp_path, start_s=PROCESS_S)
    assert str(crashed.value) == "gateway process 0 of 1 could not start: ZeroDivisionError: division by zero"
    assert "Traceback (most recent call last)" in capfd.readouterr().err


@pytest.mark.sandbox
def test_a_member_killed_at_start_is_named_by_its_signal(tmp_path):
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    with pytest.raises(UserFixable, match="could not start: it exited \\(killed by SIGKILL\\)"):
        supervise(killed, 1, run_dir=tmp_path, start_s=PROCESS_S)


def test_a_member_whose_supervisor_is_gone_leaves_at_once(tmp_path):
    """A member whose parent is not the supervisor that started it (gone while the member was starting:
    the member was handed to another parent) stops instead of serving forever."""
    member = Member.parse(Member(0, 1, tmp_path, supervisor=os.getppid() + 10**6).argument())  # not our parent
    serve_member(Starlette(), member, "127.0.0.1", free_port(), log_level="warning")  # returns: it does not serve
    assert not member.socket_path().exists()  # it never opened its socket


def test_an_owner_leaving_mid_answer_is_an_owner_gone_with_nothing_sent(tmp_path):
    """The owner's answer head came, its body (of known length) did not, whole: OwnerGone (the 404 of a
    session gone with its process), nothing sent to the client yet."""

    async def owner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        writer.close()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def relayed() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        server = await asyncio.start_unix_server(owner, str(tmp_path / "owner.sock"))
        relay = Relay(tmp_path / "owner.sock")
        scope = {"type": "http", "method": "GET", "path": "/envs", "headers": [], "query_string": b""}
        try:
            with pytest.raises(OwnerGone):
                await relay(scope, receive, send)
        finally:
            await relay.close()
            server.close()
        return sent

    assert asyncio.run(relayed()) == []


@pytest.mark.sandbox
def test_gateway_processes_sharing_a_port_keep_each_session_with_its_own_episode():
    proc, url = serve_process(str(GOLDEN), "--processes", "2")
    try:
        wait_until(lambda: len(_members(proc)) == 2, "two gateway processes", within_s=PROCESS_S)
        members = _members(proc)
        sockets = [m.socket_path() for m in members]
        wait_until(lambda: [_process_at(url, p) for p in sockets] == [0, 1], "both to answer", within_s=PROCESS_S)
        assert all(_index(url, p)["processes"] == 2 for p in sockets)

        def crossing(session_id: str, order_id: int, address: str) -> None:
            """The session's order read back over fresh connections: on the shared port, at each process's
            own socket (the other process forwards it to the owner), and refused under a forged id."""
            owner, _, sdk_id = session_id.partition("-")
            for uds in [*sockets, None, None, None, None]:
                answered = _get_order(url, session_id, order_id, uds)
                assert answered.status_code == 200, answered.text
                assert answered.json()["result"]["structuredContent"]["shipping_address"] == address
                assert answered.headers["mcp-session-id"] == session_id
            digits = ("\u00b2-x".encode("latin-1"), "9" * 5000 + "-x")  # a digit int() refuses; a huge index
            for forged in (f"{1 - int(owner)}-{sdk_id}", f"2-{sdk_id}", sdk_id, f"{owner}-nope", *digits):
                refused = _get_order(url, forged, order_id)
                assert refused.status_code == 404 and refused.json()["error"]["message"] == "Session not found"

        async def session(number: int) -> tuple[str, str]:
            seen: list[str] = []

            async def session_id(response: httpx2.Response) -> None:
                if "mcp-session-id" in response.headers:
                    seen.append(response.headers["mcp-session-id"])

            address = f"{number} Process Lane"
            async with httpx2.AsyncClient(event_hooks={"response": [session_id]}) as http:
                async with streamable_http_client(f"{url}/envs/retail_store/mcp", http_client=http) as (read, write):
                    async with ClientSession(read, write) as mcp:
                        await mcp.initialize()
                        items = [{"sku": "KB-101", "quantity": 1}]
                        arguments = {"customer_id": 1, "items": items, "shipping_address": address}
                        created = await mcp.call_tool("create_order", arguments)
                        assert not created.is_error, created
                        order_id = created.structured_content["id"]
                        await anyio.to_thread.run_sync(crossing, seen[0], order_id, address)
                        read_back = await mcp.call_tool("get_order", {"order_id": order_id})
                        assert read_back.structured_content["shipping_address"] == address
            return seen[0], address

        async def sessions() -> list[tuple[str, str]]:
            opened: list[tuple[str, str]] = []
            async with anyio.create_task_group() as group:
                for number in range(3):

                    async def one(number: int = number) -> None:
                        opened.append(await session(number))

                    group.start_soon(one)
            return opened

        opened = anyio.run(sessions)
        assert len({session_id for session_id, _ in opened}) == 3
        assert sum(_index(url, p)["session_requests_forwarded"] for p in sockets) >= 3  # one per session at least
        wait_until(lambda: all(_index(url, p)["sessions"] == 0 for p in sockets), "the sessions to end (DELETE)")
        gone = _get_order(url, opened[0][0], 1, sockets[1 - int(opened[0][0].partition("-")[0])])
        assert gone.status_code == 404  # an ended session, asked at the process that does not own it

        # a session opened at process 0, its GET stream (SSE) opened at process 1: forwarded, and streaming
        opening = {"jsonrpc": "2.0", "id": 1, "method": "initialize"}
        opening["params"] = {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        with _http(url, sockets[0]) as http:
            session_id = http.post("/envs/retail_store/mcp", json=opening, headers=HEADERS).headers["mcp-session-id"]
        stream_headers = {"accept": "text/event-stream", "mcp-session-id": session_id, "mcp-protocol-version": PROTOCOL}
        with (
            _http(url, sockets[1]) as http,
            http.stream("GET", "/envs/retail_store/mcp", headers=stream_headers) as sse,
        ):
            assert sse.status_code == 200 and sse.headers["content-type"] == "text/event-stream"
            assert sse.headers["mcp-session-id"] == session_id and session_id.startswith("0-")
            assert _get_order(url, session_id, 1).status_code == 200  # the session answers meanwhile
        assert _http_1_0_get_order(sockets[1], session_id).startswith(b"HTTP/1.1 200")  # no Host: forwarded too
        with _http(url, sockets[1]) as http:
            ended = http.delete("/envs/retail_store/mcp", headers={**stream_headers, "mcp-protocol-version": PROTOCOL})
        assert ended.status_code == 200
        wait_until(lambda: _index(url, sockets[0])["sessions"] == 0, "the forwarded DELETE to end the session")

        tree = psutil.Process(proc.pid).children(recursive=True)  # gateway processes and their workers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PROCESS_S) != 0
        _, alive = psutil.wait_procs(tree, timeout=PROCESS_S)
        assert not alive, alive
        assert not members[0].run_dir.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=PROCESS_S)
