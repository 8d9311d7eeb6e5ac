"""Row-level difference between two SQLite databases. Stdlib only (runs in the worker).

The diff runs as trusted code on connections generated code has held (an episode's connection):
it reads private copies instead, so nothing generated code installed on a connection or its class
(text or row factories, SQL functions and collations overriding built-ins, methods) runs inside it.
"""

from __future__ import annotations

import sqlite3
from typing import TypedDict, TypeVar

from worldsmith.bundle.sqlscript import harden
from worldsmith.jsonvalue import JsonObject

#: `PRAGMA table_xinfo`'s `hidden` values of columns the diff leaves out: hidden columns of virtual
#: tables (1) and virtual generated columns (2), computed on read (by SQL functions that exist only
#: on the connection that defined them) and derived from the stored columns the diff compares.
_COMPUTED = (1, 2)

#: A column's value as SQLite gives it back on a plain connection.
SqlValue = str | int | float | bytes | None


class RowUpdate(TypedDict):
    """A row in both databases whose values differ: its key and the row before and after (column: value,
    BLOBs as hex)."""

    key: dict[str, SqlValue]  # primary key column: value (`__rowid__`: the rowid, for a table without one)
    before: JsonObject
    after: JsonObject


class TableChanges(TypedDict):
    """The rows of one table that differ (the wire shape of `models.results.TableDiff`)."""

    inserted: list[JsonObject]
    updated: list[RowUpdate]
    deleted: list[JsonObject]


def private_copy(conn: sqlite3.Connection) -> sqlite3.Connection:
    """A fresh, hardened, read-only connection holding a copy of `conn`'s main database, made
    through SQLite's backup API (no callback of `conn` runs, its authorizer included); its text
    and rows come back as plain `str` and tuples, and only SQLite's built-in functions exist on it."""
    copy = sqlite3.connect(":memory:", isolation_level=None)
    try:
        sqlite3.Connection.backup(conn, copy)
        return harden(copy, read_only=True)
    except BaseException:
        copy.close()
        raise


def _quoted(name: str) -> str:
    """An SQL identifier for `name`, whatever it contains."""
    return '"' + name.replace('"', '""') + '"'


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    ]


def _rows(conn: sqlite3.Connection, table: str) -> tuple[list[str], dict[tuple[SqlValue, ...], dict[str, SqlValue]]]:
    info = conn.execute(f"PRAGMA table_xinfo({_quoted(table)})").fetchall()
    stored = [row[1] for row in info if row[6] not in _COMPUTED]
    keys = [name for _, name in sorted((row[5], row[1]) for row in info if row[5])]
    key_names = keys or ["__rowid__"]
    selected = ([] if keys else ["rowid AS __rowid__"]) + [_quoted(name) for name in stored]
    cursor = conn.execute(f"SELECT {', '.join(selected)} FROM {_quoted(table)}")
    columns = [d[0] for d in cursor.description]
    rows: dict[tuple[SqlValue, ...], dict[str, SqlValue]] = {}
    for values in cursor:
        row = dict(zip(columns, values))
        rows[tuple(row[k] for k in key_names)] = {k: v for k, v in row.items() if k != "__rowid__"}
    return key_names, rows


def _jsonable(row: dict[str, SqlValue]) -> JsonObject:
    return {k: (v.hex() if isinstance(v, bytes) else v) for k, v in row.items()}


#: A row of the diff: a row's values or a row's update.
_Row = TypeVar("_Row", JsonObject, RowUpdate)


def diff(before: sqlite3.Connection, after: sqlite3.Connection) -> dict[str, TableChanges]:
    """`{table: {"inserted": [row], "updated": [{"key", "before", "after"}], "deleted": [row]}}`
    for every table whose rows differ (keyed by primary key, else rowid), read from private copies
    of `before` and `after` (`private_copy`); virtual generated columns are left out."""
    old_db, new_db = private_copy(before), private_copy(after)
    try:
        return _diff(old_db, new_db)
    finally:
        old_db.close()
        new_db.close()


def _diff(before: sqlite3.Connection, after: sqlite3.Connection) -> dict[str, TableChanges]:
    result: dict[str, TableChanges] = {}
    old_tables, new_tables = set(_tables(before)), set(_tables(after))
    for table in sorted(old_tables | new_tables):
        key_names, old = _rows(before, table) if table in old_tables else ([], {})
        _, new = _rows(after, table) if table in new_tables else ([], {})
        inserted = [_jsonable(new[k]) for k in new.keys() - old.keys()]
        deleted = [_jsonable(old[k]) for k in old.keys() - new.keys()]
        updated: list[RowUpdate] = [
            {"key": dict(zip(key_names, k)), "before": _jsonable(old[k]), "after": _jsonable(new[k])}
            for k in old.keys() & new.keys()
            if old[k] != new[k]
        ]
        if inserted or deleted or updated:

            def order(items: list[_Row]) -> list[_Row]:
                return sorted(items, key=repr)

            result[table] = {"inserted": order(inserted), "updated": order(updated), "deleted": order(deleted)}
    return result
