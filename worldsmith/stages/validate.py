"""Stage `validate`: the whole environment runs. Seed-data expectations and every execution probe
must pass; a failure names the stage that made the faulty artifact, which is run again with the
error fed back."""

from __future__ import annotations

import time
from dataclasses import dataclass

from worldsmith.bundle.contract import Bundle
from worldsmith.llm.backend import Generator, Usage
from worldsmith.models.quality import QualityCheck
from worldsmith.quality.checks import quality_checks
from worldsmith.runtime.episode import Runtime
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.order import Stage
from worldsmith.stages.repair import CheckFailed
from worldsmith.stages.verifiers import assemble
from worldsmith.stages.work import EnvWork


@dataclass
class Validation:
    """The outcome of one validation round: the assembled bundle (None if it did not assemble), its checks,
    and on failure the stage to run again with `error` fed back."""

    bundle: Bundle | None
    checks: list[QualityCheck]
    back_to: Stage | None = None  # the stage to run again, None when everything passed
    error: str = ""


def _route(checks: list[QualityCheck]) -> tuple[Stage, str] | None:
    for check in checks:
        if check.passed:
            continue
        if check.kind == "expectations":
            return (
                Stage.DATABASE,
                f"the seed data breaks the schema's expectations: {check.summary.get('reason')}; {check.details[:3]}",
            )
        tool_failures = [d for d in check.details if d.get("probe") == "tool runs"]
        if tool_failures:
            return Stage.TOOLS, "; ".join(f"{d['target']}: {d['detail']}" for d in tool_failures)
        return Stage.VERIFIERS, "; ".join(f"{d['probe']} {d['target']}: {d['detail']}" for d in check.details)
    return None


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
    checks = quality_checks(bundle, runtime, reuse_probes=True)  # the verifiers stage probed this very bundle
    route = _route(checks)
    usage = Usage(seconds=time.perf_counter() - started)
    if route is None:
        log.record(env_id=work.env_id, stage=Stage.VALIDATE.value, attempt=attempt, outcome="success", usage=usage)
        return Validation(bundle, checks)
    log.record(
        env_id=work.env_id,
        stage=Stage.VALIDATE.value,
        attempt=attempt,
        outcome="failure",
        error_class=f"back_to_{route[0]}",
        error_text=route[1],
        usage=usage,
    )
    return Validation(bundle, checks, route[0], route[1])
