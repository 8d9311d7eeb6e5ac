"""Who may call the gateway (serving/access.py): Host and Origin naming it (DNS rebinding refused), and
a bearer token when one is set, for `Gateway.app()`, `env serve` and `env serve --processes N`."""

from __future__ import annotations

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from support.paths import GOLDEN
from test_gateway import serve_process
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.localserver import BackgroundServer
from worldsmith.serving.access import Access, AccessRefused, read_token_file
from worldsmith.serving.gateway import Gateway

TOKEN = "s3cret-token.1"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "access", "version": "1"}},
}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("host", "port", "allowed"),
    [
        ("localhost:8765", 8765, True),
        ("127.0.0.1:8765", 8765, True),
        ("[::1]:8765", 8765, True),
        ("LOCALHOST:8765", 8765, True),
        ("localhost:8766", 8765, False),  # another port: another server's name
        ("localhost", 8765, False),
        ("localhost", 80, True),
        ("evil.example.com:8765", 8765, False),
        ("127.0.0.1.evil.example.com:8765", 8765, False),
        ("gateway.internal", 8765, True),  # added without a port: any port, or none
        ("gateway.internal:443", 8765, True),
        ("pinned.internal:9000", 8765, True),  # added with one: that port only
        ("pinned.internal:9001", 8765, False),
        ("pinned.internal", 8765, False),
        ("10.0.0.5:8765", 8765, True),  # the address it was bound to
        ("10.0.0.6:8765", 8765, False),
    ],
)
def test_a_host_is_allowed_when_it_names_this_gateway(host, port, allowed):
    access = Access(allowed_hosts=("Gateway.Internal", "pinned.internal:9000"), bound="10.0.0.5")
    assert access.host_allowed(host, port) is allowed


@pytest.mark.unit
@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost:8765", True),
        ("https://127.0.0.1:8765", True),
        ("http://evil.example.com", False),
        ("http://localhost:8765/path", False),
        ("null", False),
        ("file://localhost:8765", False),
    ],
)
def test_an_origin_is_allowed_when_it_is_this_gateway_s_own(origin, allowed):
    assert Access().origin_allowed(origin, 8765) is allowed


@pytest.mark.unit
def test_a_wildcard_bind_address_names_nothing():
    assert not Access(bound="0.0.0.0").host_allowed("0.0.0.0:8765", 8765)
    assert Access(bound="::1").host_allowed("[::1]:8765", 8765)


def _guarded(access: Access) -> httpx.AsyncClient:
    async def hello(request):
        return PlainTextResponse("hello")

    inner = Starlette(routes=[Route("/envs", hello), Route("/healthz", hello)])
    transport = httpx.ASGITransport(app=access.guard(inner))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765")


@pytest.mark.unit
def test_refusals_are_403_for_a_name_and_401_with_a_challenge_for_a_token():
    async def statuses():
        async with _guarded(Access(token=TOKEN)) as client:
            ok = await client.get("/envs", headers={"authorization": f"Bearer {TOKEN}"})
            evil = await client.get("/envs", headers={"host": "evil.example.com", "authorization": f"Bearer {TOKEN}"})
            origin = await client.get(
                "/envs", headers={"origin": "http://evil.example.com", "authorization": f"Bearer {TOKEN}"}
            )
            missing = await client.get("/envs")
            wrong = await client.get("/envs", headers={"authorization": "Bearer s3cret-token.2"})
            basic = await client.get("/envs", headers={"authorization": f"Basic {TOKEN}"})
            health = await client.get("/healthz", headers={"host": "evil.example.com"})
            return ok, evil, origin, missing, wrong, basic, health

    ok, evil, origin, missing, wrong, basic, health = anyio.run(statuses)
    assert ok.status_code == 200 and ok.text == "hello"
    assert evil.status_code == 403 and "--allow-host" in evil.json()["error"]
    assert origin.status_code == 403 and "Origin" in origin.json()["error"]
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == 'Bearer realm="worldsmith"'
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert basic.status_code == 401
    assert health.status_code == 200  # says only that the gateway is up
    assert all(TOKEN not in r.text for r in (evil, origin, missing, wrong, basic))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "No such file or directory"),
        ("  \n", "is empty"),
        ("two words", "more than one"),
        ("dir", "Is a directory"),
    ],
)
def test_a_token_file_that_cannot_be_used_is_one_line_naming_the_fix(tmp_path, content, problem):
    path = tmp_path / "token"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(AccessRefused, match=problem):
        read_token_file(path)
    result = CliRunner().invoke(app, ["env", "serve", str(GOLDEN), "--token-file", str(path)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and problem in lines[0] and str(path) in lines[0], result.output


@pytest.mark.unit
def test_a_token_file_holds_one_token_its_newline_dropped(tmp_path):
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    assert read_token_file(path) == TOKEN


@pytest.mark.unit
def test_an_allowed_host_that_is_no_name_is_refused_in_one_line():
    result = CliRunner().invoke(app, ["env", "serve", str(GOLDEN), "--allow-host", "http://evil.example.com/"])
    assert result.exit_code == 2 and "is not a host name" in result.output.strip().splitlines()[-1], result.output


async def _tools_with(url: str, headers: dict[str, str]) -> list[str]:
    async with httpx2.AsyncClient(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return [t.name for t in (await session.list_tools()).tools]


@pytest.mark.sandbox
def test_a_gateway_with_a_token_answers_only_callers_that_send_it_and_name_it(runtime, golden):
    gateway = Gateway(runtime, [golden], access=Access(token=TOKEN))
    with BackgroundServer(gateway.app()) as server:
        url = f"{server.url}/envs/{golden.env_id}/mcp"
        rebinding = {"host": "evil.example.com", "origin": "http://evil.example.com"}
        refused = {
            "no token": httpx.post(url, json=INITIALIZE, headers=HEADERS),
            "another token": httpx.post(url, json=INITIALIZE, headers={**HEADERS, "authorization": "Bearer x"}),
            "rebinding": httpx.post(
                url, json=INITIALIZE, headers={**HEADERS, **rebinding, "authorization": f"Bearer {TOKEN}"}
            ),
            "listing": httpx.get(f"{server.url}/envs/{golden.env_id}/tasks"),
        }
        tools = anyio.run(_tools_with, url, {"authorization": f"Bearer {TOKEN}"})
    assert {name: r.status_code for name, r in refused.items()} == {
        "no token": 401,
        "another token": 401,
        "rebinding": 403,
        "listing": 401,
    }
    assert all(golden.task(t.id).instruction not in r.text for r in refused.values() for t in golden.tasks)
    assert "get_customer" in tools


@pytest.mark.sandbox
def test_a_gateway_without_a_token_refuses_a_dns_rebinding_request_by_default(runtime, golden):
    with BackgroundServer(Gateway(runtime, [golden]).app()) as server:
        url = f"{server.url}/envs/{golden.env_id}/mcp"
        rebinding = httpx.post(url, json=INITIALIZE, headers={**HEADERS, "host": "evil.example.com:80"})
        own = httpx.post(
            url, json=INITIALIZE, headers={**HEADERS, "origin": server.url.replace("127.0.0.1", "localhost")}
        )
    assert rebinding.status_code == 403 and "instructions" not in rebinding.text
    assert own.status_code == 200 and "instructions" in own.json()["result"]


@pytest.mark.sandbox
@pytest.mark.timeout(240)
def test_env_serve_processes_check_the_token_before_a_request_is_forwarded(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc, url = serve_process(
        str(GOLDEN), "--processes", "2", "--token-file", str(token_file), "--allow-host", "gw.test"
    )
    try:
        mcp = f"{url}/envs/retail_store/mcp"
        assert httpx.post(mcp, json=INITIALIZE, headers=HEADERS).status_code == 401
        bearer = {**HEADERS, "authorization": f"Bearer {TOKEN}"}
        named = httpx.post(mcp, json=INITIALIZE, headers={**bearer, "host": "gw.test"})
        assert named.status_code == 200, named.text
        session = {**bearer, "mcp-session-id": named.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
        call["params"] = {"name": "get_customer", "arguments": {"customer_id": 1}}
        answers = [httpx.post(mcp, json=call, headers=session) for _ in range(6)]  # fresh connections: some forwarded
        stolen = httpx.post(mcp, json=call, headers={**session, "authorization": "Bearer x"})
        rebinding = httpx.post(mcp, json=call, headers={**session, "host": "evil.example.com"})
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert [a.status_code for a in answers] == [200] * 6
    assert all(a.json()["result"]["structuredContent"]["id"] == 1 for a in answers)
    assert (stolen.status_code, rebinding.status_code) == (401, 403)
