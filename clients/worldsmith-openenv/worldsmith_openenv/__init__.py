"""An OpenEnv client for a world served by `worldsmith env serve --protocol openenv` (docs/integrations.md).

`WorldEnv` is OpenEnv 0.3's `MCPToolClient` (reset, step, `list_tools`, `call_tool`, state, `.sync()`)
with what a worldsmith world adds: `reset(task=...)` answers the task's instruction, `submit(answer)`
ends the episode with the world's verdict and reward, `tasks()` lists the tasks, and a bearer token
(`env serve --token-file`) is sent with every request. It needs openenv-core and its client's imports,
not worldsmith.

    async with WorldEnv("http://127.0.0.1:8765/envs/retail_store") as env:
        task = await env.reset(task="t01_points_balance")   # task.instruction
        await env.call_tool("find_customer", email="maria.lopez@example.com")
        verdict = await env.submit("1250")                  # verdict.status, verdict.reward
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from openenv.core.client_types import StepResult
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation
from openenv.core.mcp_client import MCPToolClient
from websockets.asyncio.client import connect

__all__ = ["TaskObservation", "Verdict", "WorldEnv"]


class TaskObservation(Observation):
    """What `reset` observes: the task the episode is bound to (None: free play) and its instruction."""

    task: str | None = None
    instruction: str = ""


@dataclass(frozen=True)
class Verdict:
    """The world's judgement of a submitted episode: `status` (complete, partial, incomplete, ...), its
    `reward`, the verifier's `evidence`, and `error` (None unless the world failed to judge)."""

    task: str
    status: str
    reward: float | None
    evidence: dict[str, Any]
    error: str | None


class WorldEnv(MCPToolClient):
    """OpenEnv's MCP tool client for one served world, at `base_url` (`http://HOST:PORT/envs/<env_id>`).
    `token`: the gateway's bearer token, if it has one."""

    def __init__(self, base_url: str, *, token: str | None = None, **options: Any):
        super().__init__(base_url=base_url, **options)
        self._http_base = base_url.rstrip("/")
        self._token = token

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def connect(self) -> WorldEnv:
        if self._ws is None and self._token:
            self._ws = await connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                additional_headers=self._headers(),
            )
        await super().connect()
        return self

    def tasks(self) -> list[dict[str, str]]:
        """The world's tasks: id and instruction of each."""
        response = httpx.get(f"{self._http_base}/tasks", headers=self._headers(), timeout=self._message_timeout)
        response.raise_for_status()
        return [{"id": t["id"], "instruction": t["instruction"]} for t in response.json()]

    async def reset(self, task: str | None = None, **options: Any) -> StepResult[Observation]:  # type: ignore[override]
        """A new episode bound to `task` (None: free play); the previous one closes."""
        return await super().reset(task=task, **options)

    async def submit(self, answer: str = "") -> Verdict:
        """End the episode with final reply `answer`: the world's verdict (the gateway serves `--verdicts`)."""
        result = await self.step(CallToolAction(tool_name="submit", arguments={"answer": answer}))
        observation = result.observation
        if not isinstance(observation, CallToolObservation) or observation.error is not None:
            problem = (
                observation.error.message
                if isinstance(observation, CallToolObservation) and observation.error
                else observation
            )
            raise RuntimeError(f"submit failed: {problem}")
        outcome = observation.result
        return Verdict(outcome["task"], outcome["status"], outcome["reward"], outcome["evidence"], outcome["error"])

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Observation]:
        observation = payload.get("observation", {})
        if "instruction" in observation:
            parsed = TaskObservation(
                task=observation.get("task"),
                instruction=observation["instruction"],
                done=payload.get("done", False),
                reward=payload.get("reward"),
            )
            return StepResult(observation=parsed, reward=payload.get("reward"), done=payload.get("done", False))
        return super()._parse_result(payload)
