"""One world of a generation run, as the `build-environment` task of the `generate` flow runs it: its
stages run as tasks and tracked (`WorldProgress`: the stage running, its failed attempts logged as it
returns), an exception that fails this world only recorded as a failed attempt of its stage, and its
outcome published (good, failed with its partial artifacts, or not again as a duplicate).

One world's failure never fails the run: only a fatal (run-wide) fault, or a transient one while
Prefect has retries left, propagates (`fails_world_only`)."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from functools import partial
from typing import cast

from prefect.context import TaskRunContext
from sqlmodel import col, select

from worldsmith.flows.interruption import STOP, Interrupted
from worldsmith.llm.backend import Generator
from worldsmith.llm.errors import TransientFault
from worldsmith.models.bundle import Manifest
from worldsmith.models.catalog import StageAttempt
from worldsmith.models.generation import WorldOutcome, WorldStatus
from worldsmith.runtime.answers import one_line
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.order import Stage
from worldsmith.stages.pipeline import BuildResult, StageRunner, run_stages
from worldsmith.stages.review import review_enabled, with_review
from worldsmith.stages.validate import Validation, Validator
from worldsmith.stages.work import EnvWork
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.failed_worlds import failed_world_files
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import Published, publish, publish_failed
from worldsmith.tasks.generation import (
    resumable,
    review_world,
    validate_environment,
    write_database,
    write_tasks,
    write_tools,
    write_verifiers,
)
from worldsmith.tasks.generation_run import GenerationResources
from worldsmith.tasks.parameters import GenerateParameters

#: The stage name recorded when publishing itself raised.
PUBLISH_STAGE = "publish"

#: The stages that write a world's artifacts, as tasks, in order (validation and review after them).
STAGE_TASKS = {
    Stage.TASKS: write_tasks,
    Stage.DATABASE: write_database,
    Stage.TOOLS: write_tools,
    Stage.VERIFIERS: write_verifiers,
}


def log_repairs(logger: logging.Logger | logging.LoggerAdapter[logging.Logger], attempts: list[StageAttempt]) -> None:
    """One line per attempt of `attempts` that did not succeed (a repair follows, or the world fails):
    world, stage, attempt, outcome and error class."""
    for a in attempts:
        if a.outcome != "success":
            logger.info(
                "world %s: %s attempt %d %s (%s)", a.env_id or "-", a.stage, a.attempt, a.outcome, a.error_class or "?"
            )


def log_scenario_repairs(logger: logging.Logger | logging.LoggerAdapter[logging.Logger], run_id: str) -> None:
    """`log_repairs` for the scenario stage of run `run_id` (recorded in the catalog by its task)."""
    with open_catalog().session() as session:
        attempts = session.exec(
            select(StageAttempt)
            .where(StageAttempt.run_id == run_id, StageAttempt.stage == Stage.SCENARIO.value)
            .order_by(col(StageAttempt.id))
        )
        log_repairs(logger, list(attempts))


@dataclass
class WorldProgress:
    """How far one world got: the work its last finished stage returned, and the stage running now.
    With `log` and `logger`, each stage's failed attempts are logged as the stage returns."""

    work: EnvWork
    stage: str = Stage.TASKS.value
    log: AttemptLog | None = None
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None
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
            STOP.check()  # a run asked to stop starts no stage
            self.stage = stage.value
            try:
                self.work = run(work, feedback)
            finally:
                self.report_repairs()
            return self.work

        return tracked

    def validator(self, run: Validator) -> Validator:
        def tracked(work: EnvWork, round_number: int) -> Validation:
            STOP.check()
            self.stage = Stage.VALIDATE.value
            try:
                return run(work, round_number)
            finally:
                self.report_repairs()

        return tracked


def fails_world_only(exc: Exception) -> bool:
    """Whether `exc` fails its world only: not a fatal (run-wide) fault, not a transient one that
    Prefect runs the world's task again for (its retries left), and not raised once the run was asked
    to stop (`Interrupted`, or what a stage stopped mid-way raised): no failure the world did not have."""
    if getattr(exc, "fatal", False) or isinstance(exc, Interrupted) or STOP.requested:
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
    artifacts as a failed version with the stage and reason, the failing attempt's trace and a note
    (storage/failed_worlds.py)."""
    store, catalog = configured_store(), open_catalog()
    if result.bundle is not None:
        return publish(result.bundle, store, catalog, result.checks, dedupe=True)
    assert result.failed_stage and result.reason
    files = failed_world_files(work.env_id, work.partial_files(), result.failed_stage, result.reason, catalog, store)
    return publish_failed(failed_manifest(work, generator), files, result.failed_stage, result.reason, store, catalog)


def build_world(
    params: GenerateParameters, run_id: str, progress: WorldProgress, r: GenerationResources
) -> BuildResult:
    """Run the world's stages: tasks -> database -> tools -> verifiers -> validate (then the model's
    review, when enabled: stages/review.py), each a resumable task; a failed validation sends its error
    back to the stage that made the faulty artifact, and the stages after it run again. An exception
    that fails this world only is recorded as a failed attempt of the stage it stopped in, and the
    world ends there."""
    runners = {
        stage: progress.stage_runner(stage, partial(resumable(t), params, run_id)) for stage, t in STAGE_TASKS.items()
    }
    validate = progress.validator(partial(resumable(validate_environment), params, run_id))
    if review_enabled(params.review, r.generator):  # the model's review once validation passes
        validate = with_review(validate, partial(resumable(review_world), params, run_id), r.runtime, r.log)
    try:
        return run_stages(progress.work, runners, validate, rounds=r.max_attempts)
    except Exception as exc:
        if STOP.requested and not isinstance(exc, Interrupted):
            raise Interrupted(f"world {progress.work.env_id} stopped in stage {progress.stage}", STOP.signum) from exc
        if not fails_world_only(exc):
            raise
        reason = record_crash(r.log, progress.work.env_id, progress.stage, exc)
        progress.report_repairs()
        return BuildResult(progress.work.env_id, None, [], progress.stage, reason)


def publish_outcome(outcome: WorldOutcome, result: BuildResult, work: EnvWork, r: GenerationResources) -> WorldOutcome:
    """`outcome` filled in from the world's build `result` once published (`publish_world`): good, failed
    with the stage and reason, or `duplicate` of the good version it is identical to. Publishing that
    raises fails the world at stage `publish` (recorded as its failed attempt)."""
    outcome.failed_stage, outcome.reason = result.failed_stage, result.reason
    try:
        published = publish_world(result, work, r.generator)
    except Exception as exc:
        if not fails_world_only(exc):
            raise
        outcome.failed_stage, outcome.reason = PUBLISH_STAGE, record_crash(r.log, work.env_id, PUBLISH_STAGE, exc)
        return outcome
    version = published.version
    if published.duplicate:
        outcome.status, outcome.ref, outcome.reason = "duplicate", version.ref, f"identical to {version.ref}"
        return outcome
    status = cast(WorldStatus, version.status)  # a published version is good or failed (validated on assignment)
    outcome.status, outcome.ref = status, version.ref
    outcome.reason = version.failure_reason or result.reason
    return outcome
