"""OpenEnv (clients/worldsmith-openenv): OpenEnv 0.3's own client, in an environment of its own without
worldsmith, plays the example world served by `env serve --protocol openenv`; each call's result and
each verdict equal the same episode's played directly on the runtime."""

from __future__ import annotations

import json

import pytest
from support.integrations import played_directly, plays, through_client
from support.paths import GOLDEN

from worldsmith.bundle.loader import load_bundle

pytestmark = pytest.mark.e2e

#: Plays each episode with `WorldEnv` (OpenEnv's MCPToolClient): argv[1] the base URL, argv[2] the plays.
CLIENT = """
import asyncio, json, sys
from worldsmith_openenv import TaskObservation, WorldEnv

async def main():
    played = []
    async with WorldEnv(sys.argv[1]) as env:
        tasks = [t["id"] for t in env.tasks()]
        for play in json.loads(sys.argv[2]):
            reset = await env.reset(task=play["task"])
            assert isinstance(reset.observation, TaskObservation) and not reset.done
            assert reset.observation.task == play["task"] and reset.observation.instruction
            names = [t.name for t in await env.list_tools(use_cache=False)]
            values = []
            for name, arguments in play["calls"]:
                try:
                    values.append(await env.call_tool(name, **arguments))
                except RuntimeError:
                    values.append(None)
            verdict = await env.submit(play["answer"])
            state = await env.state()
            played.append({"values": values, "status": verdict.status, "reward": verdict.reward,
                           "submit_offered": "submit" in names, "steps": state.step_count})
    print(json.dumps({"tasks": tasks, "played": played}))

asyncio.run(main())
"""


def test_openenv_client_plays_the_served_world_as_the_runtime_does(home):
    bundle = load_bundle(GOLDEN)
    episodes = plays(bundle)
    out = through_client("worldsmith-openenv", CLIENT, bundle, json.dumps([p.as_json() for p in episodes]))
    assert out["tasks"] == [t.id for t in bundle.tasks]
    for play, through_openenv in zip(episodes, out["played"], strict=True):
        assert through_openenv["submit_offered"] and through_openenv["steps"] == len(play.calls) + 1
        direct = played_directly(bundle, play)
        assert {k: through_openenv[k] for k in direct} == direct, play.task
    assert [p["status"] for p in out["played"]] == ["complete"] * (len(episodes) - 1) + ["incomplete"]
