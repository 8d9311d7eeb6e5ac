"""A local transformers causal LM as the policy: the tokenizer's chat template renders the visible
conversation with the tools, the model generates one assistant turn, and its tool calls are read in
the `<tool_call>{json}</tool_call>` format (Qwen, Hermes and most open tool-calling models).
Prompt and completion token ids are kept on each turn for training."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from worldsmith.agent.chat import hf_messages, hf_tools
from worldsmith.agent.messages import Message, PolicyTurn
from worldsmith.agent.openai_policy import parse_text_calls
from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.toolschema import ToolSchemaJson

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def load_model(path: str | Path, device: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a local directory or an id already in the Hugging Face cache;
    bf16 on CUDA, fp32 on the CPU; never downloads when HF_HUB_OFFLINE=1."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    # transformers' decorated `to` is typed as taking the model first
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)  # type: ignore[arg-type]
    model.eval()
    return model, tokenizer


def render_prompt(tokenizer: Any, view: list[Message], tools: list[ToolSchemaJson]) -> list[int]:
    """Token ids of the tokenizer's chat-template rendering of `view` with `tools`, ending in the
    assistant's generation prompt (thinking off where the template supports it)."""
    encoded = tokenizer.apply_chat_template(
        hf_messages(view),
        tools=hf_tools(tools),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        enable_thinking=False,
    )
    return list(encoded["input_ids"])


def stop_token_ids(tokenizer: Any) -> list[int]:
    """The tokens that end a turn: the tokenizer's end-of-sequence token and <|im_end|>."""
    ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return [i for i in ends if isinstance(i, int) and i >= 0]


def completion_text(tokenizer: Any, completion_ids: list[int]) -> str:
    """The text of a completion up to its end-of-turn token (special tokens kept: tool-call tags are some)."""
    text: str = tokenizer.decode(completion_ids, skip_special_tokens=False)
    for stop in ("<|im_end|>", "<|endoftext|>", tokenizer.eos_token or ""):
        text = text.split(stop)[0] if stop else text
    return text


def read_turn(text: str, turn: int) -> PolicyTurn:
    """An assistant message from generated text, or a format error for a malformed tool call."""
    text = _THINK.sub("", text).strip()
    calls, problem = parse_text_calls(text, turn)
    if problem:
        return PolicyTurn(format_error=problem)
    return PolicyTurn(
        message=Message(
            role="assistant",
            content=re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL).strip(),
            tool_calls=calls,
        )
    )


class HFPolicy:
    """Generates with a local model; greedy when `temperature` is 0. A turn stops at `max_new_tokens`
    or after `timeout_s` seconds; a tool call cut off that way is a format error."""

    shows_tools = True

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        timeout_s: float | None = 120.0,
        device: str | None = None,
    ):
        if model is None or tokenizer is None:
            if path is None:
                raise ValueError("HFPolicy needs a model path, or both model and tokenizer")
            model, tokenizer = load_model(path, device)
        self.model, self.tokenizer = model, tokenizer
        self.name = f"hf:{path or getattr(model, 'name_or_path', 'model')}"
        self.max_new_tokens, self.temperature, self.timeout_s = max_new_tokens, temperature, timeout_s
        self.stop_ids = stop_token_ids(tokenizer)

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        import torch

        self.turn = 0
        torch.manual_seed(seed)

    def prompt_ids(self, view: list[Message], tools: list[ToolSchemaJson]) -> list[int]:
        """Token ids the model sees for this turn: the chat-template rendering of `view`."""
        return render_prompt(self.tokenizer, view, tools)

    def generate(self, prompt_ids: list[int]) -> list[int]:
        """Completion token ids for one prompt (up to and including the stop token when one came)."""
        import torch

        sampling = (
            {"do_sample": True, "temperature": self.temperature} if self.temperature > 0 else {"do_sample": False}
        )
        with torch.no_grad():
            output = self.model.generate(
                torch.tensor([prompt_ids], device=self.model.device),
                max_new_tokens=self.max_new_tokens,
                eos_token_id=self.stop_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                max_time=self.timeout_s,
                **sampling,
            )
        completion: list[int] = output[0, len(prompt_ids) :].tolist()
        return completion

    def act(self, view: list[Message], tools: list[ToolSchemaJson]) -> PolicyTurn:
        self.turn += 1
        started = time.perf_counter()
        prompt_ids = self.prompt_ids(view, tools)
        completion_ids = self.generate(prompt_ids)
        turn = read_turn(
            completion_text(self.tokenizer, completion_ids), self.turn
        )  # out of new tokens inside a <tool_call>: unterminated, a format error
        turn.tokens_in, turn.tokens_out, turn.seconds = (
            len(prompt_ids),
            len(completion_ids),
            time.perf_counter() - started,
        )
        turn.prompt_ids, turn.completion_ids = prompt_ids, completion_ids
        return turn


@contextmanager
def whole_distribution(model: Any) -> Iterator[None]:
    """While it lasts, `model`'s own generation config (Qwen3's top_k 20 and top_p 0.95, say) is
    transformers' default one, so that `generate` samples from the whole softmax at the temperature
    given, which the loss's log-probabilities (and the importance ratio) describe: transformers
    fills every setting a `generate` call leaves unset (min_p, typical_p, top_h...) from the model's
    config, and a truncated distribution would make the rollouts off-policy without any log-probability
    saying so. The model's config is back afterwards (it is saved with the checkpoints)."""
    from transformers import GenerationConfig

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: the model it wraps
    original = base.generation_config
    base.generation_config = GenerationConfig()
    try:
        yield
    finally:
        base.generation_config = original
