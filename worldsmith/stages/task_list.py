"""Stage `tasks`: about ten self-contained tasks for the scenario."""

from __future__ import annotations

from worldsmith.llm.backend import Generator, Prompt
from worldsmith.models.specs import TaskList
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.history import Fault
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed, run_with_repair
from worldsmith.stages.work import EnvWork

TASK_COUNT = 10
MIN_TASKS = 5


def check_tasks(tasks: TaskList) -> TaskList:
    ids = [t.id for t in tasks.tasks]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise CheckFailed(
            "duplicate_ids",
            f"task ids must be unique; repeated: {', '.join(duplicates)}",
            [Fault(kind="duplicate_ids", subject=d) for d in duplicates],
        )
    if len(ids) < MIN_TASKS:
        raise CheckFailed(
            "too_few_tasks",
            f"got {len(ids)} tasks; write at least {MIN_TASKS} (about {TASK_COUNT})",
            [Fault(kind="too_few_tasks")],
        )
    return tasks


def run_tasks_stage(
    work: EnvWork, generator: Generator, log: AttemptLog, max_attempts: int, feedback: str | None = None
) -> EnvWork:
    def prompt(extra: str | None) -> Prompt:
        return work.prompt("tasks", extra, count=TASK_COUNT)

    history = work.history_of(Stage.TASKS.value)
    tasks = run_with_repair(
        stage=Stage.TASKS.value,
        env_id=work.env_id,
        generator=generator,
        prompt=prompt,
        spec=TaskList,
        check=check_tasks,
        log=log,
        max_attempts=max_attempts,
        first_feedback=feedback,
        history=history,
    )
    return work.model_copy(update={"tasks": tasks, "history": work.remembering({Stage.TASKS.value: history})})
