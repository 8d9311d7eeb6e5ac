"""Dependent rows by the world's own pattern (`Probe.DEPENDENT_ROWS`, beside quality/write_effects.py, which
judges what the schema's deletes and a tool's own description say).

A world shows what ending a row does to the rows tied to it: when one of its tools ends a row of a table
(deletes it, or moves its status to a value) and changes or removes that row's live children of a table
(`cancel_appointment` cancelling the appointment's scheduled reminders), that is the world's rule. Any other
tool that ends a row of the same table the same way (deleted, or the same new status) and leaves that row's
live children of that table as they were breaks it: `ProbeFailure.DEPENDENT_ROWS_LEFT`, naming the tool, the
call, the rows left and the tool that shows the rule.

Each writing tool that names rows of a table with children is called, per child table, on up to `rows` seed
rows with live rows of that child (rows of distinct statuses first), each on the pristine database, until a
call changes its row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.behaviour_calls import Caller, Row, SeedRows, Written, row_arguments
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import excerpt
from worldsmith.quality.tool_tables import is_read_tool
from worldsmith.quality.write_effects import is_live


@dataclass(frozen=True)
class Ending:
    """A call of `tool` that ended `row` of `table` (`how`: "deleted" or "<column> -> <value>"), the child
    tables whose live rows tied to it followed, and the live tied rows of the others it left."""

    tool: str
    arguments: JsonObject
    table: str
    row: Row
    how: str
    followed: frozenset[str]
    left: dict[str, list[Row]]


def _how(seed: SeedRows, table: str, row: Row, written: Written) -> str | None:
    """How the call ended `row` of `table`: "deleted", "<status column> -> <value>", or None (it did not)."""
    diff = written.changes.tables.get(table)
    key = seed.key(table)
    if diff is None or key is None:
        return None
    mine = str(row.get(key))
    if any(str(r.get(key)) == mine for r in diff.deleted):
        return "deleted"
    for update in diff.updated:
        if str(update["key"].get(key)) != mine:
            continue
        before, after = update["before"], update["after"]
        moved = [c for c in after if ("status" in c or c == "state") and before.get(c) != after[c]]
        if moved:
            return f"{moved[0]} -> {after[moved[0]]}"
    return None


def ending(tool: str, arguments: JsonObject, seed: SeedRows, table: str, row: Row, written: Written) -> Ending | None:
    """What the call did to `row` and its live children (None: it did not end the row)."""
    how = _how(seed, table, row, written)
    if how is None:
        return None
    followed: set[str] = set()
    left: dict[str, list[Row]] = {}
    for child, rows in seed.tied(table, row).items():
        live = [r for r in rows if is_live(seed, child, r)]
        child_key = seed.key(child)
        if not live or child_key is None:
            continue
        touched = written.changes.tables.get(child)
        gone: set[str] = set()
        if touched is not None:
            gone = {str(r.get(child_key)) for r in touched.deleted}
            gone |= {str(u["key"].get(child_key)) for u in touched.updated}
        still = [r for r in live if str(r.get(child_key)) not in gone]
        if len(still) < len(live):
            followed.add(child)
        else:
            left[child] = still
    return Ending(tool, arguments, table, row, how, frozenset(followed), left)


def _rows_with_live_children(seed: SeedRows, table: str, child: str, limit: int) -> list[Row]:
    """At most `limit` rows of `table` with a live tied row of `child`, one of each status first."""
    rows = [
        r for r in seed.rows.get(table, []) if any(is_live(seed, child, x) for x in seed.tied(table, r).get(child, []))
    ]
    status = next((c for c in seed.tables[table].columns if "status" in c or c == "state"), None)
    seen: set[Any] = set()
    first: list[Row] = []
    for row in rows:
        if status is None or row.get(status) not in seen:
            seen.add(row.get(status) if status else None)
            first.append(row)
    chosen = {id(r) for r in first[:limit]}
    return (first + [r for r in rows if id(r) not in chosen])[:limit]


def endings(
    caller: Caller,
    tools: list[ToolSchema],
    seed: SeedRows,
    bases: dict[str, JsonObject],
    named: dict[str, set[str]],
    rows: int,
) -> list[Ending]:
    """For each writing tool, table with children it names and child table, its first call (of up to `rows`)
    that ends a row with live rows of that child (one call covers every child its row has live rows of)."""
    found: list[Ending] = []
    candidates: dict[tuple[str, str], list[Row]] = {}  # per table and child, chosen once
    for tool in tools:
        if is_read_tool(tool.name) or tool.name not in bases:
            continue
        for table in sorted(named.get(tool.name, set())):
            if table not in seed.tables or seed.key(table) is None:
                continue
            covered: set[str] = set()
            for child in sorted({c for c, _, _ in seed.children(table)}):
                if child in covered:
                    continue
                if (table, child) not in candidates:
                    candidates[(table, child)] = _rows_with_live_children(seed, table, child, rows)
                for row in candidates[(table, child)]:
                    arguments = row_arguments(tool, seed, table, row, bases[tool.name])
                    if arguments is None:
                        break
                    written = caller.write(tool.name, arguments)
                    if not (written.result.ok and written.result.changed):
                        continue
                    if (ended := ending(tool.name, arguments, seed, table, row, written)) is not None:
                        found.append(ended)
                        covered |= ended.followed | set(ended.left)
                    break  # the tool changed the row without ending it, or ended it: judged on this child
    return found


def dependent_pattern_probes(
    caller: Caller,
    tools: list[ToolSchema],
    seed: SeedRows,
    bases: dict[str, JsonObject],
    named: dict[str, set[str]],
    rows: int = 3,
) -> list[ProbeResult]:
    """`Probe.DEPENDENT_ROWS` by the world's own pattern; see the module docstring. Only tools ending rows of
    a table the way another tool shows a rule for are judged."""
    found = endings(caller, tools, seed, bases, named, rows)
    rules = {(e.table, e.how, child): e.tool for e in found for child in e.followed}
    results: list[ProbeResult] = []
    for ended in found:
        broken = [
            (child, left, rules[(ended.table, ended.how, child)])
            for child, left in ended.left.items()
            if rules.get((ended.table, ended.how, child), ended.tool) != ended.tool
        ]
        if broken:
            child, left, teacher = broken[0]
            results.append(
                ProbeResult.failing(
                    ProbeFailure.DEPENDENT_ROWS_LEFT,
                    ended.tool,
                    f"called with {excerpt(ended.arguments)}: it ended {ended.table} row {excerpt(ended.row)} "
                    f"({ended.how}) but left its {len(left)} live {child} (first {excerpt(left[0])}) as they were, "
                    f"while {teacher}, ending a {ended.table} row the same way, changes or removes them",
                    cause=excerpt(ended.arguments),
                )
            )
        elif any((ended.table, ended.how, child) in rules for child in ended.followed):
            results.append(
                ProbeResult.passing(Probe.DEPENDENT_ROWS, ended.tool, f"{ended.how} of {ended.table}: children follow")
            )
    return results
