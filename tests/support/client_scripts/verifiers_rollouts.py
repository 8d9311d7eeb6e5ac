"""verifiers' own rollouts of a served world, run by the worldsmith-verifiers client's Python (its environment
has verifiers and no worldsmith, so this module imports only the stdlib and verifiers): `vf.load_environment`
on the world's base URL, then one rollout of a task per call (`Env.serving` and `Env.run_slot`, what `vf eval`
runs per rollout), the taskset's harness running verifiers' chat program against the OpenAI-compatible model
at the model URL (support/scripted_model.py), its key in `SCRIPTED_API_KEY`.

    <client python> tests/support/client_scripts/verifiers_rollouts.py BASE_URL MODEL_URL TASK_IDS_JSON

plays the tasks' rollouts all at once and prints, as JSON, the taskset's task ids and each rollout as played
(tests/integrations/test_verifiers.py); bench/adapters.py times `Rollouts.reward` through `rollouts`."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import verifiers.v1 as vf


class Rollouts:
    """The loaded environment, serving: `tasks` by id, and a rollout of one of them."""

    def __init__(self, env: Any, ctx: Any):
        self.env, self.ctx = env, ctx
        self.tasks = {t.data.id: t for t in env.taskset}

    async def run(self, task_id: str) -> Any:
        """One rollout of task `task_id` (its one slot): verifiers' episode."""
        (slot,) = self.env.slots(self.tasks[task_id])
        return await self.env.run_slot(slot, self.ctx)

    async def reward(self, task_id: str) -> float:
        """The reward verifiers records for one rollout of task `task_id`."""
        return float(reward_of(await self.run(task_id)))


def reward_of(episode: Any) -> Any:
    return episode.traces[0].rewards["world_reward"].score


@asynccontextmanager
async def rollouts(base_url: str, model_url: str) -> AsyncIterator[Rollouts]:
    """The environment at `base_url` loaded as verifiers loads it, its model the one at `model_url`, serving."""
    config = vf.resolve_env_config({"taskset": {"id": "worldsmith-verifiers", "base_url": base_url}})
    env = vf.load_environment(config)
    client = vf.EvalClientConfig(base_url=model_url, api_key_var="SCRIPTED_API_KEY")
    ctx = vf.ModelContext(model="scripted", client=client)
    async with env.serving():
        yield Rollouts(env, ctx)


def played(env: Any, episode: Any) -> dict[str, Any]:
    """One rollout as played: the environment's class, the task, the instruction the model saw, its replies,
    each call's result (None where the tool failed) and the reward."""
    assert episode.ok, episode.errors
    (trace,) = episode.traces
    seen = [json.loads(m.content)["observation"] for m in trace.messages if m.role == "user"]
    return {
        "env": type(env).__name__,
        "task": episode.task.data.id,
        "instruction": seen[0]["instruction"],
        "actions": [m.content.strip() for m in trace.messages if m.role == "assistant"],
        "values": [o["result"] if o.get("error") is None else None for o in seen[1:]],
        "reward": reward_of(episode),
    }


async def main(base_url: str, model_url: str, task_ids: list[str]) -> None:
    async with rollouts(base_url, model_url) as world:
        episodes = await asyncio.gather(*(world.run(task_id) for task_id in task_ids))
    print(json.dumps({"tasks": sorted(world.tasks), "played": [played(world.env, e) for e in episodes]}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
