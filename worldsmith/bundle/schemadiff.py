"""Compare a bundle's written `tools.json` with the schemas derived from `tools.py` by meaning.

Equivalent spellings are not differences: key order and layout, the order of tools, of `required`
and of `enum` values, whitespace in descriptions, an absent `required` and an empty one, a type
spelled as a string, a list or a union of bare types (`anyOf: [{"type": ...}, ...]`). Anything else
is a difference, named by tool and place (`tool_schema_differences`).
"""

from __future__ import annotations

import json
from typing import Any

from worldsmith.jsonvalue import JsonObject


def tool_schema_differences(written: Any, derived: list[JsonObject]) -> list[str]:
    """What differs in meaning between `written` (tools.json as read: any JSON) and `derived` (from
    tools.py), one line per difference naming the tool and what differs; [] when they agree."""
    if not isinstance(written, list) or not all(isinstance(t, dict) for t in written):
        return ["is not a list of tool schemas"]
    mine = {str(t.get("name")): t for t in written}
    theirs = {str(t.get("name")): t for t in derived}
    problems = [f"tool {n!r} is not in tools.py" for n in sorted(set(mine) - set(theirs))]
    problems += [f"tool {n!r} of tools.py is missing" for n in sorted(set(theirs) - set(mine))]
    for name in sorted(set(mine) & set(theirs)):
        for place in _differences(_normal(mine[name]), _normal(theirs[name]), ""):
            problems.append(f"tool {name!r}: {place}")
    return problems


def _normal(schema: Any) -> Any:
    """`schema` with equivalent spellings made one."""
    if isinstance(schema, list):
        return [_normal(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    branches = out.get("anyOf")
    if isinstance(branches, list) and branches and all(_bare_type(b) for b in branches) and "type" not in out:
        out["type"] = [kind for b in branches for kind in _kinds(b["type"])]
        del out["anyOf"]
    out = {key: _normal(value) for key, value in out.items()}
    if isinstance(out.get("description"), str):
        out["description"] = " ".join(out["description"].split())
    if _kinds(out.get("type")):
        out["type"] = sorted(set(_kinds(out["type"])))
    if out.get("required") == []:
        del out["required"]
    for unordered in ("required", "enum"):
        if isinstance(out.get(unordered), list):
            out[unordered] = sorted(out[unordered], key=lambda v: json.dumps(v, sort_keys=True))
    return out


def _kinds(spelling: Any) -> list[str]:
    """The type names of a `type` spelled as a string or a list of strings ([] for anything else)."""
    if isinstance(spelling, str):
        return [spelling]
    if isinstance(spelling, list) and spelling and all(isinstance(k, str) for k in spelling):
        return list(spelling)
    return []


def _bare_type(branch: Any) -> bool:
    return isinstance(branch, dict) and set(branch) == {"type"} and bool(_kinds(branch["type"]))


def _differences(mine: Any, theirs: Any, at: str) -> list[str]:
    """Where normalised `mine` and `theirs` differ, each as `<place>: tools.json has X, tools.py gives Y`."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        problems: list[str] = []
        for key in sorted(set(mine) | set(theirs)):
            place = f"{at}.{key}" if at else key
            if key not in mine:
                problems.append(f"{place}: missing from tools.json (tools.py gives {_short(theirs[key])})")
            elif key not in theirs:
                problems.append(f"{place}: in tools.json ({_short(mine[key])}) but not derived from tools.py")
            else:
                problems += _differences(mine[key], theirs[key], place)
        return problems
    if mine != theirs:
        return [f"{at or 'schema'}: tools.json has {_short(mine)}, tools.py gives {_short(theirs)}"]
    return []


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
