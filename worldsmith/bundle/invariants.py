"""A world's invariants (`invariants.json`, optional): rules every state of the world keeps, each a one-line
statement and one SELECT returning the rows that break it. Read and checked here; `broken_invariants` runs
them on a database (the seed, a reference solution's end state).

Invariant SQL is generated, so untrusted: it runs as the seed's SQL does (sqlscript.py), never on a
database anything else reads: on a private in-memory copy, through a hardened read-only connection (no
write, ATTACH, extension or unsafe PRAGMA), under a time and memory budget (`INVARIANT_BUDGET`, SQLite
interrupted past it), and at most `MAX_ROWS` of its rows are read. Stdlib and pydantic models only.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from worldsmith.bundle.sqlscript import BudgetMeter, SqlBudget, Statement, deserialize
from worldsmith.models.bundle import Invariant

#: The optional bundle file holding a world's invariants (a JSON list of `Invariant`).
INVARIANTS_FILE = "invariants.json"
#: What checking all of one world's invariants on one database may cost (each query, and all together).
INVARIANT_BUDGET = SqlBudget(statement_s=2.0, total_s=10.0, memory_bytes=256 * 1024 * 1024)
#: The offending rows read of a broken invariant (the rest are counted as "more").
MAX_ROWS = 5
_SHOWN_CHARS = 120
_LIST = TypeAdapter(list[Invariant])


def parse_invariants(text: str) -> tuple[list[Invariant], list[str]]:
    """The invariants `text` (invariants.json) holds and every problem found statically: not a list of
    invariants, duplicate ids, SQL that is not exactly one SELECT."""
    try:
        invariants = _LIST.validate_json(text)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in exc.errors()]
        return [], problems
    return invariants, invariant_problems(invariants)


def invariant_problems(invariants: list[Invariant]) -> list[str]:
    """What is statically wrong with `invariants`: a duplicate id, SQL that is not one SELECT (or WITH)."""
    problems, seen = [], set()
    for invariant in invariants:
        if invariant.id in seen:
            problems.append(f"invariant {invariant.id!r}: duplicate id")
        seen.add(invariant.id)
        statements = _statements(invariant.sql)
        if len(statements) != 1 or statements[0].keyword not in ("SELECT", "WITH"):
            problems.append(f"invariant {invariant.id!r}: sql must be one SELECT returning the rows that break it")
    return problems


def _statements(sql: str) -> list[Statement]:
    """The statements of `sql`, split where SQLite would end one (a `;` outside literals and comments)."""
    text = sql.strip() if sql.strip().endswith(";") else sql.strip() + ";"
    statements, start = [], 0
    for end, char in enumerate(text, start=1):
        if char == ";" and sqlite3.complete_statement(text[start:end]):
            if text[start : end - 1].strip():
                statements.append(Statement(text[start:end].strip(), 1))
            start = end
    return statements


def invariants_json(invariants: list[Invariant]) -> bytes:
    """`invariants` as the bundle file holds them."""
    return (json.dumps([i.model_dump() for i in invariants], indent=2) + "\n").encode()


@dataclass(frozen=True)
class InvariantViolation:
    """An invariant that does not hold on a database: the offending `rows` (at most MAX_ROWS, each shown as
    text) and whether there were more, or the `error` its query ended in (a fault of the query, or the
    budget it ran out of)."""

    invariant: Invariant
    rows: tuple[str, ...] = ()
    more: bool = False
    error: str | None = None

    def describe(self) -> str:
        """One line naming the invariant, its statement and the offending rows (or the query's error)."""
        head = f"invariant {self.invariant.id!r} ({self.invariant.statement})"
        if self.error is not None:
            return f"{head}: its query failed: {self.error}"
        more = " and more" if self.more else ""
        return f"{head} is broken by these rows: {'; '.join(self.rows)}{more}"


def _shown(row: sqlite3.Row) -> str:
    text = ", ".join(f"{key}={row[key]!r}" for key in row.keys())  # noqa: SIM118 (a Row iterates its values)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def broken_invariants(world: bytes, invariants: list[Invariant] | tuple[Invariant, ...]) -> list[InvariantViolation]:
    """The invariants that do not hold on serialized database `world` (see the module docstring for how
    their SQL runs), in the order given; [] when every one holds."""
    if not invariants:
        return []
    broken: list[InvariantViolation] = []
    meter = BudgetMeter(INVARIANT_BUDGET)
    conn = deserialize(world, read_only=True)
    try:
        conn.row_factory = sqlite3.Row
        conn.set_progress_handler(meter, INVARIANT_BUDGET.check_every)
        for invariant in invariants:
            try:
                with meter.statement():
                    rows = conn.execute(invariant.sql).fetchmany(MAX_ROWS + 1)
            except sqlite3.Error as exc:
                reason = f"it ran out of {meter.exceeded}" if meter.exceeded else f"{type(exc).__name__}: {exc}"
                broken.append(InvariantViolation(invariant, error=reason))
                continue
            if rows:
                shown = tuple(_shown(row) for row in rows[:MAX_ROWS])
                broken.append(InvariantViolation(invariant, shown, more=len(rows) > MAX_ROWS))
    finally:
        conn.close()
        meter.close()
    return broken
