"""One environment from scenario to validated bundle: tasks -> database -> tools -> verifiers ->
validate, each stage with its own repair loop; a validation failure sends its error back to the
stage that made the faulty artifact and the stages after it run again."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from worldsmith.bundle.contract import Bundle
from worldsmith.llm.backend import Generator
from worldsmith.models.bundle import Scenario
from worldsmith.models.quality import QualityCheck
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.database import run_database_stage
from worldsmith.stages.order import ENVIRONMENT_STAGES, STEPS, Stage
from worldsmith.stages.repair import StageFailed
from worldsmith.stages.review import review_enabled, run_review_stage, with_review
from worldsmith.stages.task_list import run_tasks_stage
from worldsmith.stages.tools import run_tools_stage
from worldsmith.stages.validate import Validation, Validator, run_validate_stage
from worldsmith.stages.verifiers import run_verifiers_stage
from worldsmith.stages.work import EnvWork

#: Runs one stage on the work so far, with the error of a failed validation fed back (or None).
StageRunner = Callable[[EnvWork, str | None], EnvWork]


@dataclass
class BuildResult:
    """One environment's outcome: its bundle and checks, or the stage that failed it and why."""

    env_id: str
    bundle: Bundle | None
    checks: list[QualityCheck] = field(default_factory=list)
    failed_stage: str | None = None
    reason: str | None = None

    @property
    def good(self) -> bool:
        return self.bundle is not None and self.failed_stage is None


def rejected_step(stage: Stage, step: str | None) -> str:
    """The record name of the step a failed validation sends back to (`step` None: the stage's first)."""
    steps = STEPS.get(stage)
    return stage.step(step or steps[0]) if steps else stage.value


def run_stages(work: EnvWork, stages: Mapping[Stage, StageRunner], validate: Validator, rounds: int) -> BuildResult:
    """Run `stages` (one runner for each of ENVIRONMENT_STAGES) in order, then `validate`; a failed validation
    sends its error back to the stage it names, which runs again with the error fed back to the step it names
    (`work.resume_step`; the steps before it kept), that step's latest answer recorded as rejected in
    `work.history` (its repair prompt carries every attempt), and the stages after it run again. At most `rounds`
    rounds; never raises for semantic faults (they end in a failed result)."""
    start, feedback = 0, None
    try:
        for round_number in range(1, rounds + 1):
            for index, stage in enumerate(ENVIRONMENT_STAGES[start:], start=start):
                work = stages[stage](work, feedback if index == start else None)
            validation = validate(work, round_number)
            if validation.back_to is None:
                return BuildResult(work.env_id, validation.bundle, validation.checks)
            start, feedback = ENVIRONMENT_STAGES.index(validation.back_to), validation.error
            assert validation.step is None or validation.step in STEPS[validation.back_to], validation.step
            work = work.rejected(
                rejected_step(validation.back_to, validation.step),
                validation.error,
                validation.faults,
                validation.evidence,
            ).model_copy(update={"resume_step": validation.step})
        return BuildResult(
            work.env_id,
            validation.bundle,
            validation.checks,
            Stage.VALIDATE.value,
            f"validation kept failing: {validation.error}",
        )
    except StageFailed as failed:
        return BuildResult(work.env_id, None, [], failed.stage, str(failed))


def build_environment(
    scenario: Scenario,
    seed: int,
    generator: Generator,
    runtime: Runtime,
    log: AttemptLog,
    max_attempts: int = 5,
    review: bool = False,
) -> BuildResult:
    """Generate and validate one environment in this process, each stage a plain function call
    (the generate flow runs the same stages as Prefect tasks through `run_stages`); with `review`, the
    model's review of the validated world (stages/review.py; not for the procedural backend)."""
    stages: dict[Stage, StageRunner] = {
        Stage.TASKS: lambda w, fb: run_tasks_stage(w, generator, log, max_attempts, fb, runtime),
        Stage.DATABASE: lambda w, fb: run_database_stage(w, generator, log, max_attempts, fb),
        Stage.TOOLS: lambda w, fb: run_tools_stage(w, generator, runtime, log, max_attempts, fb),
        Stage.VERIFIERS: lambda w, fb: run_verifiers_stage(w, generator, runtime, log, max_attempts, fb),
    }

    def validate_world(work: EnvWork, round_number: int) -> Validation:
        return run_validate_stage(work, generator, runtime, log, round_number)

    validate: Validator = validate_world
    if review_enabled(review, generator):
        review_world = lambda w: run_review_stage(w, generator, log, max_attempts)  # noqa: E731
        validate = with_review(validate_world, review_world, runtime, log)
    return run_stages(EnvWork.start(scenario, seed), stages, validate, rounds=max_attempts)
