"""What an environment set is made from: the query over the catalog's versions (worldsmith/storage/sets.py
builds the set; the `curate` flow and `worldsmith sets create` / `curate` take it as their options).
Pydantic only, so the command line builds its options without loading the catalog."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

#: What the catalog records of a version: it passed its checks, or it did not.
VersionStatus = Literal["good", "failed"]
#: Which of a set's splits a run reads (training rows, an evaluation).
SplitName = Literal["all", "train", "validation"]


class SetQuery(BaseModel):
    """Which versions a set takes. Only versions whose status is `status` qualify; by default the
    latest such version of each env."""

    status: VersionStatus = Field("good", description="Only versions with this status qualify.")
    categories: list[str] = Field(default_factory=list, description="Keep envs with any of these categories.")
    env_ids: list[str] = Field(default_factory=list, description="Keep only these envs.")
    min_tasks: int = Field(0, description="Keep envs with at least this many tasks.")
    min_tools: int = Field(0, description="Keep envs with at least this many tools.")
    require_passed: list[str] = Field(default_factory=list, description="Quality checks that must have passed.")
    count: int | None = Field(None, ge=1, description="Sample this many envs (deterministic for the seed).")
    seed: int = Field(0, description="Seed of the sampling and of the train/validation split.")
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of the chosen envs in the validation split (split by environment)."
    )
    latest_only: bool = Field(True, description="Only the latest qualifying version of each env; off: every one.")
