"""Policies named on the command line and in flow parameters: `reference`, `random`,
`openai:MODEL` (the configured OpenAI-compatible endpoint) and `hf:PATH` (a local model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from worldsmith.agent.policies import Policy, RandomPolicy, ReferencePolicy
from worldsmith.settings import get_settings

SPEC_HELP = "reference | random | openai:MODEL | hf:PATH"


def check_spec(spec: str) -> str:
    """`spec` if it names a policy kind, else ValueError naming the problem (nothing is loaded)."""
    kind, _, target = spec.partition(":")
    if spec in ("reference", "random") or kind in ("openai", "hf") and target:
        return spec
    raise ValueError(f"unknown policy {spec!r}; use {SPEC_HELP}")


def policy_factory(
    spec: str,
    *,
    temperature: float = 0.0,
    tool_format: Literal["native", "text"] = "native",
    meta_tools: bool = False,
    max_new_tokens: int = 512,
) -> Callable[[], Policy]:
    """A function making a fresh policy per episode (policies keep per-episode state); a local
    model is loaded once and shared. Raises ValueError naming the problem for a bad spec."""
    kind, _, target = check_spec(spec).partition(":")
    if spec == "reference":
        return ReferencePolicy
    if spec == "random":
        return RandomPolicy
    if kind == "openai" and target:
        from worldsmith.agent.openai_policy import OpenAIPolicy

        settings = get_settings()
        return lambda: OpenAIPolicy(
            target,
            base_url=settings.llm_base_url,
            api_key=settings.llm_key(),
            mode=tool_format,
            meta=meta_tools,
            temperature=temperature,
            timeout_s=settings.llm_timeout_s,
        )
    from worldsmith.agent.hf_policy import HFPolicy, load_model

    model, tokenizer = load_model(target)
    return lambda: HFPolicy(
        target, model=model, tokenizer=tokenizer, temperature=temperature, max_new_tokens=max_new_tokens
    )
