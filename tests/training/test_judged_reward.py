"""The judged reward of GRPO (TrainingConfig.reward): a scripted judge on the local OpenAI-compatible
server rules on real rollouts of the tiny model's trainer; rulings become rewards, answers are cached
by what the judge reads, a judge that fails leaves its rollout out of the loss, and each step logs
the judge's requests, cost and latency."""

from __future__ import annotations

import pytest
from support.llm_server import ScriptedLLM, error_reply, json_reply, text_reply
from test_training import make_trainer, one_task  # noqa: F401 - the module fixture, reused

from worldsmith.agent.loop import run_episode
from worldsmith.agent.policies import ReferencePolicy
from worldsmith.cli.config_options import options_for
from worldsmith.models.verdict import Verdict
from worldsmith.settings import get_settings
from worldsmith.training.config import JudgeConfig, TrainingConfig
from worldsmith.training.judged_reward import JudgeUnavailable, RewardJudge, judge_endpoint

pytestmark = pytest.mark.e2e


@pytest.fixture()
def judge_server(monkeypatch):
    monkeypatch.setenv("WORLDSMITH_LLM_PRICES", '{"judge": {"input": 2.0, "output": 8.0}}')
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-judge")
    get_settings.cache_clear()
    server = ScriptedLLM([json_reply({"verdict": "partial", "reason": "half done"})])
    with server.serve() as running:
        server.url = f"{running.url}/v1"
        yield server
    get_settings.cache_clear()


def test_a_judged_step_rewards_the_rulings_leaving_failed_judgements_out(
    tiny_model,
    one_task,  # noqa: F811
    runtime,
    tmp_path,
    judge_server,
):
    """The solved rollout's judge answers garbage twice (retries 1): env_error, no row; the wrong answer
    is ruled partial (0.1), its reward; the step logs what the judge did."""
    judge_server.script(text_reply("no idea"), text_reply("still no idea"), json_reply({"verdict": "partial"}))
    judge = {"model": "judge", "base_url": judge_server.url, "api_key_variable": "JUDGE_TEST_KEY"}
    trainer = make_trainer(
        tiny_model,
        one_task,
        runtime,
        tmp_path,
        reward="verifier+judge",
        judge={**judge, "retries": 1, "concurrency": 1},
    )
    trainer.train()
    rollouts = trainer.last_rollouts
    assert [t.verdict for t in rollouts] == ["env_error", "partial", "env_error", "format_error"]
    assert sorted({r.rollout for r in trainer.last_rows}) == [1, 3]  # the failed judgement is out of the loss
    assert "the judge failed" in rollouts[0].error and rollouts[0].judge["verifier_verdict"] == "complete"
    assert rollouts[1].reward == pytest.approx(0.1) and rollouts[1].judge["verifier_verdict"] == "incomplete"
    prompt = judge_server.requests[0]["messages"][1]["content"]
    assert "Verifier verdict: complete" in prompt and "Verifier evidence:" in prompt  # the code-augmented judge
    (log,) = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert (log["judge_requests"], log["judge_cache_hits"], log["judge_error_rate"]) == (3.0, 0.0, 0.25)
    assert log["env_error_rate"] == 0.5 and log["judge_agreement"] == 0.0  # partial where the verifier said incomplete
    assert log["judge_cost_usd"] > 0 and log["judge_latency_s"] > 0 and log["judge_seconds"] > 0


def _judge_alone(judge_server) -> TrainingConfig:
    """A training config whose reward is the judge's alone, at `judge_server`."""
    return TrainingConfig(
        model="m", set_name="s", reward="judge", judge={"model": "judge", "base_url": judge_server.url}
    )


@pytest.mark.sandbox
def test_the_judge_alone_reads_no_verifier_answering_repeats_from_its_cache(runtime, golden, judge_server):
    task = golden.task("t01_points_balance")
    solved = run_episode(runtime, golden, task, ReferencePolicy())
    judge = RewardJudge.for_training(_judge_alone(judge_server))
    metrics = judge.judge_rollouts([task, task], [solved, solved.model_copy(deep=True)])
    assert metrics["judge_requests"] == 1 and metrics["judge_cache_hits"] == 1
    prompt = judge_server.requests[-1]["messages"][1]["content"]
    assert task.instruction in prompt and "Verifier" not in prompt
    assert judge_server.requests[-1]["model"] == "judge"
    later = judge.judge_rollouts([task], [solved.model_copy(deep=True)])  # a later step: the cache answers
    assert later["judge_requests"] == 0 and later["judge_cache_hits"] == 1


@pytest.mark.sandbox
def test_the_judges_endpoint_failures_are_env_errors(runtime, golden, judge_server):
    task, config = golden.task("t01_points_balance"), _judge_alone(judge_server)
    down = RewardJudge.for_training(config.model_copy(update={"judge": JudgeConfig(base_url="http://127.0.0.1:9/v1")}))
    again = run_episode(runtime, golden, task, ReferencePolicy())
    assert down.judge_rollouts([task], [again])["judge_error_rate"] == 1.0
    assert again.verdict == "env_error" and again.reward is None and "the judge failed" in again.error
    assert down.cache == {}  # a failed judgement is asked again next time

    judge_server.script(error_reply(401, message="bad key"))
    with pytest.raises(JudgeUnavailable, match="HTTP 401"):  # a fresh judge: nothing cached
        RewardJudge.for_training(config).judge_rollouts([task], [run_episode(runtime, golden, task, ReferencePolicy())])


@pytest.mark.unit
def test_the_judge_key_is_read_from_the_variable_the_config_names_never_stored(judge_server, monkeypatch):
    config = JudgeConfig(model="judge", base_url=judge_server.url, api_key_variable="JUDGE_TEST_KEY")
    assert judge_endpoint(config).api_key == "sk-judge"
    assert "sk-judge" not in TrainingConfig(model="m", set_name="s", judge=config).model_dump_json()
    monkeypatch.delenv("JUDGE_TEST_KEY")
    with pytest.raises(ValueError, match="JUDGE_TEST_KEY"):
        judge_endpoint(config)
    flags = {o.flag for o in options_for(TrainingConfig)}
    assert {"--reward", "--judge-model", "--judge-base-url", "--judge-votes"} <= flags
    with pytest.raises(ValueError):
        TrainingConfig(model="m", set_name="s", reward="llm")


@pytest.mark.sandbox
def test_the_judges_env_error_counts_as_agent_error_and_env_error_rollouts_are_not_judged(
    runtime, golden, judge_server
):
    """A judge that blames the application on a rollout rules agent_error (rewarded, in the loss),
    never a way out of it: a rollout the world failed ended there as an env_error (agent/loop.py)
    and reaches no judge."""
    task = golden.task("t01_points_balance")
    blamed = run_episode(runtime, golden, task, ReferencePolicy())
    failing = blamed.model_copy(deep=True, update={"verdict": Verdict.env_error, "reward": None})
    failing.steps[-1].status = "env_error"  # what the loop leaves when the world fails a call
    judge = RewardJudge.for_training(_judge_alone(judge_server))
    judge_server.script(json_reply({"verdict": "env_error", "reason": "the application is broken"}))
    metrics = judge.judge_rollouts([task, task], [blamed, failing])
    assert blamed.verdict == "agent_error" and blamed.reward == 0.0
    assert "holds none: counted as agent_error" in blamed.judge["votes"][0]["reason"]
    assert failing.verdict == "env_error" and failing.reward is None and not failing.judge
    assert metrics["judge_requests"] == 1 and metrics["judge_error_rate"] == 0.0
