"""Row-level difference between two SQLite databases. Stdlib only (runs in the worker)."""

from __future__ import annotations

import sqlite3
from typing import Any


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    ]


def _key_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
    keys = sorted((row[5], row[1]) for row in info if row[5])
    return [name for _, name in keys]


def _rows(conn: sqlite3.Connection, table: str) -> tuple[list[str], dict[tuple[Any, ...], dict[str, Any]]]:
    keys = _key_columns(conn, table)
    select = f'SELECT {"rowid AS __rowid__, " if not keys else ""}* FROM "{table}"'
    cursor = conn.execute(select)
    columns = [d[0] for d in cursor.description]
    key_names = keys or ["__rowid__"]
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for values in cursor:
        row = dict(zip(columns, values))
        rows[tuple(row[k] for k in key_names)] = {k: v for k, v in row.items() if k != "__rowid__"}
    return key_names, rows


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.hex() if isinstance(v, bytes) else v) for k, v in row.items()}


def diff(before: sqlite3.Connection, after: sqlite3.Connection) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """`{table: {"inserted": [row], "updated": [{"key", "before", "after"}], "deleted": [row]}}`
    for every table whose rows differ (keyed by primary key, else rowid)."""
    result: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for table in sorted(set(_tables(before)) | set(_tables(after))):
        key_names, old = _rows(before, table) if table in _tables(before) else ([], {})
        _, new = _rows(after, table) if table in _tables(after) else ([], {})
        inserted = [_jsonable(new[k]) for k in new.keys() - old.keys()]
        deleted = [_jsonable(old[k]) for k in old.keys() - new.keys()]
        updated = [
            {"key": dict(zip(key_names, k)), "before": _jsonable(old[k]), "after": _jsonable(new[k])}
            for k in old.keys() & new.keys()
            if old[k] != new[k]
        ]
        if inserted or deleted or updated:

            def order(items):
                return sorted(items, key=repr)

            result[table] = {"inserted": order(inserted), "updated": order(updated), "deleted": order(deleted)}
    return result
