"""The local transformers policy on a tiny offline Qwen3 model: chat template, token ids, parsing."""

from __future__ import annotations

import pytest

from worldsmith.agent.hf_policy import HFPolicy, read_turn, render_prompt
from worldsmith.agent.loop import EpisodeConfig, run_episode

pytestmark = pytest.mark.e2e


def test_episode_records_the_exact_tokens(runtime, golden, tiny_model):
    policy = HFPolicy(tiny_model, max_new_tokens=24)
    trajectory = run_episode(runtime, golden, golden.task("t01_points_balance"), policy, EpisodeConfig(max_turns=2))
    record = trajectory.turn_records[0]
    assert record.prompt_ids and record.completion_ids and record.tokens_out == len(record.completion_ids) <= 24
    # the prompt is the chat template over the system message, the task and the tools (listed once, by the template)
    text = policy.tokenizer.decode(record.prompt_ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert (
        "<tools>" in text
        and text.count('"name": "get_loyalty_history"') == 1
        and golden.task("t01_points_balance").instruction in text
    )
    assert record.prompt_ids == render_prompt(policy.tokenizer, trajectory.messages[:2], trajectory.tools)
    assert trajectory.verdict in ("incomplete", "format_error")  # random weights do not solve tasks


@pytest.mark.unit
def test_read_turn_parses_qwen_tool_calls():
    turn = read_turn(
        '<think>\nplan\n</think>\n\n<tool_call>\n{"name": "get_customer", "arguments": {"customer_id": 3}}\n</tool_call>',
        2,
    )
    assert turn.format_error is None and [(c.name, c.arguments) for c in turn.message.tool_calls] == [
        ("get_customer", {"customer_id": 3})
    ]
    assert turn.message.content == ""
    assert read_turn("The balance is 1250 points.", 1).message.content == "The balance is 1250 points."
    assert (
        read_turn('<tool_call>\n{"name": "f", "arguments": {"x": ', 1).format_error == "unterminated <tool_call> block"
    )


def test_generation_time_is_bounded(runtime, golden, tiny_model):
    """The time limit, not the token limit nor a stop token, ends the turn: greedy decoding of the
    same prompt without a limit goes on past where it was cut (however fast or busy the machine)."""
    policy = HFPolicy(tiny_model, max_new_tokens=4000, timeout_s=0.05)
    trajectory = run_episode(runtime, golden, golden.task("t01_points_balance"), policy, EpisodeConfig(max_turns=1))
    record = trajectory.turn_records[0]
    assert 1 <= record.tokens_out < 4000 and record.completion_ids[-1] not in policy.stop_ids
    untimed = HFPolicy(
        model=policy.model, tokenizer=policy.tokenizer, max_new_tokens=record.tokens_out + 8, timeout_s=None
    )
    continued = untimed.generate(record.prompt_ids)
    assert len(continued) == record.tokens_out + 8 and continued[: record.tokens_out] == record.completion_ids
