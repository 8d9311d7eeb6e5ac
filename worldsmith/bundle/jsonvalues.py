"""What the values generated code returns become in JSON: what agents read of a tool's result,
and what a judge reads of a verifier's. Stdlib only: the sandbox worker converts every result
with `json_text`; an app exported in the AgentWorldModel-1K format (worldsmith/interop/awm_export.py)
carries the source of `json_default` so that it answers the same JSON."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import sqlite3
from typing import Any

from worldsmith.errors import WorldsmithError


def json_default(value: Any) -> Any:
    """`json.dumps`'s `default`: a sqlite3.Row as a dict, a set as a list sorted by repr, bytes as
    base64 text, a date or time in ISO format, a Decimal as a float; anything else is refused."""
    if isinstance(value, sqlite3.Row):
        return dict(zip(value.keys(), tuple(value)))
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise TypeError(f"a value of type {type(value).__name__} is not JSON-serialisable")


#: How deeply a value may nest (lists, tuples, dicts, sets) to become JSON: far beyond any real
#: result, far below what the recursive encoders and decoders on either side of the sandbox
#: (the worker's, the parent's, an agent's) can take.
MAX_NESTING = 100
#: The types `json_text` nests into: what the encoder recurses into, and what `json_default`
#: turns into a list (sets); a sqlite3.Row becomes a flat dict.
_CONTAINERS = (list, tuple, dict, set, frozenset)


class TooDeep(WorldsmithError, ValueError):
    """A value nested deeper than `MAX_NESTING`."""


def check_nesting(value: Any, limit: int = MAX_NESTING) -> None:
    """TooDeep ("result nested deeper than N levels") if `value` nests more than `limit` containers
    deep; walked level by level, without recursion (a cycle is as deep as the limit allows)."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise TooDeep(f"result nested deeper than {limit} levels")
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, _CONTAINERS)
        ]


def json_text(value: Any) -> str:
    """`value` as JSON text; TypeError for a value `json_default` refuses, TooDeep for one nested
    deeper than `MAX_NESTING` (checked before the recursive encoder sees it; a container whose
    iteration answers differently the second time can still take the encoder past the interpreter's
    recursion limit, which is TooDeep too)."""
    check_nesting(value)
    try:
        return json.dumps(value, default=json_default)
    except RecursionError:
        raise TooDeep(f"result nested deeper than {MAX_NESTING} levels") from None
