"""Stage `validate`: the whole environment runs. Seed-data expectations and every execution probe
must pass; a failure names the stage that made the faulty artifact, which is run again with the
error fed back."""

from __future__ import annotations

import time
from dataclasses import dataclass

from worldsmith.bundle.loader import Bundle
from worldsmith.llm.backend import Generator, Usage
from worldsmith.quality.checks import quality_checks
from worldsmith.runtime.episode import Runtime
from worldsmith.storage.publish import QualityCheck
from worldsmith.tasks.attempts import AttemptLog
from worldsmith.tasks.repair import CheckFailed
from worldsmith.tasks.verifiers import assemble
from worldsmith.tasks.work import EnvWork


@dataclass
class Validation:
    bundle: Bundle | None
    checks: list[QualityCheck]
    back_to: str | None = None  # the stage to run again, None when everything passed
    error: str = ""


def _route(checks: list[QualityCheck]) -> tuple[str, str] | None:
    for check in checks:
        if check.passed:
            continue
        if check.kind == "expectations":
            return "database", f"the seed data breaks the schema's expectations: {check.summary.get('reason')}; {check.details[:3]}"
        tool_failures = [d for d in check.details if d.get("probe") == "tool runs"]
        if tool_failures:
            return "tools", "; ".join(f"{d['target']}: {d['detail']}" for d in tool_failures)
        return "verifiers", "; ".join(f"{d['probe']} {d['target']}: {d['detail']}" for d in check.details)
    return None


def run_validate_stage(work: EnvWork, generator: Generator, runtime: Runtime, log: AttemptLog, attempt: int) -> Validation:
    started = time.perf_counter()
    try:
        bundle = assemble(work, generator)
    except CheckFailed as failed:
        log.record(env_id=work.env_id, stage="validate", attempt=attempt, outcome="failure", error_class=failed.kind, error_text=str(failed),
                   usage=Usage(seconds=time.perf_counter() - started))
        return Validation(None, [], "verifiers", str(failed))
    checks = quality_checks(bundle, runtime, reuse_probes=True)  # the verifiers stage probed this very bundle
    route = _route(checks)
    usage = Usage(seconds=time.perf_counter() - started)
    if route is None:
        log.record(env_id=work.env_id, stage="validate", attempt=attempt, outcome="success", usage=usage)
        return Validation(bundle, checks)
    log.record(env_id=work.env_id, stage="validate", attempt=attempt, outcome="failure", error_class=f"back_to_{route[0]}",
               error_text=route[1], usage=usage)
    return Validation(bundle, checks, route[0], route[1])
