"""Bounded memory: rows packed into length-sorted micro-batches under a token budget, whose
accumulated gradients equal one pass over the whole batch; log-probability passes chunked the same
way; the memory model and the refusal of a configuration that cannot fit."""

from __future__ import annotations

import re

import pytest
import torch
from test_training import make_trainer, one_task  # noqa: F401 - one_task is a fixture used below

from worldsmith.failures import UserFixable
from worldsmith.training.config import TrainingConfig
from worldsmith.training.memory import GIB, ModelShape, check_fits, estimate_memory, model_shape
from worldsmith.training.rows import TrainingRow, collate, even_out, micro_batches, row_lengths, take_rows

pytestmark = pytest.mark.unit

# the shape of a Qwen3-4B checkpoint's config.json (what `model_shape` reads from a model directory)
QWEN3_4B = ModelShape.from_config(
    {
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "vocab_size": 151936,
        "num_attention_heads": 32,
        "head_dim": 128,
        "num_key_value_heads": 8,
        "intermediate_size": 9728,
        "tie_word_embeddings": True,
    }
)


def padded(lengths: list[tuple[int, int]], group: list[int]) -> int:
    return len(group) * (max(lengths[i][0] for i in group) + max(lengths[i][1] for i in group))


#: (prompt, completion) token lengths of eight rows; row 6 alone is longer than a budget of 100.
LENGTHS = [(30, 5), (10, 2), (50, 40), (12, 3), (31, 4), (5, 1), (200, 10), (11, 2)]


def test_micro_batches_hold_every_row_once():
    groups = micro_batches(LENGTHS, 100)
    assert sorted(i for g in groups for i in g) == list(range(len(LENGTHS)))


def test_micro_batches_go_longest_first_within_the_budget():
    groups = micro_batches(LENGTHS, 100)
    order = [i for g in groups for i in g]
    assert [sum(LENGTHS[i]) for i in order] == sorted((sum(x) for x in LENGTHS), reverse=True)
    assert groups[0] == [6]  # longer than the budget: alone
    assert all(padded(LENGTHS, g) <= 100 for g in groups if len(g) > 1)
    assert micro_batches(LENGTHS, 10_000) == [order]  # everything fits: one pass


def test_processes_even_out_their_passes_by_halving_groups_then_adding_empty_ones():
    """Under DDP every pass is a collective: a process with fewer micro-batches than the busiest
    splits its largest ones (each half within the budget), and runs empty passes past one row each."""
    lengths = [(40, 8), (30, 5), (20, 5), (10, 2)]
    groups = micro_batches(lengths, 1000)
    assert len(groups) == 1
    for count in (1, 2, 3, 4):
        evened = even_out(groups, count)
        assert len(evened) == count and sorted(i for g in evened for i in g) == [0, 1, 2, 3]
        assert all(padded(lengths, g) <= 1000 for g in evened)
    assert even_out(groups, 6)[4:] == [[], []] and all(even_out(groups, 6)[:4])


def test_taking_rows_of_a_collated_batch_equals_collating_those_rows():
    rows = [
        TrainingRow([1, 2, 3], [4, 5], 1.0, 0, sampling_logps=[-0.1, -0.2]),
        TrainingRow([1] * 9, [6] * 7, -1.0, 1, tool_mask=[1, 0, 0, 1, 1, 1, 1]),
        TrainingRow([7], [8], 0.5, 2),
    ]
    batch = collate(rows, pad_id=0)
    assert row_lengths(batch) == [(3, 2), (9, 7), (1, 1)]
    for picked in ([0, 2], [2, 0], [1]):
        part, expected = take_rows(batch, picked), collate([rows[i] for i in picked], pad_id=0)
        for key, value in expected.items():
            assert torch.equal(part[key].nan_to_num(9.0), value.nan_to_num(9.0)), key
        # what the other rows brought along is neutral: no tool tokens, no sampler log-probabilities
        extra = part.keys() - expected.keys()
        assert extra <= {"tool_mask", "sampling_per_token_logps"}
        assert "tool_mask" not in extra or bool((part["tool_mask"] == 1).all())
        assert "sampling_per_token_logps" not in extra or bool(part["sampling_per_token_logps"].isnan().all())


def gradients(trainer, batch: dict, budget: int) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss and gradients of one training pass over `batch` with micro-batches under `budget`."""
    trainer.config = trainer.config.model_copy(update={"max_tokens_per_micro_batch": budget})
    trainer.model.train()
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, batch)
    trainer.accelerator.backward(loss)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.item(), grads


@pytest.mark.e2e
@pytest.mark.parametrize("history", ["windowed", "full"])
def test_micro_batched_gradients_equal_the_whole_batchs(tiny_model, one_task, runtime, tmp_path, history):  # noqa: F811
    """The same scored batch (every verdict kind, tool masks in full history, the KL term on) through
    one pass and through micro-batches of about two rows: the same loss and gradients, for TRL's
    default loss (dapo, normalised by the batch's tokens) and for those normalised per row (grpo)
    or per micro-batch token (bnpo); the chunked reference log-probabilities equal the whole pass's."""
    trainer = make_trainer(tiny_model, one_task, runtime, tmp_path, history=history, beta=0.04)
    trainer.train()
    batch = trainer.last_batch
    lengths = row_lengths(batch)
    small = 2 * max(p + c for p, c in lengths)
    whole = 10 * batch["prompt_ids"].numel()
    assert len(micro_batches(lengths, small)) >= 2 and len(micro_batches(lengths, whole)) == 1
    for loss_type in ("dapo", "grpo", "bnpo"):
        trainer.loss_type = loss_type
        loss, grads = gradients(trainer, batch, whole)
        micro_loss, micro_grads = gradients(trainer, batch, small)
        assert micro_loss == pytest.approx(loss, rel=1e-4, abs=1e-6), loss_type
        with torch.no_grad():  # evaluation's pass: the same loss, nothing backpropagated
            assert trainer.compute_loss(trainer.model, batch).item() == pytest.approx(loss, rel=1e-4, abs=1e-6)
        worst = max(float((micro_grads[n] - g).abs().max() / g.abs().max().clamp(min=1e-12)) for n, g in grads.items())
        print(f"{history} {loss_type}: loss {loss:.6f} vs {micro_loss:.6f}, worst gradient gap {worst:.1e} of its max")
        assert grads.keys() == micro_grads.keys() and grads
        for name, grad in grads.items():
            torch.testing.assert_close(micro_grads[name], grad, rtol=1e-3, atol=1e-6, msg=f"{loss_type} {name}")
    reference = trainer._reference_logps(batch)
    trainer.config = trainer.config.model_copy(update={"max_tokens_per_micro_batch": whole})
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(reference[mask], trainer._reference_logps(batch)[mask], rtol=1e-4, atol=1e-5)
    assert trainer.state.log_history[0]["micro_batches"] >= 1


def test_a_configuration_fits_on_the_cpu_without_a_device_limit():
    config = TrainingConfig(model="m", set_name="s", max_tokens_per_micro_batch=10**6)
    estimate = check_fits(config, QWEN3_4B.params, None, QWEN3_4B)
    assert estimate.peak > 16 * QWEN3_4B.params  # fp32 weights, gradients and Adam's two moments, at least


def test_full_fine_tuning_that_cannot_fit_is_refused_naming_lora():
    config = TrainingConfig(model="m", set_name="s", profile="gpu", rows_per_step=1)
    with pytest.raises(UserFixable, match=r"--lora\b") as refused:
        check_fits(config, QWEN3_4B.params, 64 * GIB, QWEN3_4B)
    assert "64.0 GiB" in str(refused.value) and refused.value.exit_code == 2
    lora = config.model_copy(update={"lora": config.lora.model_copy(update={"enabled": True})})
    assert check_fits(lora, QWEN3_4B.params, 64 * GIB, QWEN3_4B).peak < 0.9 * 64 * GIB


def test_a_token_budget_too_large_is_refused_with_one_that_fits():
    config = TrainingConfig(model="m", set_name="s", profile="gpu", rows_per_step=1, max_tokens_per_micro_batch=400_000)
    with pytest.raises(UserFixable, match="lower --max-tokens-per-micro-batch to") as refused:
        check_fits(config, QWEN3_4B.params, 139 * GIB, QWEN3_4B)
    (suggested,) = re.findall(r"to (\d+) or less", str(refused.value))
    fitting = config.model_copy(update={"max_tokens_per_micro_batch": int(suggested)})
    assert check_fits(fitting, QWEN3_4B.params, 139 * GIB, QWEN3_4B).peak <= 0.9 * 139 * GIB


def _gpu_config(max_tokens_per_micro_batch: int) -> TrainingConfig:
    return TrainingConfig(
        model="m", set_name="s", profile="gpu", rows_per_step=1, max_tokens_per_micro_batch=max_tokens_per_micro_batch
    )


def test_memory_grows_with_the_token_budget():
    small, large = _gpu_config(8192), _gpu_config(65536)
    assert estimate_memory(large, QWEN3_4B, 139 * GIB).peak > estimate_memory(small, QWEN3_4B, 139 * GIB).peak


def test_a_model_shape_guessed_from_its_size_errs_on_the_safe_side():
    large, guessed = _gpu_config(65536), ModelShape.from_params(QWEN3_4B.params)
    assert estimate_memory(large, guessed, 139 * GIB).peak >= estimate_memory(large, QWEN3_4B, 139 * GIB).peak


@pytest.mark.e2e
def test_model_shape_reads_the_model_directory(tiny_model):
    from transformers import AutoModelForCausalLM

    shape = model_shape(str(tiny_model))
    params = AutoModelForCausalLM.from_pretrained(tiny_model).num_parameters()
    assert shape is not None and shape.params == pytest.approx(params, rel=0.01)  # all but the norms' weights
    assert model_shape("tiny") is None
