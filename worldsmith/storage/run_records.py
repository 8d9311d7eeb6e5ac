"""Run records in the catalog (evaluation and training runs, and the `RunRecord` of the runs with no
table of their own: generation, curation): adding a run row owned by this process, updating and
finishing it with its status and metrics, its per-step rows, and marking `crashed` the rows left
`running` by flow runs whose process died. Knows nothing of Prefect: a flow passes its flow run id
(`worldsmith/flows/records.py` reads it and holds the `on_crashed` hook)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlmodel import col, select

from worldsmith.jsonvalue import JsonValue
from worldsmith.models.catalog import EvaluationRun, RunRecord, TrainingRun, TrainingStep, utcnow
from worldsmith.models.runs import RunKind, RunStatus
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.run_owner import this_process

#: A run row: its table has a status, metrics, a flow run and a finish time.
RunRow = EvaluationRun | TrainingRun | RunRecord
RUN_TABLES: tuple[type[RunRow], ...] = (EvaluationRun, TrainingRun, RunRecord)


def add_run(row: EvaluationRun | TrainingRun) -> int:
    """Insert a run row (status `running`, metrics `process`: this process) and return its id."""
    row.metrics = {**row.metrics, "process": this_process()}
    with open_catalog().session() as session:
        session.add(row)
        session.commit()
        run_id = row.id
        assert run_id is not None  # the database numbered it
        return run_id


def open_record(kind: RunKind, run_id: str, what: str, flow_run_id: str | None) -> None:
    """The `RunRecord` of run `run_id` made `running` and owned by this process (a run resumed under the
    same id starts its record again, its old error dropped)."""
    with open_catalog().session() as session:
        session.merge(
            RunRecord(run_id=run_id, kind=kind, what=what, metrics={"process": this_process()}, flow_run_id=flow_run_id)
        )
        session.commit()


def record_refused(kind: RunKind, what: str, error: str) -> str:
    """A `failed` `RunRecord` of a run refused before it started (an endpoint that does not answer), so the
    dashboard has a page naming the failure; returns its new id."""
    run_id = str(uuid.uuid4())
    with open_catalog().session() as session:
        session.add(
            RunRecord(
                run_id=run_id,
                kind=kind,
                what=what,
                status=RunStatus.FAILED,
                metrics={"error": error},
                finished_at=utcnow(),
            )
        )
        session.commit()
    return run_id


@contextmanager
def recorded_if_refused(kind: RunKind, what: str) -> Iterator[None]:
    """Inside (a command's checks before its run starts: the model endpoint's), an exception is recorded
    as a refused run (`record_refused`, its error the exception's one line) and propagates, whether or
    not the catalog could record it (the refusal is the answer; an unwritable catalog does not replace it)."""
    try:
        yield
    except Exception as exc:
        try:
            record_refused(kind, what, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except Exception:  # noqa: BLE001, S110 - a catalog that cannot record it must not replace the refusal
            pass
        raise


def finish_run(table: type[RunRow], run_id: int | str, status: RunStatus, metrics: Mapping[str, JsonValue]) -> None:
    """Set the run's status and finish time and merge `metrics` into its metrics."""
    update_run(table, run_id, metrics, status=status, finished=True)


def update_run(
    table: type[RunRow],
    run_id: int | str,
    metrics: Mapping[str, JsonValue],
    *,
    status: RunStatus | None = None,
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


def crash_running(flow_run_ids: list[str], error: str) -> None:
    """The run rows of the flow runs `flow_run_ids` that still read `running` become `crashed`, with `error`."""
    with open_catalog().session() as session:
        running: list[tuple[type[RunRow], int | str]] = [
            (table, run_id)
            for table in RUN_TABLES
            for run_id in session.exec(
                select(_key(table)).where(col(table.flow_run_id).in_(flow_run_ids), table.status == RunStatus.RUNNING)
            )
            if run_id is not None  # (a stored row's id never is)
        ]
    for table, run_id in running:
        finish_run(table, run_id, RunStatus.CRASHED, {"error": error})


def _key(table: type[RunRow]) -> Any:
    """SQL: the primary key column of a run table."""
    if issubclass(table, RunRecord):
        return col(RunRecord.run_id)
    return col(table.id)
