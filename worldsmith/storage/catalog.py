"""The catalog database: SQLModel on SQLite (default, foreign keys enforced) or PostgreSQL.

`Catalog(url)` connects and brings the schema to the newest Alembic revision, so an existing
catalog upgrades in place without losing rows.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import ConnectionPoolEntry
from sqlmodel import Session, create_engine

from worldsmith.failures import UserFixable

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
MIGRATION_LOCK_KEY = 0x776F726C64  # "world"
_MIGRATING = threading.Lock()  # Alembic's command API keeps global state: one migration at a time
_OPEN: dict[str, Catalog] = {}
_OPEN_LOCK = threading.Lock()


def _sqlite_pragmas(dbapi_connection: DBAPIConnection, connection_record: ConnectionPoolEntry) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.execute("PRAGMA busy_timeout = 30000")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.close()


#: The databases a catalog may live in (the URL's dialect, before any +driver).
DIALECTS = ("sqlite", "postgresql")


class CatalogUnavailable(UserFixable):
    """The configured catalog cannot be used (an unsupported or malformed URL, a database that does not
    answer); the message is one line naming WORLDSMITH_CATALOG_URL. `exit_code` 2: a bad setting; 1: a failure."""


def _shown(url: str) -> str:
    """`url` with any password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def check_url(url: str) -> None:
    """CatalogUnavailable (exit 2) unless `url` is a SQLite or PostgreSQL URL."""
    try:
        dialect = make_url(url).get_backend_name()
    except ArgumentError:
        raise CatalogUnavailable(
            f"the catalog URL {url!r} is not a database URL; set WORLDSMITH_CATALOG_URL to sqlite:///PATH "
            "or postgresql://USER:PASSWORD@HOST/DB",
            2,
        ) from None
    if dialect not in DIALECTS:
        raise CatalogUnavailable(
            f"the catalog cannot live in {dialect} ({_shown(url)}); set WORLDSMITH_CATALOG_URL to sqlite:///PATH "
            "or postgresql://USER:PASSWORD@HOST/DB",
            2,
        )


def read_only_sqlite(url: str) -> Path | None:
    """The database file of a SQLite `url` that exists in a directory this process cannot write (a
    read-only WORLDSMITH_HOME), else None."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    path = Path(parsed.database)
    return path if path.is_file() and not os.access(path.parent, os.W_OK) else None


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite connections enforce foreign keys and wait on locks. A SQLite catalog
    in a directory that cannot be written is opened read-only and immutable (its WAL files cannot be
    created there): reading works, a write is CatalogUnavailable naming the fix (`Catalog.session`)."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        read_only = read_only_sqlite(url)
        if read_only is not None:
            url = f"sqlite:///file:{read_only}?mode=ro&immutable=1&uri=true"
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        if read_only is None:
            event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


class Catalog:
    """A connection to the catalog database, migrated to the newest schema on open."""

    def __init__(self, url: str, *, migrate: bool = True):
        check_url(url)
        self.url = url
        self.engine = make_engine(url)
        if migrate:
            try:
                self.upgrade()
            except DBAPIError as exc:  # the database does not answer (down, refused, wrong password, no file)
                self.engine.dispose()
                reason = str(exc.orig or exc).strip().splitlines()[0]
                raise CatalogUnavailable(
                    f"the catalog database {_shown(url)} cannot be used: {reason}; check that it runs and "
                    "WORLDSMITH_CATALOG_URL",
                    1,
                ) from None

    def upgrade(self, revision: str = "head") -> None:
        """Apply pending migrations (idempotent). A catalog already at the newest revision is left
        alone: no lock file, no write (so a read-only catalog opens)."""
        if revision == "head" and self.revision() == self.head():
            return
        if read_only_sqlite(self.url) is not None:
            raise CatalogUnavailable(
                f"the catalog {_shown(self.url)} needs its schema upgraded but its directory is read-only; "
                "open it once where it can be written, or set WORLDSMITH_HOME to a writable directory",
                2,
            )
        config = alembic_config(self.url)
        with _MIGRATING, self._migration_lock(), self.engine.begin() as connection:
            if connection.dialect.name == "postgresql":  # other processes wait here until we are done
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

    @contextmanager
    def _migration_lock(self) -> Iterator[None]:
        """Across processes: an exclusive lock file beside a SQLite catalog (PostgreSQL uses an advisory lock)."""
        database = self.engine.url.database if self.engine.dialect.name == "sqlite" else None
        if not database or database == ":memory:":
            yield
            return
        with open(f"{database}.migrate.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def revision(self) -> str | None:
        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    @staticmethod
    def head() -> str | None:
        return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session whose work is committed on success and rolled back on error."""
        with Session(self.engine, expire_on_commit=False) as session:
            try:
                yield session
                session.commit()
            except DBAPIError as exc:
                session.rollback()
                if "readonly database" in str(exc.orig):
                    raise CatalogUnavailable(
                        f"the catalog {_shown(self.url)} is read-only (its directory cannot be written); set "
                        "WORLDSMITH_HOME (or WORLDSMITH_CATALOG_URL) to a writable place to change it",
                        2,
                    ) from None
                raise
            except BaseException:
                session.rollback()
                raise

    def close(self) -> None:
        self.engine.dispose()


def open_catalog(url: str | None = None) -> Catalog:
    """The catalog at `url`, or the configured one (`WORLDSMITH_CATALOG_URL`); one shared
    (migrated once) per URL in this process."""
    from worldsmith.settings import get_settings

    target = url or get_settings().resolved_catalog_url()
    with _OPEN_LOCK:
        if target not in _OPEN:
            _OPEN[target] = Catalog(target)
        return _OPEN[target]
