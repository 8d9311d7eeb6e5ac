"""Free text in a reference solution's writes (an address, a note, a name: words, not a code, a date or an
enum value), and what verifier mutation testing writes in its place (quality/verifier_mutations.py): the
same text otherwise written, which a verifier must accept, and another entity's text, which it must reject."""

from __future__ import annotations

import re

from worldsmith.jsonvalue import JsonValue
from worldsmith.quality.written_units import FORMATS

_WORD = re.compile(r"[A-Za-z]{2}")


def is_free_text(value: JsonValue) -> bool:
    """Whether `value` is free text: two words or more with letters, not a date, time, email or address of
    the web."""
    if not isinstance(value, str) or len(value.split()) < 2 or not _WORD.search(value):
        return False
    if any(pattern.match(value) for pattern in FORMATS.values()):
        return False
    return "@" not in value and "://" not in value


def text_variants(value: str) -> list[str]:
    """`value` written otherwise, the same text to a reader: in another case, with space around it, and with
    (or without) a closing full stop. (Not with its inner spacing changed: a verifier may fairly look for
    the words it wants, "harbour st", inside the stored text.)"""
    cased = value.upper() if value != value.upper() else value.lower()
    stopped = value[:-1] if value.endswith(".") else value + "."
    return [cased, f" {value} ", stopped]


def quoted(instruction: str, value: str) -> bool:
    """Whether `instruction` quotes `value` ("..." or '...'): text to be written verbatim, its case and
    spacing included."""
    return re.search(rf"[\"'“‘]{re.escape(value)}[\"'”’]", instruction) is not None
