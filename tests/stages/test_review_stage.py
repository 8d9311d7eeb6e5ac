"""The optional review stage: the model lists suspected bugs, each finding is probed on the world, and a
confirmed one goes back to its owning step; off for the procedural backend; its cost on record."""

from __future__ import annotations

import pytest
from support.llm_server import ProceduralLLM, ScriptedLLM, json_reply
from support.patience import MOMENTS_S
from support.procedural import over_strict, procedural_work

from worldsmith.llm.openai_backend import OpenAIGenerator
from worldsmith.llm.procedural.backend import ProceduralGenerator
from worldsmith.models.bundle import Scenario
from worldsmith.models.specs import VerifierCode
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.order import Stage
from worldsmith.stages.pipeline import build_environment
from worldsmith.stages.review import run_review_stage, with_review
from worldsmith.stages.validate import run_validate_stage
from worldsmith.tasks.parameters import GenerateParameters

pytestmark = pytest.mark.sandbox

AMAZON = Scenario(
    name="Amazon",
    description="Amazon is the world's largest e-commerce platform: users browse products, order, pay and return them.",
)


def _generator(url: str) -> OpenAIGenerator:
    return OpenAIGenerator(
        model="m", base_url=url, timeout_s=MOMENTS_S, retries=1, prices={"m": {"input": 1.0, "output": 2.0}}
    )


def test_review_is_off_by_default_even_asked_for_the_procedural_backend(runtime):
    assert GenerateParameters().review is False and GenerateParameters(review=True).review is True
    log = AttemptLog("procedural")
    result = build_environment(AMAZON, 2, ProceduralGenerator(seed=2), runtime, log, review=True)
    assert result.good and not [a for a in log.attempts if a.stage == Stage.REVIEW]
    assert not [c for c in result.checks if c.kind == "review"]


def test_a_reviewed_world_records_the_reviews_cost(runtime):
    """Through an endpoint (here answering as a capable model would: no bug in a composed world)."""
    server = ProceduralLLM(seed=2)
    with server.serve() as background:
        log = AttemptLog("reviewed")
        result = build_environment(AMAZON, 2, _generator(f"{background.url}/v1"), runtime, log, review=True)
    assert result.good, result.reason
    reviews = [a for a in log.attempts if a.stage == Stage.REVIEW]
    assert [a.outcome for a in reviews] == ["success"] and reviews[0].tokens_in > 0 and reviews[0].cost_usd > 0
    assert ("review", "ok") in server.served
    (check,) = [c for c in result.checks if c.kind == "review"]
    assert check.passed and check.summary["findings"] == 0


def test_review_findings_become_probes_whose_confirmed_ones_are_repaired(runtime):
    work, verifiers = procedural_work(runtime)
    strict = work.model_copy(update={"verifiers": VerifierCode.model_validate(over_strict(verifiers))})
    count = next(s for s in verifiers["solutions"] if s["answer"])
    lookup = count["solution"][0]
    other = next(s for s in verifiers["solutions"] if s["task_id"] != count["task_id"])
    findings = [
        {"category": "tool_crash", "target": lookup["tool"], "problem": "crashes on names", "call": lookup},
        {"category": "clock_or_randomness", "target": lookup["tool"], "problem": "reads the clock", "call": lookup},
        {"category": "missing_tool", "target": other["task_id"], "problem": "no tool does this"},
        {
            "category": "verifier_too_strict",
            "target": count["task_id"],
            "problem": "compares the answer's text exactly",
            "answer": f"There are {count['answer']} of them.",
        },
    ]
    unknown = [{"category": "tool_crash", "target": "no_such_tool", "problem": "crashes", "call": lookup}]
    server = ScriptedLLM([json_reply({"findings": unknown}), json_reply({"findings": findings})])
    with server.serve() as background:
        generator, log = _generator(f"{background.url}/v1"), AttemptLog("review")
        reviewed = with_review(
            lambda w, n: run_validate_stage(w, generator, runtime, log, n),
            lambda w: run_review_stage(w, generator, log, 3),
            runtime,
        )
        validation = reviewed(strict, 1)
        assert [(a.outcome, a.error_class) for a in log.attempts if a.stage == Stage.REVIEW] == [
            ("failure", "finding_unchecked"),
            ("success", None),
        ]
        assert validation.back_to == Stage.VERIFIERS and validation.step is None
        assert f"verifier_too_strict {count['task_id']}" in validation.error and "incomplete" in validation.error
        (check,) = [c for c in validation.checks if c.kind == "review"]
        outcome = {d["probe"]: d["confirmed"] for d in check.details}
        assert outcome == {
            "review tool_crash": False,
            "review clock_or_randomness": False,
            "review missing_tool": False,
            "review verifier_too_strict": True,
        }
        assert not check.passed and check.summary == {
            "findings": 4,
            "confirmed": 1,
            "outcomes": {"not_confirmed": 3, "confirmed": 1},
            "categories": {"tool_crash": 1, "clock_or_randomness": 1, "missing_tool": 1, "verifier_too_strict": 1},
        }
        asked = len(server.requests)
        repaired = reviewed(work.model_copy(update={"verifiers": VerifierCode.model_validate(verifiers)}), 2)
    assert repaired.back_to is None and len(server.requests) == asked  # the findings probed again, no new question
    assert [c.passed for c in repaired.checks if c.kind == "review"] == [True]


@pytest.mark.parametrize("category", ["tool_crash", "verifier_too_strict"])
def test_a_finding_without_what_its_probe_needs_is_sent_back(runtime, category):
    from worldsmith.models.specs import Review
    from worldsmith.stages.repair import CheckFailed
    from worldsmith.stages.review import check_review

    work, _ = procedural_work(runtime)
    target = work.tool_plan.tools[0].name if category == "tool_crash" else work.tasks.tasks[0].id
    review = Review.model_validate({"findings": [{"category": category, "target": target, "problem": "broken"}]})
    with pytest.raises(CheckFailed, match="give `call`|give `answer`"):
        check_review(work, review)


def test_a_review_the_model_never_gets_right_fails_no_world(runtime):
    work, verifiers = procedural_work(runtime)
    work = work.model_copy(update={"verifiers": VerifierCode.model_validate(verifiers)})
    lookup = verifiers["solutions"][0]["solution"][0]
    unknown = {"category": "tool_crash", "target": "no_such_tool", "problem": "crashes", "call": lookup}
    server = ScriptedLLM([json_reply({"findings": [unknown]})])
    with server.serve() as background:
        generator, log = _generator(f"{background.url}/v1"), AttemptLog("unanswered")
        reviewed = with_review(
            lambda w, n: run_validate_stage(w, generator, runtime, log, n),
            lambda w: run_review_stage(w, generator, log, 2),
            runtime,
        )
        validation = reviewed(work, 1)
    assert validation.back_to is None and validation.bundle is not None
    assert [a.outcome for a in log.attempts if a.stage == Stage.REVIEW] == ["failure", "failure"]
    (check,) = [c for c in validation.checks if c.kind == "review"]
    assert check.passed and "stage review failed after 2 attempts" in check.summary["unanswered"]


@pytest.mark.flow
def test_the_generate_flow_reviews_its_worlds_when_asked(prefect_api, home, monkeypatch):
    from sqlmodel import select

    from worldsmith.flows.generate import run_generate
    from worldsmith.models.catalog import StageAttempt
    from worldsmith.settings import get_settings
    from worldsmith.storage.catalog import open_catalog

    server = ProceduralLLM(seed=4)
    with server.serve() as background:
        monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", f"{background.url}/v1")
        monkeypatch.setenv("WORLDSMITH_LLM_MODEL", "m")
        get_settings.cache_clear()
        try:
            results = run_generate(GenerateParameters(count=1, seed=4, backend="openai", review=True))
        finally:  # the endpoint's settings stay with this test
            monkeypatch.delenv("WORLDSMITH_LLM_BASE_URL")
            monkeypatch.delenv("WORLDSMITH_LLM_MODEL")
            get_settings.cache_clear()
    assert [r.status for r in results] == ["good"]
    with open_catalog().session() as session:
        stages = [a.stage for a in session.exec(select(StageAttempt)).all()]
    assert stages.count("review") == 1 and ("review", "ok") in server.served
