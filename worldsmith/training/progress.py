"""A rich progress bar over a trainer's optimizer steps, and the numeric entries of a log record.
Needs only transformers and rich: the GPU smoke scripts use it without the orchestration stack."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

SHOWN = ("reward", "success_rate", "loss")


def step_metrics(logs: Mapping[str, float]) -> dict[str, float]:
    """The numeric, finite entries of one log record (JSON columns cannot hold NaN)."""
    return {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and math.isfinite(v)}


class ProgressBar(TrainerCallback):
    """A rich progress bar over the optimizer steps, showing the latest reward, success rate and loss."""

    def __init__(self, description: str = "training"):
        self.description = description
        self.progress: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        if not state.is_world_process_zero:
            return
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[latest]}"),
        )
        self.progress.start()
        self.task = self.progress.add_task(self.description, total=state.max_steps, latest="")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if self.progress is not None and logs:
            latest = "  ".join(f"{k} {logs[k]:.3f}" for k in SHOWN if isinstance(logs.get(k), (int, float)))
            self.progress.update(self.task, completed=state.global_step, latest=latest)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)
            self.progress.stop()
            self.progress = None
