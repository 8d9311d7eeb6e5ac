"""verifiers (clients/worldsmith-verifiers): verifiers 0.4, in an environment of its own without worldsmith
(it pins mcp==2.0.0), loads the served example world with `vf.load_environment` and plays each task with
its episode loop (`WorldEnv.run`, verifiers' OpenEnv loop over the world's tools) against `env serve --protocol openenv
--verdicts`; the tool results the loop observes and the rewards it records equal the same episodes' played
directly on the runtime.

The policy is scripted: verifiers 0.4 drives a model through a harness program that `uv` installs into
a runtime of its own at the first rollout (docs/integrations.md, verifiers), so the test stands a scripted
player in the seat the harness fills, replying each play's actions as a model would."""

from __future__ import annotations

import json

import pytest
from support.client_venvs import client_python
from support.integrations import played_directly, plays, run_client, served
from support.paths import GOLDEN

from worldsmith.bundle.loader import load_bundle

pytestmark = pytest.mark.e2e

#: Loads the environment as verifiers does and runs each play through WorldEnv.run: argv[1] the base URL,
#: argv[2] the plays.
CLIENT = """
import asyncio, contextlib, json, sys
import verifiers.v1 as vf

base_url, plays = sys.argv[1], json.loads(sys.argv[2])

class Trace:
    def __init__(self):
        self.rewards, self.stopped = {}, None
    def record_reward(self, name, value):
        self.rewards[name] = value
    def stop(self, reason):
        self.stopped = reason

class Segment:
    def __init__(self, reply):
        self.last_reply, self.terminated = reply, reply is None

class Interaction:
    '''The seat a harness fills: each turn shows the policy an observation and answers its next action.'''
    def __init__(self, actions):
        self.trace, self.actions, self.observations = Trace(), list(actions), []
    async def turn(self, payload):
        self.observations.append(json.loads(payload)["observation"])
        return Segment(json.dumps(self.actions.pop(0)) if self.actions else None)

class Seat:
    def __init__(self, actions):
        self.last = Interaction(actions)
    @contextlib.asynccontextmanager
    async def interaction(self, task):
        yield self.last

class Agents:
    def __init__(self, actions):
        self.player = Seat(actions)

async def main():
    config = vf.resolve_env_config({"taskset": {"id": "worldsmith-verifiers", "base_url": base_url}})
    env = vf.load_environment(config)
    tasks = {t.data.id: t for t in vf.load_taskset(config.taskset)}
    played = []
    for play in plays:
        actions = [{"type": "call_tool", "tool_name": n, "arguments": a} for n, a in play["calls"]]
        actions.append({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": play["answer"]}})
        agents = Agents(actions)
        await env.run(tasks[play["task"]], agents)
        seen = agents.player.last.observations
        values = [o["result"] if o.get("error") is None else None for o in seen[1:]]
        played.append({"env": type(env).__name__, "instruction": seen[0]["instruction"], "values": values,
                       "reward": agents.player.last.trace.rewards["world_reward"]})
    print(json.dumps({"tasks": sorted(tasks), "played": played}))

asyncio.run(main())
"""


def test_verifiers_loop_plays_the_served_world_as_the_runtime_does(home):
    bundle = load_bundle(GOLDEN)
    episodes = plays(bundle)
    python = client_python("worldsmith-verifiers")
    with served(GOLDEN) as url:
        out = run_client(python, CLIENT, f"{url}/envs/{bundle.env_id}", json.dumps([p.as_json() for p in episodes]))
    assert out["tasks"] == sorted(t.id for t in bundle.tasks)
    instructions = {t.id: t.instruction for t in bundle.tasks}
    for play, through_verifiers in zip(episodes, out["played"], strict=True):
        direct = played_directly(bundle, play)
        assert through_verifiers["env"] == "WorldEnv"
        assert instructions[play.task] in through_verifiers["instruction"]
        assert through_verifiers["values"] == direct["values"], play.task
        assert through_verifiers["reward"] == direct["reward"], play.task
    assert [p["reward"] for p in out["played"]] == [1.0] * (len(episodes) - 1) + [0.0]
