"""The arguments the deep probes call a tool with (quality/deep_probes.py): per parameter the valid values
the seeded database, the schema and the reference solutions give (keys of the tables its id parameters
name, values of CHECK-constrained enums, range boundaries, examples and defaults) and the invalid ones
(unknown ids, values outside an enum, out of range); a string that does not fit the format the
parameter declares (quality/input_formats.py) is never a valid value; per tool each value once, the reference
solutions' arguments, and Hypothesis's derandomized combinations of them all."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.input_formats import conforming
from worldsmith.quality.json_schema import declared_kinds, fits_kinds, schema_list, schema_number, schema_object
from worldsmith.quality.schema import Range
from worldsmith.quality.world_values import WorldValues, singular


def _kinds(schema: Mapping[str, JsonValue]) -> tuple[set[str], bool]:
    """The JSON types a parameter schema accepts (anyOf/oneOf included), and whether its own `type` names
    null (a null among anyOf options, as pydantic writes an optional parameter, is not probed as a value)."""
    kinds, declared = declared_kinds(schema), schema.get("type")
    nullable = declared == "null" or (isinstance(declared, list) and "null" in declared)
    return (kinds - {"null"}) or ({"string"} if not schema.get("enum") else set()), nullable


def _typed(value: Any, kinds: set[str]) -> Any:
    if isinstance(value, float) and value.is_integer() and "integer" in kinds and "number" not in kinds:
        return int(value)
    return value


def _boundaries(bounds: Range, kinds: set[str]) -> tuple[list[Any], list[Any]]:
    """Valid and invalid values at a range's ends."""
    step = 1 if "integer" in kinds or "number" not in kinds else 0.5
    valid, invalid = [], []
    if bounds.low is not None:
        low = bounds.low + step if bounds.strict_low else bounds.low
        valid.append(low)
        invalid.append(low - step)
    if bounds.high is not None:
        high = bounds.high - step if bounds.strict_high else bounds.high
        valid.append(high)
        invalid.append(high + step)
    return [_typed(v, kinds) for v in valid], [_typed(v, kinds) for v in invalid]


@dataclass
class ParameterValues:
    """The values one parameter is probed with."""

    valid: list[JsonValue] = field(default_factory=list)
    invalid: list[tuple[JsonValue, str]] = field(default_factory=list)  # (value, why it is invalid)


def parameter_values(
    name: str,
    schema: Mapping[str, JsonValue],
    values: WorldValues,
    tables: set[str],
    reference: list[Any],
) -> ParameterValues:
    """Valid and invalid values of parameter `name` (JSON Schema `schema`) of a tool owning `tables`,
    `reference` being the values the reference solutions pass it."""
    kinds, nullable = _kinds(schema)
    found = ParameterValues()
    candidates: list[Any] = list(schema_list(schema, "examples"))
    if "example" in schema:
        candidates.append(schema["example"])
    candidates += [v for v in reference if v is not None]
    enum, owned = list(schema_list(schema, "enum")), True
    if not enum:  # a CHECK of a column of that name: invalid values only where it is the tool's table's
        enum, owned = values.enum(name, tables)
    candidates += enum
    if enum and owned and all(isinstance(v, str) for v in enum):
        found.invalid.append((f"not_a_{name}", f"not one of {enum}"))
    parent = values.referenced_table(name)
    if parent is not None:
        keys, unknown = values.keys(parent)
        candidates += keys
        if unknown is not None and fits_kinds(unknown, kinds):
            found.invalid.append((unknown, f"no {singular(parent)} has it"))
    elif name in {c for t in values.tables.values() for c in t.columns}:
        candidates += values.column_values(name, tables)
    elif kinds == {"string"} and not enum:
        candidates += values.text_values(tables)
    minimum, maximum = schema_number(schema, "minimum"), schema_number(schema, "maximum")
    bounds, owned = (Range(minimum, maximum), True) if minimum is not None or maximum is not None else (None, False)
    if bounds is None:
        bounds, owned = values.range(name, tables)
    if bounds is not None and kinds & {"integer", "number"}:
        valid, invalid = _boundaries(bounds, kinds)
        candidates += valid
        if owned:
            found.invalid += [(v, "out of its range") for v in invalid]
    if "default" in schema and schema["default"] is not None:
        candidates.append(schema["default"])
    fitting = [_typed(v, kinds) for v in candidates if fits_kinds(_typed(v, kinds), kinds)]
    if not fitting and "string" in kinds:
        fitting = [str(v) for v in candidates if v is not None and not isinstance(v, (list, dict))]
    fitting = conforming(fitting, schema, name)  # a malformed value (a date that is none) is no valid input
    if not fitting:
        fitting = [_composite(schema, kinds, values, tables)] if kinds & {"array", "object"} else []
    if not fitting:
        fitting = [values.seeds.value(name, schema)]
    unique = list({json.dumps(v, sort_keys=True, default=str): v for v in fitting}.values())
    found.valid = unique[: values.bound * 2]
    if nullable:
        found.valid.append(None)
    found.invalid = [(v, why) for v, why in found.invalid if v not in found.valid]
    return found


def _composite(schema: Mapping[str, JsonValue], kinds: set[str], values: WorldValues, tables: set[str]) -> JsonValue:
    """An array of one item, or an object of its required properties, drawn like parameters."""
    if "array" in kinds:
        items = schema_object(schema, "items")
        item_kinds, _ = _kinds(items)
        if item_kinds & {"array", "object"}:
            return [_composite(items, item_kinds, values, tables)]
        return [parameter_values("item", items, values, tables, []).valid[0]]
    required = schema_list(schema, "required")
    return {
        key: parameter_values(key, sub, values, tables, []).valid[0]
        for key, sub in schema_object(schema, "properties").items()
        if key in required and isinstance(sub, dict)
    }


_HYPOTHESIS = threading.Lock()  # one Hypothesis run at a time in this process


@dataclass
class ToolInputs:
    """The argument sets one tool is probed with, and the values Hypothesis combines into more."""

    valid: list[JsonObject]
    invalid: list[tuple[JsonObject, str]]  # (arguments, what is invalid)
    required: dict[str, list[JsonValue]] = field(default_factory=dict)
    optional: dict[str, list[JsonValue]] = field(default_factory=dict)


def combinations(inputs: dict[str, ToolInputs], count: int) -> dict[str, list[JsonObject]]:
    """`count` Hypothesis draws (derandomized: the same every run) of one argument dict per tool: each
    required parameter one of its values, each optional one absent or one of its values. One run for
    every tool: a Hypothesis run costs more to start than to draw."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import strategies as st

    strategies = {
        name: st.fixed_dictionaries(
            {k: st.sampled_from(v) for k, v in found.required.items()},
            optional={k: st.sampled_from(v) for k, v in found.optional.items()},
        )
        for name, found in inputs.items()
        if found.required or found.optional
    }
    drawn: dict[str, list[JsonObject]] = {name: [] for name in strategies}
    if not strategies:
        return drawn

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(st.fixed_dictionaries(strategies))
    def collect(arguments: dict[str, JsonObject]) -> None:
        for name, one in arguments.items():
            drawn[name].append(one)

    with _HYPOTHESIS:
        collect()
    return drawn


def tool_inputs(tool: ToolSchema, values: WorldValues, tables: set[str], references: list[JsonObject]) -> ToolInputs:
    """The valid and invalid argument sets `tool` is probed with: the reference solutions' arguments,
    each value of each parameter once (the others at their first value, optional ones absent), all
    optional ones present; and each invalid value of a parameter with the others valid."""
    properties = tool.argument_schemas()
    required = [p for p in tool.required_arguments() if p in properties]
    per = {
        p: parameter_values(p, s, values, tables, [r[p] for r in references if p in r]) for p, s in properties.items()
    }
    base = {p: per[p].valid[0] for p in required if per.get(p) and per[p].valid}
    valid: list[JsonObject] = [*references, dict(base)]
    for p, found in per.items():
        valid += [{**base, p: v} for v in found.valid]
    valid.append({**base, **{p: f.valid[0] for p, f in per.items() if f.valid and f.valid[0] is not None}})
    invalid = [({**base, p: v}, f"{p} {why}") for p, found in per.items() for v, why in found.invalid]
    return ToolInputs(
        valid,
        invalid,
        {p: per[p].valid for p in required if per.get(p) and per[p].valid},
        {p: f.valid for p, f in per.items() if p not in required and f.valid},
    )


def distinct(arguments: list[JsonObject], bound: int) -> list[JsonObject]:
    """At most `bound` of `arguments`, each argument set once, in order."""
    return list({json.dumps(a, sort_keys=True, default=str): a for a in arguments}.values())[:bound]
