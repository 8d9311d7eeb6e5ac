"""The `openai` generator backend against a local OpenAI-compatible HTTP server."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field
from support.llm_server import (
    Reply,
    ScriptedLLM,
    empty_reply,
    error_reply,
    json_reply,
    refusal_reply,
    stalled_reply,
    text_reply,
    truncated_reply,
)
from support.patience import MOMENTS_S

from worldsmith.llm.backend import Prompt
from worldsmith.llm.errors import EndpointAuthFault, EndpointConfigFault, OutputFault, TransientFault
from worldsmith.llm.jsonrepair import parse_json_object, unterminated_json
from worldsmith.llm.openai_backend import OpenAIGenerator
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.repair import StageFailed, run_with_repair

pytestmark = pytest.mark.unit


class TaskList(BaseModel):
    tasks: list[str] = Field(min_length=2)
    domain: str


GOOD = {"tasks": ["refund order 7", "ship order 9"], "domain": "retail"}
PROMPT = Prompt(stage="tasks", system="You write tasks.", user="Write two tasks for a store.")


@pytest.fixture()
def llm():
    server = ScriptedLLM([json_reply(GOOD)])
    with server.serve() as background:
        server.url = f"{background.url}/v1"
        yield server


def generator(llm, **kwargs) -> OpenAIGenerator:
    options = {
        "model": "test-model",
        "base_url": llm.url,
        "api_key": "sk-test",
        "timeout_s": MOMENTS_S,
        "retries": 3,
        "backoff_s": 0.05,
        "prices": {"test-model": {"input": 1.0, "output": 2.0}},
    }
    options.update(kwargs)
    return OpenAIGenerator(**options)


def test_a_structured_answer_is_parsed_with_its_usage_priced(llm):
    result = generator(llm).generate(PROMPT, TaskList)
    assert result.spec == TaskList(**GOOD)
    assert result.usage.calls == 1 and result.usage.tokens_in > 0 and result.usage.tokens_out > 0
    expected = result.usage.tokens_in / 1e6 * 1.0 + result.usage.tokens_out / 1e6 * 2.0
    assert result.usage.cost_usd == pytest.approx(expected)
    request = llm.requests[-1]
    assert request["response_format"]["type"] == "json_schema"
    assert request["response_format"]["json_schema"]["schema"]["required"] == ["tasks", "domain"]
    assert request["messages"][0] == {"role": "system", "content": "You write tasks."}


def test_near_json_is_repaired(llm):
    llm.script(text_reply('Sure! Here it is:\n```json\n{"tasks": ["a", "b",], "domain": "x"}\n```\nAnything else?'))
    assert generator(llm).generate(PROMPT, TaskList).spec.tasks == ["a", "b"]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (text_reply("I cannot help with that."), "no JSON object found"),
        (text_reply('{"tasks": ["a", "b"], "domain": '), "truncated"),
        (truncated_reply('{"tasks": ["a", "b"'), "output truncated at max_tokens"),
        (
            json_reply({"tasks": ["only one"], "domain": 3}),
            "output does not match TaskList: tasks: List should have at least 2 items",
        ),
    ],
)
def test_bad_output_is_an_output_fault_with_the_text(llm, reply, message):
    llm.script(reply)
    with pytest.raises(OutputFault, match=message) as info:
        generator(llm).generate(PROMPT, TaskList)
    assert info.value.text  # fed back to the model by the repair loop
    assert info.value.usage.calls == 1


def test_429_honours_retry_after_then_succeeds(llm):
    llm.script(error_reply(429, retry_after=1), json_reply(GOOD))
    result = generator(llm).generate(PROMPT, TaskList)
    assert result.usage.calls == 2
    assert result.usage.retries and "HTTP 429" in result.usage.retries[0]
    assert llm.times[1] - llm.times[0] >= 0.95


def test_500s_are_retried_with_backoff_then_give_up(llm):
    llm.script(error_reply(500), error_reply(503), json_reply(GOOD))
    assert generator(llm).generate(PROMPT, TaskList).usage.calls == 3
    llm.script(error_reply(500))
    with pytest.raises(TransientFault, match="4 attempts failed; last: InternalServerError") as info:
        generator(llm, retries=3).generate(PROMPT, TaskList)
    assert len(info.value.usage.retries) == 3


def test_a_stalled_answer_is_retried_after_the_client_timeout(llm):
    llm.script(stalled_reply(GOOD), json_reply(GOOD))  # the first answer comes only once the client gives up
    result = generator(llm, timeout_s=0.5).generate(PROMPT, TaskList)  # the limit under test
    assert result.usage.calls == 2 and "APITimeoutError" in result.usage.retries[0] and result.spec == TaskList(**GOOD)


def test_endpoint_without_json_schema_falls_back_to_json_mode(llm):
    llm.script(Reply("refuse_schema", GOOD))
    gen = generator(llm)
    assert gen.generate(PROMPT, TaskList).spec.domain == "retail"
    assert [r["response_format"]["type"] for r in llm.requests] == ["json_schema", "json_object"]
    assert "JSON Schema" in llm.requests[-1]["messages"][0]["content"]
    gen.generate(PROMPT, TaskList)
    assert llm.requests[-1]["response_format"]["type"] == "json_object"  # remembered


def test_concurrency_limit(llm):
    import threading

    llm.script(json_reply(GOOD, delay_s=0.3, together=2))  # each answer waits until two requests are in flight
    gen = generator(llm, concurrency=2)
    threads = [threading.Thread(target=gen.generate, args=(PROMPT, TaskList)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(llm.requests) == 4 and llm.peak_in_flight == 2  # two waves of two


def test_parse_json_object_cases():
    assert parse_json_object('{"a": 1}') == {"a": 1}
    assert parse_json_object("{'a': True, 'b': None}") == {"a": True, "b": None}
    assert parse_json_object('prefix {"a": {"b": "}"}} suffix') == {"a": {"b": "}"}}
    with pytest.raises(ValueError, match="no JSON object found"):
        parse_json_object("[1, 2]")


def test_embeddings_for_scenario_dedup(llm):
    from worldsmith.models.bundle import Scenario
    from worldsmith.stages.scenario import novel

    gen = generator(llm)
    vectors = gen.embed(["an online shoe store", "an online shoe shop", "a hospital"], "embed-model")
    assert len(vectors) == 3 and len(vectors[0]) == 64
    seeds = [Scenario(name="Shoes", description="An online store selling shoes and boots to customers.")]
    close = Scenario(name="Boots", description="An online store selling boots and shoes to customers.")
    far = Scenario(name="Clinic", description="Patients book doctor appointments and refill prescriptions.")
    accepted, dropped = novel([close, far], seeds, embed=lambda texts: gen.embed(texts, "embed-model"))
    assert accepted == [far] and "near-duplicate of 'Shoes'" in dropped[0]
    assert llm.requests[-1]["model"] == "embed-model"


def run_stage(llm, log: AttemptLog, max_attempts: int = 1, **kwargs) -> TaskList:
    """One stage's repair loop on the `openai` backend against `llm`, its attempts recorded in `log`."""
    return run_with_repair(
        stage="tasks",
        env_id="env-1",
        generator=generator(llm, **kwargs),
        prompt=lambda feedback: Prompt("tasks", PROMPT.system, PROMPT.user + (f"\n\n{feedback}" if feedback else "")),
        spec=TaskList,
        check=lambda spec: spec,
        log=log,
        max_attempts=max_attempts,
    )


@pytest.mark.parametrize(
    ("reply", "error_class", "said"),
    [
        (empty_reply(), "empty_choices", "empty `choices`"),
        (refusal_reply("I can't help with making that store."), "refusal", "I can't help with making that store."),
        (
            text_reply('{"tasks": ["a", "b"], "dom', finish="content_filter"),
            "content_filter",
            '{"tasks": ["a", "b"], "dom',
        ),
        (truncated_reply('{"tasks": ["a", "b"'), "truncated", "max_tokens"),
        (text_reply('{"tasks": ["a", "b"], "domain": "ret', finish=None), "truncated", "unterminated JSON string"),
        # cut off after a complete inner object, which alone would give a misleading schema mismatch
        (text_reply('{"store": {"tasks": ["a"]}, "tasks": ["a", "b"'), "truncated", "unterminated JSON array"),
        (text_reply("Sorry, no JSON today."), "invalid_json", "no JSON object found"),
        (json_reply({"tasks": ["only one"], "domain": 3}), "schema_mismatch", "does not match TaskList"),
    ],
)
def test_each_bad_answer_is_a_recorded_attempt_of_its_class(llm, reply, error_class, said):
    llm.script(reply)
    log = AttemptLog("faults")
    with pytest.raises(StageFailed) as info:
        run_stage(llm, log)
    assert info.value.error_class == error_class and len(llm.requests) == 1
    [row] = log.attempts
    assert (row.stage, row.outcome, row.error_class) == ("tasks", "failure", error_class)
    assert said in row.error_text
    assert row.tokens_in > 0 and row.cost_usd > 0  # the endpoint reported usage: it is on record


def test_a_bad_answer_is_repaired_with_its_error_fed_back(llm):
    llm.script(refusal_reply("I won't write tasks."), json_reply(GOOD))
    log = AttemptLog("repair")
    assert run_stage(llm, log, max_attempts=3) == TaskList(**GOOD)
    assert [(a.outcome, a.error_class) for a in log.attempts] == [("failure", "refusal"), ("success", None)]
    assert "I won't write tasks." in llm.requests[1]["messages"][1]["content"]


@pytest.mark.parametrize(
    "reply",
    [
        error_reply(400, message="This model's maximum context length is 8192 tokens. However, you requested 9000."),
        error_reply(400, message="Input too large for this model.", code="context_length_exceeded"),
        error_reply(413, message="Request Entity Too Large"),
    ],
)
def test_context_length_fails_the_stage_at_once_without_retries(llm, reply):
    llm.script(reply, json_reply(GOOD))
    log = AttemptLog("context")
    with pytest.raises(StageFailed, match="do not fit the model's context") as info:
        run_stage(llm, log, max_attempts=5)
    assert info.value.error_class == "context_length" and info.value.attempts == 1
    assert len(llm.requests) == 1  # neither retried by the client nor repaired with a longer prompt
    assert [(a.outcome, a.error_class) for a in log.attempts] == [("failure", "context_length")]
    assert not isinstance(info.value.__cause__, TransientFault)  # so Prefect does not retry it either


def test_another_rejected_request_fails_the_stage_once(llm):
    llm.script(error_reply(422, message="messages: field required"), json_reply(GOOD))
    log = AttemptLog("rejected")
    with pytest.raises(StageFailed, match="messages: field required"):
        run_stage(llm, log, max_attempts=5)
    assert len(llm.requests) == 1 and [a.error_class for a in log.attempts] == ["bad_request"]


@pytest.mark.parametrize(
    ("status", "key", "fix"),
    [(401, "sk-wrong", "set WORLDSMITH_LLM_API_KEY to a valid key"), (403, None, "WORLDSMITH_LLM_API_KEY is not set")],
)
def test_auth_failure_is_fatal_after_one_request(llm, status, key, fix):
    llm.script(error_reply(status, message="Incorrect API key provided"), json_reply(GOOD))
    log = AttemptLog("auth")
    with pytest.raises(EndpointAuthFault) as info:
        run_stage(llm, log, max_attempts=5, api_key=key)
    assert info.value.fatal and not isinstance(info.value, TransientFault)
    assert fix in str(info.value) and f"HTTP {status}" in str(info.value)
    assert len(llm.requests) == 1
    assert [(a.outcome, a.error_class) for a in log.attempts] == [("failure", "auth")]


def test_unknown_model_is_fatal_naming_the_settings(llm):
    llm.script(error_reply(404, message="The model `nope` does not exist"))
    with pytest.raises(EndpointConfigFault, match="WORLDSMITH_LLM_MODEL") as info:
        run_stage(llm, AttemptLog("missing"), max_attempts=5)
    assert info.value.fatal and info.value.kind == "not_found" and len(llm.requests) == 1


def test_unterminated_json():
    assert unterminated_json('{"a": [1, {"b": "}') == "string"
    assert unterminated_json('{"a": [1, {"b": "}"') == "object"
    assert unterminated_json('{"a": [1, {"b": "}"}') == "array"
    assert unterminated_json('{"a": {"b": 1}') == "object"
    assert unterminated_json('Sure: {"a": "x\\"y"} and { more') is None  # the first value closed
    assert unterminated_json("no JSON here") is None
