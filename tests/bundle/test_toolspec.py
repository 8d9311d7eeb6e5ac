"""Deriving JSON Schemas from tool signatures and docstrings, and the static code policy."""

from __future__ import annotations

import pytest

from worldsmith.bundle.codepolicy import check_source
from worldsmith.bundle.toolspec import derive_tool_schemas, parse_docstring

pytestmark = pytest.mark.unit

SOURCE = '''
from typing import Literal, Optional

def search(conn, query: str, limit: int = 10, kinds: list[str] | None = None, mode: Literal["fast", "full"] = "fast",
           price: Optional[float] = None, filters: dict[str, int] | None = None, exact: bool = False) -> list:
    """Search things.

    Longer explanation on a second paragraph.

    Args:
        query: What to look for.
        limit: How many results,
            at most.
        kinds (list): Kinds to include.
        mode: Search mode.
        price: Highest price.
        filters: Column filters.
        exact: Exact matching only.

    Returns:
        The matches.
    """

def _helper(conn):
    pass
'''


def test_schema_of_every_supported_annotation():
    tools, issues = derive_tool_schemas(SOURCE)
    assert issues == []
    (tool,) = tools
    assert tool["name"] == "search"
    assert tool["description"] == "Search things. Longer explanation on a second paragraph."
    props = tool["parameters"]["properties"]
    assert tool["parameters"]["required"] == ["query"]
    assert tool["parameters"]["additionalProperties"] is False
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["limit"] == {"type": "integer", "description": "How many results, at most.", "default": 10}
    assert props["kinds"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
        "description": "Kinds to include.",
        "default": None,
    }
    assert props["mode"] == {
        "enum": ["fast", "full"],
        "type": "string",
        "description": "Search mode.",
        "default": "fast",
    }
    assert props["price"]["type"] == ["number", "null"]
    assert props["filters"]["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["exact"]["type"] == "boolean"


def test_defects_are_reported_with_lines():
    source = 'def a(conn, x):\n    """Doc.\n\n    Args:\n        x: thing.\n    """\n\ndef b(conn, y: set[int] | complex):\n    """Doc.\n\n    Args:\n        y: thing.\n    """\n\ndef c(*args):\n    """Doc."""\n'
    _, issues = derive_tool_schemas(source)
    text = [str(i) for i in issues]
    assert "tools.py:1: tool 'a': argument 'x' has no type annotation" in text
    assert any(t.startswith("tools.py:8: tool 'b': argument 'y' has an unsupported type annotation") for t in text)
    assert "tools.py:15: tool 'c': *args/**kwargs are not allowed; name every argument" in text


def test_docstring_sections():
    description, args = parse_docstring(
        "Do it.\n\nArgs:\n    a (int): first\n      continued\n    b: second\nRaises:\n    ToolError: never"
    )
    assert description == "Do it."
    assert args == {"a": "first continued", "b": "second"}


def test_code_policy():
    assert (
        check_source("import json\nfrom datetime import date\nfrom worldsmith.runtime import ToolError\n", "tools.py")
        == []
    )
    problems = dict(
        check_source(
            "import os\nfrom subprocess import run\nx = eval('1')\ny = ().__class__\nz = getattr(1, '__doc__')\nfrom worldsmith.runtime import Guard\n",
            "tools.py",
        )
    )
    assert "import of 'os' is not allowed" in problems[1]
    assert "import from 'subprocess' is not allowed" in problems[2]
    assert problems[3] == "use of 'eval' is not allowed"
    assert problems[4] == "access to attribute '__class__' is not allowed"
    assert "private attribute '__doc__'" in problems[5]
    assert "only ToolError may be imported" in problems[6]
    assert check_source("def f(:\n", "verifiers.py")[0][1].startswith("syntax error")
    assert check_source("import operator\nget = operator.attrgetter('__globals__')\n", "tools.py") == [
        (2, "string naming the attribute '__globals__' is not allowed")
    ]
