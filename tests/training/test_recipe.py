"""The training recipe's defaults and refusals: a reward map that cannot teach giving up (refused
otherwise, and shown by learning), a constant learning rate after a warm-up, importance masking per
token with its masked share, the truncated-turn rate."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from worldsmith.agent.loop import Trajectory, TurnRecord
from worldsmith.agent.rewards import RewardMap
from worldsmith.models.verdict import Verdict
from worldsmith.training.config import TrainingConfig
from worldsmith.training.importance import importance_ratio, masked_share
from worldsmith.training.rollouts import truncated_turn_rate
from worldsmith.training.rows import group_advantages
from worldsmith.training.trainer import grpo_settings

pytestmark = pytest.mark.unit


def test_the_default_reward_map_never_rewards_giving_up_over_trying():
    rewards = TrainingConfig(model="m", set_name="s").rewards
    gave_up = rewards.reward(Verdict.incomplete)  # an answer without any tool call: its verifier fails
    assert all(rewards.reward(v) >= gave_up for v in (Verdict.partial, Verdict.format_error, Verdict.agent_error))


@pytest.mark.parametrize("verdict", ["format_error", "partial", "agent_error"])
def test_a_reward_map_that_teaches_giving_up_is_refused_naming_the_setting(verdict):
    with pytest.raises(ValidationError) as refused:
        TrainingConfig(model="m", set_name="s", rewards={verdict: -1.0})
    (error,) = refused.value.errors()
    assert "\n" not in error["msg"]
    assert f"rewards.{verdict} (-1.0) is below rewards.incomplete (0.0)" in error["msg"]
    assert error["msg"].endswith(f"set rewards.{verdict} to at least 0.0")
    TrainingConfig(model="m", set_name="s", rewards={verdict: -1.0, "incomplete": -1.0})  # equal: no reason to give up


def play(logits: torch.Tensor, group: int, calls: int, rng: torch.Generator) -> tuple[list[Verdict], torch.Tensor]:
    """`group` episodes of a two-choice policy: give up (answer at once, verdict incomplete) or try,
    then each of `calls` tool calls right (probability sigmoid(logits[1])) or malformed (format_error,
    the episode ends); all right: complete. Returns the verdicts and each episode's log-probability."""
    verdicts, logps = [], []
    p_try, p_right = torch.sigmoid(logits[0]), torch.sigmoid(logits[1])
    for _ in range(group):
        tries = bool(torch.rand((), generator=rng) < p_try)
        logp = torch.log(p_try if tries else 1 - p_try)
        verdict = Verdict.incomplete
        if tries:
            verdict = Verdict.complete
            for _ in range(calls):
                right = bool(torch.rand((), generator=rng) < p_right)
                logp = logp + torch.log(p_right if right else 1 - p_right)
                if not right:
                    verdict = Verdict.format_error
                    break
        verdicts.append(verdict)
        logps.append(logp)
    return verdicts, torch.stack(logps)


def learn(rewards: RewardMap, steps: int = 60, group: int = 8, calls: int = 3) -> tuple[float, float]:
    """GRPO (one iteration per batch: the clipped ratio is 1, the loss -advantage x log-probability,
    advantages by the trainer's `group_advantages`) from a policy that mostly fails: it tries half
    the time and gets each of 3 calls right with probability 0.6 (success 0.108). As in a language
    model, the skill (right calls) learns slower than the habit (trying or not): Adam at 0.02 and
    0.1. Returns the final (probability of trying, probability of success)."""
    rng = torch.Generator().manual_seed(0)
    habit, skill = torch.tensor(0.0, requires_grad=True), torch.tensor(math.log(0.6 / 0.4), requires_grad=True)
    optimizer = torch.optim.Adam([{"params": [habit], "lr": 0.1}, {"params": [skill], "lr": 0.02}])
    for _ in range(steps):
        verdicts, logps = play(torch.stack([habit, skill]), group, calls, rng)
        advantages = torch.tensor(group_advantages([rewards.reward(v) for v in verdicts], group))
        optimizer.zero_grad()
        (-(advantages * logps).mean()).backward()
        optimizer.step()
    p_try, p_right = torch.sigmoid(habit).item(), torch.sigmoid(skill).item()
    return p_try, p_try * p_right**calls


def test_a_policy_that_mostly_fails_learns_to_try_under_the_default_rewards_not_to_give_up():
    """The default map (a malformed call worth what a wrong answer is) takes a policy at 11% success
    to trying nearly always and succeeding about half the time; the map it replaces (format_error -1,
    below what giving up gets) collapses the same policy, same seed, to giving up: the control
    (measured over seeds 0-3: 0.97-0.98 / 0.55-0.56 against 0.05-0.14 / 0.02-0.07)."""
    p_try, success = learn(RewardMap())
    assert p_try > 0.9 and success > 0.4
    collapsed_try, collapsed_success = learn(RewardMap(format_error=-1.0))
    assert collapsed_try < 0.2 and collapsed_success < 0.108  # below where it started


def test_the_learning_rate_is_constant_after_a_warm_up_of_a_tenth_of_the_steps(tmp_path: Path):
    def settings(**fields: int) -> tuple[str, int]:
        made = grpo_settings(TrainingConfig(model="m", set_name="s", **fields), tmp_path)
        return made["lr_scheduler_type"], made["warmup_steps"]

    assert settings(steps=100) == ("constant_with_warmup", 10)
    assert settings(steps=5) == ("constant_with_warmup", 0)  # a short run starts at its learning rate
    assert settings(steps=100, lr_warmup_steps=3) == ("constant_with_warmup", 3)


def test_importance_masking_is_per_token_and_its_masked_share_counts_loss_tokens_only(tmp_path: Path):
    assert grpo_settings(TrainingConfig(model="m", set_name="s"), tmp_path)["vllm_importance_sampling_mode"] == (
        "token_mask"
    )
    train = torch.zeros(2, 4)
    sampler = torch.tensor([[-0.1, -2.0, -0.1, 0.0], [-0.1, -0.1, -0.1, -0.1]])  # token 1 of row 0: ratio e^2 > 3
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    per_token = importance_ratio(train, sampler, mask, "token_mask", None, 3.0)
    assert masked_share(per_token, mask) == pytest.approx(1 / 7)  # one of the 7 loss tokens
    per_sequence = importance_ratio(train, sampler, mask, "sequence_mask", None, 3.0)
    assert masked_share(per_sequence, mask) == pytest.approx(3 / 7)  # row 0 whole
    assert masked_share(per_token, torch.zeros(2, 4)) == 0.0


def test_the_truncated_turn_rate_counts_turns_cut_off_before_a_stop_token():
    def rollout(*completions: list[int]) -> Trajectory:
        records = [TurnRecord(turn=i, completion_ids=ids) for i, ids in enumerate(completions, start=1)]
        return Trajectory(
            env_id="e", env_key="k", task_id="t", policy="p", messages=[], steps=[], turns=len(records),
            verdict="incomplete", reward=0.0, turn_records=records,
        )  # fmt: skip

    stop = 9
    full_length_with_stop, cut, short = [1, 2, stop], [1, 2, 3], [1, stop]
    trajectories = [rollout(full_length_with_stop, cut), rollout(short, cut), rollout()]
    assert truncated_turn_rate(trajectories, 3, [stop]) == 0.5
    assert truncated_turn_rate([rollout()], 3, [stop]) == 0.0
