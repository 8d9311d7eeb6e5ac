"""Row ids a verifier names that only this seed has: found statically, from verifiers.py's syntax tree and the
seeded database.

A verifier that reads `appointments` row 7 where its task says "APT-58213" judges this seed only: regenerate
the seed, or let the agent create rows in another order, and it checks the wrong row. In a task's verifier
function, an integer literal is read as a row id where the code says so:

- in SQL text: `id = 7`, `appointment_id = 7`, `id IN (7, 9)` (the table: the one the text reads for `id`,
  the one the column is named after otherwise);
- as a call's argument beside a table's name: `_value(final, 'appointments', 7, 'status')`;
- compared with a row's id column: `row["appointment_id"] == 7`.

It is flagged when it is a row id of that table in the seed, or the id the table's next row gets, and
neither the task's instruction nor its reference solution's arguments name it (an id the solution passes is
one the agent finds with the tools: the verifier may check that very row), nor is it an id a row the
solution names by id points at (order 1009's `customer_id`: the task fixes that row as well).
"""

from __future__ import annotations

import ast
import re
import sqlite3
from collections.abc import Iterator

from worldsmith.bundle.codepolicy import parse_source
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonValue
from worldsmith.models.bundle import TaskSpec
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.verifier_mutations import singulars

#: SQL comparing an id column with integer literals: the column and the literals.
_SQL_ID = re.compile(r"\b(\w*id)\"?\s*(?:==?|IN\s*\()\s*(\d+(?:\s*,\s*\d+)*)", re.IGNORECASE)
_SQL_TABLE = re.compile(r"\b(?:FROM|UPDATE|INTO|JOIN)\s+\"?(\w+)", re.IGNORECASE)


def seed_ids(world: bytes) -> dict[str, set[int]]:
    """Each table's integer row ids in the seed, with the id its next row gets."""
    conn = sqlite3.connect(":memory:")
    conn.deserialize(world)
    found: dict[str, set[int]] = {}
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"):
        try:
            ids = {r[0] for r in conn.execute(f'SELECT rowid FROM "{table}"') if isinstance(r[0], int)}
        except sqlite3.Error:  # a WITHOUT ROWID table has no row ids to hard-code
            continue
        found[table] = ids | {max(ids, default=0) + 1}
    conn.close()
    return found


def _table_of(column: str, sql_tables: list[str], tables: dict[str, set[int]]) -> str | None:
    """The table whose ids `column` holds: for `id`, the first table the SQL reads; for `x_id`, the table
    whose row is an x."""
    if column.lower() == "id":
        return next((t for t in sql_tables if t in tables), None)
    named = column.lower().removesuffix("_id")
    return next((t for t in tables if named in singulars(t)), None)


def _literal_ids(function: ast.FunctionDef, tables: dict[str, set[int]]) -> Iterator[tuple[str | None, int, str]]:
    """(table or None, id, where) of every integer literal `function` uses as a row id."""
    for node in ast.walk(function):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            sql_tables = _SQL_TABLE.findall(node.value)
            for column, literals in _SQL_ID.findall(node.value):
                for literal in re.findall(r"\d+", literals):
                    yield _table_of(column, sql_tables, tables), int(literal), f"SQL {column} = {literal}"
        elif isinstance(node, ast.Call):
            named = [a.value for a in node.args if isinstance(a, ast.Constant) and a.value in tables]
            for arg in node.args:
                if named and isinstance(arg, ast.Constant) and type(arg.value) is int:
                    yield str(named[0]), arg.value, f"argument {arg.value} beside table {named[0]!r}"
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript):
            key = node.left.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.endswith("id"):
                for right in node.comparators:
                    if isinstance(right, ast.Constant) and type(right.value) is int:
                        yield _table_of(key.value, [], tables), right.value, f"[{key.value!r}] == {right.value}"


def _named(task: TaskSpec, conn: sqlite3.Connection, tables: dict[str, set[int]]) -> set[int]:
    """The integers a task's instruction and its reference solution's arguments name, with the ids the rows
    its solution names by id point at (order 1009's customer: the task fixes that row too)."""
    undated = re.sub(r"\d{4}-\d{2}-\d{2}(?:[T ][\d:.]+)?", " ", task.instruction)  # no id is part of a date
    numbers = {int(n) for n in re.findall(r"\d+", undated)}
    by_id: list[tuple[str, int]] = []

    def walk(value: JsonValue, key: str = "") -> None:
        if type(value) is int or isinstance(value, str) and value.isdigit():
            numbers.add(int(value))
            if key == "id" or key.endswith("_id"):
                by_id.append((key, int(value)))
        elif isinstance(value, dict):
            for name, item in value.items():
                walk(item, name)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)

    for step in task.solution:
        walk(step.arguments)
    for key, value in by_id:
        table = _table_of(key, [], tables)
        if table is not None:
            cursor = conn.execute(f'SELECT * FROM "{table}" WHERE rowid = ?', (value,))
            columns = [d[0] for d in cursor.description]
            for row in cursor.fetchall():
                numbers |= {v for c, v in zip(columns, row) if c.endswith("_id") and type(v) is int}
    return numbers


def seed_id_results(bundle: Bundle) -> list[ProbeResult]:
    """Per task with a verifier in verifiers.py: `Probe.NO_SEED_IDS`, failed naming the first row id only
    this seed has that its verifier reads."""
    source = bundle.files.get("verifiers.py")
    if source is None:
        return []
    try:
        tree = parse_source(source.decode(), "verifiers.py")
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return []  # a verifier module that does not parse fails to load: the probes that run it say so
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    tables = seed_ids(bundle.world)
    conn = sqlite3.connect(":memory:")
    conn.deserialize(bundle.world)
    results = []
    for task in bundle.tasks:
        function = functions.get(task.verifier)
        if function is None:
            continue
        named = _named(task, conn, tables)
        hard_coded = [
            (table, value, where)
            for table, value, where in _literal_ids(function, tables)
            if value not in named
            and (value in tables[table] if table else any(value in ids for ids in tables.values()))
        ]
        if hard_coded:
            table, value, where = hard_coded[0]
            detail = (
                f"verifier {task.verifier} reads row id {value}{f' of {table}' if table else ''} ({where}), which "
                "neither the task nor its reference solution names: look the row up by what the task says"
            )
            results.append(ProbeResult.failing(ProbeFailure.SEED_ID_HARD_CODED, task.id, detail, cause=where))
        else:
            results.append(ProbeResult.passing(Probe.NO_SEED_IDS, task.id, "no seed-only id"))
    conn.close()
    return results
