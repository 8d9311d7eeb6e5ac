"""MCP gateway: one streamable-HTTP MCP server hosting many environments.

Each environment is served at `/envs/<env_id>/mcp`; each MCP session is one isolated episode
(its task chosen with `?task=<id>` when connecting), opened at `initialize` and closed when the
client ends the session or it stays idle past the limit. Agents see the tools only: verifiers,
rewards and other sessions are not reachable through it.

A hostile environment is answered, never a traceback: an episode that cannot open (tools refused
at import, source too deep to compile, a worker lost) is an MCP error on `initialize`, and a call
that fails in the runtime (a worker that keeps dying, a result too deep to send) is a tool error
result; both say why in one line (`worldsmith/runtime/answers.py`), and the session and the server go on.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self

import anyio
import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import worldsmith
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.jsonvalues import TooDeep, check_nesting
from worldsmith.models.results import ToolResult
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode, Runtime

EPISODE_KEY = "worldsmith.episode"


def _connection(ctx: ServerRequestContext) -> Any:
    # mcp 2.3 keeps the per-session Connection (session_id, state, exit_stack) only on a private
    # attribute of the per-request ServerSession; pinned in requirements.lock.
    return ctx.session._connection


async def _sessions_only(ctx: ServerRequestContext, call_next: Callable[[ServerRequestContext], Awaitable[Any]]) -> Any:
    """Refuse the stateless protocol era: an episode needs a session. Clients in `auto` mode fall
    back to the `initialize` handshake."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        raise MCPError(
            code=UNSUPPORTED_PROTOCOL_VERSION,
            message="worldsmith episodes need a session: use a handshake protocol version",
            data={"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": ctx.protocol_version},
        )
    return await call_next(ctx)


def tool_result_to_mcp(result: ToolResult) -> types.CallToolResult:
    """What the agent sees of a tool call: the JSON value, or an error text (is_error). A value
    nested deeper than the sandbox lets results nest (only a reply forged past the worker's own
    check could carry one) is an environment error, before any recursive encoder sees it."""
    if result.ok:
        try:
            check_nesting(result.value)
        except TooDeep as exc:
            return runtime_error_to_mcp(exc)
        structured = result.value if isinstance(result.value, dict) else {"result": result.value}
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(result.value))], structured_content=structured
        )
    prefix = "error" if result.status == "tool_error" else "environment error"
    return types.CallToolResult(content=[types.TextContent(text=f"{prefix}: {result.error}")], is_error=True)


def runtime_error_to_mcp(exc: Exception) -> types.CallToolResult:
    """A call the runtime could not answer with a result, as a tool error result saying why."""
    line = answer(exc) or f"{type(exc).__name__}: {exc}"
    return types.CallToolResult(content=[types.TextContent(text=f"environment error: {one_line(line)}")], is_error=True)


def _refused_episode(env_id: str, exc: Exception) -> MCPError | None:
    """The MCP error answering an episode of `env_id` that could not open, or None for an exception
    bad input cannot cause (a bug: it propagates)."""
    line = answer(exc)
    if line is None:
        return None
    return MCPError(code=INTERNAL_ERROR, message=one_line(f"{env_id}: cannot open an episode: {line}"))


class Gateway:
    """The gateway's state: hosted bundles, one MCP server and session manager per env, live sessions."""

    def __init__(
        self, runtime: Runtime, bundles: list[Bundle], *, session_idle_s: float = 900.0, max_sessions: int = 4096
    ):
        ids = [b.env_id for b in bundles]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"two bundles with the same env_id: {', '.join(duplicates)}")
        self.runtime = runtime
        self.bundles = {b.env_id: b for b in bundles}
        self.sessions: dict[str, Episode] = {}
        self.managers = {
            env_id: StreamableHTTPSessionManager(
                app=self._server(bundle),
                stateless=False,
                session_idle_timeout=session_idle_s,
                max_sessions=max_sessions,
            )
            for env_id, bundle in self.bundles.items()
        }

    def _server(self, bundle: Bundle) -> Server:
        tools = [types.Tool(name=t.name, description=t.description, input_schema=t.parameters) for t in bundle.tools]

        async def open_episode(
            ctx: ServerRequestContext, call_next: Callable[[ServerRequestContext], Awaitable[Any]]
        ) -> Any:
            if ctx.method == "initialize":
                connection = _connection(ctx)
                task_id = ctx.request.query_params.get("task") if ctx.request is not None else None
                if task_id is not None and task_id not in {t.id for t in bundle.tasks}:
                    raise MCPError(code=INVALID_PARAMS, message=f"{bundle.env_id} has no task {task_id!r}")
                try:
                    episode = await anyio.to_thread.run_sync(self.runtime.open_episode, bundle, task_id)
                except Exception as exc:  # what a hostile environment can cause is answered
                    refusal = _refused_episode(bundle.env_id, exc)
                    if refusal is None:
                        raise
                    raise refusal from None
                connection.state[EPISODE_KEY] = episode
                session_id = connection.session_id
                self.sessions[session_id] = episode

                async def close_episode() -> None:
                    try:
                        await anyio.to_thread.run_sync(episode.close)
                    finally:
                        self.sessions.pop(session_id, None)

                connection.exit_stack.push_async_callback(close_episode)
            return await call_next(ctx)

        async def list_tools(
            ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=tools)

        async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
            episode: Episode | None = _connection(ctx).state.get(EPISODE_KEY)
            if episode is None:
                raise MCPError(code=INVALID_PARAMS, message="no episode for this session; reconnect")
            try:
                result = await anyio.to_thread.run_sync(episode.call_tool, params.name, params.arguments or {})
            except Exception as exc:  # the runtime's refusals, answered like a failed call
                if answer(exc) is None:
                    raise
                return runtime_error_to_mcp(exc)
            return tool_result_to_mcp(result)

        server = Server(
            f"worldsmith/{bundle.env_id}",
            version=worldsmith.__version__,
            on_list_tools=list_tools,
            on_call_tool=call_tool,
        )
        server.middleware.append(_sessions_only)
        server.middleware.append(open_episode)
        return server

    async def _index(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {"envs": {env_id: f"/envs/{env_id}/mcp" for env_id in self.bundles}, "sessions": len(self.sessions)}
        )

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with contextlib.AsyncExitStack() as stack:
                for manager in self.managers.values():
                    await stack.enter_async_context(manager.run())
                yield

        routes = [
            Route(f"/envs/{env_id}/mcp", endpoint=StreamableHTTPASGIApp(m)) for env_id, m in self.managers.items()
        ]
        routes.append(Route("/envs", endpoint=self._index))
        routes.append(Route("/healthz", endpoint=lambda request: JSONResponse({"ok": True})))
        return Starlette(routes=routes, lifespan=lifespan)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """Run an ASGI app under uvicorn in a thread (tests, benchmarks, the demo); `url` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, daemon=True, name="worldsmith-gateway")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


def serve(
    runtime: Runtime, bundles: list[Bundle], host: str, port: int, *, session_idle_s: float, max_sessions: int
) -> None:
    """Serve `bundles` until interrupted."""
    gateway = Gateway(runtime, bundles, session_idle_s=session_idle_s, max_sessions=max_sessions)
    uvicorn.run(gateway.app(), host=host, port=port, log_level="info")
