"""The `curate` flow: an environment set from what passed the gates.

the catalog's good versions (latest per env) -> filtered by the query (categories, minimum tasks
and tools, quality checks that must have passed) -> sampled and split by environment -> an
immutable set. Run again with the same name and query it returns the set it made (a retried or
re-triggered run duplicates nothing); the same name with another query is refused.
"""

from __future__ import annotations

import uuid

from prefect import flow, task

from worldsmith.flows.artifacts import summarise_curation
from worldsmith.flows.records import current_flow_run_id, failed_on_error, mark_crashed
from worldsmith.flows.run_names import named_after
from worldsmith.models.catalog import RunRecord
from worldsmith.models.curation import CuratedMember, CurationResult
from worldsmith.models.runs import RecordedKind, RunStatus
from worldsmith.models.sets import SetQuery
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.publish import CatalogError
from worldsmith.storage.run_records import finish_run, open_record
from worldsmith.storage.sets import create_set, get_set, members_of
from worldsmith.tasks.parameters import CurateParameters


@task(name="create-set", retries=2, retry_delay_seconds=2, task_run_name="create-set-{name}")
def make_set(name: str, query: SetQuery) -> CurationResult:
    """Create set `name` from `query`, or return it when it already exists from the same query."""
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
def curate(params: CurateParameters = CurateParameters()) -> CurationResult:
    """Build an environment set from the catalog's good versions; returns its name and members.

    Args:
        params: The set: its name, and the query choosing and splitting the catalog's good versions.

    Its `RunRecord` (kind `curate`) holds its status, members and whether it created the set.
    """
    run_id = current_flow_run_id() or str(uuid.uuid4())
    open_record(RecordedKind.CURATE, run_id, f"set {params.set_name()}", current_flow_run_id())
    with failed_on_error(RunRecord, run_id):
        result = make_set(params.set_name(), params.query)
        summarise_curation(result)
    finish_run(RunRecord, run_id, RunStatus.COMPLETED, {"members": len(result.members), "created": result.created})
    return result
