"""The MCP gateway, driven by the official MCP Python client over HTTP."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable

import anyio
import httpx
import httpx2
import pytest
from conftest import GOLDEN, PATIENT_LIMITS
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.gateway import BackgroundServer, Gateway, free_port


@pytest.fixture(scope="module")
def served() -> str:
    """`worldsmith env serve` as a real process on a loopback port."""
    port = free_port()
    env = dict(os.environ, WORLDSMITH_SANDBOX_WORKERS="2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worldsmith.cli", "env", "serve", str(GOLDEN), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"env serve did not start: {proc.stdout.read().decode()}")
        time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def eventually(condition: Callable[[], bool], within_s: float = 60.0) -> bool:
    """Whether `condition` holds within `within_s` (polled; as soon as it holds, however busy the machine)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def _session_run(url: str, calls, task: str | None = None):
    query = f"?task={task}" if task else ""
    async with streamable_http_client(f"{url}/envs/retail_store/mcp{query}") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await calls(session)


def test_list_and_call_tools_over_http(served):
    async def calls(session):
        tools = (await session.list_tools()).tools
        found = await session.call_tool("find_customer", {"email": "maria.lopez@example.com"})
        refused = await session.call_tool("ship_order", {"order_id": 1001})
        invalid = await session.call_tool("get_customer", {"customer_id": "one"})
        return tools, found, refused, invalid

    tools, found, refused, invalid = anyio.run(_session_run, served, calls, "t01_points_balance")
    names = {t.name for t in tools}
    assert {"find_customer", "create_order", "request_return"} <= names and len(names) == 16
    create = next(t for t in tools if t.name == "create_order")
    assert create.input_schema["required"] == ["customer_id", "items", "shipping_address"]
    assert not found.is_error and found.structured_content["loyalty_points"] == 1250
    assert refused.is_error and "only paid orders can be shipped" in refused.content[0].text
    assert invalid.is_error and "is not of type 'integer'" in invalid.content[0].text


def test_verification_is_not_reachable_by_the_agent(served):
    async def calls(session):
        tools = (await session.list_tools()).tools
        attempt = await session.call_tool(
            "verify_t01_points_balance", {"initial": None, "final": None, "answer": "1250"}
        )
        return tools, attempt

    tools, attempt = anyio.run(_session_run, served, calls)
    assert not any("verif" in t.name or "reward" in t.name for t in tools)
    assert attempt.is_error and "unknown tool" in attempt.content[0].text
    assert httpx.get(f"{served}/envs/retail_store/verify").status_code == 404


def test_unknown_task_is_refused_when_connecting(served):
    async def calls(session):
        return None

    with pytest.raises(BaseException) as info:
        anyio.run(_session_run, served, calls, "no_such_task")
    assert "no task 'no_such_task'" in repr(info.value)


def test_64_concurrent_sessions_with_conflicting_writes_stay_independent(served):
    async def one(index: int):
        async def calls(session):
            email = f"agent{index}@example.com"
            changed = await session.call_tool("update_customer_email", {"customer_id": 1, "email": email})
            order = await session.call_tool(
                "create_order",
                {"customer_id": 1, "items": [{"sku": "MN-510", "quantity": 3}], "shipping_address": f"{index} Main St"},
            )
            me = await session.call_tool("get_customer", {"customer_id": 1})
            stock = await session.call_tool("get_product", {"sku": "MN-510"})
            return changed, order, me, stock

        return await _session_run(served, calls)

    async def all_sessions():
        return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(all_sessions())
    for index, (changed, order, me, stock) in enumerate(results):
        assert not changed.is_error and not order.is_error, (changed, order)
        assert me.structured_content["email"] == f"agent{index}@example.com"
        assert order.structured_content["id"] == 1013  # every session saw the same fresh database
        assert order.structured_content["shipping_address"] == f"{index} Main St"
        assert stock.structured_content["stock"] == 0  # 3 in stock, each session bought all 3


def test_sessions_close_their_episodes_and_idle_ones_expire(golden):
    with Runtime(limits=PATIENT_LIMITS, workers=1) as runtime:
        gateway = Gateway(runtime, [golden], session_idle_s=5.0)  # far longer than a client takes between its requests
        with BackgroundServer(gateway.app()) as server:
            url = f"{server.url}/envs/retail_store/mcp?task=t04_return_headphones"

            async def polite():  # ends its session (HTTP DELETE)
                async with streamable_http_client(url) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        await session.call_tool("get_order", {"order_id": 1002})
                        assert len(gateway.sessions) == 1 and runtime.open_episodes == 1

            anyio.run(polite)
            assert eventually(lambda: not gateway.sessions) and runtime.open_episodes == 0

            async def vanishing():  # leaves without ending its session
                async with httpx2.AsyncClient() as http:
                    async with streamable_http_client(url, http_client=http, terminate_on_close=False) as (read, write):
                        async with ClientSession(read, write) as session:
                            await session.initialize()
                            await session.call_tool("get_order", {"order_id": 1002})
                assert len(gateway.sessions) == 1

            anyio.run(vanishing)
            assert eventually(lambda: not gateway.sessions) and runtime.open_episodes == 0


def test_many_environments_on_one_server(golden, tmp_path):
    from worldsmith.bundle.loader import build_bundle, load_bundle, write_bundle

    other = build_bundle(
        {n: golden.files[n] for n in ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl", "verifiers.py")},
        golden.manifest.model_copy(update={"env_id": "retail_store_copy"}),
    )
    write_bundle(other, tmp_path / "copy")
    with pytest.raises(ValueError, match="same env_id"):
        Gateway(Runtime(limits=PATIENT_LIMITS, workers=1), [golden, golden])
    with Runtime(limits=PATIENT_LIMITS, workers=1) as runtime:
        gateway = Gateway(runtime, [golden, load_bundle(tmp_path / "copy")])
        with BackgroundServer(gateway.app()) as server:
            index = httpx.get(f"{server.url}/envs").json()
            assert set(index["envs"]) == {"retail_store", "retail_store_copy"}

            async def both():
                out = []
                for env in index["envs"]:
                    async with streamable_http_client(f"{server.url}/envs/{env}/mcp") as (read, write):
                        async with ClientSession(read, write) as session:
                            init = await session.initialize()
                            out.append(init.server_info.name)
                return out

            assert anyio.run(both) == ["worldsmith/retail_store", "worldsmith/retail_store_copy"]


def test_session_limit_refuses_with_503_and_frees_up(golden):
    with Runtime(limits=PATIENT_LIMITS, workers=1) as runtime:
        gateway = Gateway(runtime, [golden], max_sessions=2)
        with BackgroundServer(gateway.app()) as server:
            url = f"{server.url}/envs/retail_store/mcp"
            opening = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"},
                },
            }
            headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
            ids = []
            for _ in range(2):
                response = httpx.post(url, json=opening, headers=headers)
                assert response.status_code == 200
                ids.append(response.headers["mcp-session-id"])
            refused = httpx.post(url, json=opening, headers=headers)
            assert refused.status_code == 503 and "Too many open sessions" in refused.text
            assert runtime.open_episodes == 2
            assert httpx.delete(url, headers={"mcp-session-id": ids[0]}).status_code == 200
            assert eventually(lambda: runtime.open_episodes == 1)
            assert httpx.post(url, json=opening, headers=headers).status_code == 200
