"""How a procedural world spells names: identifiers, the words of a column name, and the
foreign-key columns of an entity (its parent's singular name plus `_id`)."""

from __future__ import annotations

import re

from worldsmith.llm.procedural.blocks import DOMAINS, TABLE_ALIASES, Entity


def _singulars() -> dict[str, str]:
    """The singular of every table name a world may use (its domain's names and their aliases)."""
    pairs = [(e.table, e.singular) for d in DOMAINS for e in d.entities]
    pairs += [alias for aliases in TABLE_ALIASES.values() for alias in aliases]
    singulars: dict[str, str] = {}
    for table, singular in pairs:
        if singulars.setdefault(table, singular) != singular:
            raise ValueError(f"table {table!r} has two singulars: {singulars[table]!r} and {singular!r}")
    return singulars


SINGULARS = _singulars()


def ident(text: str) -> str:
    """`text` as a lower-case Python and SQL identifier."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def words(name: str) -> str:
    """A column name as words a user reads (`price_cents` -> `price`)."""
    return name.replace("_cents", "").replace("_", " ")


def singular_of(table: str) -> str:
    """The singular of a table name, as every domain and alias spells it (the same across domains)."""
    return SINGULARS[table]


def foreign_keys(entity: Entity) -> list[tuple[str, str]]:
    """(column, parent table) of each foreign key: the parent's singular name plus `_id`."""
    return [(f"{ident(singular_of(parent))}_id", parent) for parent in (entity.parent, entity.extra_parent) if parent]
