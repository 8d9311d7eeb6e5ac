"""Peak device memory of a GRPO run, estimated before it starts, and the refusal of a configuration
that cannot fit (docs/training.md, "Memory"). Imports nothing heavy: the command line calls it.

The model, in bytes, for one training process (P parameters, L layers, h hidden size, kv the key/value
width, T = max(max_tokens_per_micro_batch, tokens per row) padded tokens in the largest pass):

    weights, gradients, AdamW: full fine-tuning 16 P (fp32 masters, fp32 gradients, two fp32 moments)
                               + 2 P on the gpu profile (autocast's bf16 copies of the weights);
                               LoRA: the frozen base, 2 P (gpu, bf16) or 4 P (cpu), + 16 A for the
                               A = 2 x rank x h x modules x L adapter parameters
    reference model:           4 P when beta > 0 without LoRA (LoRA disables its adapters instead)
    vLLM colocate:             VLLM_SHARE x device memory (gpu profile with vLLM installed)
    training activations:      with activation checkpointing (gpu) T x h x (b L + 34), b the bytes of the
                               residual stream (4 for fp32 masters, 2 for a bf16 base): every layer's
                               input kept, one layer recomputed (34 bytes per token and hidden unit in
                               16 bits with memory-efficient attention, Korthikanti et al. 2022);
                               without it (cpu-test, fp32) T x h x L x 68
    generation without vLLM:   the KV cache of group_size x rows_per_step sequences of the row length,
                               2 x L x kv x (2 or 4) bytes per token
    peak = weights etc. + reference + vLLM + max(training activations, generation)

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
LAYER_ACTIVATION_BYTES = 34  # per token and hidden unit of one layer, 16-bit, memory-efficient attention


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
    """What the memory model needs of a model: parameters, layers, hidden size, key/value width."""

    params: int
    layers: int
    hidden_size: int
    kv_size: int

    @classmethod
    def from_params(cls, params: int) -> ModelShape:
        """A dense decoder's shape guessed from its size alone: h = (6 P)^(1/3), L = h / 72, kv = h / 2
        (P ~ 12 L h^2; above Qwen3's own L x h and kv, so the estimate errs on the safe side)."""
        hidden = (6 * params) ** (1 / 3)
        return cls(params, max(1, round(hidden / 72)), round(hidden), round(hidden / 2))

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
        return cls(embeddings + layers * (attention + mlp), layers, h, kv)


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
    """Peak memory in bytes by part (see the module docstring) and the tokens of the largest pass."""

    states: int
    reference: int
    vllm: int
    activations: int
    generation: int
    pass_tokens: int
    activation_bytes_per_token: int

    @property
    def peak(self) -> int:
        return self.states + self.reference + self.vllm + max(self.activations, self.generation)

    def describe(self) -> str:
        parts = {
            "weights, gradients and optimizer": self.states,
            "reference model": self.reference,
            "vLLM": self.vllm,
            f"activations of {self.pass_tokens} tokens": self.activations,
            "generation's KV cache": self.generation,
        }
        listed = ", ".join(f"{name} {gib(size)}" for name, size in parts.items() if size)
        return f"about {gib(self.peak)} ({listed})"


def estimate_memory(config: TrainingConfig, shape: ModelShape, device_memory: int | None) -> MemoryEstimate:
    """The peak memory of `config` for a model of `shape` on a device of `device_memory` bytes."""
    gpu = config.profile == "gpu"
    p, layers, h = shape.params, shape.layers, shape.hidden_size
    if config.lora.enabled:
        adapters = 2 * config.lora.rank * h * len(config.lora.target_modules) * layers
        states, residual = (2 if gpu else 4) * p + 16 * adapters, 2 if gpu else 4
    else:
        states, residual = (18 if gpu else 16) * p, 4
    reference = 4 * p if config.beta > 0 and not config.lora.enabled else 0
    vllm = round(VLLM_SHARE * device_memory) if gpu and vllm_installed() and device_memory else 0
    tokens = max(config.max_tokens_per_micro_batch, row_tokens(config))
    per_token = h * (residual * layers + LAYER_ACTIVATION_BYTES) if gpu else h * layers * 2 * LAYER_ACTIVATION_BYTES
    sequences = config.group_size * config.rows_per_step
    generation = 0 if vllm else sequences * row_tokens(config) * 2 * layers * shape.kv_size * (2 if gpu else 4)
    return MemoryEstimate(states, reference, vllm, tokens * per_token, generation, tokens, per_token)


def check_fits(
    config: TrainingConfig, model_params: int, device_memory: int | None, shape: ModelShape | None = None
) -> MemoryEstimate:
    """The estimate of `config` for a model of `model_params` parameters (`shape` when known, else
    guessed from the size) on a device of `device_memory` bytes (None: no limit, e.g. the CPU).
    Raises UserFixable naming the setting to change when the peak is above HEADROOM of the device."""
    estimate = estimate_memory(config, shape or ModelShape.from_params(model_params), device_memory)
    if device_memory is None or estimate.peak <= HEADROOM * device_memory:
        return estimate
    usable = HEADROOM * device_memory
    fixed = estimate.states + estimate.reference + estimate.vllm
    if fixed > usable:
        if not config.lora.enabled:
            fix = "train LoRA adapters over a frozen bf16 base instead (--lora)" + (
                ", or drop the reference model (--beta 0)" if estimate.reference else ""
            )
        else:
            fix = "use a smaller model or a device with more memory"
    elif estimate.activations >= estimate.generation:
        fitting = int((usable - fixed) // estimate.activation_bytes_per_token)
        if fitting >= row_tokens(config):
            fix = f"lower --max-tokens-per-micro-batch to {fitting} or less"
        else:
            fix = (
                f"a row of about {row_tokens(config)} tokens does not fit alone: lower --max-completion-length"
                + (", or --max-turns (history full)" if config.history == "full" else "")
                + ("" if config.lora.enabled else ", or train LoRA adapters (--lora)")
            )
    else:
        fix = "generate fewer sequences at once (--group-size, --rows-per-step), or install vLLM"
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
