"""Peak device memory of a GRPO run, estimated before it starts, and the refusal of a configuration
that cannot fit (docs/training.md, "Memory"). Imports nothing heavy: the command line calls it.

The model, in bytes, for one training process (P parameters, L layers, h hidden size, kv the key/value
width, W = processes x nodes, T = max(max_tokens_per_micro_batch, tokens per row) padded tokens in the
largest pass):

    weights, gradients, AdamW: full fine-tuning 16 P (fp32 masters, fp32 gradients, two fp32 moments)
                               + 2 P on the gpu profile (autocast's bf16 copies of the weights);
                               sharding fsdp: 16 P / W (FSDP2 full shard), none on the device with
                               cpu_offload (the shards and the optimizer step live in CPU memory);
                               LoRA: the frozen base, 2 P (gpu, bf16) or 4 P (cpu), + 16 A for the
                               A = rank x (in + out) x L adapter parameters of the target modules
    DDP gradient buckets:      with W > 1 under ddp, 4 x trainable parameters when gradients are not
                               bucket views (a second fp32 copy of every gradient); 0 with
                               gradient_as_bucket_view, which the trainer turns on (sharding.py)
    FSDP gathered units:       the root unit (embeddings, head) and two decoder layers (the one computed
                               and the one prefetched) gathered whole, 2 bytes per parameter under bf16
                               (4 on cpu-test), + one layer's unsharded fp32 gradient before its
                               reduce-scatter
    reference model:           4 P (/ W under fsdp) when beta > 0 without LoRA (LoRA disables its adapters)
    vLLM colocate:             VLLM_SHARE x device memory (gpu profile with vLLM installed)
    training activations:      with activation checkpointing (gpu) T x h x (b L + 91), b the bytes of the
                               residual stream kept per layer (4 for fp32 masters, 2 for a bf16 base), 91
                               the peak bytes per token and hidden unit of the layer being recomputed with
                               its backward (measured for Qwen3-4B, issue 36; the 16-bit tensors a layer
                               saves for backward alone are 66, tests/training/test_training_memory.py);
                               without it (cpu-test, fp32) T x h x L x 103 (fp32 tensors saved per layer,
                               measured on the CPU by the same test); no logits: TRL's LM head is fused
                               and tiled (`fused_lm_head`)
    generation without vLLM:   the KV cache of group_size x rows_per_step sequences of the row length,
                               2 x L x kv x (2 or 4) bytes per token
    peak = states + DDP buckets + gathered units + reference + vLLM + max(activations, generation)

A configuration fits when the peak is at most HEADROOM of the device's memory (the CUDA context and
the allocator's fragmentation take the rest). Prompts are not bounded by the configuration: the
estimate assumes ASSUMED_PROMPT_TOKENS (system prompt, tools, task and window).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from worldsmith.failures import UserFixable
from worldsmith.training.config import TrainingConfig

GIB = 2**30
VLLM_SHARE = 0.3  # GRPOConfig's vllm_gpu_memory_utilization, as grpo_settings passes it
HEADROOM = 0.9
ASSUMED_PROMPT_TOKENS = 4096
#: Peak bytes per token and hidden unit of the one layer recomputed (with its backward) under activation
#: checkpointing, 16-bit, memory-efficient attention: measured 91 for Qwen3-4B (issue 36); 34 in Korthikanti
#: et al. 2022, which counts a plain MLP's saved tensors only (Qwen3's gated MLP is 3.8 h wide, three matrices).
LAYER_ACTIVATION_BYTES = 91
#: Bytes per token and hidden unit a decoder layer saves for backward in fp32 (cpu-test: no checkpointing),
#: measured on the CPU at Qwen3-4B's proportions (tests/training/test_training_memory.py measures it again).
FP32_LAYER_ACTIVATION_BYTES = 103


def gib(size: float) -> str:
    """`size` bytes in GiB, one decimal."""
    return f"{size / GIB:.1f} GiB"


def vllm_installed() -> bool:
    """Whether vLLM can be imported (the gpu profile then generates with it, colocated)."""
    return importlib.util.find_spec("vllm") is not None


class DecoderConfig(TypedDict):
    """What the memory model reads of a dense decoder's Hugging Face `config.json`."""

    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    num_attention_heads: int
    intermediate_size: int
    head_dim: NotRequired[int | None]
    num_key_value_heads: NotRequired[int]
    tie_word_embeddings: NotRequired[bool]


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs of a model: parameters, layers, hidden size, key/value width, and
    (0 when unknown) the MLP's width and the parameters outside the decoder layers
    (embeddings and an untied head: FSDP's root unit)."""

    params: int
    layers: int
    hidden_size: int
    kv_size: int
    intermediate_size: int = 0
    embedding_params: int = 0

    @classmethod
    def from_params(cls, params: int) -> ModelShape:
        """A dense decoder's shape guessed from its size alone: h = (6 P)^(1/3), L = h / 72, kv = h / 2,
        an MLP 4 h wide (P ~ 12 L h^2; above Qwen3's own L x h, kv and MLP, so the estimate errs on the
        safe side); the embeddings unknown."""
        hidden = (6 * params) ** (1 / 3)
        return cls(params, max(1, round(hidden / 72)), round(hidden), round(hidden / 2), round(4 * hidden))

    @classmethod
    def from_config(cls, config: DecoderConfig) -> ModelShape:
        """The shape of a Hugging Face `config.json` of a dense decoder (embeddings, attention, MLP)."""
        h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or h // heads
        kv = config.get("num_key_value_heads", heads) * head_dim
        attention = 2 * h * heads * head_dim + 2 * h * kv
        mlp = 3 * h * config["intermediate_size"]
        embeddings = vocab * h * (1 if config.get("tie_word_embeddings", False) else 2)
        params = embeddings + layers * (attention + mlp)
        return cls(params, layers, h, kv, config["intermediate_size"], embeddings)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (FSDP's unit)."""
        return (self.params - self.embedding_params) // self.layers

    def adapter_params(self, rank: int, modules: list[str]) -> int:
        """LoRA's trainable parameters: rank x (inputs + outputs) of each target module, every layer
        (attention projections taken 2 h wide, the MLP's h + its width; other names 2 h)."""
        h, mlp = self.hidden_size, self.intermediate_size or 4 * self.hidden_size
        widths = {"k_proj": h + self.kv_size, "v_proj": h + self.kv_size}
        widths |= {name: h + mlp for name in ("gate_proj", "up_proj", "down_proj")}
        return rank * self.layers * sum(widths.get(name, 2 * h) for name in modules)


def model_shape(model: str) -> ModelShape | None:
    """The shape of `model` (a directory, or an id in the local Hugging Face cache) from its
    config.json, without loading weights; None when there is none to read (`tiny`, not cached)."""
    path = Path(model) / "config.json"
    if not path.is_file():
        if model == "tiny" or Path(model).exists() or model.count("/") != 1:
            return None
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        return ModelShape.from_config(json.loads(path.read_text()))
    except (KeyError, TypeError, ValueError):
        return None


def device_memory() -> int | None:
    """Total memory of this process's CUDA device in bytes; None without one."""
    import torch

    return (
        torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        if torch.cuda.is_available()
        else None
    )


def row_tokens(config: TrainingConfig) -> int:
    """Tokens of the longest training row the estimate assumes: the prompt and one completion
    (windowed), or the prompt and every turn's completion and tool result, as long (full)."""
    if config.history == "windowed":
        return ASSUMED_PROMPT_TOKENS + config.max_completion_length
    return ASSUMED_PROMPT_TOKENS + 2 * config.max_turns * config.max_completion_length


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak memory in bytes by part (see the module docstring) and the tokens of the largest pass;
    `offloaded`: bytes held in CPU memory instead (fsdp with cpu_offload), not part of the peak."""

    states: int
    reference: int
    vllm: int
    activations: int
    generation: int
    pass_tokens: int
    activation_bytes_per_token: int
    ddp_buckets: int = 0
    gathered: int = 0
    offloaded: int = 0

    @property
    def fixed(self) -> int:
        """What does not depend on the tokens of a pass or the sequences generated."""
        return self.states + self.ddp_buckets + self.gathered + self.reference + self.vllm

    @property
    def peak(self) -> int:
        return self.fixed + max(self.activations, self.generation)

    def describe(self) -> str:
        parts = {
            "weights, gradients and optimizer": self.states,
            "DDP's gradient buckets": self.ddp_buckets,
            "FSDP's gathered layers": self.gathered,
            "reference model": self.reference,
            "vLLM": self.vllm,
            f"activations of {self.pass_tokens} tokens": self.activations,
            "generation's KV cache": self.generation,
        }
        listed = ", ".join(f"{name} {gib(size)}" for name, size in parts.items() if size)
        return f"about {gib(self.peak)} ({listed})"


def world_size(config: TrainingConfig) -> int:
    """Training processes of the run, all nodes together (FSDP shards over all of them)."""
    return config.processes * config.nodes


def estimate_memory(
    config: TrainingConfig, shape: ModelShape, device_memory: int | None, *, gradient_as_bucket_view: bool = True
) -> MemoryEstimate:
    """The peak memory of `config` for a model of `shape` on a device of `device_memory` bytes
    (`gradient_as_bucket_view`: DDP's setting, on in the trainer; off counts its second gradient copy)."""
    gpu, fsdp, world = config.profile == "gpu", config.sharding == "fsdp", world_size(config)
    p, layers, h = shape.params, shape.layers, shape.hidden_size
    trainable = shape.adapter_params(config.lora.rank, config.lora.target_modules) if config.lora.enabled else p
    if config.lora.enabled:
        states, residual = (2 if gpu else 4) * p + 16 * trainable, 2 if gpu else 4
    elif fsdp:  # bf16 gathering under FSDP's mixed precision: no autocast copies
        states, residual = 16 * p // world, 4
    else:
        states, residual = (18 if gpu else 16) * p, 4
    offloaded = 0
    if fsdp and config.cpu_offload:
        states, offloaded = 0, states
    buckets = 4 * trainable if world > 1 and not fsdp and not gradient_as_bucket_view else 0
    gathered = (shape.embedding_params + 2 * shape.layer_params) * (2 if gpu else 4) + 4 * shape.layer_params
    reference = 4 * p // (world if fsdp else 1) if config.beta > 0 and not config.lora.enabled else 0
    vllm = round(VLLM_SHARE * device_memory) if gpu and vllm_installed() and device_memory else 0
    tokens = max(config.max_tokens_per_micro_batch, row_tokens(config))
    per_token = h * (residual * layers + LAYER_ACTIVATION_BYTES) if gpu else h * layers * FP32_LAYER_ACTIVATION_BYTES
    sequences = config.group_size * config.rows_per_step
    generation = 0 if vllm else sequences * row_tokens(config) * 2 * layers * shape.kv_size * (2 if gpu else 4)
    return MemoryEstimate(
        states,
        reference,
        vllm,
        tokens * per_token,
        generation,
        tokens,
        per_token,
        ddp_buckets=buckets,
        gathered=gathered if fsdp else 0,
        offloaded=offloaded,
    )


def fitting_processes(config: TrainingConfig, shape: ModelShape, usable: float, device: int) -> int | None:
    """The fewest processes (per node, at most 64) with which `config` under fsdp fits in `usable` bytes."""
    for processes in range(max(2, config.processes), 65):
        sharded = config.model_copy(update={"sharding": "fsdp", "processes": processes})
        if estimate_memory(sharded, shape, device).peak <= usable:
            return processes
    return None


def fitting_token_budget(config: TrainingConfig, shape: ModelShape, usable: float, device: int) -> int | None:
    """The largest max_tokens_per_micro_batch (at least one row's tokens) with which `config` fits in
    `usable` bytes; None when a row alone does not fit."""

    def fits(tokens: int) -> bool:
        budget = config.model_copy(update={"max_tokens_per_micro_batch": tokens})
        return estimate_memory(budget, shape, device).peak <= usable

    low, high = row_tokens(config), config.max_tokens_per_micro_batch
    if not fits(low):
        return None
    while low < high:  # fits(low), and nothing above high was asked for
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def _states_fix(config: TrainingConfig, shape: ModelShape, usable: float, device: int) -> str:
    """What to change when the weights, gradients and optimizer states alone do not fit."""
    if config.lora.enabled:
        return "use a smaller model or a device with more memory"
    lora = "train LoRA adapters over a frozen bf16 base instead (--lora)"
    if config.sharding == "fsdp" and not config.cpu_offload:
        return f"keep the shards in CPU memory (--cpu-offload), add processes, or {lora}"
    processes = fitting_processes(config, shape, usable, device) if config.sharding != "fsdp" else None
    if processes is not None:
        total = processes * config.nodes
        return f"shard the model (--sharding fsdp) over {total} processes or more (--processes {processes}), or {lora}"
    return f"add processes or nodes under --sharding fsdp, or {lora}"


def check_fits(
    config: TrainingConfig, model_params: int, device_memory: int | None, shape: ModelShape | None = None
) -> MemoryEstimate:
    """The estimate of `config` for a model of `model_params` parameters (`shape` when known, else
    guessed from the size) on a device of `device_memory` bytes (None: no limit, e.g. the CPU).
    Raises UserFixable naming the setting to change when the peak is above HEADROOM of the device."""
    shape = shape or ModelShape.from_params(model_params)
    estimate = estimate_memory(config, shape, device_memory)
    if device_memory is None or estimate.peak <= HEADROOM * device_memory:
        return estimate
    usable = HEADROOM * device_memory
    fixed = estimate.fixed
    if fixed > usable:
        fix = _states_fix(config, shape, usable, device_memory)
        if estimate.reference:
            fix += ", or drop the reference model (--beta 0)"
    elif estimate.activations >= estimate.generation:
        fitting = fitting_token_budget(config, shape, usable, device_memory)
        if fitting is not None:
            fix = f"lower --max-tokens-per-micro-batch to {fitting} or less"
        else:
            fix = (
                f"a row of about {row_tokens(config)} tokens does not fit alone: lower --max-completion-length"
                + (", or --max-turns (history full)" if config.history == "full" else "")
                + ("" if config.lora.enabled else ", or train LoRA adapters (--lora)")
            )
    else:
        per_row = estimate.generation // config.rows_per_step
        rows = int((usable - fixed) // per_row) if per_row else 0
        lower = f"lower --rows-per-step to {rows}" if rows >= 1 else "lower --group-size"
        fix = f"generate fewer sequences at once ({lower}), or install vLLM"
    raise UserFixable(
        f"this run needs {estimate.describe()}, more than {HEADROOM:.0%} of the device's {gib(device_memory)}: {fix}"
    )


class MachineUnfit(UserFixable, ValueError):
    """A configuration this machine cannot run: the gpu profile without a CUDA device."""


def check_cuda(profile: str) -> None:
    """MachineUnfit when `profile` is `gpu` and torch sees no CUDA device here."""
    if profile != "gpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise MachineUnfit(
            "profile 'gpu' needs a CUDA device and torch sees none on this machine; use --profile cpu-test "
            "here, or run on a GPU worker (the train deployment on the gpu pool)"
        )


def check_machine(config: TrainingConfig) -> None:
    """Before any work: the profile suits this machine (`check_cuda`) and a gpu run fits its device
    (`check_fits` on the model's config.json, when there is one to read); each refusal one line."""
    check_cuda(config.profile)
    if config.profile == "gpu":
        shape = model_shape(config.model)
        if shape is not None:
            check_fits(config, shape.params, device_memory(), shape)
