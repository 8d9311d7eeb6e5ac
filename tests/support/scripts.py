"""Scripted completions of the tiny Qwen3 model's chat format, for tests that play an agent."""

from __future__ import annotations

import json


def call_text(name: str, arguments: dict) -> str:
    """One tool call as the model writes it, ending its turn."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"
