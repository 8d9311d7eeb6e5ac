"""A world's invariants (`invariants.json`, optional): rules every state of the world keeps, each a one-line
statement and one SELECT returning the rows that break it. Read and checked here; `broken_invariants` runs
them on a database (the seed, a reference solution's end state).

Invariant SQL is generated, so untrusted: it runs through readquery.py (a hardened read-only connection: no
write, ATTACH, extension or unsafe PRAGMA; interrupted past its time, `INVARIANT_BUDGET`; at most
`MAX_ROWS` of its rows read), never on a database anything else reads: on an end state, in the episode's
sandbox worker (`SandboxEpisode.query`, quality/invariants.py); on the seed the database stage has just
built, on a private in-memory copy in the process that built it, as the seed's own SQL ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from worldsmith.bundle.readquery import Cell, QueryOutcome, read_queries_on
from worldsmith.bundle.sqlscript import SqlBudget, is_one_read
from worldsmith.models.bundle import Invariant

#: The optional bundle file holding a world's invariants (a JSON list of `Invariant`).
INVARIANTS_FILE = "invariants.json"
#: How long checking one world's invariants on one database may take (each query, and all together).
INVARIANT_BUDGET = SqlBudget(statement_s=2.0, total_s=10.0)
#: The offending rows read of a broken invariant (the rest are counted as "more").
MAX_ROWS = 5
_SHOWN_CHARS = 120
_LIST = TypeAdapter(list[Invariant])

#: Runs read-only queries on one database, bounded: (queries, max rows, seconds a query, seconds in all) ->
#: their outcomes, in order (`readquery.run_read_queries`: here, or in an episode's sandbox worker).
QueryRunner = Callable[[list[str], int, float, float], list[QueryOutcome]]


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
        if not is_one_read(invariant.sql):
            problems.append(f"invariant {invariant.id!r}: sql must be one SELECT returning the rows that break it")
    return problems


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


def _shown(row: dict[str, Cell]) -> str:
    text = ", ".join(f"{key}={value!r}" for key, value in row.items())
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def violations(
    invariants: list[Invariant] | tuple[Invariant, ...], outcomes: list[QueryOutcome]
) -> list[InvariantViolation]:
    """The invariants broken according to `outcomes` (their queries' outcomes, in the same order)."""
    broken = []
    for invariant, outcome in zip(invariants, outcomes, strict=True):
        if outcome["error"] is not None:
            broken.append(InvariantViolation(invariant, error=outcome["error"]))
        elif outcome["rows"]:
            shown = tuple(_shown(row) for row in outcome["rows"])
            broken.append(InvariantViolation(invariant, shown, more=outcome["more"]))
    return broken


def check_queries(runner: QueryRunner, invariants: list[Invariant] | tuple[Invariant, ...]) -> list[InvariantViolation]:
    """The invariants broken on the database `runner` queries (bounded by INVARIANT_BUDGET and MAX_ROWS)."""
    if not invariants:
        return []
    budget = INVARIANT_BUDGET
    outcomes = runner([i.sql for i in invariants], MAX_ROWS, budget.statement_s, budget.total_s)
    return violations(invariants, outcomes)


def broken_invariants(world: bytes, invariants: list[Invariant] | tuple[Invariant, ...]) -> list[InvariantViolation]:
    """The invariants that do not hold on serialized database `world`, checked in this process on a private
    read-only copy (the database stage's check of the seed it has just built, as the seed's own SQL ran),
    in the order given; [] when every one holds."""

    def here(queries: list[str], max_rows: int, query_s: float, total_s: float) -> list[QueryOutcome]:
        return read_queries_on(world, queries, max_rows=max_rows, query_s=query_s, total_s=total_s)

    return check_queries(here, invariants)
