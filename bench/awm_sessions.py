"""A new MCP session plus one read on an imported AWM environment: worldsmith's gateway against the reference, in one run.

    .venv/bin/python bench/awm_sessions.py [--release tests/data/awm_format_sample] [--sessions 30]

What an outside agent does at each reset: open a new MCP session (`initialize`, then
`notifications/initialized`) and make one read (`list_branches`). worldsmith: the gateway serving
the imported environment (`serving.gateway.serve`, as `env serve` runs it; each session is a fresh
episode, strict isolation). Reference: the release's app behind the MCP SDK's own server under
uvicorn, its tool a request to the app in-process, as fastapi-mcp serves an app (one database for
all sessions: no reset at all). Each server runs in a process of its own; this process is the
client, two ways:

- light: JSON-RPC over one HTTP/1.1 connection per session, written and read by hand (httpx, without
  a certificate store: the URLs are plain http://, and loading the store took 30-350 ms per client,
  the same for both servers and more than what is measured);
- official: the `mcp` SDK's `streamable_http_client` and `ClientSession`.

A third server, the **floor**, answers every request at once with canned bytes under the same
uvicorn (`FLOOR_SERVER`: no session, no app): a session against it costs what the client and the HTTP
stack do, the least any server's session can cost on this machine.

Prints the medians and the ratios (worldsmith / reference: below 1 means worldsmith is
faster; the floor / reference beside them), with the light client's session split in two (its opening: `initialize` and `initialized`;
its read: the episode's first call); the last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from worldsmith.bundle.contract import Bundle
from worldsmith.interop.awm import AwmScenario

REPO = Path(__file__).resolve().parent.parent
READ = ("list_branches", {})
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
#: The reference server: the release's app behind the MCP SDK's own server, each tool a request to the
#: app in-process (httpx's ASGI transport), as fastapi-mcp serves an app (fastapi-mcp itself does not
#: run on the mcp 2.x installed here). Only the read measured is exposed (its tools are not listed).
REFERENCE_SERVER = """
import logging

import httpx
from mcp.server import MCPServer

from awm_app import app as awm

server = MCPServer("awm-reference")
client = httpx.AsyncClient(transport=httpx.ASGITransport(app=awm), base_url="http://awm")


@server.tool(name="list_branches")
async def list_branches() -> str:
    response = await client.get(PATH)
    response.raise_for_status()
    return response.text


app = server.streamable_http_app(streamable_http_path="/mcp")
logging.getLogger().setLevel(logging.WARNING)
"""


#: The floor: a server that answers each request at once with canned bytes (no MCP session, no app, no
#: database), under the same uvicorn. What a session costs against it is the client's and the HTTP
#: stack's share, which no server can take off: the least any server's session can cost here.
FLOOR_SERVER = """
import json

RESULTS = {
    "initialize": {
        "protocolVersion": "2025-06-18",
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "floor", "version": "0"},
    },
    "tools/list": {"tools": []},
}
READ_RESULT = {"content": [{"type": "text", "text": "[]"}], "isError": False}


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    status, payload, headers = 200, b"", [(b"mcp-session-id", b"floor")]
    if scope["method"] == "POST":
        request = json.loads(body)
        if "id" in request:
            result = RESULTS.get(request.get("method"), READ_RESULT)
            payload = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode()
            headers.append((b"content-type", b"application/json"))
        else:
            status = 202
    elif scope["method"] == "GET":  # no stream of server messages
        status = 405
    headers.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(port: int, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("a server did not start") from None
            time.sleep(0.1)


def _message(response: httpx.Response) -> dict:
    """The JSON-RPC message of a response: a JSON body, or the first `data:` line of an SSE stream."""
    response.raise_for_status()
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                return json.loads(line[5:])
        raise RuntimeError("an event stream without data")
    return response.json()


def light_session(url: str) -> tuple[float, float, float]:
    """A new session and one read, by hand: the seconds of its `initialize`, its
    `notifications/initialized` and its read (`tools/call`)."""
    with httpx.Client(timeout=30, verify=False) as client:  # http:// only: no certificate store to load
        started = time.perf_counter()
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"},
            },
        }
        response = client.post(url, json=init, headers=HEADERS)
        _message(response)
        initialized = time.perf_counter()
        headers = dict(HEADERS)
        if "mcp-session-id" in response.headers:
            headers["mcp-session-id"] = response.headers["mcp-session-id"]
        headers["mcp-protocol-version"] = "2025-06-18"
        client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        opened = time.perf_counter()
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": READ[0], "arguments": READ[1]}}
        answer = _message(client.post(url, json=call, headers=headers))
        if "error" in answer or answer.get("result", {}).get("isError"):
            raise RuntimeError(f"the read failed: {answer}")
        return initialized - started, opened - initialized, time.perf_counter() - opened


async def official_session(url: str) -> None:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool(*READ)
        if result.is_error:
            raise RuntimeError(f"the read failed: {result}")


def measure(urls: dict[str, str], sessions: int) -> dict[str, dict[str, float]]:
    """Median milliseconds of a new session plus one read, per server and client, the servers and
    clients taken in turn (so that all meet the same load)."""
    for url in urls.values():  # warm-up: the servers' first sessions
        for _ in range(3):
            light_session(url)
            anyio.run(official_session, url)
    kinds = ("light_ms", "official_ms", "light_open_ms", "light_read_ms")
    samples: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in kinds} for name in urls}
    for _ in range(sessions):
        for name, url in urls.items():
            started = time.perf_counter()
            initialize, initialized, read = light_session(url)
            samples[name]["light_ms"].append(time.perf_counter() - started)
            samples[name]["light_open_ms"].append(initialize + initialized)
            samples[name]["light_read_ms"].append(read)
            started = time.perf_counter()
            anyio.run(official_session, url)
            samples[name]["official_ms"].append(time.perf_counter() - started)
    return {name: {k: 1000 * statistics.median(v) for k, v in by.items()} for name, by in samples.items()}


def serve_worldsmith(bundle_file: Path, port: int) -> None:
    from worldsmith.runtime.episode import Runtime
    from worldsmith.serving.gateway import Gateway, serve
    from worldsmith.serving.supervisor import listener

    bundle = pickle.loads(bundle_file.read_bytes())
    with Runtime(workers=1) as runtime:
        serve(Gateway(runtime, [bundle]), listener("127.0.0.1", port), log_level="warning")


@contextlib.contextmanager
def served(scenario: AwmScenario, bundle: Bundle) -> Iterator[dict[str, str]]:
    """The servers of `scenario`'s app started, each in a process of its own: their MCP URLs, by
    name (worldsmith: the gateway serving `bundle`; reference: the SDK's server, the app in-process;
    floor: canned answers, `FLOOR_SERVER`)."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "bundle.pickle").write_bytes(pickle.dumps(bundle))
        (root / "awm_app.py").write_text(scenario.app)
        read_path = next(
            e["path"] for g in scenario.spec["api_groups"] for e in g["endpoints"] if e["operation_id"] == READ[0]
        )
        (root / "reference_server.py").write_text(REFERENCE_SERVER.replace("PATH", repr(read_path)))
        (root / "world.db").write_bytes(bundle.world)
        (root / "floor_server.py").write_text(FLOOR_SERVER)
        ours_port, theirs_port, floor_port = _free_port(), _free_port(), _free_port()
        ours = subprocess.Popen(
            [sys.executable, __file__, "--serve-worldsmith", str(root / "bundle.pickle"), "--port", str(ours_port)]
        )
        theirs = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "reference_server:app", "--port", str(theirs_port)]
            + ["--log-level", "warning", "--no-access-log"],
            cwd=root,
            env={**os.environ, "DATABASE_PATH": f"sqlite:///{root / 'world.db'}"},
        )
        floor = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "floor_server:app", "--port", str(floor_port)]
            + ["--log-level", "warning", "--no-access-log"],
            cwd=root,
        )
        try:
            _wait_for(ours_port, ours)
            _wait_for(theirs_port, theirs)
            _wait_for(floor_port, floor)
            yield {
                "worldsmith": f"http://127.0.0.1:{ours_port}/envs/{bundle.env_id}/mcp",
                "reference": f"http://127.0.0.1:{theirs_port}/mcp",
                "floor": f"http://127.0.0.1:{floor_port}/mcp",
            }
        finally:
            for process in (ours, theirs, floor):
                process.terminate()
                process.wait(30)


def imported_world(release: Path) -> tuple[AwmScenario, Bundle]:
    """The first scenario of AWM release folder `release` and its imported bundle."""
    from worldsmith.interop.awm import import_scenario, read_release
    from worldsmith.runtime.episode import Runtime

    scenario = read_release(release)[0]
    with Runtime(workers=1) as runtime:
        bundle = import_scenario(scenario, runtime).bundle
    assert bundle is not None
    return scenario, bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, default=REPO / "tests" / "data" / "awm_format_sample")
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--serve-worldsmith", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worldsmith:
        serve_worldsmith(args.serve_worldsmith, args.port)
        return

    if args.sessions < 1:
        parser.error("--sessions must be at least 1")
    from worldsmith.interop.awm import AwmFormatError

    try:
        scenario, bundle = imported_world(args.release)
    except AwmFormatError as exc:
        parser.error(str(exc))
    with served(scenario, bundle) as urls:
        figures = measure(urls, args.sessions)
    ratios = {key: figures["worldsmith"][key] / figures["reference"][key] for key in figures["worldsmith"]}
    floors = {key: figures["floor"][key] / figures["reference"][key] for key in figures["floor"]}
    for key in ("light_open_ms", "light_read_ms"):
        print(
            f"  light client, {'the session opened' if key == 'light_open_ms' else 'its one read'}: worldsmith "
            f"{figures['worldsmith'][key]:7.2f} ms, reference {figures['reference'][key]:7.2f} ms, x{ratios[key]:.2f}"
        )
    for key, ratio in ratios.items():
        if key in ("light_open_ms", "light_read_ms"):
            continue
        print(
            f"new session + one read, {key[:-3]:>8} client: worldsmith {figures['worldsmith'][key]:7.2f} ms, "
            f"reference {figures['reference'][key]:7.2f} ms, x{ratio:.2f} (target <= 0.5; the floor "
            f"{figures['floor'][key]:.2f} ms, x{floors[key]:.2f})"
        )
    print(
        json.dumps(
            {
                **figures,
                "ratio_worldsmith_over_reference": ratios,
                "ratio_floor_over_reference": floors,
                "sessions": args.sessions,
            }
        )
    )


if __name__ == "__main__":
    main()
