"""Episode messages in the Hugging Face chat format (what chat templates, TRL and `datasets` read)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal, NotRequired, TypedDict

from worldsmith.agent.messages import Message, Role, ToolCall
from worldsmith.jsonvalue import JsonObject
from worldsmith.toolschema import ToolSchemaJson


class FunctionCall(TypedDict):
    """A tool call's function: its name and arguments (an object, or its JSON text)."""

    name: str
    arguments: JsonObject | str


class ChatToolCall(TypedDict):
    """A tool call in the OpenAI function shape (`id` on the wire, not in chat templates)."""

    type: Literal["function"]
    function: FunctionCall
    id: NotRequired[str]


class ChatMessage(TypedDict):
    """One message as chat templates read it."""

    role: Role
    content: str
    tool_calls: list[ChatToolCall]


class ChatTool(TypedDict):
    """A tool schema as chat templates read it (a function)."""

    type: Literal["function"]
    function: ToolSchemaJson


class ChatTemplateKwargs(TypedDict):
    """The chat template's extra arguments a dataset row carries (TRL passes them on)."""

    enable_thinking: bool


class WireMessage(TypedDict):
    """One message as an OpenAI chat-completions request carries it: tool calls with their ids and
    arguments as JSON text (only when there are some), a tool result with the id it answers."""

    role: Role
    content: str
    tool_calls: NotRequired[list[ChatToolCall]]
    tool_call_id: NotRequired[str]


def chat_tool_calls(
    calls: Sequence[ToolCall], *, arguments_as_text: bool = False, with_ids: bool = False
) -> list[ChatToolCall]:
    """Tool calls in the OpenAI function shape: arguments as an object or (`arguments_as_text`) as
    JSON text, each call's `id` when `with_ids` (the wire; chat templates read none)."""
    out: list[ChatToolCall] = []
    for c in calls:
        call: ChatToolCall = {
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments) if arguments_as_text else c.arguments},
        }
        if with_ids:
            call["id"] = c.id
        out.append(call)
    return out


def hf_message(message: Message, *, arguments_as_text: bool = False) -> ChatMessage:
    """One message as {"role", "content", "tool_calls"}; tool calls in the OpenAI function shape.
    `arguments_as_text` writes arguments as JSON strings (one Arrow type for every row)."""
    calls = chat_tool_calls(message.tool_calls, arguments_as_text=arguments_as_text)
    return {"role": message.role, "content": message.content, "tool_calls": calls}


def wire_message(message: Message) -> WireMessage:
    """One message as an OpenAI-compatible server reads it (`WireMessage`)."""
    out: WireMessage = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = chat_tool_calls(message.tool_calls, arguments_as_text=True, with_ids=True)
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def hf_messages(view: list[Message], *, arguments_as_text: bool = False) -> list[ChatMessage]:
    return [hf_message(m, arguments_as_text=arguments_as_text) for m in view]


def hf_tools(tools: list[ToolSchemaJson]) -> list[ChatTool]:
    """Tool schemas as chat-template functions."""
    return [{"type": "function", "function": t} for t in tools]
