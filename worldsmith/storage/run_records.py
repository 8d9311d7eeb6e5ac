"""Run records in the catalog (evaluation and training runs): adding a run row owned by this
process, updating and finishing it with its status and metrics, its per-step rows, and failing
the rows left `running` by flow runs whose process died. Knows nothing of Prefect: a flow passes
its flow run id (`worldsmith/flows/records.py` reads it and holds the `on_crashed` hook)."""

from __future__ import annotations

from typing import Any

from sqlmodel import SQLModel, select

from worldsmith.models.catalog import EvaluationRun, TrainingRun, TrainingStep, utcnow
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.run_owner import this_process

RUN_TABLES: tuple[type[SQLModel], ...] = (EvaluationRun, TrainingRun)


def add_run(row: SQLModel) -> int:
    """Insert a run row (status `running`, metrics `process`: this process) and return its id."""
    row.metrics = {**row.metrics, "process": this_process()}
    with open_catalog().session() as session:
        session.add(row)
        session.commit()
        return row.id


def finish_run(table: type[SQLModel], run_id: int, status: str, metrics: dict[str, Any]) -> None:
    """Set the run's status and finish time and merge `metrics` into its metrics."""
    update_run(table, run_id, metrics, status=status, finished=True)


def update_run(
    table: type[SQLModel],
    run_id: int,
    metrics: dict[str, Any],
    *,
    status: str | None = None,
    finished: bool = False,
    flow_run_id: str | None = None,
) -> None:
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


def fail_running(flow_run_ids: list[str], error: str) -> None:
    """The run rows of the flow runs `flow_run_ids` that still read `running` become `failed`, with `error`."""
    with open_catalog().session() as session:
        running = [
            (table, run_id)
            for table in RUN_TABLES
            for run_id in session.exec(
                select(table.id).where(table.flow_run_id.in_(flow_run_ids), table.status == "running")
            )
        ]
    for table, run_id in running:
        finish_run(table, run_id, "failed", {"error": error})
