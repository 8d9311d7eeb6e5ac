"""Reading a tool's JSON Schema (tools.json: generated, so any JSON): a field as the JSON type it must be,
or empty when it is absent or another type."""

from __future__ import annotations

from collections.abc import Mapping

from worldsmith.jsonvalue import JsonValue


def schema_object(schema: Mapping[str, JsonValue], key: str) -> Mapping[str, JsonValue]:
    """The object at `key` (`properties`, `items`, `parameters`...), empty when it is not one."""
    value = schema.get(key)
    return value if isinstance(value, dict) else {}


def schema_list(schema: Mapping[str, JsonValue], key: str) -> list[JsonValue]:
    """The list at `key` (`required`, `enum`, `examples`, `anyOf`...), empty when it is not one."""
    value = schema.get(key)
    return value if isinstance(value, list) else []


def schema_number(schema: Mapping[str, JsonValue], key: str) -> float | None:
    """The number at `key` (`minimum`, `maximum`), None when it is not one."""
    value = schema.get(key)
    return value if isinstance(value, int | float) else None
