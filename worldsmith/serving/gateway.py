"""MCP gateway: one streamable-HTTP MCP server hosting many environments.

Each environment is served at `/envs/<env_id>/mcp`; each MCP session is one isolated episode
(its task chosen with `?task=<id>` when connecting), opened at `initialize` and closed when the
client ends the session or it stays idle past the limit. Agents see the tools (described as
`serving/mcp_tools.py` says: schemas and observed behaviour hints), the bound task's instruction
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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

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
from worldsmith.agent.loop import judged_verdict, system_prompt
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle, jsonschema_error
from worldsmith.bundle.jsonvalues import TooDeep, check_nesting
from worldsmith.failures import UserFixable
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import ToolResult
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode, Runtime
from worldsmith.serving.mcp_tools import OutputShape, mcp_tools, observe, output_shapes

EPISODE_KEY = "worldsmith.episode"
#: Set on a session once its episode was submitted: the verdict it got.
SUBMITTED_KEY = "worldsmith.submitted"
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


class Gateway:
    """The gateway's state: hosted bundles, one MCP server and session manager per env, live sessions.
    `verdicts`: task-bound sessions get the `submit` tool. Refuses (GatewayRefused) two bundles of one
    env_id, and with `verdicts` a bundle with a tool of its own named `submit`."""

    def __init__(
        self,
        runtime: Runtime,
        bundles: list[Bundle],
        *,
        session_idle_s: float = 900.0,
        max_sessions: int = 4096,
        verdicts: bool = False,
    ):
        ids = [b.env_id for b in bundles]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise GatewayRefused(
                f"two bundles with the same env_id: {', '.join(duplicates)}; serve one version of each environment"
            )
        clashing = sorted(b.env_id for b in bundles if any(t.name == SUBMIT_TOOL.name for t in b.tools))
        if verdicts and clashing:
            raise GatewayRefused(
                f"{', '.join(clashing)} has a tool named {SUBMIT_TOOL.name!r}: serve it without verdicts"
            )
        self.runtime = runtime
        self.bundles = {b.env_id: b for b in bundles}
        self.session_idle_s = session_idle_s
        self.verdicts = verdicts
        self.rewards = RewardMap()
        self.sessions: dict[str, Episode] = {}  # the open episode of each live session, by session id
        self.outputs = {env_id: output_shapes(bundle) for env_id, bundle in self.bundles.items()}
        self._tools: dict[str, list[types.Tool]] = {}
        self._describing: dict[str, anyio.Lock] = {}
        self.managers = {
            env_id: StreamableHTTPSessionManager(
                app=self._server(bundle),
                stateless=False,
                session_idle_timeout=session_idle_s,
                max_sessions=max_sessions,
            )
            for env_id, bundle in self.bundles.items()
        }

    async def tools(self, bundle: Bundle) -> list[types.Tool]:
        """`bundle`'s tools as MCP lists them; their hints are observed once, at the first listing."""
        lock = self._describing.setdefault(bundle.env_id, anyio.Lock())
        async with lock:
            if bundle.env_id not in self._tools:
                evidence = await anyio.to_thread.run_sync(observe, self.runtime, bundle)
                self._tools[bundle.env_id] = mcp_tools(bundle, self.outputs[bundle.env_id], evidence)
        return self._tools[bundle.env_id]

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
            await anyio.to_thread.run_sync(episode.close)
            self.sessions.pop(connection.session_id, None)
        return _text_result(outcome, outcome)

    def _server(self, bundle: Bundle) -> Server:
        tasks = {t.id: t for t in bundle.tasks}

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
            self.sessions[session_id] = episode

            async def close_episode() -> None:
                try:
                    await anyio.to_thread.run_sync(episode.close)
                finally:
                    self.sessions.pop(session_id, None)

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
            tools = await self.tools(bundle)
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
            if params.name == SUBMIT_TOOL.name and self.verdicts and episode.task is not None:
                return await self._submit(connection, bundle, params.arguments or {})
            try:
                result = await anyio.to_thread.run_sync(episode.call_tool, params.name, params.arguments or {})
            except Exception as exc:  # the runtime's refusals, answered like a failed call
                if answer(exc) is None:
                    raise
                return runtime_error_to_mcp(exc)
            return tool_result_to_mcp(result, self.outputs[bundle.env_id].get(params.name))

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
        server.middleware.append(_sessions_only)
        server.middleware.append(open_episode)
        return server

    async def _index(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "envs": {env_id: f"/envs/{env_id}/mcp" for env_id in self.bundles},
                "sessions": len(self.sessions),
                "session_idle_s": self.session_idle_s,
                "verdicts": self.verdicts,
            }
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
        routes += [
            Route(f"/envs/{env_id}/tasks", endpoint=lambda request, b=bundle: JSONResponse(task_listing(b)))
            for env_id, bundle in self.bundles.items()
        ]
        routes.append(Route("/envs", endpoint=self._index))
        routes.append(Route("/healthz", endpoint=lambda request: JSONResponse({"ok": True})))
        return Starlette(routes=routes, lifespan=lifespan)


def serve(gateway: Gateway, host: str, port: int) -> None:
    """Serve `gateway` until interrupted."""
    uvicorn.run(gateway.app(), host=host, port=port, log_level="info")
