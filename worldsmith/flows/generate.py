"""The `generate` flow: seed scenarios -> new scenarios -> one environment each, its stages run as
Prefect tasks (worldsmith/tasks/generation.py: retries for transient faults, caching for resume) each
with its own repair loop -> published.

Fan-out: a thread pool (`concurrency` environments at once), or a Dask cluster when configured
(`WORLDSMITH_TASK_RUNNER=dask`). Each process that runs tasks builds its own generator, sandbox
runtime and attempt log from the run's parameters (worldsmith/tasks/generation_run.py).

Resumable: stage tasks are cached by their inputs (persisted under WORLDSMITH_HOME), so running
the flow again after a crash or kill reuses every finished stage, and publishing is idempotent, so
no environment is duplicated.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from sqlmodel import select

from worldsmith.flows.links import dashboard_link
from worldsmith.flows.records import current_flow_run_id
from worldsmith.llm.prompts import prompt_version
from worldsmith.models.bundle import Scenario
from worldsmith.models.catalog import StageAttempt
from worldsmith.settings import get_settings
from worldsmith.stages.attempts import stage_summary
from worldsmith.stages.order import Stage
from worldsmith.stages.pipeline import run_stages
from worldsmith.stages.scenario import load_scenarios
from worldsmith.stages.work import EnvWork
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import publish
from worldsmith.tasks.generation import (
    new_scenarios,
    resumable,
    transient_only,
    validate_environment,
    write_database,
    write_tasks,
    write_tools,
    write_verifiers,
)
from worldsmith.tasks.generation_run import GenerateParameters, release, resources


def _warm_imports() -> None:
    import great_expectations  # noqa: F401
    import sklearn.feature_extraction.text  # noqa: F401


@task(name="build-environment", retries=2, retry_condition_fn=transient_only)
def build_and_publish(params: GenerateParameters, run_id: str, scenario: Scenario) -> dict[str, Any]:
    """One environment: tasks -> database -> tools -> verifiers -> validate, each stage a task; a
    failed validation sends its error back to the stage that made the faulty artifact, and the stages
    after it run again. Then published (good, or failed with its reason)."""
    r = resources(params, run_id)
    stages = {
        Stage.TASKS: partial(resumable(write_tasks), params, run_id),
        Stage.DATABASE: partial(resumable(write_database), params, run_id),
        Stage.TOOLS: partial(resumable(write_tools), params, run_id),
        Stage.VERIFIERS: partial(resumable(write_verifiers), params, run_id),
    }
    validate = partial(resumable(validate_environment), params, run_id)
    result = run_stages(EnvWork.start(scenario, params.seed), stages, validate, rounds=r.max_attempts)
    summary: dict[str, Any] = {
        "env_id": result.env_id,
        "scenario": scenario.name,
        "status": "failed",
        "ref": None,
        "reason": result.reason,
        "built_by": f"{socket.gethostname()}:{os.getpid()}",
    }
    if result.bundle is None:  # a stage ran out of attempts: nothing to publish; the failure is on record
        r.log.record(
            env_id=result.env_id,
            stage="environment",
            attempt=1,
            outcome="failure",
            error_class=f"{result.failed_stage}_exhausted",
            error_text=result.reason,
        )
    else:
        published = publish(result.bundle, configured_store(), open_catalog(), result.checks)
        summary.update(
            status=published.version.status,
            ref=published.version.ref,
            reason=published.version.failure_reason or result.reason,
        )
    return summary


#: Environments finished so far, per run started by `run_generate` in this process. Plain data
#: only: the flow's module globals may travel to Dask workers, callbacks must not.
_FINISHED: dict[str, list[dict[str, Any]]] = {}


@flow(name="generate", log_prints=True)
def generate(params: GenerateParameters = GenerateParameters()) -> list[dict[str, Any]]:
    """Generate `params.count` environments and publish them."""
    params = params.dated()
    finished = _FINISHED.get(params.key())
    logger = get_run_logger()
    run_id = current_flow_run_id() or params.key()
    seeds = load_scenarios(params.scenario_file)
    # Import the heavy libraries the stages use before any stage runs: threads that import one
    # cycle of modules at once can deadlock (importlib raises _DeadlockError in one of them).
    _warm_imports()
    try:
        scenarios = resumable(new_scenarios)(params, run_id, seeds)
        progress = create_progress_artifact(
            0.0, key="generation-progress", description=f"{len(scenarios)} environments"
        )
        futures = [build_and_publish.submit(params, run_id, scenario) for scenario in scenarios]
        for done, future in enumerate(as_completed(futures), start=1):
            update_progress_artifact(progress, 100.0 * done / len(futures))
            if finished is not None:
                finished.append(future.result())
        results = [future.result() for future in futures]
    finally:
        release(params, run_id)
    with open_catalog().session() as session:
        attempts = session.exec(select(StageAttempt).where(StageAttempt.run_id == run_id)).all()
    create_table_artifact(
        stage_summary(list(attempts)),
        key="generation-stages",
        description="Per stage: first-attempt success, repair and failure rates, attempts, tokens, cost",
    )
    create_table_artifact(results, key="generation-environments", description="Environments of this run")
    good = sum(1 for r in results if r["status"] == "good")
    create_markdown_artifact(
        f"# Generation run\n\n{good} of {len(results)} environments published as good "
        f"(backend {params.backend}, prompt version {prompt_version()}).\n\n{dashboard_link('generate')}",
        key="generation-summary",
    )
    logger.info("%d of %d environments published as good", good, len(results))
    return results


def task_runner(concurrency: int) -> Any:
    """Threads in this process (default), or a Dask cluster when `WORLDSMITH_TASK_RUNNER=dask`:
    the one at `WORLDSMITH_DASK_ADDRESS`, else a local cluster of `WORLDSMITH_DASK_WORKERS` processes."""
    settings = get_settings()
    if settings.task_runner != "dask":
        return ThreadPoolTaskRunner(max_workers=concurrency)
    from prefect_dask import DaskTaskRunner

    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    threads = max(1, math.ceil(concurrency / settings.dask_workers))
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": settings.dask_workers,
            "threads_per_worker": threads,
            "processes": True,
            "dashboard_address": None,
        }
    )


def run_generate(
    params: GenerateParameters, on_progress: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Run the flow in this process (against the configured Prefect API or an ephemeral one)."""
    params = params.dated()
    if on_progress is None:
        return generate.with_options(task_runner=task_runner(params.concurrency))(params)
    finished: list[dict[str, Any]] = []
    _FINISHED[params.key()] = finished
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["results"] = generate.with_options(task_runner=task_runner(params.concurrency))(params)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="generate-flow")
    worker.start()
    reported = 0
    try:
        while worker.is_alive() or reported < len(finished):
            worker.join(timeout=0.2)
            while reported < len(finished):
                on_progress(finished[reported])
                reported += 1
    finally:
        _FINISHED.pop(params.key(), None)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["results"]
