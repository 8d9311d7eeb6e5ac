"""A quick acceptance test of tool arguments, before the full JSON Schema validation.

Most tool schemas are objects of scalar, enum and scalar-array parameters (what `bundle/toolspec.py`
derives from type annotations). For those, `accepts(validator, arguments)` answers True in a few
microseconds when the arguments surely match, checked with exact types; anything else (a schema of
another shape, a value it is not sure of such as 1.0 for an integer) is left to jsonschema, which
also words the refusal. True here implies jsonschema's Draft 2020-12 accepts too, never the reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema

Check = Callable[[Any], bool]

#: JSON types by the exact Python types that surely are of them (a bool is no integer; 1.0 is left to jsonschema).
_EXACT_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}
#: Keywords that never change whether a value is valid (annotations; Draft 2020-12 without a format checker).
_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "deprecated", "readOnly", "writeOnly"})
#: Compiled checks by prepared validator, the validator kept alive with its check (so its id is not reused).
_CHECKS: dict[int, tuple[jsonschema.protocols.Validator, Check | None]] = {}
_MAX_CHECKS = 4096


def _value_check(schema: Any) -> Check | None:
    """A check of one parameter's value under `schema`, or None where `schema` has another shape."""
    if not isinstance(schema, dict) or not set(schema) <= _ANNOTATIONS | {"type", "enum", "items"}:
        return None
    kinds = schema.get("type", list(_EXACT_TYPES))
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not all(isinstance(k, str) and k in _EXACT_TYPES for k in kinds):
        return None
    if "object" in kinds and "type" in schema and set(schema) - _ANNOTATIONS != {"type"}:
        return None  # an object with constraints of its own is left to jsonschema
    exact = frozenset(t for k in kinds for t in _EXACT_TYPES[k])
    items: Check | None = None
    if "items" in schema:
        items = _value_check(schema["items"])
        if items is None:
            return None
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not all(type(v) is str for v in values):
            return None
        allowed = frozenset(values)
        return lambda value: type(value) is str and str in exact and value in allowed
    if items is not None:
        check_items = items
        return lambda value: type(value) in exact and (type(value) is not list or all(map(check_items, value)))
    return lambda value: type(value) in exact


def compile_check(schema: Any) -> Check | None:
    """A quick check of arguments under tool parameter schema `schema` (an object schema), or None
    where it has a shape the check does not cover."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    if not set(schema) <= _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}:
        return None
    properties, required = schema.get("properties", {}), schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list) or not isinstance(extra, bool):
        return None
    checks = {name: _value_check(sub) for name, sub in properties.items()}
    if any(check is None for check in checks.values()) or not all(isinstance(n, str) for n in required):
        return None
    needed = tuple(required)

    def check(arguments: Any) -> bool:
        if type(arguments) is not dict or not all(name in arguments for name in needed):
            return False
        for name, value in arguments.items():
            test = checks.get(name)
            if test is None:
                if not extra:
                    return False
            elif not test(value):
                return False
        return True

    return check


def accepts(validator: jsonschema.protocols.Validator, arguments: Any) -> bool:
    """True when `arguments` surely match the schema of prepared `validator`; False: ask `validator`."""
    entry = _CHECKS.get(id(validator))
    if entry is None or entry[0] is not validator:
        if len(_CHECKS) >= _MAX_CHECKS:  # the oldest goes (another thread may have taken it already)
            oldest = next(iter(_CHECKS), None)
            if oldest is not None:
                _CHECKS.pop(oldest, None)
        entry = _CHECKS[id(validator)] = (validator, compile_check(validator.schema))
    check = entry[1]
    return check is not None and check(arguments)
