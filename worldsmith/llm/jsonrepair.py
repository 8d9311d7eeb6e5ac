"""Recover a JSON object from near-JSON model output: code fences, prose around it, trailing
commas, single-quoted Python literals. Stdlib only."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator

from worldsmith.jsonvalue import JsonObject

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def _structure(text: str, start: int) -> Iterator[tuple[int, str]]:
    """(index, char) of every bracket or brace of `text` from `start` that is outside a JSON string; then,
    when the text ends inside a string, one last (len(text), '"')."""
    in_string = escaped = False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{}[]":
            yield index, char
    if in_string:
        yield len(text), '"'


def _outermost_object(text: str) -> str | None:
    """The first balanced {...} in `text`, respecting strings."""
    start = text.find("{")
    while start != -1:
        depth = 0
        for index, char in _structure(text, start):
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[start : index + 1]
        start = text.find("{", start + 1)
    return None


def parse_json_object(text: str) -> JsonObject:
    """The JSON object in `text`, repairing common near-JSON; raises ValueError naming the problem."""
    if "{" not in text:
        raise ValueError("no JSON object found in the output")
    candidates = [text.strip()]
    candidates += [m.strip() for m in _FENCE.findall(text)]
    embedded = _outermost_object(text)
    if embedded:
        candidates.append(embedded)
    problem = "no JSON object found"
    for candidate in candidates:
        for attempt in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
            try:
                value = json.loads(attempt)
            except json.JSONDecodeError as exc:
                problem = f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                try:  # Python-literal style: single quotes, True/False/None
                    value = ast.literal_eval(attempt)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    continue
            if isinstance(value, dict):
                return value
            problem = f"expected a JSON object, got {type(value).__name__}"
    if text.count("{") > text.count("}"):
        problem += " (the output looks truncated)"
    raise ValueError(problem)


def unterminated_json(text: str) -> str | None:
    """What the JSON value starting at the first `{` of `text` leaves open where the text ends ("string",
    "object" or "array"), or None when it closes (or there is none): an answer cut off mid-way."""
    start = text.find("{")
    if start == -1:
        return None
    open_brackets: list[str] = []
    for _, char in _structure(text, start):
        if char == '"':
            return "string"
        if char in "{[":
            open_brackets.append(char)
        else:
            if open_brackets:
                open_brackets.pop()
            if not open_brackets:
                return None
    return {"{": "object", "[": "array"}[open_brackets[-1]] if open_brackets else None
