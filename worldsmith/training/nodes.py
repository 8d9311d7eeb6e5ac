"""The other nodes of a multi-node training run (`TrainingConfig.nodes` > 1): `launch` runs node 0 on
the flow's machine and starts nodes 1..N-1 with a node launcher, then watches them (NodeRun).

- DeploymentNodes (the default when the `train-node` deployment exists): each node is a run of the
  `train-node` flow (worldsmith/flows/train_node.py), which a worker of the gpu pool starts on its
  machine;
- LocalNodes: each node is a local process of the same command (a test of the launch on one machine,
  or one machine's GPUs split into nodes).

Either way a node runs `run_node_command`'s agent: the same TrainRequest, its own node rank and node
0's rendezvous. Contract: the request's model, bundle and output paths hold on every node (a shared
file system: WORLDSMITH_HOME, or the model, the set's bundles and `output`, on a mount every gpu host
has at the same path); a node where one is missing fails at once, naming it. Node N's log and request
file are OUTPUT/node-N.log and OUTPUT/node-N-request.json.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from uuid import UUID

from worldsmith.training.launch import LaunchFailed, Rendezvous, TrainRequest, last_error, start_node, stop_process

TRAIN_NODE_DEPLOYMENT = "train-node/train-node"
"""The deployment (flow/deployment) that starts nodes 1.. of a multi-node run (deployments/prefect.yaml)."""
API_PATIENCE_S = 60.0
"""How long a flow run node's state may go unread (the Prefect API failing) before the run fails."""


@dataclass(frozen=True)
class NodeOutcome:
    """How a node ended: `ok`, what ended it (`detail`: an exit code, a flow run state) and, when not
    ok, the last error of its log."""

    ok: bool
    detail: str
    error: str = ""


class NodeRun(Protocol):
    """One started node, watched by node 0."""

    name: str  # "node 1 of 2 (...)", as failures name it

    def outcome(self) -> NodeOutcome | None:
        """None while the node runs (or waits to start), else how it ended."""

    def started(self) -> bool:
        """Whether the node began running (a flow run still scheduled has not)."""

    def waiting_reason(self) -> str:
        """What a node that has not started waits for, for the one-line failure."""

    def stop(self) -> None:
        """Stop the node if it still runs (or still waits to start)."""


class NodeLauncher(Protocol):
    """Starts node `node_rank` of a multi-node run of `request` (its `config.processes` processes),
    meeting the others at `rendezvous`."""

    def start(self, request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> NodeRun: ...


def missing_on_this_node(request: TrainRequest) -> list[str]:
    """The request's paths this machine lacks: the bundles, the output directory, and the model when
    it is a path (an id names a model in each machine's own Hugging Face cache)."""
    paths = [*request.bundles, request.output, *([request.model] if Path(request.model).is_absolute() else [])]
    return [path for path in paths if not Path(path).exists()]


def run_node_command(request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> tuple[subprocess.Popen, Path]:
    """Start node `node_rank`'s agent here (after checking the request's paths hold on this machine);
    returns the process and its log (OUTPUT/node-N.log). LaunchFailed naming the missing paths."""
    missing = missing_on_this_node(request)
    if missing:
        raise LaunchFailed(
            f"training node {node_rank}: {', '.join(missing)} not on this machine ({socket.gethostname()}): the "
            "model, bundles and output of a multi-node run must be on a file system every node shares "
            "(docs/training.md, 'Several machines')"
        )
    out = Path(request.output)
    request_file = out / f"node-{node_rank}-request.json"
    request_file.write_text(request.model_dump_json())
    log = out / f"node-{node_rank}.log"
    return start_node(request_file, node_rank, request.config.processes, rendezvous, log), log


@dataclass
class ProcessNode:
    """A node running as a local process."""

    name: str
    process: subprocess.Popen
    log: Path

    def outcome(self) -> NodeOutcome | None:
        code = self.process.poll()
        if code is None:
            return None
        detail = f"exit {code}, log {self.log}"
        return NodeOutcome(ok=code == 0, detail=detail, error="" if code == 0 else last_error(self.log))

    def started(self) -> bool:
        return True

    def waiting_reason(self) -> str:
        return "its process runs"

    def stop(self) -> None:
        stop_process(self.process)


@dataclass(frozen=True)
class LocalNodes:
    """Nodes as local processes of the train-node flow's command: the launch of a multi-node run as
    far as one machine allows (tests), or one machine's GPUs split into nodes."""

    def start(self, request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> NodeRun:
        process, log = run_node_command(request, node_rank, rendezvous)
        return ProcessNode(f"node {node_rank} of {rendezvous.nodes} (local process {process.pid})", process, log)


@dataclass
class FlowRunNode:
    """A node running as a flow run of the train-node deployment. While the Prefect API fails to answer
    (a transient HTTP error), the node counts as still running and started, for at most `patience_s`
    of consecutive failures; then LaunchFailed naming the API."""

    name: str
    flow_run_id: UUID
    patience_s: float = API_PATIENCE_S
    _failing_since: float | None = field(default=None, init=False, repr=False)

    def _state(self):  # noqa: ANN202 - a prefect State, or None while the API fails (within patience)
        import httpx
        from prefect.client.orchestration import get_client

        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(self.flow_run_id).state
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
        from prefect.deployments import run_deployment

        run = run_deployment(
            self.deployment,
            parameters={
                "request": request.model_dump(mode="json"),
                "node_rank": node_rank,
                "rendezvous": rendezvous.model_dump(),
            },
            flow_run_name=f"train-node-{node_rank}-run-{request.run_id}",  # as the flow names itself
            timeout=0,  # started, not awaited: node 0 watches it
        )
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
