"""Steps that carry signal: a GRPO group whose rewards are all equal has zero advantage everywhere, so
it teaches nothing, and a step made only of such groups has zero gradient, yet AdamW's momentum would
still move the weights.

- `flat_groups` finds the groups with nothing to teach (fewer than two distinct rewards among the
  rollouts that have one; an env_error has none);
- `refill` draws the dataset rows that replace them (dynamic sampling: `refill_rounds` rounds a step);
- `SkippableStep` lets the trainer skip the optimizer for a step in which no row has an advantage.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any


def flat_groups(rewards: Sequence[float | None], group_size: int) -> list[int]:
    """The indices of the groups (consecutive `group_size` rewards) that cannot teach: fewer than two
    distinct rewards among the rollouts scored (None, an env_error, is not scored)."""
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    flat = []
    for index, start in enumerate(range(0, len(rewards), group_size)):
        scored = {r for r in rewards[start : start + group_size] if r is not None}
        if len(scored) < 2:
            flat.append(index)
    return flat


def has_signal(advantages: Sequence[float]) -> bool:
    """Whether any rollout has a non-zero advantage (else the policy-gradient term is zero everywhere)."""
    return any(a != 0.0 for a in advantages)


def refill(size: int, count: int, rng: random.Random) -> list[int]:
    """`count` indices of a dataset of `size` rows, drawn uniformly (with replacement: a small set
    refills too), for the groups that replace those that could not teach."""
    if size < 1:
        raise ValueError("nothing to refill from: the dataset is empty")
    return [rng.randrange(size) for _ in range(count)]


class SkippableStep:
    """An optimizer's `step` that does nothing while `skip` is set: the weights, the moments and the
    step count stay as they were (an AdamW step over zero gradients would still move the weights by
    its momentum). The trainer sets `skip` for each step from the advantages every process agrees on."""

    def __init__(self, step: Callable[..., Any]):
        self._step = step
        self.skip = False
        self.skipped = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.skip:
            self.skipped += 1
            return None
        return self._step(*args, **kwargs)
