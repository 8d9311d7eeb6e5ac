"""Documented units and formats of written values (part of `Probe.WRITE_EFFECTS`, quality/write_effects.py):
an argument named for a column must land in it in the unit and format it was given in.

- `ProbeFailure.WRITE_UNIT_CHANGED`: a number stored scaled by a unit factor (x100: dollars taken for
  cents; x60: minutes stored as seconds; x2.2: kilograms stored as pounds), or divided by one;
- `ProbeFailure.WRITE_FORMAT_CHANGED`: a date, time or timestamp given in the format every seed row of the
  column holds (and the parameter documents), stored in another (`06/17/2027` for `2027-06-17`).

Only an exact factor or a broken shared format is judged: a stored value merely other than the argument is
write_effects's own rule."""

from __future__ import annotations

import math
import re
from typing import Any

from worldsmith.quality.probe_results import ProbeFailure
from worldsmith.quality.probes import excerpt

#: The factors one unit of a quantity is another by (cents, minutes, seconds, milli-, pounds, miles, inches, days).
UNIT_FACTORS = (10.0, 12.0, 24.0, 60.0, 100.0, 1000.0, 3600.0, 2.20462, 1.60934)
#: The formats a column's seed values may share, by the name a description gives them.
FORMATS = {
    "YYYY-MM-DD": re.compile(r"^\d{4}-\d{2}-\d{2}$"),
    "HH:MM": re.compile(r"^\d{2}:\d{2}(:\d{2})?$"),
    "YYYY-MM-DDTHH:MM": re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$"),
}
_TOLERANCE = 0.005


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def unit_factor(given: Any, stored: Any) -> float | None:
    """The unit factor `stored` is `given` scaled by (below 1: divided), None when it is none of them."""
    a, b = _number(given), _number(stored)
    if a is None or b is None or a == 0 or b == 0 or a == b:
        return None
    ratio = b / a
    for factor in UNIT_FACTORS:
        for candidate in (factor, 1 / factor):
            if math.isclose(ratio, candidate, rel_tol=_TOLERANCE):
                return candidate
    return None


def shared_format(values: list[Any]) -> str | None:
    """The format every one of `values` (two at least, None aside) has, by name; None when they share none."""
    held = [v for v in values if v is not None]
    if len(held) < 2 or not all(isinstance(v, str) for v in held):
        return None
    return next((name for name, pattern in FORMATS.items() if all(pattern.match(v) for v in held)), None)


def unit_or_format_changed(
    table: str, parameter: str, given: Any, stored: Any, seed_values: list[Any], documented: str
) -> tuple[ProbeFailure, str] | None:
    """What a write did to the unit or format of `given` (argument `parameter`, documented as `documented`)
    stored as `stored` in `table`.`parameter`, whose seed values are `seed_values`; None when it kept both."""
    said = f" (documented: {documented!r})" if documented else ""
    factor = unit_factor(given, stored)
    if factor is not None:
        scaled = f"x{factor:g}" if factor > 1 else f"/{1 / factor:g}"
        return (
            ProbeFailure.WRITE_UNIT_CHANGED,
            f"{parameter}={given!r}{said} was stored in {table}.{parameter} as {excerpt(stored)} ({scaled}): "
            "the value changed its unit on the way",
        )
    shared = shared_format(seed_values)
    if shared is None or not isinstance(given, str) or not isinstance(stored, str) or given == stored:
        return None
    pattern = FORMATS[shared]
    if pattern.match(given) and not pattern.match(stored):
        return (
            ProbeFailure.WRITE_FORMAT_CHANGED,
            f"{parameter}={given!r}{said} was stored in {table}.{parameter} as {excerpt(stored)}, though every "
            f"seed row of that column holds {shared}: the value changed its format on the way",
        )
    return None
