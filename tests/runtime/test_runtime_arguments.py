"""The quick acceptance test of tool arguments (worldsmith/runtime/arguments.py): whatever it accepts,
the full JSON Schema validation accepts too; the calls worlds really make take the quick path."""

from __future__ import annotations

import random

import jsonschema
import pytest

from worldsmith.runtime.arguments import accepts, compile_check

pytestmark = pytest.mark.unit

#: Values of every JSON type and the edge cases of each (bool vs integer, 1.0, big integers, NaN).
VALUES = [
    None,
    True,
    False,
    0,
    1,
    -5,
    2**70,
    1.0,
    1.5,
    float("nan"),
    "",
    "KB-101",
    "x",
    [],
    [1],
    ["a"],
    [1.0],
    {},
    {"a": 1},
]
#: Shapes `bundle/toolspec.py` writes (scalars, unions with null, Literal enums, lists) and shapes it leaves to jsonschema.
SHAPES = [
    {
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": {"type": "integer"}},
            "mode": {"enum": ["x", "y"], "type": "string"},
            "anything": {},
            "limit": {"type": ["number", "null"], "default": None},
            "flag": {"type": "boolean"},
        },
        "required": ["ids"],
    },
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}, "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "object", "additionalProperties": {"type": "string"}}}},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, "required": ["v"]},
]


def test_what_the_quick_check_accepts_the_schema_accepts(golden):
    draw = random.Random(24)
    schemas = [tool.parameters for tool in golden.tools] + SHAPES
    for schema in schemas:
        validator = jsonschema.Draft202012Validator(schema)
        names = [*schema.get("properties", {}), "unlisted"]
        for _ in range(400):
            arguments = {name: draw.choice(VALUES) for name in draw.sample(names, draw.randint(0, len(names)))}
            if accepts(validator, arguments):
                assert validator.is_valid(arguments), (schema, arguments)
        assert not accepts(validator, ["not", "an", "object"])
    # shapes with constraints of their own are left whole to jsonschema
    assert [compile_check(schema) is None for schema in SHAPES] == [False, True, True, True]


def test_the_golden_worlds_calls_take_the_quick_path(golden):
    steps = [step for task in golden.tasks for step in task.solution]
    assert steps
    for step in steps:
        assert accepts(golden.validators[step.tool], step.arguments), step
