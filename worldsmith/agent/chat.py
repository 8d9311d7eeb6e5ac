"""Episode messages in the Hugging Face chat format (what chat templates, TRL and `datasets` read)."""

from __future__ import annotations

import json
from typing import Any

from worldsmith.agent.messages import Message


def hf_message(message: Message, *, arguments_as_text: bool = False) -> dict[str, Any]:
    """One message as {"role", "content", "tool_calls"}; tool calls in the OpenAI function shape.
    `arguments_as_text` writes arguments as JSON strings (one Arrow type for every row)."""
    calls = [
        {
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments) if arguments_as_text else c.arguments},
        }
        for c in message.tool_calls
    ]
    return {"role": message.role, "content": message.content, "tool_calls": calls}


def hf_messages(view: list[Message], *, arguments_as_text: bool = False) -> list[dict[str, Any]]:
    return [hf_message(m, arguments_as_text=arguments_as_text) for m in view]


def hf_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool schemas as chat-template functions."""
    return [{"type": "function", "function": t} for t in tools]
