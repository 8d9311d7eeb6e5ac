"""The Prefect side of run records (`worldsmith/storage/run_records.py`): the current flow run's id,
the run rows a flow opens (`start_evaluation_run`, `start_training_run`, `open_record`) and ends when it
raises (`failed_on_error`: `cancelled` when stopped by a signal, else `failed`), and the `on_crashed` hook
that marks `crashed` the run rows of a flow run whose process died."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect.context import FlowRunContext

from worldsmith.flows.interruption import Interrupted
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.catalog import EvaluationRun, TrainingRun
from worldsmith.models.runs import RunStatus
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.run_records import RunRow, add_run, crash_running, finish_run
from worldsmith.storage.sets import get_set
from worldsmith.tasks.parameters import EvaluateParameters


def current_flow_run_id() -> str | None:
    """The id of the Prefect flow run this code runs in (also from inside its tasks), or None outside one."""
    context = FlowRunContext.get()
    return str(context.flow_run.id) if context and context.flow_run else None


def _set_id(set_name: str) -> int:
    """The id of environment set `set_name`; CatalogError naming it when there is none."""
    with open_catalog().session() as session:
        set_id = get_set(session, set_name).id
    assert set_id is not None  # a stored set
    return set_id


def start_evaluation_run(params: EvaluateParameters) -> int:
    """A `running` evaluation run of the current flow run on set `params.set_name`, its parameters
    recorded; returns its id."""
    return add_run(
        EvaluationRun(
            set_id=_set_id(params.set_name),
            policy=params.policy,
            samples=params.samples,
            flow_run_id=current_flow_run_id(),
            metrics={"parameters": params.model_dump()},
        )
    )


def start_training_run(set_name: str, config: JsonObject) -> int:
    """A `running` training run of the current flow run on set `set_name` with `config`; returns its id."""
    return add_run(TrainingRun(set_id=_set_id(set_name), config=config, flow_run_id=current_flow_run_id()))


@contextmanager
def failed_on_error(table: type[RunRow], run_id: int | str, extra: Callable[[], JsonObject] = dict) -> Iterator[None]:
    """Inside, any exception finishes run `run_id` of `table` and propagates: `cancelled` for a stop by a
    signal (`Interrupted`, KeyboardInterrupt), `failed` for any other, its error the exception's type and
    message; `extra()` merged into its metrics."""
    try:
        yield
    except BaseException as exc:
        stopped = isinstance(exc, Interrupted | KeyboardInterrupt)
        status = RunStatus.CANCELLED if stopped else RunStatus.FAILED
        finish_run(table, run_id, status, {"error": f"{type(exc).__name__}: {exc}", **extra()})
        raise


def mark_crashed(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect `on_crashed` hook, run by the worker when a flow run's process dies (SIGKILL, out of
    memory): the catalog's run rows of that flow run and of its subflow runs that still read
    `running` become `crashed`, their error naming the crash, so the dashboard shows them as they
    are and a training run among them can be resumed."""
    crash_running(_with_subflows(flow_run.id), f"crashed: {state.message or state.name}")


def _with_subflows(flow_run_id: UUID) -> list[str]:
    """`flow_run_id` and the ids of all its subflow runs, at any depth, as strings."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    found, frontier = [str(flow_run_id)], [flow_run_id]
    with get_client(sync_client=True) as client:
        while frontier:
            children = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier))
            )
            frontier = [child.id for child in children if str(child.id) not in found]
            found += [str(child) for child in frontier]
    return found
