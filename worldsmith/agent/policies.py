"""Policies that need no model: the task's reference solution replayed, and a random policy that
picks tools and arguments from the schemas and the seed data."""

from __future__ import annotations

import json
import random
from typing import Protocol

from worldsmith.agent.messages import Message, PolicyTurn, ToolCall
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import ToolResult
from worldsmith.quality.probes import SeedValues, sample_arguments
from worldsmith.toolschema import ToolSchemaJson


class Policy(Protocol):
    """Acts on the visible conversation: returns the next assistant message (tool calls or a final answer)."""

    name: str

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None: ...

    def act(self, view: list[Message], tools: list[ToolSchemaJson]) -> PolicyTurn: ...


class ScriptPolicy:
    """Plays fixed tool calls, one per turn, then answers `answer`; with `answer=None` it reports
    the last tool result it saw (what an agent that trusts its last lookup would say)."""

    def __init__(self, name: str, calls: list[tuple[str, JsonObject]], answer: str | None = "Done."):
        self.name, self.calls, self.answer = name, list(calls), answer

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.turn = 0

    def act(self, view: list[Message], tools: list[ToolSchemaJson]) -> PolicyTurn:
        if self.turn < len(self.calls):
            name, arguments = self.calls[self.turn]
            self.turn += 1
            return PolicyTurn(
                message=Message(
                    role="assistant", tool_calls=[ToolCall(id=f"call_{self.turn}", name=name, arguments=arguments)]
                )
            )
        answer = (
            self.answer
            if self.answer is not None
            else next((m.content for m in reversed(view) if m.role == "tool"), "")
        )
        return PolicyTurn(message=Message(role="assistant", content=answer))


class ReferencePolicy(ScriptPolicy):
    """Replays the task's reference solution, one tool call per turn, then gives its answer."""

    def __init__(self) -> None:
        super().__init__("reference", [])

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.calls = [(step.tool, step.arguments) for step in task.solution]
        self.answer = task.answer or "Done."
        self.turn = 0


class RandomPolicy:
    """Calls `calls` random tools with arguments drawn from the schemas and seed data, then gives up."""

    name = "random"

    def __init__(self, calls: int = 3):
        self.calls = calls

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.bundle = bundle
        self.rng = random.Random(f"{bundle.key}:{task.id}:{seed}")
        self.seeds = SeedValues(bundle.world, rng=self.rng)
        self.turn = 0

    def act(self, view: list[Message], tools: list[ToolSchemaJson]) -> PolicyTurn:
        if self.turn >= self.calls:
            return PolicyTurn(message=Message(role="assistant", content="I could not finish the task."))
        self.turn += 1
        name = self.rng.choice(tools)["name"]
        arguments = sample_arguments(self.bundle.tool(name).model_dump(), self.seeds)  # it reads a dumped ToolSchema
        call = ToolCall(id=f"call_{self.turn}", name=name, arguments=arguments)
        return PolicyTurn(message=Message(role="assistant", tool_calls=[call]))


def tool_message(call: ToolCall, status: str, value: JsonValue, error: str | None) -> Message:
    """What the agent sees of a tool call's result."""
    content = json.dumps(value) if status == "ok" else f"error: {error}"
    return Message(role="tool", content=content, tool_call_id=call.id)


META_TOOLS: list[ToolSchemaJson] = [
    {
        "name": "list_tools",
        "description": "List the application's tools with their JSON Schemas.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
    {
        "name": "call_tool",
        "description": "Call one of the application's tools by name.",
        "parameters": {
            "type": "object",
            "properties": {"tool_name": {"type": "string"}, "arguments": {"type": "object"}},
            "required": ["tool_name"],
            "additionalProperties": False,
        },
    },
]


def meta_result(call: ToolCall, tools: list[ToolSchemaJson]) -> ToolResult | None:
    """The answer to the `list_tools` meta-tool (policies in meta mode), or None for a real tool call."""
    if call.name == "list_tools" and all(t["name"] != "list_tools" for t in tools):
        return ToolResult(status="ok", value=tools)
    return None
