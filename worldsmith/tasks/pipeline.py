"""One environment from scenario to validated bundle: tasks -> database -> tools -> verifiers ->
validate, each stage with its own repair loop; a validation failure sends its error back to the
stage that made the faulty artifact and the stages after it run again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from worldsmith.bundle.loader import Bundle
from worldsmith.llm.backend import Generator
from worldsmith.models.bundle import Scenario
from worldsmith.runtime.episode import Runtime
from worldsmith.storage.publish import QualityCheck
from worldsmith.tasks.attempts import AttemptLog
from worldsmith.tasks.database import run_database_stage
from worldsmith.tasks.repair import StageFailed, feedback_text
from worldsmith.tasks.task_list import run_tasks_stage
from worldsmith.tasks.tools import run_tools_stage
from worldsmith.tasks.validate import Validation, run_validate_stage
from worldsmith.tasks.verifiers import run_verifiers_stage
from worldsmith.tasks.work import EnvWork, env_id_for

ORDER = ("tasks", "database", "tools", "verifiers")


@dataclass
class BuildResult:
    env_id: str
    bundle: Bundle | None
    checks: list[QualityCheck] = field(default_factory=list)
    failed_stage: str | None = None
    reason: str | None = None

    @property
    def good(self) -> bool:
        return self.bundle is not None and self.failed_stage is None


def run_stage(stage: str, work: EnvWork, generator: Generator, runtime: Runtime, log: AttemptLog, max_attempts: int, feedback: str | None) -> EnvWork:
    if stage == "tasks":
        return run_tasks_stage(work, generator, log, max_attempts, feedback)
    if stage == "database":
        return run_database_stage(work, generator, log, max_attempts, feedback)
    if stage == "tools":
        return run_tools_stage(work, generator, runtime, log, max_attempts, feedback)
    return run_verifiers_stage(work, generator, runtime, log, max_attempts, feedback)


StageRunner = Callable[[str, EnvWork, str | None], EnvWork]
Validator = Callable[[EnvWork, int], Validation]


def build_environment(scenario: Scenario, seed: int, generator: Generator, runtime: Runtime, log: AttemptLog, max_attempts: int = 5,
                      *, stage_runner: StageRunner | None = None, validator: Validator | None = None) -> BuildResult:
    """Generate and validate one environment; never raises for semantic faults (they end in a failed result).

    `stage_runner(stage, work, feedback)` and `validator(work, round)` default to running the
    stages directly; the generate flow passes Prefect-task versions of them.
    """
    stage_runner = stage_runner or (lambda stage, w, fb: run_stage(stage, w, generator, runtime, log, max_attempts, fb))
    validator = validator or (lambda w, round_number: run_validate_stage(w, generator, runtime, log, round_number))
    work = EnvWork(scenario=scenario, seed=seed, env_id=env_id_for(scenario, seed))
    start, feedback = 0, None
    try:
        for round_number in range(1, max_attempts + 1):
            for index, stage in enumerate(ORDER[start:], start=start):
                work = stage_runner(stage, work, feedback if index == start else None)
            validation = validator(work, round_number)
            if validation.back_to is None:
                return BuildResult(work.env_id, validation.bundle, validation.checks)
            start, feedback = ORDER.index(validation.back_to), feedback_text(validation.error, "")
        return BuildResult(work.env_id, validation.bundle, validation.checks, "validate", f"validation kept failing: {validation.error}")
    except StageFailed as failed:
        return BuildResult(work.env_id, None, [], failed.stage, str(failed))
