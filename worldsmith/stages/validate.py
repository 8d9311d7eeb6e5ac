"""Stage `validate`: the whole environment runs. Seed-data expectations and every execution probe
must pass; a failure names the stage that made the faulty artifact, which is run again with the
error fed back."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.llm.backend import Generator, Usage
from worldsmith.models.quality import QualityCheck
from worldsmith.quality.checks import failed_probes, quality_checks
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog, AttemptTrace
from worldsmith.stages.history import Fault
from worldsmith.stages.order import ENVIRONMENT_STAGES, Stage
from worldsmith.stages.repair import CheckFailed
from worldsmith.stages.routing import owning_step
from worldsmith.stages.verifiers import assemble
from worldsmith.stages.work import EnvWork


@dataclass
class Validation:
    """The outcome of one validation round: the assembled bundle (None if it did not assemble), its checks,
    and on failure the stage to run again with `error` fed back, from its `step` (order.STEPS; None: from
    its first step), the steps before it kept; `faults`, the failures typed (kind and subject), `evidence`
    what the probes saw."""

    bundle: Bundle | None
    checks: list[QualityCheck]
    back_to: Stage | None = None  # the stage to run again, None when everything passed
    error: str = ""
    step: str | None = None
    faults: list[Fault] = field(default_factory=list)
    evidence: str = ""


#: Validates the work of every stage, in rounds numbered 1, 2, ...
Validator = Callable[[EnvWork, int], Validation]


class Route(NamedTuple):
    """Where a failed check goes back to, and what it tells that step: the error, typed failures, evidence."""

    stage: Stage
    step: str | None
    error: str
    faults: list[Fault]
    evidence: str


def _route(checks: list[QualityCheck]) -> tuple[Stage, str | None, str] | None:
    """Where the first failed check goes back to: (stage, step, error) of `_routed`."""
    route = _routed(checks)
    return None if route is None else (route.stage, route.step, route.error)


def _routed(checks: list[QualityCheck]) -> Route | None:
    """Where the first failed check goes back to. Of a check's failed probes, those of the earliest stage go
    back (routing.owning_step): the later stages run again after it anyway."""
    for check in checks:
        if check.passed:
            continue
        if check.kind == "expectations":
            reason = str(check.summary.get("reason"))
            return Route(
                Stage.DATABASE,
                "seed",
                f"the seed data breaks the schema's expectations: {reason}; {check.details[:3]}",
                [Fault(kind="expectations", subject=reason)],
                "",
            )
        owners = [(owning_step(r), r) for r in failed_probes(check)]
        stage, step = min(
            (owner for owner, _ in owners),
            key=lambda owner: ENVIRONMENT_STAGES.index(owner[0]),
            default=(Stage.VERIFIERS, None),
        )
        owned = [r for owner, r in owners if owner == (stage, step)]
        error = "; ".join(f"{r.probe} {r.target}: {r.detail}" for r in owned) or str(check.summary)
        faults = [Fault(kind=str(r.failure or r.probe), subject=r.target) for r in owned]
        evidence = "\n".join(f"{r.target}: {r.cause}" for r in owned if r.cause)
        return Route(stage, step, error, faults, evidence)
    return None


def failed_check(check: QualityCheck) -> JsonObject:
    """A failed quality check as the validate attempt's evidence: its kind, summary and details."""
    details: list[JsonValue] = list(check.details)
    return {"check": check.kind, "summary": check.summary, "details": details}


def run_validate_stage(
    work: EnvWork, generator: Generator, runtime: Runtime, log: AttemptLog, attempt: int
) -> Validation:
    started = time.perf_counter()
    try:
        bundle = assemble(work, generator)
    except CheckFailed as failed:
        log.record(
            env_id=work.env_id,
            stage=Stage.VALIDATE.value,
            attempt=attempt,
            outcome="failure",
            error_class=failed.kind,
            error_text=str(failed),
            usage=Usage(seconds=time.perf_counter() - started),
        )
        return Validation(None, [], Stage.VERIFIERS, str(failed))
    checks = quality_checks(bundle, runtime, reuse=True)  # the verifiers stage probed this very bundle
    route = _routed(checks)
    usage = Usage(seconds=time.perf_counter() - started)
    if route is None:
        log.record(env_id=work.env_id, stage=Stage.VALIDATE.value, attempt=attempt, outcome="success", usage=usage)
        return Validation(bundle, checks)
    stage, step, error, faults, evidence = route
    log.record(
        env_id=work.env_id,
        stage=Stage.VALIDATE.value,
        attempt=attempt,
        outcome="failure",
        error_class=f"back_to_{stage.step(step) if step else stage}",
        error_text=error,
        usage=usage,
        trace=AttemptTrace(evidence=[failed_check(c) for c in checks if not c.passed]),
    )
    return Validation(bundle, checks, stage, error, step, faults, evidence)
