"""The `generate` flow: seed scenarios -> new scenarios -> one environment each, its stages run as
Prefect tasks (worldsmith/tasks/generation.py: retries for transient faults, caching for resume) each
with its own repair loop -> published.

Fan-out: a thread pool (`concurrency` environments at once), or a Dask cluster when configured
(`WORLDSMITH_TASK_RUNNER=dask`). Each process that runs tasks builds its own generator, sandbox
runtime and attempt log from the run's parameters (worldsmith/tasks/generation_run.py).

Resumable: stage tasks are cached by their inputs (persisted under WORLDSMITH_HOME), so running
the flow again after a crash or kill reuses every finished stage, and publishing is idempotent, so
no environment is duplicated. A world whose artifacts a good version of another env already holds
is not published again (reported as `duplicate`).

One world's failure never fails the run: a stage out of attempts or an unexpected exception fails
that world only (recorded, published as failed with its partial artifacts and reason). Only a fatal
(run-wide) fault stops the run. After the summary artifacts, a run whose share of good worlds is
below `min_good_share` ends Failed (raising `TooFewGoodWorlds` in the caller), so Prefect can alert.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import socket
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from prefect import State, flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.context import TaskRunContext
from prefect.futures import as_completed
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner
from sqlmodel import select

from worldsmith.errors import WorldsmithError
from worldsmith.flows.links import dashboard_link
from worldsmith.flows.records import current_flow_run_id
from worldsmith.flows.run_names import named_after
from worldsmith.llm.backend import Generator
from worldsmith.llm.errors import TransientFault
from worldsmith.llm.prompts import prompt_version
from worldsmith.models.bundle import Manifest, Scenario
from worldsmith.models.catalog import StageAttempt
from worldsmith.models.generation import WorldOutcome
from worldsmith.runtime.answers import one_line
from worldsmith.settings import get_settings
from worldsmith.stages.attempts import AttemptLog, stage_summary
from worldsmith.stages.order import Stage
from worldsmith.stages.pipeline import BuildResult, StageRunner, run_stages
from worldsmith.stages.review import review_enabled, with_review
from worldsmith.stages.scenario import load_scenarios
from worldsmith.stages.validate import Validation, Validator
from worldsmith.stages.work import EnvWork
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import Published, publish, publish_failed
from worldsmith.tasks.generation import (
    new_scenarios,
    resumable,
    review_world,
    transient_only,
    validate_environment,
    write_database,
    write_tasks,
    write_tools,
    write_verifiers,
)
from worldsmith.tasks.generation_run import release, resources
from worldsmith.tasks.parameters import GenerateParameters
from worldsmith.tasks.run_resources import RunResources

#: The heavy libraries the stages import, the scenario stage's first.
WARM_IMPORTS = ("sklearn.feature_extraction.text", "great_expectations")


def _warm_imports() -> None:
    for module in WARM_IMPORTS:
        importlib.import_module(module)


#: The stage name recorded when publishing itself raised.
PUBLISH_STAGE = "publish"


class TooFewGoodWorlds(WorldsmithError):
    """A run whose share of good worlds is below its `min_good_share`: the flow ends Failed with this
    one-line message; `results` are the run's world summaries."""

    def __init__(self, message: str, results: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.results = results or []

    def __reduce__(self) -> tuple[type, tuple[str, list[dict[str, Any]]]]:
        return type(self), (str(self), self.results)  # the results survive a trip through a result store


def log_repairs(logger: logging.Logger | logging.LoggerAdapter, attempts: list[StageAttempt]) -> None:
    """One line per attempt of `attempts` that did not succeed (a repair follows, or the world fails):
    world, stage, attempt, outcome and error class."""
    for a in attempts:
        if a.outcome != "success":
            logger.info(
                "world %s: %s attempt %d %s (%s)", a.env_id or "-", a.stage, a.attempt, a.outcome, a.error_class or "?"
            )


@dataclass
class WorldProgress:
    """How far one world got: the work its last finished stage returned, and the stage running now.
    With `log` and `logger`, each stage's failed attempts are logged as the stage returns."""

    work: EnvWork
    stage: str = Stage.TASKS.value
    log: AttemptLog | None = None
    logger: logging.Logger | logging.LoggerAdapter | None = None
    _reported: int = 0

    def report_repairs(self) -> None:
        """Log this world's attempts recorded since the last report that did not succeed."""
        if self.log is None or self.logger is None:
            return
        mine = [a for a in list(self.log.attempts) if a.env_id == self.work.env_id]
        log_repairs(self.logger, mine[self._reported :])
        self._reported = len(mine)

    def stage_runner(self, stage: Stage, run: StageRunner) -> StageRunner:
        def tracked(work: EnvWork, feedback: str | None) -> EnvWork:
            self.stage = stage.value
            try:
                self.work = run(work, feedback)
            finally:
                self.report_repairs()
            return self.work

        return tracked

    def validator(self, run: Validator) -> Validator:
        def tracked(work: EnvWork, round_number: int) -> Validation:
            self.stage = Stage.VALIDATE.value
            try:
                return run(work, round_number)
            finally:
                self.report_repairs()

        return tracked


def fails_world_only(exc: Exception) -> bool:
    """Whether `exc` fails its world only: not a fatal (run-wide) fault, and not a transient one that
    Prefect runs the world's task again for (its retries left)."""
    if getattr(exc, "fatal", False):
        return False
    if isinstance(exc, TransientFault):
        context = TaskRunContext.get()
        return context is None or context.task_run.run_count > context.task.retries
    return True


def record_crash(log: AttemptLog, env_id: str, stage: str, exc: Exception) -> str:
    """Record `exc`, raised in `stage` of world `env_id`, as a failed attempt of that stage (its error
    class the exception's type, its text the traceback's end); returns the world's failure reason."""
    reason = one_line(f"stage {stage} raised {type(exc).__name__}: {exc}")
    earlier = [a for a in log.attempts if a.env_id == env_id and a.stage == stage]
    attempt = earlier[-1].attempt + 1 if earlier and earlier[-1].outcome == "failure" else 1
    log.record(
        env_id=env_id,
        stage=stage,
        attempt=attempt,
        outcome="failure",
        error_class=type(exc).__name__,
        error_text="".join(traceback.format_exception(exc, limit=-8)),
    )
    return reason


def failed_manifest(work: EnvWork, generator: Generator) -> Manifest:
    """The manifest of a failed world's partial artifacts: identity, clock, provenance, the counts known."""
    stats = {
        "tasks": len(work.tasks.tasks) if work.tasks else None,
        "tools": len(work.tool_plan.tools) if work.tool_plan else None,
    }
    return work.manifest(generator, stats={k: v for k, v in stats.items() if v is not None})


def publish_world(result: BuildResult, work: EnvWork, generator: Generator) -> Published:
    """Publish a world's outcome: its bundle (good, or failed by its checks; not again when a good version
    of another env holds identical artifacts), or, when it stopped before it was a bundle, its partial
    artifacts as a failed version with the stage and reason."""
    store, catalog = configured_store(), open_catalog()
    if result.bundle is not None:
        return publish(result.bundle, store, catalog, result.checks, dedupe=True)
    assert result.failed_stage and result.reason
    return publish_failed(
        failed_manifest(work, generator), work.partial_files(), result.failed_stage, result.reason, store, catalog
    )


@task(name="build-environment", retries=2, retry_condition_fn=transient_only, task_run_name="build-{scenario.name}")
def build_and_publish(params: GenerateParameters, run_id: str, scenario: Scenario) -> WorldOutcome:
    """One environment: tasks -> database -> tools -> verifiers -> validate, each stage a task; a
    failed validation sends its error back to the stage that made the faulty artifact, and the stages
    after it run again. Then published: good, failed with its reason (with the partial artifacts of a
    world that stopped at a stage), or not again as a `duplicate` of a good version of another env.

    Never raises for this world's own failure: an unexpected exception is recorded as a failed attempt
    of its stage and the world published as failed. Raises a fatal fault, and a transient one while
    Prefect has retries left."""
    r = resources(params, run_id)
    progress = WorldProgress(EnvWork.start(scenario, params.seed), log=r.log, logger=get_run_logger())
    stages = {
        Stage.TASKS: write_tasks,
        Stage.DATABASE: write_database,
        Stage.TOOLS: write_tools,
        Stage.VERIFIERS: write_verifiers,
    }
    runners = {
        stage: progress.stage_runner(stage, partial(resumable(t), params, run_id)) for stage, t in stages.items()
    }
    validate = progress.validator(partial(resumable(validate_environment), params, run_id))
    if review_enabled(params.review, r.generator):  # the model's review once validation passes (stages/review.py)
        validate = with_review(validate, partial(resumable(review_world), params, run_id), r.runtime)
    summary = WorldOutcome(
        env_id=progress.work.env_id,
        scenario=scenario.name,
        status="failed",
        built_by=f"{socket.gethostname()}:{os.getpid()}",
    )
    try:
        result = run_stages(progress.work, runners, validate, rounds=r.max_attempts)
    except Exception as exc:
        if not fails_world_only(exc):
            raise
        reason = record_crash(r.log, progress.work.env_id, progress.stage, exc)
        progress.report_repairs()
        result = BuildResult(progress.work.env_id, None, [], progress.stage, reason)
    summary.failed_stage, summary.reason = result.failed_stage, result.reason
    try:
        published = publish_world(result, progress.work, r.generator)
    except Exception as exc:
        if not fails_world_only(exc):
            raise
        reason = record_crash(r.log, progress.work.env_id, PUBLISH_STAGE, exc)
        summary.failed_stage, summary.reason = PUBLISH_STAGE, reason
        return summary
    version = published.version
    if published.duplicate:
        summary.status, summary.ref, summary.reason = "duplicate", version.ref, f"identical to {version.ref}"
        return summary
    summary.status, summary.ref = version.status, version.ref
    summary.reason = version.failure_reason or result.reason
    return summary


#: Environments finished so far, by the parameters' key of each run started by `run_generate` in this
#: process (which reports them to its caller as they finish). Plain data only: no callback of the caller.
FINISHED: RunResources[list[WorldOutcome]] = RunResources()


@flow(
    name="generate",
    log_prints=True,
    flow_run_name=named_after(
        "generate",
        "params",
        GenerateParameters,
        lambda p: f"{p.count}x-{p.resolved_backend().partition(':')[0]}",
    ),
)
def generate(params: GenerateParameters = GenerateParameters()) -> list[WorldOutcome] | State:
    """Generate `params.count` environments and publish them. Ends Failed (raising the fault, or
    `TooFewGoodWorlds`, in the caller, with no traceback logged) on a fatal fault, or after writing
    the summary when the share of good worlds is below `params.min_good_share`. Logs a line per
    stage attempt that failed (world, stage, error class) as its world goes on.

    Args:
        params: The run: how many environments, the backend and model, seeds, attempts, the share of good worlds required.
    """
    params = params.dated()
    finished = FINISHED.find(params.key())
    logger = get_run_logger()
    run_id = current_flow_run_id() or params.key()
    seeds = load_scenarios(params.scenario_file)
    # Import the heavy libraries the stages use before the stage threads start: threads that import one
    # cycle of modules at once can deadlock (importlib raises _DeadlockError in one of them). Against a
    # model endpoint the imports overlap the scenario call (its stage imports inside a function, holding
    # no module lock); a backend that answers at once waits for them first.
    warming = threading.Thread(target=_warm_imports, name="warm-imports", daemon=True)
    warming.start()
    if params.backend != "openai":
        warming.join()
    try:
        scenarios = resumable(new_scenarios)(params, run_id, seeds)
        warming.join()
        with open_catalog().session() as session:
            log_repairs(
                logger,
                list(
                    session.exec(
                        select(StageAttempt)
                        .where(StageAttempt.run_id == run_id, StageAttempt.stage == Stage.SCENARIO.value)
                        .order_by(StageAttempt.id)
                    )
                ),
            )
        progress = create_progress_artifact(
            0.0, key="generation-progress", description=f"{len(scenarios)} environments"
        )
        futures = [build_and_publish.submit(params, run_id, scenario) for scenario in scenarios]
        for done, future in enumerate(as_completed(futures), start=1):
            update_progress_artifact(progress, 100.0 * done / len(futures))
            summary = future.result()  # a world's own failure is in its summary; a fatal fault raises here
            if finished is not None:
                finished.append(summary)
        results = [future.result() for future in futures]
    except Exception as exc:
        if not getattr(exc, "fatal", False):
            raise
        return Failed(message=one_line(str(exc)), data=exc)  # run-wide: the fault's one line, no traceback
    finally:
        release(params, run_id)
    with open_catalog().session() as session:
        attempts = session.exec(select(StageAttempt).where(StageAttempt.run_id == run_id)).all()
    create_table_artifact(
        stage_summary(list(attempts)),
        key="generation-stages",
        description="Per stage: first-attempt success, repair and failure rates, attempts, tokens, cost",
    )
    create_table_artifact(
        [r.model_dump(mode="json") for r in results],
        key="generation-environments",
        description="Environments of this run: status (good, failed, duplicate), ref, failed stage and reason",
    )
    counts = {status: sum(1 for r in results if r.status == status) for status in ("good", "failed", "duplicate")}
    good = counts["good"] + counts["duplicate"]
    failed_lines = "".join(
        f"- `{r.env_id}` ({r.failed_stage or 'checks'}): {r.reason}\n" for r in results if r.status == "failed"
    )
    create_markdown_artifact(
        f"# Generation run\n\n{good} of {len(results)} environments good: {counts['good']} published as good, "
        f"{counts['duplicate']} identical to a good one already published, {counts['failed']} failed "
        f"(backend {params.backend}, prompt version {prompt_version()}).\n\n"
        + (f"Failed:\n\n{failed_lines}\n" if failed_lines else "")
        + dashboard_link("generate"),
        key="generation-summary",
    )
    logger.info("%d of %d environments good (%d failed)", good, len(results), counts["failed"])
    share = good / len(results) if results else 0.0
    if share < params.min_good_share:
        message = (
            f"{good} of {len(results)} worlds good ({share:.0%}), below min_good_share {params.min_good_share:.0%}"
        )
        return Failed(message=message, data=TooFewGoodWorlds(message, results))
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
    params: GenerateParameters, on_progress: Callable[[WorldOutcome], None] | None = None
) -> list[WorldOutcome]:
    """Run the flow in this process (against the configured Prefect API or an ephemeral one)."""
    params = params.dated()
    if on_progress is None:
        return generate.with_options(task_runner=task_runner(params.concurrency))(params)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["results"] = generate.with_options(task_runner=task_runner(params.concurrency))(params)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    with FINISHED.holding(params.key(), []) as finished:
        worker = threading.Thread(target=run, name="generate-flow")
        worker.start()
        reported = 0
        while worker.is_alive() or reported < len(finished):
            worker.join(timeout=0.2)
            while reported < len(finished):
                on_progress(finished[reported])
                reported += 1
    if "error" in outcome:
        raise outcome["error"]
    return outcome["results"]
