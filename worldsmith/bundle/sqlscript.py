"""SQL of a bundle: statement splitting with line numbers, the hardening every connection gets,
and building `world.db` from `schema.sql` + `seed.sql`.

Stdlib only: the sandbox worker hardens episode connections with `harden`.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

_FIRST_WORD = re.compile(r"^\s*(?:(?:--[^\n]*\n)|(?:/\*.*?\*/)|\s)*([A-Za-z]+)", re.DOTALL)

#: PRAGMAs tools and verifiers may run (read-only introspection).
SAFE_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "foreign_key_list", "foreign_key_check",
     "table_list", "data_version", "read_uncommitted"}  # read_uncommitted: SQLAlchemy reads it on connect; no effect without shared cache
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


class IncompleteStatement(ValueError):
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


def _authorizer(read_only: bool):
    deny, ok = sqlite3.SQLITE_DENY, sqlite3.SQLITE_OK
    writes = {
        sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE, sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_DROP_TABLE, sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_DROP_INDEX,
        sqlite3.SQLITE_ALTER_TABLE, sqlite3.SQLITE_CREATE_VIEW, sqlite3.SQLITE_DROP_VIEW,
        sqlite3.SQLITE_CREATE_TRIGGER, sqlite3.SQLITE_DROP_TRIGGER, sqlite3.SQLITE_CREATE_TEMP_TABLE,
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
        return ok

    return authorize


def harden(conn: sqlite3.Connection, *, read_only: bool = False) -> sqlite3.Connection:
    """Make a connection safe for untrusted SQL: foreign keys on, no ATTACH / VACUUM INTO / extensions,
    only introspection PRAGMAs, bounded value sizes; `read_only` also refuses every write."""
    base = sqlite3.Connection  # unbound methods: subclasses given to tools refuse these
    base.execute(conn, "PRAGMA foreign_keys = ON")
    if read_only:
        base.execute(conn, "PRAGMA query_only = ON")
    base.setlimit(conn, sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    base.setlimit(conn, sqlite3.SQLITE_LIMIT_LENGTH, MAX_SQL_LENGTH)
    base.setlimit(conn, sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_LENGTH)
    base.set_authorizer(conn, _authorizer(read_only))
    return conn


def deserialize(data: bytes, *, read_only: bool = False, factory: type[sqlite3.Connection] = sqlite3.Connection) -> sqlite3.Connection:
    """A private in-memory, hardened connection holding a copy of serialized database `data`."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False, factory=factory)
    sqlite3.Connection.deserialize(conn, data)
    return harden(conn, read_only=read_only)


def snapshot(conn: sqlite3.Connection, *, read_only: bool = False) -> bytes:
    """Serialize a hardened connection's database (the authorizer must step aside for it)."""
    sqlite3.Connection.set_authorizer(conn, None)
    try:
        return sqlite3.Connection.serialize(conn)
    finally:
        sqlite3.Connection.set_authorizer(conn, _authorizer(read_only))


def restore(conn: sqlite3.Connection, data: bytes, *, read_only: bool = False) -> None:
    """Replace a hardened connection's database by serialized `data` (a memory copy)."""
    sqlite3.Connection.set_authorizer(conn, None)
    sqlite3.Connection.deserialize(conn, data)
    harden(conn, read_only=read_only)


@dataclass(frozen=True)
class SqlFault:
    """Why one statement of a script failed."""

    file: str
    statement: Statement | None
    problem: str

    @property
    def line(self) -> int | None:
        return self.statement.line if self.statement else None


def _foreign_key_detail(conn: sqlite3.Connection, statement: Statement, limit: int = 5) -> str:
    """Which rows of `statement` break which foreign key: replayed on a copy with checks deferred."""
    probe = sqlite3.connect(":memory:", isolation_level=None)
    try:
        sqlite3.Connection.deserialize(probe, snapshot(conn))
        probe.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # foreign keys stay off (SQLite's default)
        probe.execute(statement.sql)
        rows = probe.execute("PRAGMA foreign_key_check").fetchmany(limit)
        links = []
        for table, rowid, parent, fk_index in rows:
            fk = [r for r in probe.execute(f'PRAGMA foreign_key_list("{table}")') if r[0] == fk_index]
            column = fk[0][3] if fk else "?"
            value = probe.execute(f'SELECT "{column}" FROM "{table}" WHERE rowid = ?', (rowid,)).fetchone() if fk else None
            links.append(f"{table} row {rowid}: {column}={value[0] if value else '?'} has no match in {parent}")
        return " (" + "; ".join(links) + ")" if links else ""
    except sqlite3.Error:
        return ""
    finally:
        probe.close()


ALLOWED = {"schema.sql": {"CREATE"}, "seed.sql": {"INSERT", "REPLACE"}}


def _run_script(conn: sqlite3.Connection, file: str, script: str, faults: list[SqlFault], max_faults: int) -> None:
    """Execute every statement of `script` on `conn`, appending a fault for each that fails."""
    try:
        statements = split_statements(script)
    except IncompleteStatement as exc:
        faults.append(SqlFault(file, Statement("", exc.line), str(exc)))
        return
    if not statements:
        faults.append(SqlFault(file, None, "no SQL statements"))
    for statement in statements:
        if len(faults) >= max_faults:
            break
        if statement.keyword not in ALLOWED[file]:
            kinds = " or ".join(sorted(ALLOWED[file]))
            faults.append(SqlFault(file, statement, f"only {kinds} statements are allowed here, not {statement.keyword or 'this'}"))
            continue
        try:
            conn.execute(statement.sql)
        except sqlite3.IntegrityError as exc:
            detail = _foreign_key_detail(conn, statement) if "FOREIGN KEY" in str(exc) else ""
            faults.append(SqlFault(file, statement, f"SQL error: {exc}{detail}"))
        except sqlite3.Error as exc:
            faults.append(SqlFault(file, statement, f"SQL error: {exc}"))


def check_schema(schema_sql: str, *, max_faults: int = 20) -> list[SqlFault]:
    """Every fault of `schema.sql` run alone on a fresh database ([] if it is sound)."""
    conn = harden(sqlite3.connect(":memory:", isolation_level=None))
    faults: list[SqlFault] = []
    _run_script(conn, "schema.sql", schema_sql, faults, max_faults)
    conn.close()
    return faults


def build_world(schema_sql: str, seed_sql: str, *, max_faults: int = 20) -> tuple[bytes | None, list[SqlFault]]:
    """Run `schema.sql` then `seed.sql` on a fresh database; every statement must succeed.

    Returns the serialized database and no faults, or `None` and every fault found
    (file, statement with its line, SQLite's message).
    """
    conn = harden(sqlite3.connect(":memory:", isolation_level=None))
    faults: list[SqlFault] = []
    for file, script in (("schema.sql", schema_sql), ("seed.sql", seed_sql)):
        _run_script(conn, file, script, faults, max_faults)
    if faults:
        conn.close()
        return None, faults
    data = snapshot(conn)
    conn.close()
    return data, []
