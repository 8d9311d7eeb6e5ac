"""Run records of flows in the catalog (evaluation and training runs): the current flow run's
id, the process that runs a run, finishing a run row with its status and metrics, and the
`on_crashed` hook that fails the rows of a flow run whose process died."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect.context import FlowRunContext
from sqlmodel import SQLModel, select

from worldsmith.models.catalog import EvaluationRun, TrainingRun, TrainingStep, utcnow
from worldsmith.ops.run_owner import this_process
from worldsmith.storage.catalog import open_catalog

RUN_TABLES: tuple[type[SQLModel], ...] = (EvaluationRun, TrainingRun)


def current_flow_run_id() -> str | None:
    """The id of the Prefect flow run this code runs in (also from inside its tasks), or None outside one."""
    context = FlowRunContext.get()
    return str(context.flow_run.id) if context and context.flow_run else None


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


def mark_crashed(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect `on_crashed` hook, run by the worker when a flow run's process dies (SIGKILL, out of
    memory): the catalog's run rows of that flow run and of its subflow runs that still read
    `running` become `failed`, their error naming the crash, so the dashboard shows them as they
    are and a training run among them can be resumed."""
    ids = _with_subflows(flow_run.id)
    with open_catalog().session() as session:
        running = [(table, run_id) for table in RUN_TABLES
                   for run_id in session.exec(select(table.id).where(table.flow_run_id.in_(ids), table.status == "running"))]
    for table, run_id in running:
        finish_run(table, run_id, "failed", {"error": f"crashed: {state.message or state.name}"})


def _with_subflows(flow_run_id: UUID) -> list[str]:
    """`flow_run_id` and the ids of all its subflow runs, at any depth, as strings."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    found, frontier = [str(flow_run_id)], [flow_run_id]
    with get_client(sync_client=True) as client:
        while frontier:
            children = client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier)))
            frontier = [child.id for child in children if str(child.id) not in found]
            found += [str(child) for child in frontier]
    return found
