"""Warm-up: supervised fine-tuning on reference episodes, so that a model that has never seen
the tool-call format (the tiny offline model) emits tool calls before GRPO starts.

The reference solution of every task is replayed in the runtime; each of its turns becomes a
prompt/completion row holding exactly the window the policy will see during GRPO (the same
`turn_rows` the `data sft --per-turn` command writes), and TRL's SFTTrainer trains on the
completions only. `lazy_rows` adds a wrong habit (TrainingConfig.curriculum.lazy_habit) that GRPO
then has to unlearn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worldsmith.agent.datasets import PromptCompletion, TurnRow, turn_rows
from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import Policy, ReferencePolicy, ScriptPolicy
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import TaskSpec
from worldsmith.runtime.episode import Runtime


class TemplateReference(ReferencePolicy):
    """The reference solution as a chat-template policy sees its episode: the tools are shown by
    the template, not listed in the system prompt (so the rows match `HFPolicy`'s prompts)."""

    shows_tools = True


class LazyHabit(ScriptPolicy):
    """Fixed calls, then "Done.", as a chat-template policy sees its episode (see `TemplateReference`)."""

    shows_tools = True

    def __init__(self, calls: list[tuple[str, JsonObject]]):
        super().__init__("lazy", calls)


def reference_rows(runtime: Runtime, bundles: list[Bundle], window: int | None) -> list[TurnRow]:
    """Per-turn SFT rows from the reference solution of every task that the verifier accepts."""
    rows = _played_rows(runtime, bundles, window, lambda task: TemplateReference(), ("complete",))
    if not rows:
        raise ValueError("no reference solution passed its verifier: nothing to warm up on")
    return rows


def lazy_rows(runtime: Runtime, bundles: list[Bundle], window: int | None) -> list[TurnRow]:
    """Per-turn SFT rows of a lazy habit of every task with a reference solution: its calls but the
    last, then the answer "Done.", kept where the verifier rates the episode incomplete (a wrong habit
    beside the reference's, for GRPO to unlearn)."""

    def habit(task: TaskSpec) -> Policy | None:
        return LazyHabit([(s.tool, s.arguments) for s in task.solution[:-1]]) if task.solution else None

    return _played_rows(runtime, bundles, window, habit, ("incomplete",))


def warmup_rows(runtime: Runtime, bundles: list[Bundle], window: int | None, lazy_habit: bool) -> list[TurnRow]:
    """The tiny model's warm-up rows: `reference_rows`, and with `lazy_habit` the `lazy_rows` beside them,
    one for each reference row: where the habit departs from the reference, the warm-up sees the right
    turn and the lazy one once each, so a model that has learned both starts near even odds between them
    (whatever the warm-up's length) and GRPO's groups hold successes and failures."""
    rows = reference_rows(runtime, bundles, window)
    return rows + lazy_rows(runtime, bundles, window) if lazy_habit else rows


def turn_tokens(model_dir: Path, rows: list[TurnRow]) -> dict[str, int]:
    """The longest turn of each task ("env id/task id") among `rows`, in tokens of `model_dir`'s chat
    template up to its end-of-turn token (what a policy generates for it). A row whose prompt does not
    render as the start of prompt and completion together is left out (no count to trust)."""
    from transformers import AutoTokenizer

    from worldsmith.agent.hf_policy import stop_token_ids

    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))  # its chat template takes our messages
    stops = set(stop_token_ids(tokenizer))
    longest: dict[str, int] = {}
    for row in rows:
        template = {"tools": json.loads(row["tools"]), **row["chat_template_kwargs"]}
        prompt = list(
            tokenizer.apply_chat_template(
                row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False, **template
            )
        )
        whole = list(
            tokenizer.apply_chat_template(
                row["prompt"] + row["completion"], tokenize=True, return_dict=False, **template
            )
        )
        if whole[: len(prompt)] != prompt:
            continue
        turn = whole[len(prompt) :]
        ends = [i for i, token in enumerate(turn) if token in stops]
        task = f"{row['env_id']}/{row['task_id']}"
        longest[task] = max(ends[0] + 1 if ends else len(turn), longest.get(task, 0))
    return longest


def overlong(longest: dict[str, int], limit: int) -> dict[str, int]:
    """The tasks of `longest` (`turn_tokens`) with a turn over `limit` tokens: GRPO cuts such a turn at
    `max_completion_length`, a format error, so the task is never solved."""
    return {task: tokens for task, tokens in longest.items() if tokens > limit}


def _played_rows(
    runtime: Runtime,
    bundles: list[Bundle],
    window: int | None,
    policy: Callable[[TaskSpec], Policy | None],
    verdicts: tuple[str, ...],
) -> list[TurnRow]:
    """Per-turn rows of every task played by `policy(task)` (None: not played), kept where the episode's
    verdict is one of `verdicts`."""
    config = EpisodeConfig(max_turns=100, window=window)
    trajectories = [
        run_episode(runtime, bundle, task, chosen, config)
        for bundle in bundles
        for task in bundle.tasks
        if (chosen := policy(task)) is not None
    ]
    return turn_rows(trajectories, window, verdicts=verdicts)


def warm_up(
    model_dir: Path,
    rows: list[TurnRow],
    out: Path,
    *,
    steps: int = 60,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = False,
    gpu: bool = False,
    stop_requested: Callable[[], bool] | None = None,
) -> Path:
    """SFT `model_dir` for `steps` steps on per-turn `rows` (`reference_rows`, or any `turn_rows`), on the
    CPU or (`gpu`) a CUDA device; the result (model and tokenizer) is saved to `out`, which is returned.
    Once `stop_requested()`, it ends at the next step boundary (the caller knows not to keep `out`)."""
    from worldsmith.training.progress import ProgressBar
    from worldsmith.training.sft import supervised_fine_tune
    from worldsmith.training.stopping import StopWhenRequested

    kept = [
        PromptCompletion(
            prompt=row["prompt"],
            completion=row["completion"],
            tools=row["tools"],
            chat_template_kwargs=row["chat_template_kwargs"],
        )
        for row in rows
    ]
    supervised_fine_tune(
        model_dir,
        kept,
        out,
        steps=steps,
        learning_rate=learning_rate,
        batch_size=batch_size,
        seed=seed,
        gpu=gpu,
        logging_steps=max(1, steps // 5),
        callbacks=[
            *([ProgressBar("supervised warm-up")] if progress else []),
            *([StopWhenRequested(stop_requested)] if stop_requested else []),
        ],
    )
    return out
