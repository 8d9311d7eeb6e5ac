"""Failed probes are routed and reported by their typed fields (quality/probe_results.py): the step that
owns each failure kind (stages/routing.py, stages/validate.py), the import report's defect kind of each
failure and sandbox limit (interop/report.py), the stored record read back. Fast: results are built
directly, no sandbox runs."""

from __future__ import annotations

import pytest

from worldsmith.interop.awm import APP, SCHEMA, SEED, SQL_BUDGET, VERIFIERS, Imported, ImportProblem
from worldsmith.interop.report import BY_FAILURE, defects, import_check, probe_defect, static_defects
from worldsmith.models.quality import QualityCheck
from worldsmith.models.results import ToolResult, VerifierResult
from worldsmith.quality.checks import failed_probes
from worldsmith.quality.probe_results import Artifact, Probe, ProbeFailure, ProbeResult
from worldsmith.stages.order import Stage
from worldsmith.stages.routing import owning_step
from worldsmith.stages.validate import _route

pytestmark = pytest.mark.unit

F = ProbeFailure
CODE, SEED_STEP, VERIFIERS_STAGE = (Stage.TOOLS, "code"), (Stage.DATABASE, "seed"), (Stage.VERIFIERS, None)

#: The step that must fix each failure: the tool code's when a tool fails (it does not load, crashes, writes
#: where it must not, crashes a reference step, or replays otherwise), the seed's when a task names a record
#: the seed lacks, the verifiers stage's otherwise.
OWNING_STEP = {
    F.TOOLS_DO_NOT_LOAD: CODE,
    F.TOOL_CRASHED: CODE,
    F.VALID_INPUT_CRASHED: CODE,
    F.INVALID_INPUT_CRASHED: CODE,
    F.INVALID_INPUT_WRITTEN: CODE,
    F.READ_TOOL_WROTE: CODE,
    F.WROTE_OTHER_TABLES: CODE,
    F.BLOCKED_BY_REFUSED_STEP: VERIFIERS_STAGE,
    F.BLOCKED_BY_MISSING_RECORD: SEED_STEP,
    F.REFERENCE_STEP_CRASHED: CODE,
    F.REFERENCE_STEP_REFUSED: VERIFIERS_STAGE,
    F.REFERENCE_REJECTED: VERIFIERS_STAGE,
    F.UNTOUCHED_ACCEPTED: VERIFIERS_STAGE,
    F.UNTOUCHED_VERIFIER_CRASHED: VERIFIERS_STAGE,
    F.REPLAY_DIFFERS_IN_TOOL: CODE,
    F.REPLAY_DIFFERS_IN_VERIFIER: VERIFIERS_STAGE,
    F.REPLAY_DIFFERS_IN_END_STATE: CODE,
    F.BOUNDARY_INPUT_CRASHED: CODE,
    F.TOOL_REPLAY_DIFFERS: CODE,
    F.SEED_BREAKS_INVARIANT: SEED_STEP,
    F.INVARIANT_QUERY_FAILED: (Stage.DATABASE, "schema"),  # the invariants are stated with the schema
    F.TOOL_BREAKS_INVARIANT: CODE,
    F.READ_ROW_OUTSIDE_FILTER: CODE,
    F.READ_DROPPED_ROWS: CODE,
    F.RANGE_BOUNDARY_BROKEN: CODE,
    F.WRITE_WRONG_COLUMN: CODE,
    F.WRITE_UNIT_CHANGED: CODE,
    F.WRITE_FORMAT_CHANGED: CODE,
    F.DEPENDENT_ROWS_LEFT: CODE,
    F.SQL_BUILT_FROM_ARGUMENTS: CODE,
    F.SQL_INJECTION_ACCEPTED: CODE,
    F.HALF_DONE_ACCEPTED: VERIFIERS_STAGE,
    F.WRONG_ENTITY_ACCEPTED: VERIFIERS_STAGE,
    F.EXTRA_SIDE_EFFECT_ACCEPTED: VERIFIERS_STAGE,
    F.OTHER_ANSWER_ACCEPTED: VERIFIERS_STAGE,
    F.REORDERED_REJECTED: VERIFIERS_STAGE,
    F.TEXT_VARIANT_REJECTED: VERIFIERS_STAGE,
    F.OTHER_TEXT_ACCEPTED: VERIFIERS_STAGE,
    F.SEED_ID_HARD_CODED: VERIFIERS_STAGE,
}

#: The import report's kind of each failure that broke no sandbox limit (issue 8's names; any other
#: probe's failure is named after the probe).
DEFECT_KIND = {
    F.TOOLS_DO_NOT_LOAD: "tools_load",
    F.TOOL_CRASHED: "route_crashes",
    F.VALID_INPUT_CRASHED: "route_crashes",
    F.INVALID_INPUT_CRASHED: "tool_refuses_invalid_inputs",
    F.INVALID_INPUT_WRITTEN: "tool_refuses_invalid_inputs",
    F.READ_TOOL_WROTE: "read_tool_writes_nothing",
    F.WROTE_OTHER_TABLES: "tool_writes_only_its_tables",
    F.BLOCKED_BY_REFUSED_STEP: "task_not_blocked",
    F.BLOCKED_BY_MISSING_RECORD: "task_not_blocked",
    F.REFERENCE_STEP_CRASHED: "reference_rejected",
    F.REFERENCE_STEP_REFUSED: "reference_rejected",
    F.REFERENCE_REJECTED: "reference_rejected",
    F.UNTOUCHED_ACCEPTED: "task_already_satisfied",
    F.UNTOUCHED_VERIFIER_CRASHED: "verifier_raises",
    F.REPLAY_DIFFERS_IN_TOOL: "replay_differs",
    F.REPLAY_DIFFERS_IN_VERIFIER: "replay_differs",
    F.REPLAY_DIFFERS_IN_END_STATE: "replay_differs",
    F.BOUNDARY_INPUT_CRASHED: "route_crashes",
    F.TOOL_REPLAY_DIFFERS: "replay_differs",
    F.SEED_BREAKS_INVARIANT: "seed_breaks_invariant",
    F.INVARIANT_QUERY_FAILED: "invariant_query_failed",
    F.TOOL_BREAKS_INVARIANT: "tool_breaks_invariant",
    F.READ_ROW_OUTSIDE_FILTER: "tool_does_the_wrong_thing",
    F.READ_DROPPED_ROWS: "tool_does_the_wrong_thing",
    F.RANGE_BOUNDARY_BROKEN: "tool_does_the_wrong_thing",
    F.WRITE_WRONG_COLUMN: "tool_does_the_wrong_thing",
    F.WRITE_UNIT_CHANGED: "tool_does_the_wrong_thing",
    F.WRITE_FORMAT_CHANGED: "tool_does_the_wrong_thing",
    F.DEPENDENT_ROWS_LEFT: "tool_does_the_wrong_thing",
    F.SQL_BUILT_FROM_ARGUMENTS: "sql_injection",
    F.SQL_INJECTION_ACCEPTED: "sql_injection",
    F.HALF_DONE_ACCEPTED: "verifier_too_lenient",
    F.WRONG_ENTITY_ACCEPTED: "verifier_too_lenient",
    F.EXTRA_SIDE_EFFECT_ACCEPTED: "verifier_too_lenient",
    F.OTHER_ANSWER_ACCEPTED: "verifier_too_lenient",
    F.REORDERED_REJECTED: "verifier_too_strict",
    F.TEXT_VARIANT_REJECTED: "verifier_too_strict",
    F.OTHER_TEXT_ACCEPTED: "verifier_too_lenient",
    F.SEED_ID_HARD_CODED: "verifier_reads_seed_ids",
}


def failed(failure: ProbeFailure, detail: str = "boom", target: str = "x", **fields: str | None) -> ProbeResult:
    return ProbeResult.failing(failure, target, detail, **fields)


def probes_check(*results: ProbeResult) -> QualityCheck:
    return QualityCheck("probes", False, {"failed": len(results)}, [r.record() for r in results])


# -- the typed result ------------------------------------------------------------------------------


def test_every_failure_kind_has_a_deliberate_route_with_a_report():
    assert set(OWNING_STEP) == set(ProbeFailure) == set(DEFECT_KIND) == set(BY_FAILURE)


@pytest.mark.parametrize("failure", list(ProbeFailure))
def test_a_failed_result_carries_its_failure_with_the_failures_probe(failure):
    result = failed(failure)
    assert result.probe == failure.probe and not result.passed and result.failure is failure
    assert result.owner is failure.owner


def test_a_result_cannot_pass_with_a_failure_nor_fail_without_one_or_with_another_probes():
    with pytest.raises(ValueError):
        ProbeResult(Probe.TOOL_RUNS, "t", True, "ok", F.TOOL_CRASHED)
    with pytest.raises(ValueError):
        ProbeResult(Probe.TOOL_RUNS, "t", False, "boom")
    with pytest.raises(ValueError):
        ProbeResult(Probe.TOOL_RUNS, "t", False, "boom", F.VALID_INPUT_CRASHED)
    assert ProbeResult.passing(Probe.TOOL_RUNS, "t", "ok").owner is None


def test_a_failure_quoting_an_outcome_carries_its_sandbox_limit_with_the_refused_module():
    tool = ToolResult(status="env_error", error="sandbox limit import: ...", limit="import", refused_module="socket")
    result = ProbeResult.quoting(F.TOOL_CRASHED, "t", "boom", tool, "step 1 (t)")
    assert (result.limit, result.refused_module, result.cause) == ("import", "socket", "step 1 (t)")
    verdict = VerifierResult(status="env_error", error="sandbox limit timeout: ...", limit="timeout")
    assert ProbeResult.quoting(F.UNTOUCHED_VERIFIER_CRASHED, "t1", "env_error: ...", verdict).limit == "timeout"


@pytest.mark.parametrize("failure", list(ProbeFailure))
def test_a_stored_result_reads_back_as_it_was(failure):
    result = failed(failure, cause="step 2 (t)", limit="import", refused_module="urllib.request")
    record = result.record()
    assert {"probe", "target", "passed", "detail"} <= set(record)  # what catalogs stored before failures were typed
    assert ProbeResult.from_record(record) == result
    passed = ProbeResult.passing(failure.probe, "x", "fine")
    assert ProbeResult.from_record({"probe": passed.probe.value, "target": "x", "passed": True, "detail": "fine"}) == (
        passed
    )


def test_a_failed_result_stored_before_failures_were_typed_is_refused():
    with pytest.raises(ValueError):
        ProbeResult.from_record({"probe": "tool runs", "target": "x", "passed": False, "detail": "boom"})


def test_a_probes_check_gives_back_its_failed_probes_typed():
    results = [failed(F.TOOL_CRASHED, limit="timeout"), failed(F.UNTOUCHED_ACCEPTED, "complete", "t1")]
    assert failed_probes(probes_check(*results)) == results
    with pytest.raises(AssertionError):
        failed_probes(QualityCheck("expectations", False, {}, [{"table": "notes"}]))


# -- routing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", list(ProbeFailure))
def test_each_failure_goes_to_the_step_that_makes_the_artifact_at_fault(failure):
    assert owning_step(failed(failure)) == OWNING_STEP[failure]


def test_the_owner_names_the_artifact_whose_step_is_asked():
    assert {failure.owner for failure in ProbeFailure} == set(Artifact)
    for failure in ProbeFailure:
        expected = {
            CODE: Artifact.TOOL_CODE,
            SEED_STEP: Artifact.SEED,
            VERIFIERS_STAGE: Artifact.VERIFIERS,
            (Stage.DATABASE, "schema"): Artifact.INVARIANTS,
        }
        assert failure.owner is expected[OWNING_STEP[failure]]


def test_routing_reads_the_kind_never_the_words():
    # details that once decided the route now say nothing: the kind does
    assert owning_step(failed(F.REFERENCE_REJECTED, "verifier said incomplete: step 1 gave env_error")) == (
        VERIFIERS_STAGE
    )
    refused = failed(F.BLOCKED_BY_REFUSED_STEP, "step 1 ends in a ToolError: which no row of the seed holds")
    assert owning_step(refused) == VERIFIERS_STAGE
    assert owning_step(failed(F.REPLAY_DIFFERS_IN_TOOL, "verifier v: its verdict differs")) == CODE
    with pytest.raises(ValueError):
        owning_step(ProbeResult.passing(Probe.TOOL_RUNS, "t", "ok"))


def test_validation_sends_a_failed_check_back_to_the_earliest_owning_step_with_its_failures():
    untouched = failed(F.UNTOUCHED_ACCEPTED, "complete", "t1")
    crash = failed(F.TOOL_CRASHED, "ZeroDivisionError", "list_orders")
    missing = failed(F.BLOCKED_BY_MISSING_RECORD, "its instruction names ['Ada']", "t2")
    stage, step, error = _route([probes_check(untouched, crash, missing)])
    assert (stage, step) == (Stage.DATABASE, "seed")
    assert error == "task not blocked t2: its instruction names ['Ada']"
    stage, step, error = _route([probes_check(untouched, crash, failed(F.VALID_INPUT_CRASHED, "bad", "list_orders"))])
    assert (stage, step) == CODE
    assert error == "tool runs list_orders: ZeroDivisionError; tool runs on valid inputs list_orders: bad"
    assert _route([probes_check(untouched)]) == (Stage.VERIFIERS, None, "untouched rejected t1: complete")


def test_validation_routes_failed_seed_expectations_before_failed_probes():
    expectations = QualityCheck("expectations", False, {"reason": "table notes is empty"}, [{"table": "notes"}])
    stage, step, error = _route([expectations, probes_check(failed(F.TOOL_CRASHED))])
    assert (stage, step) == SEED_STEP and "table notes is empty" in error


def test_validation_passes_a_world_whose_checks_all_passed():
    assert _route([QualityCheck("expectations", True), QualityCheck("probes", True)]) is None


def test_validation_routes_a_failed_check_naming_no_probe_to_the_verifiers():
    assert _route([QualityCheck("probes", False, {"failed": 0})]) == (Stage.VERIFIERS, None, "{'failed': 0}")


# -- the import report -----------------------------------------------------------------------------


@pytest.mark.parametrize("failure", list(ProbeFailure))
def test_a_failure_that_broke_no_limit_is_reported_by_its_kind(failure):
    assert probe_defect(failed(failure)) == DEFECT_KIND[failure]
    # a resource limit is the route's crash, not an attempt
    for limit in ("timeout", "cpu", "memory", "recursion"):
        assert probe_defect(failed(failure, limit=limit)) == DEFECT_KIND[failure]


@pytest.mark.parametrize(
    ("limit", "refused_module", "kind"),
    [
        ("secrets", None, "secret_attempt"),
        ("network", None, "network_attempt"),
        ("import", "urllib.request", "network_attempt"),
        ("import", "socket", "network_attempt"),
        ("import", "os", "sandbox_violation"),
        ("import", None, "sandbox_violation"),  # a relative import names no module
        ("filesystem", None, "sandbox_violation"),
        ("introspection", None, "sandbox_violation"),
        ("crash", None, "sandbox_violation"),
        ("protocol", None, "sandbox_violation"),
    ],
)
def test_a_failure_that_broke_a_sandbox_limit_is_reported_as_the_attempt(limit, refused_module, kind):
    for failure in (F.TOOL_CRASHED, F.UNTOUCHED_VERIFIER_CRASHED, F.REFERENCE_STEP_CRASHED):
        assert probe_defect(failed(failure, limit=limit, refused_module=refused_module)) == kind


def test_the_report_reads_no_message():
    words = "sandbox limit secrets: import of 'socket' refused"
    assert probe_defect(failed(F.TOOL_CRASHED, words)) == "route_crashes"
    assert probe_defect(failed(F.UNTOUCHED_VERIFIER_CRASHED, "complete: " + words)) == "verifier_raises"


def test_import_problems_are_reported_by_their_part_with_their_limit():
    imported = Imported(
        "s",
        "env",
        None,
        defects=[
            ImportProblem(SEED, "1 of 9 inserts fail (first: FOREIGN KEY constraint failed: INSERT ...)"),
            ImportProblem(SCHEMA, "near 'TABL': syntax error"),
            ImportProblem(SQL_BUDGET, "statement ran past its budget"),
            ImportProblem(VERIFIERS, "task 3 has no verifier"),
            ImportProblem("tools.json", "no tools (line 1)"),
            ImportProblem(APP, "the app does not load: ZeroDivisionError"),
            ImportProblem(APP, "the app does not load: sandbox limit secrets: ...", "secrets"),
            ImportProblem(APP, "the app does not load: sandbox limit import: ...", "import", "requests"),
            ImportProblem(APP, "the app does not load: sandbox limit timeout: ...", "timeout"),
        ],
        failed_inserts=[("INSERT INTO loans VALUES (9001)", "FOREIGN KEY constraint failed")],
    )
    found = defects(imported, [])
    assert [(d["kind"], d["target"]) for d in found] == [
        ("seed_insert_fails", "seed"),
        ("malformed", SCHEMA),
        ("malformed", SQL_BUDGET),
        ("malformed", VERIFIERS),
        ("malformed", "tools.json"),
        ("app_fails", APP),
        ("secret_attempt", APP),
        ("network_attempt", APP),
        ("app_fails", APP),
    ]
    assert found[0]["detail"] == "FOREIGN KEY constraint failed: INSERT INTO loans VALUES (9001)"
    assert found[1]["detail"] == "schema: near 'TABL': syntax error"
    assert found[4]["detail"] == "tools.json: no tools (line 1)"


def test_failed_probes_join_refused_imports_in_the_import_report():
    crash = failed(F.TOOL_CRASHED, "sandbox limit import: ...", "list_branches", limit="import", refused_module="ssl")
    satisfied = failed(F.UNTOUCHED_ACCEPTED, "complete: {}", "t04")
    passed = ProbeResult.passing(Probe.TOOL_RUNS, "get_book", "ok")
    app = "import os\nimport requests\n\nasync def route():\n    import urllib.request\n"
    found = defects(Imported("s", "env", None), [crash, passed, satisfied], app)
    assert [(d["kind"], d["target"]) for d in found] == [
        ("network_attempt", "app.py:2"),
        ("network_attempt", "app.py:5"),
        ("network_attempt", "list_branches"),
        ("task_already_satisfied", "t04"),
    ]
    assert found[2]["detail"] == "sandbox limit import: ..." and found[3]["detail"] == "complete: {}"
    assert {d["target"] for d in static_defects(app)} == {"app.py:2", "app.py:5"}  # os is the app's to import
    check = import_check(found)
    assert not check.passed and check.summary["by_kind"] == {"network_attempt": 3, "task_already_satisfied": 1}
    assert check.summary["reason"] == "import defects: network_attempt x3, task_already_satisfied x1"
    assert import_check([]).passed
