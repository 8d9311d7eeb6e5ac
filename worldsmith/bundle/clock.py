"""A generated world's "now": an instant fixed by its scenario and seed, so that a rerun writes the same
world, recorded as `Manifest.clock` and answered by the sandbox's clock reads."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from worldsmith.models.bundle import Scenario

#: The span a generated world's "now" is drawn from (a weekday morning to afternoon, UTC).
CLOCK_EPOCH = datetime(2024, 1, 1, 9, 0, 0)
CLOCK_SPAN_DAYS = 730


def world_clock(scenario: Scenario, seed: int) -> str:
    """The world's "now" (ISO, UTC, to the second): fixed by scenario and seed, so a rerun writes the
    same world; between 2024-01-01 and 2025-12-31, on a weekday between 09:00 and 17:00."""
    digest = int(hashlib.sha256(f"clock|{scenario.name}|{seed}".encode()).hexdigest(), 16)
    day = CLOCK_EPOCH + timedelta(days=digest % CLOCK_SPAN_DAYS)
    day += timedelta(days=(7 - day.weekday()) % 7 if day.weekday() >= 5 else 0)
    instant = day + timedelta(seconds=(digest >> 16) % (8 * 3600))
    return instant.isoformat()
