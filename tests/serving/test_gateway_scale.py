"""The gateway at scale: many worlds named up front and loaded at first use, idle ones unloaded past a
bound, routing by env_id, sessions kept alive by their calls (`env serve` of bundles and a set: test_gateway.py)."""

from __future__ import annotations

import time
from collections import OrderedDict

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from support.limits import PATIENT_LIMITS
from support.patience import MOMENTS_S, wait_until
from test_gateway import renamed

from worldsmith.bundle.contract import Bundle
from worldsmith.localserver import BackgroundServer
from worldsmith.runtime.episode import Runtime
from worldsmith.serving import mcp_tools
from worldsmith.serving.gateway import Gateway
from worldsmith.serving.worlds import WorldSource

pytestmark = pytest.mark.sandbox


async def _session(url: str, env_id: str, calls=None):
    """One session on `env_id`: initialize, `calls(session)` (default: one get_customer), ended by DELETE."""
    async with streamable_http_client(f"{url}/envs/{env_id}/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            if calls is not None:
                return await calls(session)
            result = await session.call_tool("get_customer", {"customer_id": 1})
            assert not result.is_error, result
            return init.server_info.name


def test_the_gateway_keeps_at_most_its_bound_of_worlds_loaded_from_first_use(golden, runtime):
    loads: dict[str, int] = {}

    def source(env_id: str) -> WorldSource:
        def load() -> Bundle:
            loads[env_id] = loads.get(env_id, 0) + 1
            return renamed(golden, env_id)

        return WorldSource(env_id, f"copy {env_id}", load)

    def broken() -> Bundle:
        raise OSError("the store cannot be reached")

    names = [f"world_{i:03d}" for i in range(200)]
    worlds = [source(name) for name in names] + [WorldSource("unreachable", "a ref", broken)]
    gateway = Gateway(runtime, worlds, max_loaded=2)
    assert not loads  # naming 201 worlds loads none
    with BackgroundServer(gateway.app()) as server:
        index = httpx.get(f"{server.url}/envs", timeout=MOMENTS_S).json()
        assert len(index["envs"]) == 201 and index["loaded"] == [] and index["max_loaded"] == 2

        assert anyio.run(_session, server.url, names[-1]) == f"worldsmith/{names[-1]}"  # routed by env_id
        assert loads == {names[-1]: 1} and httpx.get(f"{server.url}/envs", timeout=MOMENTS_S).json()["loaded"] == [
            names[-1]
        ]

        async def held_while_others_load():
            """A session on names[0] stays open while two other worlds load and serve sessions."""

            async def calls(session):
                for name in names[1:3]:
                    await _session(server.url, name)
                    assert names[0] in gateway.loaded  # the least recently used, but busy: kept
                    assert len(gateway.loaded) <= 3  # the bound, plus the busy world
                return await session.call_tool("get_customer", {"customer_id": 1})

            return await _session(server.url, names[0], calls)

        assert not anyio.run(held_while_others_load).is_error
        wait_until(lambda: len(gateway.loaded) <= 2, "names[0], idle again, to unload")  # back under the bound
        assert names[-1] not in gateway.loaded  # unloaded: idle and least recently used
        anyio.run(_session, server.url, names[-1])
        assert loads[names[-1]] == 2  # loaded again when next used

        tasks = httpx.get(f"{server.url}/envs/{names[5]}/tasks", timeout=MOMENTS_S)  # a listing loads its world too
        assert (
            tasks.status_code == 200
            and loads[names[5]] == 1
            and [t["id"] for t in tasks.json()] == [t.id for t in golden.tasks]
        )
        missing = httpx.get(f"{server.url}/envs/no_such_world/tasks", timeout=MOMENTS_S)
        assert missing.status_code == 404 and "no environment 'no_such_world'" in missing.text
        refused = httpx.post(
            f"{server.url}/envs/unreachable/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            headers={"accept": "application/json, text/event-stream"},
            timeout=MOMENTS_S,
        )
        assert refused.status_code == 503 and "the store cannot be reached" in refused.json()["error"]["message"]
        assert anyio.run(_session, server.url, names[5])  # the server goes on; names[5] was loaded once
        assert loads[names[5]] == 1
    assert runtime.open_episodes == 0


def test_calls_keep_a_session_alive_until_it_is_left_idle(golden):
    idle_s = 1.0  # the limit under test
    with Runtime(limits=PATIENT_LIMITS, workers=1) as runtime:
        gateway = Gateway(runtime, [golden], session_idle_s=idle_s)
        with BackgroundServer(gateway.app()) as server:

            async def calling_past_the_idle_limit(session):
                start = time.monotonic()
                while time.monotonic() - start < 2 * idle_s:  # calls for two idle periods, a tenth of one apart
                    result = await session.call_tool("get_customer", {"customer_id": 1})
                    assert not result.is_error, result
                    await anyio.sleep(idle_s / 10)
                return len(gateway.sessions)

            async def run():
                async with streamable_http_client(f"{server.url}/envs/retail_store/mcp", terminate_on_close=False) as (
                    read,
                    write,
                ):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        return await calling_past_the_idle_limit(session)

            assert anyio.run(run) == 1  # still open after two idle periods of calls
            wait_until(lambda: not gateway.sessions, "the session left idle to expire")
            assert runtime.open_episodes == 0


def test_a_session_is_known_only_at_its_own_world(golden, runtime):
    # a bound of 1: world_b loads and serves while world_a, busy with a session, holds the only place
    gateway = Gateway(runtime, [renamed(golden, "world_a"), renamed(golden, "world_b")], max_loaded=1)
    with BackgroundServer(gateway.app()) as server:
        opening = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        opened = httpx.post(f"{server.url}/envs/world_a/mcp", json=opening, headers=headers, timeout=MOMENTS_S)
        session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "get_customer", "arguments": {}}}
        assert httpx.get(f"{server.url}/envs/world_b/tasks", timeout=MOMENTS_S).status_code == 200  # world_b loaded
        assert list(gateway.loaded) == ["world_a", "world_b"]
        assert (
            httpx.post(f"{server.url}/envs/world_b/mcp", json=call, headers=session, timeout=MOMENTS_S).status_code
            == 404
        )
        answered = httpx.post(f"{server.url}/envs/world_a/mcp", json=call, headers=session, timeout=MOMENTS_S)
        assert answered.status_code == 200 and answered.json()["id"] == 2
        assert answered.json()["result"]["isError"]  # customer_id is required: the tool's error, in the session
        assert httpx.delete(f"{server.url}/envs/world_a/mcp", headers=session, timeout=MOMENTS_S).status_code == 200
        assert (
            httpx.post(f"{server.url}/envs/world_a/mcp", json=call, headers=session, timeout=MOMENTS_S).status_code
            == 404
        )
        wait_until(lambda: runtime.open_episodes == 0, "the ended session's episode to close")
        wait_until(lambda: len(gateway.loaded) == 1, "world_a, idle, to unload")  # back under the bound


def test_observed_tool_evidence_is_kept_for_a_bounded_number_of_worlds(golden, runtime, monkeypatch):
    """A gateway of thousands of worlds unloads them past `--max-loaded`; the tool evidence it observed
    is kept for the most recently used `OBSERVED_KEPT` worlds only."""
    monkeypatch.setattr(mcp_tools, "OBSERVED_KEPT", 2)
    monkeypatch.setattr(mcp_tools, "_OBSERVED", OrderedDict())
    worlds = [renamed(golden, f"kept_{i}") for i in range(3)]
    for world in worlds:
        assert mcp_tools.observe(runtime, world)
    assert list(mcp_tools._OBSERVED) == [w.runtime_key for w in worlds[1:]]
    mcp_tools.observe(runtime, worlds[1])  # used again: the most recent
    assert list(mcp_tools._OBSERVED) == [worlds[2].runtime_key, worlds[1].runtime_key]
