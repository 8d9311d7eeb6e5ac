"""Run records in the catalog (evaluation and training runs): adding a run row owned by this
process, updating and finishing it with its status and metrics, its per-step rows, and failing
the rows left `running` by flow runs whose process died. Knows nothing of Prefect: a flow passes
its flow run id (`worldsmith/flows/records.py` reads it and holds the `on_crashed` hook)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlmodel import col, select

from worldsmith.jsonvalue import JsonValue
from worldsmith.models.catalog import EvaluationRun, TrainingRun, TrainingStep, utcnow
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.run_owner import this_process

#: A run row: its table has a status, metrics, a flow run and a finish time.
RunRow = EvaluationRun | TrainingRun
RUN_TABLES: tuple[type[RunRow], ...] = (EvaluationRun, TrainingRun)


def add_run(row: RunRow) -> int:
    """Insert a run row (status `running`, metrics `process`: this process) and return its id."""
    row.metrics = {**row.metrics, "process": this_process()}
    with open_catalog().session() as session:
        session.add(row)
        session.commit()
        run_id = row.id
        assert run_id is not None  # the database numbered it
        return run_id


def finish_run(table: type[RunRow], run_id: int, status: str, metrics: Mapping[str, JsonValue]) -> None:
    """Set the run's status and finish time and merge `metrics` into its metrics."""
    update_run(table, run_id, metrics, status=status, finished=True)


def update_run(
    table: type[RunRow],
    run_id: int,
    metrics: Mapping[str, JsonValue],
    *,
    status: str | None = None,
    finished: bool = False,
    flow_run_id: str | None = None,
) -> None:
    """Merge `metrics` into the run's metrics; set its status (and finish time, or clear it when
    not `finished`) and flow run when given."""
    with open_catalog().session() as session:
        run = session.get(table, run_id)
        assert isinstance(run, RUN_TABLES), f"no {table.__name__} {run_id}"  # add_run made it
        run.metrics = {**run.metrics, **metrics}
        if status is not None:
            run.status, run.finished_at = status, utcnow() if finished else None
        if flow_run_id is not None:
            run.flow_run_id = flow_run_id
        session.add(run)
        session.commit()


def record_step(run_id: int, step: int, metrics: Mapping[str, JsonValue]) -> None:
    """A `training_steps` row of run `run_id`: one optimizer step, or one co-training round."""
    with open_catalog().session() as session:
        session.add(TrainingStep(training_run_id=run_id, step=step, metrics=dict(metrics)))
        session.commit()


def fail_running(flow_run_ids: list[str], error: str) -> None:
    """The run rows of the flow runs `flow_run_ids` that still read `running` become `failed`, with `error`."""
    with open_catalog().session() as session:
        running = [
            (table, run_id)
            for table in RUN_TABLES
            for run_id in session.exec(
                select(col(table.id)).where(col(table.flow_run_id).in_(flow_run_ids), table.status == "running")
            )
            if run_id is not None  # (a stored row's id never is)
        ]
    for table, run_id in running:
        finish_run(table, run_id, "failed", {"error": error})
