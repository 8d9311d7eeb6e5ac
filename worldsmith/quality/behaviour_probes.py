"""Behaviour probes: tools that run but do the wrong thing, found from each tool's spec (its schema and
description), its SQL (tools.py) and the seed. `check_environment` runs them (quality/probes.py); each
failure names the tool, the input and the rule, and is the tool code's to repair (stages/routing.py):

- read filters (quality/read_filters.py): returned rows hold the filter's value; no matching row dropped;
- documented range bounds (quality/range_bounds.py): inclusive/exclusive holds at the boundary value;
- write effects and dependent rows (quality/write_effects.py): arguments land in the columns they name;
  a deleted or cancelled row's dependants follow, as the schema, the tool's description and the world's
  other tools (quality/dependent_patterns.py) say; numbers and dates keep their unit and format;
- no SQL text built from arguments (quality/sql_injection.py): statically in tools.py, and by injection.

All calls run on one episode, each on the pristine database. Where an argument's column is not certain,
nothing is judged.
"""

from __future__ import annotations

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.behaviour_calls import Caller, SeedRows
from worldsmith.quality.dependent_patterns import dependent_pattern_probes
from worldsmith.quality.probe_results import ProbeResult
from worldsmith.quality.range_bounds import range_bound_probes
from worldsmith.quality.read_filters import read_filter_probes
from worldsmith.quality.sql_injection import injection_probes, static_probes
from worldsmith.quality.tool_calls import reference_arguments
from worldsmith.quality.tool_inputs import distinct, tool_inputs
from worldsmith.quality.tool_tables import is_read_tool, named_tables
from worldsmith.quality.world_values import WorldValues, world_values
from worldsmith.quality.write_effects import write_effect_probes
from worldsmith.runtime.episode import Runtime

#: A read tool's base arguments are the first of this many ordinary inputs its call answers (ok).
_BASE_TRIES = 4


def entity_tables(tool: ToolSchema, values: WorldValues) -> set[str]:
    """The tables `tool` acts on: those its name or description names (irregular plurals too: `singular`),
    and those its id parameters are keys of."""
    found = named_tables(tool, values.tables)
    for parameter in tool.argument_schemas():
        parent = values.referenced_table(parameter)
        if parent is not None and parent in values.tables:
            found.add(parent)
    return found


def _bases(
    caller: Caller,
    tools: list[ToolSchema],
    values: WorldValues,
    named: dict[str, set[str]],
    references: dict[str, list[JsonObject]],
) -> dict[str, JsonObject]:
    """Each tool's ordinary valid arguments: a reference call's, else the first ordinary input a read
    answers (a writing tool: its first ordinary input, not called here)."""
    bases: dict[str, JsonObject] = {}
    for tool in tools:
        refs = references.get(tool.name, [])
        candidates = distinct(tool_inputs(tool, values, named[tool.name], refs).valid, _BASE_TRIES)
        if not is_read_tool(tool.name):
            if candidates:
                bases[tool.name] = candidates[0]
            continue
        answered = next((c for c in candidates if caller.call(tool.name, c).ok), None)
        if answered is not None:
            bases[tool.name] = answered
    return bases


def behaviour_probes(runtime: Runtime, bundle: Bundle, *, skip: frozenset[str] = frozenset()) -> list[ProbeResult]:
    """The behaviour probes of every tool but those in `skip` (already found crashing); see the module
    docstring."""
    tools = [t for t in bundle.tools if t.name not in skip]
    values = world_values(bundle.world, 8)
    seed = SeedRows(values)
    named = {t.name: entity_tables(t, values) for t in tools}
    references = reference_arguments(bundle)
    source = bundle.files.get("tools.py")
    static = static_probes(source.decode() if source is not None else None, tools)
    with runtime.open_episode(bundle) as episode:
        caller = Caller(episode, bundle.world)
        bases = _bases(caller, tools, values, named, references)
        results = read_filter_probes(caller, tools, seed, bases, named)
        results += range_bound_probes(caller, tools, bases)
        results += write_effect_probes(caller, tools, seed, bases, named, references)
        results += dependent_pattern_probes(caller, tools, seed, bases, named)
        results += injection_probes(caller, tools, bases, static)
    return results
