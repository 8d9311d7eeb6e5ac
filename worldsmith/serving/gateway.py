"""MCP gateway: one streamable-HTTP MCP server hosting many environments.

Each environment is served at `/envs/<env_id>/mcp` (routed by a dict lookup on env_id). The worlds are
named up front (`serving/worlds.py`: bundles, directories, catalog refs, set members) and loaded at
their first session or task listing; past `max_loaded` loaded worlds, the least recently used world
with no open episode and no request in flight is unloaded (its MCP server stopped, its bundle dropped).
Answers are JSON bodies (the SDK's JSON-response mode), not SSE streams; a `tools/call` in an established
session is answered by the gateway itself (`serving/hotpath.py`), every other request by the MCP SDK.
Each MCP session is one isolated episode (its task chosen with `?task=<id>` when connecting), opened at
`initialize` and closed when the client ends the session or it has no request in flight for the idle
limit (the gateway expires idle sessions itself, counting hot-path calls as activity). Agents see the
tools (described as `serving/mcp_tools.py` says: schemas and observed behaviour hints), the bound task's instruction
(the `instructions` of `initialize` and prompt `task`) and the task list (resource
`worldsmith://<env_id>/tasks`, and `GET /envs/<env_id>/tasks` for harnesses choosing a task before
they connect); verifiers, rewards and other sessions are not reachable through it. A gateway made
with `verdicts=True` adds a `submit` tool to task-bound sessions: the final answer, judged as an
evaluation judges it (the task's verifier, then the side-effect guard), returned with its reward and
evidence; the episode then closes.

A hostile environment is answered, never a traceback: an episode that cannot open (tools refused
at import, source too deep to compile, a worker lost) is an MCP error on `initialize`, and a call
that fails in the runtime (a worker that keeps dying, a result too deep to send) is a tool error
result; both say why in one line (`worldsmith/runtime/answers.py`), and the session and the server go on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

import worldsmith
from worldsmith.agent.loop import judged_verdict, system_prompt
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle, jsonschema_error
from worldsmith.bundle.jsonvalues import TooDeep, check_nesting
from worldsmith.errors import WorldsmithError
from worldsmith.failures import UserFixable
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import ToolResult
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode, Runtime
from worldsmith.serving import hotpath
from worldsmith.serving.affinity import Member
from worldsmith.serving.mcp_tools import OutputShape, mcp_tools, observe, output_shapes
from worldsmith.serving.worlds import WorldSource

logger = logging.getLogger(__name__)
EPISODE_KEY = "worldsmith.episode"
#: Set on a session once its episode was submitted: the verdict it got.
SUBMITTED_KEY = "worldsmith.submitted"
#: Set on a session with an episode: closes it (once), at submit or when the session ends.
CLOSE_KEY = "worldsmith.close"
#: The JSON-RPC code of an unknown resource (MCP specification, resources).
RESOURCE_NOT_FOUND = -32002
#: The prompt holding the bound task's instruction.
TASK_PROMPT = "task"
SUBMIT_TOOL = types.Tool(
    name="submit",
    description=(
        "Submit your final answer and end the episode: the task's verifier judges the database as you "
        "left it and your answer; returns the verdict (complete, partial, incomplete), its reward and "
        "the verifier's evidence. No tool can be called after it."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "answer": {
                "type": ["string", "number"],
                "description": "Your final reply to the user (what the task asks you to report); empty if none. "
                "A number is taken as its JSON text.",
                "default": "",
            }
        },
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "task": {"type": "string"},
            "status": {"enum": [v.value for v in Verdict]},
            "reward": {"type": ["number", "null"]},
            "evidence": {"type": "object"},
            "error": {"type": ["string", "null"]},
        },
        "required": ["task", "status", "reward", "evidence", "error"],
    },
    annotations=types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
    ),
)


class GatewayRefused(UserFixable, ValueError):
    """Bundles a gateway cannot serve together (the message names the fix)."""


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


def _text_result(value: Any, structured: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=structured)


def tool_result_to_mcp(result: ToolResult, shape: OutputShape | None = None) -> types.CallToolResult:
    """What the agent sees of a tool call: the JSON value with its structured content as `shape` makes
    it (default: the value if an object, else `{"result": value}`), or an error text (is_error). A
    value nested deeper than the sandbox lets results nest (only a reply forged past the worker's own
    check could carry one) is an environment error, before any recursive encoder sees it; so is a
    value that breaks the output schema its tool declares."""
    if result.ok:
        try:
            check_nesting(result.value)
        except TooDeep as exc:
            return runtime_error_to_mcp(exc)
        structured, problem = (shape or OutputShape.of(None)).structured(result.value)
        if problem is not None:
            return _error_result(f"environment error: the result breaks the tool's declared output schema: {problem}")
        return _text_result(result.value, structured)
    prefix = "error" if result.status == "tool_error" else "environment error"
    return _error_result(f"{prefix}: {result.error}")


def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def runtime_error_to_mcp(exc: Exception) -> types.CallToolResult:
    """A call the runtime could not answer with a result, as a tool error result saying why."""
    line = answer(exc) or f"{type(exc).__name__}: {exc}"
    return _error_result(f"environment error: {one_line(line)}")


def _refused_episode(env_id: str, exc: Exception) -> MCPError | None:
    """The MCP error answering an episode of `env_id` that could not open, or None for an exception
    bad input cannot cause (a bug: it propagates)."""
    line = answer(exc)
    if line is None:
        return None
    return MCPError(code=INTERNAL_ERROR, message=one_line(f"{env_id}: cannot open an episode: {line}"))


def tasks_uri(env_id: str, task_id: str | None = None) -> str:
    """The resource listing `env_id`'s tasks, or holding one task's instruction."""
    return f"worldsmith://{env_id}/tasks" + (f"/{task_id}" if task_id is not None else "")


def task_listing(bundle: Bundle) -> list[dict[str, str]]:
    """Every task of `bundle`: its id, instruction and the path of an MCP session bound to it (no
    verifier, solution or expected answer)."""
    return [
        {"id": t.id, "instruction": t.instruction, "mcp": f"/envs/{bundle.env_id}/mcp?task={t.id}"}
        for t in bundle.tasks
    ]


def instructions(bundle: Bundle, task: TaskSpec | None, verdicts: bool) -> str:
    """What `initialize` tells an agent: the evaluation's system message, then the bound task's
    instruction (and how to submit, when the gateway judges) or where the tasks are listed."""
    text = system_prompt(bundle, with_tools=False)
    if task is None:
        return (
            f"{text}\nThis session is not bound to a task (free play). The tasks are listed in resource "
            f"{tasks_uri(bundle.env_id)}; connect with ?task=<id> to attempt one."
        )
    text += f"\n\nTask {task.id}:\n{task.instruction}"
    if verdicts:
        text += (
            "\n\nWhen you are done, call `submit` with your final answer (empty if the task asks for none): "
            "it returns your verdict and ends the episode."
        )
    return text


@dataclass
class LiveSession:
    """A session with an open episode: its world, its episode, the SDK connection's state, and its
    activity (requests in flight, when the last one ended), from which the gateway expires it."""

    world: ServedWorld
    episode: Episode
    state: dict[str, Any]
    in_flight: int = 0
    last_active: float = field(default_factory=time.monotonic)
    ending: bool = False  # its DELETE came, or it was expired: nothing more is answered on the hot path


class WorldUnavailable(WorldsmithError):
    """A world named to the gateway that cannot be served now; the message is one line saying why."""


class ServedWorld:
    """A loaded world: its bundle, its MCP server and session manager (running while loaded), and what
    its tools look like. `active` counts its open episodes and its requests in flight: a world is
    unloaded only at 0."""

    def __init__(self, gateway: Gateway, bundle: Bundle):
        self.env_id = bundle.env_id
        self.bundle = bundle
        self.outputs = output_shapes(bundle)
        self.tasks = {t.id: t for t in bundle.tasks}
        self.active = 0
        self._tools: list[types.Tool] | None = None
        self._describing = anyio.Lock()
        self._unloaded = anyio.Event()
        self.manager = StreamableHTTPSessionManager(
            app=gateway._server(self),
            json_response=True,  # one JSON body per call: no SSE stream, no task per request (docs/benchmarks.md)
            stateless=False,
            session_idle_timeout=None,  # the gateway expires idle sessions itself (hot-path calls are activity)
            max_sessions=gateway.max_sessions,
        )

    async def tools(self, runtime: Runtime) -> list[types.Tool]:
        """The tools as MCP lists them; their hints are observed once, at the first listing."""
        async with self._describing:
            if self._tools is None:
                evidence = await anyio.to_thread.run_sync(observe, runtime, self.bundle)
                self._tools = mcp_tools(self.bundle, self.outputs, evidence)
        return self._tools

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the session manager until `unload`."""
        async with self.manager.run():
            task_status.started()
            await self._unloaded.wait()

    def unload(self) -> None:
        self._unloaded.set()


class Gateway:
    """The gateway's state: the worlds it serves, by env_id, those loaded (at most `max_loaded` while
    idle ones can be unloaded), and the live sessions. `worlds`: bundles in memory, or `WorldSource`s
    loaded at their first session or task listing. `verdicts`: task-bound sessions get the `submit` tool.
    Refuses (GatewayRefused) two worlds of one env_id, and with `verdicts` a bundle given in memory with a
    tool of its own named `submit` (a world loaded later with one answers its sessions with an error).
    `member`: this gateway is one of several processes serving one port (serving/affinity.py); its
    sessions, loaded worlds and bounds (`max_sessions`, `max_loaded`, idle expiry) are its own, and `/envs`
    reports its process index and this process's sessions."""

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
    ):
        self.runtime = runtime
        self.sources = {s.env_id: s for s in self.check(worlds, verdicts=verdicts, max_loaded=max_loaded)}
        self.member = member
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
        clashing = sorted(b.env_id for b in worlds if isinstance(b, Bundle) and _submit_clash(b))
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
        if self.verdicts and _submit_clash(bundle):
            raise WorldUnavailable(
                f"{bundle.env_id} has a tool named {SUBMIT_TOOL.name!r}: it is served without verdicts"
            )
        world = ServedWorld(self, bundle)
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

    def _done_with(self, world: ServedWorld) -> None:
        world.active -= 1
        if world.active == 0 and len(self.loaded) > self.max_loaded:
            self._unload_idle()

    # -- sessions ---------------------------------------------------------------------------------
    async def _expire_idle_sessions(self) -> None:
        """End every session with no request in flight for `session_idle_s` (as its client's DELETE
        would), checking a few times per idle period."""
        period = min(max(self.session_idle_s / 4, 0.05), 5.0)
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            for session_id, live in list(self._live.items()):
                if not live.ending and not live.in_flight and now - live.last_active > self.session_idle_s:
                    live.ending = True
                    try:
                        await _end_session(live.world, session_id)
                    except Exception:  # a bug ending one session: said in the log, the others still expire
                        logger.exception("ending idle session %s of %s failed", session_id, live.world.env_id)

    async def _hot_call(self, live: LiveSession, session_id: str, body: bytes, send: Send) -> bool:
        """Answer a POST of session `session_id` with `body` if it is a plain `tools/call`
        (serving/hotpath.py); False, with nothing sent, otherwise: the SDK answers it."""
        found = hotpath.tool_call(body)
        if found is None or live.ending or live.state.get(SUBMITTED_KEY):
            return False
        request_id, name, arguments = found
        if self._is_submit(live.episode, name):
            return False
        result = await call(live.world, live.episode, name, arguments)
        await hotpath.send_result(
            send, session_id, request_id, result.model_dump(by_alias=True, mode="json", exclude_none=True)
        )
        return True

    # -- the MCP server of one world ------------------------------------------------------------
    def _judge(self, bundle: Bundle, episode: Episode, final_answer: str) -> dict[str, Any]:
        """The verdict of `episode` with `final_answer`, as an evaluation reaches it (agent/loop.py)."""
        task = episode.task
        try:
            judged = episode.verify(final_answer)
            verdict, evidence = judged_verdict(self.runtime, bundle, task, episode, judged, guard=True)
            error = judged.error
        except Exception as exc:  # a hostile world failing its verifier or its reference run: the env's failure
            line = answer(exc)
            if line is None:
                raise
            verdict, evidence, error = Verdict.env_error.value, {}, one_line(line)
        return {
            "task": task.id,
            "status": verdict,
            "reward": self.rewards.reward(verdict),
            "evidence": evidence,
            "error": error,
        }

    def _is_submit(self, episode: Episode, name: str) -> bool:
        """Whether a call of `name` in `episode` is the opt-in `submit` (the verdict), not a world's tool."""
        return name == SUBMIT_TOOL.name and self.verdicts and episode.task is not None

    async def _submit(self, connection: Any, bundle: Bundle, arguments: dict[str, Any]) -> types.CallToolResult:
        """`submit` in a task-bound session: judge its episode with the final answer, then close it."""
        problem = jsonschema_error(SUBMIT_TOOL.input_schema, arguments)
        if problem is not None:
            return _error_result(f"error: invalid arguments for submit: {problem}")
        episode: Episode = connection.state[EPISODE_KEY]
        connection.state[SUBMITTED_KEY] = True  # before any await: a second submit is refused, not judged again
        final = arguments.get("answer", "")
        final = final if isinstance(final, str) else json.dumps(final)
        try:
            outcome = await anyio.to_thread.run_sync(self._judge, bundle, episode, final)
            check_nesting(outcome)
        except TooDeep as exc:
            outcome = {"task": episode.task.id, "status": "env_error", "reward": None, "evidence": {}}
            outcome["error"] = one_line(answer(exc) or str(exc))
        finally:
            await connection.state[CLOSE_KEY]()
        return _text_result(outcome, outcome)

    def _server(self, world: ServedWorld) -> Server:
        bundle, tasks = world.bundle, world.tasks

        async def open_episode(
            ctx: ServerRequestContext, call_next: Callable[[ServerRequestContext], Awaitable[Any]]
        ) -> Any:
            if ctx.method != "initialize":
                return await call_next(ctx)
            connection = _connection(ctx)
            task_id = ctx.request.query_params.get("task") if ctx.request is not None else None
            if task_id is not None and task_id not in tasks:
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
            self._live[session_id] = LiveSession(world, episode, connection.state)
            world.active += 1

            closing: list[bool] = []

            async def close_episode() -> None:  # once: at submit, when the session ends, or both
                if closing:
                    return
                closing.append(True)
                try:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(episode.close)
                finally:
                    self._live.pop(session_id, None)
                    self._done_with(world)

            connection.state[CLOSE_KEY] = close_episode
            connection.exit_stack.push_async_callback(close_episode)
            result = await call_next(ctx)
            if isinstance(result, dict):  # the wire form of the InitializeResult
                result = {**result, "instructions": instructions(bundle, episode.task, self.verdicts)}
            return result

        def bound_task(ctx: ServerRequestContext) -> TaskSpec | None:
            episode: Episode | None = _connection(ctx).state.get(EPISODE_KEY)
            return episode.task if episode is not None else None

        async def list_tools(
            ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            tools = await world.tools(self.runtime)
            if self.verdicts and bound_task(ctx) is not None:
                tools = [*tools, SUBMIT_TOOL]
            return types.ListToolsResult(tools=tools)

        async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
            connection = _connection(ctx)
            episode: Episode | None = connection.state.get(EPISODE_KEY)
            if episode is None:
                raise MCPError(code=INVALID_PARAMS, message="no episode for this session; reconnect")
            if connection.state.get(SUBMITTED_KEY):
                return _error_result("error: this episode was submitted and has ended; open a new session to try again")
            if self._is_submit(episode, params.name):
                return await self._submit(connection, bundle, params.arguments or {})
            return await call(world, episode, params.name, params.arguments or {})

        async def list_prompts(
            ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
        ) -> types.ListPromptsResult:
            task = bound_task(ctx)
            if task is None:
                return types.ListPromptsResult(prompts=[])
            prompt = types.Prompt(name=TASK_PROMPT, title=task.id, description=f"The instruction of task {task.id}")
            return types.ListPromptsResult(prompts=[prompt])

        async def get_prompt(ctx: ServerRequestContext, params: types.GetPromptRequestParams) -> types.GetPromptResult:
            task = bound_task(ctx)
            if params.name != TASK_PROMPT:
                raise MCPError(code=INVALID_PARAMS, message=f"no prompt {params.name!r}; the prompt is {TASK_PROMPT!r}")
            if task is None:
                raise MCPError(
                    code=INVALID_PARAMS, message="this session is not bound to a task: connect with ?task=<id>"
                )
            message = types.PromptMessage(role="user", content=types.TextContent(text=task.instruction))
            return types.GetPromptResult(description=f"The instruction of task {task.id}", messages=[message])

        async def list_resources(
            ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
        ) -> types.ListResourcesResult:
            listing = types.Resource(
                uri=tasks_uri(bundle.env_id),
                name="tasks",
                description=f"The tasks of {bundle.env_id}: id, instruction and the session path bound to each",
                mime_type="application/json",
            )
            each = [
                types.Resource(
                    uri=tasks_uri(bundle.env_id, t.id), name=t.id, description=t.instruction, mime_type="text/plain"
                )
                for t in bundle.tasks
            ]
            return types.ListResourcesResult(resources=[listing, *each])

        async def read_resource(
            ctx: ServerRequestContext, params: types.ReadResourceRequestParams
        ) -> types.ReadResourceResult:
            uri = str(params.uri)
            if uri == tasks_uri(bundle.env_id):
                text, mime = json.dumps(task_listing(bundle)), "application/json"
            elif uri.startswith(tasks_uri(bundle.env_id) + "/") and uri.rsplit("/", 1)[1] in tasks:
                text, mime = tasks[uri.rsplit("/", 1)[1]].instruction, "text/plain"
            else:
                raise MCPError(code=RESOURCE_NOT_FOUND, message=f"no resource {uri!r}", data={"uri": uri})
            return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=mime, text=text)])

        server = Server(
            f"worldsmith/{bundle.env_id}",
            version=worldsmith.__version__,
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_prompts=list_prompts,
            on_get_prompt=get_prompt,
            on_list_resources=list_resources,
            on_read_resource=read_resource,
        )
        # no OpenTelemetry span per message (the SDK's default middleware): nothing here exports them
        server.middleware[:] = [_sessions_only, open_episode]
        return server

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
                **(self.member.describe() if self.member is not None else {"process": 0, "processes": 1}),
            }
        )

    async def _tasks(self, request: Request) -> JSONResponse:
        try:
            world = await self.world(request.path_params["env_id"])
        except KeyError:
            return _no_env(request.path_params["env_id"])
        except WorldUnavailable as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse(task_listing(world.bundle))

    def app(self) -> Starlette:
        """The gateway as an ASGI app: `/envs/<env_id>/mcp` (MCP), `/envs/<env_id>/tasks`, `/envs` (the
        index), `/healthz`. Worlds load at their first request and run while the app's lifespan runs."""

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with anyio.create_task_group() as group:
                self._task_group = group
                group.start_soon(self._expire_idle_sessions)
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
        ]
        return Starlette(routes=routes, lifespan=lifespan)


async def call(world: ServedWorld, episode: Episode, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """Tool `name` called in `episode` (in a thread), as the agent sees the result."""
    try:
        result = await anyio.to_thread.run_sync(episode.call_tool, name, arguments)
    except Exception as exc:  # the runtime's refusals, answered like a failed call
        if answer(exc) is None:
            raise
        return runtime_error_to_mcp(exc)
    return tool_result_to_mcp(result, world.outputs.get(name))


async def _end_session(world: ServedWorld, session_id: str) -> None:
    """End session `session_id` of `world` as its client's DELETE does (through the SDK's front door)."""
    scope: Scope = {
        "type": "http",
        "method": "DELETE",
        "path": f"/envs/{world.env_id}/mcp",
        "raw_path": f"/envs/{world.env_id}/mcp".encode(),
        "root_path": "",
        "scheme": "http",
        "query_string": b"",
        "headers": [(hotpath.SESSION_HEADER, session_id.encode())],
        "http_version": "1.1",
        "server": None,
        "client": None,
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def discard(message: Message) -> None:
        pass

    await world.manager.handle_request(scope, receive, discard)


def _submit_clash(bundle: Bundle) -> bool:
    return any(t.name == SUBMIT_TOOL.name for t in bundle.tools)


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
            elif live is not None and scope["method"] == "POST" and hotpath.answerable_headers(scope):
                body = await hotpath.read_body(receive)
                if body is None:  # the client left: nobody to answer
                    return
                if await self.gateway._hot_call(live, session_id, body, send):
                    return
                receive = hotpath.replaying(body, receive)
            await world.manager.handle_request(scope, receive, send)
        finally:
            self.gateway._done_with(world)
            if live is not None:
                live.in_flight -= 1
                live.last_active = time.monotonic()


def serve(gateway: Gateway, host: str, port: int, *, log_level: str = "info") -> None:
    """Serve `gateway` until interrupted: no access log (a line per call costs as much as the call)."""
    uvicorn.run(gateway.app(), host=host, port=port, log_level=log_level, access_log=False, backlog=4096)
