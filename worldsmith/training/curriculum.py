"""The curriculum of a training run (TrainingConfig.curriculum): which tasks the policy trains on and
which tools its episodes show. The same bundles feed the tiny model's warm-up (flows/train.py) and the
GRPO rollouts (training/launch.py), so both see exactly the same prompts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cached_property

from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.training.config import Curriculum


def solution_size(task: TaskSpec) -> tuple[int, int]:
    """How long `task`'s reference solution is: (calls, characters of the calls and the answer)."""
    calls = [[step.tool, step.arguments] for step in task.solution]
    return len(calls), len(json.dumps(calls)) + len(task.answer or "")


def chosen_tasks(bundles: dict[str, Bundle], curriculum: Curriculum) -> set[tuple[str, str]]:
    """(bundle key, task id) of the `curriculum.tasks` tasks (None: every task) with the shortest
    reference solutions (`solution_size`, ties by environment and task id), one per kind first
    (`task_kind`): a task whose kind is already chosen comes after every kind's shortest, so that its
    siblings (the same tools, other records) stay out of training for `held_out_bundles`."""
    every = [(key, task) for key, bundle in bundles.items() for task in bundle.tasks]
    if curriculum.tasks is None:
        return {(key, task.id) for key, task in every}
    solved = sorted((solution_size(task), bundles[key].env_id, task.id, key) for key, task in every if task.solution)
    first: list[tuple[str, str]] = []
    again: list[tuple[str, str]] = []
    kinds: set[str] = set()
    for _, _, task_id, key in solved:
        kind = task_kind(bundles[key], bundles[key].task(task_id), curriculum)
        (again if kind in kinds else first).append((key, task_id))
        kinds.add(kind)
    return set((first + again)[: curriculum.tasks])


@dataclass(frozen=True)
class SubsetBundle(Bundle):
    """A bundle showing a subset of its environment's tools. Sandbox workers load an environment with
    the tools it shows and serve only those, so it loads under a key of its own (`runtime_key`)."""

    subset: str = ""

    @cached_property
    def runtime_key(self) -> str:
        return f"{super().runtime_key}#{self.subset}"


def shown_tools(bundle: Bundle, task: TaskSpec) -> Bundle:
    """`bundle` holding only `task`, with only the tools its reference solution calls (all of them
    when it has no solution)."""
    used = {step.tool for step in task.solution}
    if not used:
        return dataclasses.replace(bundle, tasks=(task,))
    tools = tuple(t for t in bundle.tools if t.name in used)
    fields = {f.name: getattr(bundle, f.name) for f in dataclasses.fields(Bundle)}
    return SubsetBundle(**{**fields, "tasks": (task,), "tools": tools}, subset=",".join(t.name for t in tools))


def curriculum_bundles(bundles: dict[str, Bundle], curriculum: Curriculum) -> dict[str, Bundle]:
    """The bundles a run trains on, by key: each bundle with only its chosen tasks (bundles left with
    none are dropped) or, with tools='solution', one bundle per chosen task keyed 'KEY#TASK' showing
    only its solution's tools. ValueError when no task is left."""
    chosen = chosen_tasks(bundles, curriculum)
    out: dict[str, Bundle] = {}
    for key, bundle in sorted(bundles.items()):
        tasks = tuple(t for t in bundle.tasks if (key, t.id) in chosen)
        if curriculum.tools == "solution":
            out.update({f"{key}#{t.id}": shown_tools(bundle, t) for t in tasks})
        elif tasks:
            out[key] = dataclasses.replace(bundle, tasks=tasks)
    if not out:
        raise ValueError("the curriculum leaves no task to train on (curriculum.tasks needs tasks with a solution)")
    return out


def task_kind(bundle: Bundle, task: TaskSpec, curriculum: Curriculum) -> str:
    """What makes two tasks the same kind: the tools their reference solutions call, in order, and
    the definitions of the tools an episode shows (the curriculum's: the solution's or all)."""
    shown = shown_tools(bundle, task).tools if curriculum.tools == "solution" else bundle.tools
    return json.dumps([[step.tool for step in task.solution], [t.model_dump() for t in shown]], sort_keys=True)


def held_out_bundles(bundles: dict[str, Bundle], curriculum: Curriculum, per_task: int = 1) -> dict[str, Bundle]:
    """Tasks of the same kind as the curriculum's (`task_kind`: the same tools, other records) that it
    does not train on, at most `per_task` per trained task (the first by environment and task id),
    shown as `curriculum_bundles` shows its own and keyed alike ('KEY#TASK'). Empty when the curriculum
    trains on every task or no other task shares a kind with one of them. A task that expects the same
    answer as the trained one is not held out for it (the trained answer, memorised, would pass it)."""
    chosen = chosen_tasks(bundles, curriculum)
    others = sorted(
        (bundle.env_id, task.id, key)
        for key, bundle in bundles.items()
        for task in bundle.tasks
        if task.solution and (key, task.id) not in chosen
    )
    kinds = {
        (key, task_id): task_kind(bundles[key], bundles[key].task(task_id), curriculum) for _, task_id, key in others
    }
    out: dict[str, Bundle] = {}
    for key, task_id in sorted(chosen):
        trained = bundles[key].task(task_id)
        kind = task_kind(bundles[key], trained, curriculum)
        same = [
            (k, t)
            for _, t, k in others
            if kinds[(k, t)] == kind and f"{k}#{t}" not in out and not _same_answer(trained, bundles[k].task(t))
        ][:per_task]
        for other_key, other_id in same:
            bundle, task = bundles[other_key], bundles[other_key].task(other_id)
            shown = (
                shown_tools(bundle, task)
                if curriculum.tools == "solution"
                else dataclasses.replace(bundle, tasks=(task,))
            )
            out[f"{other_key}#{other_id}"] = shown
    return out


def _same_answer(trained: TaskSpec, other: TaskSpec) -> bool:
    """Whether `other` expects the answer `trained` expects (a count, a name...; None: no answer asked)."""
    return trained.answer is not None and trained.answer == other.answer
