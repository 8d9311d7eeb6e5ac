"""Chat messages, tool calls and policy turns exchanged in an episode (OpenAI-style roles)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from worldsmith.jsonvalue import JsonObject

#: Who wrote a message (OpenAI's roles).
Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: JsonObject = Field(default_factory=dict)


class Message(BaseModel):
    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None


class PolicyTurn(BaseModel):
    """What a policy produced for one turn: an assistant message, or a format error."""

    message: Message | None = None
    format_error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0
    prompt_ids: list[int] | None = Field(None, description="Token ids the model saw (local policies only).")
    completion_ids: list[int] | None = Field(None, description="Token ids the model produced (local policies only).")
    completion_logprobs: list[float] | None = Field(
        None,
        description="Each produced token's log-probability under the sampler, when the generation backend reports it (vLLM).",
    )
    policy_version: int | None = Field(
        None, description="The version of the weights that produced the turn, when an inference engine reports it."
    )
