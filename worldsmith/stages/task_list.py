"""Stage `tasks`: about ten self-contained tasks for the scenario. Once a world was built (a later round,
validation having sent a failure back here) the model may look at it: SQL over its seed, calls of its tools
(stages/looking.py)."""

from __future__ import annotations

from worldsmith.bundle.sqlscript import build_world
from worldsmith.bundle.toolspec import derive_tool_schemas
from worldsmith.llm.backend import Generator, Prompt
from worldsmith.llm.looks import LookOffer
from worldsmith.models.specs import TaskList
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.history import Fault
from worldsmith.stages.looking import offer_looks, with_looks
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed, refuse_repeated, run_with_repair
from worldsmith.stages.tools import tools_only_bundle
from worldsmith.stages.work import EnvWork

TASK_COUNT = 10
MIN_TASKS = 5


def check_tasks(tasks: TaskList) -> TaskList:
    ids = [t.id for t in tasks.tasks]
    refuse_repeated(ids, "duplicate_ids", "task ids")
    if len(ids) < MIN_TASKS:
        raise CheckFailed(
            "too_few_tasks",
            f"got {len(ids)} tasks; write at least {MIN_TASKS} (about {TASK_COUNT})",
            [Fault(kind="too_few_tasks")],
        )
    return tasks


def built_world_looks(work: EnvWork, runtime: Runtime | None) -> LookOffer | None:
    """The looks at the world an earlier round built (its seed; its tools too where they derive and `runtime`
    runs them); None before any world was built."""
    if not (work.schema_sql and work.seed_sql):
        return None
    world, _ = build_world(work.schema_sql, work.seed_sql)
    bundle = None
    if world is not None and work.tools_py and runtime is not None:
        tools, issues = derive_tool_schemas(work.tools_py)
        bundle = None if issues else tools_only_bundle(work, work.tools_py, tools, world=world)
    return offer_looks(world, runtime, bundle)


def run_tasks_stage(
    work: EnvWork,
    generator: Generator,
    log: AttemptLog,
    max_attempts: int,
    feedback: str | None = None,
    runtime: Runtime | None = None,
) -> EnvWork:
    """The tasks of `work`'s scenario; with `runtime`, the model may call the tools an earlier round built."""
    looks = built_world_looks(work, runtime)

    def prompt(extra: str | None) -> Prompt:
        return with_looks(work.prompt("tasks", extra, count=TASK_COUNT), looks)

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
