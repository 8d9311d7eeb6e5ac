"""Policies that need no model: the task's reference solution replayed, and a random policy that
picks tools and arguments from the schemas and the seed data."""

from __future__ import annotations

import json
import random
from typing import Any, Protocol

from worldsmith.agent.messages import Message, PolicyTurn, ToolCall
from worldsmith.bundle.loader import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.quality.probes import SeedValues, sample_arguments


class Policy(Protocol):
    """Acts on the visible conversation: returns the next assistant message (tool calls or a final answer)."""

    name: str

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None: ...

    def act(self, view: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn: ...


class ReferencePolicy:
    """Replays the task's reference solution, one tool call per turn, then answers."""

    name = "reference"

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.steps = list(task.solution)
        self.answer = task.answer or "Done."
        self.turn = 0

    def act(self, view: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        if self.turn < len(self.steps):
            step = self.steps[self.turn]
            self.turn += 1
            call = ToolCall(id=f"call_{self.turn}", name=step.tool, arguments=step.arguments)
            return PolicyTurn(message=Message(role="assistant", tool_calls=[call]))
        return PolicyTurn(message=Message(role="assistant", content=self.answer))


class RandomPolicy:
    """Calls `calls` random tools with arguments drawn from the schemas and seed data, then gives up."""

    name = "random"

    def __init__(self, calls: int = 3):
        self.calls = calls

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.rng = random.Random(f"{bundle.key}:{task.id}:{seed}")
        self.seeds = SeedValues(bundle.world, rng=self.rng)
        self.turn = 0

    def act(self, view: list[Message], tools: list[dict[str, Any]]) -> PolicyTurn:
        if self.turn >= self.calls:
            return PolicyTurn(message=Message(role="assistant", content="I could not finish the task."))
        self.turn += 1
        tool = self.rng.choice(tools)
        call = ToolCall(id=f"call_{self.turn}", name=tool["name"], arguments=sample_arguments(tool, self.seeds))
        return PolicyTurn(message=Message(role="assistant", tool_calls=[call]))


def tool_message(call: ToolCall, status: str, value: Any, error: str | None) -> Message:
    """What the agent sees of a tool call's result."""
    content = json.dumps(value) if status == "ok" else f"error: {error}"
    return Message(role="tool", content=content, tool_call_id=call.id)
