"""The Zocdoc world a strong model wrote (examples/realmodel/zocdoc), as a bundle, with the slot
invariants its schema implies and, for a test, its sources edited (support/realmodel.py builds it)."""

from __future__ import annotations

from support.realmodel import real_sources, real_world
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.invariants import INVARIANTS_FILE, invariants_json
from worldsmith.models.bundle import Invariant

#: What a booked or open slot means in Zocdoc: the rules the seed and every booking tool must keep.
SLOT_INVARIANTS = [
    Invariant(
        id="open_slot_has_no_active_appointment",
        statement="a slot marked open has no appointment that is not cancelled",
        sql="SELECT s.id AS slot_id, a.confirmation_code FROM availability_slots s "
        "JOIN appointments a ON a.slot_id = s.id WHERE s.status = 'open' AND a.status <> 'cancelled'",
    ),
    Invariant(
        id="booked_slot_has_one_appointment",
        statement="a booked slot has exactly one appointment that is not cancelled",
        sql="SELECT s.id AS slot_id FROM availability_slots s WHERE s.status = 'booked' AND "
        "(SELECT COUNT(*) FROM appointments a WHERE a.slot_id = s.id AND a.status <> 'cancelled') <> 1",
    ),
]


def zocdoc_sources() -> dict[str, str]:
    """The world's five source files, as written."""
    return real_sources("zocdoc")


def zocdoc_bundle(sources: dict[str, str] | None = None, invariants: list[Invariant] | None = None) -> Bundle:
    """The world built from `sources` (default: as written) with `invariants` (default: SLOT_INVARIANTS)."""
    files: dict[str, str | bytes] = dict(sources or zocdoc_sources())
    files[INVARIANTS_FILE] = invariants_json(SLOT_INVARIANTS if invariants is None else invariants)
    return real_world("zocdoc", files)
