"""OpenEnv's protocol on the gateway (`env serve --protocol openenv`): each world is an OpenEnv
environment server at base URL `/envs/<env_id>`, so that OpenEnv's own clients (`MCPToolClient`,
`GenericEnvClient`, and `clients/worldsmith-openenv`) drive its episodes without worldsmith installed.

What OpenEnv 0.3's clients speak (openenv.core.env_client): a WebSocket at `<base>/ws`, one session
per connection; the client sends `{"type": "reset" | "step" | "state" | "close", "data": ...}` and
gets `{"type": "observation", "data": {"observation", "reward", "done"}}`, `{"type": "state", ...}`
or `{"type": "error", "data": {"message", "code"}}`. Steps are OpenEnv's MCP actions:

- `reset` (data `task`: a task id, or none for free play) closes the connection's episode, if any,
  and opens one; its observation is the task id and the instruction an MCP session gets.
- `{"type": "list_tools"}`: the world's tools (`name`, `description`, `input_schema`), with
  `submit` in a task-bound episode of a gateway serving verdicts (`--verdicts`).
- `{"type": "call_tool", "tool_name", "arguments"}`: the call in the episode; its observation is
  `{"tool_name", "result", "error"}`, `result` the tool's value, `error` (OpenEnv's ToolError) a
  tool's or the environment's failure, one line. `submit` judges the episode as the MCP `submit` does
  (serving/submit.py): the observation's result is the verdict, `reward` its reward, `done` true.

Plain HTTP beside it: `GET <base>/health`, `<base>/schema` (the action, observation and state
schemas) and `<base>/metadata`. The gateway's access checks (serving/access.py: Host, Origin, bearer
token) apply to the WebSocket's handshake as to any request. A connection's episode closes when
the connection ends, at `submit`, at the next `reset`, or after the gateway's idle limit without a
message; at most `max_sessions` connections are open at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import mcp_types as types
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from worldsmith.agent.rewards import RewardMap
from worldsmith.errors import WorldsmithError
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode, Runtime
from worldsmith.serving.lanes import WorldBusy
from worldsmith.serving.mcp_results import JsonAnswer, call_json
from worldsmith.serving.served_world import ServedWorld
from worldsmith.serving.sessions import CLOSE_KEY, EPISODE_KEY
from worldsmith.serving.submit import SUBMIT_TOOL, is_submit, submit
from worldsmith.serving.world_server import instructions
from worldsmith.serving.worlds import WorldSource

#: OpenEnv's error codes (openenv.core.env_server.types.WSErrorCode).
INVALID_JSON, UNKNOWN_TYPE, EXECUTION_ERROR, CAPACITY_REACHED = (
    "INVALID_JSON",
    "UNKNOWN_TYPE",
    "EXECUTION_ERROR",
    "CAPACITY_REACHED",
)
_ACTION_SCHEMA = {
    "title": "CallToolAction",
    "type": "object",
    "properties": {
        "type": {"enum": ["call_tool", "list_tools"]},
        "tool_name": {"type": "string"},
        "arguments": {"type": "object"},
    },
    "required": ["type"],
}
_OBSERVATION_SCHEMA = {
    "title": "WorldObservation",
    "type": "object",
    "properties": {
        "task": {"type": ["string", "null"]},
        "instruction": {"type": "string"},
        "tools": {"type": "array"},
        "tool_name": {"type": "string"},
        "result": {},
        "error": {"type": ["object", "null"]},
    },
}
_STATE_SCHEMA = {
    "title": "WorldState",
    "type": "object",
    "properties": {
        "episode_id": {"type": ["string", "null"]},
        "step_count": {"type": "integer"},
        "env_id": {"type": "string"},
        "task": {"type": ["string", "null"]},
        "done": {"type": "boolean"},
    },
}


class StepRefused(WorldsmithError):
    """A message this connection cannot act on now; its text is the error's one line."""

    def __init__(self, message: str, code: str = EXECUTION_ERROR):
        super().__init__(message)
        self.code = code


class Gateway(Protocol):
    """What OpenEnv's routes use of the gateway (serving/gateway.py)."""

    runtime: Runtime
    rewards: RewardMap
    sources: dict[str, WorldSource]
    verdicts: bool
    max_sessions: int
    session_idle_s: float

    async def world(self, env_id: str) -> ServedWorld: ...

    async def world_or_refusal(self, env_id: str) -> ServedWorld | JSONResponse: ...

    def refusal(self, env_id: str) -> JSONResponse | None: ...

    def done_with(self, world: ServedWorld) -> None: ...


@dataclass
class _Connection:
    """One OpenEnv connection to `world`: its episode (None before `reset` and after `submit`), the
    state `submit` reads (serving/submit.py), and what `state` reports."""

    world: ServedWorld
    episode: Episode | None = None
    task: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    episodes: int = 0
    step_count: int = 0
    done: bool = False


def openenv_routes(gateway: Gateway) -> list[BaseRoute]:
    """The routes serving each of `gateway`'s worlds as an OpenEnv environment at `/envs/<env_id>`."""
    server = _OpenEnvServer(gateway)
    return [
        WebSocketRoute("/envs/{env_id}/ws", endpoint=server.session),
        Route("/envs/{env_id}/health", endpoint=server.health),
        Route("/envs/{env_id}/schema", endpoint=server.schema),
        Route("/envs/{env_id}/metadata", endpoint=server.metadata),
    ]


class _OpenEnvServer:
    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.open = 0

    async def health(self, request: Request) -> JSONResponse:
        return self.gateway.refusal(request.path_params["env_id"]) or JSONResponse({"status": "healthy"})

    async def schema(self, request: Request) -> JSONResponse:
        schemas = {"action": _ACTION_SCHEMA, "observation": _OBSERVATION_SCHEMA, "state": _STATE_SCHEMA}
        return self.gateway.refusal(request.path_params["env_id"]) or JSONResponse(schemas)

    async def metadata(self, request: Request) -> JSONResponse:
        world = await self.gateway.world_or_refusal(request.path_params["env_id"])
        if isinstance(world, JSONResponse):
            return world
        bundle = world.bundle
        return JSONResponse(
            {
                "name": bundle.env_id,
                "description": bundle.manifest.scenario.description,
                "version": str(bundle.manifest.version or ""),
                "tasks": [t.id for t in bundle.tasks],
            }
        )

    async def session(self, websocket: WebSocket) -> None:
        """One OpenEnv session: messages answered in order until the client closes, says `close`, or
        sends nothing for the gateway's idle limit."""
        env_id = websocket.path_params["env_id"]
        await websocket.accept()
        if self.open >= self.gateway.max_sessions:
            await _send_error(websocket, f"the gateway has {self.open} sessions open: retry later", CAPACITY_REACHED)
            await websocket.close()
            return
        world = await self.gateway.world_or_refusal(env_id)
        if isinstance(world, JSONResponse):
            await _send_error(websocket, json.loads(bytes(world.body))["error"])
            await websocket.close()
            return
        connection = _Connection(world)
        self.open += 1
        world.active += 1  # the world stays loaded while the connection is open
        try:
            await self._converse(websocket, connection)
        finally:
            with anyio.CancelScope(shield=True):
                await _close_episode(connection)
            self.open -= 1
            self.gateway.done_with(world)

    async def _converse(self, websocket: WebSocket, connection: _Connection) -> None:
        while True:
            raw: str | None = None
            with anyio.move_on_after(self.gateway.session_idle_s):  # the wait for a message, not its answer
                try:
                    raw = await websocket.receive_text()
                except WebSocketDisconnect:
                    return
            if raw is None:
                idle = f"no message for {self.gateway.session_idle_s:g} s: the session has ended"
                await _send_error(websocket, idle)
                await websocket.close()
                return
            if await self._answer(websocket, connection, raw):
                await websocket.close()
                return

    async def _answer(self, websocket: WebSocket, connection: _Connection, raw: str) -> bool:
        """Answer message `raw`; True when the client asked to close."""
        try:
            message = json.loads(raw)
        except ValueError as exc:
            await _send_error(websocket, f"invalid JSON: {one_line(str(exc))}", INVALID_JSON)
            return False
        kind = message.get("type") if isinstance(message, dict) else None
        data = message.get("data") if isinstance(message, dict) else None
        data = data if isinstance(data, dict) else {}
        try:
            if kind == "close":
                return True
            if kind == "reset":
                reply = _message("observation", await self._reset(connection, data))
            elif kind == "step":
                reply = _message("observation", await self._step(connection, data))
            elif kind == "state":
                reply = _message("state", _state(connection))
            else:
                raise StepRefused(f"unknown message type {kind!r}: send reset, step, state or close", UNKNOWN_TYPE)
        except StepRefused as refused:
            await _send_error(websocket, str(refused), refused.code)
            return False
        await websocket.send_text(reply)
        return False

    async def _reset(self, connection: _Connection, data: dict[str, Any]) -> dict[str, Any]:
        world, gateway = connection.world, self.gateway
        task_id = data.get("task", data.get("task_id"))
        if task_id is not None and task_id not in world.tasks:
            raise StepRefused(f"{world.env_id} has no task {task_id!r}; GET /envs/{world.env_id}/tasks lists them")
        await _close_episode(connection)
        try:
            episode = await world.lanes.control(gateway.runtime.open_episode, world.bundle, task_id)
        except Exception as exc:  # what a hostile environment can cause is answered
            line = answer(exc)
            if line is None:
                raise
            raise StepRefused(one_line(f"{world.env_id}: cannot open an episode: {line}")) from None
        connection.episode, connection.task, connection.done, connection.step_count = episode, task_id, False, 0
        connection.episodes += 1

        async def close() -> None:
            connection.episode = None
            await world.lanes.control(episode.close)

        connection.state = {EPISODE_KEY: episode, CLOSE_KEY: close}
        observation = {"task": task_id, "instruction": instructions(world.bundle, episode.task, gateway.verdicts)}
        return {"observation": observation, "reward": None, "done": False}

    async def _step(self, connection: _Connection, action: dict[str, Any]) -> dict[str, Any] | str:
        world, gateway, episode = connection.world, self.gateway, connection.episode
        if action.get("type") == "list_tools":
            tools = await world.tools(gateway.runtime)
            if episode is not None and gateway.verdicts and episode.task is not None:
                tools = [*tools, SUBMIT_TOOL]
            return {"observation": {"tools": [_tool(t) for t in tools]}, "reward": None, "done": connection.done}
        if action.get("type") != "call_tool" or not isinstance(action.get("tool_name"), str):
            raise StepRefused('a step is {"type": "call_tool", "tool_name": ..., "arguments": {...}} or list_tools')
        name, arguments = action["tool_name"], action.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise StepRefused(f"the arguments of {name} must be a JSON object")
        if episode is None:
            ended = "was submitted and has ended" if connection.done else "is not open"
            raise StepRefused(f"the episode {ended}: send reset to start one")
        connection.step_count += 1
        try:
            if is_submit(episode, name, verdicts=gateway.verdicts):
                judged = await submit(
                    connection.state, world, arguments, runtime=gateway.runtime, rewards=gateway.rewards
                )
                if judged.is_error:
                    return _called(name, None, _text(judged), done=False)
                connection.done = True
                verdict = judged.structured_content or {}
                return {**_called(name, verdict, None, done=True), "reward": verdict.get("reward")}
            answered = await call_json(world, episode, name, arguments)
        except WorldBusy as busy:
            raise StepRefused(str(busy)) from None
        if isinstance(answered, JsonAnswer):  # the value as the sandbox sent it (checked JSON), not decoded again
            return _passed_on(name, answered.text)
        if answered.is_error:
            return _called(name, None, _text(answered), done=False)
        return _called(name, answered.structured_content, None, done=False)


def _message(kind: str, data: dict[str, Any] | str) -> str:
    """An OpenEnv message as JSON text; `data` is already JSON text when a step passes a tool's value on."""
    encoded = data if isinstance(data, str) else json.dumps(data)
    return f'{{"type": "{kind}", "data": {encoded}}}'


def _called(name: str, result: Any, error: str | None, *, done: bool) -> dict[str, Any]:
    """A `call_tool` step's answer; `error` is OpenEnv's ToolError of a failed call."""
    failure = None if error is None else {"error_type": "execution_error", "message": error}
    return {"observation": {"tool_name": name, "result": result, "error": failure}, "reward": None, "done": done}


def _passed_on(name: str, value: bytes) -> str:
    """`_called`'s answer to a successful call, as JSON text around its value as the sandbox sent it."""
    observation = f'{{"tool_name": {json.dumps(name)}, "result": {value.decode()}, "error": null}}'
    return f'{{"observation": {observation}, "reward": null, "done": false}}'


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _tool(tool: types.Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description or "", "input_schema": tool.input_schema}


def _state(connection: _Connection) -> dict[str, Any]:
    return {
        "episode_id": f"{connection.world.env_id}#{connection.episodes}" if connection.episodes else None,
        "step_count": connection.step_count,
        "env_id": connection.world.env_id,
        "task": connection.task,
        "done": connection.done,
    }


async def _close_episode(connection: _Connection) -> None:
    close: Callable[[], Any] | None = connection.state.pop(CLOSE_KEY, None)
    connection.state.pop(EPISODE_KEY, None)
    if close is not None and connection.episode is not None:
        await close()
    connection.episode = None


async def _send_error(websocket: WebSocket, message: str, code: str = EXECUTION_ERROR) -> None:
    await websocket.send_text(json.dumps({"type": "error", "data": {"message": message, "code": code}}))
