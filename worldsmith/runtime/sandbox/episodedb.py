"""Episode databases in the worker: the connections tools get and the transaction the runtime owns. Stdlib only.

Tools receive an `EpisodeConnection` (ASGI apps' engines an `AppConnection`): commits, closes and
connection settings are the runtime's, and while generated code runs SQL that opens, releases or
rolls back a transaction is refused (`refuse_transaction_control`, the gate `bundle.sqlscript`
installs); `with db:` gets the runtime's `commit()` and `rollback()` instead of its own COMMIT and
ROLLBACK. Every tool call runs between `begin_call` and `end_call`: inside the runtime's savepoint,
kept if the tool returns, rolled back if it fails. Connections are opened here, in memory (fast
isolation) or on the episode's database file (strict isolation), hardened, watched by the guard's
deadline and bound to the world's clock.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from types import GetSetDescriptorType, MemberDescriptorType
from typing import Any, Literal

from worldsmith.bundle.kinds import ToolsKind
from worldsmith.bundle.sqlscript import deserialize, harden
from worldsmith.runtime.sandbox import guard, worldclock

SAVEPOINT = "ws_call"
APP_SAVEPOINT = "ws_app"  # inside SAVEPOINT, for ASGI apps' own transactions
_RUNTIME_SQL = [False]  # True while the runtime's own transaction control runs inside a call


@contextmanager
def _runtime_sql() -> Iterator[None]:
    _RUNTIME_SQL[0] = True
    try:
        yield
    finally:
        _RUNTIME_SQL[0] = False


def refuse_transaction_control(statement: str) -> bool:
    """The transaction gate of episode connections (`harden`): while generated code runs, only the
    runtime's own savepoints may be opened, released or rolled back; tool SQL doing it is refused."""
    if not guard.GUARD.active or _RUNTIME_SQL[0]:
        return False
    guard.GUARD.refuse(
        "database", f"transaction control ({statement}) from tool SQL refused: the runtime owns the call's transaction"
    )
    return True


class EpisodeConnection(sqlite3.Connection):
    """The connection tools receive: the runtime owns transactions and connection settings."""

    #: How rows read during a call come back, and the savepoints the runtime opens around each call.
    CALL_ROW_FACTORY: Any = sqlite3.Row
    CALL_SAVEPOINTS: tuple[str, ...] = (SAVEPOINT,)

    def commit(self) -> None:  # the runtime commits when the tool returns
        return None

    def rollback(self) -> None:  # undo this call's writes so far
        with _runtime_sql():
            sqlite3.Connection.execute(self, f"ROLLBACK TO {SAVEPOINT}")

    def close(self) -> None:
        return None

    def __enter__(self) -> EpisodeConnection:
        return self

    def __exit__(self, exc_type: object, exc_value: object, traceback: object) -> Literal[False]:
        """`with db:` (sqlite3's context manager, which would send COMMIT or ROLLBACK itself): the
        runtime's `commit()` on leaving, its `rollback()` on an exception, which goes on."""
        if exc_type is None:
            self.commit()
        else:
            self.rollback()
        return False

    def executescript(self, *args: Any, **kwargs: Any) -> Any:
        raise sqlite3.NotSupportedError("executescript is not available to tools; use execute()")

    def _refused(self, *args: Any, **kwargs: Any) -> Any:
        raise guard.GUARD.refuse("database", "changing the episode connection's settings is refused")

    set_authorizer = set_progress_handler = set_trace_callback = setlimit = _refused
    enable_load_extension = load_extension = deserialize = serialize = backup = _refused


class AppConnection(EpisodeConnection):
    """The connection an ASGI app's engine hands out: its commits and rollbacks act on an inner
    savepoint, so a rollback after a commit (SQLAlchemy ends every session with one) keeps what was
    committed, while the runtime can still undo the whole call."""

    CALL_ROW_FACTORY = None  # SQLAlchemy reads plain tuples
    CALL_SAVEPOINTS = (SAVEPOINT, APP_SAVEPOINT)

    def commit(self) -> None:
        with _runtime_sql():
            sqlite3.Connection.execute(self, f"RELEASE {APP_SAVEPOINT}")
            sqlite3.Connection.execute(self, f"SAVEPOINT {APP_SAVEPOINT}")

    def rollback(self) -> None:
        with _runtime_sql():
            sqlite3.Connection.execute(self, f"ROLLBACK TO {APP_SAVEPOINT}")


#: What the runtime sets around each call, by connection class (its row factory, the savepoints it
#: opens), kept here: generated code may rebind the classes' attributes.
_CALL_SETTINGS: dict[type, tuple[Any, tuple[str, ...]]] = {
    EpisodeConnection: (EpisodeConnection.CALL_ROW_FACTORY, EpisodeConnection.CALL_SAVEPOINTS),
    AppConnection: (AppConnection.CALL_ROW_FACTORY, AppConnection.CALL_SAVEPOINTS),
}
# the descriptors themselves (typeshed types these attributes as their values)
_ROW_FACTORY: MemberDescriptorType = vars(sqlite3.Connection)["row_factory"]
_TOTAL_CHANGES: GetSetDescriptorType = vars(sqlite3.Connection)["total_changes"]
_IN_TRANSACTION: GetSetDescriptorType = vars(sqlite3.Connection)["in_transaction"]


def connection_class(tools_kind: ToolsKind) -> type[EpisodeConnection]:
    """The class of an environment's episode connections: AppConnection where its tools run their own
    transactions (ASGI apps), else EpisodeConnection."""
    return AppConnection if tools_kind.app_transactions else EpisodeConnection


#: What SQLite says when a write does not fit (`max_page_count`, or a full disk): SQLITE_FULL's message.
DATABASE_FULL = "database or disk is full"


def limit_growth(conn: sqlite3.Connection, max_bytes: int) -> None:
    """Let hardened episode connection `conn`'s database hold at most `max_bytes` (SQLite's
    `max_page_count`: a write past it fails with DATABASE_FULL; tool SQL cannot change it, PRAGMAs
    being refused). Its authorizer steps aside for the PRAGMA and is put back as `harden` set it.
    Setting it reads the database into SQLite's cache: done at an episode's first call, not at its open."""
    sqlite3.Connection.set_authorizer(conn, None)
    try:
        page_size = int(sqlite3.Connection.execute(conn, "PRAGMA page_size").fetchone()[0])
        sqlite3.Connection.execute(conn, f"PRAGMA max_page_count = {max(max_bytes // page_size, 1)}")
    finally:
        harden(conn, transactions=refuse_transaction_control)


def memory_connection(data: bytes, tools_kind: ToolsKind, clock: str | None) -> EpisodeConnection:
    """A private in-memory episode database holding `data`, hardened and watched."""
    conn = deserialize(data, factory=connection_class(tools_kind), transactions=refuse_transaction_control)
    conn.row_factory = sqlite3.Row
    guard.GUARD.watch(conn)
    worldclock.bind_sql(conn, clock)
    return conn


def file_connection(path: str, world: bytes, tools_kind: ToolsKind, clock: str | None) -> EpisodeConnection:
    """The episode's database file at `path`, opened like an in-memory episode database (strict
    isolation); made from the world on first use. Called before the process confines itself to the
    episode's file area: the file and its rollback journal are opened here and SQLite keeps both
    open from then on (exclusive locking), so nothing the process runs later opens either by path."""
    if not os.path.exists(path):
        write_db(path, world)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, factory=connection_class(tools_kind))
    execute = sqlite3.Connection.execute
    execute(conn, "PRAGMA synchronous = OFF")  # the file lives as long as the episode
    # one process at a time has the file open (`processes`): it keeps its lock, no re-check per statement
    execute(conn, "PRAGMA locking_mode = EXCLUSIVE")
    # a write rolled back: rolls back a journal a killed process left, takes the lock and opens the
    # journal, which exclusive locking keeps open (zeroed between transactions) until the process ends
    version = int(execute(conn, "PRAGMA user_version").fetchone()[0])
    execute(conn, "BEGIN")
    execute(conn, f"PRAGMA user_version = {version}")
    execute(conn, "ROLLBACK")
    harden(conn, transactions=refuse_transaction_control)
    conn.row_factory = sqlite3.Row
    guard.GUARD.watch(conn)
    worldclock.bind_sql(conn, clock)
    return conn


#: The files SQLite keeps beside a database file (a killed process's journal goes with its file).
DATABASE_SIDE_FILES = ("-journal", "-wal", "-shm")


def write_db(path: str, data: bytes) -> None:
    """Make `data` (a serialized database) the database file at `path`, whole or not at all, in a
    directory no episode's code can write (docs/security.md). Nothing in the way is followed: the
    directory is opened without following a link, the new file made afresh there (`O_EXCL`, any entry
    of its name removed first) and renamed over the old one; stale side files are removed."""
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    dir_fd = open_directory(directory)
    try:
        fresh = name + ".new"
        create_at(dir_fd, fresh, data, 0o600)
        remove_side_files_at(dir_fd, name)
        os.replace(fresh, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def remove_db(path: str) -> None:
    """Remove the database file at `path` and its side files, if any (nothing is followed)."""
    directory, name = os.path.split(path)
    try:
        dir_fd = open_directory(directory)
    except FileNotFoundError:
        return
    try:
        remove_at(dir_fd, name)
        remove_at(dir_fd, name + ".new")
        remove_side_files_at(dir_fd, name)
    finally:
        os.close(dir_fd)


def open_directory(path: str) -> int:
    """A descriptor of the directory at `path`, opened without following a link."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def create_at(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """`data` as a new file `name` of the directory open as `dir_fd`: any entry of that name (a link, a
    pipe) is removed first, never followed, and the file is made afresh (`O_EXCL`)."""
    remove_at(dir_fd, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(name, flags, mode, dir_fd=dir_fd), "wb") as handle:
        handle.write(data)


def remove_side_files_at(dir_fd: int, name: str) -> None:
    """Remove database `name`'s side files (journal, WAL, shared memory) of the directory open as `dir_fd`."""
    for suffix in DATABASE_SIDE_FILES:
        remove_at(dir_fd, name + suffix)


def remove_at(dir_fd: int, name: str) -> None:
    """Remove entry `name` of the directory open as `dir_fd` (a link itself, never what it points to), if any."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def begin_call(conn: EpisodeConnection, tools_kind: ToolsKind) -> int:
    """Open the runtime's savepoints for a tool call on `conn`, its rows read as the call's settings
    say; returns the connection's count of changes so far (`changed_since`). Read through
    sqlite3.Connection and the runtime's own constants: tools may plant attributes on their connection
    or its class, which must not run here with the guard off."""
    row_factory, savepoints = _CALL_SETTINGS[connection_class(tools_kind)]
    _ROW_FACTORY.__set__(conn, row_factory)
    changes: int = _TOTAL_CHANGES.__get__(conn)
    for savepoint in savepoints:
        sqlite3.Connection.execute(conn, f"SAVEPOINT {savepoint}")
    return changes


def changed_since(conn: sqlite3.Connection, changes: int) -> bool:
    """Whether `conn` changed rows since its count of changes was `changes` (`begin_call`)."""
    now: int = _TOTAL_CHANGES.__get__(conn)
    return now != changes


def end_call(conn: sqlite3.Connection, *, commit: bool) -> None:
    """End a tool call's savepoint: keep its writes (`commit`) or undo them."""
    try:
        if not commit:
            sqlite3.Connection.execute(conn, f"ROLLBACK TO {SAVEPOINT}")
        sqlite3.Connection.execute(conn, f"RELEASE {SAVEPOINT}")
    except sqlite3.Error:
        if _IN_TRANSACTION.__get__(conn):  # the tool ended our savepoint itself; leave no transaction open
            sqlite3.Connection.execute(conn, "COMMIT" if commit else "ROLLBACK")
