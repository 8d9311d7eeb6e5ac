"""Gymnasium (worldsmith/integrations/gymnasium_env.py), driven through Gymnasium's own API: its
environment checker, `gymnasium.make` through the registration, and a vector environment of several
copies sharing one WorldEnv (its pool), on the example world and a generated one."""

from __future__ import annotations

import json

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import SyncVectorEnv

from worldsmith.integrations.environment import WorldEnv
from worldsmith.integrations.gymnasium_env import ENV_ID, WorldGymEnv
from worldsmith.llm.procedural.backend import procedural_bundle

pytestmark = pytest.mark.sandbox


def call(tool: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def test_gymnasiums_checker_passes_the_registered_environment(golden):
    made = gymnasium.make(ENV_ID, worlds=golden)
    try:
        check_env(made.unwrapped)  # spaces, seeded resets, step determinism, data not reused
        first, _ = made.reset(seed=7)
        assert made.reset(seed=7)[0] == first  # the seed picks the task
    finally:
        made.close()


def test_an_episode_through_make_solves_its_task(golden, runtime):
    """The reference solution as the model's text: reward 0 until the answer, then the verified reward."""
    task = golden.tasks[0]
    made = gymnasium.make(ENV_ID, env=WorldEnv(golden, runtime=runtime))
    observation, info = made.reset(options={"task": task.id})
    assert task.instruction in observation and "<tool_call>" in observation
    assert info["task_id"] == task.id and {t["name"] for t in info["tools"]} == {t.name for t in golden.tools}
    for step in task.solution:
        observation, reward, terminated, truncated, _ = made.step(call(step.tool, step.arguments))
        assert (reward, terminated, truncated) == (0.0, False, False) and observation
    _, reward, terminated, truncated, info = made.step(task.answer or "Done.")
    assert (reward, terminated, truncated, info["verdict"]) == (1.0, True, False, "complete")
    made.close()


def test_a_vector_of_envs_plays_a_generated_world_at_once(runtime):
    """Three copies on one WorldEnv (its pool), each on the task its seed draws, step by step together:
    each copy's reference solution earns 1.0 when its answer ends it."""
    generated = procedural_bundle("clinic", 1)
    shared = WorldEnv(generated, runtime=runtime)
    vector = SyncVectorEnv([lambda: WorldGymEnv(env=shared) for _ in range(3)])
    _, infos = vector.reset(seed=[1, 2, 3])
    plans = []
    for task_id in infos["task_id"]:
        task = generated.task(str(task_id))
        plans.append([call(s.tool, s.arguments) for s in task.solution] + [task.answer or "Done."])
    final: dict[int, float] = {}
    for turn in range(max(len(plan) for plan in plans)):
        actions = [plan[min(turn, len(plan) - 1)] for plan in plans]
        _, rewards, terminated, _, _ = vector.step(actions)
        final.update({i: float(rewards[i]) for i in range(3) if terminated[i] and i not in final})
    vector.close()
    assert final == {0: 1.0, 1: 1.0, 2: 1.0}
    assert runtime.open_episodes == 0
