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
    format_error: float = Field(
        0.0,
        description="Reward of an episode ended by a malformed tool call: an attempt, so no lower than incomplete "
        "(an answer without any tool call), or a policy learns to give up (training refuses a lower one).",
    )

    def reward(self, verdict: Verdict | str) -> float | None:
        """The reward of `verdict`; None for env_error."""
        if verdict == Verdict.env_error:
            return None
        return float(getattr(self, verdict))


#: The verdicts an honest attempt that fails can get; an answer given without any tool call gets
#: `incomplete` (its verifier fails), so none of these may be worth less.
ATTEMPT_VERDICTS = (Verdict.partial, Verdict.agent_error, Verdict.format_error)


def teaches_giving_up(rewards: RewardMap) -> str | None:
    """Why `rewards` would teach a policy that answering without calling anything beats trying (a
    failed attempt's verdict worth less than `incomplete`, what giving up gets), or None when it does
    not. Measured: with format_error -1 below incomplete 0, a policy at 21% success collapsed within
    6 GRPO steps to answering without tools (docs/training.md, 'Rewards')."""
    for verdict in ATTEMPT_VERDICTS:
        if getattr(rewards, verdict) < rewards.incomplete:
            return (
                f"rewards.{verdict} ({getattr(rewards, verdict)}) is below rewards.incomplete ({rewards.incomplete}), "
                f"what an answer without any tool call gets: the policy would learn to give up; "
                f"set rewards.{verdict} to at least {rewards.incomplete}"
            )
    return None
