"""The training step of the `train` flow: GRPO in this process, or in several processes (one per
GPU) started by `torch.distributed.run`, which is what `accelerate launch` runs underneath.

    python -m torch.distributed.run --nproc_per_node N -m worldsmith.training.launch REQUEST.json

Each process builds the same trainer; accelerate reads the distributed environment (NCCL on GPUs,
gloo on CPUs), TRL gathers rewards across processes before the group advantages, and only the
main process writes the catalog's step rows, the final model and `OUTPUT/result.json`.

Several machines: the same command on each (`torchrun_command` with `nodes` and `node_rank`), one
REQUEST.json whose model, bundle and output paths hold on every node, the first node's address as
the rendezvous (docs/training.md, "Several machines").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from worldsmith.bundle.loader import load_bundle
from worldsmith.runtime.episode import Runtime
from worldsmith.training.config import TrainingConfig
from worldsmith.training.curriculum import curriculum_bundles
from worldsmith.worldmodel.simulated import SimulatedRuntime


class TrainRequest(BaseModel):
    """Everything the training step needs, as JSON for the launched processes."""

    config: TrainingConfig
    model: str
    bundles: list[str]
    run_id: int
    output: str
    resume_from: str | None = None  # a trainer checkpoint directory to continue from


def bind_local_gpu() -> None:
    """Make this process's GPU (LOCAL_RANK, set by torch.distributed.run; 0 alone) the current CUDA
    device before anything loads. Accelerate does so only when the trainer is built; a world model
    loaded before that with `.to("cuda")` would otherwise land on GPU 0 in every process."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def run_training(request: TrainRequest, progress: bool = False) -> dict[str, Any]:
    """Run GRPO (from `request.resume_from` when set), once `check_fits` passes on this process's
    device; returns (on every process) the final model directory and the number of processes and,
    on the main process, the per-step log and the trainer checkpoints stored in the object store as
    (step, digest)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.training.callbacks import CatalogMetrics, CheckpointUpload
    from worldsmith.training.memory import check_fits, device_memory, model_shape
    from worldsmith.training.progress import ProgressBar
    from worldsmith.training.success import success_rate
    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, model_dtype, peft_config, task_dataset

    bind_local_gpu()
    config, out = request.config, Path(request.output)
    shape = model_shape(request.model)
    if shape is not None:  # a configuration that cannot fit is refused before any weight loads
        check_fits(config, shape.params, device_memory(), shape)
    bundles = curriculum_bundles({path: load_bundle(Path(path)) for path in request.bundles}, config.curriculum)
    tokenizer = AutoTokenizer.from_pretrained(request.model)
    policy = AutoModelForCausalLM.from_pretrained(request.model, dtype=model_dtype(config))
    metrics, uploads = CatalogMetrics(request.run_id), CheckpointUpload(request.run_id)
    callbacks = [metrics, uploads, *([ProgressBar(f"GRPO on {config.set_name}")] if progress else [])]
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
            bundles=bundles,
            simulation=simulation,
        )
        before = success_rate(trainer, config.success_samples) if config.success_samples else None
        trainer.train(resume_from_checkpoint=request.resume_from)
        after = success_rate(trainer, config.success_samples) if config.success_samples else None
        final = out / "final"
        trainer.accelerator.wait_for_everyone()
        if trainer.accelerator.is_main_process:
            trained = trainer.accelerator.unwrap_model(trainer.model)
            (trained.merge_and_unload() if config.lora.enabled else trained).save_pretrained(final)
            tokenizer.save_pretrained(final)
        trainer.accelerator.wait_for_everyone()
    finally:
        runtime.close()
    return {
        "final": str(final),
        "steps": trainer.state.global_step,
        "checkpoints": uploads.stored,
        "log": metrics.steps,
        "processes": trainer.accelerator.num_processes,
        "main": trainer.accelerator.is_main_process,
        "simulation": simulation.stats.as_dict() if simulation else None,
        "success": {"before": before, "after": after} if config.success_samples else None,
    }


def torchrun_command(
    request_file: Path,
    processes: int,
    master_port: int,
    *,
    nodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
) -> list[str]:
    """The `torch.distributed.run` command of one node: `processes` training processes (one per GPU)
    of `nodes` in all, rank `node_rank`; the node of rank 0 listens at `master_addr:master_port`,
    which every other node must reach (static rendezvous: ranks are fixed, no elastic restarts)."""
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
        "-m",
        "worldsmith.training.launch",
        str(request_file),
    ]


def launch(request: TrainRequest, processes: int) -> dict[str, Any]:
    """Run the training step in `processes` processes and return the main process's result; a
    failed launch raises RuntimeError with the end of its log (OUTPUT/launch.log)."""
    from worldsmith.localserver import free_port

    out = Path(request.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "request.json").write_text(request.model_dump_json())
    (out / "result.json").unlink(missing_ok=True)
    command = torchrun_command(out / "request.json", processes, free_port())
    with (out / "launch.log").open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0 or not (out / "result.json").is_file():
        tail = (out / "launch.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(
            f"training in {processes} processes failed (exit {code}); end of {out / 'launch.log'}:\n{tail}"
        )
    return json.loads((out / "result.json").read_text())


def main(argv: list[str] | None = None) -> None:
    """Entry point of each launched process: REQUEST.json in, OUTPUT/result.json out (main process)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m worldsmith.training.launch REQUEST.json")
    request = TrainRequest.model_validate_json(Path(args[0]).read_text())
    result = run_training(request)
    if result["main"]:
        (Path(request.output) / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
