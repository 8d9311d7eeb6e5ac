"""What the behaviour probes (quality/behaviour_probes.py) build on: the seeded rows read on the host
(`SeedRows`: each table's rows, keys, foreign keys, children), the rows a tool's value holds (`rows_of`),
arguments that name one seed row (`row_arguments`), and calls on one episode, each on the pristine database,
with their values and, for a call that wrote, the rows it changed (`Caller`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import ToolSchema
from worldsmith.models.results import DbDiff, ToolResult
from worldsmith.quality.json_schema import declared_kinds
from worldsmith.quality.schema import TableSchema
from worldsmith.quality.tool_calls import PristineCalls
from worldsmith.quality.world_values import WorldValues, singular, words
from worldsmith.runtime.episode import SandboxEpisode
from worldsmith.runtime.errors import RuntimeFault

Row = dict[str, Any]


def parameter_kinds(schema: dict[str, JsonValue]) -> set[str]:
    """The JSON types a parameter takes, null aside (`type`, a list of them, or anyOf/oneOf options)."""
    return declared_kinds(schema) - {"null"}


def rows_of(value: JsonValue) -> list[Row] | None:
    """The rows a read's value lists: a list of objects, or an object holding exactly one such list (under
    any key: `{"slots": [...], "provider": {...}}`); None when it lists none."""
    if isinstance(value, list):
        return [r for r in value if isinstance(r, dict)] if all(isinstance(r, dict) for r in value) else None
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
        if len(lists) == 1:
            return [r for r in lists[0] if isinstance(r, dict)]
        empty = [v for v in value.values() if isinstance(v, list)]
        return [] if not lists and len(empty) == 1 else None
    return None


def identity(row: Row) -> str:
    """How a returned row is told from the others: its `id`, else all of it."""
    return json.dumps(row.get("id", row), sort_keys=True, default=str)


def same_value(returned: Any, expected: Any, *, contains: bool = False) -> bool:
    """Whether `returned` holds `expected`: equal (numbers by value, text ignoring case and surrounding
    space); with `contains`, text holding it."""
    if isinstance(returned, bool) or isinstance(expected, bool):
        return bool(returned) == bool(expected) and type(returned) is type(expected) or returned == expected
    if isinstance(returned, (int, float)) and isinstance(expected, (int, float)):
        return float(returned) == float(expected)
    if isinstance(returned, str) and isinstance(expected, str):
        a, b = returned.strip().casefold(), expected.strip().casefold()
        return a == b or (contains and b in a)
    if isinstance(returned, str) and isinstance(expected, (int, float)) or isinstance(expected, str):
        return str(returned).strip() == str(expected).strip()
    return bool(returned == expected)


class SeedRows:
    """The seeded database read on the host: each table's schema and its first rows (those `values` read:
    the world's memoised WorldValues, so the seed is read once per check)."""

    def __init__(self, values: WorldValues):
        self.tables: dict[str, TableSchema] = values.tables
        self.rows: dict[str, list[Row]] = values.rows

    def key(self, table: str) -> str | None:
        """The single primary-key column of `table` (None: none, or several)."""
        schema = self.tables.get(table)
        return schema.primary_key[0] if schema is not None and len(schema.primary_key) == 1 else None

    def children(self, table: str) -> list[tuple[str, str, str]]:
        """(child table, its column, the parent column) of every foreign key into `table`."""
        return [
            (child.name, column, parent_column)
            for child in self.tables.values()
            for column, parent, parent_column in child.foreign_keys
            if parent == table and child.name != table
        ]

    def tied(self, table: str, row: Row) -> dict[str, list[Row]]:
        """The rows of each child table whose foreign key names `row` of `table`."""
        found: dict[str, list[Row]] = {}
        for child, column, parent_column in self.children(table):
            if row.get(parent_column) is None:
                continue
            tied = [r for r in self.rows.get(child, []) if r.get(column) == row[parent_column]]
            if tied:
                found.setdefault(child, []).extend(tied)
        return found

    def columns_holding(self, name: str) -> list[str]:
        """The tables with a column `name`."""
        return [t.name for t in self.tables.values() if name in t.columns]


def row_arguments(tool: ToolSchema, seed: SeedRows, table: str, row: Row, base: JsonObject) -> JsonObject | None:
    """Arguments of `tool` naming `row` of `table`: a parameter named for one of its columns takes the row's
    value, `<table>_id` (or `id`) its key, `<parent>_<column>` that column of the parent row its foreign key
    names (`patient_email` -> the email of the row's patient); the others keep `base`'s values. None when no
    parameter names the row."""
    schema = seed.tables[table]
    key = seed.key(table)
    arguments = dict(base)
    named = False
    for parameter in tool.argument_schemas():
        value: Any = None
        if parameter in schema.columns and parameter != key:
            value = row.get(parameter)
        elif key is not None and parameter in (f"{singular(table)}_id", "id", f"{table}_id"):
            value, named = row.get(key), True
        else:
            value = _through_parent(seed, schema, row, parameter)
        if value is not None:
            arguments[parameter] = value
            named = named or parameter in schema.columns and parameter in _identifying(seed, table)
    return arguments if named else None


def _identifying(seed: SeedRows, table: str) -> set[str]:
    """Columns of `table` whose seed values are all distinct (a key, a code, a unique name)."""
    rows = seed.rows.get(table, [])
    return {
        c
        for c in seed.tables[table].columns
        if rows and len({r.get(c) for r in rows}) == len(rows) and all(r.get(c) is not None for r in rows)
    }


def _through_parent(seed: SeedRows, schema: TableSchema, row: Row, parameter: str) -> Any:
    """The value parameter `<parent>_<column>` names through a foreign key of `row` (None: it names none)."""
    parts = words(parameter)
    for column, parent, parent_column in schema.foreign_keys:
        parent_words = words(singular(parent))
        if parts[: len(parent_words)] != parent_words or row.get(column) is None:
            continue
        wanted = "_".join(parameter.split("_")[len(parent_words) :])
        target = next((r for r in seed.rows.get(parent, []) if r.get(parent_column) == row[column]), None)
        if target is not None and wanted in target:
            return target[wanted]
    return None


@dataclass
class Written:
    """A call that may write: its result and the rows it changed (from the pristine database)."""

    result: ToolResult
    changes: DbDiff


class Caller(PristineCalls):
    """`PristineCalls` answering with results and, for a write, the rows it changed; reads and writes are kept
    by tool and arguments (the probes ask some calls twice: a write's outcome on the pristine database is the
    same each time, or the determinism replays say it is not)."""

    def __init__(self, episode: SandboxEpisode, world: bytes):
        super().__init__(episode, world)
        self.kept: dict[str, ToolResult] = {}
        self.written: dict[str, Written] = {}

    def call(self, tool: str, arguments: JsonObject) -> ToolResult:
        """The result of `tool` on the pristine database (a runtime fault is its env_error)."""
        key = json.dumps([tool, arguments], sort_keys=True, default=str)
        if key in self.kept:
            return self.kept[key]
        try:
            result = self.call_fresh(tool, arguments)
        except RuntimeFault as fault:
            return ToolResult(status="env_error", error=f"runtime fault: {fault}")
        if not result.changed:
            self.kept[key] = result
        return result

    def write(self, tool: str, arguments: JsonObject) -> Written:
        """`tool` called on the pristine database, with the rows it changed (none unless it changed the
        database; a runtime fault is its env_error)."""
        key = json.dumps([tool, arguments], sort_keys=True, default=str)
        if key in self.written:
            return self.written[key]
        try:
            result = self.call_fresh(tool, arguments)
            changes = self.episode.diff(self.world) if result.ok and result.changed else DbDiff()
        except RuntimeFault as fault:
            self.dirty = True
            return Written(ToolResult(status="env_error", error=f"runtime fault: {fault}"), DbDiff())
        if result.status != "env_error":  # a crash (a limit hit under load) is made again
            self.written[key] = Written(result, changes)
        return Written(result, changes)
