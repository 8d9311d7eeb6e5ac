"""Documented range boundaries (`Probe.RANGE_BOUNDARIES`): a date or number bound documented inclusive (or
exclusive) is so at the boundary value.

A bound is a parameter of a read tool named for one end of a range (`to_date`, `end_date`, `max_price`;
`from_date`, `min_rating`) whose description, or its tool's, says how it holds: "inclusive", "on or before",
"at most" ... or "exclusive", "strictly". The boundary values are taken from the rows the tool returns:
a value x a row holds, and its neighbour one step outside (a day; 1 for an integer, 0.01 else). The rows
returned at x and at the neighbour tell which key of the rows the bound filters on and how: at an inclusive
upper bound x, rows hold key <= x and the rows the neighbour x+1 adds hold x < key <= x+1; at an exclusive
one, key < x and x <= key < x+1. A bound is judged wrong (`ProbeFailure.RANGE_BOUNDARY_BROKEN`) only when
some key is consistent with the other reading and none with the documented one, on rows that differ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import Any

from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.behaviour_calls import Caller, Row, identity, parameter_kinds, rows_of
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import excerpt
from worldsmith.quality.tool_tables import is_read_tool
from worldsmith.quality.world_values import words

_DAY = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:[T ][\d:.]+(?:Z|[+-]\d{2}:?\d{2})?)?$")
_UPPER = frozenset({"to", "end", "until", "till", "before", "max", "maximum", "through", "thru", "last", "latest"})
_LOWER = frozenset({"from", "start", "since", "after", "min", "minimum", "earliest", "first", "begin"})
#: Words of a parameter that counts rows, not values (`max_results`): no bound of a range.
_COUNTS = frozenset({"result", "row", "item", "count", "limit", "page", "size", "per"})
_INCLUSIVE = re.compile(
    r"\binclusive\b|\bon or (before|after)\b|\bno (later|earlier) than\b|\bat (most|least)\b|\bor (earlier|later)\b"
    r"|\bup to and including\b|\bthrough\b",
    re.IGNORECASE,
)
_EXCLUSIVE = re.compile(r"\bexclusive\b|\bstrictly\b", re.IGNORECASE)
_NOT_INCLUSIVE = re.compile(r"\bnot inclusive\b|\bnon-inclusive\b", re.IGNORECASE)


@dataclass(frozen=True)
class Bound:
    """One documented bound: the parameter, which end it is, how it is documented, its kind and step."""

    parameter: str
    upper: bool
    inclusive: bool
    dates: bool
    step: float


def documented(text: str) -> bool | None:
    """Whether `text` documents a bound inclusive (True), exclusive (False), or says neither (None)."""
    if _NOT_INCLUSIVE.search(text) or _EXCLUSIVE.search(text):
        return None if _INCLUSIVE.search(_NOT_INCLUSIVE.sub("", text)) else False
    return True if _INCLUSIVE.search(text) else None


def bounds(tool: ToolSchema, base: JsonObject) -> list[Bound]:
    """The documented bounds among `tool`'s parameters (`base`: its ordinary arguments, for their shape)."""
    found = []
    for parameter, schema in tool.argument_schemas().items():
        described = str(schema.get("description") or "")
        said = documented(described)
        if said is None and sum(1 for w in ("inclusive", "exclusive") if w in tool.description.lower()) == 1:
            said = documented(tool.description)
        if said is None:
            continue
        name = words(parameter)
        lowered = described.lower()
        if set(name) & _COUNTS:
            continue
        if ("on or before" in lowered) != ("on or after" in lowered):
            upper = "on or before" in lowered
        else:  # the last word of the name that says an end: `starts_on_to` is an upper bound
            ends = [w for w in reversed(name) if w in _UPPER or w in _LOWER]
            if not ends:
                continue
            upper = ends[0] in _UPPER
        kinds = parameter_kinds(schema)
        sample = base.get(parameter)
        if kinds and kinds <= {"integer", "number"}:
            found.append(Bound(parameter, upper, said, False, 1 if kinds == {"integer"} else 0.01))
        elif (isinstance(sample, str) and len(sample) == 10 and _DAY.match(sample)) or (
            sample is None and ("YYYY-MM-DD" in described or schema.get("format") == "date")
        ):
            found.append(Bound(parameter, upper, said, True, 1))
    return found


def _ordinal(value: Any, dates: bool) -> float | None:
    if dates:
        match = _DAY.match(value) if isinstance(value, str) else None
        if match is None:
            return None
        try:
            return float(date.fromisoformat(match.group(1)).toordinal())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _argument(x: float, bound: Bound) -> JsonValue:
    if bound.dates:
        return date.fromordinal(int(x)).isoformat()
    return int(x) if bound.step == 1 and float(x).is_integer() else round(x, 2)


def _consistent(at: list[Row], added: list[Row], key: str, x: float, bound: Bound, inclusive: bool) -> bool:
    """Whether rows `at` (returned at bound x) and `added` (what the neighbour adds) read as key filtered by
    the bound, `inclusive` or not."""
    at_values = [_ordinal(r.get(key), bound.dates) for r in at]
    added_values = [_ordinal(r.get(key), bound.dates) for r in added]
    if not added_values or any(v is None for v in at_values + added_values):
        return False
    s = bound.step
    if bound.upper:
        holds_at = all(v <= x if inclusive else v < x for v in at_values if v is not None)
        holds_added = all((x < v <= x + s) if inclusive else (x <= v < x + s) for v in added_values if v is not None)
    else:
        holds_at = all(v >= x if inclusive else v > x for v in at_values if v is not None)
        holds_added = all((x - s <= v < x) if inclusive else (x - s < v <= x) for v in added_values if v is not None)
    return holds_at and holds_added


def _rows(caller: Caller, tool: str, arguments: JsonObject) -> list[Row] | None:
    result = caller.call(tool, arguments)
    return rows_of(result.value) if result.ok else None


def _candidates(rows: list[Row], bound: Bound, limit: int) -> list[float]:
    """Boundary values the rows hold (spread over them), of any key of the bound's kind."""
    values = sorted({v for r in rows for k, raw in r.items() if k != "id" and (v := _ordinal(raw, bound.dates))})
    if len(values) <= limit:
        return values
    return [values[round(i * (len(values) - 1) / (limit - 1))] for i in range(limit)] if limit > 1 else values[:1]


def _probe_bound(caller: Caller, tool: ToolSchema, bound: Bound, base: JsonObject, tries: int) -> ProbeResult | None:
    """The failure one bound shows (None: none, or nothing to judge by)."""
    p = bound.parameter
    rows = _rows(caller, tool.name, base) or []
    if p not in tool.required_arguments():
        rows += _rows(caller, tool.name, {k: v for k, v in base.items() if k != p}) or []
    for x in _candidates(rows, bound, tries):
        neighbour = x + bound.step if bound.upper else x - bound.step
        at_arguments = {**base, p: _argument(x, bound)}
        at = _rows(caller, tool.name, at_arguments)
        beyond = _rows(caller, tool.name, {**base, p: _argument(neighbour, bound)})
        if at is None or beyond is None:
            continue
        returned = {identity(r) for r in at}
        added = [r for r in beyond if identity(r) not in returned]
        keys = {k for r in at + added for k in r if k != "id"}
        documented_keys = [k for k in keys if _consistent(at, added, k, x, bound, bound.inclusive)]
        other_keys = [k for k in keys if _consistent(at, added, k, x, bound, not bound.inclusive)]
        if other_keys and not documented_keys:
            said = "inclusive" if bound.inclusive else "exclusive"
            treated = "exclusive" if bound.inclusive else "inclusive"
            shown = _argument(x, bound)
            detail = (
                f"{p} is documented {said}, but called with {excerpt(at_arguments)} it treats {shown!r} as {treated}:"
                f" the rows whose {other_keys[0]} is at the bound (first {excerpt(added[0])}) are "
                f"{'left out' if bound.inclusive else 'returned'}"
            )
            return ProbeResult.failing(ProbeFailure.RANGE_BOUNDARY_BROKEN, tool.name, detail, cause=p)
    return None


def range_bound_probes(
    caller: Caller, tools: list[ToolSchema], bases: dict[str, JsonObject], tries: int = 3
) -> list[ProbeResult]:
    """`Probe.RANGE_BOUNDARIES` of every read tool with a documented bound (`bases`: each tool's ordinary
    valid arguments); see the module docstring."""
    results: list[ProbeResult] = []
    for tool in tools:
        if not is_read_tool(tool.name) or tool.name not in bases:
            continue
        found = bounds(tool, bases[tool.name])
        failure = next(
            (f for b in found if (f := _probe_bound(caller, tool, b, bases[tool.name], tries)) is not None), None
        )
        if failure is not None:
            results.append(failure)
        elif found:
            results.append(
                ProbeResult.passing(Probe.RANGE_BOUNDARIES, tool.name, f"{len(found)} documented bounds hold")
            )
    return results
