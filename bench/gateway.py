"""Gateway throughput: MCP tool calls per second and their latency at 1, 8, 32 and 128 concurrent sessions.

    .venv/bin/python bench/gateway.py [--seconds S] [--sessions 1,8,32,128] [--workers N] [--servers ...]
        [--processes 1,2] [--second-connection F]

Servers of the same `echo` tool, measured in this same run:
- sdk: the bare `mcp` SDK (MCPServer) serving an equivalent echo tool over streamable HTTP, as it comes
  (answers as SSE streams); sdk-json: the same in the SDK's JSON-response mode (the gateway's mode);
- gateway: the worldsmith gateway as `worldsmith env serve` runs it (serving/gateway.py `serve`), the
  tool sandboxed in a runtime of `--workers` workers; with `--processes 1,2`, also gateway-2p: `env serve
  --processes 2` (serving/supervisor.py: two gateway processes on one port, each with a runtime of
  `--workers` workers, sessions kept by the process that opened them, serving/affinity.py);
- runtime: no HTTP, no MCP: threads calling the sandboxed tool through in-process Runtime episodes
  (bench/runtime_load.py's `runtime_calls_per_second`).

Each server runs in a process of its own (the runtime in this one); the load comes from this process,
speaking MCP on the wire (one keep-alive HTTP/1.1 connection per session, JSON-RPC written and read by
hand) so the load generator costs little CPU next to the servers. Each session is opened
(`initialize`, `notifications/initialized`), then calls `echo` in a loop for `--seconds`. The kernel pins
a connection to one gateway process; with `--second-connection F` a fraction F of the sessions alternate
their requests over two keep-alive connections (as the official client spreads a session over a POST and
a GET connection): a request arriving at a process that does not own its session is forwarded to the
owner, and the share forwarded is printed with the multi-process gateway's figures.

With `--worlds N` it measures instead a gateway of N published worlds (copies of the golden bundle,
published to a catalog in a fresh WORLDSMITH_HOME, one set of them): `worldsmith env serve --set` start-up
time and RSS, then a session on each of `--touch` worlds (cold: the world loads; `--max-loaded` bounds the
loaded ones), the RSS after and the worlds still loaded.

Prints one line per server and level (calls/s, p50/p99 latency, server CPU per call: its process (each
gateway process, for gateway-Np), and its sandbox workers), the ratios against the SDK (and of gateway-Np
against the one-process gateway) at each level, then a JSON object with every figure.
`--profile FILE` also writes a cProfile of the gateway process (its event loop thread) to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from echo_world import ECHO_ENV, GOLDEN, counts, echo_world, sdk_echo_app

from worldsmith.bundle.loader import load_bundle
from worldsmith.localserver import free_port
from worldsmith.runtime.episode import Runtime
from worldsmith.serving.affinity import Member

PROTOCOL = "2025-11-25"  # a handshake-era protocol version: a session per client


class WireSession:
    """One MCP session over keep-alive HTTP/1.1 connections (one, or `connections` taken in turn by its
    requests), JSON-RPC over streamable HTTP spoken by hand (answers as JSON or as an SSE stream,
    whichever the server sends)."""

    def __init__(self, port: int, path: str, connections: int = 1, *, landing: bool = False):
        self.port = port
        self.path = path
        self.connections = connections
        self.landing = landing
        self.session_id: str | None = None
        self.forwarded = False  # whether the last request went through a process that does not own the session
        self._next_id = 0
        self._turn = 0
        self._streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._landed: list[int] = []  # with `landing`: the gateway process each connection reached

    async def open(self) -> None:
        for _ in range(self.connections):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            self._streams.append((reader, writer))
            if self.landing:  # which gateway process the kernel gave this connection to (it stays there)
                writer.write(f"GET /envs HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode())
                self._landed.append(json.loads((await self._response(reader))[1])["process"])
        params = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
        await self.request("initialize", params)
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The JSON-RPC response to one request (an AssertionError unless it is a result)."""
        self._next_id += 1
        status, body = await self._post({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        message = _message(body)
        assert status == 200 and "result" in message, (status, body[:300])
        return message["result"]

    async def _post(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        body = json.dumps(payload).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nMcp-Protocol-Version: {PROTOCOL}\r\n"
        )
        if self.session_id is not None:
            head += f"Mcp-Session-Id: {self.session_id}\r\n"
        reader, writer = self._next_stream()
        writer.write(head.encode() + b"\r\n" + body)
        return await self._response(reader)

    def _next_stream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self._turn += 1
        index = self._turn % len(self._streams) if self.session_id else 0
        if self._landed and self.session_id:
            self.forwarded = self._landed[index] != int(self.session_id.partition("-")[0])
        return self._streams[index]

    async def _response(self, reader: asyncio.StreamReader) -> tuple[int, bytes]:
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        self.session_id = headers.get("mcp-session-id", self.session_id)
        if "content-length" in headers:
            return status, await reader.readexactly(int(headers["content-length"]))
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
        return status, b"".join(chunks)

    async def end(self) -> None:
        """End the session (DELETE), then close the connection."""
        head = (
            f"DELETE {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nMcp-Session-Id: {self.session_id}\r\n\r\n"
        )
        reader, writer = self._next_stream()
        writer.write(head.encode())
        await self._response(reader)
        await self.close()

    async def close(self) -> None:
        for _, writer in self._streams:
            writer.close()


def _message(body: bytes) -> dict[str, Any]:
    """The JSON-RPC message of a response body: JSON, or the `data:` line of an SSE event that has an id."""
    if body.startswith(b"{"):
        return json.loads(body)
    for line in body.splitlines():
        if line.startswith(b"data:") and len(line) > 6:
            message = json.loads(line[5:])
            if "id" in message:
                return message
    raise AssertionError(f"no JSON-RPC response in {body[:300]!r}")


@dataclass
class Level:
    """One server at one level of concurrency."""

    server: str
    sessions: int
    calls: int
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    open_ms: float | None  # mean time to open a session (initialize + initialized)
    server_cpu_ms_per_call: float | None = None  # the server's own process
    workers_cpu_ms_per_call: float | None = None  # its sandbox workers and their processes
    cpu_ms_per_call_all: float | None = None  # the runtime: its process, workers and their processes
    client_cpu_ms_per_call: float | None = None  # this process, generating the load
    failed_sessions: int = 0  # sessions a failed request ended before the time was up
    processes_cpu_ms_per_call: list[float] = field(default_factory=list)  # each gateway process (gateway-Np)
    forwarded_share: float | None = None  # gateway-Np: session requests forwarded to their owner / all
    p50_ms_direct: float | None = None  # gateway-Np: calls answered by the process the connection reached
    p50_ms_forwarded: float | None = None  # gateway-Np: calls that process forwarded to the session's owner

    def line(self) -> str:
        cpu = opening = ""
        if self.server_cpu_ms_per_call is not None:
            server, workers = self.server_cpu_ms_per_call, self.workers_cpu_ms_per_call
            cpu = f", CPU/call server {server:.2f} ms + workers {workers:.2f} ms"
        if self.processes_cpu_ms_per_call:
            cpu += " (by process " + " + ".join(f"{ms:.2f}" for ms in self.processes_cpu_ms_per_call) + " ms)"
        if self.forwarded_share is not None:
            cpu += f", forwarded {self.forwarded_share:.0%}"
        if self.p50_ms_forwarded is not None:
            cpu += f" (p50 {self.p50_ms_forwarded:.2f} ms against {self.p50_ms_direct:.2f} ms direct)"
        if self.cpu_ms_per_call_all is not None:
            cpu = f", CPU/call all processes {self.cpu_ms_per_call_all:.2f} ms"
        if self.open_ms is not None:
            opening = f", open {self.open_ms:6.1f} ms"
        return (
            f"{self.server:10s} {self.sessions:4d} sessions: {self.calls_per_s:8.0f} calls/s, "
            f"p50 {self.p50_ms:7.2f} ms, p99 {self.p99_ms:7.2f} ms{opening}{cpu}"
            + (f"; {self.failed_sessions} sessions ended by a failed request" if self.failed_sessions else "")
        )


def _cpu(processes: list[psutil.Process], *, reaped: bool = True) -> float:
    """CPU seconds of `processes`, and with `reaped` of their children that ended and were waited for."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
        if reaped:
            total += times.children_user + times.children_system
    return total


class Served:
    """A server process of this script (`--serve KIND`) on a loopback port; CPU of it and of its children.
    With `processes` > 1 (a gateway) that process is the supervisor of `processes` gateway processes."""

    def __init__(self, kind: str, args: argparse.Namespace, processes: int = 1):
        self.port = free_port()
        self.processes = processes
        self.run_dir = Path(tempfile.mkdtemp(prefix="worldsmith-bench-gateway-"))
        command = [sys.executable, __file__, "--serve", kind, "--port", str(self.port), "--workers", str(args.workers)]
        command += ["--processes", str(processes), "--run-dir", str(self.run_dir)]
        command += ["--profile", args.profile] if args.profile and kind == "gateway" and processes == 1 else []
        path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(command, env=dict(os.environ, PYTHONPATH=path))
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} server did not start") from None
                time.sleep(0.1)
        self.root = psutil.Process(self.proc.pid)
        self.members = [Member(i, processes, self.run_dir) for i in range(processes)] if processes > 1 else []
        while self.members and not all(m.socket_path().exists() for m in self.members):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} server processes did not start") from None
            time.sleep(0.1)
        self.servers = [self.root, *(self.root.children() if self.members else [])]

    def cpu(self) -> tuple[float, float, list[float]]:
        """CPU seconds so far of the server processes (the supervisor and its gateway processes), of
        everything below them (sandbox workers), and of each gateway process of a supervisor."""
        times = [p.cpu_times() for p in self.servers]
        own = [t.user + t.system for t in times]
        reaped = sum(t.children_user + t.children_system for t in times)  # workers that ended: their server's
        below = [p for p in self.root.children(recursive=True) if p not in self.servers]
        return sum(own), _cpu(below) + reaped, own[1:]

    def forwarding(self) -> tuple[int, int]:
        """Session requests forwarded by the gateway processes so far, and answered by their owners."""
        import httpx

        forwarded = answered = 0
        for member in self.members:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(member.socket_path()))) as http:
                index = http.get("http://gateway/envs").json()
            forwarded += index["session_requests_forwarded"]
            answered += index["session_requests_answered"]
        return forwarded, answered

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.run_dir, ignore_errors=True)


async def _over_the_wire(
    port: int, path: str, sessions: int, seconds: float, second_connection: float = 0.0, forwarded: list | None = None
) -> tuple[list[float], list[float], int]:
    """Call latencies of `sessions` sessions calling `echo` for `seconds`, their opening times, and how
    many sessions a failed request ended (its connection closed, an error answered). A fraction
    `second_connection` of the sessions take two connections in turn. With `forwarded` (a list: a
    multi-process gateway), the latencies of calls forwarded to their session's owner are put there
    instead."""
    opening = asyncio.Semaphore(16)
    opened: list[float] = []
    split = round(sessions * second_connection)

    async def opened_session(number: int) -> WireSession:
        async with opening:
            session = WireSession(port, path, connections=2 if number < split else 1, landing=forwarded is not None)
            start = time.perf_counter()
            await session.open()
            opened.append(time.perf_counter() - start)
            return session

    all_sessions = await asyncio.gather(*(opened_session(n) for n in range(sessions)))
    latencies: list[float] = []
    failed: list[BaseException] = []
    loop = asyncio.get_running_loop()
    warm_until = loop.time() + min(1.0, seconds / 4)
    stop = warm_until + seconds

    async def calling(session: WireSession) -> None:
        index = 0
        while (now := loop.time()) < stop:
            index += 1
            start = time.perf_counter()
            try:
                result = await session.request("tools/call", {"name": "echo", "arguments": {"text": f"hello {index}"}})
                assert not result.get("isError"), result
            except (AssertionError, OSError, asyncio.IncompleteReadError) as exc:
                failed.append(exc)
                return
            if now >= warm_until:
                (forwarded if session.forwarded else latencies).append(time.perf_counter() - start)

    await asyncio.gather(*(calling(s) for s in all_sessions))
    for session in all_sessions:
        await session.close()
    return latencies, opened, len(failed)


def _level(server: str, sessions: int, latencies: list[float], seconds: float, opened: list[float]) -> Level:
    ordered = sorted(latencies) or [math.nan]  # no call answered: no latency
    return Level(
        server=server,
        sessions=sessions,
        calls=len(latencies),
        calls_per_s=len(latencies) / seconds,
        p50_ms=statistics.median(ordered) * 1e3,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
        open_ms=statistics.fmean(opened) * 1e3,
    )


def bench_http(kind: str, path: str, args: argparse.Namespace, levels: list[int], processes: int = 1) -> list[Level]:
    served = Served(kind, args, processes)
    name = kind if processes == 1 else f"{kind}-{processes}p"
    results = []
    try:
        for sessions in levels:
            server_before, workers_before, each_before = served.cpu()
            forwarded_before, answered_before = served.forwarding()
            client_before = time.process_time()
            forwarded: list[float] | None = [] if served.members else None
            measured = _over_the_wire(served.port, path, sessions, args.seconds, args.second_connection, forwarded)
            latencies, opened, failed = asyncio.run(measured)
            server_after, workers_after, each_after = served.cpu()
            forwarded_after, answered_after = served.forwarding()
            level = _level(name, sessions, latencies + (forwarded or []), args.seconds, opened)
            if forwarded:  # calls through a process that does not own their session, against the others
                level.p50_ms_direct = _level(name, sessions, latencies, args.seconds, opened).p50_ms
                level.p50_ms_forwarded = _level(name, sessions, forwarded, args.seconds, opened).p50_ms
            level.failed_sessions = failed
            # CPU over the whole level (opening and warm-up included) per call measured: an upper bound
            calls = max(level.calls, 1)
            level.server_cpu_ms_per_call = (server_after - server_before) / calls * 1e3
            level.workers_cpu_ms_per_call = (workers_after - workers_before) / calls * 1e3
            level.processes_cpu_ms_per_call = [
                (a - b) / calls * 1e3 for a, b in zip(each_after, each_before, strict=True)
            ]
            if served.members:
                level.forwarded_share = (forwarded_after - forwarded_before) / max(answered_after - answered_before, 1)
            level.client_cpu_ms_per_call = (time.process_time() - client_before) / calls * 1e3
            print(level.line(), flush=True)
            results.append(level)
    finally:
        served.close()
    return results


def bench_runtime(args: argparse.Namespace, levels: list[int]) -> list[Level]:
    """Threads of this process calling `echo` through Runtime episodes, one episode per thread
    (bench/runtime_load.py's measurement)."""
    from runtime_load import runtime_calls_per_second

    world = echo_world(load_bundle(GOLDEN))
    results = []
    with Runtime(workers=args.workers) as runtime:
        for sessions in levels:
            measured = runtime_calls_per_second(
                runtime, world, sessions, seconds=args.seconds, call=("echo", {"text": "hello"})
            )
            level = Level(
                server="runtime",
                sessions=sessions,
                calls=measured["calls"],
                calls_per_s=measured["calls_per_second"],
                p50_ms=measured["p50_ms"],
                p99_ms=measured["p99_ms"],
                open_ms=None,
                cpu_ms_per_call_all=measured["cpu_us_per_call"] / 1e3,
            )
            print(level.line(), flush=True)
            results.append(level)
    return results


def _tree_rss(pid: int) -> float:
    """MiB resident in process `pid` and everything below it."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def bench_many_worlds(count: int, touch: int, max_loaded: int, workers: int) -> dict[str, float]:
    """`env serve --set` over `count` published worlds: start-up, RSS, then `touch` of them used once."""
    import dataclasses
    import tempfile

    import httpx

    from worldsmith.settings import get_settings
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import open_store
    from worldsmith.storage.publish import publish
    from worldsmith.storage.sets import SetQuery, create_set

    home = tempfile.mkdtemp(prefix="worldsmith-bench-worlds-")
    env = dict(os.environ, WORLDSMITH_HOME=home, WORLDSMITH_SANDBOX_WORKERS=str(workers))
    os.environ["WORLDSMITH_HOME"] = home
    get_settings.cache_clear()
    golden = load_bundle(GOLDEN)
    store, catalog = open_store(get_settings().resolved_store_url()), open_catalog()
    start = time.perf_counter()
    names = [f"world_{i:05d}" for i in range(count)]
    for name in names:  # the golden bundle renamed: same files, its own env_id and content key
        renamed = dataclasses.replace(golden, manifest=golden.manifest.model_copy(update={"env_id": name}), root=None)
        publish(renamed, store, catalog)
    create_set(catalog, "bench_worlds", SetQuery(validation_fraction=0.0))
    create_set(catalog, "bench_one", SetQuery(validation_fraction=0.0, env_ids=names[:1]))
    print(f"published {count} worlds and a set of them in {time.perf_counter() - start:.1f} s", flush=True)

    def serving(set_name: str) -> tuple[subprocess.Popen, int, float]:
        """`env serve --set set_name` started; its port and how long it took to answer /healthz."""
        port = free_port()
        command = [sys.executable, "-m", "worldsmith.cli", "env", "serve", "--set", set_name, "--port", str(port)]
        start = time.perf_counter()
        log = open(os.path.join(home, f"serve-{set_name}.log"), "w")  # noqa: SIM115 (the process holds it)
        proc = subprocess.Popen([*command, "--max-loaded", str(max_loaded)], env=env, stdout=log, stderr=log)
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return proc, port, time.perf_counter() - start
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise RuntimeError(f"env serve did not start: see {log.name}") from None
                time.sleep(0.05)

    one, _, one_s = serving("bench_one")
    one_rss = _tree_rss(one.pid)
    one.send_signal(signal.SIGINT)
    one.wait(timeout=60)
    proc, port, started_s = serving("bench_worlds")
    url = f"http://127.0.0.1:{port}"
    try:
        index = httpx.get(f"{url}/envs").json()
        assert len(index["envs"]) == count, len(index["envs"])
        rss_start = _tree_rss(proc.pid)

        async def use(env_id: str) -> tuple[float, float]:
            session = WireSession(port, f"/envs/{env_id}/mcp")
            begin = time.perf_counter()
            await session.open()
            opened = time.perf_counter() - begin
            await session.request("tools/call", {"name": "get_customer", "arguments": {"customer_id": 1}})
            await session.end()
            return opened, time.perf_counter() - begin

        cold = [asyncio.run(use(name)) for name in names[:touch]]
        warm = [asyncio.run(use(names[touch - 1])) for _ in range(5)]  # loaded, its sandbox worker bound
        index = httpx.get(f"{url}/envs").json()
        figures = {
            "worlds": count,
            "startup_one_world_s": one_s,
            "rss_one_world_mib": one_rss,
            "startup_s": started_s,
            "rss_start_mib": rss_start,
            "touched": touch,
            "rss_after_touch_mib": _tree_rss(proc.pid),
            "loaded_after_touch": len(index["loaded"]),
            "max_loaded": max_loaded,
            "first_session_cold_ms": statistics.median(c[0] for c in cold) * 1e3,
            "first_session_warm_ms": statistics.median(w[0] for w in warm) * 1e3,
        }
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    print(
        f"env serve --set of 1 world: up in {one_s:.2f} s, RSS {one_rss:.0f} MiB; of {count} worlds: up in "
        f"{figures['startup_s']:.2f} s, RSS {figures['rss_start_mib']:.0f} MiB; "
        f"after a session on each of {touch}: RSS {figures['rss_after_touch_mib']:.0f} MiB (server and sandbox "
        f"workers), {figures['loaded_after_touch']} loaded (bound {max_loaded}); opening a session "
        f"{figures['first_session_cold_ms']:.0f} ms on a world not loaded, {figures['first_session_warm_ms']:.0f} ms "
        "on a loaded one",
        flush=True,
    )
    return figures


def serve(args: argparse.Namespace) -> None:
    """Serve the echo tool on `--port` until SIGINT/SIGTERM (this script's server processes): a gateway
    of `--processes` > 1 is a supervisor (serving/supervisor.py) of gateway processes run as `--member`."""
    import uvicorn

    kind, port, workers, profile = args.serve, args.port, args.workers, args.profile
    if kind.startswith("sdk"):
        app = sdk_echo_app(json_response=kind == "sdk-json")
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        return
    from worldsmith.serving.gateway import Gateway
    from worldsmith.serving.gateway import serve as serve_gateway
    from worldsmith.serving.supervisor import listener, serve_member, supervise

    if args.processes > 1 and args.member is None:
        command = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--workers", str(workers)]
        sys.exit(supervise([*command, "--processes", str(args.processes)], args.processes, run_dir=args.run_dir))
    world = echo_world(load_bundle(GOLDEN))
    with Runtime(workers=workers) as runtime:
        gateway = Gateway(runtime, [world], member=Member.parse(args.member) if args.member else None)
        if gateway.member is not None:
            serve_member(gateway.app(), gateway.member, "127.0.0.1", port, log_level="warning")
            return
        if profile is None:
            serve_gateway(gateway, listener("127.0.0.1", port), log_level="warning")
            return
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        try:
            serve_gateway(gateway, listener("127.0.0.1", port), log_level="warning")
        finally:
            profiler.disable()
            profiler.dump_stats(profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="Measured seconds per server and level.")
    parser.add_argument("--sessions", type=counts, default=[1, 8, 32, 128], help="Levels of concurrent sessions.")
    parser.add_argument("--workers", type=int, default=2, help="Sandbox workers of the gateway and of the runtime.")
    parser.add_argument("--servers", default="sdk,sdk-json,gateway,runtime", help="Which to measure (ratios: vs sdk).")
    parser.add_argument("--profile", help="Write a cProfile of the gateway process here.")
    parser.add_argument("--worlds", type=int, help="Measure a gateway of this many published worlds instead.")
    parser.add_argument("--touch", type=int, default=50, help="With --worlds: worlds given a session each.")
    parser.add_argument("--max-loaded", type=int, default=16, help="With --worlds: the gateway's bound.")
    parser.add_argument(
        "--processes",
        type=counts,
        default=[1],
        help="Gateway process counts to measure (2: gateway-2p, env serve --processes 2).",
    )
    parser.add_argument(
        "--second-connection",
        type=float,
        default=0.0,
        help="Fraction of sessions taking two keep-alive connections in turn (their requests may be forwarded).",
    )
    parser.add_argument("--serve", choices=("gateway", "sdk", "sdk-json"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--member", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        args.processes = args.processes[0]
        serve(args)
        return
    if args.worlds:
        print(json.dumps(bench_many_worlds(args.worlds, args.touch, args.max_loaded, args.workers)))
        return
    levels = args.sessions
    servers = args.servers.split(",")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.seconds:g} s per level", flush=True)
    results: dict[str, list[Level]] = {}
    for kind in ("sdk", "sdk-json"):
        if kind in servers:
            results[kind] = bench_http(kind, "/mcp", args, levels)
    if "gateway" in servers:
        for processes in args.processes:
            measured = bench_http("gateway", f"/envs/{ECHO_ENV}/mcp", args, levels, processes)
            results[measured[0].server] = measured
    if "runtime" in servers:
        results["runtime"] = bench_runtime(args, levels)
    ratios: dict[str, dict[str, float]] = {}
    if "sdk" in results:
        for name in (n for n in results if n != "sdk"):
            for ours, sdk in zip(results[name], results["sdk"], strict=True):
                ratio = ours.calls_per_s / sdk.calls_per_s if sdk.calls_per_s else math.inf
                ratios.setdefault(name, {})[str(ours.sessions)] = round(ratio, 3)
                print(f"{name} / sdk at {ours.sessions} sessions: x{ratio:.2f} calls/s", flush=True)
    for name in (n for n in results if n.startswith("gateway-") and "gateway" in results):
        for ours, single in zip(results[name], results["gateway"], strict=True):
            ratio = ours.calls_per_s / single.calls_per_s if single.calls_per_s else math.inf
            ratios.setdefault(f"{name}/gateway", {})[str(ours.sessions)] = round(ratio, 3)
            print(f"{name} / gateway at {ours.sessions} sessions: x{ratio:.2f} calls/s", flush=True)
    figures = {
        name: [{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(level).items()} for level in levels_]
        for name, levels_ in results.items()
    }
    print(json.dumps({"levels": figures, "ratios": ratios}))


if __name__ == "__main__":
    main()
