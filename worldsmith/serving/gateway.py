"""MCP gateway: one streamable-HTTP MCP server hosting many environments.

Each environment is served at `/envs/<env_id>/mcp` (routed by a dict lookup on env_id). The worlds are
named up front (`serving/worlds.py`: bundles, directories, catalog refs, set members) and loaded at
their first session or task listing; past `max_loaded` loaded worlds, the least recently used world
with no open episode and no request in flight is unloaded (its MCP server stopped, its bundle dropped).
Answers are JSON bodies (the SDK's JSON-response mode), not SSE streams; a `tools/call` in an established
session is answered by the gateway itself (`serving/hotpath.py`), every other request by the MCP SDK.
Each loaded world has lanes of gateway threads of its own (serving/lanes.py): a slow or busy world's
calls wait, or past its limits are refused, without holding up another world's requests, and its
`initialize` and `tools/list` never wait behind its tool calls. Each MCP session is one isolated
episode (its task chosen with `?task=<id>` when connecting), opened at `initialize` and closed when
the client ends the session or it has no request in flight for the idle limit (the gateway expires idle sessions itself, counting hot-path calls as activity). Agents see the
tools (described as `serving/mcp_tools.py` says: schemas and observed behaviour hints), the bound task's instruction
(the `instructions` of `initialize` and prompt `task`) and the task list (resource
`worldsmith://<env_id>/tasks`, and `GET /envs/<env_id>/tasks` for harnesses choosing a task before
they connect); verifiers, rewards and other sessions are not reachable through it. A gateway made
with `verdicts=True` adds a `submit` tool to task-bound sessions: the final answer, judged as an
evaluation judges it (the task's verifier, then the side-effect guard), returned with its reward and
evidence; the episode then closes.

Who may call is checked first (serving/access.py): a Host naming this gateway (loopback names by
default), a browser Origin of its own, and the bearer token when one is set.

A hostile environment is answered, never a traceback: an episode that cannot open (tools refused
at import, source too deep to compile, a worker lost) is an MCP error on `initialize`, and a call
that fails in the runtime (a worker that keeps dying, a result too deep to send) is a tool error
result; both say why in one line (`worldsmith/runtime/answers.py`), and the session and the server go on.

This module holds the gateway's state (the worlds it serves and has loaded, its live sessions), its
HTTP routes and `serve`. Its parts: a loaded world (served_world.py), the MCP server of one world
(world_server.py), a session's record and expiry (sessions.py), the `submit` tool (submit.py), and
tool results as MCP answers them (mcp_results.py).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence

import anyio
import anyio.abc
import uvicorn
from mcp.server import Server
from mcp_types import INTERNAL_ERROR
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle
from worldsmith.failures import UserFixable
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode, Runtime
from worldsmith.serving import hotpath
from worldsmith.serving.access import Access
from worldsmith.serving.affinity import Member
from worldsmith.serving.lanes import WORLD_BUSY, ServingLimits, WorldBusy
from worldsmith.serving.mcp_results import JsonAnswer, call_json
from worldsmith.serving.openenv import openenv_routes
from worldsmith.serving.served_world import ServedWorld, WorldUnavailable
from worldsmith.serving.sessions import SUBMITTED_KEY, LiveSession, expire_idle_sessions
from worldsmith.serving.submit import SUBMIT_TOOL, is_submit, submit_clash
from worldsmith.serving.world_server import task_listing, world_server
from worldsmith.serving.worlds import WorldSource

logger = logging.getLogger(__name__)


class GatewayRefused(UserFixable, ValueError):
    """Bundles a gateway cannot serve together (the message names the fix)."""


class Gateway:
    """The gateway's state: the worlds it serves, by env_id, those loaded (at most `max_loaded` while
    idle ones can be unloaded), and the live sessions. `worlds`: bundles in memory, or `WorldSource`s
    loaded at their first session or task listing. `verdicts`: task-bound sessions get the `submit` tool.
    Refuses (GatewayRefused) two worlds of one env_id, and with `verdicts` a bundle given in memory with a
    tool of its own named `submit` (a world loaded later with one answers its sessions with an error).
    `member`: this gateway is one of several processes serving one port (serving/affinity.py); its
    sessions, loaded worlds and bounds (`max_sessions`, `max_loaded`, idle expiry) are its own, and `/envs`
    reports its process index and this process's sessions. `access`: who may call (default: clients
    naming a loopback address, without a token). `limits`: how much of the gateway one world may hold
    (serving/lanes.py; default: the settings). `openenv`: each world is also an OpenEnv environment server
    at `/envs/<env_id>` (serving/openenv.py)."""

    def __init__(
        self,
        runtime: Runtime,
        worlds: Sequence[Bundle | WorldSource],
        *,
        session_idle_s: float = 900.0,
        max_sessions: int = 4096,
        verdicts: bool = False,
        max_loaded: int = 64,
        member: Member | None = None,
        access: Access | None = None,
        limits: ServingLimits | None = None,
        openenv: bool = False,
    ):
        self.runtime = runtime
        self.openenv = openenv
        self.limits = limits or ServingLimits.from_settings()
        self.sources = {s.env_id: s for s in self.check(worlds, verdicts=verdicts, max_loaded=max_loaded)}
        self.member = member
        self.access = access or Access()
        self.session_idle_s = session_idle_s
        self.max_sessions = max_sessions
        self.verdicts = verdicts
        self.max_loaded = max_loaded
        self.rewards = RewardMap()
        self._live: dict[str, LiveSession] = {}  # the same sessions with what the gateway keeps of them
        self.loaded: OrderedDict[str, ServedWorld] = OrderedDict()  # least recently used first
        self._loading: dict[str, anyio.Lock] = {}
        self._task_group: anyio.abc.TaskGroup | None = None

    @staticmethod
    def check(worlds: Sequence[Bundle | WorldSource], *, verdicts: bool, max_loaded: int) -> list[WorldSource]:
        """The sources of `worlds`, or GatewayRefused for worlds a gateway cannot serve together (what the
        constructor checks, for a supervisor checking before it starts gateway processes)."""
        sources = [w if isinstance(w, WorldSource) else WorldSource.of(w) for w in worlds]
        ids = Counter(s.env_id for s in sources)
        duplicates = sorted(env_id for env_id, count in ids.items() if count > 1)
        if duplicates:
            raise GatewayRefused(
                f"two bundles with the same env_id: {', '.join(duplicates)}; serve one version of each environment"
            )
        clashing = sorted(b.env_id for b in worlds if isinstance(b, Bundle) and submit_clash(b))
        if verdicts and clashing:
            raise GatewayRefused(
                f"{', '.join(clashing)} has a tool named {SUBMIT_TOOL.name!r}: serve it without verdicts"
            )
        if max_loaded < 1:
            raise GatewayRefused("a gateway needs room for at least one loaded world (max_loaded >= 1)")
        return sources

    @property
    def sessions(self) -> dict[str, Episode]:
        """The open episode of each live session, by session id."""
        return {session_id: live.episode for session_id, live in self._live.items()}

    # -- loading and unloading worlds ------------------------------------------------------------
    async def world(self, env_id: str) -> ServedWorld:
        """The loaded world `env_id`, loading it (and unloading idle ones past `max_loaded`) if needed.
        KeyError for an env_id not served here; WorldUnavailable for a world that cannot load."""
        world = self.loaded.get(env_id)
        if world is None:
            source = self.sources[env_id]
            async with self._loading.setdefault(env_id, anyio.Lock()):
                world = self.loaded.get(env_id)
                if world is None:
                    world = await self._load(source)
        self.loaded.move_to_end(env_id)
        return world

    async def _load(self, source: WorldSource) -> ServedWorld:
        if self._task_group is None:
            raise RuntimeError("the gateway is not running: serve its app()")
        try:
            bundle = await anyio.to_thread.run_sync(source.load)
        except Exception as exc:  # whatever keeps a world from loading is that world's answer, not the server's
            line = answer(exc) or f"{type(exc).__name__}: {exc}"
            raise WorldUnavailable(one_line(f"{source.env_id} ({source.origin}) cannot be loaded: {line}")) from exc
        if bundle.env_id != source.env_id:
            raise WorldUnavailable(f"{source.origin} now holds {bundle.env_id}, not {source.env_id}")
        if self.verdicts and submit_clash(bundle):
            raise WorldUnavailable(
                f"{bundle.env_id} has a tool named {SUBMIT_TOOL.name!r}: it is served without verdicts"
            )
        world = ServedWorld(bundle, self._server, max_sessions=self.max_sessions, limits=self.limits)
        await self._task_group.start(world.run)
        self.loaded[source.env_id] = world
        logger.info("loaded %s (%s); %d worlds loaded", source.env_id, source.origin, len(self.loaded))
        self._unload_idle(keep=source.env_id)
        return world

    def _unload_idle(self, keep: str | None = None) -> None:
        """Unload the least recently used idle worlds (but `keep`, just loaded for a request) while more
        than `max_loaded` are loaded; worlds with open episodes or requests in flight stay, over the
        bound if they must."""
        excess = len(self.loaded) - self.max_loaded
        for env_id, world in list(self.loaded.items()):
            if excess <= 0:
                return
            if world.active == 0 and env_id != keep:
                del self.loaded[env_id]
                world.unload()
                logger.info("unloaded %s (idle); %d worlds loaded", env_id, len(self.loaded))
                excess -= 1

    def done_with(self, world: ServedWorld) -> None:
        """One of `world`'s open episodes or requests (counted in `world.active`) is over."""
        world.active -= 1
        if world.active == 0 and len(self.loaded) > self.max_loaded:
            self._unload_idle()

    # -- the MCP server of one world ------------------------------------------------------------
    def _server(self, world: ServedWorld) -> Server:
        """The MCP server of `world`: its sessions are this gateway's live sessions."""
        return world_server(
            world,
            self.runtime,
            verdicts=self.verdicts,
            rewards=self.rewards,
            live_sessions=self._live,
            done_with=self.done_with,
        )

    # -- the hot path ---------------------------------------------------------------------------
    async def _hot_call(self, live: LiveSession, session_id: str, body: bytes, send: Send) -> bool:
        """Answer a POST of session `session_id` with `body` if it is a plain `tools/call`
        (serving/hotpath.py); False, with nothing sent, otherwise: the SDK answers it."""
        found = hotpath.tool_call(body)
        if found is None or live.ending or live.state.get(SUBMITTED_KEY):
            return False
        request_id, name, arguments = found
        if is_submit(live.episode, name, verdicts=self.verdicts):
            return False
        try:
            answered = await call_json(live.world, live.episode, name, arguments)
        except WorldBusy as busy:
            await hotpath.send_error(send, session_id, request_id, WORLD_BUSY, str(busy))
            return True
        if isinstance(answered, JsonAnswer):
            await hotpath.send_text_result(send, session_id, request_id, answered.text, answered.wrapped)
        else:
            result = answered.model_dump(by_alias=True, mode="json", exclude_none=True)
            await hotpath.send_result(send, session_id, request_id, result)
        return True

    # -- HTTP -----------------------------------------------------------------------------------
    async def _index(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "envs": {env_id: f"/envs/{env_id}/mcp" for env_id in self.sources},
                "loaded": list(self.loaded),
                "max_loaded": self.max_loaded,
                "sessions": len(self.sessions),
                "session_idle_s": self.session_idle_s,
                "verdicts": self.verdicts,
                "openenv": {env_id: f"/envs/{env_id}" for env_id in self.sources} if self.openenv else None,
                **(self.member.describe() if self.member is not None else {"process": 0, "processes": 1}),
            }
        )

    async def world_or_refusal(self, env_id: str) -> ServedWorld | JSONResponse:
        """World `env_id`, loaded; or the HTTP answer refusing it (404: not served here; 503: cannot load)."""
        try:
            return await self.world(env_id)
        except KeyError:
            return _no_env(env_id)
        except WorldUnavailable as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)

    def refusal(self, env_id: str) -> JSONResponse | None:
        """The 404 for a world not served here, else None (nothing loaded)."""
        return None if env_id in self.sources else _no_env(env_id)

    async def _tasks(self, request: Request) -> JSONResponse:
        world = await self.world_or_refusal(request.path_params["env_id"])
        return world if isinstance(world, JSONResponse) else JSONResponse(task_listing(world.bundle))

    def app(self) -> ASGIApp:
        """The gateway as an ASGI app: `/envs/<env_id>/mcp` (MCP), `/envs/<env_id>/tasks`, `/envs` (the
        index), `/healthz`, OpenEnv's routes when `openenv` (serving/openenv.py), behind `access`. Worlds
        load at their first request and run while the app's lifespan runs."""

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with anyio.create_task_group() as group:
                self._task_group = group
                group.start_soon(expire_idle_sessions, self._live, self.session_idle_s)
                try:
                    yield
                finally:
                    self._task_group = None
                    group.cancel_scope.cancel()
                    for world in self.loaded.values():
                        world.unload()
                    self.loaded.clear()

        routes = [
            Route("/envs/{env_id}/mcp", endpoint=_WorldEndpoint(self)),
            Route("/envs/{env_id}/tasks", endpoint=self._tasks),
            Route("/envs", endpoint=self._index),
            Route("/healthz", endpoint=lambda request: JSONResponse({"ok": True})),
            *(openenv_routes(self) if self.openenv else []),
        ]
        app = Starlette(routes=routes, lifespan=lifespan)
        # one of --processes N: `supervisor.serve_member` checks who calls in front, before it forwards
        return self.access.guard(app) if self.member is None else app


def _no_env(env_id: str) -> JSONResponse:
    return JSONResponse({"error": f"no environment {env_id!r} is served here; see /envs"}, status_code=404)


class _WorldEndpoint:
    """`/envs/<env_id>/mcp`: the request handed to its world's session manager (the world loaded first)."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        env_id = scope["path_params"]["env_id"]
        try:
            world = await self.gateway.world(env_id)
        except KeyError:
            await _no_env(env_id)(scope, receive, send)
            return
        except WorldUnavailable as exc:
            error = {"jsonrpc": "2.0", "id": None, "error": {"code": INTERNAL_ERROR, "message": str(exc)}}
            await JSONResponse(error, status_code=503)(scope, receive, send)
            return
        session_id = hotpath.header(scope, hotpath.SESSION_HEADER)
        live = self.gateway._live.get(session_id) if session_id is not None else None
        if live is not None and live.world is not world:
            live = None  # another world's session: the SDK answers 404, as for any unknown session
        world.active += 1
        if live is not None:
            live.in_flight += 1
        try:
            if live is not None and scope["method"] == "DELETE":
                live.ending = True
            elif (
                live is not None
                and session_id is not None
                and scope["method"] == "POST"
                and hotpath.answerable_headers(scope)
            ):
                body = await hotpath.read_body(receive)
                if body is None:  # the client left: nobody to answer
                    return
                if await self.gateway._hot_call(live, session_id, body, send):
                    return
                receive = hotpath.replaying(body, receive)
            await world.manager.handle_request(scope, receive, send)
        finally:
            self.gateway.done_with(world)
            if live is not None:
                live.in_flight -= 1
                live.last_active = time.monotonic()


class _Server(uvicorn.Server):
    """uvicorn's server that, once it listens with its own signal handlers in place, stops at once when
    `stopped` says a stop was asked for before them (a signal while the gateway was starting)."""

    def __init__(self, config: uvicorn.Config, stopped: Callable[[], bool]):
        super().__init__(config)
        self.stopped = stopped

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.stopped():
            self.should_exit = True


def serve(
    gateway: Gateway, sock: socket.socket, *, log_level: str = "info", stopped: Callable[[], bool] = lambda: False
) -> None:
    """Serve `gateway` on the listening socket `sock` (supervisor.listener) until interrupted (SIGINT/SIGTERM
    raised again once stopped), or at once when `stopped()` holds once it listens: no access log (a line
    per call costs as much as the call)."""
    config = uvicorn.Config(gateway.app(), log_level=log_level, access_log=False, backlog=4096)
    try:
        _Server(config, stopped).run(sockets=[sock])
    finally:
        sock.close()
