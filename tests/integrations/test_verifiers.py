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
from support.integrations import played_directly, plays, through_client
from support.paths import GOLDEN, TESTS
from support.scripted_model import ScriptedModel, scripted_model

from worldsmith.bundle.loader import load_bundle

pytestmark = pytest.mark.e2e

#: Loads the environment as verifiers does and runs one rollout per play, all at once, with verifiers' own
#: rollout machinery: argv[1] the world's base URL, argv[2] the model's, argv[3] the plays' task ids.
ROLLOUTS = TESTS / "support" / "client_scripts" / "verifiers_rollouts.py"


def test_verifiers_rollouts_play_the_served_world_as_the_runtime_does(home, monkeypatch):
    bundle = load_bundle(GOLDEN)
    episodes = [p for p in plays(bundle) if p.task == bundle.tasks[0].id]  # right and wrong: each turn is a process
    instructions = {t.id: t.instruction for t in bundle.tasks}
    model = ScriptedModel([(instructions[p.task], p.actions()) for p in episodes])
    monkeypatch.setenv("SCRIPTED_API_KEY", "scripted")
    with scripted_model(model) as model_url:
        tasks = json.dumps([p.task for p in episodes])
        out = through_client("worldsmith-verifiers", ROLLOUTS, bundle, model_url, tasks)
    assert out["tasks"] == sorted(t.id for t in bundle.tasks) and len(episodes) == 2
    by_actions = {json.dumps(p.actions()): p for p in episodes}
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
