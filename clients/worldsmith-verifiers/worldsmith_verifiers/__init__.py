"""A verifiers 0.4 environment for a world served by `worldsmith env serve --protocol openenv --verdicts`
(docs/integrations.md).

verifiers loads it by taskset id, as it loads any environment package:

    import verifiers.v1 as vf
    config = vf.resolve_env_config({"taskset": {"id": "worldsmith-verifiers",
                                                "base_url": "http://127.0.0.1:8765/envs/retail_store"}})
    env = vf.load_environment(config)        # WorldEnv over WorldTaskset

Each task of the world is one verifiers task (`tasks`: the ids to keep; default all). An episode is one
OpenEnv session with the served world (its WebSocket, `<base_url>/ws`), played the way verifiers' own
OpenEnv loop plays one (`verifiers.v1.tasksets.openenv`): the player's first turn shows the task's
instruction and the tools, each reply is an action (`{"type": "call_tool", "tool_name": ...,
"arguments": {...}}`, JSON, fenced or not) whose observation is the next turn, and the `submit` action
ends the episode with the world's verdict, judged by the server (the task's verifier, then the
side-effect guard). Its reward is the trace's `world_reward`. Runs in the trainer's environment:
verifiers and websockets, not worldsmith.

The player is the model, driven by `WorldHarness`, the taskset's own harness: verifiers' plain chat program
(the `null` harness's), run by this environment's Python instead of a `uv` environment built at the first
rollout, so its dependencies (openai, mcp, httpx, tenacity, certifi) are installed with this package and
a rollout needs no package index. It runs on the trainer's host (the `subprocess` runtime, `WorldEnv`'s
default for its `player`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import httpx
import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarness, NullHarnessConfig
from verifiers.v1.runtimes import Runtime
from websockets.asyncio.client import ClientConnection, connect

__all__ = ["WorldEnv", "WorldEnvConfig", "WorldHarness", "WorldTaskset", "WorldTasksetConfig"]

#: What the player is told an action is (the tools are listed beside it).
ACTION_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "call_tool"},
        "tool_name": {"type": "string"},
        "arguments": {"type": "object"},
    },
    "required": ["type", "tool_name", "arguments"],
}
#: The longest wait for the world's task listing or its WebSocket's opening.
ANSWER_S = 600.0


class WorldTasksetConfig(vf.TasksetConfig):
    base_url: str
    """The world's OpenEnv base URL: `http://HOST:PORT/envs/<env_id>`."""
    tasks: list[str] | None = None
    """The ids of the world's tasks to play; None: every task."""
    token: str | None = None
    """The gateway's bearer token (`env serve --token-file`), if it has one."""


class WorldData(vf.TaskData):
    base_url: str
    task: str
    token: str | None = None


class WorldTask(vf.Task[WorldData]):
    pass


class WorldTaskset(vf.Taskset[WorldTask, WorldTasksetConfig]):
    """The served world's tasks (listed by `GET <base_url>/tasks`)."""

    def load(self) -> Iterator[WorldTask]:
        config = self.config
        base_url = config.base_url.rstrip("/")
        response = httpx.get(f"{base_url}/tasks", headers=_headers(config.token), timeout=ANSWER_S)
        response.raise_for_status()
        listed = {t["id"]: t["instruction"] for t in response.json()}
        chosen = config.tasks if config.tasks is not None else list(listed)
        unknown = sorted(set(chosen) - set(listed))
        if unknown:
            raise ValueError(f"{base_url} has no tasks {unknown}; it has {sorted(listed)}")
        for task_id in chosen:
            data = WorldData(
                id=task_id,
                name=task_id,
                description=listed[task_id],
                base_url=base_url,
                task=task_id,
                token=config.token,
            )
            yield WorldTask(data, config.task)


class WorldHarnessConfig(NullHarnessConfig):
    pass


class WorldHarness(NullHarness):
    """verifiers' chat program (the `null` harness's), run by this environment's Python: no `uv`, no package
    index at rollout time. Only for a runtime on this host (`subprocess`)."""

    async def setup(self, runtime: Runtime) -> None:
        pass  # the chat program's dependencies are this package's

    async def launch(self, ctx: Any, trace: Any, runtime: Runtime, *args: Any, **kwargs: Any) -> Any:
        return await super().launch(ctx, trace, _OwnPython(runtime), *args, **kwargs)


class _OwnPython:
    """`runtime`, with a PEP 723 script (verifiers' chat program) run by this Python rather than prepared by uv."""

    def __init__(self, runtime: Runtime):
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script: str | bytes, env: Any = None, *, activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f".vf-program-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(path, data)
        return [sys.executable, path]


class WorldEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class WorldEnv(vf.Env[WorldEnvConfig]):
    """One episode of a served world per task: the player's replies are its actions, the reward the
    world's verdict at `submit` (recorded as `world_reward`)."""

    async def run(self, task: WorldTask, agents: Any) -> None:  # type: ignore[override]
        data = task.data
        total = 0.0
        async with _Session(data.base_url, data.token) as world:
            result = await world.send("reset", {"task": data.task})
            tools = (await world.send("step", {"type": "list_tools"}))["observation"]["tools"]

            def payload() -> str:
                shown = {"observation": result["observation"], "action_schema": ACTION_SCHEMA, "available_tools": tools}
                return json.dumps(shown, ensure_ascii=False)

            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn(payload())
                while not segment.terminated and not result["done"]:
                    reply = segment.last_reply.strip()
                    if not reply:
                        interaction.trace.stop("empty_action")
                        break
                    result = await world.send("step", parse_action(reply))
                    total += result["reward"] or 0.0
                    if result["done"]:
                        break
                    segment = await interaction.turn(payload())
        interaction.trace.record_reward("world_reward", total)


def parse_action(reply: str) -> dict[str, Any]:
    """The player's reply as an action: JSON, in a code fence or not. A reply that is not one is sent as
    it is, and the world's answer (an error observation) tells the player what an action is."""
    text = reply.strip()
    if text.startswith("```") and text.endswith("```"):
        text = "\n".join(text.splitlines()[1:-1]).strip()
    try:
        action = json.loads(text)
    except json.JSONDecodeError:
        return {"type": "call_tool", "tool_name": "", "arguments": {}}
    return action if isinstance(action, dict) else {"type": "call_tool", "tool_name": "", "arguments": {}}


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class _Session:
    """One OpenEnv session with the world at `base_url` (its WebSocket): `send` a message, get the
    observation; the server's refusal of a message (an error) is the observation `{"error": message}`."""

    def __init__(self, base_url: str, token: str | None):
        self.url = base_url.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + "/ws"
        self.token = token
        self.socket: ClientConnection | None = None

    async def __aenter__(self) -> _Session:
        self.socket = await connect(self.url, additional_headers=_headers(self.token), open_timeout=ANSWER_S)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.socket is not None
        await self.socket.send(json.dumps({"type": "close"}))
        await self.socket.close()

    async def send(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        assert self.socket is not None
        await self.socket.send(json.dumps({"type": kind, "data": data}))
        answer = json.loads(await self.socket.recv())
        if answer["type"] == "error":
            return {"observation": {"error": answer["data"]["message"]}, "reward": None, "done": False}
        return answer["data"]
