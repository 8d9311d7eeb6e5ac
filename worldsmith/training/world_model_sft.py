"""World-model training: supervised fine-tuning (TRL's SFTTrainer, `worldsmith/training/sft.py`) of
a causal LM to answer a transition's prompt with its observation and diff as JSON; the result is
used as a world model by `HFWorldModel` (`worldsmith/worldmodel/world_models.py`).

Profiles as for the policy: `cpu-test` trains a tiny Qwen3-architecture model built offline (its
tokenizer trained on the transitions' text), fp32 on the CPU; `gpu` trains a given model directory
in bf16 compute over fp32 master weights, with gradient checkpointing. Needs no catalog (the GPU smoke runs it without the
orchestration stack); a recorded run is `training/world_model_runs.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from worldsmith.training.config import WorldModelConfig
from worldsmith.training.sft import TextPromptCompletion, supervised_fine_tune
from worldsmith.training.tiny import build_tiny_model
from worldsmith.worldmodel.transitions import Transition
from worldsmith.worldmodel.world_models import prompt, target


def sft_rows(transitions: list[Transition]) -> list[TextPromptCompletion]:
    """Prompt/completion rows (TRL's conversational format): the state and call in, the JSON out."""
    return [
        {"prompt": prompt(t, t.history), "completion": [{"role": "assistant", "content": target(t)}]}
        for t in transitions
    ]


def tiny_world_model(out: Path, transitions: list[Transition], seed: int = 0) -> Path:
    """A tiny Qwen3 model whose tokenizer is trained on the transitions' prompts and answers."""
    texts = [m["content"] for row in sft_rows(transitions) for m in row["prompt"] + row["completion"]]
    return build_tiny_model(out, [], seed=seed, texts=texts)


def fine_tune(
    model_dir: Path, transitions: list[Transition], out: Path, config: WorldModelConfig, callbacks: Sequence[Any] = ()
) -> list[dict[str, float]]:
    """SFT of `model_dir` on `transitions` for `config.steps` steps (loss on the answers only);
    saves model and tokenizer to `out`; returns the trainer's log of losses."""
    import torch

    gpu = config.profile == "gpu"
    if gpu and not torch.cuda.is_available():
        raise ValueError("profile 'gpu' needs a CUDA device; use profile 'cpu-test' on this machine")
    return supervised_fine_tune(
        model_dir,
        sft_rows(transitions),
        out,
        steps=config.steps,
        learning_rate=config.learning_rate,
        batch_size=config.batch_size,
        seed=config.seed,
        logging_steps=max(1, config.steps // 10),
        gpu=gpu,
        callbacks=list(callbacks),
    )
