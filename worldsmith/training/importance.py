"""Importance-sampling correction for a sampler that is not the trained model (vLLM in the trainer,
or an inference engine one or more policy versions behind).

vLLM's kernels give the sampled tokens slightly different probabilities than the trainer's own
forward pass, and an engine's rollouts may come from an older version, so the rollouts are a
little off-policy even in the first optimizer step. The loss is multiplied by the ratio
pi_train(token) / pi_sampler(token), per token or per sequence, truncated or masked at its bounds
(GRPOConfig's `vllm_importance_sampling_mode` and `_clip_*` settings), over the sampler
log-probabilities the rollouts recorded (rows.TrainingRow.sampling_logps).

The trainer applies it itself (`weigh_advantages`), never through TRL's `use_vllm` flag (which would
also switch TRL's generation and weight-sync code on): the ratio, being >= 0, multiplies each token's
advantage, which TRL's loss accepts per token (B x T) and which scales every loss type's
policy-gradient term by it exactly as TRL's own multiplication would (min(r a x, r a y) = r min(a x,
a y) for r >= 0), the KL term untouched. TRL's own correction is off (`vllm_importance_sampling_correction`
False in trainer.grpo_settings), so it is applied once.

The runs use `token_mask` (trainer.grpo_settings): per sequence, the ratio of a long full-history
row is a product over thousands of tokens, which leaves the bounds for almost any row, so the whole
rollout would be silently zeroed; per token only the tokens whose own ratio is out of bounds are.
The share of loss tokens masked is logged each step (`masked_share`).
"""

from __future__ import annotations

import math
from typing import Any

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_ratio(
    train_logps: Any,
    sampling_logps: Any,
    mask: Any,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> Any:
    """exp(train - sampling) over the tokens `mask` keeps: per token (shape B x T) or summed per
    sequence (B x 1); `*_truncate` clamps it into [clip_min, clip_max], `*_mask` sets it to 0
    outside. A token whose sampler log-probability is unknown (NaN) or masked out counts as
    ratio 1, so it neither corrects nor poisons the loss."""
    import torch

    if mode not in MODES:
        raise ValueError(f"unknown importance sampling mode {mode!r}: use one of {', '.join(MODES)}")
    diff = torch.nan_to_num((train_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("_truncate"):
        return ratio if clip_min is None and clip_max is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def masked_share(ratio: Any, mask: Any) -> float:
    """The share of the tokens `mask` keeps that a `*_mask` ratio (per token B x T, or per sequence
    B x 1) sets to 0: what the correction takes out of the loss. 0 when `mask` keeps none."""
    kept = mask.bool()
    total = int(kept.sum())
    if not total:
        return 0.0
    return float(((ratio == 0).expand_as(kept) & kept).sum()) / total


def sampler_correction(
    train_logps: Any,
    sampling_logps: Any,
    loss_mask: Any,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> tuple[Any, dict[str, float]]:
    """The importance ratio of the trained model's log-probabilities over the sampler's (vLLM's, or
    an inference engine's one or more policy versions behind) on the loss tokens, and what the step
    logs of it: the mean absolute log-probability gap, the mean ratio applied, the masked share."""
    import torch

    ratio = importance_ratio(train_logps, sampling_logps, loss_mask, mode, clip_min, clip_max)
    kept = loss_mask.bool() & ~torch.isnan(sampling_logps)
    gap = (train_logps - sampling_logps).abs()[kept]
    applied = ratio if ratio.size(-1) == 1 else ratio[loss_mask.bool()]  # per sequence, or per loss token
    return ratio, {
        "sampling/sampling_logp_difference/mean": gap.mean().item() if gap.numel() else 0.0,
        "sampling/importance_sampling_ratio/mean": applied.float().mean().item() if applied.numel() else 1.0,
        "sampling/masked_share": masked_share(ratio, loss_mask),
    }


def weigh_advantages(
    batch: dict[str, Any],
    train_logps: Any,
    loss_mask: Any,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> dict[str, float]:
    """Applies the sampler correction to `batch` in place: its `advantages` (one per row) become one
    per token (or per row, for the sequence modes), each multiplied by the importance ratio of
    `train_logps` (the trained model's, without gradients) over the batch's `sampling_per_token_logps`
    (NaN where unknown: ratio 1); the ratio is kept as `importance_sampling_ratio`. Returns what the
    step logs (`sampler_correction`)."""
    sampling = batch.get("sampling_per_token_logps")
    if sampling is None:
        sampling = batch["sampling_per_token_logps"] = train_logps.new_full(train_logps.shape, math.nan)
    ratio, logged = sampler_correction(train_logps, sampling, loss_mask, mode, clip_min, clip_max)
    batch["importance_sampling_ratio"] = ratio
    batch["advantages"] = batch["advantages"].reshape(-1, 1) * ratio
    return logged
