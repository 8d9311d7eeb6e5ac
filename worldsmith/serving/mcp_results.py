"""What an agent sees of a tool call: a runtime result or refusal as an MCP `CallToolResult`.

A result's value comes back as JSON text with its structured content as the tool's output shape makes
it; a tool's own error is `error: ...`, anything the environment or the runtime failed at is
`environment error: ...`, one line (worldsmith/runtime/answers.py). Nothing here raises for what a
hostile world can send; an exception bad input cannot cause (a bug) propagates.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from worldsmith.bundle.jsonvalues import TooDeep, check_nesting
from worldsmith.models.results import ToolResult
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode
from worldsmith.serving.mcp_tools import OutputShape
from worldsmith.serving.served_world import ServedWorld


def text_result(value: Any, structured: Any) -> types.CallToolResult:
    """A successful result: `value` as JSON text, `structured` as its structured content."""
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=structured)


def tool_result_to_mcp(result: ToolResult, shape: OutputShape | None = None) -> types.CallToolResult:
    """What the agent sees of a tool call: the JSON value with its structured content as `shape` makes
    it (default: the value if an object, else `{"result": value}`), or an error text (is_error). A
    value nested deeper than the sandbox lets results nest (only a reply forged past the worker's own
    check could carry one) is an environment error, before any recursive encoder sees it; so is a
    value that breaks the output schema its tool declares."""
    if result.ok:
        try:
            check_nesting(result.value)
        except TooDeep as exc:
            return runtime_error_to_mcp(exc)
        structured, problem = (shape or OutputShape.of(None)).structured(result.value)
        if problem is not None:
            return error_result(f"environment error: the result breaks the tool's declared output schema: {problem}")
        return text_result(result.value, structured)
    prefix = "error" if result.status == "tool_error" else "environment error"
    return error_result(f"{prefix}: {result.error}")


def error_result(text: str) -> types.CallToolResult:
    """A tool error result (is_error) saying `text`."""
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def runtime_error_to_mcp(exc: Exception) -> types.CallToolResult:
    """A call the runtime could not answer with a result, as a tool error result saying why."""
    line = answer(exc) or f"{type(exc).__name__}: {exc}"
    return error_result(f"environment error: {one_line(line)}")


async def call(world: ServedWorld, episode: Episode, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """Tool `name` called in `episode` (in a thread of the world's calls lane), as the agent sees the
    result; WorldBusy (serving/lanes.py) when the world has as many calls as its limits allow."""
    try:
        result = await world.lanes.call(episode.call_tool, name, arguments)
    except Exception as exc:  # the runtime's refusals, answered like a failed call
        if answer(exc) is None:
            raise
        return runtime_error_to_mcp(exc)
    return tool_result_to_mcp(result, world.outputs.get(name))
