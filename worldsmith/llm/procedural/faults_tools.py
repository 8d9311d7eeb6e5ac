"""Planted faults of tools that run but do the wrong thing (issue 33), for the behaviour probes to find
(quality/behaviour_probes.py; bench/probes.py measures the share found). Registered in faults.py's PLANTERS;
each rewrites tools.py of a procedural world the way a model gets it wrong and names the tool it planted in:

- `read_ignores_status_filter`: a list tool takes `status` but never applies it;
- `write_sets_wrong_column`: an update tool writes its value to another column of the row;
- `cancel_leaves_dependents`: a tool that ends a row documents that the row's children follow, and leaves them;
- `inclusive_end_treated_exclusive`: a list tool's new date (else number) bound, documented inclusive,
  compares with `<`;
- `fstring_sql_from_arguments`: a find tool formats its text argument into the SQL (a quote breaks it);
- `filter_drops_matching_rows`: a list tool pages from the second row (`OFFSET 1`): its filters drop a match;
- `documented_unit_changed`: a writing tool's number, documented in one unit (cents, mg, minutes), is
  stored as if it were another (x100);
- `documented_format_changed`: a writing tool's date, documented YYYY-MM-DD, is stored as MM/DD/YYYY;
- `dependents_left_unlike_sibling`: another tool of the world ends a row and removes its live children (the
  world's own pattern); the tool that ends rows of that table the same way leaves them.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable

from worldsmith.models.bundle import TaskSpec

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ENDING = re.compile(r"cancel|void|remov|withdr|archiv|clos|terminat|expire", re.I)


def _world(sources: dict[str, str]) -> sqlite3.Connection:
    """The procedural world's database (its own schema and seed: trusted, generated here)."""
    conn = sqlite3.connect(":memory:")
    conn.executescript(sources["schema.sql"] + "\n" + sources["seed.sql"])
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    return [(r[1], r[2].upper()) for r in conn.execute(f'PRAGMA table_info("{table}")')]


def _list_tools(tools_py: str) -> list[tuple[str, str, str]]:
    """(name, parameters, table) of each list tool."""
    return [
        (m.group(1), m.group(2), m.group(3))
        for m in re.finditer(
            r"def (list_\w+)\(conn, ([^)]*)\)[^\n]*\n(?:.*\n)*?    sql = 'SELECT \* FROM (\w+) WHERE", tools_py
        )
    ]


def _function(tools_py: str, name: str) -> tuple[int, int]:
    """Where tool `name`'s definition starts and ends in `tools_py`."""
    start = tools_py.index(f"\ndef {name}(") + 1
    following = tools_py.find("\ndef ", start)
    return start, len(tools_py) if following < 0 else following + 1


def _replace_in(sources: dict[str, str], name: str, old: str, new: str) -> None:
    """Replace `old` (which must be there) by `new` in tool `name` of tools.py."""
    tools_py = sources["tools.py"]
    start, end = _function(tools_py, name)
    body = tools_py[start:end]
    if old not in body:
        raise ValueError(f"{name} has no {old!r} to plant a fault in")
    sources["tools.py"] = tools_py[:start] + body.replace(old, new, 1) + tools_py[end:]


def _read_ignores_status_filter(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    for name, parameters, _ in _list_tools(sources["tools.py"]):
        if "status:" in parameters:
            _replace_in(
                sources, name, "        sql += ' AND status = ?'\n        params.append(status)\n", "        pass\n"
            )
            return frozenset({name})
    raise ValueError("no list tool with a status filter")


def _write_sets_wrong_column(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    conn = _world(sources)
    try:
        for match in re.finditer(
            r"def (update_\w+)\(conn, [^\n]*\n(?:.*\n)*?    conn\.execute\('UPDATE (\w+) SET (\w+) = \? WHERE id = \?'",
            sources["tools.py"],
        ):
            name, table, column = match.groups()
            kinds = dict(_columns(conn, table))
            schema = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]

            def fits(c: str) -> int:
                """How well column `c` can take the value instead: 2 unconstrained, 1 constrained, 0 not."""
                if c in (column, "id", "status") or kinds[c] != kinds[column]:
                    return 0
                constrained = re.search(rf"\b{c}\b[^,\n]*(UNIQUE|CHECK|REFERENCES)", schema)
                enum_or_key = re.search(rf"\b{c}\b[^,\n]*(\bIN \(|REFERENCES)", schema)
                return 0 if enum_or_key else 1 if constrained else 2

            others = sorted((c for c in kinds if fits(c)), key=fits, reverse=True)
            if others:
                _replace_in(sources, name, f"SET {column} = ?", f"SET {others[0]} = ?")
                return frozenset({name})
    finally:
        conn.close()
    raise ValueError("no update tool with a column of the same type to write instead")


def _ending_with_children(sources: dict[str, str], leaf: bool = False) -> tuple[str, str, str, str, str, str]:
    """The tool that moves rows of a table with live children (one that ends a row first), as (tool, table,
    child table, target status, the child's key column, a live child's status: "" when it has none); with
    `leaf`, only children no other table's rows name (they can be deleted)."""
    conn = _world(sources)
    best: tuple[int, str, str, str, str, str, str] | None = None
    try:
        pattern = r"def (\w+)\(conn, \w+: int\)[^\n]*\n(?:.*\n)*?    return _move\(conn, '(\w+)', '[^']*', \w+, \(([^)]*)\), '(\w+)'"
        for match in re.finditer(pattern, sources["tools.py"]):
            name, table, allowed, target = match.groups()
            states = re.findall(r"'(\w+)'", allowed)
            for child in [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]:
                keys = [fk for fk in conn.execute(f'PRAGMA foreign_key_list("{child}")') if fk[2] == table]
                if not keys or child == table:
                    continue
                named_by = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
                if leaf and any(
                    fk[2] == child for t in named_by for fk in conn.execute(f'PRAGMA foreign_key_list("{t}")')
                ):
                    continue
                column = keys[0][3]
                child_sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (child,)).fetchone()[0]
                first = re.search(r"status TEXT[^\n]*IN \('(\w+)'", child_sql)  # a live child: its first status
                live = f" AND c.status = '{first.group(1)}'" if first else ""
                marks = ",".join("?" * len(states))
                count = conn.execute(
                    f'SELECT COUNT(DISTINCT p.id) FROM "{table}" p JOIN "{child}" c ON c."{column}" = p.id'
                    f" WHERE p.status IN ({marks}){live}",
                    states,
                ).fetchone()[0]
                score = count * (2 if _ENDING.search(target) else 1)
                if count and (best is None or score > best[0]):
                    best = (score, name, table, child, target, column, first.group(1) if first else "")
    finally:
        conn.close()
    if best is None:
        raise ValueError("no tool that moves a row with live children")
    return best[1:]


def _cancel_leaves_dependents(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    name, _, child, _, _, _ = _ending_with_children(sources)
    start, end = _function(sources["tools.py"], name)
    docstring_end = sources["tools.py"].index("\n\n    Args:", start)
    said = f" Its {child.replace('_', ' ')} are cancelled with it."
    sources["tools.py"] = sources["tools.py"][:docstring_end] + said + sources["tools.py"][docstring_end:]
    return frozenset({name})


def _inclusive_end_treated_exclusive(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    conn = _world(sources)
    try:
        found: list[tuple[bool, str, str, str]] = []  # (a number, not a date; tool; column; its type)
        for name, _, table in _list_tools(sources["tools.py"]):
            for column, kind in _columns(conn, table):
                values = [r[0] for r in conn.execute(f'SELECT "{column}" FROM "{table}"')]
                if len(set(values)) < 3 or column == "id" or column.endswith("_id"):
                    continue
                if kind == "TEXT" and all(isinstance(v, str) and _DATE.match(v) for v in values):
                    found.append((False, name, column, "str"))
                elif kind == "INTEGER" and all(isinstance(v, int) for v in values):
                    found.append((True, name, column, "int"))
    finally:
        conn.close()
    if not found:
        raise ValueError("no list tool of a table with a date or number column")
    number, name, column, kind = min(found, key=lambda f: f[0])
    bound = f"{column}_max" if number else f"{column}_to"
    said = "at most this" if number else "on or before this date (YYYY-MM-DD)"
    _replace_in(sources, name, "limit: int = 20)", f"{bound}: {kind} | None = None, limit: int = 20)")
    _replace_in(
        sources,
        name,
        "        limit: At most",
        f"        {bound}: Only rows whose {column} is {said}, inclusive.\n        limit: At most",
    )
    _replace_in(
        sources,
        name,
        "    sql += ' ORDER BY id LIMIT ?'",
        f"    if {bound} is not None:\n        sql += ' AND {column} < ?'\n        params.append({bound})\n"
        "    sql += ' ORDER BY id LIMIT ?'",
    )
    return frozenset({name})


def _fstring_sql_from_arguments(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    pattern = r"conn\.execute\('SELECT \* FROM (\w+) WHERE (\w+) LIKE \? ORDER BY id LIMIT 20', \(f'%\{query\.strip\(\)\}%',\)\)"
    match = re.search(pattern, sources["tools.py"])
    if match is None:
        raise ValueError("no find tool to build its SQL from its argument")
    table, column = match.groups()
    built = f"""conn.execute(f"SELECT * FROM {table} WHERE {column} LIKE '%{{query.strip()}}%' ORDER BY id LIMIT 20")"""
    name = re.findall(r"\ndef (\w+)\(", sources["tools.py"][: match.start()])[-1]
    sources["tools.py"] = sources["tools.py"][: match.start()] + built + sources["tools.py"][match.end() :]
    return frozenset({name})


def _filter_drops_matching_rows(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    for name, parameters, _ in _list_tools(sources["tools.py"]):
        if re.search(r"\b(status|\w+_id):", parameters):
            _replace_in(sources, name, "' ORDER BY id LIMIT ?'", "' ORDER BY id LIMIT ? OFFSET 1'")
            return frozenset({name})
    raise ValueError("no list tool with a filter")


_UNIT_NAMED = re.compile(r"cents|mg|grams|minutes|hours|credits|kg|points|days")


def _stored_argument(sources: dict[str, str], name: str, parameter: str, stored: str) -> None:
    """Tool `name` stores `stored` (an expression of `parameter`) where its INSERT or UPDATE passed
    `parameter` itself."""
    start, end = _function(sources["tools.py"], name)
    body = sources["tools.py"][start:end]
    match = re.search(r"(    (?:cursor = )?conn\.execute\('(?:INSERT|UPDATE)[^']*', \()([^\n]*)\)\)\n", body)
    if match is None or not re.search(rf"\b{parameter}\b", match.group(2)):
        raise ValueError(f"{name} does not pass {parameter} to its write")
    passed = re.sub(rf"\b{parameter}\b", stored, match.group(2), count=1)
    body = body[: match.start(2)] + passed + body[match.end(2) :]
    sources["tools.py"] = sources["tools.py"][:start] + body + sources["tools.py"][end:]


def _documented_unit_changed(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    found = [
        (name, parameter)
        for name, parameters in re.findall(r"\ndef ((?:create|update)_\w+)\(conn, ([^)]*)\)", sources["tools.py"])
        for parameter in re.findall(r"(\w+): int\b", parameters)
        if not parameter.endswith("_id") and parameter not in ("rating", "limit")
    ]
    found.sort(key=lambda f: not _UNIT_NAMED.search(f[1]))
    for name, parameter in found:
        try:
            _stored_argument(sources, name, parameter, f"{parameter} * 100")
        except ValueError:
            continue
        return frozenset({name})
    raise ValueError("no writing tool storing a number argument")


def _documented_format_changed(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    for name, parameters in re.findall(r"\ndef ((?:create|update)_\w+)\(conn, ([^)]*)\)", sources["tools.py"]):
        start, end = _function(sources["tools.py"], name)
        for parameter in re.findall(r"(\w+): str\b", parameters):
            if f"{parameter}: " not in sources["tools.py"][start:end] or not re.search(
                rf"        {parameter}: [^\n]*YYYY-MM-DD", sources["tools.py"][start:end]
            ):
                continue
            us_date = f"'/'.join(({parameter}[5:7], {parameter}[8:10], {parameter}[:4]))"
            try:
                _stored_argument(sources, name, parameter, us_date)
            except ValueError:
                continue
            return frozenset({name})
    raise ValueError("no writing tool storing a date argument documented YYYY-MM-DD")


def _dependents_left_unlike_sibling(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    name, table, child, target, column, live = _ending_with_children(sources, leaf=True)
    start, end = _function(sources["tools.py"], name)
    body = sources["tools.py"][start:end]
    move = re.search(r"    return (_move\(conn, '\w+', '([^']*)', (\w+), \([^)]*\), '\w+'), '\w+'\)\n", body)
    if move is None:
        raise ValueError(f"{name} does not end rows through _move")
    what, key = move.group(2), move.group(3)
    sibling = f"void_{name.split('_', 1)[1]}"
    if f"def {sibling}(" in sources["tools.py"]:
        raise ValueError(f"the world already has a {sibling}")
    only_live, live_value = (" AND status = ?", f", '{live}'") if live else ("", "")
    children = child.replace("_", " ")
    sources["tools.py"] += (
        f"\n\ndef {sibling}(conn, {key}: int) -> dict | list:\n"
        f'    """Void a {what} (it becomes {target}); its {children} are removed with it.\n\n'
        f'    Args:\n        {key}: The {what}\'s id.\n    """\n'
        f"    row = {move.group(1)}, 'void')\n"
        f"    conn.execute('DELETE FROM {child} WHERE {column} = ?{only_live}', ({key}{live_value}))\n"
        "    return row\n"
    )
    return frozenset({name})


TOOL_PLANTERS: dict[str, Callable[[dict[str, str], list[TaskSpec]], frozenset[str]]] = {
    "read_ignores_status_filter": _read_ignores_status_filter,
    "write_sets_wrong_column": _write_sets_wrong_column,
    "cancel_leaves_dependents": _cancel_leaves_dependents,
    "inclusive_end_treated_exclusive": _inclusive_end_treated_exclusive,
    "fstring_sql_from_arguments": _fstring_sql_from_arguments,
    "filter_drops_matching_rows": _filter_drops_matching_rows,
    "documented_unit_changed": _documented_unit_changed,
    "documented_format_changed": _documented_format_changed,
    "dependents_left_unlike_sibling": _dependents_left_unlike_sibling,
}
