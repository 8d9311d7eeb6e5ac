"""Simulated training's two views of reward, and imagined rollouts from real mid-episode states: the
per-step rewards of real and imagined rollouts apart, and a rollout of the trained policy that starts
where a real episode of the task stood after its first turns (replayed in the real world), the policy
seeing those turns as its own, the world model continuing on that database."""

from __future__ import annotations

import random

import pytest
from support.scripts import call_text

from worldsmith.agent.hf_policy import render_prompt
from worldsmith.agent.loop import EpisodeConfig, Trajectory, run_episode, visible
from worldsmith.agent.policies import ReferencePolicy
from worldsmith.training.config import TrainingConfig
from worldsmith.training.rollout_metrics import world_rewards
from worldsmith.training.rollouts import Sampled, TrainingPolicy, run_rollouts
from worldsmith.worldmodel.config import SimulationConfig
from worldsmith.worldmodel.real_starts import RealStarts, StartedSimulation, real_start, tool_turns
from worldsmith.worldmodel.simulated import SimulatedRuntime

pytestmark = pytest.mark.unit

TASK = "t01_points_balance"


def rollout(world: str, verdict: str, reward: float | None) -> Trajectory:
    return Trajectory(
        env_id="e", env_key="k", task_id="t", policy="p", world=world, messages=[], steps=[], turns=1,
        verdict=verdict, reward=reward,
    )  # fmt: skip


def test_real_rewards_are_logged_apart_from_imagined_ones():
    imagined = "simulated:hf:wm"
    step = [
        rollout("real", "complete", 1.0),
        rollout("real", "incomplete", 0.0),
        rollout(imagined, "complete", 1.0),
        rollout(imagined, "complete", 1.0),
        rollout(imagined, "env_error", None),  # stopped as uncertain: no reward, not counted
    ]
    metrics = world_rewards(step)
    assert metrics == {
        "reward_real": 0.5,
        "success_rate_real": 0.5,
        "reward_imagined": 1.0,
        "success_rate_imagined": 1.0,
        "reward_gap": 0.5,
    }
    assert set(world_rewards(step[2:])) == {"reward_imagined", "success_rate_imagined"}  # no real rollout: no gap


def test_real_starts_need_simulation():
    with pytest.raises(ValueError, match="real_starts applies to simulated training only"):
        TrainingConfig(model="m", set_name="s", real_starts=0.5)


@pytest.mark.e2e
def test_an_imagined_rollout_continues_a_real_episode_from_its_middle(runtime, golden, tiny_model):
    from transformers import AutoTokenizer

    task = golden.task(TASK)
    reference = run_episode(runtime, golden, task, ReferencePolicy())
    assert len(tool_turns(reference)) >= 2
    start = real_start(runtime, golden, task, reference, 1, "reference")
    assert [s.call.name for s in start.steps] == [task.solution[0].tool] and start.history[0]["action"]["name"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rest = [call_text(s.tool, s.arguments) for s in task.solution[1:]] + [f"{task.answer}<|im_end|>"]

    def generate_batch(prompts: list[list[int]]) -> list[Sampled]:
        return [Sampled(tokenizer.encode(rest.pop(0), add_special_tokens=False)) for _ in prompts]

    simulation = SimulatedRuntime(runtime, SimulationConfig(world_model="code"))

    def policy(batcher, index):
        return TrainingPolicy(object(), tokenizer, batcher, index, prefix=start.messages, window=1)

    config = EpisodeConfig(max_turns=4, window=1)
    (trajectory,) = run_rollouts(
        runtime, [(golden, task)], policy, generate_batch, config, [StartedSimulation(simulation, start)]
    )
    assert trajectory.world == "simulated:code" and trajectory.verdict == "complete"  # the real turn's work counted
    assert len(trajectory.steps) == len(task.solution) - 1  # only its own calls ran in imagination
    first = trajectory.turn_records[0].prompt_ids
    assert first == render_prompt(tokenizer, visible([*trajectory.messages[:2], *start.messages], 1), trajectory.tools)
    assert simulation.stats.calls == len(task.solution) - 1


@pytest.mark.sandbox
def test_starts_come_from_the_runs_real_rollouts_else_the_reference_solution(runtime, golden):
    starts = RealStarts(runtime)
    task = golden.task(TASK)
    drawn = starts.draw(golden, task, random.Random(0))
    assert drawn is not None and drawn.source == "reference" and 1 <= drawn.turns <= len(task.solution)
    real = run_episode(runtime, golden, task, ReferencePolicy())
    imagined = real.model_copy(update={"world": "simulated:code"})
    starts.add([real, imagined])
    assert len(starts.seen[(golden.key, TASK)]) == 1  # only real episodes are real states
    assert starts.draw(golden, task, random.Random(0)).source == "rollout"
