"""The generation stages as Prefect tasks, one per stage, each a thin wrapper over its plain
function in worldsmith/stages/ with its retry and cache policy beside it.

Retries: Prefect retries a stage only for transient faults (the endpoint failing through its own
retries); semantic faults are the stage's own repair loop's job. Caching: a stage is cached by its
inputs less the run id and its result persisted (`resumable`), so running the flow again after a
crash or kill reuses every finished stage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import INPUTS, CacheKeyFnPolicy

from worldsmith.llm.errors import TransientFault
from worldsmith.llm.prompts import prompt_version
from worldsmith.models.bundle import Scenario
from worldsmith.models.specs import Review
from worldsmith.settings import get_settings
from worldsmith.stages.database import run_database_stage
from worldsmith.stages.order import Stage
from worldsmith.stages.review import run_review_stage
from worldsmith.stages.scenario import catalog_names, expand_scenarios
from worldsmith.stages.task_list import run_tasks_stage
from worldsmith.stages.tools import run_tools_stage
from worldsmith.stages.validate import Validation, run_validate_stage
from worldsmith.stages.verifiers import run_verifiers_stage
from worldsmith.stages.work import EnvWork
from worldsmith.tasks.generation_run import embedder, resources
from worldsmith.tasks.parameters import GenerateParameters

P = ParamSpec("P")
R = TypeVar("R")


def _prompts_version(context: Any, parameters: dict[str, Any]) -> str:
    """The prompt templates' version: a stage's cached result is reused only under the prompts that made it."""
    return prompt_version()


#: A rerun (new run id) reuses what an earlier run finished with the same inputs and prompt templates.
CACHED = (INPUTS - "run_id") + CacheKeyFnPolicy(cache_key_fn=_prompts_version)


def transient_only(task_: Any, task_run: Any, state: Any) -> bool:
    """Prefect retries a stage only for transient faults; semantic ones are the repair loop's job."""
    try:
        state.result()
    except TransientFault:
        return True
    except Exception:  # noqa: BLE001
        return False
    return False


def results_storage() -> Path:
    """Where finished stages are persisted (so a rerun can reuse them)."""
    path = (get_settings().home / "prefect-results").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def resumable(stage_task: Task[P, R]) -> Task[P, R]:
    """`stage_task` with its results persisted under WORLDSMITH_HOME."""
    return stage_task.with_options(result_storage=results_storage())


def llm_stage(stage: Stage, task_run_name: str | None = None) -> Callable[[Callable[P, R]], Task[P, R]]:
    """The policy of a stage that asks the generator: up to 3 retries of transient faults (after 2, 10
    and 30 seconds), cached by its inputs less the run id, its result persisted. Its task runs are
    named `task_run_name` (default `<stage>-<env_id>`, from its `work` argument)."""
    return task(
        name=stage.value,
        task_run_name=task_run_name or f"{stage.value}-{{work.env_id}}",
        retries=3,
        retry_delay_seconds=[2, 10, 30],
        retry_condition_fn=transient_only,
        cache_policy=CACHED,
        persist_result=True,
    )


@llm_stage(Stage.SCENARIO, task_run_name="scenario-{params.count}x")
def new_scenarios(params: GenerateParameters, run_id: str, seeds: list[Scenario]) -> list[Scenario]:
    r = resources(params, run_id)
    return expand_scenarios(
        seeds,
        params.count,
        r.generator,
        r.log,
        max_attempts=r.max_attempts,
        embed=embedder(r.generator),
        taken=catalog_names(r.log.catalog),
    )


@llm_stage(Stage.TASKS)
def write_tasks(params: GenerateParameters, run_id: str, work: EnvWork, feedback: str | None) -> EnvWork:
    r = resources(params, run_id)
    return run_tasks_stage(work, r.generator, r.log, r.max_attempts, feedback, r.runtime)


@llm_stage(Stage.DATABASE)
def write_database(params: GenerateParameters, run_id: str, work: EnvWork, feedback: str | None) -> EnvWork:
    r = resources(params, run_id)
    return run_database_stage(work, r.generator, r.log, r.max_attempts, feedback)


@llm_stage(Stage.TOOLS)
def write_tools(params: GenerateParameters, run_id: str, work: EnvWork, feedback: str | None) -> EnvWork:
    r = resources(params, run_id)
    return run_tools_stage(work, r.generator, r.runtime, r.log, r.max_attempts, feedback)


@llm_stage(Stage.VERIFIERS)
def write_verifiers(params: GenerateParameters, run_id: str, work: EnvWork, feedback: str | None) -> EnvWork:
    r = resources(params, run_id)
    return run_verifiers_stage(work, r.generator, r.runtime, r.log, r.max_attempts, feedback)


@llm_stage(Stage.REVIEW)
def review_world(params: GenerateParameters, run_id: str, work: EnvWork) -> Review:
    """The model's review of a validated world (GenerateParameters.review); its findings are probed by the caller."""
    r = resources(params, run_id)
    return run_review_stage(work, r.generator, r.log, r.max_attempts)


# Validation sends no request to the generator, so nothing transient to retry: a failure goes back to a stage.
@task(
    name=Stage.VALIDATE.value,
    task_run_name="validate-{work.env_id}-round-{round_number}",
    cache_policy=CACHED,
    persist_result=True,
)
def validate_environment(params: GenerateParameters, run_id: str, work: EnvWork, round_number: int) -> Validation:
    r = resources(params, run_id)
    return run_validate_stage(work, r.generator, r.runtime, r.log, round_number)
