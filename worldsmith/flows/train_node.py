"""The `train-node` flow: one of nodes 1..N-1 of a multi-node training run, started by the `train`
flow's node 0 through the `train-node` deployment on the gpu pool (worldsmith/training/nodes.py).

It runs the run's TrainRequest as node `node_rank` (`config.processes` training processes) and joins
node 0 at `rendezvous`; it ends when its agent does: completed, or failed with one line naming the
node and the last error of its log (OUTPUT/node-N.log), which node 0 reports. The request's model,
bundle and output paths must hold on this machine (a shared file system); where one is missing the
run fails at once, naming it.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from worldsmith.training.launch import LaunchFailed, Rendezvous, TrainRequest, last_error, stop_process
from worldsmith.training.nodes import run_node_command


@flow(name="train-node", log_prints=True, flow_run_name="train-node-{node_rank}-run-{request.run_id}")
def train_node(request: TrainRequest, node_rank: int, rendezvous: Rendezvous) -> dict[str, Any]:
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
