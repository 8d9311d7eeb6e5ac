"""Supervised fine-tuning with TRL's SFTTrainer: the one recipe behind the policy's warm-up and
world-model training (loss on the completions only, constant learning rate, nothing on stdout)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from worldsmith.agent.datasets import PromptCompletion


class TextPromptCompletion(TypedDict):
    """A prompt/completion row of plain chat messages ({"role", "content"}), as a world model learns them."""

    prompt: list[dict[str, str]]
    completion: list[dict[str, str]]


def supervised_fine_tune(
    model_dir: Path,
    rows: Sequence[PromptCompletion] | Sequence[TextPromptCompletion],
    out: Path,
    *,
    steps: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    logging_steps: int,
    gpu: bool = False,
    callbacks: Sequence[Any] = (),
) -> list[dict[str, float]]:
    """SFT of `model_dir` on prompt/completion `rows` for `steps` steps, fp32 on the CPU or (`gpu`) bf16
    compute under autocast over fp32 master weights, with activation checkpointing; saves model and
    tokenizer to `out`; returns the logged losses."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)  # fp32 masters (bf16 autocast)
    args = SFTConfig(
        output_dir=str(out / "sft"),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        logging_steps=logging_steps,
        save_strategy="no",
        report_to="none",
        seed=seed,
        data_seed=seed,
        use_cpu=not gpu,
        bf16=gpu,
        disable_tqdm=True,
        completion_only_loss=True,
        max_length=None,
        activation_checkpointing=gpu,
    )  # on the CPU models are small: recomputation would only cost time
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # stdout may be a --json answer; progress is a callback's business
    for callback in callbacks:
        trainer.add_callback(callback)
    trainer.train()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return [entry for entry in trainer.state.log_history if "loss" in entry]
