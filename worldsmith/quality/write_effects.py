"""Write effects (`Probe.WRITE_EFFECTS`) and dependent rows (`Probe.DEPENDENT_ROWS`) of the writing tools.

Each writing tool (not tool_tables.is_read_tool) is called, on the pristine database, with its reference
solutions' arguments and with arguments naming rows of the tables it names (behaviour_calls.row_arguments),
a parameter named for a column of the row getting a value another row holds (a new value). Of each call that
changed the database, the rows it changed (the runtime's diff) are judged:

- an argument named for a column of the row the call inserted, or updated (the row its key argument names),
  went to that column: `ProbeFailure.WRITE_WRONG_COLUMN` when the column does not hold it while another
  column of the row took it; or, where the parameter is documented as the new value, when the column kept
  another value unchanged;
- no other row of that table took the value in that column (`ProbeFailure.WRITE_WRONG_COLUMN` too: the update
  reached rows its key did not name);
- a row deleted leaves no row whose foreign key names it, and a row whose status a tool moves, where the
  tool's description says a child table follows (`Cancel an appointment; the pending reminders are
  cancelled`), changes or removes the rows of that table tied to it that are still live (their status the
  first its CHECK lists, or not one that ends a row): else `ProbeFailure.DEPENDENT_ROWS_LEFT`;
- an argument that reached its column kept its unit and format (quality/written_units.py).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import ToolSchema
from worldsmith.models.results import TableDiff
from worldsmith.quality.behaviour_calls import (
    Caller,
    Row,
    SeedRows,
    Written,
    parameter_kinds,
    row_arguments,
    same_value,
)
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import excerpt
from worldsmith.quality.tool_tables import is_read_tool
from worldsmith.quality.world_values import singular, words
from worldsmith.quality.written_units import shared_format, unit_or_format_changed

#: A status that ends a row's life (its dependants should follow).
_ENDED = re.compile(r"cancel|void|delet|remov|revok|terminat|withdr|archiv|inactive|closed|expired", re.I)


@dataclass(frozen=True)
class WriteBudget:
    """At most `rows` seed rows per writing tool (besides its reference calls), `calls` calls in all."""

    rows: int = 2
    calls: int = 3


def _new_value(seed: SeedRows, table: str, column: str, row: Row) -> Any:
    """A value for `column` of `row` other than its own: another row's, else its text marked new (not a date's
    or a time's: another row's, in the format they share)."""
    current = row.get(column)
    others = [r.get(column) for r in seed.rows.get(table, []) if r.get(column) not in (None, current)]
    counts = Counter(others)
    shared = [v for v in counts if counts[v] > 1 or column in seed.tables[table].enums]
    if shared:
        return shared[0]
    formatted = shared_format([r.get(column) for r in seed.rows.get(table, [])]) is not None  # a date: no "n"
    if isinstance(current, str) and column not in seed.tables[table].enums and not formatted:
        return "n" + current
    return others[0] if others else None


def is_live(seed: SeedRows, table: str, row: Row) -> bool:
    """Whether a child row is still live: no status column, or its status the first its CHECK lists (or not
    one that ends a row)."""
    schema = seed.tables[table]
    status = next((c for c in schema.columns if "status" in c or c == "state"), None)
    if status is None:
        return True
    value = row.get(status)
    enum = schema.enums.get(status)
    if enum:
        return value == enum[0]
    return isinstance(value, str) and not _ENDED.search(value)


def _named_children(seed: SeedRows, table: str, description: str) -> set[str]:
    """The child tables of `table` a tool's description says follow it: named in a sentence that also says
    they end ("... and pending reminders are cancelled")."""
    found = set()
    for sentence in re.split(r"[.;!?]\s", description):
        if not _ENDED.search(sentence):
            continue
        said = set(words(sentence))
        found |= {c for c, _, _ in seed.children(table) if singular(c) in said or words(c)[-1] in said}
    return found


def _calls(
    tool: ToolSchema,
    seed: SeedRows,
    tables: set[str],
    references: list[JsonObject],
    base: JsonObject,
    budget: WriteBudget,
) -> list[JsonObject]:
    """The arguments a writing tool is judged on: calls naming seed rows with live children its description
    says follow, its reference calls, then calls naming other seed rows of the tables it names, with new
    values."""
    following: list[JsonObject] = []
    others: list[JsonObject] = []
    for table in sorted(tables):
        if table not in seed.tables or seed.key(table) is None:
            continue
        named_children = _named_children(seed, table, tool.description)
        rows = seed.rows.get(table, [])

        def tied_live(row: Row) -> bool:
            tied = seed.tied(table, row)
            return any(is_live(seed, child, r) for child in named_children for r in tied.get(child, []))

        live = [r for r in rows if tied_live(r)] if named_children else []
        spread = rows[:: max(1, len(rows) // budget.rows)][: budget.rows]
        for row, into in [(r, following) for r in live[: budget.calls]] + [(r, others) for r in spread]:
            arguments = row_arguments(tool, seed, table, row, base)
            if arguments is None:
                continue
            for parameter in tool.argument_schemas():
                columns = seed.tables[table].columns
                if parameter not in columns or parameter == seed.key(table) or not _is_value(tool, parameter):
                    continue
                if (value := _new_value(seed, table, parameter, row)) is not None:
                    arguments[parameter] = value
            into.append(_as_declared(tool, arguments))
    return (following + [dict(r) for r in references] + others)[: budget.calls]


def _as_declared(tool: ToolSchema, arguments: JsonObject) -> JsonObject:
    """`arguments` with a seed's 0/1 given as false/true where the parameter is declared boolean."""
    schemas = tool.argument_schemas()
    return {
        name: bool(value)
        if name in schemas and isinstance(value, int) and "boolean" in parameter_kinds(schemas[name])
        else value
        for name, value in arguments.items()
    }


def _is_value(tool: ToolSchema, parameter: str) -> bool:
    """Whether a column parameter is a value to write, not the row's name: a key parameter names the row."""
    keys = [p for p in tool.argument_schemas() if p.endswith("_id") or p == "id"]
    return bool(keys) and parameter not in keys


def _documented_new(tool: ToolSchema, parameter: str) -> bool:
    schema = tool.argument_schemas().get(parameter, {})
    return "new" in words(str(schema.get("description") or ""))


def _target(
    changes: TableDiff, key: str | None, arguments: JsonObject, tool: ToolSchema, table: str
) -> tuple[Row, Row] | None:
    """(before, after) of the row a call inserted, or updated as its key argument names; None: none certain."""
    if len(changes.inserted) == 1 and not changes.updated:
        return {}, dict(changes.inserted[0])
    if key is None:
        return None
    wanted = [arguments[p] for p in (f"{singular(table)}_id", "id") if p in arguments and p in tool.argument_schemas()]
    for update in changes.updated:
        if wanted and same_value(update["key"].get(key), wanted[0]):
            return dict(update["before"]), dict(update["after"])
    return None


def _judge_columns(
    tool: ToolSchema, seed: SeedRows, arguments: JsonObject, written: Written
) -> tuple[ProbeFailure, str] | None:
    """What the call did wrong with the columns its arguments name, and how (None: nothing)."""
    for table, changes in written.changes.tables.items():
        schema = seed.tables.get(table)
        if schema is None:
            continue
        key = seed.key(table)
        target = _target(changes, key, arguments, tool, table)
        if target is None:
            continue
        before, after = target
        for parameter, value in arguments.items():
            if parameter not in schema.columns or parameter == key or value is None or parameter not in after:
                continue
            if same_value(after[parameter], value, contains=isinstance(value, str)):
                others = [
                    u
                    for u in changes.updated
                    if u["after"] != after
                    and same_value(u["after"].get(parameter), value)
                    and not same_value(u["before"].get(parameter), value)
                ]
                if others and before:
                    return ProbeFailure.WRITE_WRONG_COLUMN, (
                        f"{parameter}={value!r} also went to {len(others)} other rows of {table} "
                        f"(first key {excerpt(others[0]['key'])}): the update reaches rows its key does not name"
                    )
                continue
            took = [c for c in after if c != parameter and before.get(c) != after[c] and same_value(after[c], value)]
            if took:
                return ProbeFailure.WRITE_WRONG_COLUMN, (
                    f"{parameter}={value!r} went to column {took[0]} of {table}, not {parameter} "
                    f"(which holds {excerpt(after[parameter])})"
                )
            documented = str(tool.argument_schemas().get(parameter, {}).get("description") or "")
            seeded = [r.get(parameter) for r in seed.rows.get(table, [])]
            if changed := unit_or_format_changed(table, parameter, value, after[parameter], seeded, documented):
                return changed
            if before and before.get(parameter) == after[parameter] and _documented_new(tool, parameter):
                return ProbeFailure.WRITE_WRONG_COLUMN, (
                    f"{parameter}={value!r} is documented as the new value, but {table}.{parameter} kept "
                    f"{excerpt(after[parameter])}"
                )
    return None


def _judge_dependants(tool: ToolSchema, seed: SeedRows, written: Written) -> tuple[str | None, bool]:
    """Rows a deleted or cancelled row leaves behind, in words (None: none), and whether the call deleted or
    cancelled a row with dependants to judge."""
    changes = written.changes.tables
    judged = False
    for table, diff in changes.items():
        if table not in seed.tables:
            continue
        named = _named_children(seed, table, tool.description)
        ended: list[tuple[Row, bool]] = [(dict(r), True) for r in diff.deleted]
        for update in diff.updated:
            moved = [c for c in update["after"] if "status" in c and update["before"].get(c) != update["after"][c]]
            if moved and named:
                ended.append((dict(update["before"]), False))
        for row, deleted in ended:
            for child, rows in seed.tied(table, row).items():
                if not deleted and child not in named:
                    continue
                judged = True
                child_key = seed.key(child)
                touched = changes.get(child)
                if child_key is None:
                    continue
                gone: set[str] = set()
                if touched is not None:
                    gone = {str(r.get(child_key)) for r in touched.deleted}
                    gone |= {str(u["key"].get(child_key)) for u in touched.updated}
                left = [r for r in rows if (deleted or is_live(seed, child, r)) and str(r.get(child_key)) not in gone]
                if deleted and left:
                    return (
                        f"deleting {table} row {excerpt(row)} left {len(left)} rows of {child} naming it (first {excerpt(left[0])})",
                        True,
                    )
                if not deleted and left and not gone:
                    return (
                        f"it cancelled {table} row {excerpt(row)} but left its {len(left)} live {child} "
                        f"(first {excerpt(left[0])}) as they were, though its description says they follow"
                    ), True
    return None, judged


def write_effect_probes(
    caller: Caller,
    tools: list[ToolSchema],
    seed: SeedRows,
    bases: dict[str, JsonObject],
    named: dict[str, set[str]],
    references: dict[str, list[JsonObject]],
    budget: WriteBudget | None = None,
) -> list[ProbeResult]:
    """`Probe.WRITE_EFFECTS` and `Probe.DEPENDENT_ROWS` of every writing tool; see the module docstring."""
    budget = budget or WriteBudget()
    results: list[ProbeResult] = []
    for tool in tools:
        if is_read_tool(tool.name) or tool.name not in bases:
            continue
        calls = _calls(tool, seed, named.get(tool.name, set()), references.get(tool.name, []), bases[tool.name], budget)
        column_failure = dependant_failure = None
        judged = ended = 0
        for arguments in calls:
            written = caller.write(tool.name, arguments)
            if not (written.result.ok and written.result.changed):
                continue
            judged += 1
            if column_failure is None and (wrong := _judge_columns(tool, seed, arguments, written)):
                column_failure = ProbeResult.failing(
                    wrong[0],
                    tool.name,
                    f"called with {excerpt(arguments)}: {wrong[1]}",
                    cause=excerpt(arguments),
                )
            why, ending = _judge_dependants(tool, seed, written)
            ended += ending
            if dependant_failure is None and why:
                dependant_failure = ProbeResult.failing(
                    ProbeFailure.DEPENDENT_ROWS_LEFT,
                    tool.name,
                    f"called with {excerpt(arguments)}: {why}",
                    cause=excerpt(arguments),
                )
        if judged:
            results.append(
                column_failure or ProbeResult.passing(Probe.WRITE_EFFECTS, tool.name, f"{judged} writes as named")
            )
        if ended:
            results.append(
                dependant_failure
                or ProbeResult.passing(Probe.DEPENDENT_ROWS, tool.name, f"{ended} removals left no dependants")
            )
    return results
