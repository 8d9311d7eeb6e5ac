"""The MCP gateway, driven by the official MCP Python client and the MCP Inspector CLI over HTTP."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from support.catalog import published_set
from support.limits import PATIENT_LIMITS
from support.paths import GOLDEN, REPO
from support.patience import MOMENTS_S, PROCESS_S, wait_until
from typer.testing import CliRunner

from worldsmith.bundle.contract import Bundle
from worldsmith.cli import app
from worldsmith.localserver import BackgroundServer, free_port
from worldsmith.runtime.episode import Runtime
from worldsmith.serving.gateway import Gateway, GatewayRefused

pytestmark = pytest.mark.sandbox

#: The MCP Inspector the Inspector test runs, installed (by .ci/run, or by the test when npm is there)
#: into a directory git ignores.
INSPECTOR_PACKAGE = "@modelcontextprotocol/inspector@2.12.0"
INSPECTOR_DIR = REPO / ".venv" / "mcp-inspector"


def serve_process(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`worldsmith env serve ARGS` as a real process on a loopback port, once it answers `/healthz`."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worldsmith.cli", "env", "serve", *args, "--port", str(port)],
        env=dict(os.environ, WORLDSMITH_SANDBOX_WORKERS="2", **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"env serve did not start: {proc.stdout.read().decode()}")
        try:
            return httpx.get(f"{url}/healthz", timeout=MOMENTS_S).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, "env serve to answer /healthz", within_s=PROCESS_S)
    except BaseException:
        proc.kill()
        raise
    return proc, url


@pytest.fixture(scope="module")
def served() -> str:
    """`worldsmith env serve GOLDEN`: plain tool serving (no verdicts)."""
    proc, url = serve_process(str(GOLDEN))
    yield url
    proc.terminate()
    proc.wait(timeout=PROCESS_S)


def _index(url: str) -> dict:
    """The gateway's index at `url` (/envs): its worlds, sessions and loaded worlds."""
    return httpx.get(f"{url}/envs", timeout=MOMENTS_S).json()


def renamed(golden: Bundle, env_id: str) -> Bundle:
    """The golden bundle as `env_id` (same files, its own content key)."""
    return dataclasses.replace(golden, manifest=golden.manifest.model_copy(update={"env_id": env_id}), root=None)


async def _session_run(url: str, calls, task: str | None = None):
    query = f"?task={task}" if task else ""
    async with streamable_http_client(f"{url}/envs/retail_store/mcp{query}") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await calls(session)


def test_a_client_lists_then_calls_tools_over_http(served):
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
    assert httpx.get(f"{served}/envs/retail_store/verify", timeout=MOMENTS_S).status_code == 404


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


@pytest.fixture(scope="module")
def gateway_runtime():
    """One sandbox worker for the gateways of the tests that count the runtime's open episodes (each
    counts from what it found open)."""
    with Runtime(limits=PATIENT_LIMITS, workers=1) as runtime:
        yield runtime


def test_a_session_its_client_ends_closes_its_episode(golden, gateway_runtime):
    runtime, before = gateway_runtime, gateway_runtime.open_episodes
    gateway = Gateway(runtime, [golden])  # the default idle limit: only the client's DELETE ends the session
    with BackgroundServer(gateway.app()) as server:
        url = f"{server.url}/envs/retail_store/mcp?task=t04_return_headphones"

        async def polite():  # ends its session (HTTP DELETE)
            async with streamable_http_client(url) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    await session.call_tool("get_order", {"order_id": 1002})
                    assert len(gateway.sessions) == 1 and runtime.open_episodes == before + 1

        anyio.run(polite)
        wait_until(lambda: not gateway.sessions, "the ended session to close")
        assert runtime.open_episodes == before


def test_an_idle_session_expires_closing_its_episode(golden, gateway_runtime):
    runtime, before = gateway_runtime, gateway_runtime.open_episodes
    gateway = Gateway(runtime, [golden], session_idle_s=5.0)  # the limit under test
    with BackgroundServer(gateway.app()) as server:
        url = f"{server.url}/envs/retail_store/mcp?task=t04_return_headphones"

        async def vanishing():  # leaves without ending its session
            async with httpx2.AsyncClient() as http:
                async with streamable_http_client(url, http_client=http, terminate_on_close=False) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        await session.call_tool("get_order", {"order_id": 1002})
            assert len(gateway.sessions) == 1

        anyio.run(vanishing)
        wait_until(lambda: not gateway.sessions, "the idle session to expire")
        assert runtime.open_episodes == before


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
            index = httpx.get(f"{server.url}/envs", timeout=MOMENTS_S).json()
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


def test_past_the_session_limit_a_new_session_is_refused_with_503_until_one_ends(golden, gateway_runtime):
    runtime, before = gateway_runtime, gateway_runtime.open_episodes
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
            response = httpx.post(url, json=opening, headers=headers, timeout=MOMENTS_S)
            assert response.status_code == 200
            ids.append(response.headers["mcp-session-id"])
        refused = httpx.post(url, json=opening, headers=headers, timeout=MOMENTS_S)
        assert refused.status_code == 503 and "Too many open sessions" in refused.text
        assert runtime.open_episodes == before + 2
        assert httpx.delete(url, headers={"mcp-session-id": ids[0]}, timeout=MOMENTS_S).status_code == 200
        wait_until(lambda: runtime.open_episodes == before + 1, "the ended session's episode to close")
        again = httpx.post(url, json=opening, headers=headers, timeout=MOMENTS_S)
        assert again.status_code == 200
        for session_id in (ids[1], again.headers["mcp-session-id"]):  # the worker's episodes, left as found
            httpx.delete(url, headers={"mcp-session-id": session_id}, timeout=MOMENTS_S)


# -- what an outside agent is told: instructions, prompt, task listing ------------------------------


async def _opened(url: str, calls, task: str | None = None, env_id: str = "retail_store"):
    """`calls(session, initialize result)` in one MCP session of `env_id` at `url`."""
    query = f"?task={task}" if task else ""
    async with streamable_http_client(f"{url}/envs/{env_id}/mcp{query}") as (read, write):
        async with ClientSession(read, write) as session:
            return await calls(session, await session.initialize())


def test_a_session_bound_to_a_task_is_given_it_as_instructions_with_a_prompt(served, golden):
    task = golden.task("t02_place_and_pay")

    async def bound(session, init):
        prompt = await session.get_prompt("task")
        names = {t.name for t in (await session.list_tools()).tools}
        return init.instructions, (await session.list_prompts()).prompts, prompt, names

    instructions, prompts, prompt, names = anyio.run(_opened, served, bound, task.id)
    assert task.instruction in instructions and golden.manifest.scenario.name in instructions
    assert "submit" not in instructions and "submit" not in names  # plain serving: no verdicts
    assert [(p.name, p.title) for p in prompts] == [("task", task.id)]
    assert [(m.role, m.content.text) for m in prompt.messages] == [("user", task.instruction)]


def test_an_unbound_session_finds_the_tasks_as_resources(served, golden):
    task = golden.task("t02_place_and_pay")

    async def unbound(session, init):
        listed = (await session.list_resources()).resources
        listing = await session.read_resource(f"worldsmith://{golden.env_id}/tasks")
        one = await session.read_resource(f"worldsmith://{golden.env_id}/tasks/{task.id}")
        with pytest.raises(MCPError, match="not bound to a task"):
            await session.get_prompt("task")
        return init.instructions, (await session.list_prompts()).prompts, listed, listing, one

    instructions, prompts, listed, listing, one = anyio.run(_opened, served, unbound)
    assert f"worldsmith://{golden.env_id}/tasks" in instructions and not prompts
    assert {r.uri for r in listed} == {f"worldsmith://{golden.env_id}/tasks"} | {
        f"worldsmith://{golden.env_id}/tasks/{t.id}" for t in golden.tasks
    }
    rows = json.loads(listing.contents[0].text)
    assert rows == httpx.get(f"{served}/envs/{golden.env_id}/tasks", timeout=MOMENTS_S).json()
    assert [(r["id"], r["instruction"]) for r in rows] == [(t.id, t.instruction) for t in golden.tasks]
    assert all(set(r) == {"id", "instruction", "mcp"} for r in rows)  # no verifier, solution or answer
    assert one.contents[0].text == task.instruction


# -- how the tools are described: schemas as written, output schemas, observed hints --------------


def _with_choices(bundle: Bundle) -> Bundle:
    """`bundle` whose tools.json spells out allowed values and ranges the golden one has only in prose."""
    tools = []
    for tool in bundle.tools:
        parameters = copy.deepcopy(tool.parameters)
        if tool.name == "list_orders":
            parameters["properties"]["status"]["enum"] = ["pending", "paid", "shipped", "delivered", "cancelled", None]
        if tool.name == "get_loyalty_history":
            parameters["properties"]["limit"] |= {"minimum": 1, "maximum": 100}
        tools.append(tool.model_copy(update={"parameters": parameters}))
    return dataclasses.replace(bundle, tools=tuple(tools))


def _writes(runtime: Runtime, bundle: Bundle) -> dict[str, bool]:
    """Per tool a reference solution calls: whether some call of it changed the database."""
    wrote: dict[str, bool] = {}
    for task in bundle.tasks:
        with runtime.open_episode(bundle) as episode:
            for step in task.solution:
                before = episode.snapshot()
                episode.call_tool(step.tool, step.arguments)
                wrote[step.tool] = wrote.get(step.tool, False) or not episode.diff(before).empty
    return wrote


@dataclasses.dataclass
class ServedTools:
    """What one session saw of the golden world with choices spelled out (`_with_choices`): its tools
    as listed, and three calls: a status outside the enum, a limit past the maximum, a paid listing."""

    bundle: Bundle
    tools: dict
    bad_status: object
    too_many: object
    listed: object


@pytest.fixture(scope="module")
def served_tools(golden, runtime) -> ServedTools:
    bundle = _with_choices(golden)
    gateway = Gateway(runtime, [bundle])

    async def calls(session, init):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        bad_status = await session.call_tool("list_orders", {"customer_id": 1, "status": "lost"})
        too_many = await session.call_tool("get_loyalty_history", {"customer_id": 1, "limit": 1000})
        listed = await session.call_tool("list_orders", {"customer_id": 1, "status": "paid"})
        return tools, bad_status, too_many, listed

    with BackgroundServer(gateway.app()) as server:
        return ServedTools(bundle, *anyio.run(_opened, server.url, calls))


def test_tools_are_served_with_their_input_schemas_as_written(served_tools):
    tools, bad_status, too_many = served_tools.tools, served_tools.bad_status, served_tools.too_many
    assert {name: t.input_schema for name, t in tools.items()} == {
        t.name: t.parameters for t in served_tools.bundle.tools
    }
    assert None in tools["list_orders"].input_schema["properties"]["status"]["enum"]
    assert bad_status.is_error and "is not one of" in bad_status.content[0].text
    assert too_many.is_error and "is greater than the maximum of 100" in too_many.content[0].text


def test_tools_carry_output_schemas_from_their_return_annotations(served_tools):
    """`-> dict` is an object, `-> list` comes as {"result": [...]}."""
    tools, listed = served_tools.tools, served_tools.listed
    assert tools["get_customer"].output_schema == {"type": "object"}
    assert tools["list_orders"].output_schema["properties"]["result"] == {"type": "array"}
    assert not listed.is_error and all(o["status"] == "paid" for o in listed.structured_content["result"])


def test_tools_carry_the_hints_their_observed_writes_allow(served_tools, runtime):
    bundle, tools = served_tools.bundle, served_tools.tools
    wrote = _writes(runtime, bundle)
    hints = {name: t.annotations for name, t in tools.items()}
    assert all(h.open_world_hint is False for h in hints.values())
    for name, writes in wrote.items():  # a tool seen to change the database is never read-only
        assert not (writes and hints[name].read_only_hint), name
    assert {name for name, h in hints.items() if h.read_only_hint} == {
        name for name in hints if not wrote.get(name) and name.startswith(("get_", "find_", "list_", "search_"))
    }
    # placing the same order twice places two orders: create_order is not idempotent; it also takes stock
    with runtime.open_episode(bundle) as episode:
        arguments = {"customer_id": 1, "items": [{"sku": "KB-101", "quantity": 1}], "shipping_address": "1 Main St"}
        first, second = episode.call_tool("create_order", arguments), episode.call_tool("create_order", arguments)
    assert first.value["id"] != second.value["id"]
    assert hints["create_order"].idempotent_hint is False and hints["create_order"].destructive_hint is True


# -- the opt-in verdict -------------------------------------------------------------------------------


def test_submit_ends_the_episode_with_the_verdict_an_evaluation_would_give(golden, runtime):
    gateway = Gateway(runtime, [golden], verdicts=True)
    place = golden.task("t02_place_and_pay")
    points = golden.task("t01_points_balance")

    def solving(task, answer: str, extra: list[tuple[str, dict]] = ()):
        async def calls(session, init):
            names = [t.name for t in (await session.list_tools()).tools]
            for step in task.solution:
                assert not (await session.call_tool(step.tool, step.arguments)).is_error
            for tool, arguments in extra:
                assert not (await session.call_tool(tool, arguments)).is_error
            open_before = len(gateway.sessions)
            verdict = await session.call_tool("submit", {"answer": answer})
            after = await session.call_tool("get_customer", {"customer_id": 1})
            return init.instructions, names, verdict, open_before, len(gateway.sessions), after

        return calls

    async def unbound(session, init):
        return [t.name for t in (await session.list_tools()).tools], await session.call_tool("submit", {})

    with BackgroundServer(gateway.app()) as server:
        solved = anyio.run(_opened, server.url, solving(place, ""), place.id)
        overreaching = anyio.run(
            _opened,
            server.url,
            solving(place, "", [("update_customer_email", {"customer_id": 1, "email": "x@example.com"})]),
            place.id,
        )
        wrong = anyio.run(_opened, server.url, solving(points, "12"), points.id)
        free_names, free_submit = anyio.run(_opened, server.url, unbound)
    instructions, names, verdict, open_before, open_after, after = solved
    assert "submit" in instructions and names[-1] == "submit"
    assert not verdict.is_error and verdict.structured_content["task"] == place.id
    assert verdict.structured_content["status"] == "complete" and verdict.structured_content["reward"] == 1.0
    assert (open_before, open_after) == (1, 0)  # the episode closed at submit
    assert after.is_error and "submitted" in after.content[0].text
    # the side-effect guard, as an evaluation applies it: the verifier's `complete` downgraded
    judged = overreaching[2].structured_content
    assert judged["status"] == "partial" and any("customers" in line for line in judged["evidence"]["side_effects"])
    assert wrong[2].structured_content["status"] == "incomplete" and wrong[2].structured_content["reward"] == 0.0
    assert "submit" not in free_names and free_submit.is_error and "unknown tool" in free_submit.content[0].text
    assert runtime.open_episodes == 0


@pytest.mark.unit
def test_verdicts_refuse_a_world_with_its_own_submit_tool(golden):
    from support.bundles import with_tools

    clashing = with_tools(golden, "def submit(conn):\n    return {}\n", ["submit"])
    with pytest.raises(GatewayRefused, match="has a tool named 'submit'"):
        Gateway(Runtime(limits=PATIENT_LIMITS, workers=1), [clashing], verdicts=True)


# -- env serve: bundle directories, sets, catalog refs, a short idle limit, lazy loading ------------


def test_env_serve_hosts_worlds_of_every_source_within_its_bounds(home, golden, tmp_path):
    from worldsmith.bundle.loader import build_bundle, write_bundle
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import configured_store
    from worldsmith.storage.publish import publish

    published_set("served", [golden], validation_fraction=0.0)
    copy_of = build_bundle(
        {n: golden.files[n] for n in ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl", "verifiers.py")},
        golden.manifest.model_copy(update={"env_id": "retail_store_copy"}),
    )
    publish(copy_of, configured_store(), open_catalog())
    directory = write_bundle(renamed(golden, "dir_world"), tmp_path / "dir_world")
    broken = write_bundle(renamed(golden, "dir_broken"), tmp_path / "dir_broken")
    (broken / "tools.py").write_text("def get_customer(conn, customer_id: int) -> dict:\n    return {}\n")

    proc, url = serve_process(
        str(directory),
        str(broken),  # its manifest names it; what is wrong inside shows when it is first served
        "--set",
        "served",
        "retail_store_copy@1",
        "--verdicts",
        "--session-idle",
        "2",  # the limit under test
        "--max-loaded",
        "1",
        env={"WORLDSMITH_HOME": str(home)},
    )
    try:
        index = _index(url)
        assert set(index["envs"]) == {"retail_store", "retail_store_copy", "dir_world", "dir_broken"}
        assert index["session_idle_s"] == 2 and index["verdicts"] is True
        assert index["loaded"] == [] and index["max_loaded"] == 1  # nothing loaded before its first session

        async def vanishing():  # leaves without ending its session
            async with httpx2.AsyncClient() as http:
                target = f"{url}/envs/retail_store_copy/mcp?task=t01_points_balance"
                async with streamable_http_client(target, http_client=http, terminate_on_close=False) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        return [t.name for t in (await session.list_tools()).tools]

        assert "submit" in anyio.run(vanishing)
        assert _index(url)["sessions"] == 1
        wait_until(lambda: _index(url)["sessions"] == 0, "the vanished client's session to expire")
        assert _index(url)["loaded"] == ["retail_store_copy"]

        async def polite():
            async with streamable_http_client(f"{url}/envs/dir_world/mcp") as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await session.call_tool("get_customer", {"customer_id": 1})

        assert not anyio.run(polite).is_error
        wait_until(lambda: _index(url)["loaded"] == ["dir_world"], "the idle world to unload")  # the bound: 1
        refused = httpx.post(
            f"{url}/envs/dir_broken/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            headers={"accept": "application/json, text/event-stream"},
            timeout=MOMENTS_S,
        )
        message = refused.json()["error"]["message"]
        assert refused.status_code == 503 and "dir_broken" in message and "tools.py" in message and "\n" not in message
    finally:
        proc.terminate()
        proc.wait(timeout=PROCESS_S)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "name what to serve"),
        (["nope@2"], "no environment version 'nope@2'"),
        (["--set", "nope"], "no environment set 'nope'"),
        ([str(GOLDEN), str(GOLDEN)], "two bundles with the same env_id: retail_store"),
        ([str(GOLDEN), "--member", "garbage"], "sets it; leave it unset"),
        ([str(GOLDEN), "--processes", "2", "--host", "203.0.113.9"], "choose another --host"),
    ],
)
def test_env_serve_refuses_what_it_cannot_serve_in_one_line(home, args, words):
    result = CliRunner().invoke(app, ["env", "serve", *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and words in lines[0], result.output


# -- the MCP Inspector CLI (npm) against the gateway -------------------------------------------------


def _unavailable(reason: str) -> None:
    """Skip the Inspector test for `reason`; in CI (where .ci/run installs it) fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"the MCP Inspector is required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def inspector() -> Path:
    """The MCP Inspector's launcher, installed into INSPECTOR_DIR (git-ignored) on first use."""
    launcher = INSPECTOR_DIR / "node_modules" / ".bin" / "mcp-inspector"
    if not launcher.exists():
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            _unavailable("the MCP Inspector test needs node and npm (apt-get install -y nodejs npm)")
        done = subprocess.run(
            [npm, "install", "--prefix", str(INSPECTOR_DIR), "--no-audit", "--no-fund", INSPECTOR_PACKAGE],
            capture_output=True,
            text=True,
            timeout=PROCESS_S,
        )
        if done.returncode != 0:
            _unavailable(f"npm could not install {INSPECTOR_PACKAGE}: {done.stderr.strip()[-500:]}")
    return launcher


def test_the_mcp_inspector_cli_sees_everything_the_gateway_serves(inspector, golden, runtime, tmp_path):
    task = golden.task("t01_points_balance")
    gateway = Gateway(runtime, [golden], verdicts=True)

    def inspect(url: str, *args: str) -> dict:
        done = subprocess.run(
            [str(inspector), "--cli", url, *args],
            capture_output=True,
            text=True,
            timeout=PROCESS_S,
            env=dict(os.environ, HOME=str(tmp_path)),
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    with BackgroundServer(gateway.app()) as server:
        url = f"{server.url}/envs/{golden.env_id}/mcp?task={task.id}"
        tools = {t["name"]: t for t in inspect(url, "--method", "tools/list")["tools"]}
        prompt = inspect(url, "--method", "prompts/get", "--prompt-name", "task")
        called = inspect(url, "--method", "tools/call", "--tool-name", "get_customer", "--tool-arg", "customer_id=1")
        verdict = inspect(url, "--method", "tools/call", "--tool-name", "submit", "--tool-arg", f"answer={task.answer}")
    assert set(tools) == {t.name for t in golden.tools} | {"submit"}
    assert tools["find_customer"]["annotations"]["readOnlyHint"] is True
    assert tools["create_order"]["annotations"]["readOnlyHint"] is False
    assert all("outputSchema" in t and t["annotations"]["openWorldHint"] is False for t in tools.values())
    assert prompt["messages"][0]["content"]["text"] == task.instruction
    with runtime.open_episode(golden) as episode:
        assert called["structuredContent"] == episode.call_tool("get_customer", {"customer_id": 1}).value
    assert verdict["structuredContent"]["status"] == "complete" and verdict["structuredContent"]["task"] == task.id
