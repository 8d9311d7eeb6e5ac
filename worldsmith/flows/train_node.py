"""The `train-node` flow: one of nodes 1..N-1 of a multi-node training run, started by the `train`
flow's node 0 through the `train-node` deployment on the gpu pool (`DeploymentNodes`, below).

It runs the run's TrainRequest as node `node_rank` (`config.processes` training processes) and joins
node 0 at `rendezvous`; it ends when its agent does: completed, or failed with one line naming the
node and the last error of its log (OUTPUT/node-N.log), which node 0 reports. The request's model,
bundle and output paths must hold on this machine (a shared file system); where one is missing the
run fails at once, naming it. `DeploymentNodes` starts nodes as runs of this flow and `FlowRunNode`
watches one through the Prefect API; `default_node_launcher` (the train flow's and the CLI's) checks
that the deployment exists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, cast
from uuid import UUID

from prefect import flow

from worldsmith.training.launch import (
    LaunchFailed,
    NodeLauncher,
    NodeOutcome,
    NodeRun,
    Rendezvous,
    TrainRequest,
    last_error,
    stop_process,
)
from worldsmith.training.nodes import run_node_command

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun, State

TRAIN_NODE_DEPLOYMENT = "train-node/train-node"
"""The deployment (flow/deployment) that starts nodes 1.. of a multi-node run (deployments/prefect.yaml)."""
API_PATIENCE_S = 60.0
"""How long a flow run node's state may go unread (the Prefect API failing) before the run fails."""


class NodeFinished(TypedDict):
    """A node of a multi-node run that finished: its rank and its training processes' log."""

    node_rank: int
    log: str


@flow(name="train-node", log_prints=True, flow_run_name="train-node-{node_rank}-run-{request.run_id}")
def train_node(request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> NodeFinished:
    """Node `node_rank` of a multi-node training run; started by the run's node 0, not by hand.

    Args:
        request: The training step's request, the same on every node (its paths hold on every node).
        node_rank: This node's rank (1 .. nodes-1; node 0 is the train flow's own machine).
        rendezvous: Node 0's rendezvous address, the number of nodes and the join timeout.
    """
    process, log = run_node_command(request, node_rank, rendezvous)
    try:
        code = process.wait()
    finally:
        stop_process(process)  # a cancelled or crashed flow run leaves no training processes behind
    if code != 0:
        raise LaunchFailed(f"training node {node_rank} failed (exit {code}): {last_error(log)} (log: {log})")
    return {"node_rank": node_rank, "log": str(log)}


@dataclass
class FlowRunNode:
    """A node running as a flow run of the train-node deployment. While the Prefect API fails to answer
    (a transient HTTP error), the node counts as still running and started, for at most `patience_s`
    of consecutive failures; then LaunchFailed naming the API."""

    name: str
    flow_run_id: UUID
    patience_s: float = API_PATIENCE_S
    _failing_since: float | None = field(default=None, init=False, repr=False)

    def _state(self) -> State[Any] | None:
        """The flow run's state, or None while the API fails (within patience)."""
        import httpx
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(self.flow_run_id).state
        except ObjectNotFound:
            raise LaunchFailed(f"training {self.name}: its flow run {self.flow_run_id} no longer exists") from None
        except httpx.HTTPError as exc:  # PrefectHTTPStatusError included
            now = time.monotonic()
            self._failing_since = self._failing_since if self._failing_since is not None else now
            if now - self._failing_since < self.patience_s:
                return None
            from prefect.settings import PREFECT_API_URL

            raise LaunchFailed(
                f"the Prefect API ({PREFECT_API_URL.value() or 'not set'}) did not answer about training {self.name} "
                f"for {self.patience_s:.0f} s: {type(exc).__name__}: {exc}"
            ) from None
        self._failing_since = None
        return state

    def outcome(self) -> NodeOutcome | None:
        state = self._state()
        if state is None or not state.is_final():
            return None
        error = (state.message or "").removeprefix("Flow run encountered an exception: ")  # Prefect's wording
        return NodeOutcome(ok=state.is_completed(), detail=f"flow run {state.name}", error=error)

    def started(self) -> bool:
        state = self._state()  # unknown (the API failing): not blamed for never starting
        return state is None or not (state.is_scheduled() or state.is_pending())

    def waiting_reason(self) -> str:
        state = self._state()
        return (
            f"its flow run is still {state.name if state else 'unknown'}: is a worker of the gpu pool running, "
            "with a free slot?"
        )

    def stop(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.states import Cancelled, Cancelling

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(self.flow_run_id).state
            if state is None or state.is_scheduled() or state.is_pending():  # no process to end: ended here
                client.set_flow_run_state(self.flow_run_id, Cancelled(), force=True)
            elif not state.is_final():  # its worker ends the flow run's process
                client.set_flow_run_state(self.flow_run_id, Cancelling(), force=True)


@dataclass(frozen=True)
class DeploymentNodes:
    """Nodes as runs of the train-node deployment, started on the gpu pool's workers."""

    deployment: str = TRAIN_NODE_DEPLOYMENT

    def start(self, request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> NodeRun:
        """The started flow run of node `node_rank`; LaunchFailed in one line when the API refuses it."""
        import httpx
        from prefect.deployments import run_deployment
        from prefect.exceptions import ObjectNotFound

        try:
            started = run_deployment(
                self.deployment,
                parameters={
                    "request": request.model_dump(mode="json"),
                    "node_rank": node_rank,
                    "rendezvous": rendezvous.model_dump(),
                },
                flow_run_name=f"train-node-{node_rank}-run-{request.run_id}",  # as the flow names itself
                timeout=0,  # started, not awaited: node 0 watches it
            )
            run = cast("FlowRun", started)  # called from sync code: the flow run, not a coroutine
        except (httpx.HTTPError, ObjectNotFound) as exc:  # the API down, or the deployment gone since the check
            raise LaunchFailed(
                f"training node {node_rank} of {rendezvous.nodes} could not be started as a run of {self.deployment}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return FlowRunNode(f"node {node_rank} of {rendezvous.nodes} (flow run {run.name})", run.id)


def default_node_launcher() -> NodeLauncher:
    """DeploymentNodes when the Prefect API has the train-node deployment; else LaunchFailed (exit 2)
    naming how to deploy it."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(TRAIN_NODE_DEPLOYMENT)
        except ObjectNotFound:
            raise LaunchFailed(
                f"a multi-node run starts its other nodes as runs of the {TRAIN_NODE_DEPLOYMENT} deployment, which "
                "this Prefect API lacks: run `worldsmith up`, or `prefect deploy --prefect-file "
                "deployments/prefect.yaml --name train-node`",
                exit_code=2,
            ) from None
    return DeploymentNodes()
