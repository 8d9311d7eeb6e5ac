"""The reward map: what each verdict (worldsmith/models/verdict.py) is worth in training and scores."""

from __future__ import annotations

from pydantic import BaseModel

from worldsmith.models.verdict import Verdict


class RewardMap(BaseModel):
    """Reward of each `Verdict`; env_error episodes get no reward (excluded from scores and losses)."""

    complete: float = 1.0
    partial: float = 0.1
    incomplete: float = 0.0
    agent_error: float = 0.0
    format_error: float = -1.0

    def reward(self, verdict: Verdict | str) -> float | None:
        if verdict == Verdict.env_error:
            return None
        return float(getattr(self, verdict))
