"""How a procedural world spells names: identifiers, the words of a column name, and the
foreign-key columns of an entity (its parent's singular name plus `_id`)."""

from __future__ import annotations

import re

from worldsmith.llm.procedural.blocks import DOMAINS, Entity

SINGULARS = {e.table: e.singular for d in DOMAINS for e in d.entities}


def ident(text: str) -> str:
    """`text` as a lower-case Python and SQL identifier."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def words(name: str) -> str:
    """A column name as words a user reads (`price_cents` -> `price`)."""
    return name.replace("_cents", "").replace("_", " ")


def singular_of(table: str) -> str:
    """The singular of a table name, as every domain spells it (the same across domains)."""
    return SINGULARS[table]


def foreign_keys(entity: Entity) -> list[tuple[str, str]]:
    """(column, parent table) of each foreign key: the parent's singular name plus `_id`."""
    return [(f"{ident(singular_of(parent))}_id", parent) for parent in (entity.parent, entity.extra_parent) if parent]
