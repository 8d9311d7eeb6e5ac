"""Datasets from trajectories, as JSON lines plus Parquet that `datasets.load_dataset` reads.

- SFT, conversational: one row per successful episode, {"messages", "tools"} (TRL's SFTTrainer
  format; tool-call arguments and the tool list as JSON text so every row has one Arrow type).
- SFT, per turn: one row per assistant turn, {"prompt", "completion", "tools"}, the prompt being
  exactly the history window the policy saw (history-aligned training).
- Transitions: one row per tool call, {"state", "action", "observation", "diff"}, what a world
  model learns to predict (state: task plus recent history; diff: the database change).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from worldsmith.agent.chat import ChatMessage, ChatTemplateKwargs, hf_message, hf_messages, hf_tools
from worldsmith.agent.loop import Trajectory, visible

NO_THINKING: ChatTemplateKwargs = {"enable_thinking": False}


class SftRow(TypedDict):
    """A conversational SFT row: one episode's messages with the tools it had (JSON text)."""

    messages: list[ChatMessage]
    tools: str
    chat_template_kwargs: ChatTemplateKwargs
    env_id: str
    task_id: str
    reward: float | None


class PromptCompletion(TypedDict):
    """A prompt/completion row's training part (TRL's conversational prompt-completion format)."""

    prompt: list[ChatMessage]
    completion: list[ChatMessage]
    tools: str
    chat_template_kwargs: ChatTemplateKwargs


class TurnRow(PromptCompletion):
    """A per-turn SFT row: the window the policy saw and the turn it produced, with where it came from."""

    env_id: str
    task_id: str
    reward: float | None


class TransitionRow(TypedDict):
    """A world-model row: one tool call, the state before it and what came of it (JSON text)."""

    env_id: str
    env_key: str
    task_id: str
    turn: int
    index: int
    state: str
    action: str
    observation: str
    diff: str
    changed: bool


#: Any row this module writes.
DatasetRow = SftRow | TurnRow | TransitionRow


def sft_rows(trajectories: list[Trajectory], verdicts: tuple[str, ...] = ("complete",)) -> list[SftRow]:
    """One conversational row per episode whose verdict is in `verdicts`."""
    return [
        {
            "messages": hf_messages(t.messages, arguments_as_text=True),
            "tools": json.dumps(hf_tools(t.tools)),
            "chat_template_kwargs": NO_THINKING,
            "env_id": t.env_id,
            "task_id": t.task_id,
            "reward": t.reward,
        }
        for t in trajectories
        if t.verdict in verdicts
    ]


def turn_rows(
    trajectories: list[Trajectory], window: int | None = None, verdicts: tuple[str, ...] = ("complete",)
) -> list[TurnRow]:
    """One prompt/completion row per assistant turn of the selected episodes; the prompt is the
    view of the conversation with the last `window` turns (None: all of them)."""
    rows: list[TurnRow] = []
    for t in trajectories:
        if t.verdict not in verdicts:
            continue
        for index, message in enumerate(t.messages):
            if message.role != "assistant":
                continue
            prompt = visible(t.messages[:index], window)
            rows.append(
                {
                    "prompt": hf_messages(prompt, arguments_as_text=True),
                    "completion": [hf_message(message, arguments_as_text=True)],
                    "tools": json.dumps(hf_tools(t.tools)),
                    "chat_template_kwargs": NO_THINKING,
                    "env_id": t.env_id,
                    "task_id": t.task_id,
                    "reward": t.reward,
                }
            )
    return rows


def _instruction(t: Trajectory) -> str:
    return next(m.content for m in t.messages if m.role == "user")


def transition_rows(trajectories: list[Trajectory], history: int = 3) -> list[TransitionRow]:
    """One row per tool call of every episode (failures included: they are transitions too)."""
    rows: list[TransitionRow] = []
    for t in trajectories:
        for index, step in enumerate(t.steps):
            recent = t.steps[max(0, index - history) : index]
            calls = [f"- {s.call.name}({json.dumps(s.call.arguments)}) -> {s.status}" for s in recent] or ["(none)"]
            state = "\n".join([f"Task: {_instruction(t)}", "Recent calls:", *calls])
            rows.append(
                {
                    "env_id": t.env_id,
                    "env_key": t.env_key,
                    "task_id": t.task_id,
                    "turn": step.turn,
                    "index": index,
                    "state": state,
                    "action": json.dumps({"name": step.call.name, "arguments": step.call.arguments}),
                    "observation": json.dumps(
                        {"status": step.status, "value": step.value, "error": step.error}, default=str
                    ),
                    "diff": json.dumps(step.diff, default=str),
                    "changed": bool(step.diff),
                }
            )
    return rows


def write_rows(rows: Sequence[DatasetRow], out: Path, name: str) -> dict[str, Path]:
    """`out/name.jsonl` and `out/name.parquet` (load either with `datasets.load_dataset`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError(f"no rows for {name}: no trajectory matched")
    out.mkdir(parents=True, exist_ok=True)
    jsonl, parquet = out / f"{name}.jsonl", out / f"{name}.parquet"
    with jsonl.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    return {"jsonl": jsonl, "parquet": parquet}
