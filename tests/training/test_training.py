"""GRPO in the worlds: advantages, history-aligned rows, tool-result masks, env_error exclusion, and
real optimizer steps of TRL's GRPOTrainer on the tiny offline model.

Most tests script what the model "generates" (the `ScriptedTrainer` below overrides generation
only) so that every verdict kind appears in one group; prompts, token ids, the loss, the
optimizer and the runtime are all real.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from support.bundles import with_tools
from support.patience import MOMENTS_S
from support.scripts import call_text

from worldsmith.agent.hf_policy import render_prompt
from worldsmith.agent.loop import Trajectory, TurnRecord, visible
from worldsmith.bundle.contract import Bundle
from worldsmith.training.config import TrainingConfig
from worldsmith.training.importance import importance_ratio
from worldsmith.training.rollouts import Batcher, Sampled
from worldsmith.training.rows import full_rows, group_advantages, windowed_rows

pytestmark = pytest.mark.e2e

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

TASK = "t01_points_balance"


@pytest.fixture(scope="module")
def one_task(golden: Bundle) -> Bundle:
    """The golden world with one task (so every dataset row is that task) and a crashing tool."""
    broken = with_tools(golden, "def broken(conn):\n    return 1 / 0\n", ["broken"])
    return dataclasses.replace(broken, tasks=(golden.task(TASK),))


def scripts_for(bundle: Bundle) -> list[list[str]]:
    """Four rollouts of TASK: solved (1.0), a wrong answer (0.0), an env_error (None), a broken
    tool call (format_error, 0.0: an attempt, worth no less than a wrong answer)."""
    task = bundle.task(TASK)
    solved = [call_text(s.tool, s.arguments) for s in task.solution] + [
        f"The balance is {task.answer} points.<|im_end|>"
    ]
    return [
        solved,
        ["I do not know.<|im_end|>"],
        [call_text("broken", {})],
        ["<tool_call>\n[[ oops, no json<|im_end|>"],
    ]


def token_logps(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """log p(completion token i | prompt, earlier tokens) under `model`, one sequence at a time."""
    with torch.no_grad():
        logits = (
            model(torch.tensor([prompt_ids + completion_ids], device=model.device))
            .logits[0, len(prompt_ids) - 1 : -1]
            .float()
        )
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion_ids, device=model.device)[:, None])[:, 0].tolist()


def make_trainer(
    model_dir: Path,
    bundle: Bundle,
    runtime,
    tmp_path: Path,
    *,
    scripted: bool = True,
    dtype: torch.dtype = torch.float32,
    settings: dict | None = None,
    **overrides,
):
    """The trainer for `bundle` (scripted generation unless `scripted=False`); `settings` override
    GRPOConfig's arguments, `overrides` TrainingConfig's fields."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, grpo_settings, peft_config, task_dataset

    class ScriptedTrainer(WorldGRPOTrainer):
        """Generation follows `scripts` (rollout i's turn k); batch k holds the rollouts still running.
        With `sampler_shift` set it reports sampler log-probabilities as vLLM does: the model's own,
        lowered by the shift. The last scored batch is kept as `last_batch`."""

        sampler_shift: float | None = None

        def rollouts(self, inputs):
            self.turn = 0
            return super().rollouts(inputs)

        def generate_batch(self, prompts):
            live = [s for s in self.scripts if len(s) > self.turn]
            self.turn += 1
            assert len(live) == len(prompts)
            completions = [self.processing_class.encode(s[self.turn - 1], add_special_tokens=False) for s in live]
            if self.sampler_shift is None:
                return [Sampled(ids) for ids in completions]
            return [
                Sampled(ids, [lp - self.sampler_shift for lp in token_logps(self.model, p, ids)])
                for p, ids in zip(prompts, completions)
            ]

        def _generate_and_score_completions(self, inputs):
            self.last_batch = super()._generate_and_score_completions(inputs)
            return self.last_batch

    config = TrainingConfig(
        **{
            "model": str(model_dir),
            "set_name": "test",
            "group_size": 4,
            "steps": 1,
            "learning_rate": 1e-3,
            "max_turns": 4,
            "max_completion_length": 32,
            "rows_per_step": 1,  # one group: the scripts are one group's (the gpu profile would take 4)
            **overrides,
        }
    )
    cls = ScriptedTrainer if scripted else WorldGRPOTrainer
    args = (
        GRPOConfig(**{**grpo_settings(config, tmp_path / "out"), **settings})
        if settings
        else grpo_args(config, tmp_path / "out")
    )
    trainer = cls(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype),
        args=args,
        train_dataset=task_dataset({"b": bundle}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        config=config,
        runtime=runtime,
        bundles={"b": bundle},
        peft_config=peft_config(config),
    )
    if scripted:
        trainer.scripts = scripts_for(bundle) * (config.group_size // 4)
    return trainer


@pytest.mark.unit
def test_group_advantages_are_relative_to_their_group():
    spread = 2**0.5 + 1e-4  # each group's own std (+ 1e-4)
    assert group_advantages([1.0, -1.0, 1.0, 1.0], 2) == pytest.approx([1 / spread, -1 / spread, 0.0, 0.0])
    assert group_advantages([1.0, 1.0, 1.0, 1.0], 4) == [0.0] * 4  # no spread, no signal
    assert group_advantages([1.0, 0.0], 2, "none") == [0.5, -0.5]


@pytest.mark.unit
def test_an_env_error_rollout_gets_no_advantage_nor_moves_its_groups_baseline():
    advantages = group_advantages([1.0, 0.0, None, -1.0, 1.0, 1.0, 1.0, 1.0], 4)
    assert advantages[:4] == pytest.approx([1 / 1.0001, 0.0, 0.0, -1 / 1.0001])
    assert group_advantages([None, None], 2) == [0.0, 0.0]
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages([1.0, 0.0], 3)


@pytest.mark.unit
def test_rows_of_env_error_rollouts_are_empty():
    trajectory = Trajectory(
        env_id="e",
        env_key="k",
        task_id="t",
        policy="p",
        messages=[],
        steps=[],
        turns=1,
        verdict="env_error",
        reward=None,
        turn_records=[TurnRecord(turn=1, prompt_ids=[1, 2], completion_ids=[3])],
    )
    assert windowed_rows(trajectory, 0.0, 0) == [] and full_rows(trajectory, 0.0, 0) == []


@pytest.mark.unit
def test_batcher_waits_for_every_live_episode():
    import threading

    seen: list[list[list[int]]] = []
    threads_generating: set[str] = set()

    def generate_batch(prompts):
        seen.append(prompts)
        threads_generating.add(threading.current_thread().name)
        return [Sampled([p[0] * 10]) for p in prompts]

    batcher = Batcher(generate_batch, live=3)
    results: dict[int, list[int]] = {}

    def episode(index: int, turns: int) -> None:
        for turn in range(turns):
            results[index * 100 + turn] = batcher.generate(index, [index + turn]).ids
        batcher.retire()

    threads = [threading.Thread(target=episode, args=(i, t)) for i, t in ((2, 1), (0, 2), (1, 3))]
    for t in threads:
        t.start()
    batcher.serve()  # returns once every episode retired
    for t in threads:
        t.join(timeout=MOMENTS_S)
    # batches in index order, shrinking as episodes end, whatever the thread timing; the model
    # works only on the serving thread (the trainer's, which owns the CUDA device and any vLLM engine)
    assert seen == [[[0], [1], [2]], [[1], [2]], [[3]]]
    assert threads_generating == {threading.current_thread().name}
    assert results == {0: [0], 1: [10], 200: [20], 100: [10], 101: [20], 102: [30]}


@pytest.mark.unit
def test_an_interrupted_batcher_fails_the_waiting_episodes_instead_of_hanging():
    """An interrupt while generating (Ctrl-C in the trainer) reaches the caller; the episodes
    waiting for that batch, and any that ask later, get an error instead of waiting forever."""
    import threading

    def interrupted(prompts):
        raise KeyboardInterrupt

    batcher = Batcher(interrupted, live=2)
    errors: list[str] = []

    def episode(index: int) -> None:
        try:
            batcher.generate(index, [index])
        except RuntimeError as exc:
            errors.append(str(exc))
        try:
            batcher.generate(index, [index])
        except RuntimeError as exc:
            errors.append(str(exc))
        batcher.retire()

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    with pytest.raises(KeyboardInterrupt):
        batcher.serve()
    for t in threads:
        t.join(timeout=MOMENTS_S)
    assert not any(t.is_alive() for t in threads)
    assert errors == ["rollouts stopped: KeyboardInterrupt"] * 4


def test_windowed_step_rows_hold_exactly_what_the_policy_saw(tiny_model, one_task, runtime, tmp_path):
    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path, window=1)
    assert not trainer.args.bf16 and not trainer.model.is_activation_checkpointing  # cpu-test: fp32, no recomputation
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    result = trainer.train()
    rollouts, rows = trainer.last_rollouts, trainer.last_rows
    assert [t.verdict for t in rollouts] == ["complete", "incomplete", "env_error", "format_error"]
    tokenizer = trainer.processing_class
    for index, trajectory in enumerate(rollouts):
        mine = [r for r in rows if r.rollout == index]
        if trajectory.verdict == "env_error":
            assert mine == []  # contributes nothing to the loss
            continue
        assert len(mine) == trajectory.turns
        assistant = [i for i, m in enumerate(trajectory.messages) if m.role == "assistant"]
        for turn, row in enumerate(mine):
            # exactly the window the policy saw: system, task, the last w=1 turn, rendered by the chat template
            upto = assistant[turn] if turn < len(assistant) else len(trajectory.messages)
            assert row.prompt_ids == render_prompt(tokenizer, visible(trajectory.messages[:upto], 1), trajectory.tools)
            assert row.completion_ids == tokenizer.encode(scripts_for(one_task)[index][turn], add_special_tokens=False)
    advantages = {r.rollout: r.advantage for r in rows}
    assert advantages[0] > 0 > advantages[1] == advantages[3]  # group of rewards 1, 0, (env_error), 0
    assert math.isfinite(result.training_loss) and result.global_step == 1
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    log = trainer.state.log_history[0]
    assert log["success_rate"] == 0.25 and log["env_error_rate"] == 0.25 and log["format_error_rate"] == 0.25
    assert log["rows"] == len(rows) == len(scripts_for(one_task)[0]) + 1 + 1


@pytest.fixture(scope="module")
def qwen25_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a real model's chat template: Qwen2.5-Instruct's (TRL ships it; tool calls
    in <tool_call> blocks, no think blocks), which renders earlier turns as they were generated."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    out = tmp_path_factory.mktemp("tiny-qwen25")
    shutil.copytree(tiny_model, out, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(out)
    return out


def served_prompt(tokenizer, messages, tools) -> list[int]:
    """What a server running the model's own chat template feeds it for `messages` (OpenAI-shaped
    messages and tools, thinking off), ending in the assistant's generation prompt."""
    chat = [
        {
            "role": m.role,
            "content": m.content,
            **(
                {
                    "tool_calls": [
                        {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in m.tool_calls
                    ]
                }
                if m.tool_calls
                else {}
            ),
        }
        for m in messages
    ]
    encoded = tokenizer.apply_chat_template(
        chat,
        tools=[{"type": "function", "function": t} for t in tools],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        enable_thinking=False,
    )
    return list(encoded["input_ids"])


@pytest.mark.parametrize("template", ["qwen3", "qwen2.5"])
def test_full_history_template_trains_on_the_tokens_the_model_is_served(
    tiny_model, qwen25_model, one_task, runtime, tmp_path, template
):
    """Every policy turn of a full-history rollout is trained on exactly the tokens the model's own
    template gives that conversation when served, the tool results masked: Qwen3's template drops
    past empty think blocks, so each turn is a row of its own; Qwen2.5's preserves the prefix, so a
    rollout is one row."""
    model_dir = tiny_model if template == "qwen3" else qwen25_model
    trainer = make_trainer(model_dir, one_task, runtime, tmp_path, history="full")
    trainer.train()
    tokenizer = trainer.processing_class
    assert ("<think>" in tokenizer.chat_template) == (template == "qwen3")
    scored = [i for i, t in enumerate(trainer.last_rollouts) if t.verdict != "env_error"]
    assert {r.rollout for r in trainer.last_rows} == set(scored) == {0, 1, 3}
    for index in scored:
        trajectory, script = trainer.last_rollouts[index], scripts_for(one_task)[index]
        rows = [r for r in trainer.last_rows if r.rollout == index]
        assert len(rows) == (trajectory.turns if template == "qwen3" else 1)
        assistant = [i for i, m in enumerate(trajectory.messages) if m.role == "assistant"]
        turn = 0
        for row in rows:
            tokens, mask = row.prompt_ids + row.completion_ids, [0] * len(row.prompt_ids) + row.tool_mask
            runs = [i for i in range(1, len(mask) + 1) if (mask + [0])[i] != mask[i - 1]]  # edges of unmasked runs
            for start, end in zip(runs[::2], runs[1::2]):  # each run: one turn, after exactly what serving gives it
                upto = assistant[turn] if turn < len(assistant) else len(trajectory.messages)
                assert tokens[:start] == served_prompt(tokenizer, trajectory.messages[:upto], trajectory.tools)
                assert tokens[start:end] == tokenizer.encode(script[turn], add_special_tokens=False)
                turn += 1
        assert turn == trajectory.turns == len(script)


def test_each_of_three_training_steps_is_logged(tiny_model, one_task, runtime, tmp_path):
    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path, steps=3)
    trainer.scripts = scripts_for(one_task)
    result = trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert result.global_step == 3 and len(logs) == 3
    assert all(math.isfinite(entry["loss"]) and entry["reward"] == pytest.approx(1 / 3) for entry in logs)


def test_lora_with_kl_trains_only_the_adapters_logging_the_kl(tiny_model, one_task, runtime, tmp_path):
    trainer = make_trainer(
        tiny_model,
        one_task,
        runtime,
        tmp_path,
        beta=0.04,
        lora={"enabled": True, "rank": 4, "target_modules": ["q_proj", "v_proj"]},
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and all("lora_" in n for n in changed)  # the base weights stay as they were
    log = trainer.state.log_history[0]
    assert math.isfinite(log["kl"]) and log["kl"] >= 0 and math.isfinite(log["loss"])


def completion_logp(trainer, rows) -> list[float]:
    """Sum of the model's log-probabilities of each row's completion tokens."""
    from worldsmith.training.rows import collate

    batch = collate(rows, trainer.processing_class.pad_token_id)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, batch["completion_ids"].size(1))[0]
    return (logps * batch["completion_mask"]).sum(-1).tolist()


def test_steps_move_probability_towards_the_better_rollouts(tiny_model, one_task, runtime, tmp_path):
    untrained = make_trainer(tiny_model, one_task, runtime, tmp_path / "untrained")
    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path, steps=3)
    trainer.train()
    first = trainer.last_rows[0].prompt_ids  # every rollout's first turn shares this prompt
    rows = [next(r for r in trainer.last_rows if r.rollout == i and r.prompt_ids == first) for i in (0, 1, 3)]
    start, end = completion_logp(untrained, rows), completion_logp(trainer, rows)
    assert end[0] > start[0]  # the solved rollout's first tool call (advantage > 0): more likely
    assert end[2] < start[2]  # the malformed call (advantage < 0): less likely


def test_gpu_profile_settings(tiny_model, one_task, runtime, tmp_path):
    """The gpu profile: bf16, gradient checkpointing, vLLM only when installed; refused with a clear
    message on a machine without CUDA (the GPU figures come from bench/gpu_train_smoke.sh)."""
    import importlib.util

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="profile 'gpu' needs a CUDA device"):
            make_trainer(tiny_model, one_task, runtime, tmp_path, profile="gpu")
        return
    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path, profile="gpu")
    assert trainer.args.bf16 and trainer.args.activation_checkpointing
    assert trainer.use_vllm == (importlib.util.find_spec("vllm") is not None)
    result = trainer.train()
    assert math.isfinite(result.training_loss) and trainer.model.is_activation_checkpointing


ADAPTERS = {"lora": {"enabled": True, "rank": 4, "target_modules": ["q_proj", "v_proj"]}}


def gpu_dtype(lora: bool) -> torch.dtype:
    """The dtype the gpu profile loads the policy in (trainer.model_dtype)."""
    from worldsmith.training.trainer import model_dtype

    config = TrainingConfig(model="m", set_name="s", profile="gpu", **(ADAPTERS if lora else {}))
    return getattr(torch, model_dtype(config))


@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
def test_gpu_profile_mechanics_run_in_bf16_on_the_cpu(tiny_model, one_task, runtime, tmp_path, lora):
    """All the gpu profile changes but the device, run here: bf16 autocast over fp32 weights (a bf16
    base under LoRA, its adapters fp32), activation checkpointing off while rolling out and on for
    the loss (with LoRA too, which needs input gradients for it), every verdict kind in the group
    (so the masks, advantages and env_error exclusion meet bf16 log-probabilities before a GPU
    does), the KL term on."""
    trainer = make_trainer(
        tiny_model,
        one_task,
        runtime,
        tmp_path,
        dtype=gpu_dtype(lora),
        beta=0.04,
        settings={"bf16": True, "activation_checkpointing": True},
        **(ADAPTERS if lora else {}),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    result = trainer.train()
    assert (
        trainer.args.bf16
        and trainer.model.is_activation_checkpointing
        and trainer.accelerator.mixed_precision == "bf16"
    )
    dtypes = {n: p.dtype for n, p in trainer.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16 if lora else torch.float32}
    assert {d for n, d in dtypes.items() if "lora_" in n} == ({torch.float32} if lora else set())
    assert math.isfinite(result.training_loss)
    assert [t.verdict for t in trainer.last_rollouts] == ["complete", "incomplete", "env_error", "format_error"]
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and (not lora or all("lora_" in n for n in changed))
    logged = trainer.state.log_history[0]
    assert math.isfinite(logged["kl"]) and logged["success_rate"] == 0.25


def changed_share(before: dict[str, torch.Tensor], model, kind: str) -> float:
    """Share of the elements of `kind` weights (linear: 2-D but the embeddings; norm) that changed."""
    picked = [
        (before[n], p)
        for n, p in model.named_parameters()
        if (kind == "norm") == ("norm" in n) and (kind == "norm" or (p.ndim == 2 and "embed" not in n))
    ]
    return sum(int((b != p).sum()) for b, p in picked) / sum(p.numel() for _, p in picked)


@pytest.mark.parametrize("storage", ["gpu-profile", "bf16"])
def test_one_step_at_the_papers_learning_rate_moves_most_weights(tiny_model, one_task, runtime, tmp_path, storage):
    """One GRPO step at lr 7e-7 with the gpu profile's precision (bf16 autocast, emulated on the CPU)
    changes more than 90% of the stored linear and norm weights: an AdamW update of about 7e-7 is
    far above an fp32 master's resolution. Stored in bf16 instead (what the profile did before),
    the same step leaves almost every weight as it was: below bf16's resolution."""
    trainer = make_trainer(
        tiny_model,
        one_task,
        runtime,
        tmp_path,
        profile="gpu",
        learning_rate=7e-7,
        dtype=gpu_dtype(False) if storage == "gpu-profile" else torch.bfloat16,
        settings={"use_cpu": True, "use_vllm": False},
    )
    assert trainer.args.bf16 and trainer.accelerator.mixed_precision == "bf16"
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    linear, norm = changed_share(before, trainer.model, "linear"), changed_share(before, trainer.model, "norm")
    print(f"{storage}: {linear:.2%} of linear weights and {norm:.2%} of norm weights changed")
    if storage == "gpu-profile":
        assert linear > 0.9 and norm > 0.9
    else:
        assert linear < 0.1 and norm < 0.1


def test_lora_at_the_papers_learning_rate_trains_fp32_adapters_only(tiny_model, one_task, runtime, tmp_path):
    """The gpu profile's LoRA: a frozen bf16 base, fp32 adapters that one step at lr 7e-7 moves."""
    trainer = make_trainer(
        tiny_model,
        one_task,
        runtime,
        tmp_path,
        profile="gpu",
        dtype=gpu_dtype(True),
        settings={"use_cpu": True, "use_vllm": False},
        lora={**ADAPTERS["lora"], "learning_rate": 7e-7},
    )
    assert trainer.args.learning_rate == 7e-7
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and all("lora_" in n for n in changed)
    assert all(trainer.model.get_parameter(n).dtype == torch.float32 for n in changed)


@pytest.mark.unit
def test_importance_ratio_modes():
    """TRL's vLLM correction rule: exp(train - sampler) per token or summed per sequence, truncated
    or masked at the bounds; unknown (NaN) and masked tokens count as ratio 1."""
    train = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    sampler = torch.tensor([[-1.5, -2.0, math.nan], [-0.5, -2.5, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    token = importance_ratio(train, sampler, mask, "token_truncate", clip_min=None, clip_max=1.5)
    assert token.flatten().tolist() == pytest.approx([1.5, 1.0, 1.0, math.exp(-0.5), 1.5, 1.0])
    masked = importance_ratio(train, sampler, mask, "token_mask", clip_min=0.7, clip_max=3.0)
    assert masked.flatten().tolist() == pytest.approx([math.exp(0.5), 1.0, 1.0, 0.0, 0.0, 1.0])  # 0.61 < 0.7, 4.48 > 3
    sequence = importance_ratio(train, sampler, mask, "sequence_mask", clip_max=2.0)
    assert sequence.shape == (2, 1) and sequence.flatten().tolist() == pytest.approx(
        [math.exp(0.5), 0.0]
    )  # exp(1.0) > 2: out
    assert importance_ratio(
        train, sampler, mask, "sequence_truncate", clip_max=2.0
    ).flatten().tolist() == pytest.approx([math.exp(0.5), 2.0])
    with pytest.raises(ValueError, match="unknown importance sampling mode 'per_row'"):
        importance_ratio(train, sampler, mask, "per_row")


@pytest.mark.unit
def test_rows_carry_the_sampler_logprobs_of_generated_tokens_only():
    records = [
        TurnRecord(turn=1, prompt_ids=[1, 2], completion_ids=[3, 4], completion_logprobs=[-0.1, -0.2]),
        TurnRecord(turn=2, prompt_ids=[1, 2, 3, 4, 9, 9], completion_ids=[5], completion_logprobs=[-0.3]),
    ]
    trajectory = Trajectory(
        env_id="e",
        env_key="k",
        task_id="t",
        policy="p",
        messages=[],
        steps=[],
        turns=2,
        verdict="complete",
        reward=1.0,
        turn_records=records,
    )
    assert [r.sampling_logps for r in windowed_rows(trajectory, 1.0, 0)] == [[-0.1, -0.2], [-0.3]]
    (row,) = full_rows(trajectory, 1.0, 0)
    assert row.tool_mask == [1, 1, 0, 0, 1]
    assert [x for x, keep in zip(row.sampling_logps, row.tool_mask) if keep] == [-0.1, -0.2, -0.3]
    assert all(math.isnan(x) for x, keep in zip(row.sampling_logps, row.tool_mask) if not keep)
    unsampled = trajectory.model_copy(
        update={"turn_records": [r.model_copy(update={"completion_logprobs": None}) for r in records]}
    )
    assert full_rows(unsampled, 1.0, 0)[0].sampling_logps is None  # transformers generation reports none


@pytest.mark.parametrize("history", ["windowed", "full"])
def test_vllm_sampler_logprobs_become_trls_importance_correction(tiny_model, one_task, runtime, tmp_path, history):
    """With vLLM generating (needs a GPU: its reported log-probabilities are scripted here as the
    model's own minus 0.1 per token), the batch carries TRL's correction per token (token_mask):
    exp(0.1) on every generated token, 1 elsewhere, no token masked, where a ratio per sequence,
    exp(0.1 x the row's generated tokens), would have dropped the longer rows whole; the step trains
    and logs the ratio and the masked share."""
    from trl import GRPOTrainer

    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path, history=history)
    trainer.use_vllm, trainer.sampler_shift = True, 0.1  # what GRPOTrainer sets with vLLM; generation stays scripted
    result = trainer.train()
    batch = trainer.last_batch
    loss_mask = (batch["completion_mask"] * batch.get("tool_mask", 1)).bool()
    ratio = batch["importance_sampling_ratio"]
    assert ratio.shape == loss_mask.shape and trainer.vllm_importance_sampling_mode == "token_mask"
    assert ratio[loss_mask].tolist() == pytest.approx([math.exp(0.1)] * int(loss_mask.sum()), rel=1e-3)
    row_advantages = torch.tensor([r.advantage for r in trainer.last_rows])
    assert torch.allclose(batch["advantages"], row_advantages[:, None] * ratio)  # the ratio rides on the advantages
    trained = batch["sampling_per_token_logps"] + 0.1
    per_sequence = importance_ratio(trained, batch["sampling_per_token_logps"], loss_mask, "sequence_mask", None, 3.0)
    assert 0.0 in per_sequence.flatten().tolist()  # per sequence, some rows would have left the loss whole
    logged = trainer.state.log_history[0]
    assert math.isfinite(result.training_loss) and logged["sampling/masked_share"] == 0.0
    assert logged["sampling/sampling_logp_difference/mean"] == pytest.approx(0.1, rel=1e-2)
    assert not trainer.vllm_importance_sampling_correction  # TRL's own multiplication: off
    with torch.no_grad():  # the same loss as TRL's own correction (its vLLM flag on, the ratio multiplied in its loss)
        folded = GRPOTrainer._compute_loss(trainer, trainer.model, batch)
        trainer.vllm_importance_sampling_correction = True
        trls = GRPOTrainer._compute_loss(trainer, trainer.model, {**batch, "advantages": row_advantages})
    assert folded.item() == pytest.approx(trls.item(), rel=1e-5, abs=1e-7)


def test_num_iterations_above_one_is_refused_in_one_line(tiny_model, one_task, runtime, tmp_path):
    with pytest.raises(ValueError, match="^num_iterations 2 is not supported: .*; set 1$"):
        make_trainer(tiny_model, one_task, runtime, tmp_path, settings={"num_iterations": 2})


def test_a_model_failure_fails_the_step_before_any_scoring(tiny_model, one_task, runtime, tmp_path):
    """The model failing to generate (out of memory, say) is not the agent's failure: the step
    raises, naming it, before any reward or loss is computed."""
    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    def out_of_memory(prompts):
        raise RuntimeError("CUDA out of memory (tried to allocate 2.00 GiB)")

    trainer.generate_batch = out_of_memory
    with pytest.raises(RuntimeError, match=r"generation failed during rollouts: .*CUDA out of memory"):
        trainer.train()
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def flat_scripts(bundle: Bundle, group_size: int) -> list[list[str]]:
    """A group that cannot teach: every rollout answers without calling anything (all reward 0)."""
    return [["I do not know.<|im_end|>"]] * group_size


def scripted_rounds(trainer, rounds: list[list[list[str]]]) -> list[int]:
    """Make `trainer`'s successive rollout rounds follow `rounds` (the last repeats); returns the
    number of entries each round played, as it goes."""
    played: list[int] = []
    scripted = trainer.rollouts

    def rollouts(inputs):
        trainer.scripts = rounds[min(len(played), len(rounds) - 1)]
        played.append(len(inputs))
        return scripted(inputs)

    trainer.rollouts = rollouts
    return played


def test_dynamic_sampling_replaces_a_group_that_cannot_teach(tiny_model, one_task, runtime, tmp_path):
    """The first group's rewards are all equal: it is replaced by a group of a task drawn from the
    set, whose mixed rewards then make the step (counted as refilled, not skipped)."""
    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path, refill_rounds=2)
    played = scripted_rounds(trainer, [flat_scripts(one_task, 4), scripts_for(one_task)])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    log = trainer.state.log_history[0]
    assert played == [4, 4]  # one refill round sufficed; the second was not needed
    assert log["groups_refilled"] == 1.0 and log["skipped_step"] == 0.0
    assert {r.rollout for r in trainer.last_rows} == {0, 1, 3}  # the refilled group's rows make the batch
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


@pytest.mark.parametrize("guarded", [True, False], ids=["skip_step", "without-skip"])
def test_skip_step_leaves_weights_and_moments_as_they_were(
    tiny_model, one_task, runtime, tmp_path, guarded, monkeypatch
):
    """Step 1 teaches; step 2's only group cannot (no refill): its optimizer step is skipped, so the
    weights and AdamW's moments stay as step 1 left them. Without the skip (the control), AdamW's
    momentum moves the weights on that zero-gradient step."""
    one = make_trainer(tiny_model, one_task, runtime, tmp_path / "one", refill_rounds=0)
    one.train()
    if not guarded:
        monkeypatch.setattr("worldsmith.training.trainer.has_signal", lambda advantages: True)
    two = make_trainer(tiny_model, one_task, runtime, tmp_path / "two", refill_rounds=0, steps=2)
    scripted_rounds(two, [scripts_for(one_task), flat_scripts(one_task, 4)])
    two.train()
    same = all(torch.equal(p, q) for p, q in zip(one.model.parameters(), two.model.parameters(), strict=True))
    steps = {int(state["step"]) for state in two.optimizer.optimizer.state.values()}
    if guarded:
        assert same and steps == {1}
        assert [entry["skipped_step"] for entry in two.state.log_history if "loss" in entry] == [0.0, 1.0]
    else:
        assert not same and steps == {2}
