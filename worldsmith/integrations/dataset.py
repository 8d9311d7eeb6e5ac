"""Sets as datasets: the tasks of worlds as a Hugging Face `datasets.Dataset`, one row per (world, task),
what the adapters consume (`worldsmith sets export NAME DIR --format hf`; `datasets.load_from_disk(DIR)`).

A row: `prompt` (the system prompt and the task's instruction, in the chat format TRL reads; the tools
are given apart, for the chat template), `tools` (the world's tools as chat-template functions, JSON
text), `world` (its name: a catalog reference `ENV@VERSION` for a set's member, which `WorldEnv`
opens), `environment` (the same name: TRL's `environment_factory` dict picks a world by it),
`env_id`, `task_id` and `split`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from worldsmith.agent.chat import hf_tools
from worldsmith.agent.loop import system_prompt
from worldsmith.bundle.contract import Bundle
from worldsmith.failures import UserFixable
from worldsmith.integrations.environment import WorldEnv, set_members, world_name
from worldsmith.runtime.episode import tool_schemas

if TYPE_CHECKING:
    from datasets import Dataset


class PromptMessage(TypedDict):
    role: str
    content: str


class TaskRow(TypedDict):
    """One (world, task) row of a task dataset (see the module docstring)."""

    prompt: list[PromptMessage]
    tools: str
    world: str
    environment: str
    env_id: str
    task_id: str
    split: str


def task_rows(worlds: Mapping[str, Bundle], splits: Mapping[str, str] | None = None) -> list[TaskRow]:
    """A row per task of each world (by name), with its split (`splits[name]`, default "train")."""
    rows: list[TaskRow] = []
    for name, bundle in worlds.items():
        tools = json.dumps(hf_tools(tool_schemas(bundle)))
        system = system_prompt(bundle, with_tools=False)
        for task in bundle.tasks:
            rows.append(
                {
                    "prompt": [{"role": "system", "content": system}, {"role": "user", "content": task.instruction}],
                    "tools": tools,
                    "world": name,
                    "environment": name,
                    "env_id": bundle.env_id,
                    "task_id": task.id,
                    "split": (splits or {}).get(name, "train"),
                }
            )
    return rows


def task_dataset(worlds: Mapping[str, Bundle], splits: Mapping[str, str] | None = None) -> Dataset:
    """The rows of `task_rows` as a `datasets.Dataset`."""
    from datasets import Dataset

    return Dataset.from_list(task_rows(worlds, splits))


def env_dataset(env: WorldEnv) -> Dataset:
    """The task dataset of `env`'s worlds (each once, by its name)."""
    return task_dataset({world_name(b): b for b in env.worlds.values()})


def export_set_dataset(name: str, target: Path) -> int:
    """Write set `name`'s tasks as a Hugging Face dataset into `target` (`save_to_disk`; a new or empty
    directory); returns the number of rows. CatalogError for an unknown set; UserFixable for a target
    that holds something."""
    from worldsmith.storage.bundle_cache import open_bundle

    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserFixable(f"{target} is not an empty directory: name a new one for the dataset")
    splits = dict(set_members(name))
    worlds = {ref: open_bundle(ref) for ref in sorted(splits)}
    dataset = task_dataset(worlds, splits)
    dataset.save_to_disk(str(target))
    return len(dataset)
