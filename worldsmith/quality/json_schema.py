"""Reading a tool's JSON Schema (tools.json: generated, so any JSON): a field as the JSON type it must be,
or empty when it is absent or another type; the JSON types a schema declares; whether a value is of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def declared_kinds(schema: Mapping[str, JsonValue]) -> set[str]:
    """The JSON types `schema` declares (`type`, a list of them, and its anyOf/oneOf options'), null
    included; empty when it declares none."""
    declared = schema.get("type")
    kinds = (
        {declared}
        if isinstance(declared, str)
        else {k for k in declared if isinstance(k, str)}
        if isinstance(declared, list)
        else set()
    )
    for option in schema_list(schema, "anyOf") + schema_list(schema, "oneOf"):
        if isinstance(option, dict):
            kinds |= declared_kinds(option)
    return kinds


def fits_kinds(value: Any, kinds: set[str]) -> bool:
    """Whether `value` (decoded JSON) is of one of the JSON types `kinds` (an integral float an integer;
    None never: nullable is the caller's to decide)."""
    if value is None:
        return False
    if isinstance(value, bool):
        return "boolean" in kinds
    if isinstance(value, int):
        return bool(kinds & {"integer", "number"})
    if isinstance(value, float):
        return "number" in kinds or ("integer" in kinds and value.is_integer())
    if isinstance(value, str):
        return "string" in kinds
    if isinstance(value, list):
        return "array" in kinds
    if isinstance(value, dict):
        return "object" in kinds
    return False
