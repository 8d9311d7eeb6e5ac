"""Planted faults of a procedural world's seed data (faults.py registers them in `FAULTS`):

- `seed_breaks_invariant`: the seed holds a row that breaks one of the world's own invariants (as a seed
  that marks a slot open while an appointment books it): an audit log entry dated after the world's
  today, against `audit_log_not_after_today` (procedural/invariants.py). The `seed keeps invariants`
  probe's to find, naming the invariant.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, timedelta

from worldsmith.models.bundle import TaskSpec


def _seed_breaks_invariant(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    seed = sources["seed.sql"]
    today = re.search(r"\('today', '(\d{4}-\d{2}-\d{2})'\)", seed)
    table = re.search(r"VALUES\n    \('import', '(\w+)', 1, ", seed)
    if today is None or table is None:
        raise ValueError("no 'today' setting and audit log import rows to plant a future entry beside")
    later = date.fromisoformat(today.group(1)) + timedelta(days=7)
    sources["seed.sql"] = seed + (
        "\nINSERT INTO audit_log (action, table_name, row_id, logged_on) VALUES "
        f"('import', '{table.group(1)}', 1, '{later.isoformat()}');\n"
    )
    return frozenset({"audit_log_not_after_today"})


#: The seed's fault classes, by name (faults.PLANTERS holds them with the rest).
SEED_PLANTERS: dict[str, Callable[[dict[str, str], list[TaskSpec]], frozenset[str]]] = {
    "seed_breaks_invariant": _seed_breaks_invariant,
}
