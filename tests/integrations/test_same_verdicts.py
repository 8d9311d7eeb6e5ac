"""A world behaves the same through every interface: the same tool calls and answer, played through the
environment object, Gymnasium, SkyRL-gym, TRL's environment, and OpenEnv's client against `env serve
--protocol openenv --verdicts`, give the verdict and reward of the same episode played directly on the
runtime (the plays of support/integrations.py: each reference solution, and a wrong answer after a
refused call)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import skyrl_gym
from support.integrations import Play, played_directly, plays, through_client
from support.paths import GOLDEN

from worldsmith.bundle.loader import load_bundle
from worldsmith.integrations.environment import TaskRef, WorldEnv
from worldsmith.integrations.gymnasium_env import WorldGymEnv
from worldsmith.integrations.skyrl_env import use_env
from worldsmith.integrations.trl_env import environment_factory, world_reward

pytestmark = pytest.mark.e2e

#: OpenEnv's client (clients/worldsmith-openenv) plays each play: argv[1] the base URL, argv[2] the plays.
OPENENV = """
import asyncio, json, sys
from worldsmith_openenv import WorldEnv

async def main():
    verdicts = []
    async with WorldEnv(sys.argv[1]) as env:
        for play in json.loads(sys.argv[2]):
            await env.reset(task=play["task"])
            for name, arguments in play["calls"]:
                try:
                    await env.call_tool(name, **arguments)
                except RuntimeError:
                    pass
            verdict = await env.submit(play["answer"])
            verdicts.append([verdict.status, verdict.reward])
    print(json.dumps(verdicts))

asyncio.run(main())
"""


def as_text(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def through_env(env: WorldEnv, world: str, play: Play) -> tuple[str, float]:
    with env.reset(TaskRef(world, play.task)) as episode:
        for name, arguments in play.calls:
            episode.step({"name": name, "arguments": arguments})
        episode.step(play.answer)
        judged = episode.verify()
    return judged.verdict.value, judged.reward


def through_gymnasium(env: WorldEnv, play: Play) -> tuple[str, float]:
    gym = WorldGymEnv(env=env)
    gym.reset(options={"task": play.task})
    for name, arguments in play.calls:
        gym.step(as_text(name, arguments))
    _, reward, terminated, _, info = gym.step(play.answer)
    assert terminated
    return info["verdict"], float(reward)


def through_skyrl(world: str, play: Play) -> tuple[str, float]:
    sky = skyrl_gym.make("worldsmith", env_config={}, extras={"world": world, "task_id": play.task})
    sky.init([])
    for name, arguments in play.calls:
        sky.step(as_text(name, arguments))
    output = sky.step(play.answer)
    sky.close()
    assert output["done"]
    return output["metadata"]["verdict"], float(output["reward"])


def through_trl(env: WorldEnv, world: str, play: Play) -> tuple[str, float]:
    instance = environment_factory(env)[world]()
    instance.reset(task_id=play.task)
    for name, arguments in play.calls:
        try:
            getattr(instance, name)(**arguments)
        except TypeError:  # an argument the tool has not: TRL reports the call's failure to the model
            pass
    (reward,) = world_reward(completions=[[{"role": "assistant", "content": play.answer}]], environments=[instance])
    assert instance.episode is not None and reward is not None
    return instance.episode.verify().verdict.value, reward


def test_the_same_calls_give_the_same_verdicts_through_every_interface(home, runtime):
    bundle = load_bundle(GOLDEN)
    episodes = plays(bundle)
    direct = [played_directly(bundle, p) for p in episodes]
    expected = [(d["status"], d["reward"]) for d in direct]
    assert [status for status, _ in expected] == ["complete"] * (len(episodes) - 1) + ["incomplete"]
    env = WorldEnv(bundle, runtime=runtime)
    world = bundle.env_id
    use_env(env)
    try:
        interfaces = {
            "WorldEnv": [through_env(env, world, p) for p in episodes],
            "gymnasium": [through_gymnasium(env, p) for p in episodes],
            "skyrl_gym": [through_skyrl(world, p) for p in episodes],
            "trl": [through_trl(env, world, p) for p in episodes],
        }
    finally:
        use_env(None)
    played = through_client("worldsmith-openenv", OPENENV, bundle, json.dumps([p.as_json() for p in episodes]))
    interfaces["openenv"] = [(status, reward) for status, reward in played]
    for name, verdicts in interfaces.items():
        assert verdicts == expected, name
    assert runtime.open_episodes == 0
