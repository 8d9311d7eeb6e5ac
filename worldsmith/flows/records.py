"""Run records of flows in the catalog (evaluation and training runs): the current flow run's
id, and finishing a run row with its status and metrics."""

from __future__ import annotations

from typing import Any

from prefect.context import get_run_context
from sqlmodel import SQLModel

from worldsmith.models.catalog import TrainingStep, utcnow
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
    update_run(table, run_id, metrics, status=status, finished=True)


def update_run(table: type[SQLModel], run_id: int, metrics: dict[str, Any], *, status: str | None = None, finished: bool = False,
               flow_run_id: str | None = None) -> None:
    """Merge `metrics` into the run's metrics; set its status (and finish time, or clear it when
    not `finished`) and flow run when given."""
    with open_catalog().session() as session:
        run = session.get(table, run_id)
        run.metrics = {**run.metrics, **metrics}
        if status is not None:
            run.status, run.finished_at = status, utcnow() if finished else None
        if flow_run_id is not None:
            run.flow_run_id = flow_run_id
        session.add(run)
        session.commit()


def record_step(run_id: int, step: int, metrics: dict[str, Any]) -> None:
    """A `training_steps` row of run `run_id`: one optimizer step, or one co-training round."""
    with open_catalog().session() as session:
        session.add(TrainingStep(training_run_id=run_id, step=step, metrics=metrics))
        session.commit()
