"""Generated read-only queries (a world's invariants, bundle/invariants.py), run bounded: each on a hardened
read-only connection (`sqlscript.harden(read_only=True)`: writes, ATTACH, extensions and unsafe PRAGMAs
refused), interrupted past its own deadline and the deadline of the whole batch, and at most `max_rows`
of its rows read. Stdlib only: the sandbox worker runs them on an episode's database (the `query` op),
the database stage on the seed it has just built.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import TypedDict

from worldsmith.bundle.sqlscript import deserialize

#: A value of a row as sent back: SQLite's own, blobs shown as text.
Cell = int | float | str | None


class QueryOutcome(TypedDict):
    """What one query gave: its first rows (each a column -> value mapping, at most the `max_rows` asked
    for) and whether it had more, or the error it ended in (a fault of the query, or its deadline)."""

    rows: list[dict[str, Cell]]
    more: bool
    error: str | None


def _cell(value: object) -> Cell:
    if value is None or isinstance(value, (int, float, str)):
        return value
    return repr(value)  # a blob


def run_read_queries(
    conn: sqlite3.Connection, queries: list[str], *, max_rows: int, query_s: float, total_s: float
) -> list[QueryOutcome]:
    """Run each of `queries` on `conn` (a hardened read-only connection this code owns: its progress
    handler is replaced), each within `query_s` seconds and all within `total_s`."""
    batch_deadline = time.monotonic() + total_s
    deadline = [batch_deadline]
    timed_out = [False]

    def progress() -> int:
        timed_out[0] = time.monotonic() > deadline[0]
        return 1 if timed_out[0] else 0

    sqlite3.Connection.set_progress_handler(conn, progress, 1000)
    outcomes: list[QueryOutcome] = []
    try:
        for sql in queries:
            deadline[0] = min(time.monotonic() + query_s, batch_deadline)
            timed_out[0] = False
            try:
                cursor = sqlite3.Connection.execute(conn, sql)
                columns = [d[0] for d in cursor.description or ()]
                fetched = cursor.fetchmany(max_rows + 1)
            except sqlite3.Error as exc:
                spent = timed_out[0]
                reason = f"it ran out of its time ({query_s:g} s a query, {total_s:g} s in all)" if spent else None
                outcomes.append({"rows": [], "more": False, "error": reason or f"{type(exc).__name__}: {exc}"})
                continue
            rows = [{column: _cell(value) for column, value in zip(columns, row, strict=False)} for row in fetched]
            outcomes.append({"rows": rows[:max_rows], "more": len(rows) > max_rows, "error": None})
    finally:
        sqlite3.Connection.set_progress_handler(conn, None, 0)
    return outcomes


def read_queries_on(
    world: bytes, queries: list[str], *, max_rows: int, query_s: float, total_s: float
) -> list[QueryOutcome]:
    """`run_read_queries` on a private read-only in-memory copy of serialized database `world`."""
    conn = deserialize(world, read_only=True)
    try:
        return run_read_queries(conn, queries, max_rows=max_rows, query_s=query_s, total_s=total_s)
    finally:
        conn.close()


def outcomes_from_json(data: bytes) -> list[QueryOutcome]:
    """The outcomes a worker sent as JSON (`run_read_queries`'s), checked: ValueError for anything else."""
    outcomes = json.loads(data)
    if not isinstance(outcomes, list):
        raise ValueError("not a list of outcomes")
    checked: list[QueryOutcome] = []
    for outcome in outcomes:
        if not isinstance(outcome, dict):
            raise ValueError("an outcome that is not {rows, more, error}")
        rows, more, error = outcome.get("rows"), outcome.get("more"), outcome.get("error")
        if not isinstance(rows, list) or not all(_is_row(row) for row in rows):
            raise ValueError("an outcome whose rows are not rows")
        if not isinstance(more, bool) or not (error is None or isinstance(error, str)):
            raise ValueError("an outcome that is not {rows, more, error}")
        checked.append({"rows": rows, "more": more, "error": error})
    return checked


def _is_row(row: object) -> bool:
    return isinstance(row, dict) and all(
        isinstance(key, str) and (value is None or isinstance(value, (int, float, str))) for key, value in row.items()
    )
