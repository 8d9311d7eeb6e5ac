"""A slow or busy world cannot hold up another world's requests at the gateway (issue 32, point 4).

Before: 60 sessions whose first calls hit a 4.5 s tool held every thread the gateway shared between its
worlds, and another world's `initialize` waited 94 s. Each world now has lanes of its own
(serving/lanes.py), and a worker hands each episode's process to the parent before it serves its first
call (runtime/sandbox/processes.py), so first calls no longer queue on the worker. What is checked is
order, not time: another world's `initialize`, `tools/list` and call, and the slow world's own next
`initialize`, are answered while every call of the slow world is still held; and a world past its own
limits is refused at once, with an MCP error naming the limit, while its held calls are still held.
"""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from support.bundles import with_tools
from support.limits import PATIENT_LIMITS

from worldsmith.bundle.contract import Bundle
from worldsmith.localserver import BackgroundServer
from worldsmith.runtime.episode import Runtime
from worldsmith.serving.gateway import Gateway

pytestmark = pytest.mark.sandbox

#: A tool that holds its call (until its runtime is closed under it: the test's end).
NAP = "import time\n\n\ndef nap(conn):\n    time.sleep(600)\n    return 'rested'\n"
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
#: The default anyio thread pool the gateway shared between worlds had 40 threads.
SLOW_SESSIONS = 48


def _slow_world(golden: Bundle) -> Bundle:
    slow = with_tools(golden, NAP, ["nap"])
    return dataclasses.replace(slow, manifest=slow.manifest.model_copy(update={"env_id": "slow_world"}), root=None)


async def _open(http: httpx.AsyncClient, url: str) -> str:
    """A new session of the world at `url` (initialize, initialized): its id."""
    opening = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    response = await http.post(url, json=opening, headers=HEADERS)
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await http.post(url, json=initialized, headers={**HEADERS, "mcp-session-id": session})
    return session


async def _call(http: httpx.AsyncClient, url: str, session: str, tool: str) -> dict:
    """The JSON-RPC answer to a call of `tool` in `session`."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": {}}}
    response = await http.post(url, json=call, headers={**HEADERS, "mcp-session-id": session})
    return response.json()


def _held(gateway: Gateway, env_id: str) -> int:
    """Requests of `env_id`'s sessions the gateway has taken and not answered."""
    return sum(live.in_flight for live in list(gateway._live.values()) if live.world.env_id == env_id)


async def _until(condition, tasks: list[asyncio.Task]) -> None:
    """Wait until `condition()` holds (polled), failing if any of `tasks` ends first."""
    while not condition():
        assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()][:1]
        await asyncio.sleep(0.02)


def _serving(golden: Bundle, **limits: object) -> tuple[Runtime, Gateway]:
    runtime = Runtime(limits=PATIENT_LIMITS, workers=1)
    return runtime, Gateway(runtime, [golden, _slow_world(golden)], **limits)


def _release(runtime: Runtime) -> None:
    """End the held calls: the workers killed and no new ones started (each held call answers an error)."""
    runtime.pool.close()


def test_a_slow_world_does_not_hold_up_another_worlds_initialize_listing_or_calls(golden):
    runtime, gateway = _serving(golden)
    with runtime, BackgroundServer(gateway.app()) as server:
        try:
            slow_url = f"{server.url}/envs/slow_world/mcp"

            async def other_world() -> tuple[str, int, bool]:
                async with streamable_http_client(f"{server.url}/envs/{golden.env_id}/mcp") as (read, write):
                    async with ClientSession(read, write) as session:
                        init = await session.initialize()
                        tools = (await session.list_tools()).tools
                        found = await session.call_tool("get_customer", {"customer_id": 1})
                        return init.server_info.name, len(tools), found.is_error

            async def scenario():
                async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None)) as http:
                    sessions = [await _open(http, slow_url) for _ in range(SLOW_SESSIONS)]
                    slow = [asyncio.create_task(_call(http, slow_url, s, "nap")) for s in sessions]
                    await _until(lambda: _held(gateway, "slow_world") == SLOW_SESSIONS, slow)
                    other = asyncio.create_task(other_world())
                    done, _ = await asyncio.wait([other, *slow], return_when=asyncio.FIRST_COMPLETED)
                    answered = other.result() if other in done else None
                    # the slow world's own `initialize` waits for none of its calls either
                    own = asyncio.create_task(_open(http, slow_url))
                    done, _ = await asyncio.wait([own, *slow], return_when=asyncio.FIRST_COMPLETED)
                    opened = own in done and bool(own.result())
                    held = sum(not t.done() for t in slow)
                    for task in slow:
                        task.cancel()
                    return answered, opened, held

            answered, opened, held = asyncio.run(scenario())
            assert answered == (f"worldsmith/{golden.env_id}", 16, False)
            assert opened
            assert held == SLOW_SESSIONS  # every slow call was still held when both were answered
        finally:
            _release(runtime)


def test_a_world_past_its_own_limits_is_refused_at_once_naming_them(golden):
    from worldsmith.serving.lanes import WORLD_BUSY, ServingLimits

    limits = ServingLimits(world_calls=2, world_waiting=3, world_control=2)
    runtime, gateway = _serving(golden, limits=limits)
    with runtime, BackgroundServer(gateway.app()) as server:
        try:
            slow_url = f"{server.url}/envs/slow_world/mcp"

            async def scenario():
                async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None)) as http:
                    sessions = [await _open(http, slow_url) for _ in range(6)]
                    held = [asyncio.create_task(_call(http, slow_url, s, "nap")) for s in sessions[:5]]
                    await _until(lambda: gateway.loaded["slow_world"].lanes.calls_in_flight == 5, held)
                    refused = await _call(http, slow_url, sessions[5], "nap")
                    still = sum(not t.done() for t in held)
                    for task in held:
                        task.cancel()
                    return refused, still

            refused, still = asyncio.run(scenario())
            assert still == 5
            error = refused["error"]
            assert error["code"] == WORLD_BUSY and "gateway limit world_calls" in error["message"]
            assert "2 tool calls running and 3 waiting" in error["message"]
            assert "WORLDSMITH_GATEWAY_WORLD_CALLS" in error["message"] and "\n" not in error["message"]
        finally:
            _release(runtime)
