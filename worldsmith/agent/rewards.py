"""The reward map: what each verdict (worldsmith/models/verdict.py) is worth in training and scores."""

from __future__ import annotations

from pydantic import BaseModel, Field

from worldsmith.models.verdict import Verdict


class RewardMap(BaseModel):
    """Reward of each `Verdict`; env_error episodes get no reward (excluded from scores and losses)."""

    complete: float = Field(1.0, description="Reward of a complete episode (the task's verifier passed).")
    partial: float = Field(0.1, description="Reward of a partial episode.")
    incomplete: float = Field(0.0, description="Reward of an incomplete episode.")
    agent_error: float = Field(0.0, description="Reward of an episode the agent failed (or a judge overruled).")
    format_error: float = Field(-1.0, description="Reward of an episode ended by a malformed tool call.")

    def reward(self, verdict: Verdict | str) -> float | None:
        if verdict == Verdict.env_error:
            return None
        return float(getattr(self, verdict))
