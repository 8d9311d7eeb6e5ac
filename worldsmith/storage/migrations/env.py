"""Alembic environment of the catalog: runs on the connection `Catalog.upgrade` hands over."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import worldsmith.models.catalog  # noqa: F401 - registers the tables on SQLModel.metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # pragma: no cover - `alembic` command line: build an engine from the URL
    from sqlalchemy import create_engine

    url = config.get_main_option("sqlalchemy.url")
    assert url is not None, "the Alembic configuration names no sqlalchemy.url"
    connection = create_engine(url).connect()

context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
