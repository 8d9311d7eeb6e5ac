"""The seeded database as the later stages need to see it: which rows hold the values the tasks
name (the coverage check after seeding), and a bounded view of the rows the tasks touch with the
ids the next inserted rows will get (what a stateless model writing tools, verifiers and reference
solutions needs).

A task names records by literal values: its `entities`, the acting user's identifier, and the
quoted strings, emails, `#<number>` ids and codes of its instruction. A value matches a cell when
they are equal as text, case-insensitively, or as numbers (42, "42" and "#42" match 42). A task also
names the records whose text values its instruction holds as words (an unquoted "Maria Lopez"), and
the tables it filters on: those its words name ("the cheapest walker": walkers) and those the tools
read; the view shows their rows after the first rows of every table."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from worldsmith.bundle.sqlscript import deserialize
from worldsmith.models.specs import TaskList
from worldsmith.quality.world_values import singular

#: The most characters a seed view takes in a prompt.
SEED_VIEW_CHARS = 12_000
#: ... in the tools stage's prompts (formats of codes, timestamps and amounts; the rows the tasks touch).
TOOLS_VIEW_CHARS = 6_000
#: The shortest text value matched as words of an instruction.
MENTION_CHARS = 4
#: Rows shown of a table no task names (the first ones by rowid).
SAMPLE_ROWS = 3
CELL_CHARS = 80
#: A value held by more rows of a table than this does not identify a row of it.
IDENTIFYING_ROWS = 3
MORE_ROWS_CHARS = 24  # "  ... <n> more rows"

_QUOTED = re.compile(r"'([^'\n]{1,120})'|\"([^\"\n]{1,120})\"|“([^”\n]{1,120})”")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_HASH_ID = re.compile(r"#\s?(\d+)")
_CODE = re.compile(r"\b(?=[A-Z0-9-]*\d)(?=[A-Z0-9-]*[A-Z])[A-Z0-9]+(?:-[A-Z0-9]+)*\b")
_QUERIED = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE)\s+[\"`\[]?(\w+)", re.IGNORECASE)
_WORD = re.compile(r"[a-z][a-z0-9_]*")


def _key(value: Any) -> str | None:
    """The comparable form of a cell or literal: numbers as their integer text where integral,
    text stripped and case-folded."""
    if value is None or isinstance(value, bytes):
        return None
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    text = str(value).strip().casefold()
    return _key(float(text.replace(",", ""))) if re.fullmatch(r"-?[\d,]*\.?\d+", text) else text


def literal_keys(literal: str) -> set[str]:
    """The keys a named value may match: itself, and without surrounding quotes, a leading '#' or
    trailing punctuation; a number after '#' ("order #12")."""
    text = literal.strip().strip("'\"“”`").strip()
    keys = {_key(text), _key(text.lstrip("#").strip()), _key(text.rstrip(".,;:!?"))}
    hashed = _HASH_ID.fullmatch(text) or re.fullmatch(r".*?#\s?(\d+)", text)
    if hashed:
        keys.add(_key(hashed.group(1)))
    return {k for k in keys if k}


def instruction_literals(instruction: str) -> list[str]:
    """The values an instruction names records by: quoted strings, emails, `#<n>` ids and codes."""
    found = [next(g for g in m.groups() if g) for m in _QUOTED.finditer(instruction)]
    found += _EMAIL.findall(instruction)
    found += [f"#{n}" for n in _HASH_ID.findall(instruction)]
    found += _CODE.findall(instruction)
    return list(dict.fromkeys(found))


def named_by_tasks(tasks: TaskList) -> list[str]:
    """Every value the tasks name records by (entities, the acting user, the instructions' literals)."""
    values = [tasks.acting_user.identifier] if tasks.acting_user.identifier else []
    for task in tasks.tasks:
        values += task.entities + instruction_literals(task.instruction)
    return list(dict.fromkeys(values))


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[tuple[int, tuple[Any, ...]]]  # (rowid, values)
    key: int | None = None  # the position of its single primary-key column
    parents: list[tuple[str, str, str]] = field(default_factory=list)  # (column, parent table, parent column)
    next_id: int | None = None  # the id the next inserted row gets (INTEGER PRIMARY KEY tables)

    def named(self, texts: set[str], numbers: set[str]) -> list[int]:
        """The rows holding one of `texts` in a cell, or one of `numbers` as primary key (rowid). A text
        held by more than IDENTIFYING_ROWS rows (a status, a category) names none of them."""
        by_text: dict[str, list[int]] = {}
        found = []
        for index, (rowid, row) in enumerate(self.rows):
            if _key(rowid if self.key is None else row[self.key]) in numbers:
                found.append(index)
            for key in texts & {_key(v) for v in row}:
                by_text.setdefault(key, []).append(index)
        found += [i for rows in by_text.values() if len(rows) <= IDENTIFYING_ROWS for i in rows]
        return sorted(set(found))

    def column_keys(self, column: str) -> list[str | None]:
        """Each row's key of `column` (the rowid for "rowid")."""
        if column not in self.columns:
            return [_key(rowid) for rowid, _ in self.rows]
        position = self.columns.index(column)
        return [_key(row[position]) for _, row in self.rows]


def _tables(conn: sqlite3.Connection) -> list[Table]:
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        )
    ]
    sequences = (
        dict(conn.execute("SELECT name, seq FROM sqlite_sequence").fetchall())
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone()
        else {}
    )
    tables = []
    for name in names:
        info = conn.execute(f'PRAGMA table_info("{name}")').fetchall()  # cid, name, type, notnull, default, pk
        columns = [c[1] for c in info]
        keys = [c for c in info if c[5]]
        key = keys[0][0] if len(keys) == 1 else None
        rowid_alias = key is not None and keys[0][2].strip().upper() == "INTEGER"
        try:
            rows = [(r[0], tuple(r[1:])) for r in conn.execute(f'SELECT rowid, * FROM "{name}" ORDER BY rowid')]
        except sqlite3.OperationalError:  # a WITHOUT ROWID table
            rows = [(i, tuple(r)) for i, r in enumerate(conn.execute(f'SELECT * FROM "{name}"'), start=1)]
            rowid_alias = False
        parents = [(fk[3], fk[2], fk[4] or "rowid") for fk in conn.execute(f'PRAGMA foreign_key_list("{name}")')]
        highest = max((rowid for rowid, _ in rows), default=0)
        next_id = max(highest, sequences.get(name, 0)) + 1 if rowid_alias else None
        tables.append(Table(name, columns, rows, key, parents, next_id))
    return tables


def _open(world: bytes) -> list[Table]:
    conn = deserialize(world, read_only=True)
    try:
        return _tables(conn)
    finally:
        conn.close()


def missing_entities(world: bytes, tasks: TaskList) -> dict[str, list[str]]:
    """Per task id (and "acting user"), the entities it names that no row of `world` holds."""
    held = {_key(value) for table in _open(world) for _, row in table.rows for value in row} - {None}
    missing: dict[str, list[str]] = {}
    identifier = tasks.acting_user.identifier
    if identifier and not literal_keys(identifier) & held:
        missing["acting user"] = [identifier]
    for task in tasks.tasks:
        absent = [e for e in task.entities if e.strip() and not literal_keys(e) & held]
        if absent:
            missing[task.id] = absent
    return missing


def _cell(value: Any) -> str:
    text = repr(value) if not isinstance(value, bytes) else f"<{len(value)} bytes>"
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 4] + "...'"


def mentioned_values(tables: list[Table], texts: Iterable[str]) -> set[str]:
    """The keys of the text cells (at least MENTION_CHARS long, with a letter) that `texts` hold as whole
    words, case aside: the records an instruction names without quotes."""
    blob = "\n".join(texts).casefold()
    if not blob:
        return set()
    cells = {_key(v) for t in tables for _, row in t.rows for v in row if isinstance(v, str)}
    return {
        k
        for k in cells
        if k and len(k) >= MENTION_CHARS and re.search("[a-z]", k) and re.search(rf"(?<!\w){re.escape(k)}(?!\w)", blob)
    }


def filtered_tables(tables: list[Table], texts: Iterable[str], tools_py: str = "") -> list[str]:
    """The tables the tasks filter on: those a word of `texts` names (a table's name or its last word,
    singular or plural), then those the queries of `tools_py` read or write, in order."""
    words = {singular(w) for text in texts for w in _WORD.findall(text.casefold())}
    by_words = [
        t.name for t in tables if {singular(t.name.casefold()), singular(t.name.casefold().split("_")[-1])} & words
    ]
    names = {t.name.casefold(): t.name for t in tables}
    queried = [names[m.casefold()] for m in _QUERIED.findall(tools_py) if m.casefold() in names]
    return list(dict.fromkeys(by_words + queried))


def seed_view(
    world: bytes,
    named: Iterable[str],
    limit: int = SEED_VIEW_CHARS,
    *,
    texts: Iterable[str] = (),
    tools_py: str = "",
) -> str:
    """Each table's columns, row count and next id, with its rows that hold a `named` value (text in
    any column; a number as the primary key) or a value `texts` (the tasks' instructions) hold as words,
    the rows those reference by foreign key and the rows referencing them, its first few rows, then the
    rows of the tables the tasks filter on (`filtered_tables`, `tools_py` the tools' code); at most about
    `limit` characters (rows named first, then referenced, referencing, first rows, filtered tables')."""
    tables = _open(world)
    texts = list(texts)
    by_name = {t.name: t for t in tables}
    keys = set().union(set(), *(literal_keys(v) for v in named))
    numbers = {k for k in keys if re.fullmatch(r"-?\d+", k)}
    texts_named = (keys - numbers) | mentioned_values(tables, texts)
    matched = {t.name: t.named(texts_named, numbers) for t in tables}
    referenced: dict[str, list[int]] = {t.name: [] for t in tables}
    referencing: dict[str, list[int]] = {t.name: [] for t in tables}
    for table in tables:
        for column, parent_name, parent_column in table.parents:
            parent = by_name.get(parent_name)
            if parent is None:
                continue
            child_keys, parent_keys = table.column_keys(column), parent.column_keys(parent_column)
            wanted = {child_keys[i] for i in matched[table.name]}
            referenced[parent.name] += [i for i, k in enumerate(parent_keys) if k in wanted]
            wanted = {parent_keys[i] for i in matched[parent.name]}
            referencing[table.name] += [i for i, k in enumerate(child_keys) if k in wanted]
    first = {t.name: list(range(min(SAMPLE_ROWS, len(t.rows)))) for t in tables}
    filtered: dict[str, list[int]] = {t.name: [] for t in tables}
    for name in filtered_tables(tables, texts, tools_py) if texts or tools_py else []:
        filtered[name] = list(range(len(by_name[name].rows)))
    shown: dict[str, set[int]] = {t.name: set() for t in tables}
    used = sum(len(_head(t)) + MORE_ROWS_CHARS for t in tables)
    for tier in (matched, referenced, referencing, first, filtered):
        for table in tables:
            for i in dict.fromkeys(tier[table.name]):
                cost = len(_row(table, i)) + 1
                if i not in shown[table.name] and used + cost <= limit:
                    shown[table.name].add(i)
                    used += cost
    parts = []
    for table in tables:
        parts.append(_head(table))
        parts += [_row(table, i) for i in sorted(shown[table.name])]
        hidden = len(table.rows) - len(shown[table.name])
        if hidden:
            parts.append(f"  ... {hidden} more rows")
    return "\n".join(parts)


def _head(table: Table) -> str:
    next_id = f"; the next inserted row gets id {table.next_id}" if table.next_id is not None else ""
    return f"{table.name} ({len(table.rows)} rows{next_id}): {', '.join(table.columns)}"


def _row(table: Table, index: int) -> str:
    return "  (" + ", ".join(_cell(v) for v in table.rows[index][1]) + ")"
