"""What a GRPO step logs of its rollouts: rewards, verdict rates, turns, tokens, rows, truncated turns
and, in simulated training, the real and imagined worlds apart (TRL averages each per logging step)."""

from __future__ import annotations

from typing import Any

from worldsmith.agent.loop import Trajectory
from worldsmith.models.verdict import Verdict
from worldsmith.training.rollouts import truncated_turn_rate
from worldsmith.training.rows import TrainingRow


def world_rewards(trajectories: list[Trajectory]) -> dict[str, float]:
    """Rewards and success rates of a step's real and imagined rollouts apart (`reward_real`,
    `reward_imagined`, `success_rate_real`, `success_rate_imagined`; each only when the step has such
    rollouts scored), and `reward_gap` (imagined - real) when it has both: a gap that widens over a run
    is the sign that the policy exploits the world model. env_error rollouts have no reward."""
    out: dict[str, float] = {}
    for name, imagined in (("real", False), ("imagined", True)):
        scored = [t for t in trajectories if (t.world != "real") == imagined and t.reward is not None]
        if scored:
            out[f"reward_{name}"] = sum(t.reward for t in scored if t.reward is not None) / len(scored)
            out[f"success_rate_{name}"] = sum(t.verdict == Verdict.complete for t in scored) / len(scored)
    if "reward_real" in out and "reward_imagined" in out:
        out["reward_gap"] = out["reward_imagined"] - out["reward_real"]
    return out


def rollout_metrics(
    trajectories: list[Trajectory],
    rewards: Any,
    rows: list[TrainingRow],
    max_completion_length: int,
    stop_ids: list[int],
    simulated: bool,
) -> dict[str, float]:
    """One step's metrics of its (non-empty) `trajectories`; `rewards` the gathered reward tensor (NaN:
    env_error or dropped), `rows` the training rows built from them; with `simulated`, the share of
    imagined rollouts and `world_rewards`."""
    import torch

    def rate(*verdicts: Verdict) -> float:
        return sum(t.verdict in verdicts for t in trajectories) / len(trajectories)

    finite = rewards[~torch.isnan(rewards)]
    metrics = {
        "reward": finite.mean().item() if finite.numel() else float("nan"),
        "reward_std": finite.std().item() if finite.numel() > 1 else 0.0,
        "success_rate": rate(Verdict.complete),
        "env_error_rate": rate(Verdict.env_error),
        "format_error_rate": rate(Verdict.format_error),
        "turns": sum(t.turns for t in trajectories) / len(trajectories),
        "tokens": sum(t.tokens_out for t in trajectories) / len(trajectories),
        "rows": float(len(rows)),
        "truncated_turn_rate": truncated_turn_rate(trajectories, max_completion_length, stop_ids),
    }
    if simulated:
        metrics["imagined_rate"] = sum(t.world != "real" for t in trajectories) / len(trajectories)
        metrics.update(world_rewards(trajectories))
    return metrics
