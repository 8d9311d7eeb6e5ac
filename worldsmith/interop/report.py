"""The import quality report: every defect of an imported environment, by kind, as a catalog check.

Kinds (design of issue 8; each names the thing at fault):
- `seed_insert_fails`: an insert of the release's seed data fails (the insert is dropped, the
  environment is failed);
- `app_fails`: the app does not load in the sandbox;
- `route_crashes`: a route answers 5xx or raises on plausible input (its documented examples,
  else values from the seed data);
- `verifier_raises`: a verifier raises instead of judging;
- `task_already_satisfied`: the untouched database already passes a task's verifier;
- `reference_rejected` / `replay_differs`: a given reference solution is not accepted, or two
  replays end in different databases;
- `secret_attempt` / `network_attempt` / `sandbox_violation`: the code tried to read a secret, to
  reach the network, or anything else the sandbox refuses (refused either way);
- `verifier_too_lenient` / `verifier_too_strict` / `verifier_reads_seed_ids`: a verifier judged a
  mutated end state wrongly, or names a row id only this seed has (quality/verifier_mutations.py);
- any other failed probe: its probe's name (`tool_refuses_invalid_inputs`, `task_not_blocked` ...);
  any other problem of the release: `malformed`.

Each is read from typed fields (the sandbox limit a failure names, its `ProbeFailure`, the part of the
scenario at fault), never from the wording of a message.
"""

from __future__ import annotations

from collections import Counter

from worldsmith.bundle.asgiapp import app_imports
from worldsmith.bundle.codepolicy import APP_MODULES
from worldsmith.interop.awm import APP, SEED, Imported
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.quality import QualityCheck
from worldsmith.quality.probe_results import ProbeFailure, ProbeResult

#: Modules whose import is an attempt to reach the network.
NETWORK_MODULES = frozenset(
    {"socket", "ssl", "urllib", "http", "httpx", "requests", "aiohttp", "urllib3", "ftplib", "smtplib", "websockets"}
)
#: Sandbox limits of resources: hitting one is the route's crash, not an attempt at anything.
RESOURCE_LIMITS = frozenset({"timeout", "cpu", "memory", "recursion"})
_BY_LIMIT = {"secrets": "secret_attempt", "network": "network_attempt"}
#: The defect kind of each failed probe that broke no sandbox limit.
BY_FAILURE: dict[ProbeFailure, str] = {
    ProbeFailure.TOOLS_DO_NOT_LOAD: "tools_load",
    ProbeFailure.TOOL_CRASHED: "route_crashes",
    ProbeFailure.VALID_INPUT_CRASHED: "route_crashes",
    ProbeFailure.INVALID_INPUT_CRASHED: "tool_refuses_invalid_inputs",
    ProbeFailure.INVALID_INPUT_WRITTEN: "tool_refuses_invalid_inputs",
    ProbeFailure.READ_TOOL_WROTE: "read_tool_writes_nothing",
    ProbeFailure.WROTE_OTHER_TABLES: "tool_writes_only_its_tables",
    ProbeFailure.BLOCKED_BY_REFUSED_STEP: "task_not_blocked",
    ProbeFailure.BLOCKED_BY_MISSING_RECORD: "task_not_blocked",
    ProbeFailure.REFERENCE_STEP_CRASHED: "reference_rejected",
    ProbeFailure.REFERENCE_STEP_REFUSED: "reference_rejected",
    ProbeFailure.REFERENCE_REJECTED: "reference_rejected",
    ProbeFailure.UNTOUCHED_ACCEPTED: "task_already_satisfied",
    ProbeFailure.UNTOUCHED_VERIFIER_CRASHED: "verifier_raises",
    ProbeFailure.REPLAY_DIFFERS_IN_TOOL: "replay_differs",
    ProbeFailure.REPLAY_DIFFERS_IN_VERIFIER: "replay_differs",
    ProbeFailure.REPLAY_DIFFERS_IN_END_STATE: "replay_differs",
    ProbeFailure.BOUNDARY_INPUT_CRASHED: "route_crashes",
    ProbeFailure.TOOL_REPLAY_DIFFERS: "replay_differs",
    ProbeFailure.SEED_BREAKS_INVARIANT: "seed_breaks_invariant",
    ProbeFailure.INVARIANT_QUERY_FAILED: "invariant_query_failed",
    ProbeFailure.TOOL_BREAKS_INVARIANT: "tool_breaks_invariant",
    ProbeFailure.READ_ROW_OUTSIDE_FILTER: "tool_does_the_wrong_thing",
    ProbeFailure.READ_DROPPED_ROWS: "tool_does_the_wrong_thing",
    ProbeFailure.RANGE_BOUNDARY_BROKEN: "tool_does_the_wrong_thing",
    ProbeFailure.WRITE_WRONG_COLUMN: "tool_does_the_wrong_thing",
    ProbeFailure.WRITE_UNIT_CHANGED: "tool_does_the_wrong_thing",
    ProbeFailure.WRITE_FORMAT_CHANGED: "tool_does_the_wrong_thing",
    ProbeFailure.DEPENDENT_ROWS_LEFT: "tool_does_the_wrong_thing",
    ProbeFailure.SQL_BUILT_FROM_ARGUMENTS: "sql_injection",
    ProbeFailure.SQL_INJECTION_ACCEPTED: "sql_injection",
    ProbeFailure.HALF_DONE_ACCEPTED: "verifier_too_lenient",
    ProbeFailure.WRONG_ENTITY_ACCEPTED: "verifier_too_lenient",
    ProbeFailure.EXTRA_SIDE_EFFECT_ACCEPTED: "verifier_too_lenient",
    ProbeFailure.OTHER_ANSWER_ACCEPTED: "verifier_too_lenient",
    ProbeFailure.REORDERED_REJECTED: "verifier_too_strict",
    ProbeFailure.TEXT_VARIANT_REJECTED: "verifier_too_strict",
    ProbeFailure.OTHER_TEXT_ACCEPTED: "verifier_too_lenient",
    ProbeFailure.SEED_ID_HARD_CODED: "verifier_reads_seed_ids",
}


def _violation(limit: str | None, refused_module: str | None) -> str | None:
    """The defect kind of breaking sandbox limit `limit` (an import's: of `refused_module`); None when no
    limit was broken, or a resource limit (a timeout is the route's crash, not an attempt)."""
    if limit is None or limit in RESOURCE_LIMITS:
        return None
    if limit == "import":
        network = refused_module is not None and refused_module.split(".")[0] in NETWORK_MODULES
        return "network_attempt" if network else "sandbox_violation"
    return _BY_LIMIT.get(limit, "sandbox_violation")


def probe_defect(probe: ProbeResult) -> str:
    """The defect kind of a failed probe: the sandbox limit its code broke, else what failed."""
    assert probe.failure is not None, f"{probe.probe} {probe.target} passed"
    return _violation(probe.limit, probe.refused_module) or BY_FAILURE[probe.failure]


def static_defects(app_source: str) -> list[dict[str, str]]:
    """Imports in the app that the sandbox will refuse: network modules are network attempts."""
    found = []
    for line, module in app_imports(app_source):
        top = module.split(".")[0]
        if top not in APP_MODULES:
            kind = "network_attempt" if top in NETWORK_MODULES else "sandbox_violation"
            found.append(
                {"kind": kind, "target": f"app.py:{line}", "detail": f"imports {module!r}, which the sandbox refuses"}
            )
    return found


def defects(imported: Imported, probes: list[ProbeResult], app_source: str = "") -> list[dict[str, str]]:
    """Every defect found importing and probing one scenario: `{kind, target, detail}`."""
    found = [
        {"kind": "seed_insert_fails", "target": "seed", "detail": f"{error}: {statement[:200]}"}
        for statement, error in imported.failed_inserts
    ]
    found += static_defects(app_source)
    for problem in imported.defects:
        if problem.part == SEED:
            continue  # each failed insert is listed above
        kind = (
            (_violation(problem.limit, problem.refused_module) or "app_fails") if problem.part == APP else "malformed"
        )
        found.append({"kind": kind, "target": problem.part, "detail": str(problem)})
    found += [
        {"kind": probe_defect(probe), "target": probe.target, "detail": probe.detail}
        for probe in probes
        if not probe.passed
    ]
    return found


def import_check(found: list[dict[str, str]]) -> QualityCheck:
    """The `import` quality check of a version: passed when nothing was found."""
    counts = Counter(d["kind"] for d in found)
    by_kind: JsonObject = {kind: n for kind, n in sorted(counts.items())}
    summary: JsonObject = {"defects": len(found), "by_kind": by_kind}
    if found:
        summary["reason"] = "import defects: " + ", ".join(f"{kind} x{n}" for kind, n in sorted(counts.items()))
    return QualityCheck("import", not found, summary, [{**defect} for defect in found[:200]])
