"""Looks: what a stage lets the model ask about the world it builds before it answers (read-only SQL over
the seeded database, a call of a tool built so far, a run of a reference solution), and the protocol both
ways of asking share.

A stage offers looks with a `LookOffer` on its `Prompt`: a `Lookout` that answers them (the stage's,
stages/looking.py) and the bounds (`LookBudget`: looks per attempt, characters per answer). A backend that
can converse (llm/openai_backend.py) asks through a `LookSession`, which counts, bounds and records every
look; a backend that cannot (procedural) ignores the offer. Two ways of asking, both answered the same:

- the chat API's tool calls (`chat_tools`: one function per look kind);
- the text fallback, for endpoints without tool calling: a fenced block in the model's text,

      ```look
      {"look": "query_database", "sql": "SELECT id, name FROM walkers ORDER BY rate LIMIT 3"}
      ```

  (one JSON object per block, its `look` naming the kind, the rest its arguments), answered in the next
  user message (`text_answers`).

Every look is kept (`Look`: kind, arguments, answer, how it was asked, whether it was refused) in the
generation (`Generation.looks`), recorded with the attempt and replayed by `replay:DIR` as it was."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

from pydantic import BaseModel

from worldsmith.errors import WorldsmithError
from worldsmith.jsonvalue import JsonObject

#: The fence of a look in a model's text (the text fallback).
LOOK_FENCE = "look"
_BLOCK = re.compile(r"```look[ \t]*\n(.*?)```", re.DOTALL)
#: How the system message's paragraph on looking opens (after the stage's own text; see `instructions`).
LOOKS_OPENING = "Before answering you may look at the world you are building"
#: Refused looks after which a model that keeps looking instead of answering fails the attempt.
MAX_REFUSED_LOOKS = 3


class LookKind(StrEnum):
    """What a look asks: a read-only SQL query of the seeded database, a call of one tool on a throwaway copy
    of it, or a run of a reference solution (its calls, then the end state's diff) on another copy."""

    QUERY_DATABASE = "query_database"
    CALL_TOOL = "call_tool"
    RUN_SOLUTION = "run_solution"


#: What each look does, as the chat API's function descriptions and the text protocol state it.
DESCRIPTIONS: dict[LookKind, str] = {
    LookKind.QUERY_DATABASE: "Run one read-only SQL query (SELECT or WITH only) on the seeded database; "
    "answers its first rows as JSON.",
    LookKind.CALL_TOOL: "Call one of the world's tools on a throwaway copy of the seeded database (nothing it "
    "writes is kept); answers the tool's result.",
    LookKind.RUN_SOLUTION: "Run a reference solution (its tool calls in order) on a throwaway copy of the seeded "
    "database; answers each call's result and the end state's diff (rows inserted, updated, deleted).",
}

#: The JSON Schema of each look's arguments.
PARAMETERS: dict[LookKind, JsonObject] = {
    LookKind.QUERY_DATABASE: {
        "type": "object",
        "properties": {"sql": {"type": "string", "description": "one SELECT or WITH statement"}},
        "required": ["sql"],
    },
    LookKind.CALL_TOOL: {
        "type": "object",
        "properties": {"tool": {"type": "string"}, "arguments": {"type": "object"}},
        "required": ["tool"],
    },
    LookKind.RUN_SOLUTION: {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"tool": {"type": "string"}, "arguments": {"type": "object"}},
                    "required": ["tool"],
                },
            }
        },
        "required": ["steps"],
    },
}


class LookRefused(WorldsmithError):
    """A look the lookout will not answer (a write through the SQL look, an unknown tool...); its message goes
    back to the model as the look's answer."""


class Lookout(Protocol):
    """What answers a stage's looks: the kinds it offers and the answer to one (LookRefused: why not)."""

    @property
    def kinds(self) -> tuple[LookKind, ...]: ...

    def answer(self, kind: LookKind, arguments: JsonObject) -> str: ...


@dataclass(frozen=True)
class LookBudget:
    """The bounds of looking: looks per attempt, characters of one answer (the rest cut, and said so), rows
    of one query."""

    looks: int = 8
    chars: int = 4000
    rows: int = 30


@dataclass(frozen=True)
class LookOffer:
    """The looks a prompt offers: who answers them and within what bounds."""

    lookout: Lookout
    budget: LookBudget

    def key(self) -> JsonObject:
        """What of the offer shapes the model's answers (part of a recording's request key)."""
        return {"kinds": [str(k) for k in self.lookout.kinds], "looks": self.budget.looks, "chars": self.budget.chars}


class Look(BaseModel):
    """One look made: its kind (as the model named it), arguments, the answer it got, how it was asked
    (`tool_call` or `text`) and whether it was refused (its answer then says why)."""

    kind: str
    arguments: JsonObject
    answer: str
    via: Literal["tool_call", "text"]
    refused: bool = False


def bounded_answer(text: str, chars: int) -> str:
    """`text` whole when it fits `chars`, else its first `chars` characters and a line saying it was cut."""
    if len(text) <= chars:
        return text
    return text[:chars] + f"\n... [answer cut at {chars} of {len(text)} characters: ask for less]"


@dataclass
class LookSession:
    """The looks of one attempt: counted against the budget, answered by the lookout, bounded, recorded."""

    offer: LookOffer
    looks: list[Look] = field(default_factory=list)
    past_budget: int = 0  # looks asked for once the budget was spent

    @property
    def left(self) -> int:
        return max(0, self.offer.budget.looks - sum(1 for look in self.looks if not look.refused))

    def take(self, kind: str, arguments: JsonObject, via: Literal["tool_call", "text"]) -> str:
        """The answer to one look (a refusal saying why when the budget is spent, the kind is not offered or
        the lookout refuses it), recorded."""
        budget = self.offer.budget
        refused = True
        if not self.left:
            self.past_budget += 1
            answer = f"refused: no looks left (at most {budget.looks} an attempt); answer now with the JSON object"
        elif kind not in self.offer.lookout.kinds:
            offered = ", ".join(self.offer.lookout.kinds)
            answer = f"refused: no look {kind!r} here; the looks offered are: {offered}"
        else:
            try:
                answer, refused = (
                    bounded_answer(self.offer.lookout.answer(LookKind(kind), arguments), budget.chars),
                    False,
                )
            except LookRefused as exc:
                answer = f"refused: {exc}"
        self.looks.append(Look(kind=kind, arguments=arguments, answer=answer, via=via, refused=refused))
        return answer


def parse_arguments(text: str) -> JsonObject:
    """A tool call's arguments (JSON text) as an object; anything else as `{"unparsed": text}`."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {"unparsed": text}
    return value if isinstance(value, dict) else {"unparsed": text}


def chat_tools(offer: LookOffer) -> list[JsonObject]:
    """The chat API's `tools` of the offer: one function per look kind."""
    return [
        {"type": "function", "function": {"name": str(k), "description": DESCRIPTIONS[k], "parameters": PARAMETERS[k]}}
        for k in offer.lookout.kinds
    ]


def text_looks(text: str) -> list[tuple[str, JsonObject]]:
    """The looks a model's text asks for with ```look blocks (the text fallback), in order: each block's
    `look` and the rest of its object (a block that is no JSON object: kind "unparsed")."""
    asked: list[tuple[str, JsonObject]] = []
    for block in _BLOCK.findall(text):
        arguments = parse_arguments(block.strip())
        kind = arguments.pop("look", "unparsed") if "unparsed" not in arguments else "unparsed"
        asked.append((str(kind), arguments))
    return asked


def text_answers(answers: list[tuple[str, str]]) -> str:
    """The user message answering the looks of the text fallback: each look's kind and answer, in order."""
    parts = [f"Look {n} ({kind}) answered:\n{answer}" for n, (kind, answer) in enumerate(answers, start=1)]
    return "\n\n".join(parts) + "\n\nLook again, or answer with the JSON object."


def instructions(offer: LookOffer, tool_calls: bool) -> str:
    """What the system message says of looking: the looks offered, their bounds and how to ask (the chat API's
    tools, or the ```look blocks of the text fallback)."""
    budget = offer.budget
    lines = [
        "",
        "",
        f"{LOOKS_OPENING}: at most {budget.looks} looks, each answer "
        f"cut at {budget.chars} characters (a query: at most {budget.rows} rows). Use only ids you have seen in "
        "this request or in a look's answer. The looks:",
    ]
    lines += [f"- {k}: {DESCRIPTIONS[k]}" for k in offer.lookout.kinds]
    if tool_calls:
        lines.append("Ask by calling these functions; when you have seen enough, answer with the JSON object.")
    else:
        lines.append(
            "Ask with one fenced block per look, e.g.\n```look\n"
            + json.dumps({"look": "query_database", "sql": "SELECT * FROM some_table LIMIT 5"})
            + "\n```\n(the block's `look` names the look, the rest are its arguments: "
            + "; ".join(f"{k}: {', '.join(PARAMETERS[k]['properties'])}" for k in offer.lookout.kinds)  # type: ignore[arg-type]
            + "). Write only look blocks while looking; the answers come in the next message. When you have seen "
            "enough, answer with the JSON object alone."
        )
    return "\n".join(lines)
