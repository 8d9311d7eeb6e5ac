"""World-model training: supervised fine-tuning (TRL's SFTTrainer, `worldsmith/training/sft.py`) of
a causal LM to answer a transition's prompt with its observation and diff as JSON; the result is
used as a world model by `HFWorldModel` (`worldsmith/worldmodel/world_models.py`).

Profiles as for the policy: `cpu-test` trains a tiny Qwen3-architecture model built offline (its
tokenizer trained on the transitions' text), fp32 on the CPU; `gpu` trains a given model directory
in bf16 with gradient checkpointing. A run, its per-step losses and its final model are catalog
rows (a training run whose config says `kind: world_model`) and an object-store checkpoint.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from worldsmith.models.catalog import TrainingRun
from worldsmith.settings import get_settings
from worldsmith.storage.run_records import add_run, finish_run
from worldsmith.training.checkpoints import save_checkpoint
from worldsmith.training.config import TINY
from worldsmith.training.sft import supervised_fine_tune
from worldsmith.training.tiny import build_tiny_model
from worldsmith.worldmodel.transitions import Transition
from worldsmith.worldmodel.world_models import prompt, target


class WorldModelConfig(BaseModel):
    """A world-model SFT run."""

    model: str = Field(TINY, description="Model directory to fine-tune, or `tiny` (built offline, cpu-test).")
    profile: Literal["cpu-test", "gpu"] = "cpu-test"
    steps: int = Field(60, ge=1)
    learning_rate: float = Field(3e-3, gt=0)
    batch_size: int = Field(8, ge=1)
    seed: int = 0
    output: str | None = Field(None, description="Where the model goes (default WORLDSMITH_HOME/world-models/<run id>).")


def sft_rows(transitions: list[Transition]) -> list[dict[str, Any]]:
    """Prompt/completion rows (TRL's conversational format): the state and call in, the JSON out."""
    return [{"prompt": prompt(t, t.history), "completion": [{"role": "assistant", "content": target(t)}]} for t in transitions]


def tiny_world_model(out: Path, transitions: list[Transition], seed: int = 0) -> Path:
    """A tiny Qwen3 model whose tokenizer is trained on the transitions' prompts and answers."""
    texts = [m["content"] for row in sft_rows(transitions) for m in row["prompt"] + row["completion"]]
    return build_tiny_model(out, [], seed=seed, texts=texts)


def fine_tune(model_dir: Path, transitions: list[Transition], out: Path, config: WorldModelConfig, callbacks: list[Any] = ()) -> list[dict[str, Any]]:
    """SFT of `model_dir` on `transitions` for `config.steps` steps (loss on the answers only);
    saves model and tokenizer to `out`; returns the trainer's log of losses."""
    import torch

    gpu = config.profile == "gpu"
    if gpu and not torch.cuda.is_available():
        raise ValueError("profile 'gpu' needs a CUDA device; use profile 'cpu-test' on this machine")
    return supervised_fine_tune(model_dir, sft_rows(transitions), out, steps=config.steps, learning_rate=config.learning_rate,
                                batch_size=config.batch_size, seed=config.seed, logging_steps=max(1, config.steps // 10), gpu=gpu,
                                callbacks=list(callbacks))


def train_world_model(transitions: list[Transition], config: WorldModelConfig, *,
                      flow_run_id: str | None = None) -> dict[str, Any]:
    """A recorded run (of flow run `flow_run_id`, when one runs it): the model (tiny or given)
    fine-tuned on the train-split transitions, its steps and final model in the catalog and the
    object store. Returns the run's record."""
    from worldsmith.training.callbacks import CatalogMetrics  # transformers, only once a run trains

    train = [t for t in transitions if t.split == "train"]
    if not train:
        raise ValueError("no transitions in the train split: nothing to train on")
    run_id = add_run(TrainingRun(config={"kind": "world_model", **config.model_dump(), "transitions": len(train)},
                                 flow_run_id=flow_run_id))
    out = Path(config.output) if config.output else get_settings().home / "world-models" / str(run_id)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            base = tiny_world_model(Path(scratch) / "base", transitions, config.seed) if config.model == TINY else Path(config.model)
            log = fine_tune(base, train, out, config, [CatalogMetrics(run_id)])
        digest = save_checkpoint(run_id, out, config.steps, {"final": True, **(log[-1] if log else {})})
    except BaseException as exc:
        finish_run(TrainingRun, run_id, "failed", {"error": f"{type(exc).__name__}: {exc}"})
        raise
    result = {"run_id": run_id, "model": str(out), "checkpoint": digest, "steps": config.steps, "log": log}
    finish_run(TrainingRun, run_id, "completed", {k: v for k, v in result.items() if k != "log"})
    return result
