"""A training run's success rate on its own tasks: rollouts sampled exactly as GRPO samples them (the
trainer's policy, temperature and seeding), before and after training (TrainingConfig.success_samples).
"""

from __future__ import annotations

from typing import Any

from worldsmith.models.training import SuccessRate, SuccessRates
from worldsmith.models.verdict import Verdict


def success_line(success: SuccessRates) -> str:
    """Success rates before and after as people read them: "0.062 -> 0.398 (128 rollouts each)"."""
    return f"{success.before.rate:.3f} -> {success.after.rate:.3f} ({success.after.rollouts} rollouts each)"


def success_rate(trainer: Any, samples: int) -> SuccessRate:
    """The share of `samples` rollouts of every (env, task) row of `trainer`'s dataset, run by
    `trainer.rollouts` (a WorldGRPOTrainer) at its current step, that end complete."""
    inputs = [
        {"bundle": row["bundle"], "task_id": row["task_id"]} for row in trainer.train_dataset for _ in range(samples)
    ]
    with trainer.generation_lockstep():  # a sharded model generates in step with the other processes
        trajectories = trainer.rollouts(inputs)
    return SuccessRate(
        rate=sum(t.verdict == Verdict.complete for t in trajectories) / len(trajectories), rollouts=len(inputs)
    )
