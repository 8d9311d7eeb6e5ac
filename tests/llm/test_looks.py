"""Looks through the `openai` backend against a local OpenAI-compatible server: a model that looks with tool
calls, one that looks with the text fallback (an endpoint without tool calling), the bounds (looks per
attempt, characters per answer), and a recorded conversation replayed with its looks and answers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel
from support.llm_server import (
    ScriptedLLM,
    json_reply,
    refuse_tools_reply,
    text_reply,
    tool_calls_reply,
)
from support.patience import MOMENTS_S

from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.backend import Prompt
from worldsmith.llm.errors import OutputFault
from worldsmith.llm.looks import LookBudget, LookKind, LookOffer, LookRefused
from worldsmith.llm.openai_backend import OpenAIGenerator
from worldsmith.llm.recording import RecordingGenerator, ReplayGenerator

pytestmark = pytest.mark.unit


class Pick(BaseModel):
    walker_id: int


@dataclass
class Kennel:
    """A lookout over one table of walkers (id, name, rate): answers SELECTs by a fixed rule, refuses writes."""

    asked: list[tuple[LookKind, JsonObject]] = field(default_factory=list)
    padding: int = 0  # characters added to each answer (to exceed the bound)

    @property
    def kinds(self) -> tuple[LookKind, ...]:
        return (LookKind.QUERY_DATABASE,)

    def answer(self, kind: LookKind, arguments: JsonObject) -> str:
        self.asked.append((kind, arguments))
        sql = str(arguments.get("sql", ""))
        if not sql.lstrip().upper().startswith("SELECT"):
            raise LookRefused("only SELECT or WITH: the database is read-only here")
        return '1 rows:\n{"id": 41, "name": "Mira", "rate": 1500}' + "x" * self.padding


def generator(url: str) -> OpenAIGenerator:
    return OpenAIGenerator(model="m", base_url=f"{url}/v1", timeout_s=MOMENTS_S, retries=0)


def prompt(lookout: Kennel, budget: LookBudget | None = None) -> Prompt:
    offer = LookOffer(lookout, budget or LookBudget(looks=3, chars=400, rows=5))
    return Prompt("verifiers", "Pick the cheapest walker.", "Who is the cheapest walker?", looks=offer)


CHEAPEST = "SELECT id, name FROM walkers ORDER BY rate LIMIT 1"


def test_a_model_looks_with_tool_calls_and_answers_with_an_id_it_saw():
    kennel = Kennel()
    server = ScriptedLLM([tool_calls_reply(("query_database", {"sql": CHEAPEST})), json_reply({"walker_id": 41})])
    with server.serve() as background:
        made = generator(background.url).generate(prompt(kennel), Pick)
    assert made.spec.walker_id == 41 and made.usage.calls == 2
    [look] = made.looks
    assert (look.kind, look.arguments, look.via, look.refused) == (
        "query_database",
        {"sql": CHEAPEST},
        "tool_call",
        False,
    )
    first, second = server.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["query_database"]
    assert "at most 3 looks" in first["messages"][0]["content"]
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and '"id": 41' in tool_message["content"]
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "query_database"


def test_an_endpoint_without_tool_calling_gets_the_text_fallback():
    kennel = Kennel()
    block = "```look\n" + json.dumps({"look": "query_database", "sql": CHEAPEST}) + "\n```"
    server = ScriptedLLM([refuse_tools_reply({"walker_id": 0}), text_reply(block), text_reply('{"walker_id": 41}')])
    with server.serve() as background:
        made = generator(background.url).generate(prompt(kennel), Pick)
    assert made.spec.walker_id == 41
    [look] = made.looks
    assert (look.via, look.arguments) == ("text", {"sql": CHEAPEST})
    refused, looking, answering = server.requests
    assert refused.get("tools") and not looking.get("tools") and "response_format" not in looking
    assert "```look" in looking["messages"][0]["content"]  # the protocol is stated
    assert answering["messages"][-2] == {"role": "assistant", "content": block}
    assert "Look 1 (query_database) answered" in answering["messages"][-1]["content"]
    assert '"id": 41' in answering["messages"][-1]["content"]


def test_looks_past_the_budget_are_refused_and_a_model_that_keeps_looking_fails():
    kennel = Kennel()
    server = ScriptedLLM([tool_calls_reply(("query_database", {"sql": CHEAPEST}))])  # looks forever
    with server.serve() as background, pytest.raises(OutputFault) as failed:
        generator(background.url).generate(prompt(kennel, LookBudget(looks=2, chars=400, rows=5)), Pick)
    assert failed.value.kind == "too_many_looks"
    looks = failed.value.looks  # type: ignore[attr-defined]
    assert [look.refused for look in looks] == [False, False, True, True, True]
    assert looks[-1].answer.startswith("refused: no looks left (at most 2 an attempt)")
    assert len(kennel.asked) == 2  # the lookout answered only the looks within the budget
    assert "tool_choice" not in server.requests[1] and server.requests[2]["tool_choice"] == "none"  # once spent


def test_a_write_through_the_sql_look_is_refused_and_a_big_answer_cut():
    kennel = Kennel(padding=5000)
    server = ScriptedLLM(
        [
            tool_calls_reply(("query_database", {"sql": "DELETE FROM walkers"}), ("query_database", {"sql": CHEAPEST})),
            json_reply({"walker_id": 41}),
        ]
    )
    with server.serve() as background:
        made = generator(background.url).generate(prompt(kennel), Pick)
    write, read = made.looks
    assert write.refused and write.answer == "refused: only SELECT or WITH: the database is read-only here"
    assert not read.refused and len(read.answer) < 500
    assert read.answer.endswith("[answer cut at 400 of 5048 characters: ask for less]")
    answers = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert answers == [write.answer, read.answer]  # what the model was told


def test_a_recorded_conversation_replays_with_the_same_looks_and_answers(tmp_path):
    kennel = Kennel()
    server = ScriptedLLM([tool_calls_reply(("query_database", {"sql": CHEAPEST})), json_reply({"walker_id": 41})])
    with server.serve() as background:
        recorded = RecordingGenerator(generator(background.url), tmp_path).generate(prompt(kennel), Pick)
    replayed = ReplayGenerator(tmp_path).generate(prompt(Kennel()), Pick)
    assert replayed.spec == recorded.spec and replayed.raw == recorded.raw
    assert replayed.looks == recorded.looks and len(recorded.looks) == 1
    bigger = prompt(Kennel(), LookBudget(looks=9, chars=400, rows=5))  # another offer: another request
    with pytest.raises(Exception, match="replay miss"):
        ReplayGenerator(tmp_path).generate(bigger, Pick)
