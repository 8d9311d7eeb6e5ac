"""The format a tool parameter declares for its strings, so probes call tools only with values that fit it.

A parameter declares a format by its JSON Schema (`format`: date, date-time, time; `pattern`) or its
description (`YYYY-MM-DD`, `HH:MM`, `ISO 8601 date`...). A string that does not match is malformed,
never a valid input: a tool refusing it, or crashing on it, is no "valid input crashed" defect.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date, datetime, time
from typing import Any

from worldsmith.jsonvalue import JsonValue

#: Description phrases that declare a format, and the format they declare (first match wins).
_DESCRIBED = (
    (re.compile(r"YYYY-MM-DD[ T]HH:MM|ISO[ -]?(?:8601 )?date[- ]?time", re.IGNORECASE), "date-time"),
    (re.compile(r"YYYY-MM-DD|ISO[ -]?(?:8601 )?date", re.IGNORECASE), "date"),
    (re.compile(r"\bHH:MM\b"), "time"),
)
#: A value of each format, used when the world offers none.
EXAMPLES = {"date": "2026-01-15", "date-time": "2026-01-15T10:00:00", "time": "10:00"}


def declared_format(schema: Mapping[str, JsonValue], name: str = "") -> str | None:
    """The format `schema` (the JSON Schema of parameter `name`) declares for its strings: "date",
    "date-time", "time", or None (none, or one this module does not check). A parameter named
    `date` or `..._date` is a date."""
    declared = schema.get("format")
    if declared in EXAMPLES:
        return str(declared)
    description = schema.get("description")
    if isinstance(description, str):
        for phrase, kind in _DESCRIBED:
            if phrase.search(description):
                return kind
    return "date" if name == "date" or name.endswith("_date") else None


def conforms(value: Any, schema: Mapping[str, JsonValue], name: str = "") -> bool:
    """Whether `value` fits the format and `pattern` `schema` (of parameter `name`) declares (anything
    not a string does: its type is checked elsewhere)."""
    if not isinstance(value, str):
        return True
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            if re.search(pattern, value) is None:
                return False
        except re.error:
            pass  # a pattern Python cannot read says nothing here
    kind = declared_format(schema, name)
    try:
        if kind == "date":
            date.fromisoformat(value)
            return len(value) == 10
        if kind == "date-time":
            datetime.fromisoformat(value.replace("Z", "+00:00"))
            return len(value) > 10
        if kind == "time":
            time.fromisoformat(value)
    except ValueError:
        return False
    return True


def conforming(values: Iterable[Any], schema: Mapping[str, JsonValue], name: str = "") -> list[Any]:
    """The `values` that fit the format `schema` (of parameter `name`) declares, in order."""
    return [v for v in values if conforms(v, schema, name)]
