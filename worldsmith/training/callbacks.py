"""Trainer callbacks that record a run: per-step metrics into the catalog, checkpoints into the
object store as they are written. (The progress bar, which needs neither, is `training/progress.py`;
the stop at a step boundary, `training/stopping.py`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tenacity import retry, stop_after_attempt, wait_exponential
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from worldsmith.models.training import StepMetrics
from worldsmith.storage.run_records import record_step
from worldsmith.training.checkpoints import save_checkpoint
from worldsmith.training.progress import step_metrics


class CatalogMetrics(TrainerCallback):
    """Writes each logged step's metrics as a `training_steps` row of run `run_id`, and keeps them."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.steps: list[StepMetrics] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if not logs or "train_runtime" in logs or not state.is_world_process_zero:
            return
        metrics = step_metrics(logs)
        self.steps.append({"step": state.global_step, **metrics})
        record_step(self.run_id, state.global_step, metrics)


@retry(stop=stop_after_attempt(3), wait=wait_exponential(multiplier=1, max=8), reraise=True)
def _store_checkpoint(run_id: int, directory: Path, step: int, metrics: dict[str, float]) -> str:
    return save_checkpoint(run_id, directory, step, metrics)


class CheckpointUpload(TrainerCallback):
    """Stores each trainer checkpoint (model, optimizer, scheduler, RNG and trainer state) in the
    object store, with its catalog row, as soon as every process has written it: a run killed
    later resumes from it (`worldsmith resume`). Only the main process uploads; `stored` lists
    (step, digest) in order."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.stored: list[tuple[int, str]] = []

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # each process writes its own RNG state into the directory
        if not state.is_world_process_zero:
            return
        step = state.global_step
        logged: dict[str, float] = next(
            (entry for entry in reversed(state.log_history) if entry.get("step") == step and "loss" in entry), {}
        )
        metrics = {k: v for k, v in step_metrics(logged).items() if k != "step"}
        directory = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        self.stored.append((step, _store_checkpoint(self.run_id, directory, step, metrics)))
