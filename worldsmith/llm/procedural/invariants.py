"""The invariants a procedural world states with its schema (`SchemaSpec.invariants`, bundle/invariants.py):
rules its seed and every tool keep by construction, which its schema does not enforce. Every world has an
audit log written only by its tools (`_log`) and the seed, a single 'today' setting, and entity tables."""

from __future__ import annotations

from worldsmith.llm.procedural.blocks import Domain
from worldsmith.models.bundle import Invariant


def world_invariants(domain: Domain) -> list[Invariant]:
    """The invariants of a world of `domain` (true of its seed and of every state its tools leave);
    its table names are identifiers (blocks.py), quoted as they are."""
    tables = ", ".join(f"'{t}'" for t in ("world_settings", *(e.table for e in domain.entities)))
    return [
        Invariant(
            id="one_today",
            statement="the world has exactly one 'today' setting",
            sql="SELECT COUNT(*) AS settings FROM world_settings WHERE key = 'today' HAVING COUNT(*) <> 1",
        ),
        Invariant(
            id="audit_log_names_world_tables",
            statement="every audit log entry names a table of this world",
            sql=f"SELECT id, table_name FROM audit_log WHERE table_name NOT IN ({tables})",
        ),
        Invariant(
            id="audit_log_not_after_today",
            statement="no audit log entry is dated after the world's today",
            sql="SELECT id, logged_on FROM audit_log "
            "WHERE logged_on > (SELECT value FROM world_settings WHERE key = 'today')",
        ),
    ]
