"""SQL of a bundle: statement splitting with line numbers, the hardening every connection gets,
and building `world.db` from `schema.sql` + `seed.sql` within a time and memory budget.

Stdlib only: the sandbox worker hardens episode connections with `harden`.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar, overload

from worldsmith.errors import WorldsmithError

_FIRST_WORD = re.compile(r"^\s*(?:(?:--[^\n]*\n)|(?:/\*.*?\*/)|\s)*([A-Za-z]+)", re.DOTALL)

#: PRAGMAs tools and verifiers may run (read-only introspection).
SAFE_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "index_list",
        "index_info",
        "foreign_key_list",
        "foreign_key_check",
        "table_list",
        "data_version",
        "read_uncommitted",
    }  # read_uncommitted: SQLAlchemy reads it on connect; no effect without shared cache
)
#: SQL functions nobody in the sandbox may call.
DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
MAX_SQL_LENGTH = 16 * 1024 * 1024


@dataclass(frozen=True)
class Statement:
    """One SQL statement of a script with the 1-based line it starts on."""

    sql: str
    line: int

    @property
    def keyword(self) -> str:
        match = _FIRST_WORD.match(self.sql)
        return match.group(1).upper() if match else ""

    def excerpt(self, limit: int = 160) -> str:
        text = " ".join(self.sql.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


class IncompleteStatement(WorldsmithError, ValueError):
    """A script that ends inside a statement; `line` is where that statement starts."""

    def __init__(self, line: int):
        self.line = line
        super().__init__(f"unterminated statement starting at line {line} (missing ';'?)")


def split_statements(script: str) -> list[Statement]:
    """Split a script into complete statements, keeping where each starts; comments-only tails are ignored."""
    statements: list[Statement] = []
    buffer: list[str] = []
    start = 1
    for number, line in enumerate(script.splitlines(keepends=True), start=1):
        if not buffer:
            if not line.strip() or line.strip().startswith("--"):
                continue
            start = number
        buffer.append(line)
        text = "".join(buffer)
        if sqlite3.complete_statement(text):
            statements.append(Statement(sql=text.strip(), line=start))
            buffer = []
    if buffer and "".join(buffer).strip():
        raise IncompleteStatement(start)
    return statements


def is_one_read(sql: str) -> bool:
    """Whether `sql` is exactly one statement, and one that reads: SELECT or WITH, after any comments. Split
    where SQLite would end a statement (a `;` outside literals and comments), so two reads are not one."""
    text = sql.strip() if sql.strip().endswith(";") else sql.strip() + ";"
    statements, start = [], 0
    for end, char in enumerate(text, start=1):
        if char == ";" and sqlite3.complete_statement(text[start:end]):
            if text[start : end - 1].strip():
                statements.append(Statement(text[start:end].strip(), 1))
            start = end
    return len(statements) == 1 and statements[0].keyword in ("SELECT", "WITH")


#: Called with "BEGIN", "COMMIT", "ROLLBACK" or "SAVEPOINT" (SAVEPOINT, RELEASE and ROLLBACK TO) when a
#: statement of transaction control is prepared; True refuses it (see `harden`).
TransactionGate = Callable[[str], bool]

_Connection = TypeVar("_Connection", bound=sqlite3.Connection)


def _authorizer(
    read_only: bool, transactions: TransactionGate | None = None
) -> Callable[[int, str | None, str | None, str | None, str | None], int]:
    deny, ok = sqlite3.SQLITE_DENY, sqlite3.SQLITE_OK
    writes = {
        sqlite3.SQLITE_INSERT,
        sqlite3.SQLITE_UPDATE,
        sqlite3.SQLITE_DELETE,
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_DROP_INDEX,
        sqlite3.SQLITE_ALTER_TABLE,
        sqlite3.SQLITE_CREATE_VIEW,
        sqlite3.SQLITE_DROP_VIEW,
        sqlite3.SQLITE_CREATE_TRIGGER,
        sqlite3.SQLITE_DROP_TRIGGER,
        sqlite3.SQLITE_CREATE_TEMP_TABLE,
    }

    def authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            return deny
        if action == sqlite3.SQLITE_PRAGMA:
            return ok if (arg1 or "").lower() in SAFE_PRAGMAS else deny
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in DENIED_FUNCTIONS:
            return deny
        if read_only and action in writes:
            return deny
        if transactions is not None:
            if action == sqlite3.SQLITE_TRANSACTION and transactions((arg1 or "").upper()):
                return deny
            if action == sqlite3.SQLITE_SAVEPOINT and transactions("SAVEPOINT"):
                return deny
        return ok

    return authorize


def harden(conn: _Connection, *, read_only: bool = False, transactions: TransactionGate | None = None) -> _Connection:
    """Make a connection safe for untrusted SQL: foreign keys on, no ATTACH / VACUUM INTO / extensions,
    only introspection PRAGMAs, bounded value sizes; `read_only` also refuses every write.
    `transactions`, when given, is asked about every statement of transaction control (BEGIN,
    COMMIT, ROLLBACK, SAVEPOINT, RELEASE) and refuses it by answering True."""
    base = sqlite3.Connection  # unbound methods: subclasses given to tools refuse these
    base.execute(conn, "PRAGMA foreign_keys = ON")
    if read_only:
        base.execute(conn, "PRAGMA query_only = ON")
    base.setlimit(conn, sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    base.setlimit(conn, sqlite3.SQLITE_LIMIT_LENGTH, MAX_SQL_LENGTH)
    base.setlimit(conn, sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_LENGTH)
    base.set_authorizer(conn, _authorizer(read_only, transactions))
    return conn


@overload
def deserialize(
    data: bytes, *, read_only: bool = ..., transactions: TransactionGate | None = ...
) -> sqlite3.Connection: ...
@overload
def deserialize(
    data: bytes, *, read_only: bool = ..., factory: type[_Connection], transactions: TransactionGate | None = ...
) -> _Connection: ...


def deserialize(
    data: bytes,
    *,
    read_only: bool = False,
    factory: type[sqlite3.Connection] = sqlite3.Connection,
    transactions: TransactionGate | None = None,
) -> sqlite3.Connection:
    """A private in-memory, hardened connection holding a copy of serialized database `data`."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False, factory=factory)
    sqlite3.Connection.deserialize(conn, data)
    return harden(conn, read_only=read_only, transactions=transactions)


def snapshot(
    conn: sqlite3.Connection, *, read_only: bool = False, transactions: TransactionGate | None = None
) -> bytes:
    """Serialize a hardened connection's database (the authorizer must step aside for it; it is put
    back as `harden` was given it: pass the same `read_only` and `transactions`)."""
    sqlite3.Connection.set_authorizer(conn, None)
    try:
        return sqlite3.Connection.serialize(conn)
    finally:
        sqlite3.Connection.set_authorizer(conn, _authorizer(read_only, transactions))


def restore(
    conn: sqlite3.Connection, data: bytes, *, read_only: bool = False, transactions: TransactionGate | None = None
) -> None:
    """Replace a hardened connection's database by serialized `data` (a memory copy)."""
    sqlite3.Connection.set_authorizer(conn, None)
    sqlite3.Connection.deserialize(conn, data)
    harden(conn, read_only=read_only, transactions=transactions)


@dataclass(frozen=True)
class SqlBudget:
    """What bundle SQL may cost in the trusted process while a world is built: wall-clock seconds per
    statement and for the whole build, and how much the process may grow meanwhile (resident memory,
    read from /proc/self/statm; unchecked where that file does not exist). Generous for real worlds
    (they build in milliseconds and a few MB)."""

    statement_s: float = 10.0
    total_s: float = 60.0
    memory_bytes: int = 1024 * 1024 * 1024
    #: SQLite instructions between two checks (a check costs about 2 us).
    check_every: int = 1000


#: The budget of every build unless one is given.
BUILD_BUDGET = SqlBudget()


class _Resident:
    """The process's resident memory, read cheaply (one pread of /proc/self/statm)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None
        self._page = os.sysconf("SC_PAGE_SIZE") if self._fd is not None else 0

    def bytes(self) -> int | None:
        if self._fd is None:
            return None
        return int(os.pread(self._fd, 64, 0).split()[1]) * self._page

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class BudgetMeter:
    """The progress handler of a build connection: aborts the running statement (SQLite reports
    "interrupted") past its deadline or once the process has grown by more than the memory budget
    since the build began; `exceeded` then says which bound was hit."""

    def __init__(self, budget: SqlBudget):
        self.budget = budget
        self._resident = _Resident()
        self._baseline = self._resident.bytes()
        self._build_deadline = time.monotonic() + budget.total_s
        self._deadline = math.inf
        self.exceeded: str | None = None

    @contextmanager
    def statement(self) -> Iterator[None]:
        """Time one statement: its own budget, never past the build's."""
        self.exceeded = None
        self._deadline = min(time.monotonic() + self.budget.statement_s, self._build_deadline)
        try:
            yield
        finally:
            self._deadline = math.inf

    @property
    def spent(self) -> bool:
        """True when the whole build's time is used up."""
        return time.monotonic() >= self._build_deadline

    def __call__(self) -> int:
        if time.monotonic() > self._deadline:
            whole = self._deadline >= self._build_deadline
            self.exceeded = (
                f"the build's time budget of {self.budget.total_s:g} s"
                if whole
                else f"the statement's time budget of {self.budget.statement_s:g} s"
            )
            return 1
        current = self._resident.bytes()
        if current is not None and self._baseline is not None and current - self._baseline > self.budget.memory_bytes:
            self.exceeded = f"the build's memory budget of {self.budget.memory_bytes // (1024 * 1024)} MB"
            return 1
        return 0

    def close(self) -> None:
        self._resident.close()


@contextmanager
def bounded_connection(
    budget: SqlBudget, meter: BudgetMeter | None = None
) -> Iterator[tuple[sqlite3.Connection, BudgetMeter]]:
    """A fresh hardened in-memory connection for bundle SQL whose statements run under `budget`
    (temporary tables in memory, so the memory budget also bounds what sorting and UNION keep),
    closed on exit; with `meter`, that meter (and its remaining build time) is shared."""
    own = meter is None
    meter = meter or BudgetMeter(budget)
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("PRAGMA temp_store = MEMORY")
        harden(conn)
        conn.set_progress_handler(meter, budget.check_every)
        yield conn, meter
    finally:
        conn.close()
        if own:
            meter.close()


@dataclass(frozen=True)
class SqlFault:
    """Why one statement of a script failed."""

    file: str
    statement: Statement | None
    problem: str

    @property
    def line(self) -> int | None:
        return self.statement.line if self.statement else None


def _foreign_key_detail(conn: sqlite3.Connection, statement: Statement, meter: BudgetMeter, limit: int = 5) -> str:
    """Which rows of `statement` break which foreign key: replayed on a copy with checks deferred
    (under the build's meter, so the replay is bounded like the statement)."""
    probe = sqlite3.connect(":memory:", isolation_level=None)
    try:
        sqlite3.Connection.deserialize(probe, snapshot(conn))
        probe.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # foreign keys stay off (SQLite's default)
        probe.execute("PRAGMA temp_store = MEMORY")
        probe.set_progress_handler(meter, meter.budget.check_every)
        with meter.statement():
            probe.execute(statement.sql)
        rows = probe.execute("PRAGMA foreign_key_check").fetchmany(limit)
        links = []
        for table, rowid, parent, fk_index in rows:
            fk = [r for r in probe.execute(f'PRAGMA foreign_key_list("{table}")') if r[0] == fk_index]
            column = fk[0][3] if fk else "?"
            value = (
                probe.execute(f'SELECT "{column}" FROM "{table}" WHERE rowid = ?', (rowid,)).fetchone() if fk else None
            )
            links.append(f"{table} row {rowid}: {column}={value[0] if value else '?'} has no match in {parent}")
        return " (" + "; ".join(links) + ")" if links else ""
    except sqlite3.Error:
        return ""
    finally:
        probe.close()


ALLOWED = {"schema.sql": {"CREATE"}, "seed.sql": {"INSERT", "REPLACE"}}


def _run_script(
    conn: sqlite3.Connection, meter: BudgetMeter, file: str, script: str, faults: list[SqlFault], max_faults: int
) -> bool:
    """Execute every statement of `script` on `conn`, appending a fault for each that fails.
    Returns False when a statement broke the budget (the build stops there)."""
    try:
        statements = split_statements(script)
    except IncompleteStatement as exc:
        faults.append(SqlFault(file, Statement("", exc.line), str(exc)))
        return True
    if not statements:
        faults.append(SqlFault(file, None, "no SQL statements"))
    for statement in statements:
        if len(faults) >= max_faults:
            break
        if statement.keyword not in ALLOWED[file]:
            kinds = " or ".join(sorted(ALLOWED[file]))
            faults.append(
                SqlFault(
                    file, statement, f"only {kinds} statements are allowed here, not {statement.keyword or 'this'}"
                )
            )
            continue
        try:
            with meter.statement():
                conn.execute(statement.sql)
        except sqlite3.IntegrityError as exc:
            detail = _foreign_key_detail(conn, statement, meter) if "FOREIGN KEY" in str(exc) else ""
            faults.append(SqlFault(file, statement, f"SQL error: {exc}{detail}"))
        except sqlite3.Error as exc:
            if meter.exceeded:
                faults.append(SqlFault(file, statement, f"stopped: the statement exceeded {meter.exceeded}"))
                return False
            faults.append(SqlFault(file, statement, f"SQL error: {exc}"))
        if meter.spent:
            faults.append(
                SqlFault(
                    file,
                    statement,
                    f"stopped after this statement: the build exceeded its time budget of {meter.budget.total_s:g} s",
                )
            )
            return False
    return True


def check_schema(schema_sql: str, *, max_faults: int = 20, budget: SqlBudget | None = None) -> list[SqlFault]:
    """Every fault of `schema.sql` run alone on a fresh database ([] if it is sound), within `budget`
    (None: BUILD_BUDGET)."""
    faults: list[SqlFault] = []
    with bounded_connection(budget or BUILD_BUDGET) as (conn, meter):
        _run_script(conn, meter, "schema.sql", schema_sql, faults, max_faults)
    return faults


def build_world(
    schema_sql: str, seed_sql: str, *, max_faults: int = 20, budget: SqlBudget | None = None
) -> tuple[bytes | None, list[SqlFault]]:
    """Run `schema.sql` then `seed.sql` on a fresh database; every statement must succeed, and the
    whole build stay within `budget` (None: BUILD_BUDGET; a statement past it is a fault naming it,
    and the build stops).

    Returns the serialized database and no faults, or `None` and every fault found
    (file, statement with its line, SQLite's message).
    """
    faults: list[SqlFault] = []
    with bounded_connection(budget or BUILD_BUDGET) as (conn, meter):
        for file, script in (("schema.sql", schema_sql), ("seed.sql", seed_sql)):
            if not _run_script(conn, meter, file, script, faults, max_faults):
                break
        if faults:
            return None, faults
        return snapshot(conn), []
