"""Review findings confirmed by construction (stages/review.py, stages/finding_states.py): a too-lenient
finding's wrong end state is built from its calls through the runtime and judged by the verifier (accepted:
confirmed); a too-strict one's correct end state is built and must be rejected. Confirmed findings go back
to the verifiers stage with the evidence; every finding's outcome is recorded (repaired, or rejected: not
confirmed, or disputed by the stage) in the attempt log and the review's check."""

from __future__ import annotations

import json
import re

import pytest
from support.llm_server import ScriptedLLM, json_reply
from support.patience import MOMENTS_S
from support.procedural import over_strict, procedural_work
from support.zocdoc import zocdoc_bundle

from worldsmith.bundle.loader import build_bundle
from worldsmith.llm.openai_backend import OpenAIGenerator
from worldsmith.llm.procedural.backend import ProceduralGenerator
from worldsmith.models.specs import ReviewFinding, VerifierCode
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.order import Stage
from worldsmith.stages.review import FindingOutcome, probe_finding, run_review_stage, with_review
from worldsmith.stages.validate import Validation
from worldsmith.stages.work import EnvWork

pytestmark = pytest.mark.sandbox


def _validated(work: EnvWork, round_number: int) -> Validation:
    """A validation that passed (the review's tests probe findings, not the world's other probes)."""
    return Validation(build_bundle(work.sources(), work.manifest(ProceduralGenerator(seed=2))), [])


def _update_task(verifiers: dict) -> tuple[str, dict]:
    """A task whose reference solution ends in an update, and that step."""
    solution = next(s for s in verifiers["solutions"] if s["solution"][-1]["tool"].startswith("update_"))
    return solution["task_id"], solution["solution"][-1]


def _another_row(step: dict) -> dict:
    """`step` (an update of one row by id) made on another row."""
    key = next(k for k in step["arguments"] if k.endswith("_id"))
    other = 1 if step["arguments"][key] != 1 else 2
    return {"tool": step["tool"], "arguments": {**step["arguments"], key: other}}


def _strict(verifiers: dict, task_id: str, step: dict) -> dict:
    """`verifiers` with `task_id`'s verifier repaired: an update of any other row of the table is not complete."""
    key = next(k for k in step["arguments"] if k.endswith("_id"))
    pattern = rf"(def verify_{task_id}\(initial, final, answer\):\n    value = _value\(final, '(\w+)', (\d+), .*\n)"
    match = re.search(pattern, verifiers["verifiers_py"])
    assert match is not None and int(match.group(3)) == step["arguments"][key]
    others = f"'SELECT * FROM \"{match.group(2)}\" WHERE id != {match.group(3)} ORDER BY id'"
    guard = (
        f"    if [tuple(r) for r in initial.execute({others})] != [tuple(r) for r in final.execute({others})]:\n"
        "        return _result('incomplete', other_rows_changed=True)\n"
    )
    source = verifiers["verifiers_py"].replace(match.group(1), match.group(1) + guard, 1)
    return {**verifiers, "verifiers_py": source}


def _reviewer(url: str) -> OpenAIGenerator:
    return OpenAIGenerator(model="m", base_url=url, timeout_s=MOMENTS_S, retries=1)


def _outcomes(log: AttemptLog) -> list[tuple[int, str, list[tuple[str, str]]]]:
    """Each `review:findings` record: its round, outcome, and each finding's (id, outcome)."""
    return [
        (a.attempt, a.outcome, [(f["finding"], f["outcome"]) for f in json.loads(a.error_text or "[]")])
        for a in log.attempts
        if a.stage == Stage.REVIEW.step("findings")
    ]


def test_a_lenient_finding_is_confirmed_by_building_its_state_and_repaired(runtime):
    work, verifiers = procedural_work(runtime)
    task_id, step = _update_task(verifiers)
    lenient = work.model_copy(update={"verifiers": VerifierCode.model_validate(verifiers)})
    finding = {
        "category": "verifier_too_lenient",
        "target": task_id,
        "problem": "it accepts the update made to every other row too",
        "build": [step, _another_row(step)],
    }
    server = ScriptedLLM([json_reply({"findings": [finding]})])
    with server.serve() as background:
        log = AttemptLog("lenient")
        reviewed = with_review(
            _validated, lambda w: run_review_stage(w, _reviewer(f"{background.url}/v1"), log, 2), runtime, log
        )
        sent = reviewed(lenient, 1)
        assert sent.back_to == Stage.VERIFIERS and sent.step is None
        assert f"review review-1: verifier_too_lenient {task_id}" in sent.error
        assert "judged complete by the verifier" in sent.error and _another_row(step)["tool"] in sent.error
        assert "`disputed`" in sent.error  # the stage may disagree, with its reason
        repaired = reviewed(
            lenient.model_copy(update={"verifiers": VerifierCode.model_validate(_strict(verifiers, task_id, step))}), 2
        )
    assert repaired.back_to is None and len(server.requests) == 1  # probed again, not asked again
    (check,) = [c for c in repaired.checks if c.kind == "review"]
    assert check.passed and [d["outcome"] for d in check.details] == ["repaired"]
    assert "judged incomplete" in check.details[0]["detail"]
    assert _outcomes(log) == [(1, "failure", [("review-1", "confirmed")]), (2, "success", [("review-1", "repaired")])]


def test_findings_not_confirmed_by_construction_or_disputed_are_rejected_with_their_reason(runtime):
    work, verifiers = procedural_work(runtime)
    task_id, step = _update_task(verifiers)
    lenient = work.model_copy(update={"verifiers": VerifierCode.model_validate(verifiers)})
    refused = {
        "tool": step["tool"],
        "arguments": {**step["arguments"], next(k for k in step["arguments"] if k.endswith("_id")): 987_654},
    }

    def too_lenient(build: list[dict]) -> dict:
        return {
            "category": "verifier_too_lenient",
            "target": task_id,
            "problem": "accepts a wrong state",
            "build": build,
        }

    findings = [
        too_lenient([_another_row(step)]),  # the verifier rejects it: not confirmed
        too_lenient([step]),  # the reference solution's own end state: no wrong state
        too_lenient([refused]),  # a call the tool refuses: the state cannot be built
        too_lenient([step, _another_row(step)]),  # confirmed, then disputed by the verifiers stage
    ]
    server = ScriptedLLM([json_reply({"findings": findings})])
    with server.serve() as background:
        log = AttemptLog("rejected")
        reviewed = with_review(
            _validated, lambda w: run_review_stage(w, _reviewer(f"{background.url}/v1"), log, 2), runtime, log
        )
        first = reviewed(lenient, 1)
        assert first.back_to == Stage.VERIFIERS and "review review-4" in first.error
        assert not any(f"review review-{n}" in first.error for n in (1, 2, 3))
        dispute = {"finding": "review-4", "reason": "changing other rows is allowed in this world"}
        disputed = lenient.model_copy(
            update={"verifiers": VerifierCode.model_validate({**verifiers, "disputed": [dispute]})}
        )
        second = reviewed(disputed, 2)
    (check,) = [c for c in first.checks if c.kind == "review"]
    details = {d["finding"]: d for d in check.details}
    assert [details[f"review-{n}"]["outcome"] for n in (1, 2, 3, 4)] == ["not_confirmed"] * 3 + ["confirmed"]
    assert "judged incomplete by the verifier" in details["review-1"]["detail"]
    assert "the reference solution's own end state" in details["review-2"]["detail"]
    assert (
        "could not be built: call 1" in details["review-3"]["detail"] and "tool_error" in details["review-3"]["detail"]
    )
    assert second.back_to is None
    (check,) = [c for c in second.checks if c.kind == "review"]
    assert check.passed and check.summary["outcomes"] == {"not_confirmed": 3, "disputed": 1}
    assert "disagreed: changing other rows is allowed" in {d["finding"]: d for d in check.details}["review-4"]["detail"]
    assert _outcomes(log)[-1] == (
        2,
        "success",
        [
            ("review-1", "not_confirmed"),
            ("review-2", "not_confirmed"),
            ("review-3", "not_confirmed"),
            ("review-4", "disputed"),
        ],
    )
    assert FindingOutcome.DISPUTED.value == "disputed"


def test_a_strict_finding_is_confirmed_by_building_a_correct_state_its_verifier_rejects(runtime):
    work, verifiers = procedural_work(runtime)
    strict = work.model_copy(update={"verifiers": VerifierCode.model_validate(over_strict(verifiers))})
    count = next(s for s in verifiers["solutions"] if s["answer"])
    finding = ReviewFinding.model_validate(
        {
            "category": "verifier_too_strict",
            "target": count["task_id"],
            "problem": "it wants the bare number",
            "build": count["solution"],
            "answer": f"You have {count['answer']} of them.",
        }
    )
    checked = probe_finding(runtime, _validated(strict, 1).bundle, finding)
    assert checked.confirmed and checked.outcome == FindingOutcome.CONFIRMED and "judged incomplete" in checked.detail
    clean = probe_finding(
        runtime,
        _validated(work.model_copy(update={"verifiers": VerifierCode.model_validate(verifiers)}), 1).bundle,
        finding,
    )
    assert not clean.confirmed and "judged complete" in clean.detail


def test_the_real_model_worlds_verifier_that_accepts_an_extra_booking_is_confirmed(runtime):
    """Zocdoc (written by a strong model): the review found this verifier too lenient; nothing confirmed it."""
    bundle = zocdoc_bundle()
    task = bundle.task("book_in_network_dermatologist")
    booked = task.solution[-1]
    extra = {"tool": booked.tool, "arguments": {**booked.arguments, "slot_id": 9}}  # the same doctor's 14:00 slot
    finding = ReviewFinding.model_validate(
        {
            "category": "verifier_too_lenient",
            "target": task.id,
            "problem": "it accepts a second appointment booked beside the right one",
            "build": [*(s.model_dump() for s in task.solution), extra],
        }
    )
    checked = probe_finding(runtime, bundle, finding)
    assert checked.confirmed and checked.detail.startswith("a wrong end state judged complete by the verifier")
    assert '"slot_id": 9' in checked.detail
