"""A tiny Qwen3-architecture model built offline: a byte-level BPE tokenizer trained on episode
text, the Qwen3 chat template (as shipped with TRL), and random weights. Nothing is downloaded;
the result is an ordinary `save_pretrained` directory that every loader in worldsmith accepts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def chat_template() -> str:
    """The Qwen3 chat template, read from the installed TRL (which matches it for response parsing)."""
    from trl.chat_template_utils import qwen3_chat_template

    return qwen3_chat_template


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts`, with the Qwen3 special
    tokens, the tool-call markup as single tokens, and the Qwen3 chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL + MARKUP,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL[1:2],
    )
    fast.add_tokens(MARKUP)
    fast.chat_template = chat_template()
    return fast


def corpus(bundles: Iterable[Any]) -> list[str]:
    """Text the tokenizer should compress well: tool schemas, instructions, reference calls and
    the rows of each world (what tool results are made of)."""
    import sqlite3

    texts = []
    for bundle in bundles:
        texts += [json.dumps({"type": "function", "function": t.model_dump()}) for t in bundle.tools]
        for task in bundle.tasks:
            texts.append(task.instruction)
            texts += [
                f'<tool_call>\n{{"name": "{s.tool}", "arguments": {json.dumps(s.arguments)}}}\n</tool_call>'
                for s in task.solution
            ]
        conn = sqlite3.connect(":memory:")
        conn.deserialize(bundle.world)
        conn.row_factory = sqlite3.Row
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            texts += [json.dumps(dict(row), default=str) for row in conn.execute(f'SELECT * FROM "{table}" LIMIT 50')]
        conn.close()
    return texts


def build_tiny_model(
    out: Path,
    bundles: Iterable[Any],
    *,
    seed: int = 0,
    vocab_size: int = 4096,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    texts: Iterable[str] = (),
) -> Path:
    """Write a tiny Qwen3ForCausalLM with its tokenizer (trained on the bundles' corpus and `texts`) to `out` and return `out`."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = train_tokenizer(corpus(bundles) + list(texts), vocab_size)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // heads,
        max_position_embeddings=16384,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
