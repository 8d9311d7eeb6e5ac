"""A training run's success rate on its own tasks and on held-out tasks of the same kind (the same
tools, other records: curriculum.held_out_bundles): rollouts sampled exactly as GRPO samples them (the
trainer's policy, temperature and seeding), before and after training (TrainingConfig.success_samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worldsmith.models.training import SuccessRate, SuccessRates
from worldsmith.models.verdict import Verdict


def success_line(success: SuccessRates) -> str:
    """Success rates before and after as people read them: "0.062 -> 0.398 (128 rollouts each)", and
    the held-out tasks' after it when they were measured."""
    line = f"{success.before.rate:.3f} -> {success.after.rate:.3f} ({success.after.rollouts} rollouts each)"
    if success.held_out_before is not None and success.held_out_after is not None:
        line += (
            f"; held-out tasks of the same kind {success.held_out_before.rate:.3f} -> "
            f"{success.held_out_after.rate:.3f} ({success.held_out_after.rollouts} rollouts each)"
        )
    return line


def success_rates(trainer: Any, samples: int, held_out: Sequence[str] = ()) -> tuple[SuccessRate, SuccessRate | None]:
    """The share of `samples` rollouts of every (env, task) row of `trainer`'s dataset that end complete,
    and the same over the tasks of the `held_out` bundle keys (keys of `trainer.bundles` outside its
    dataset; None when there are none); one batch of rollouts by `trainer.rollouts` (a
    WorldGRPOTrainer) at its current step."""
    trained = [{"bundle": row["bundle"], "task_id": row["task_id"]} for row in trainer.train_dataset]
    other = [{"bundle": key, "task_id": task.id} for key in held_out for task in trainer.bundles[key].tasks]
    inputs = [ref for ref in trained + other for _ in range(samples)]
    with trainer.generation_lockstep():  # a sharded model generates in step with the other processes
        complete = [t.verdict == Verdict.complete for t in trainer.rollouts(inputs)]
    split = len(trained) * samples

    def rate(outcomes: list[bool]) -> SuccessRate:
        return SuccessRate(rate=sum(outcomes) / len(outcomes), rollouts=len(outcomes))

    return rate(complete[:split]), rate(complete[split:]) if other else None
