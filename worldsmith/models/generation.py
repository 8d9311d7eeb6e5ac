"""How each world of a generation run ended: what the `generate` flow returns, reports to its
progress callback and shows as its `generation-environments` artifact (in `model_dump` shape)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: good: published as good; failed: published as failed (or not published, when publishing itself
#: raised); duplicate: not published again, a good version of another env holds identical artifacts.
WorldStatus = Literal["good", "failed", "duplicate"]

#: The outcomes of a world that count as good.
GOOD_OUTCOMES: tuple[WorldStatus, ...] = ("good", "duplicate")


class WorldOutcome(BaseModel):
    """One world of a generation run: its env id and scenario, how it ended, the version it was
    published as, the stage that failed it and why, and the process that built it. Assignments are
    validated (the flow fills it in as the world goes on)."""

    model_config = ConfigDict(validate_assignment=True)

    env_id: str
    scenario: str = Field(description="The scenario's name.")
    status: WorldStatus = "failed"
    ref: str | None = Field(None, description="The published version (`env_id@version`); None when none was.")
    failed_stage: str | None = Field(None, description="The stage out of attempts, `publish`, or None.")
    reason: str | None = Field(None, description="Why it failed (or which version it duplicates).")
    built_by: str = Field(description="`host:pid` of the process that built it.")

    @property
    def good(self) -> bool:
        """Whether the world counts as good (`GOOD_OUTCOMES`)."""
        return self.status in GOOD_OUTCOMES
