"""The quality record of an environment version: data expectations on its seed tables and the
runtime's execution probes, as checks to publish with it."""

from __future__ import annotations

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.quality import QualityCheck
from worldsmith.quality.expectations import validate_seed_data
from worldsmith.quality.probe_results import ProbeResult
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime

#: The kind of the check `probe_check` makes.
PROBES_CHECK = "probes"


def probe_check(runtime: Runtime, bundle: Bundle, *, reuse: bool = False) -> QualityCheck:
    """The execution probes as one check: tools run (on many valid and invalid inputs, writing only where they
    may), tasks not blocked, references accepted, untouched rejected, replay deterministic."""
    results = check_environment(runtime, bundle, reuse=reuse)
    failed = [r for r in results if not r.passed]
    summary: JsonObject = {"probes": len(results), "failed": len(failed)}
    if failed:
        summary["reason"] = (
            f"{len(failed)} of {len(results)} probes failed "
            f"(first: {failed[0].probe} {failed[0].target}: {failed[0].detail})"
        )
    return QualityCheck(PROBES_CHECK, not failed, summary, [r.record() for r in failed])


def failed_probes(check: QualityCheck) -> list[ProbeResult]:
    """The failed probes a `probe_check` recorded, typed again."""
    assert check.kind == PROBES_CHECK, f"a {check.kind} check records no probes"
    return [ProbeResult.from_record(record) for record in check.details]


def quality_checks(bundle: Bundle, runtime: Runtime | None = None, *, reuse: bool = False) -> list[QualityCheck]:
    """Expectations on the seed data, then (given a runtime) the execution probes; with `reuse`, either
    outcome this process has for the same content (expectations.validate_world,
    probes.check_environment)."""
    checks = [validate_seed_data(bundle, reuse=reuse)]
    if runtime is not None:
        checks.append(probe_check(runtime, bundle, reuse=reuse))
    return checks
