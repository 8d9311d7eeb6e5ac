"""How the training processes share the model (TrainingConfig.sharding; docs/training.md, "Sharded
training"), as accelerate configures it.

- `ddp`: every process holds the whole model; gradients are all-reduced in DDP's buckets, with
  `gradient_as_bucket_view` on (the gradients *are* views into the buckets: no second fp32 copy of
  every gradient, training/memory.py's DDP term).
- `fsdp`: FSDP2 (`fully_shard`) over all processes of all nodes: weights, gradients and AdamW states
  are divided by the number of processes, one decoder layer (auto-wrap by transformer layer: the
  model's `_no_split_modules`) gathered at a time in forward and backward, resharded after forward
  (full shard); `cpu_offload` keeps the shards in CPU memory and steps the optimizer there.
  Trainer checkpoints are sharded state dicts (torch.distributed.checkpoint, each process its own
  shard), which `resume` loads into the same number of processes; the final model is gathered into
  one ordinary `save_pretrained` directory (`save_final_model`).

`ShardedTrainer` is the trainer's side: it hands accelerate the FSDP plugin (`fsdp_plugin_args`) and
DDP's keyword arguments, and keeps generation in lockstep under FSDP (every forward of a sharded
model is a collective, so every process must run as many `generate` calls as the busiest:
`LockstepGeneration`). Accelerate enables FSDP on accelerators only; on the CPU (the tests, gloo) it
sets the same state by hand, so the path tested is the GPU's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from worldsmith.training.config import TrainingConfig

if TYPE_CHECKING:
    from worldsmith.training.rollouts import Sampled

#: DDP's gradients as views into its all-reduce buckets (accelerate's DistributedDataParallelKwargs):
#: off, DDP keeps a second fp32 copy of every gradient in the buckets (training/memory.py counts it).
GRADIENT_AS_BUCKET_VIEW = True


class FsdpPluginArgs(TypedDict):
    """The keyword arguments of accelerate's FullyShardedDataParallelPlugin that a run sets."""

    fsdp_version: int
    reshard_after_forward: bool
    auto_wrap_policy: str
    state_dict_type: str
    cpu_offload: bool
    cpu_ram_efficient_loading: bool
    activation_checkpointing: bool


def fsdp_plugin_args(config: TrainingConfig) -> FsdpPluginArgs | None:
    """Accelerate's FSDP settings for `config` (None unless sharding is fsdp): FSDP2, full shard,
    auto-wrap by transformer layer, sharded checkpoints, `cpu_offload` as configured. Activation
    checkpointing stays the trainer's own (transformers' gradient checkpointing, as without sharding)."""
    if config.sharding != "fsdp":
        return None
    return {
        "fsdp_version": 2,
        "reshard_after_forward": True,
        "auto_wrap_policy": "transformer_based_wrap",
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_offload": config.cpu_offload,
        "cpu_ram_efficient_loading": False,
        "activation_checkpointing": False,
    }


def accelerate_config(config: TrainingConfig) -> dict[str, Any]:
    """The accelerate config file (`accelerate launch --config_file`) equivalent to what the trainer
    hands accelerate for `config`: for a user launching the trainer with accelerate's own launcher,
    and written beside the run's output (`write_accelerate_config`)."""
    processes = config.processes * config.nodes
    common = {"num_processes": processes, "num_machines": config.nodes, "mixed_precision": "no"}
    args = fsdp_plugin_args(config)
    if args is None:
        return {"distributed_type": "MULTI_GPU" if processes > 1 else "NO", **common}
    return {
        "distributed_type": "FSDP",
        **common,
        "mixed_precision": "bf16" if config.profile == "gpu" else "no",
        "fsdp_config": {
            "fsdp_version": args["fsdp_version"],
            "fsdp_reshard_after_forward": args["reshard_after_forward"],
            "fsdp_auto_wrap_policy": args["auto_wrap_policy"].upper(),
            "fsdp_state_dict_type": args["state_dict_type"],
            "fsdp_offload_params": args["cpu_offload"],
            "fsdp_cpu_ram_efficient_loading": args["cpu_ram_efficient_loading"],
            "fsdp_activation_checkpointing": args["activation_checkpointing"],
        },
    }


def write_accelerate_config(config: TrainingConfig, output: Path) -> Path:
    """`accelerate_config(config)` as OUTPUT/accelerate.json (the record of how the run was sharded,
    which `accelerate launch --config_file` also reads)."""
    path = output / "accelerate.json"
    path.write_text(json.dumps(accelerate_config(config), indent=2))
    return path


class LockstepGeneration:
    """`generate_batch` for processes whose model forwards are collectives (FSDP): before each batch
    every process says whether it has one (a sum over processes); a process whose rollouts are done
    runs a one-token placeholder batch for as long as another still generates (`drain`).
    Transformers' `generate` keeps the processes' token steps together within a call (`synced_gpus`,
    on for FSDP-managed models)."""

    def __init__(self, generate_batch: Callable[[list[list[int]]], list[Sampled]], placeholder: int):
        self._generate_batch, self._placeholder = generate_batch, placeholder

    def _others_generating(self, mine: int) -> int:
        import torch
        import torch.distributed as dist

        busy = torch.tensor([mine], dtype=torch.int64)
        dist.all_reduce(busy)  # on the CPU: the gloo group accelerate sets up beside nccl (or alone)
        return int(busy.item()) - mine

    def __call__(self, prompts: list[list[int]]) -> list[Sampled]:
        self._others_generating(1)
        return self._generate_batch(prompts)

    def drain(self) -> None:
        """After this process's rollouts: join the others' batches until no process generates."""
        while self._others_generating(0):
            self._generate_batch([[self._placeholder]])


class ShardedTrainer:
    """The trainer's sharding (a base of WorldGRPOTrainer, before TRL's GRPOTrainer): accelerate's
    FSDP plugin and DDP keyword arguments for `config`, and rollouts in lockstep under FSDP."""

    config: TrainingConfig
    accelerator: Any
    model_wrapped: Any  # the Trainer's: under FSDP2 the model itself, sharded in place
    processing_class: Any
    is_fsdp_enabled: bool
    _lockstep: LockstepGeneration | None = None
    generate_batch: Callable[[list[list[int]]], list[Sampled]]

    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        from accelerate.utils import DistributedDataParallelKwargs, FullyShardedDataParallelPlugin

        args: dict[str, Any] = super()._build_accelerator_args(**kwargs)  # type: ignore[misc]  # the Trainer's
        handlers = args.get("kwargs_handlers", [])
        for handler in handlers:
            if isinstance(handler, DistributedDataParallelKwargs):
                handler.gradient_as_bucket_view = GRADIENT_AS_BUCKET_VIEW
        plugin = fsdp_plugin_args(self.config)
        if plugin is not None:
            args["fsdp_plugin"] = FullyShardedDataParallelPlugin(**plugin)
        return args

    def create_accelerator_and_postprocess(self) -> None:
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        super().create_accelerator_and_postprocess()  # type: ignore[misc]  # the Trainer's
        plugin, state = fsdp_plugin_args(self.config), self.accelerator.state
        if plugin is not None and state.distributed_type == DistributedType.MULTI_CPU:
            # accelerate enables FSDP on accelerators only: the CPU (gloo) gets the state it would set there, in
            # the process's state too (each AcceleratorState() copies that one's distributed type back)
            from accelerate.state import PartialState

            PartialState().distributed_type = state.distributed_type = DistributedType.FSDP
            state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin)
            self.is_fsdp_enabled = True

    @contextmanager
    def generation_lockstep(self) -> Iterator[None]:
        """Within it, `lockstep_generate` keeps this process's generation in step with the others' when
        the model is sharded over several processes (`LockstepGeneration`), drained at its end: around
        all of a step's rollouts (refills included), before the step's next collective. Elsewhere, or
        nested, nothing changes."""
        if self._lockstep is not None or not (self.is_fsdp_enabled and self.accelerator.num_processes > 1):
            yield
            return
        # transformers' mark of an FSDP2 module (set by its own sharding, not by accelerate's): `generate`
        # then runs with synced_gpus, every process stepping until the last one's sequences end
        self.model_wrapped._is_fsdp_managed_module = True
        self._lockstep = LockstepGeneration(self.generate_batch, self.processing_class.pad_token_id)
        try:
            yield
            self._lockstep.drain()
        finally:
            self._lockstep = None

    def lockstep_generate(self, prompts: list[list[int]]) -> list[Sampled]:
        """`generate_batch`, in step with the other processes inside `generation_lockstep`."""
        return (self._lockstep or self.generate_batch)(prompts)


def process_group_environment(config: TrainingConfig) -> dict[str, str]:
    """Variables to set before the trainer's arguments set up the process group: under FSDP with
    `cpu_offload` on the gpu profile, accelerate then opens gloo beside nccl for the CPU-held shards
    (gathering the final model's state dict); nothing otherwise."""
    if config.sharding != "fsdp" or config.profile != "gpu":
        return {}
    return {"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": str(config.cpu_offload).lower()}


def save_final_model(trainer: Any, directory: Path, merge_lora: bool) -> None:
    """The trained model as one `save_pretrained` directory (LoRA adapters merged into the base when
    `merge_lora`), written by the main process; under FSDP its full state dict is gathered from every
    process first (a collective: every process calls this)."""
    accelerator = trainer.accelerator
    model = accelerator.unwrap_model(trainer.model)
    if trainer.is_fsdp_enabled:  # full fine-tuning only (TrainingConfig refuses LoRA with fsdp)
        state = accelerator.get_state_dict(trainer.model)
        if accelerator.is_main_process:
            model.save_pretrained(directory, state_dict=state)
    elif accelerator.is_main_process:
        (model.merge_and_unload() if merge_lora else model).save_pretrained(directory)
