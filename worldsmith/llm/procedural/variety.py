"""Structural variety within a domain: which optional tables and columns a world has, what its tables and
columns are called, which tools it offers and how many, and so which tasks it can hold.

`vary(domain, rng)` returns a new domain drawn from `rng`; the procedural backend seeds `rng` from the
scenario's name and the seed, so two scenarios of one domain (or one scenario on two nights) get different
worlds and a rerun gets the same one. Every draw keeps a world valid: a kept table keeps its parents, every
entity with statuses keeps a transition, a label is never editable, and names never collide.
"""

from __future__ import annotations

import random
from dataclasses import replace

from worldsmith.llm.procedural.blocks import EXTRA_TOOLS, MAX_TOOLS, TABLE_ALIASES, Domain, Entity, F, Field
from worldsmith.llm.procedural.names import ident

#: Other names of common columns (a label renamed stays the label).
COLUMN_SYNONYMS: dict[str, tuple[str, ...]] = {
    "full_name": ("name", "display_name"),
    "email": ("email_address", "contact_email"),
    "phone": ("phone_number",),
    "city": ("town",),
    "description": ("details", "summary"),
    "body": ("content", "text"),
    "reason": ("explanation",),
    "price_cents": ("unit_price_cents", "list_price_cents"),
    "amount_cents": ("value_cents",),
    "starts_on": ("begins_on", "start_date"),
    "scheduled_on": ("planned_for", "booked_for"),
    "title": ("headline",),
}

#: Columns any table may gain.
OPTIONAL_FIELDS: tuple[Field, ...] = (
    F("notes", "sentence", editable=True),
    F("created_on", "date"),
    F("reference_code", "word"),
    F("priority_level", "enum", "low", "normal", "high", editable=True),
    F("external_url", "url"),
    F("contact_phone", "phone", editable=True),
)

#: Child tables any table may gain: (table suffix, singular suffix, fields).
OPTIONAL_CHILDREN: tuple[tuple[str, str, tuple[Field, ...]], ...] = (
    ("notes", "note", (F("body", "sentence", editable=True), F("written_on", "date"))),
    ("attachments", "attachment", (F("file_name", "word"), F("size_kb", "int", low=1, high=5000))),
    ("tags", "tag", (F("tag", "word"), F("weight", "int", low=1, high=10, editable=True))),
)

MIN_ENTITIES = 4  # tables of a variant besides world_settings and audit_log
MIN_TOOL_BUDGET = 24


def _parents(entity: Entity) -> set[str]:
    return {p for p in (entity.parent, entity.extra_parent) if p}


def _drop_tables(entities: list[Entity], rng: random.Random) -> list[Entity]:
    """Without up to two tables no other table points at, keeping at least two with transitions."""
    kept = list(entities)
    for _ in range(rng.choice((0, 1, 1, 2))):
        referenced = {p for e in kept for p in _parents(e)}
        leaves = [e for e in kept if e.table not in referenced]
        moving = [e for e in kept if e.transitions]
        droppable = [e for e in leaves if not (e.transitions and len(moving) <= 2)]
        if len(kept) <= MIN_ENTITIES - 1 or not droppable:
            break
        kept.remove(rng.choice(droppable))
    return kept


def _rename_tables(entities: list[Entity], rng: random.Random) -> list[Entity]:
    """Some tables under an alias (foreign keys follow), never onto a name the world already uses."""
    names = {e.table for e in entities}
    renamed: dict[str, tuple[str, str]] = {}
    for entity in entities:
        aliases = [a for a in TABLE_ALIASES.get(entity.table, ()) if a[0] not in names]
        if aliases and rng.random() < 0.4:
            table, singular = rng.choice(aliases)
            renamed[entity.table] = (table, singular)
            names.add(table)
    out = []
    for entity in entities:
        table, singular = renamed.get(entity.table, (entity.table, entity.singular))
        parent = renamed[entity.parent][0] if entity.parent in renamed else entity.parent
        extra = renamed[entity.extra_parent][0] if entity.extra_parent in renamed else entity.extra_parent
        out.append(replace(entity, table=table, singular=singular, parent=parent, extra_parent=extra))
    return out


def _vary_fields(entity: Entity, rng: random.Random) -> Entity:
    """Some columns dropped, renamed or added, some editability and creatability redrawn, some
    transitions dropped (each entity keeps one); a label is never editable."""
    fields = [f for f in entity.fields if f.name == entity.label or rng.random() >= 0.25] or [entity.fields[0]]
    extra = rng.choice(OPTIONAL_FIELDS)
    if rng.random() < 0.35 and extra.name not in {f.name for f in fields}:
        fields.append(extra)
    label = entity.label
    taken = {f.name for f in fields} | {"id", "status"}
    varied = []
    for f in fields:
        synonyms = [s for s in COLUMN_SYNONYMS.get(f.name, ()) if s not in taken]
        if synonyms and rng.random() < 0.4:
            name = rng.choice(synonyms)
            taken.add(name)
            label = name if f.name == entity.label else label
            f = replace(f, name=name)
        editable = f.editable if rng.random() < 0.75 else not f.editable
        varied.append(replace(f, editable=editable and f.name != label))
    transitions = [t for t in entity.transitions if rng.random() >= 0.2] or list(entity.transitions[:1])
    creatable = entity.creatable if rng.random() < 0.75 else not entity.creatable
    return replace(entity, fields=tuple(varied), label=label, creatable=creatable, transitions=tuple(transitions))


def _add_children(entities: list[Entity], rng: random.Random) -> list[Entity]:
    """Optional child tables (notes, attachments, tags) of random tables, at least up to MIN_ENTITIES tables."""
    out = list(entities)
    wanted = len(out) + max(MIN_ENTITIES - len(out), rng.choice((0, 0, 1, 2)))
    candidates = [(parent, child) for parent in entities for child in OPTIONAL_CHILDREN]
    rng.shuffle(candidates)
    for parent, (suffix, singular, fields) in candidates[: wanted - len(out)]:
        table = f"{ident(parent.singular)}_{suffix}"
        creatable = rng.random() < 0.7
        out.append(Entity(table, f"{parent.singular} {singular}", fields, parent=parent.table, creatable=creatable))
    return out


def vary(domain: Domain, rng: random.Random) -> Domain:
    """A variant of `domain` drawn from `rng`: its tables, columns, names, tools and tool budget."""
    entities = _drop_tables(list(domain.entities), rng)
    entities = [_vary_fields(e, rng) for e in _rename_tables(entities, rng)]
    entities = _add_children(entities, rng)
    extra_tools = frozenset(t for t in EXTRA_TOOLS if rng.random() < 0.5)
    return replace(
        domain, entities=tuple(entities), extra_tools=extra_tools, max_tools=rng.randint(MIN_TOOL_BUDGET, MAX_TOOLS)
    )
