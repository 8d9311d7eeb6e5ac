"""`env serve --processes N`: gateway processes sharing one port, each session kept by the process that
opened it whatever connection its requests arrive on (serving/affinity.py, serving/supervisor.py)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import psutil
import pytest
from conftest import GOLDEN
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from test_gateway import eventually, serve_process
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.serving.affinity import Member
from worldsmith.serving.supervisor import MEMBER_OPTION

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
        return httpx.Client(base_url=url)
    return httpx.Client(base_url="http://gateway", transport=httpx.HTTPTransport(uds=str(uds)))


def _get_order(url: str, session_id: str, order_id: int, uds: Path | None = None) -> httpx.Response:
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    call["params"] = {"name": "get_order", "arguments": {"order_id": order_id}}
    headers = {**HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": PROTOCOL}
    with _http(url, uds) as http:
        return http.post("/envs/retail_store/mcp", json=call, headers=headers)


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


@pytest.mark.timeout(240)
def test_gateway_processes_share_a_port_and_each_session_stays_with_its_own_episode():
    proc, url = serve_process(str(GOLDEN), "--processes", "2")
    try:
        assert eventually(lambda: len(_members(proc)) == 2)
        members = _members(proc)
        sockets = [m.socket_path() for m in members]
        assert eventually(lambda: [_process_at(url, p) for p in sockets] == [0, 1])  # both started
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
            for forged in (f"{1 - int(owner)}-{sdk_id}", f"2-{sdk_id}", sdk_id, f"{owner}-nope"):
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
        assert eventually(lambda: all(_index(url, p)["sessions"] == 0 for p in sockets))  # ended (DELETE)
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
        with _http(url, sockets[1]) as http:
            ended = http.delete("/envs/retail_store/mcp", headers={**stream_headers, "mcp-protocol-version": PROTOCOL})
        assert ended.status_code == 200 and eventually(lambda: _index(url, sockets[0])["sessions"] == 0)

        tree = psutil.Process(proc.pid).children(recursive=True)  # gateway processes and their workers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, alive
        assert not members[0].run_dir.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
