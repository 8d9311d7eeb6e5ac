"""The other nodes of a multi-node training run (`TrainingConfig.nodes` > 1): `launch` runs node 0 on
the flow's machine and starts nodes 1..N-1 with a node launcher, then watches them (NodeRun).

- DeploymentNodes (worldsmith/flows/train_node.py, the train flow's default: Prefect is the flows'
  layer): each node is a run of the `train-node` flow, which a worker of the gpu pool starts on its
  machine;
- LocalNodes (here): each node is a local process of the same command (a test of the launch on one
  machine, or one machine's GPUs split into nodes).

Either way a node runs `run_node_command`'s agent: the same TrainRequest, its own node rank and node
0's rendezvous. Contract: the request's model, bundle and output paths hold on every node (a shared
file system: WORLDSMITH_HOME, or the model, the set's bundles and `output`, on a mount every gpu host
has at the same path); a node where one is missing fails at once, naming it. Node N's log and request
file are OUTPUT/node-N.log and OUTPUT/node-N-request.json.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from worldsmith.training.launch import (
    LaunchFailed,
    NodeOutcome,
    NodeRun,
    Rendezvous,
    TrainRequest,
    last_error,
    start_node,
    stop_process,
)


def missing_on_this_node(request: TrainRequest) -> list[str]:
    """The request's paths this machine lacks: the bundles, the output directory, and the model when
    it is a path (an id names a model in each machine's own Hugging Face cache)."""
    paths = [*request.bundles, request.output, *([request.model] if Path(request.model).is_absolute() else [])]
    return [path for path in paths if not Path(path).exists()]


def run_node_command(
    request: TrainRequest, node_rank: int, rendezvous: Rendezvous
) -> tuple[subprocess.Popen[bytes], Path]:
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
    process: subprocess.Popen[bytes]
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
