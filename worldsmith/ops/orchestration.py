"""What the Prefect API says about the operations of an installation (`worldsmith status`, and the
dashboard through `stalled_deployments`): its work pools with their workers (online or not, last
heartbeat), the deployments whose pool has no live worker (their runs would wait, Late, forever)
with how to start one, and the latest flow runs.

Every call is short: an unreachable API answers within a few seconds and never starts a server
(an unset PREFECT_API_URL would make the Prefect client start a temporary one)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx

from worldsmith.jsonvalue import JsonObject

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

#: Seconds a request to the Prefect API may take.
TIMEOUT_S = 3.0
#: Heartbeats a worker may miss before it counts as gone (Prefect's foreman marks it offline then).
MISSED_HEARTBEATS = 3
#: A worker's heartbeat interval when it reported none (Prefect's default).
DEFAULT_HEARTBEAT_S = 30
#: Flow run states in which a run waits for a worker to pick it up.
WAITING_STATES = frozenset({"Scheduled", "Late", "Pending", "AwaitingRetry"})


def worker_hint(pool: str) -> str:
    """How to start a worker on `pool`."""
    return f"start one with `worldsmith up --worker {pool}` here, or `prefect worker start --pool {pool}` on its host"


def configured_api_url() -> str | None:
    """The Prefect API this process would report to (PREFECT_API_URL, from the environment or a Prefect
    profile or settings context), or None when none is set."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def api_reachable(api_url: str, timeout_s: float = TIMEOUT_S) -> bool:
    """Whether the Prefect API at `api_url` answers its health check within `timeout_s` (no retries)."""
    try:
        return httpx.get(f"{api_url.rstrip('/')}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class WorkerState:
    name: str
    live: bool
    status: str
    last_heartbeat: str | None


@dataclass
class PoolState:
    name: str
    type: str
    status: str
    paused: bool
    workers: list[WorkerState] = field(default_factory=list)

    @property
    def live_workers(self) -> int:
        return sum(1 for w in self.workers if w.live)


@dataclass
class DeploymentState:
    name: str
    pool: str | None
    paused: bool
    live_workers: int
    #: Why its runs would not start (no pool, no live worker on the pool, paused), with the fix; None when they would.
    problem: str | None


@dataclass
class FlowRunState:
    id: str
    name: str
    flow: str
    deployment: str | None
    state: str
    expected_start: str | None
    #: For a run waiting for a worker whose pool has none live: that, with the fix.
    problem: str | None


@dataclass
class Orchestration:
    """The Prefect side of an installation at one moment."""

    api_url: str
    pools: list[PoolState]
    deployments: list[DeploymentState]
    flow_runs: list[FlowRunState]

    def as_dict(self) -> JsonObject:
        """As JSON (`worldsmith status --json`)."""
        return asdict(self)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment is not None else None


def _live(worker: Any, now: datetime) -> bool:
    """Online, with a heartbeat within MISSED_HEARTBEATS intervals (the server may not have marked it yet)."""
    if worker.last_heartbeat_time is None or str(worker.status.value).upper() != "ONLINE":
        return False
    interval = worker.heartbeat_interval_seconds or DEFAULT_HEARTBEAT_S
    recent: bool = now - worker.last_heartbeat_time <= timedelta(seconds=MISSED_HEARTBEATS * interval)
    return recent


def _deployment_problem(name: str, pool: PoolState | None, pool_name: str | None, paused: bool) -> str | None:
    if paused:
        return f"{name}: paused; resume it in the Prefect UI or with `prefect deployment resume`"
    if pool_name is None:
        return f"{name}: has no work pool; its runs start only where it is served"
    if pool is None:
        return f"{name}: work pool {pool_name} does not exist; `worldsmith up` creates the pools"
    if pool.paused:
        return f"{name}: pool {pool_name} is paused; resume it with `prefect work-pool resume {pool_name}`"
    if not pool.live_workers:
        return f"{name}: pool {pool_name} has no live worker; {worker_hint(pool_name)}"
    return None


@contextmanager
def _client(api_url: str, timeout_s: float) -> Iterator[SyncPrefectClient]:
    """A Prefect client of the API at `api_url` that never retries and waits at most `timeout_s` a request."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with (
        temporary_settings({PREFECT_API_URL: api_url, PREFECT_CLIENT_MAX_RETRIES: 0}),
        get_client(httpx_settings={"timeout": timeout_s}, sync_client=True) as client,
    ):
        yield client


def read_orchestration(api_url: str, flow_runs: int = 10, timeout_s: float = TIMEOUT_S) -> Orchestration:
    """Pools, workers, deployments and the latest `flow_runs` flow runs (by expected start, none in the
    future) from the Prefect API at `api_url`. Raises httpx.HTTPError (or a Prefect client error) when
    the API fails; call `api_reachable` first to answer quickly when nothing runs there."""
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterId,
        FlowRunFilter,
        FlowRunFilterExpectedStartTime,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    now = datetime.now(UTC)
    with _client(api_url, timeout_s) as client:
        pools = []
        for pool in client.read_work_pools():
            workers = [
                WorkerState(w.name, _live(w, now), str(w.status.value), _iso(w.last_heartbeat_time))
                for w in client.read_workers_for_work_pool(pool.name)
            ]
            status = str(pool.status.value) if pool.status is not None else "unknown"
            pools.append(PoolState(pool.name, pool.type, status, pool.is_paused, workers))
        deployments = client.read_deployments()
        runs = (
            client.read_flow_runs(
                # validated: prefect's DateTime is made from the datetime
                flow_run_filter=FlowRunFilter(
                    expected_start_time=FlowRunFilterExpectedStartTime.model_validate({"before_": now})
                ),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                limit=flow_runs,
            )
            if flow_runs
            else []
        )
        flow_ids = list({d.flow_id for d in deployments} | {r.flow_id for r in runs})
        flows = {f.id: f.name for f in client.read_flows(flow_filter=FlowFilter(id=FlowFilterId(any_=flow_ids)))}
    by_name = {p.name: p for p in pools}
    states, by_id = [], {}
    for d in sorted(deployments, key=lambda d: (flows.get(d.flow_id, ""), d.name)):
        name = f"{flows.get(d.flow_id, '?')}/{d.name}"
        pool_state = by_name.get(d.work_pool_name) if d.work_pool_name else None
        state = DeploymentState(
            name,
            d.work_pool_name,
            d.paused,
            pool_state.live_workers if pool_state else 0,
            _deployment_problem(name, pool_state, d.work_pool_name, d.paused),
        )
        states.append(state)
        by_id[d.id] = state
    latest = []
    for r in runs:
        deployment = by_id.get(r.deployment_id) if r.deployment_id else None
        # (a state's name defaults to its type's: None only without a state)
        state_name = r.state.name if r.state is not None and r.state.name is not None else "unknown"
        problem = deployment.problem if deployment is not None else None
        latest.append(
            FlowRunState(
                str(r.id),
                r.name,
                flows.get(r.flow_id, "?"),
                deployment.name if deployment else None,
                state_name,
                _iso(r.expected_start_time),
                f"waiting: {problem}" if problem is not None and state_name in WAITING_STATES else None,
            )
        )
    return Orchestration(api_url, pools, states, latest)


def stalled_deployments(api_url: str | None = None, timeout_s: float = TIMEOUT_S) -> list[DeploymentState] | None:
    """The deployments whose runs would not start (no live worker on their pool, no pool, paused), each
    with its `problem` (what is wrong and the fix), from the Prefect API at `api_url` (default: the
    configured one). [] when every deployment would run; None when no API is configured or it does not
    answer in time (nothing to report on). What the dashboard shows; `worldsmith status` reads the same."""
    api_url = api_url or configured_api_url()
    if not api_url or not api_reachable(api_url, timeout_s):
        return None
    try:
        orchestration = read_orchestration(api_url, flow_runs=0, timeout_s=timeout_s)
    except Exception:  # noqa: BLE001 - an API failing mid-read is as good as none for a page that refreshes
        return None
    return [d for d in orchestration.deployments if d.problem is not None]


def due_runs(api_url: str, timeout_s: float = TIMEOUT_S) -> dict[str, int]:
    """Per deployment (`flow/deployment`, as `DeploymentState.name`), its flow runs that are due: waiting
    for a worker (scheduled, late or pending) with their expected start passed. What makes a deployment
    that cannot start runs worth a warning: one nothing has asked to run yet (a GPU deployment on a
    machine without a GPU worker, a nightly schedule's next run) is not. Raises as `read_orchestration`."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowFilter,
        FlowFilterId,
        FlowRunFilter,
        FlowRunFilterDeploymentId,
        FlowRunFilterExpectedStartTime,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    now = datetime.now(UTC)
    with _client(api_url, timeout_s) as client:
        waiting = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(is_null_=False),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED, StateType.PENDING])),
                expected_start_time=FlowRunFilterExpectedStartTime.model_validate({"before_": now}),
            )
        )
        ids = list({r.deployment_id for r in waiting if r.deployment_id is not None})
        if not ids:
            return {}
        deployments = client.read_deployments(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=ids)))
        flow_ids = list({d.flow_id for d in deployments})
        flows = {f.id: f.name for f in client.read_flows(flow_filter=FlowFilter(id=FlowFilterId(any_=flow_ids)))}
    names = {d.id: f"{flows.get(d.flow_id, '?')}/{d.name}" for d in deployments}
    due: dict[str, int] = {}
    for r in waiting:
        if r.deployment_id in names:
            due[names[r.deployment_id]] = due.get(names[r.deployment_id], 0) + 1
    return due
