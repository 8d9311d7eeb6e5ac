"""The conventions of a procedural world, as its schema step states them (models/bundle.Conventions):
the formats its columns hold, money in integer cents, and each entity's status rules."""

from __future__ import annotations

from worldsmith.llm.procedural.drafts import WorldDraft
from worldsmith.models.bundle import Conventions


def conventions_of(world: WorldDraft) -> Conventions:
    """What every later stage of `world` must agree on, read off its building blocks."""
    entities = world.domain.entities
    money = sorted({f"{e.table}.{f.name}" for e in entities for f in e.fields if f.kind == "money"})
    labels = sorted({f"{e.table}.{e.label}" for e in entities if e.label})
    rules = [
        f"{t.phrase} a {e.singular}: only when its status is {' or '.join(repr(s) for s in t.sources)}; "
        f"it becomes {t.target!r} (any other status is refused with a ToolError)"
        for e in entities
        for t in e.transitions
    ]
    return Conventions(
        codes="records are found by their integer id or their unique label column"
        + (f" ({', '.join(labels)})" if labels else "")
        + "; a new record's id is the next integer id of its table",
        timestamps="dates as YYYY-MM-DD text; what happens now is dated the world's current date (world_settings.today)",
        units="money as integer cents" + (f" ({', '.join(money)})" if money else "") + "; booleans as 0 or 1",
        rules=rules,
    )
