"""Run records of flows in the catalog (evaluation and training runs): the current flow run's
id, and finishing a run row with its status and metrics."""

from __future__ import annotations

from typing import Any

from prefect.context import get_run_context
from sqlmodel import SQLModel

from worldsmith.models.catalog import utcnow
from worldsmith.storage.catalog import open_catalog


def current_flow_run_id() -> str | None:
    """The id of the Prefect flow run this code runs in, or None outside one."""
    context = get_run_context()
    return str(context.flow_run.id) if context and getattr(context, "flow_run", None) else None


def add_run(row: SQLModel) -> int:
    """Insert a run row (status `running`) and return its id."""
    with open_catalog().session() as session:
        session.add(row)
        session.commit()
        return row.id


def finish_run(table: type[SQLModel], run_id: int, status: str, metrics: dict[str, Any]) -> None:
    """Set the run's status and finish time and merge `metrics` into its metrics."""
    with open_catalog().session() as session:
        run = session.get(table, run_id)
        run.status, run.finished_at = status, utcnow()
        run.metrics = {**run.metrics, **metrics}
        session.add(run)
        session.commit()
