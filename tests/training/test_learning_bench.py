"""bench/learning.py, the learning benchmark: its placebo arm permutes each step's rewards among the
step's scored rollouts, leaving env_error rollouts (no reward) where they are."""

from __future__ import annotations

import importlib.util

import pytest
from support.paths import REPO


@pytest.mark.unit
def test_the_learning_benchmarks_placebo_permutes_rewards_and_keeps_env_errors_in_place():
    import torch

    spec = importlib.util.spec_from_file_location("learning", REPO / "bench/learning.py")
    assert spec is not None and spec.loader is not None
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    rewards = torch.tensor([[1.0], [0.0], [float("nan")], [0.5], [0.0], [1.0], [0.25], [0.0]])
    shuffled = [learning.permuted_rewards(rewards, seed)[:, 0] for seed in range(4)]
    for permuted in shuffled:
        assert torch.isnan(permuted[2]) and sorted(permuted[~torch.isnan(permuted)].tolist()) == sorted(
            rewards[~torch.isnan(rewards)].tolist()
        )
    assert any(not torch.equal(p.nan_to_num(-1), rewards[:, 0].nan_to_num(-1)) for p in shuffled)
    assert torch.equal(
        learning.permuted_rewards(rewards, 7).nan_to_num(-1), learning.permuted_rewards(rewards, 7).nan_to_num(-1)
    )
