"""verl 0.9 tools for a world served by `worldsmith env serve --protocol openenv --verdicts`
(docs/integrations.md, verl).

`tool_config(base_url, class_name)` is verl's multi-turn tool config for the world (what
`actor_rollout_ref.rollout.multi_turn.tool_config_path` reads, as YAML): one entry per tool, its
`tool_schema` in the OpenAI function format verl's `OpenAIFunctionToolSchema` reads. `WorldSession` is
the world's OpenEnv session a `BaseTool` of the trainer's (`class_name`) calls the tools through: verl
0.9's ToolAgentLoop creates and releases a tool instance for every call, so that tool keeps one session
per trajectory (its `agent_data`), not per instance; no such class ships here (docs/integrations.md).
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

__all__ = ["WorldSession", "tool_config"]


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class WorldSession:
    """One OpenEnv session with the world at `base_url` (`http://HOST:PORT/envs/<env_id>`)."""

    def __init__(self, base_url: str, token: str | None = None):
        self.url = base_url.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1) + "/ws"
        self.token = token
        self.socket: ClientConnection | None = None

    async def __aenter__(self) -> WorldSession:
        self.socket = await connect(self.url, additional_headers=_headers(self.token))
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self.socket is not None:
            await self.socket.send(json.dumps({"type": "close"}))
            await self.socket.close()
            self.socket = None

    async def _send(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        if self.socket is None:
            await self.__aenter__()
        assert self.socket is not None
        await self.socket.send(json.dumps({"type": kind, "data": data}))
        answer = json.loads(await self.socket.recv())
        if answer["type"] == "error":
            raise RuntimeError(answer["data"]["message"])
        return answer["data"]

    async def reset(self, task: str | None) -> str:
        """Open an episode bound to `task` (None: free play); its instruction."""
        return (await self._send("reset", {"task": task}))["observation"]["instruction"]

    async def tools(self) -> list[dict[str, Any]]:
        """The world's tools: name, description, input_schema."""
        answer = await self._send("step", {"type": "list_tools"})
        return list(answer["observation"]["tools"])

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Tool `name` called in the episode: the text the model reads (the result's JSON, or the error's
        line) and whether it succeeded."""
        answer = await self._send("step", {"type": "call_tool", "tool_name": name, "arguments": arguments})
        observation = answer["observation"]
        if observation.get("error"):
            return observation["error"]["message"], False
        return json.dumps(observation["result"]), True

    async def submit(self, answer: str = "") -> float:
        """End the episode with final reply `answer`: the verdict's reward."""
        judged = await self._send("step", {"type": "call_tool", "tool_name": "submit", "arguments": {"answer": answer}})
        if judged["observation"].get("error"):
            raise RuntimeError(judged["observation"]["error"]["message"])
        return float(judged["reward"] or 0.0)


async def tool_config(base_url: str, class_name: str, token: str | None = None) -> dict[str, Any]:
    """verl's multi-turn tool config for the world at `base_url`: each tool (not `submit`: the reward
    is the verdict's, at the trajectory's end) as `{"class_name", "config", "tool_schema"}`."""
    async with WorldSession(base_url, token) as session:
        tools = await session.tools()
    entries = []
    for tool in tools:
        function = {"name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]}
        entries.append(
            {
                "class_name": class_name,
                "config": {"type": "native", "base_url": base_url, "token": token},
                "tool_schema": {"type": "function", "function": function},
            }
        )
    return {"tools": entries}
