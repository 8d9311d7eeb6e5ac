"""verifiers (clients/worldsmith-verifiers): verifiers 0.4, in an environment of its own without worldsmith
(it pins mcp==2.0.0), loads the served example world with `vf.load_environment` and runs its own rollouts
(`Env.serving` and `Env.run_slot`, what `vf eval` runs per rollout) against `env serve --protocol openenv
--verdicts`: the taskset's harness runs verifiers' chat program, whose model is a scripted one behind a
real OpenAI-compatible HTTP endpoint (support/scripted_model.py) replying each play's actions. The tool
results the rollouts observe and the rewards verifiers records equal the same episodes' played directly
on the runtime."""

from __future__ import annotations

import json

import pytest
from support.client_venvs import client_python
from support.integrations import Play, played_directly, plays, run_client, served
from support.paths import GOLDEN
from support.scripted_model import ScriptedModel, scripted_model

from worldsmith.bundle.loader import load_bundle

pytestmark = pytest.mark.e2e

#: Loads the environment as verifiers does and runs one rollout per play, all at once, with verifiers' own
#: rollout machinery: argv[1] the world's base URL, argv[2] the model's, argv[3] the plays' task ids.
CLIENT = """
import asyncio, json, sys
import verifiers.v1 as vf

base_url, model_url, task_ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

async def main():
    config = vf.resolve_env_config({"taskset": {"id": "worldsmith-verifiers", "base_url": base_url}})
    env = vf.load_environment(config)
    tasks = {t.data.id: t for t in env.taskset}
    client = vf.EvalClientConfig(base_url=model_url, api_key_var="SCRIPTED_API_KEY")
    ctx = vf.ModelContext(model="scripted", client=client)
    async with env.serving():
        slots = [slot for task_id in task_ids for slot in env.slots(tasks[task_id])]
        episodes = await asyncio.gather(*(env.run_slot(slot, ctx) for slot in slots))
    played = []
    for episode in episodes:
        assert episode.ok, episode.errors
        (trace,) = episode.traces
        seen = [json.loads(m.content)["observation"] for m in trace.messages if m.role == "user"]
        played.append({"env": type(env).__name__, "task": episode.task.data.id,
                       "instruction": seen[0]["instruction"],
                       "actions": [m.content.strip() for m in trace.messages if m.role == "assistant"],
                       "values": [o["result"] if o.get("error") is None else None for o in seen[1:]],
                       "reward": trace.rewards["world_reward"].score})
    print(json.dumps({"tasks": sorted(tasks), "played": played}))

asyncio.run(main())
"""


def actions(play: Play) -> list[str]:
    """What the model replies in `play`: each call as an OpenEnv action, then `submit` with the answer."""
    calls = [{"type": "call_tool", "tool_name": n, "arguments": a} for n, a in play.calls]
    calls.append({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": play.answer}})
    return [json.dumps(c) for c in calls]


def test_verifiers_rollouts_play_the_served_world_as_the_runtime_does(home, monkeypatch):
    bundle = load_bundle(GOLDEN)
    episodes = [p for p in plays(bundle) if p.task == bundle.tasks[0].id]  # right and wrong: each turn is a process
    instructions = {t.id: t.instruction for t in bundle.tasks}
    model = ScriptedModel([(instructions[p.task], actions(p)) for p in episodes])
    python = client_python("worldsmith-verifiers")
    monkeypatch.setenv("SCRIPTED_API_KEY", "scripted")
    with served(GOLDEN) as url, scripted_model(model) as model_url:
        tasks = json.dumps([p.task for p in episodes])
        out = run_client(python, CLIENT, f"{url}/envs/{bundle.env_id}", model_url, tasks)
    assert out["tasks"] == sorted(t.id for t in bundle.tasks) and len(episodes) == 2
    by_actions = {json.dumps(actions(p)): p for p in episodes}
    assert sorted(json.dumps(p["actions"]) for p in out["played"]) == sorted(by_actions)  # each play, once
    for through_verifiers in out["played"]:
        play = by_actions[json.dumps(through_verifiers["actions"])]
        direct = played_directly(bundle, play)
        assert through_verifiers["env"] == "WorldEnv"
        assert through_verifiers["task"] == play.task
        assert instructions[play.task] in through_verifiers["instruction"]
        assert through_verifiers["values"] == direct["values"], play.task
        assert through_verifiers["reward"] == direct["reward"], play.task
    assert sorted(p["reward"] for p in out["played"]) == [0.0] + [1.0] * (len(episodes) - 1)
