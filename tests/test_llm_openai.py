"""The `openai` generator backend against a local OpenAI-compatible HTTP server."""

from __future__ import annotations

import pytest
from llm_server import Reply, ScriptedLLM, error_reply, json_reply, stalled_reply, text_reply, truncated_reply
from pydantic import BaseModel, Field

from worldsmith.llm.backend import Prompt
from worldsmith.llm.errors import OutputFault, TransientFault
from worldsmith.llm.jsonrepair import parse_json_object
from worldsmith.llm.openai_backend import OpenAIGenerator


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
        "timeout_s": 30.0,
        "retries": 3,
        "backoff_s": 0.05,
        "prices": {"test-model": {"input": 1.0, "output": 2.0}},
    }
    options.update(kwargs)
    return OpenAIGenerator(**options)


def test_structured_output_with_usage_and_cost(llm):
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


def test_slow_response_times_out_and_is_retried(llm):
    llm.script(stalled_reply(GOOD), json_reply(GOOD))  # the first answer comes only once the client gives up
    result = generator(llm, timeout_s=0.5).generate(PROMPT, TaskList)
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
