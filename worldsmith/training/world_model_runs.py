"""A recorded world-model training run: the SFT of `training/world_model_sft.py` with its run, its
per-step losses and its final model as catalog rows (a training run whose config says
`kind: world_model`) and an object-store checkpoint."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from worldsmith.models.catalog import TrainingRun
from worldsmith.models.runs import RunStatus
from worldsmith.models.training import WorldModelTrainResult
from worldsmith.settings import get_settings
from worldsmith.storage.run_records import add_run, finish_run
from worldsmith.training.checkpoints import save_checkpoint
from worldsmith.training.config import TINY, WorldModelConfig
from worldsmith.training.world_model_sft import fine_tune, tiny_world_model
from worldsmith.worldmodel.transitions import Transition


def train_split(transitions: list[Transition]) -> list[Transition]:
    """The train split's transitions; ValueError when there are none (nothing to train on)."""
    train = [t for t in transitions if t.split == "train"]
    if not train:
        raise ValueError(
            "no transitions in the train split: nothing to train on; make them with `worldsmith wm data` "
            "(its --validation-fraction and --test-fraction leave the rest to train)"
        )
    return train


def train_world_model(
    transitions: list[Transition],
    config: WorldModelConfig,
    *,
    flow_run_id: str | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> WorldModelTrainResult:
    """A recorded run (of flow run `flow_run_id`, when one runs it): the model (tiny or given)
    fine-tuned on the train-split transitions, its steps and final model in the catalog and the
    object store. Returns the run's record. Once `stop_requested()` (Ctrl-C, SIGTERM), training ends at
    the next step boundary, the run reads `cancelled` and TrainingStopped is raised."""
    from worldsmith.training.callbacks import CatalogMetrics  # transformers, only once a run trains
    from worldsmith.training.launch import TrainingStopped
    from worldsmith.training.stopping import StopWhenRequested

    train = train_split(transitions)
    run_id = add_run(
        TrainingRun(
            config={"kind": "world_model", **config.model_dump(), "transitions": len(train)}, flow_run_id=flow_run_id
        )
    )
    out = Path(config.output) if config.output else get_settings().home / "world-models" / str(run_id)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            base = (
                tiny_world_model(Path(scratch) / "base", transitions, config.seed)
                if config.model == TINY
                else Path(config.model)
            )
            log = fine_tune(base, train, out, config, [CatalogMetrics(run_id), StopWhenRequested(stop_requested)])
        if stop_requested():
            raise TrainingStopped()
        digest = save_checkpoint(run_id, out, config.steps, {"final": True, **(log[-1] if log else {})})
    except BaseException as exc:
        status = RunStatus.CANCELLED if stop_requested() else RunStatus.FAILED  # a stop is no failure
        finish_run(TrainingRun, run_id, status, {"error": f"{type(exc).__name__}: {exc}"})
        raise
    result = WorldModelTrainResult(run_id=run_id, model=str(out), checkpoint=digest, steps=config.steps, log=log)
    finish_run(TrainingRun, run_id, RunStatus.COMPLETED, result.stored())
    return result
