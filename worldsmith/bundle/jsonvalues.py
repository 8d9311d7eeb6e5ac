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


def json_text(value: Any) -> str:
    """`value` as JSON text; TypeError for a value `json_default` refuses."""
    return json.dumps(value, default=json_default)
