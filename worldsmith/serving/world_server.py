"""The MCP server of one served world: the SDK handlers answering its sessions.

`initialize` opens the session's episode (its task chosen with `?task=<id>` when connecting) and
registers it with the gateway's live sessions; the episode closes once, at `submit` or when the session
ends. A session sees the world's tools (serving/mcp_tools.py), calls them in its episode, and reads the
bound task's instruction (the `instructions` of `initialize`, prompt `task`) and the task list
(resource `worldsmith://<env_id>/tasks`); verifiers, rewards and other sessions are not reachable
through it. An episode that cannot open is an MCP error on `initialize` saying why in one line, not a
traceback. Sessions of the stateless protocol era are refused: an episode needs a session.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

import worldsmith
from worldsmith.agent.loop import system_prompt
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode, Runtime
from worldsmith.serving.lanes import WORLD_BUSY, WorldBusy
from worldsmith.serving.mcp_results import call, error_result
from worldsmith.serving.served_world import ServedWorld
from worldsmith.serving.sessions import CLOSE_KEY, EPISODE_KEY, SUBMITTED_KEY, LiveSession
from worldsmith.serving.submit import SUBMIT_TOOL, is_submit, submit

#: The JSON-RPC code of an unknown resource (MCP specification, resources).
RESOURCE_NOT_FOUND = -32002
#: The prompt holding the bound task's instruction.
TASK_PROMPT = "task"


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


def world_server(
    world: ServedWorld,
    runtime: Runtime,
    *,
    verdicts: bool,
    rewards: RewardMap,
    live_sessions: dict[str, LiveSession],
    done_with: Callable[[ServedWorld], None],
) -> Server:
    """The MCP server of `world`, its episodes opened in `runtime`: each session with an episode is in
    `live_sessions` (by session id) until its episode closes, and then `done_with(world)` is called
    (the world counted its episode in `world.active`). `verdicts`: task-bound sessions get the `submit`
    tool, its verdicts rewarded by `rewards`."""
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
            episode = await world.lanes.control(runtime.open_episode, bundle, task_id)
        except Exception as exc:  # what a hostile environment can cause is answered
            refusal = _refused_episode(bundle.env_id, exc)
            if refusal is None:
                raise
            raise refusal from None
        connection.state[EPISODE_KEY] = episode
        session_id = connection.session_id
        live_sessions[session_id] = LiveSession(world, episode, connection.state)
        world.active += 1

        closing: list[bool] = []

        async def close_episode() -> None:  # once: at submit, when the session ends, or both
            if closing:
                return
            closing.append(True)
            try:
                with anyio.CancelScope(shield=True):
                    await world.lanes.control(episode.close)
            finally:
                live_sessions.pop(session_id, None)
                done_with(world)

        connection.state[CLOSE_KEY] = close_episode
        connection.exit_stack.push_async_callback(close_episode)
        result = await call_next(ctx)
        if isinstance(result, dict):  # the wire form of the InitializeResult
            result = {**result, "instructions": instructions(bundle, episode.task, verdicts)}
        return result

    def bound_task(ctx: ServerRequestContext) -> TaskSpec | None:
        episode: Episode | None = _connection(ctx).state.get(EPISODE_KEY)
        return episode.task if episode is not None else None

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = await world.tools(runtime)
        if verdicts and bound_task(ctx) is not None:
            tools = [*tools, SUBMIT_TOOL]
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        connection = _connection(ctx)
        episode: Episode | None = connection.state.get(EPISODE_KEY)
        if episode is None:
            raise MCPError(code=INVALID_PARAMS, message="no episode for this session; reconnect")
        if connection.state.get(SUBMITTED_KEY):
            return error_result("error: this episode was submitted and has ended; open a new session to try again")
        try:
            if is_submit(episode, params.name, verdicts=verdicts):
                return await submit(connection.state, world, params.arguments or {}, runtime=runtime, rewards=rewards)
            return await call(world, episode, params.name, params.arguments or {})
        except WorldBusy as busy:
            raise MCPError(code=WORLD_BUSY, message=str(busy)) from None

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
            raise MCPError(code=INVALID_PARAMS, message="this session is not bound to a task: connect with ?task=<id>")
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
