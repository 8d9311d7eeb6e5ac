"""The Prefect side of run records (`worldsmith/storage/run_records.py`): the current flow run's id,
and the `on_crashed` hook that fails the run rows of a flow run whose process died."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect.context import FlowRunContext

from worldsmith.storage.run_records import fail_running


def current_flow_run_id() -> str | None:
    """The id of the Prefect flow run this code runs in (also from inside its tasks), or None outside one."""
    context = FlowRunContext.get()
    return str(context.flow_run.id) if context and context.flow_run else None


def mark_crashed(flow: Any, flow_run: Any, state: Any) -> None:
    """Prefect `on_crashed` hook, run by the worker when a flow run's process dies (SIGKILL, out of
    memory): the catalog's run rows of that flow run and of its subflow runs that still read
    `running` become `failed`, their error naming the crash, so the dashboard shows them as they
    are and a training run among them can be resumed."""
    fail_running(_with_subflows(flow_run.id), f"crashed: {state.message or state.name}")


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
