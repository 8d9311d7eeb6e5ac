"""Episode messages in the Hugging Face chat format (what chat templates, TRL and `datasets` read)."""

from __future__ import annotations

import json
from typing import Literal, TypedDict

from worldsmith.agent.messages import Message, Role
from worldsmith.jsonvalue import JsonObject
from worldsmith.toolschema import ToolSchemaJson


class FunctionCall(TypedDict):
    """A tool call's function: its name and arguments (an object, or its JSON text)."""

    name: str
    arguments: JsonObject | str


class ChatToolCall(TypedDict):
    """A tool call in the OpenAI function shape."""

    type: Literal["function"]
    function: FunctionCall


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


def hf_message(message: Message, *, arguments_as_text: bool = False) -> ChatMessage:
    """One message as {"role", "content", "tool_calls"}; tool calls in the OpenAI function shape.
    `arguments_as_text` writes arguments as JSON strings (one Arrow type for every row)."""
    calls: list[ChatToolCall] = [
        {
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments) if arguments_as_text else c.arguments},
        }
        for c in message.tool_calls
    ]
    return {"role": message.role, "content": message.content, "tool_calls": calls}


def hf_messages(view: list[Message], *, arguments_as_text: bool = False) -> list[ChatMessage]:
    return [hf_message(m, arguments_as_text=arguments_as_text) for m in view]


def hf_tools(tools: list[ToolSchemaJson]) -> list[ChatTool]:
    """Tool schemas as chat-template functions."""
    return [{"type": "function", "function": t} for t in tools]
