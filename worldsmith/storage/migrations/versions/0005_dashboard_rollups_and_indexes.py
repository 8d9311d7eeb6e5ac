"""the dashboard at fleet size: stage attempts rolled up at three grains (per night, run, world and stage:
stage_rollups; per night, run and stage: night_rollups; per world: world_rollups) and failed attempts per
error class at two (failure_rollups, night_failure_rollups), kept by a trigger on stage_attempts and filled
from the attempts already recorded; indexes for the dashboard's version and attempt queries

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 22:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

#: The UTC night of an attempt's time, per dialect (as worldsmith/dashboard/filters.night_of reads it).
NIGHT = {"sqlite": "date({t})", "postgresql": "date(timezone('UTC', {t}))"}
EARLIER = {"sqlite": "min", "postgresql": "least"}
LATER = {"sqlite": "max", "postgresql": "greatest"}
#: Each rollup's key: the sums rollups (AttemptSums) and the failure counts.
SUMS_ROLLUPS = {
    "stage_rollups": ("night", "run_id", "env_id", "stage"),
    "night_rollups": ("night", "run_id", "stage"),
    "world_rollups": ("env_id",),
}
#: Attempts a rollup leaves out: the world totals leave out the pseudo-stage `environment` (older catalogs
#: recorded a world's failure as an attempt of it; worldsmith/dashboard/drilldown.PSEUDO_STAGES).
LEFT_OUT = {"world_rollups": "{row}stage <> 'environment'"}
FAILURE_ROLLUPS = {
    "failure_rollups": ("night", "run_id", "env_id", "stage", "error_class"),
    "night_failure_rollups": ("night", "run_id", "stage", "error_class"),
}
KEY_COLUMNS = {
    "night": sa.Date,
    "run_id": lambda: sqlmodel.sql.sqltypes.AutoString(length=64),
    "env_id": lambda: sqlmodel.sql.sqltypes.AutoString(length=64),
    "stage": lambda: sqlmodel.sql.sqltypes.AutoString(length=32),
    "error_class": lambda: sqlmodel.sql.sqltypes.AutoString(length=128),
}
SUMS = ("invocations", "first_ok", "repaired", "failures", "tokens_in", "tokens_out", "cost_usd", "seconds")


def _flag(condition: str) -> str:
    return f"CASE WHEN {condition} THEN 1 ELSE 0 END"


def _key(column: str, dialect: str, row: str) -> str:
    """The SQL of a rollup key column for an attempt (`row`: `NEW.` in the trigger, `` in the backfill)."""
    if column == "night":
        return NIGHT[dialect].format(t=f"{row}created_at")
    if column in ("env_id", "error_class"):
        return f"coalesce({row}{column}, '')"
    return f"{row}{column}"


def _values(row: str) -> list[str]:
    """One attempt's contribution to each column of AttemptSums (attempts first, first_at and last_at last)."""
    first, ok = f"{row}attempt = 1", f"{row}outcome = 'success'"
    return [
        "1",
        _flag(first),
        _flag(f"{first} AND {ok}"),
        _flag(f"{row}attempt > 1 AND {ok}"),
        _flag(f"{row}outcome <> 'success'"),
        f"{row}tokens_in",
        f"{row}tokens_out",
        f"{row}cost_usd",
        f"{row}seconds",
        f"{row}created_at",
        f"{row}created_at",
    ]


def _rollup_upserts(dialect: str) -> str:
    """The statements the trigger runs for one new attempt `NEW`: add it to every sums rollup and, when it
    failed, to every failure rollup."""
    statements = []
    for table, key in SUMS_ROLLUPS.items():
        keys = ", ".join(_key(c, dialect, "NEW.") for c in key)
        added = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in ("attempts", *SUMS))
        statements.append(
            f"INSERT INTO {table} ({', '.join(key)}, attempts, {', '.join(SUMS)}, first_at, last_at) "
            f"SELECT {keys}, {', '.join(_values('NEW.'))} WHERE {LEFT_OUT.get(table, '1 = 1').format(row='NEW.')} "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {added}, "
            f"first_at = {EARLIER[dialect]}({table}.first_at, excluded.first_at), "
            f"last_at = {LATER[dialect]}({table}.last_at, excluded.last_at);"
        )
    for table, key in FAILURE_ROLLUPS.items():
        keys = ", ".join(_key(c, dialect, "NEW.") for c in key)
        statements.append(
            f"INSERT INTO {table} ({', '.join(key)}, failures) SELECT {keys}, 1 WHERE NEW.outcome <> 'success' "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET failures = {table}.failures + 1;"
        )
    return "\n".join(statements)


def _backfill(dialect: str) -> list[str]:
    """Fill every rollup from the attempts recorded before the trigger existed."""
    statements = []
    for table, key in SUMS_ROLLUPS.items():
        keys = ", ".join(_key(c, dialect, "") for c in key)
        sums = ", ".join(f"sum({v})" for v in _values("")[:-2])
        positions = ", ".join(str(i + 1) for i in range(len(key)))
        statements.append(
            f"INSERT INTO {table} ({', '.join(key)}, attempts, {', '.join(SUMS)}, first_at, last_at) "
            f"SELECT {keys}, {sums}, min(created_at), max(created_at) FROM stage_attempts "
            f"WHERE {LEFT_OUT.get(table, '1 = 1').format(row='')} GROUP BY {positions}"
        )
    for table, key in FAILURE_ROLLUPS.items():
        keys = ", ".join(_key(c, dialect, "") for c in key)
        positions = ", ".join(str(i + 1) for i in range(len(key)))
        statements.append(
            f"INSERT INTO {table} ({', '.join(key)}, failures) SELECT {keys}, count(*) FROM stage_attempts "
            f"WHERE outcome <> 'success' GROUP BY {positions}"
        )
    return statements


def _sums_columns() -> list[sa.Column]:
    counts = ("attempts", "invocations", "first_ok", "repaired", "failures")
    return [
        *(sa.Column(name, sa.Integer(), nullable=False) for name in counts),
        sa.Column("tokens_in", sa.BigInteger(), nullable=False),
        sa.Column("tokens_out", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("first_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("last_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
    ]


def _create(table: str, key: tuple[str, ...], columns: list[sa.Column]) -> None:
    op.create_table(
        table,
        *columns,
        *(sa.Column(c, KEY_COLUMNS[c](), nullable=False) for c in key),
        sa.PrimaryKeyConstraint(*key),
    )


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table, key in SUMS_ROLLUPS.items():
        _create(table, key, _sums_columns())
    for table, key in FAILURE_ROLLUPS.items():
        _create(table, key, [sa.Column("failures", sa.Integer(), nullable=False)])
    op.create_index("ix_stage_rollups_env_id", "stage_rollups", ["env_id"])
    op.create_index("ix_stage_rollups_run_id", "stage_rollups", ["run_id"])
    op.create_index("ix_stage_rollups_stage_night", "stage_rollups", ["stage", "night"])
    op.create_index("ix_failure_rollups_env_id", "failure_rollups", ["env_id"])
    op.create_index("ix_environment_versions_status_created_at", "environment_versions", ["status", "created_at"])
    op.create_index("ix_environment_versions_created_at", "environment_versions", ["created_at"])
    op.create_index("ix_environment_versions_generator_backend", "environment_versions", ["generator_backend"])
    op.create_index("ix_stage_attempts_env_id_created_at", "stage_attempts", ["env_id", "created_at"])
    for statement in _backfill(dialect):
        op.execute(statement)
    if dialect == "postgresql":
        op.execute(
            "CREATE FUNCTION stage_attempts_rollup() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"{_rollup_upserts(dialect)} RETURN NULL; END $$"
        )
        op.execute(
            "CREATE TRIGGER stage_attempts_rollup AFTER INSERT ON stage_attempts "
            "FOR EACH ROW EXECUTE FUNCTION stage_attempts_rollup()"
        )
    else:
        op.execute(
            f"CREATE TRIGGER stage_attempts_rollup AFTER INSERT ON stage_attempts BEGIN {_rollup_upserts(dialect)} END"
        )


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.execute("DROP TRIGGER IF EXISTS stage_attempts_rollup" + (" ON stage_attempts" if postgresql else ""))
    if postgresql:
        op.execute("DROP FUNCTION IF EXISTS stage_attempts_rollup()")
    op.drop_index("ix_stage_attempts_env_id_created_at", table_name="stage_attempts")
    op.drop_index("ix_environment_versions_generator_backend", table_name="environment_versions")
    op.drop_index("ix_environment_versions_created_at", table_name="environment_versions")
    op.drop_index("ix_environment_versions_status_created_at", table_name="environment_versions")
    for table in (*SUMS_ROLLUPS, *FAILURE_ROLLUPS):
        op.drop_table(table)  # with its indexes
