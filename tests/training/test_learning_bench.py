"""bench/learning.py, the learning benchmark: its placebo arm permutes each step's rewards among the
step's scored rollouts, leaving env_error rollouts (no reward) where they are; its verdict says whether
the real rewards beat the placebo by a clear margin."""

from __future__ import annotations

import importlib.util

import pytest
from support.paths import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("learning", REPO / "bench/learning.py")
    assert spec is not None and spec.loader is not None
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    return learning


@pytest.mark.unit
def test_the_learning_benchmarks_placebo_permutes_rewards_and_keeps_env_errors_in_place():
    import torch

    learning = _bench()
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


def _arm(name, held_out_after, success_after=0.5):
    return {
        "arm": name,
        "tasks": 2,
        "held_out_tasks": 2,
        "rollouts_per_task": 32,
        "success_after": success_after,
        "held_out_after": held_out_after,
    }


@pytest.mark.unit
def test_the_learning_benchmark_says_plainly_whether_real_rewards_beat_the_placebo():
    separation = _bench().separation
    assert separation([_arm("real", 0.6), _arm("placebo", 0.2)], "held_out").startswith("held_out: SEPARATED")
    for placebo in (0.55, 0.6, 0.9):  # within two standard errors (64 rollouts each), equal, or above
        assert "DID NOT SEPARATE" in separation([_arm("real", 0.6), _arm("placebo", placebo)], "held_out")
    assert "DID NOT SEPARATE" in separation([_arm("real", 0.0), _arm("placebo", 0.0)], "held_out")
    assert "not compared" in separation([_arm("real", 0.6), _arm("untrained", 0.1)], "held_out")
    # beating a placebo that collapsed is not enough: the untrained arm is a control too
    collapsed = [_arm("real", 0.6), _arm("placebo", 0.0)]
    assert "SEPARATED" in separation(collapsed, "held_out").split(",")[0]
    assert "DID NOT SEPARATE" in separation([*collapsed, _arm("untrained", 0.55)], "held_out")
    # rates of 0 and 1 still leave a margin: one success in 64 against none is no evidence
    assert "DID NOT SEPARATE" in separation([_arm("real", 1 / 64), _arm("placebo", 0.0)], "held_out")
    assert "not compared" in separation([_arm("real", None), _arm("placebo", None)], "held_out")


@pytest.mark.unit
def test_the_learning_benchmark_refuses_counts_that_run_nothing(capsys):
    for argv, said in ((["--steps", "0"], "--steps must be at least 1"), (["--warmup-steps", "-1"], "at least 0")):
        with pytest.raises(SystemExit) as exited:
            _bench().parse_args(argv)
        assert exited.value.code == 2 and said in capsys.readouterr().err
