"""Boundary inputs of a tool (quality/input_probes.py calls them): valid arguments that ordinary seed values
never reach, each with the rule it tries.

- boundary dates, for each date parameter (a `date`/`date-time` format, date-shaped seed or reference values,
  or a date name with no other values): month ends, 31 December (year rollover), 29 February of a leap year,
  1 January, in the shape of the parameter's own values (`2025-03-14 09:00` -> `2025-12-31 09:00`, `2025-03`
  -> `2025-12`); every date parameter of the call gets the same date, so a range stays a valid range;
- text, for each free-text parameter (no enum, format or pattern, not a date, an email, a phone or a url):
  a single quote, a double quote (both catch SQL built from arguments), non-ASCII text, and text that matches
  nothing (an empty result);
- rows with NULL columns: `nulled_world`, a copy of the seed whose entity tables (those the tools name or
  take keys of) hold NULL in every nullable column of every row but the first.
"""

from __future__ import annotations

import calendar
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from worldsmith.bundle.sqlscript import deserialize
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.json_schema import declared_kinds
from worldsmith.quality.tool_inputs import parameter_values
from worldsmith.quality.world_values import WorldValues, words

#: A date-shaped value: year, month, optional day, the rest (a time, a zone) kept as it is.
_DATE = re.compile(r"^(\d{4})-(\d{2})(?:-(\d{2}))?([T ].*)?$")
#: Words of a parameter name that say its text has a format of its own (a quote there is malformed input).
_FORMATTED = frozenset({"date", "day", "time", "email", "phone", "url", "uri", "iso", "datetime", "timestamp"})
#: Free text each free-text parameter is tried with, and the rule each tries.
TEXTS: tuple[tuple[str, str], ...] = (
    ("O'Brien", "text with a single quote"),
    ('the "quoted" one', "text with a double quote"),
    ("Zoë Ñúñez-Łódź 東京 ☕", "non-ASCII text"),
    ("zz-matches-nothing-zz", "text that matches nothing (an empty result)"),
)


@dataclass(frozen=True)
class BoundaryCall:
    """Arguments of one boundary call and the rule it tries (`month end 2025-12-31 in end_date`)."""

    arguments: JsonObject
    rule: str


def _leap_year(year: int) -> int:
    """`year` if it is a leap year, else the next one."""
    while not calendar.isleap(year):
        year += 1
    return year


def boundary_dates(sample: str) -> list[tuple[str, str]]:
    """Boundary dates in the shape of date-shaped `sample`, each with its rule."""
    match = _DATE.match(sample)
    if match is None:
        return []
    year, rest, monthly = int(match.group(1)), match.group(4) or "", match.group(3) is None
    leap = _leap_year(year)
    if monthly:  # a month: its end is the tool's to compute
        return [(f"{year}-12", "December (year rollover)"), (f"{leap}-02", "February of a leap year")]
    dates = [
        (f"{year}-01-31", "month end (31 January)"),
        (f"{year}-04-30", "month end of a 30-day month"),
        (f"{year}-12-31", "31 December (year rollover)"),
        (f"{leap}-02-29", "29 February of a leap year"),
        (f"{year + 1}-01-01", "1 January"),
    ]
    if not calendar.isleap(year):
        dates.append((f"{year}-02-28", "month end of February"))
    return [(date + rest, rule) for date, rule in dates]


def _date_sample(name: str, schema: Mapping[str, JsonValue], valid: list[JsonValue]) -> str | None:
    """The date-shaped value boundary dates of parameter `name` take their shape from (None: not a date)."""
    texts = [v for v in valid if isinstance(v, str)]
    shaped = next((v for v in texts if _DATE.match(v)), None)
    if shaped is not None:
        return shaped
    fmt = schema.get("format")
    if fmt == "date-time":
        return "2025-06-15T10:00:00"
    if fmt == "date" or (not texts and "date" in words(name)):
        return "2025-06-15"
    return None


def _free_text(name: str, schema: Mapping[str, JsonValue]) -> bool:
    """Whether parameter `name` takes free text: a string with no enum, format or pattern, not named for a format."""
    if "string" not in (declared_kinds(schema) or {"string"}) or any(
        k in schema for k in ("enum", "format", "pattern", "const")
    ):
        return False
    return not _FORMATTED & set(words(name))


def boundary_calls(
    tool: ToolSchema, values: WorldValues, tables: set[str], references: list[JsonObject]
) -> list[BoundaryCall]:
    """The boundary calls of `tool` (owning `tables`; `references`: the reference solutions' arguments):
    the others arguments at a valid value (a reference call's where there is one)."""
    properties = tool.argument_schemas()
    per = {
        p: parameter_values(p, s, values, tables, [r[p] for r in references if p in r]).valid
        for p, s in properties.items()
    }
    required = [p for p in tool.required_arguments() if p in properties]
    base: JsonObject = dict(references[0]) if references else {p: per[p][0] for p in required if per.get(p)}
    calls: list[BoundaryCall] = []
    dated = {p: sample for p, s in properties.items() if (sample := _date_sample(p, s, per[p])) is not None}
    shaped = {p: boundary_dates(sample) for p, sample in dated.items()}
    for index in range(max((len(dates) for dates in shaped.values()), default=0)):
        # the same boundary for every date parameter (each in its own shape): a range stays a range
        chosen = {p: dates[index] for p, dates in shaped.items() if index < len(dates)}
        arguments = {**base, **{p: date for p, (date, _) in chosen.items()}}
        rule = next(iter(chosen.values()))[1]
        calls.append(BoundaryCall(arguments, f"{rule}: {', '.join(f'{p}={d}' for p, (d, _) in chosen.items())}"))
    for p, schema in properties.items():
        if p not in dated and _free_text(p, schema):
            calls += [BoundaryCall({**base, p: text}, f"{rule} in {p}") for text, rule in TEXTS]
    return calls


def entity_tables(tools: list[ToolSchema], values: WorldValues, named: dict[str, set[str]]) -> set[str]:
    """The tables the tools act on: those a tool names (`named`) or takes a key of."""
    tables = set().union(*named.values()) if named else set()
    for tool in tools:
        for parameter in tool.argument_schemas():
            parent = values.referenced_table(parameter)
            if parent is not None:
                tables.add(parent)
    return tables


def nulled_world(world: bytes, values: WorldValues, tables: set[str]) -> tuple[bytes, list[str]] | None:
    """A copy of `world` whose `tables` hold NULL in each nullable column (not NOT NULL, not a key) of every
    row but the first, and the columns nulled (`table.column`); None when there is none."""
    conn = deserialize(world)
    nulled: list[str] = []
    try:
        for name in sorted(tables):
            table = values.tables.get(name)
            if table is None or not table.has_rowid:
                continue
            columns = [c for c in table.columns if c not in table.not_null and c not in table.primary_key]
            if not columns:
                continue
            assignments = ", ".join(f'"{c}" = NULL' for c in columns)
            try:
                conn.execute(f'UPDATE "{name}" SET {assignments} WHERE rowid > (SELECT MIN(rowid) FROM "{name}")')
            except sqlite3.Error:  # a trigger or a CHECK refused it: that table keeps its values
                continue
            nulled += [f"{name}.{c}" for c in columns]
        return (conn.serialize(), nulled) if nulled else None
    finally:
        conn.close()
