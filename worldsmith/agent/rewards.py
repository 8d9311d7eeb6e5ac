"""Verdicts and the reward map (design.md section 6)."""

from __future__ import annotations

from pydantic import BaseModel

VERDICTS = ("complete", "partial", "incomplete", "agent_error", "env_error", "format_error")


class RewardMap(BaseModel):
    """Reward of each verdict; env_error episodes get no reward (excluded from scores and losses)."""

    complete: float = 1.0
    partial: float = 0.1
    incomplete: float = 0.0
    agent_error: float = 0.0
    format_error: float = -1.0

    def reward(self, verdict: str) -> float | None:
        if verdict == "env_error":
            return None
        return float(getattr(self, verdict))
