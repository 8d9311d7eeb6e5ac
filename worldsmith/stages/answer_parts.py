"""A stage's answer as a repair prompt shows it: whole, or, where it is over its budget, the parts that
must be kept (those a failure names, and a module's imports and constants) with a line naming every part
cut. Never cut silently.

An answer is the JSON object of the stage's spec (or, when it did not decode, its raw text). Each field
is shown under its name: a string field as its text, split into parts where it must be cut (a Python
module into its top-level statements, named by the function or class they define; SQL into statements,
named by their first line; other text into paragraphs); a list field as its items, one a line, named by
their `id`, `task_id` or `name`."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

from worldsmith.bundle.codepolicy import parse_source
from worldsmith.bundle.sqlscript import split_statements


@dataclass(frozen=True)
class Part:
    """One piece of an answer's field: its `name` (what a cut line calls it), its text, and whether it is
    kept whatever the failures name (`always`: a module's imports and constants)."""

    name: str
    text: str
    always: bool = False


def _fields(answer: str) -> list[tuple[str, object]]:
    try:
        value = json.loads(answer)
    except ValueError:
        return [("", answer)]
    return list(value.items()) if isinstance(value, dict) else [("", answer)]


def _item_name(item: object, index: int) -> str:
    if isinstance(item, dict):
        for key in ("task_id", "id", "name"):
            if isinstance(item.get(key), str):
                return str(item[key])
    return f"item {index + 1}"


def _python_parts(text: str) -> list[Part] | None:
    try:
        module = parse_source(text)
    except SyntaxError:
        return None
    lines = text.splitlines(keepends=True)
    parts = []
    for node in module.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        source = "".join(lines[start : node.end_lineno or node.lineno])
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            parts.append(Part(node.name, source.rstrip("\n")))
        else:
            parts.append(Part(source.split("\n")[0][:60], source.rstrip("\n"), always=True))
    return parts


def _text_parts(text: str) -> list[Part]:
    parts = _python_parts(text)
    if parts is not None and any(not p.always for p in parts):
        return parts
    if any(word in text.upper() for word in ("CREATE TABLE", "INSERT INTO")):
        return [Part(s.sql.split("\n")[0][:80], s.sql) for s in split_statements(text)]
    return [Part(p.split("\n")[0][:60], p) for p in text.split("\n\n")]


def _parts(value: object) -> list[Part]:
    if isinstance(value, str):
        return _text_parts(value)
    if isinstance(value, list):
        return [Part(_item_name(item, i), json.dumps(item)) for i, item in enumerate(value)]
    return [Part("value", json.dumps(value), always=True)]


def _heading(field: str) -> str:
    return f"[{field}]\n" if field else ""


def _shown(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(json.dumps(item) for item in value)
    return json.dumps(value)


def whole(answer: str) -> str:
    """`answer` whole: each field under its name, a string field as its text, a list one item a line."""
    return "\n".join(_heading(field) + _shown(value) for field, value in _fields(answer))


def _mentions(part: Part, subjects: set[str]) -> bool:
    name, text = part.name.casefold(), part.text.casefold()
    return any(s and (s in name or s in text) for s in subjects)


def kept_parts(answer: str, subjects: set[str], limit: int) -> str:
    """`answer` within about `limit` characters: whole when it fits; else the parts that mention one of
    `subjects` (case aside) and the parts always kept, in their order, then a line naming the parts cut.
    Kept parts still over `limit` are cut at the end, and that is said too."""
    shown = whole(answer)
    if len(shown) <= limit:
        return shown
    subjects = {s.casefold() for s in subjects if s.strip()}
    blocks, cut, count = [], [], 0
    for field, value in _fields(answer):
        parts = _parts(value)
        kept = [p for p in parts if p.always or _mentions(p, subjects)]
        names = [p.name for p in parts if p not in kept]
        count += len(names)
        cut += [f"{field}: {', '.join(names)}" if field else ", ".join(names)] if names else []
        blocks.append(_heading(field) + "\n".join(p.text for p in kept))
    text = "\n".join(blocks)
    if len(text) > limit:
        text = text[:limit] + f"\n[... the last {len(text) - limit} characters of the parts kept were cut]"
    if cut:
        text += f"\n[cut from this answer to fit the prompt ({count} parts no failure names): {'; '.join(cut)}]"
    return text
