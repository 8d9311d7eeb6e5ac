"""The `curate` flow: an environment set from what passed the gates.

the catalog's good versions (latest per env) -> filtered by the query (categories, minimum tasks
and tools, quality checks that must have passed) -> sampled and split by environment -> an
immutable set. Run again with the same name and query it returns the set it made (a retried or
re-triggered run duplicates nothing); the same name with another query is refused.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any, cast

from prefect import State, flow, task
from prefect.states import Cancelled

from worldsmith.flows.artifacts import summarise_curation
from worldsmith.flows.interruption import STOP, Interrupted, run_stoppable
from worldsmith.flows.records import current_flow_run_id, failed_on_error, mark_crashed
from worldsmith.flows.run_names import named_after
from worldsmith.models.catalog import RunRecord
from worldsmith.models.curation import CuratedMember, CurationResult
from worldsmith.models.runs import RunKind, RunStatus
from worldsmith.models.sets import SetQuery
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.publish import CatalogError
from worldsmith.storage.run_records import finish_run, open_record
from worldsmith.storage.sets import create_set, get_set, members_of
from worldsmith.tasks.parameters import CurateParameters


def _not_stopped(task_: Any, task_run: Any, state: Any) -> bool:
    """Prefect retries the set's creation unless the run was asked to stop."""
    return not STOP.requested


@task(
    name="create-set",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_not_stopped,
    task_run_name="create-set-{name}",
)
def make_set(name: str, query: SetQuery) -> CurationResult:
    """Create set `name` from `query`, or return it when it already exists from the same query. Once the
    run is asked to stop (worldsmith/flows/interruption.py) it raises `Interrupted`, making nothing."""
    STOP.check()
    catalog = open_catalog()
    with catalog.session() as session:
        try:
            existing = get_set(session, name)
        except CatalogError:
            existing = None
        if existing is not None and SetQuery.model_validate(existing.query) != query:
            raise CatalogError(
                f"environment set {name!r} already exists with another query (sets are immutable; choose another name)"
            )
    created = existing is None
    if created:
        create_set(catalog, name, query)
    with catalog.session() as session:
        members = [
            CuratedMember(ref=v.ref, split=split, tasks=v.stats.get("tasks", 0), tools=v.stats.get("tools", 0))
            for v, split in members_of(session, get_set(session, name))
        ]
    return CurationResult(name=name, created=created, members=members)


@flow(
    name="curate",
    log_prints=True,
    on_crashed=[mark_crashed],  # its run record reads `crashed` when a worker sees its process die
    flow_run_name=named_after("curate", "params", CurateParameters, lambda p: p.set_name()),
)
def curate(params: CurateParameters = CurateParameters()) -> CurationResult | State:
    """Build an environment set from the catalog's good versions; returns its name and members.

    Args:
        params: The set: its name, and the query choosing and splitting the catalog's good versions.

    Its `RunRecord` (kind `curate`) holds its status, members and whether it created the set. Asked to
    stop (`STOP`) before the set is made, it makes none, the record reads `cancelled` and the flow run
    ends Cancelled.
    """
    run_id = current_flow_run_id() or str(uuid.uuid4())
    open_record(RunKind.CURATE, run_id, f"set {params.set_name()}", current_flow_run_id())
    try:
        with failed_on_error(RunRecord, run_id):  # cancelled when stopped
            result = make_set(params.set_name(), params.query)
            summarise_curation(result)
    except Interrupted as exc:
        return Cancelled(message=f"{exc}: set {params.set_name()} not made")
    finish_run(RunRecord, run_id, RunStatus.COMPLETED, {"members": len(result.members), "created": result.created})
    return result


def run_curate(params: CurateParameters, stop_on_signals: bool = False) -> CurationResult:
    """Run the flow in this process. With `stop_on_signals` (the CLI), SIGINT or SIGTERM stop it
    (`run_stoppable`): a set not yet made is not made, and `Interrupted` says whether it was."""

    def run() -> CurationResult:
        # a run that ends Cancelled raises here: Prefect resolves the state the flow returns to its result
        return cast(CurationResult, curate(params))

    if not stop_on_signals:
        return run()

    def stopped(signum: int) -> Interrupted:
        name = params.set_name()
        with open_catalog().session() as session:
            try:
                get_set(session, name)
                made = f"set {name} was made before the stop (`worldsmith sets ls`)"
            except CatalogError:
                made = f"set {name} was not made; run the command again to make it"
        return Interrupted(f"interrupted by {signal.Signals(signum).name}: {made}", signum)

    return run_stoppable(run, stopped)
