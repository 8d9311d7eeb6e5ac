"""Steps that carry signal (training/signal.py): groups that cannot teach, refills, a skippable step."""

from __future__ import annotations

import random

import pytest

from worldsmith.training.config import GPU_ROWS_PER_STEP, TrainingConfig
from worldsmith.training.signal import SkippableStep, flat_groups, has_signal, refill

pytestmark = pytest.mark.unit


def test_dynamic_sampling_finds_groups_of_equal_rewards():
    rewards = [1.0, 0.0, 0.0, 0.0, None, 0.0, 1.0, 1.0, None, None, -1.0, 0.0]
    # groups of 3: mixed; equal around an env_error; equal with an env_error; mixed with an env_error
    assert flat_groups(rewards, 3) == [1, 2]
    assert flat_groups([None] * 4, 2) == [0, 1]  # nothing scored teaches nothing
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        flat_groups([1.0] * 6, 4)


def test_dynamic_sampling_refills_from_the_rows_reproducibly():
    drawn = refill(3, 5, random.Random("seed"))
    assert len(drawn) == 5 and set(drawn) <= {0, 1, 2} and drawn == refill(3, 5, random.Random("seed"))
    with pytest.raises(ValueError, match="dataset is empty"):
        refill(0, 1, random.Random(0))


def test_skip_step_calls_nothing_while_set():
    calls: list[tuple] = []
    step = SkippableStep(lambda *args: calls.append(args) or "stepped")
    assert step(1) == "stepped"
    step.skip = True
    assert step(2) is None and step.skipped == 1
    step.skip = False
    assert step(3) == "stepped" and calls == [(1,), (3,)]
    assert has_signal([0.0, 0.0, 0.5]) and not has_signal([0.0, -0.0]) and not has_signal([])


def test_the_gpu_profile_takes_several_groups_per_step_unless_told():
    assert TrainingConfig(model="m", set_name="s", profile="gpu").rows_per_step == GPU_ROWS_PER_STEP
    assert TrainingConfig(model="m", set_name="s", profile="gpu", rows_per_step=2).rows_per_step == 2
    assert TrainingConfig(model="m", set_name="s").rows_per_step == 1
