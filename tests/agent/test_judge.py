"""The LLM judge against a local OpenAI-compatible server: rulings, k-vote majority, bad votes."""

from __future__ import annotations

import pytest
from support.llm_server import ScriptedLLM, json_reply, text_reply

from worldsmith.agent.judge import LLMJudge, majority
from worldsmith.agent.loop import run_episode
from worldsmith.agent.policies import ReferencePolicy, ScriptPolicy

pytestmark = pytest.mark.sandbox


@pytest.fixture()
def llm():
    server = ScriptedLLM([json_reply({"verdict": "complete", "reason": "ok"})])
    with server.serve() as running:
        server.url = f"{running.url}/v1"
        yield server


def test_the_judge_rules_on_the_whole_episode(runtime, golden, llm):
    task = golden.task("t04_return_headphones")
    llm.script(json_reply({"verdict": "agent_error", "reason": "the return was for the wrong item"}))
    trajectory = run_episode(runtime, golden, task, ReferencePolicy(), judge=LLMJudge("judge", base_url=llm.url))
    assert trajectory.verdict == "agent_error" and trajectory.reward == 0.0
    assert trajectory.judge["verifier_verdict"] == "complete" and trajectory.judge["votes"][0]["reason"].startswith(
        "the return"
    )
    prompt = llm.requests[-1]["messages"][1]["content"]
    assert task.instruction in prompt and "request_return(" in prompt and "Verifier verdict: complete" in prompt


def test_the_majority_of_k_judges_rules(runtime, golden, llm):
    llm.script(
        json_reply({"verdict": "partial"}), json_reply({"verdict": "complete"}), json_reply({"verdict": "partial"})
    )
    judge = LLMJudge("judge", base_url=llm.url, votes=3)
    trajectory = run_episode(runtime, golden, golden.task("t03_cancel_and_readdress"), ReferencePolicy(), judge=judge)
    assert trajectory.verdict == "partial" and trajectory.reward == 0.1 and len(trajectory.judge["votes"]) == 3
    assert llm.requests[-1]["temperature"] == 0.7


def test_env_error_ruling_excludes_the_episode(runtime, golden, llm):
    llm.script(json_reply({"verdict": "env_error", "reason": "the tool returned nonsense"}))
    trajectory = run_episode(
        runtime,
        golden,
        golden.task("t01_points_balance"),
        ScriptPolicy("x", [], "1250"),
        judge=LLMJudge("j", base_url=llm.url),
    )
    assert trajectory.verdict == "env_error" and trajectory.reward is None


def test_unparseable_votes_leave_the_verifier_verdict(runtime, golden, llm):
    llm.script(text_reply("I think it is fine"), json_reply({"verdict": "perfect"}))
    trajectory = run_episode(
        runtime,
        golden,
        golden.task("t01_points_balance"),
        ReferencePolicy(),
        judge=LLMJudge("j", base_url=llm.url, votes=2),
    )
    assert trajectory.verdict == "complete" and "no valid vote" in trajectory.judge["error"]
    assert [v["ruling"] for v in trajectory.judge["votes"]] == [None, None]


@pytest.mark.unit
def test_ties_follow_the_verifier_then_the_stricter_ruling():
    assert majority(["complete", "partial"], "partial") == "partial"
    assert majority(["complete", "agent_error"], "incomplete") == "agent_error"
    assert majority(["complete", "partial"], "incomplete") == "partial"
    assert majority(["env_error", "complete"], "partial") == "complete"
    assert majority(["env_error", "env_error", "complete"], "complete") == "env_error"
