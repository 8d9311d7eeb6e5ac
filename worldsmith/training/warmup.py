"""Warm-up: supervised fine-tuning on reference episodes, so that a model that has never seen
the tool-call format (the tiny offline model) emits tool calls before GRPO starts.

The reference solution of every task is replayed in the runtime; each of its turns becomes a
prompt/completion row holding exactly the window the policy will see during GRPO (the same
`turn_rows` the `data sft --per-turn` command writes), and TRL's SFTTrainer trains on the
completions only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worldsmith.agent.datasets import turn_rows
from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import ReferencePolicy
from worldsmith.bundle.contract import Bundle
from worldsmith.runtime.episode import Runtime


class TemplateReference(ReferencePolicy):
    """The reference solution as a chat-template policy sees its episode: the tools are shown by
    the template, not listed in the system prompt (so the rows match `HFPolicy`'s prompts)."""

    shows_tools = True


def reference_rows(runtime: Runtime, bundles: list[Bundle], window: int | None) -> list[dict[str, Any]]:
    """Per-turn SFT rows from the reference solution of every task that the verifier accepts."""
    config = EpisodeConfig(max_turns=100, window=window)
    trajectories = []
    for bundle in bundles:
        trajectories += [run_episode(runtime, bundle, task, TemplateReference(), config) for task in bundle.tasks]
    rows = turn_rows(trajectories, window)
    if not rows:
        raise ValueError("no reference solution passed its verifier: nothing to warm up on")
    return rows


def warm_up(
    model_dir: Path,
    rows: list[dict[str, Any]],
    out: Path,
    *,
    steps: int = 60,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = False,
) -> Path:
    """SFT `model_dir` for `steps` steps on per-turn `rows` (`reference_rows`, or any `turn_rows`);
    the result (model and tokenizer) is saved to `out`, which is returned."""
    from worldsmith.training.progress import ProgressBar
    from worldsmith.training.sft import supervised_fine_tune

    kept = [{k: row[k] for k in ("prompt", "completion", "tools", "chat_template_kwargs")} for row in rows]
    supervised_fine_tune(
        model_dir,
        kept,
        out,
        steps=steps,
        learning_rate=learning_rate,
        batch_size=batch_size,
        seed=seed,
        logging_steps=max(1, steps // 5),
        callbacks=[ProgressBar("supervised warm-up")] if progress else [],
    )
    return out
