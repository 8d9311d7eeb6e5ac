"""What an agent sees of a tool call: a runtime result or refusal as an MCP `CallToolResult`.

A result's value comes back as JSON text with its structured content as the tool's output shape makes
it; a tool's own error is `error: ...`, anything the environment or the runtime failed at is
`environment error: ...`, one line (worldsmith/runtime/answers.py). Nothing here raises for what a
hostile world can send; an exception bad input cannot cause (a bug) propagates.

A value arrives as the JSON text the sandbox sent (up to `MAX_RESULT_BYTES`) and is not decoded where
nothing needs it: `call_json` checks the text (serving/jsontext.py) and its kind against the tool's
output schema and answers a `JsonAnswer`, which the gateway's hot path writes out in pieces around
the text (serving/hotpath.py), so a result is held about once, not decoded into objects many times
its size. The value is decoded only where the text cannot tell: a scalar, a schema that says more
than the value's type, and the SDK's path (`call`, for requests the hot path leaves to the SDK).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from worldsmith.bundle.jsonvalues import TooDeep, check_nesting
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.results import ToolResult
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode, SandboxEpisode
from worldsmith.serving import jsontext
from worldsmith.serving.mcp_tools import OutputShape
from worldsmith.serving.served_world import ServedWorld

#: Values up to this many bytes of JSON are checked in the event loop; larger ones in a thread.
_CHECKED_INLINE = 64 * 1024


@dataclass(frozen=True)
class JsonAnswer:
    """A successful call's value as the JSON text the sandbox sent, checked (one JSON value, ASCII,
    nested at most `MAX_NESTING` deep, of a type its tool's output schema allows) and passed on as it
    is: the text content, and the structured content (`{"result": value}` when `wrapped`)."""

    text: bytes
    wrapped: bool

    def result(self) -> types.CallToolResult:
        """The same answer as an SDK result (its value decoded, for the SDK to encode again)."""
        value = json.loads(self.text)
        text = types.TextContent(text=self.text.decode("ascii"))
        return types.CallToolResult(content=[text], structured_content={"result": value} if self.wrapped else value)


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


def _call_text(episode: Episode, name: str, arguments: JsonObject) -> tuple[ToolResult, bytes | None]:
    """`SandboxEpisode.call_tool_text` of any episode (a world of another kind: its value encoded here)."""
    if isinstance(episode, SandboxEpisode):
        return episode.call_tool_text(name, arguments)
    result = episode.call_tool(name, arguments)
    if not result.ok:
        return result, None
    return result.model_copy(update={"value": None}), json.dumps(result.value).encode()


def checked_text(text: bytes, shape: OutputShape | None) -> JsonAnswer | types.CallToolResult:
    """What the agent sees of a successful call whose value has JSON text `text`: a `JsonAnswer`
    where the text and its kind tell all, else the decoded value's answer (`tool_result_to_mcp`)."""
    shape = shape or OutputShape.of(None)
    try:
        kind = jsontext.check(text)
    except (TooDeep, jsontext.NotJson) as exc:  # only a reply forged past the sandbox's own encoder
        return error_result(f"environment error: {exc}")
    checked = shape.structured_kind(kind)
    if checked is None:  # only the value can tell: decode it
        try:
            value = json.loads(text)
        except ValueError as exc:  # a number past what Python reads (digits beyond its limit)
            return error_result(f"environment error: the value cannot be read: {one_line(str(exc))}")
        return tool_result_to_mcp(ToolResult(status="ok", value=value), shape)
    wrapped, problem = checked
    if problem is not None:
        return error_result(f"environment error: the result breaks the tool's declared output schema: {problem}")
    return JsonAnswer(text, wrapped)


async def call_json(
    world: ServedWorld, episode: Episode, name: str, arguments: JsonObject
) -> JsonAnswer | types.CallToolResult:
    """Tool `name` called in `episode` (in a thread of the world's calls lane), as the agent sees the
    result: a successful value as its checked JSON text where that tells all (`checked_text`), any
    other answer as a result. WorldBusy (serving/lanes.py) when the world has as many calls as its
    limits allow."""
    try:
        result, text = await world.lanes.call(_call_text, episode, name, arguments)
    except Exception as exc:  # the runtime's refusals, answered like a failed call
        if answer(exc) is None:
            raise
        return runtime_error_to_mcp(exc)
    shape = world.outputs.get(name)
    if text is None:
        return tool_result_to_mcp(result, shape)
    if len(text) <= _CHECKED_INLINE:
        return checked_text(text, shape)
    return await world.lanes.call(checked_text, text, shape, admitted=True)  # the call was admitted


async def call(world: ServedWorld, episode: Episode, name: str, arguments: JsonObject) -> types.CallToolResult:
    """Tool `name` called in `episode` as `call_json` calls it, as the agent sees the result (its value decoded)."""
    answered = await call_json(world, episode, name, arguments)
    return answered.result() if isinstance(answered, JsonAnswer) else answered
