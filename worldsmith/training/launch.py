"""The training step of the `train` flow: GRPO in this process, or in several processes (one per
GPU) started by `torch.distributed.run`, which is what `accelerate launch` runs underneath.

    python -m torch.distributed.run --nproc_per_node N -m worldsmith.training.launch REQUEST.json

Each process builds the same trainer; accelerate reads the distributed environment (NCCL on GPUs,
gloo on CPUs), TRL gathers rewards across processes before the group advantages, and only the
main process writes the catalog's step rows, the final model and `OUTPUT/result.json`.

Several machines (`config.nodes` > 1): the same command on each (`torchrun_command` with `nodes` and
`node_rank`), one REQUEST.json whose model, bundle and output paths hold on every node (a shared file
system), node 0's address as the rendezvous. `launch` runs node 0 here and starts the others with a
node launcher: runs of the `train-node` deployment (flows/train_node.py), or local processes (training/nodes.py)
(docs/training.md, "Several machines").
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

from worldsmith.bundle.loader import load_bundle
from worldsmith.errors import WorldsmithError
from worldsmith.failures import UserFixable
from worldsmith.models.training import SuccessRates, TrainerOutcome
from worldsmith.runtime.episode import Runtime
from worldsmith.training.config import TrainingConfig
from worldsmith.training.curriculum import curriculum_bundles, held_out_bundles
from worldsmith.worldmodel.simulated import SimulatedRuntime

logger = logging.getLogger(__name__)


class TrainRequest(BaseModel):
    """Everything the training step needs, as JSON for the launched processes (and the nodes of a
    multi-node run: its paths must hold on every node)."""

    config: TrainingConfig = Field(description="The training run's configuration.")
    model: str = Field(description="The model directory to train (or an id in the local Hugging Face cache).")
    bundles: list[str] = Field(description="The bundle directories of the training rows.")
    run_id: int = Field(description="The catalog's training run the step rows and checkpoints belong to.")
    output: str = Field(description="The output directory: trainer checkpoints, the final model, result.json.")
    resume_from: str | None = Field(None, description="A trainer checkpoint directory to continue from.")


class Rendezvous(BaseModel):
    """Where the nodes of one run meet (static rendezvous: fixed ranks, no elastic restarts): node 0
    listens at `host:port`, every other node must reach it within `timeout_s`."""

    host: str = Field(description="Node 0's address, as the other nodes reach it.")
    port: int = Field(description="Node 0's rendezvous port.")
    nodes: int = Field(1, description="Nodes of the run, node 0 included.")
    timeout_s: int = Field(600, description="Seconds a node waits for the others to join.")


class LaunchFailed(UserFixable, RuntimeError):
    """The launched training (a node of it) failed: one line naming the node and the last error of its log."""

    exit_code = 1


class TrainingStopped(WorldsmithError):
    """Training ended early because its run was asked to stop (Ctrl-C, SIGTERM): in this process at a
    step boundary (`step`, the last step done), or with its launched processes stopped (`step` None:
    the steps done are the catalog's rows). Checkpoints stored before it are kept."""

    def __init__(self, step: int | None = None):
        super().__init__("training stopped" + (f" after step {step}" if step is not None else ""))
        self.step = step


def never() -> bool:
    """No stop request (a launched process, or a caller that does not stop)."""
    return False


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


def bind_local_gpu() -> None:
    """Make this process's GPU (LOCAL_RANK, set by torch.distributed.run; 0 alone) the current CUDA
    device before anything loads. Accelerate does so only when the trainer is built; a world model
    loaded before that with `.to("cuda")` would otherwise land on GPU 0 in every process."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def run_training(
    request: TrainRequest, progress: bool = False, stop_requested: Callable[[], bool] = never
) -> TrainerOutcome:
    """Run GRPO (from `request.resume_from` when set), once `check_fits` passes on this process's
    device; returns (on every process) the final model directory and the number of processes and,
    on the main process, the per-step log and the trainer checkpoints stored in the object store as
    (step, digest). Once `stop_requested()`, training ends at the next step boundary and
    TrainingStopped is raised (no final model), the sandbox runtime closed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.training.callbacks import CatalogMetrics, CheckpointUpload
    from worldsmith.training.memory import check_fits, device_memory, model_shape
    from worldsmith.training.progress import ProgressBar
    from worldsmith.training.sharding import process_group_environment, save_final_model
    from worldsmith.training.stopping import StopWhenRequested
    from worldsmith.training.success import success_rates
    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, model_dtype, peft_config, task_dataset

    bind_local_gpu()
    config, out = request.config, Path(request.output)
    os.environ.update(process_group_environment(config))  # before the trainer's arguments open the group
    shape = model_shape(request.model)
    if shape is not None:  # a configuration that cannot fit is refused before any weight loads
        check_fits(config, shape.params, device_memory(), shape)
    loaded = {path: load_bundle(Path(path)) for path in request.bundles}
    bundles = curriculum_bundles(loaded, config.curriculum)
    held_out = held_out_bundles(loaded, config.curriculum) if config.success_samples else {}
    tokenizer = AutoTokenizer.from_pretrained(request.model)
    policy = AutoModelForCausalLM.from_pretrained(request.model, dtype=model_dtype(config))
    metrics, uploads = CatalogMetrics(request.run_id), CheckpointUpload(request.run_id)
    bar = [ProgressBar(f"GRPO on {config.set_name}")] if progress else []
    callbacks = [metrics, uploads, StopWhenRequested(stop_requested), *bar]
    runtime = Runtime()
    try:
        simulation = SimulatedRuntime(runtime, config.simulate) if config.simulate else None
        trainer = WorldGRPOTrainer(
            model=policy,
            args=grpo_args(config, out),
            train_dataset=task_dataset(bundles),
            processing_class=tokenizer,
            callbacks=callbacks,
            peft_config=peft_config(config),
            config=config,
            runtime=runtime,
            bundles={**held_out, **bundles},  # the held-out tasks are measured, never trained on
            simulation=simulation,
        )
        before = success_rates(trainer, config.success_samples, list(held_out)) if config.success_samples else None
        trainer.train(resume_from_checkpoint=request.resume_from)
        if stop_requested():
            raise TrainingStopped(trainer.state.global_step)
        after = success_rates(trainer, config.success_samples, list(held_out)) if config.success_samples else None
        final = out / "final"
        trainer.accelerator.wait_for_everyone()
        save_final_model(trainer, final, merge_lora=config.lora.enabled)  # every process: FSDP gathers
        if trainer.accelerator.is_main_process:
            tokenizer.save_pretrained(final)
        trainer.accelerator.wait_for_everyone()
    finally:
        runtime.close()
    return TrainerOutcome(
        final=str(final),
        steps=trainer.state.global_step,
        checkpoints=uploads.stored,
        log=metrics.steps,
        processes=trainer.accelerator.num_processes,
        main=trainer.accelerator.is_main_process,
        simulation=simulation.stats.counts() if simulation else None,
        success=SuccessRates(
            before=before[0],
            after=after[0],
            held_out_before=before[1],
            held_out_after=after[1],
            held_out_tasks=len(held_out),
        )
        if before is not None and after is not None
        else None,
    )


def torchrun_command(
    request_file: Path,
    processes: int,
    master_port: int,
    *,
    nodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    rendezvous_timeout_s: int | None = None,
) -> list[str]:
    """The `torch.distributed.run` command of one node: `processes` training processes (one per GPU)
    of `nodes` in all, rank `node_rank`; the node of rank 0 listens at `master_addr:master_port`,
    which every other node must reach (static rendezvous: ranks are fixed, no elastic restarts)
    within `rendezvous_timeout_s` (unset: torch's 600 s)."""
    timeout = ["--rdzv_conf", f"timeout={rendezvous_timeout_s}"] if rendezvous_timeout_s is not None else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--node_rank",
        str(node_rank),
        "--nproc_per_node",
        str(processes),
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        *timeout,
        "-m",
        "worldsmith.training.launch",
        str(request_file),
    ]


def start_node(
    request_file: Path, node_rank: int, processes: int, rendezvous: Rendezvous, log: Path
) -> subprocess.Popen[bytes]:
    """Node `node_rank`'s `torch.distributed.run` agent with `processes` training processes, its output in `log`."""
    command = torchrun_command(
        request_file,
        processes,
        rendezvous.port,
        nodes=rendezvous.nodes,
        node_rank=node_rank,
        master_addr=rendezvous.host,
        rendezvous_timeout_s=rendezvous.timeout_s,
    )
    with log.open("w") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 40.0) -> None:
    """Stop a node's agent (which stops its training processes) if it still runs: SIGTERM, then SIGKILL
    after `grace_s` (longer than the 30 s the agent gives its training processes)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_ERROR_LINE = re.compile(  # an exception's last line, maybe prefixed by its process (`[rank1]: ValueError: ...`)
    r"^\s*(?:\[[^\]]*\]:?\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)): (.+)$"
)


def last_error(log: Path) -> str:
    """The end of a node's log that says what went wrong: its last exception line (not the agent's
    ChildFailedError summary), else its last three non-empty lines; at most 600 characters."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    errors = [line.strip() for line in lines if _ERROR_LINE.match(line) and "ChildFailedError" not in line]
    text = errors[-1] if errors else " | ".join(line.strip() for line in lines[-3:]) or "(empty log)"
    return text if len(text) <= 600 else "..." + text[-600:]


def host_address() -> str:
    """This machine's address as other machines reach it: the source address of its default route
    (found without sending a packet), else the address its host name resolves to; LaunchFailed when
    neither is known."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: picks the outgoing interface only
            address: str = probe.getsockname()[0]
            return address
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        raise LaunchFailed(
            "this machine's address for the other nodes is unknown (no default route, an unresolvable host "
            "name): set rendezvous_host",
            exit_code=2,
        ) from None


def launch(
    request: TrainRequest,
    processes: int,
    launcher: NodeLauncher | None = None,
    stop_requested: Callable[[], bool] = never,
) -> TrainerOutcome:
    """Run the training step in `processes` processes here (node 0) and, with `config.nodes` > 1, as
    many on each other node, started by `launcher` (required then: the train flow passes runs of the
    `train-node` deployment, flows/train_node.default_node_launcher; tests, training/nodes.LocalNodes);
    returns the main process's result (OUTPUT/result.json, written once).

    Contract of a multi-node run: the request's model, bundle and output paths hold on every node (a
    shared file system), and node 0 is reachable at the rendezvous address from every node. A node
    that fails, or has not started when node 0's rendezvous times out (`config.rendezvous_timeout_s`),
    stops the others and raises LaunchFailed naming it with the last error of its log; so does a
    failure here (node 0's log: OUTPUT/launch.log; node N's: OUTPUT/node-N.log). Once `stop_requested()`,
    every node is stopped (node 0's agent by SIGTERM, which ends its training processes) and
    TrainingStopped raised."""
    from worldsmith.localserver import free_port
    from worldsmith.training.sharding import write_accelerate_config

    config, out = request.config, Path(request.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "request.json").write_text(request.model_dump_json())
    write_accelerate_config(config, out)  # how the processes share the model, as accelerate's launcher reads it
    if config.nodes > 1 and launcher is None:
        raise ValueError("a multi-node run needs a node launcher (the train flow passes flows.train_node's)")
    (out / "result.json").unlink(missing_ok=True)
    host = (config.rendezvous_host or host_address()) if config.nodes > 1 else "127.0.0.1"
    port = config.rendezvous_port or free_port("" if config.nodes > 1 else "127.0.0.1")
    rendezvous = Rendezvous(host=host, port=port, nodes=config.nodes, timeout_s=config.rendezvous_timeout_s)
    log = out / "launch.log"
    started = time.monotonic()
    main = start_node(out / "request.json", 0, processes, rendezvous, log)
    others: list[NodeRun] = []
    try:
        if launcher is not None:
            for rank in range(1, config.nodes):
                others.append(launcher.start(request, rank, rendezvous))  # one by one: those started are stopped
        code = _supervise(main, others, stop_requested)
        waited_out = time.monotonic() - started >= rendezvous.timeout_s  # node 0 may have given up on a node
        if code != 0 or not (out / "result.json").is_file():
            error = last_error(log)
            who = (
                f"training in {processes} processes"
                if config.nodes == 1
                else f"training node 0 of {config.nodes} (this machine)"
            )
            raise LaunchFailed(
                f"{who} failed (exit {code}): {error} (log: {log})"
                + _after_node_0_failed(others, rendezvous, error, waited_out)
            )
        _wait_for(others, rendezvous.timeout_s)
    finally:
        stop_process(main)
        for node in others:
            try:
                node.stop()
            except Exception as exc:  # noqa: BLE001 - each node is stopped whatever the others do
                logger.warning("could not stop training %s: %s", node.name, exc)
    return TrainerOutcome.model_validate_json((out / "result.json").read_text())


def _supervise(
    main: subprocess.Popen[bytes], others: list[NodeRun], stop_requested: Callable[[], bool], poll_s: float = 0.5
) -> int:
    """Node 0's exit code once it ends; LaunchFailed as soon as another node fails, TrainingStopped as
    soon as a stop is requested (the caller stops the nodes)."""
    while True:
        if stop_requested():
            raise TrainingStopped()
        code = main.poll()
        for node in others:
            outcome = node.outcome()
            if outcome is not None and not outcome.ok:
                raise LaunchFailed(f"training {node.name} failed ({outcome.detail}): {outcome.error}")
        if code is not None:
            return code
        time.sleep(poll_s)


def _after_node_0_failed(
    others: list[NodeRun], rendezvous: Rendezvous, error: str, waited_out: bool, grace_s: float = 15.0
) -> str:
    """After node 0 failed (with `error`): when it ran for the rendezvous timeout (`waited_out`: it may
    have given up waiting), LaunchFailed naming a node that never started; else, once the others that
    started ended (at most `grace_s`: a node's report may come a little after node 0's exit), the
    failures of the others to add to node 0's line ("" when none)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            outcomes = [(node, node.outcome()) for node in others]
            running = [node for node, outcome in outcomes if outcome is None]
            waiting = [node for node in running if not node.started()]
            reason = waiting[0].waiting_reason() if waiting and waited_out else None
        except LaunchFailed as exc:  # the Prefect API stopped answering about the nodes: node 0's failure stands
            return f"; {exc}"
        if reason is not None:
            raise LaunchFailed(
                f"training {waiting[0].name} never joined node 0's rendezvous at {rendezvous.host}:{rendezvous.port} "
                f"within {rendezvous.timeout_s} s ({reason}); node 0: {error}"
            )
        if len(waiting) == len(running) or time.monotonic() > deadline:  # nodes not started report nothing
            break
        time.sleep(0.5)
    failed = [f"; {node.name} failed too ({o.detail}): {o.error}" for node, o in outcomes if o is not None and not o.ok]
    return "".join(failed)


def _wait_for(others: list[NodeRun], timeout_s: float) -> None:
    """After node 0 succeeded: the other nodes' ends (their agents exit with node 0's), at most `timeout_s`
    (and not past the Prefect API's failing: the result is written)."""
    deadline = time.monotonic() + timeout_s
    try:
        while any(node.outcome() is None for node in others) and time.monotonic() < deadline:
            time.sleep(0.5)
    except LaunchFailed as exc:
        logger.warning("stopped waiting for the other nodes to end: %s", exc)


def main(argv: list[str] | None = None) -> None:
    """Entry point of each launched process: REQUEST.json in, OUTPUT/result.json out (main process)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m worldsmith.training.launch REQUEST.json")
    request = TrainRequest.model_validate_json(Path(args[0]).read_text())
    result = run_training(request)
    if result.main:
        (Path(request.output) / "result.json").write_text(json.dumps(result.model_dump(mode="json")))


if __name__ == "__main__":
    main()
