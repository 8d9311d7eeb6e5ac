"""Read filters (`Probe.READ_FILTERS`): what a read tool returns for a filter argument is what that filter
selects.

A filter is a parameter of a read tool (tool_tables.is_read_tool) named for a column of the seeded database
(`status`, `customer_id`), called with values that column holds. The argument maps to a column only where the
rows the tool returns carry a key of that name: nothing is judged otherwise.

- every returned row holding that key holds the value given (text of a free-text parameter may contain it;
  an enum's or a number's must equal it): else `ProbeFailure.READ_ROW_OUTSIDE_FILTER`;
- an optional filter drops no row: every row the call without it returns that holds the value is also
  returned with it, unless that call returned as many rows as the tool ever returns (a page may cut it):
  else `ProbeFailure.READ_DROPPED_ROWS`. The call without the filter is the reference, not the database:
  conditions the tool always applies (only upcoming rows, only open ones) hold for both calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.behaviour_calls import Caller, Row, SeedRows, identity, parameter_kinds, rows_of, same_value
from worldsmith.quality.json_schema import fits_kinds
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import excerpt
from worldsmith.quality.tool_tables import is_read_tool


@dataclass(frozen=True)
class FilterBudget:
    """At most `filters` filter parameters per tool, each called with `values` of its column's values."""

    filters: int = 4
    values: int = 3


def _is_exact(schema: dict[str, JsonValue], seed: SeedRows, column: str) -> bool:
    """Whether a filter must match exactly: an enum, a CHECK-listed column, a number; else text may contain it."""
    if "enum" in schema or schema.get("type") in ("integer", "number", "boolean"):
        return True
    return any(column in t.enums for t in seed.tables.values())


def filter_values(seed: SeedRows, column: str, preferred: set[str], bound: int) -> list[Any]:
    """Up to `bound` distinct values column `column` holds (a `preferred` table's first), each held by
    fewer rows than the table has (a value every row holds filters nothing)."""
    tables = sorted(seed.columns_holding(column), key=lambda t: t not in preferred)
    for table in tables:
        rows = seed.rows.get(table, [])
        counts: dict[Any, int] = {}
        for row in rows:
            if row.get(column) is not None:
                counts[row[column]] = counts.get(row[column], 0) + 1
        values = [v for v, n in counts.items() if n < len(rows) and not isinstance(v, bytes)]
        if values:
            return values[:bound]
    return []


def _fits_schema(value: Any, schema: dict[str, JsonValue]) -> bool:
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        return False
    return fits_kinds(value, parameter_kinds(schema) or {"string"})


def _rows(caller: Caller, tool: str, arguments: JsonObject) -> list[Row] | None:
    result = caller.call(tool, arguments)
    return rows_of(result.value) if result.ok else None


def _probe_filter(
    caller: Caller,
    tool: ToolSchema,
    parameter: str,
    values: list[Any],
    base: JsonObject,
    exact: bool,
) -> ProbeResult | bool:
    """The failure one filter parameter shows, else whether any returned row carried it (it was judged)."""
    optional = parameter not in tool.required_arguments()
    unfiltered = _rows(caller, tool.name, {k: v for k, v in base.items() if k != parameter}) if optional else None
    results: list[tuple[Any, JsonObject, list[Row]]] = []
    for value in values:
        arguments = {**base, parameter: value}
        rows = _rows(caller, tool.name, arguments)
        if rows is not None:
            results.append((value, arguments, rows))
    cap = max([len(r) for _, _, r in results] + [len(unfiltered or [])], default=0)
    judged = False
    for value, arguments, rows in results:
        judged = judged or any(parameter in r for r in rows)
        outside = [r for r in rows if parameter in r and not same_value(r[parameter], value, contains=not exact)]
        if outside:
            detail = (
                f"called with {excerpt(arguments)}, it returned {len(outside)} of {len(rows)} rows whose {parameter}"
                f" is not {value!r} (first {excerpt(outside[0])}): the {parameter} filter is not applied"
            )
            return ProbeResult.failing(ProbeFailure.READ_ROW_OUTSIDE_FILTER, tool.name, detail, cause=parameter)
        if unfiltered is None or len(rows) >= cap or not any(parameter in r for r in rows + unfiltered):
            continue
        returned = {identity(r) for r in rows}
        dropped = [
            r
            for r in unfiltered
            if parameter in r and same_value(r[parameter], value, contains=not exact) and identity(r) not in returned
        ]
        if dropped:
            detail = (
                f"called with {excerpt(arguments)}, it left out {len(dropped)} rows with {parameter} {value!r} that the"
                f" call without {parameter} returns (first {excerpt(dropped[0])}): the filter drops matching rows"
            )
            return ProbeResult.failing(ProbeFailure.READ_DROPPED_ROWS, tool.name, detail, cause=parameter)
    return judged


def read_filter_probes(
    caller: Caller,
    tools: list[ToolSchema],
    seed: SeedRows,
    bases: dict[str, JsonObject],
    named: dict[str, set[str]],
    budget: FilterBudget | None = None,
) -> list[ProbeResult]:
    """`Probe.READ_FILTERS` of every read tool with a filter parameter (`bases`: each tool's ordinary valid
    arguments; `named`: the tables each names); see the module docstring."""
    budget = budget or FilterBudget()
    results: list[ProbeResult] = []
    columns = {c for t in seed.tables.values() for c in t.columns}
    for tool in tools:
        if not is_read_tool(tool.name) or tool.name not in bases:
            continue
        schemas = tool.argument_schemas()
        filters = [p for p in schemas if p in columns][: budget.filters]
        failure: ProbeResult | None = None
        tried = 0
        for parameter in filters:
            schema = schemas[parameter]
            values = [
                v
                for v in filter_values(seed, parameter, named.get(tool.name, set()), budget.values)
                if _fits_schema(v, schema)
            ]
            if not values:
                continue
            exact = _is_exact(schema, seed, parameter)
            found = _probe_filter(caller, tool, parameter, values, bases[tool.name], exact)
            if isinstance(found, ProbeResult):
                failure = found
                break
            tried += found
        if failure is not None:
            results.append(failure)
        elif tried:
            results.append(ProbeResult.passing(Probe.READ_FILTERS, tool.name, f"{tried} filters hold"))
    return results
