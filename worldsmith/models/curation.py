"""What the `curate` flow returns: the environment set it made (or found from the same query), with its
members; `worldsmith curate --json` prints it as `model_dump(mode="json")`."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CuratedMember(BaseModel):
    """One member of a curated set: its version, the split it is in, and its counts of tasks and tools."""

    ref: str = Field(description="The member version (`env_id@version`).")
    split: str = Field(description="train or validation.")
    tasks: int
    tools: int


class CurationResult(BaseModel):
    """The set a curation run made, or found made from the same query (`created` False), and its members."""

    name: str
    created: bool
    members: list[CuratedMember]

    def split_counts(self) -> dict[str, int]:
        """Members per split: {"train": n, "validation": m}."""
        return {s: sum(1 for m in self.members if m.split == s) for s in ("train", "validation")}

    @property
    def tasks(self) -> int:
        """The members' tasks, all together."""
        return sum(m.tasks for m in self.members)
