"""Correct final answers worded otherwise: what a verifier must still judge complete.

From a task's expected answer, mechanically (no model): the answer reworded, with extra context,
formatted otherwise (thousands separators, currency symbols, dates spelled out, bold), its times on a
12 h or a 24 h clock and its time ranges as people write them ("1:30 to 2:30 PM", "13:30-14:30"), its
small counts in words, its amounts as "5750 USD", in lower case, as a list in another order or bullet
style, and followed by a sentence naming what was left out and why. A task without an expected answer
(an action) gets confirmations worded the same ways. Templates hold no digits, so a variant names no
number the expected answer does not.
"""

from __future__ import annotations

import re
from datetime import date

#: Quantities of four to seven digits, not part of a code (SP-4100), a decimal, a date or an id (#1004);
#: longer runs of digits are left alone (account or phone numbers).
_LONG_INTEGER = re.compile(r"(?<![\w.,/#-])(\d{4,7})(?=(\.\d+)?(?![\w/-]|[.,]\d))")
#: A whole number, grouped by thousands (5,750) or not (5750).
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
#: An amount with a currency symbol in front, the whole number with its decimals.
_SYMBOL_AMOUNT = re.compile(rf"([$€£])\s?({_NUMBER}(?:\.\d+)?)(?![\d,]\d)")
#: An amount with exactly two decimals and no currency symbol (a price), the whole number.
_BARE_PRICE = re.compile(rf"(?<![\w.,$€£-])({_NUMBER}\.\d{{2}})(?![\w.])")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_CODES = {"$": "USD", "€": "EUR", "£": "GBP"}
#: A time on a 24 h clock (13:30), not part of a longer time, an ISO timestamp or a 12 h time.
_TIME_24 = re.compile(r"(?<![\dT:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])(?!\s*[AaPp]\.?[Mm]\b)")
#: A time on a 12 h clock (1:30 PM, 3 pm, 9:00 a.m.).
_TIME_12 = re.compile(r"(?<![\d:])(1[0-2]|0?[1-9])(?::([0-5]\d))?\s*([AaPp])\.?[Mm]\.?(?![\w])")
#: A 24 h time followed by the same time on a 12 h clock in brackets: "15:00 (3:00 PM)".
_BOTH_CLOCKS = re.compile(rf"({_TIME_24.pattern})\s*\(({_TIME_12.pattern})\)")
#: Two 24 h times joined as a range: "13:30-14:30", "13:30 to 14:30", "13:30, until 14:30".
_RANGE_24 = re.compile(rf"{_TIME_24.pattern}\s*,?\s*(?:-|–|to|until|till|through)\s*{_TIME_24.pattern}")
_RANGE_OR_TIME = re.compile(rf"{_RANGE_24.pattern}|{_TIME_24.pattern}")
#: A small whole number standing alone (not part of a date, time, code, amount or id).
_SMALL_NUMBER = re.compile(r"(?<![\w.,:/$€£#-])(\d{1,2})(?![\w%/:-]|[.,]\d)")
_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
_LIST_SEPARATORS = ("\n", "; ", ", ")

EXCLUDED = (
    "I left out the records that do not match your request (other statuses or owners), "
    "because you did not ask about them."
)


def _spelled_date(match: re.Match[str]) -> str:
    try:
        day = date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return match[0]
    return f"{day:%B} {day.day}, {day.year}"


def formatted(answer: str) -> str:
    """`answer` with dates spelled out (March 5, 2026), amounts given a currency code instead of their
    symbol or a symbol when they look like a price (each amount whole, its separators kept: $5,750.00
    becomes 5,750.00 USD), and long integers grouped by thousands."""
    if _SYMBOL_AMOUNT.search(answer):
        text = _SYMBOL_AMOUNT.sub(lambda m: f"{m[2]} {_CODES[m[1]]}", answer)
    else:
        text = _BARE_PRICE.sub(lambda m: f"${m[1]}", answer)
    text = _LONG_INTEGER.sub(lambda m: f"{int(m[1]):,}", text)
    return _ISO_DATE.sub(_spelled_date, text)


def _clock_12(hour: int, minute: int, meridiem: bool = True) -> str:
    suffix = (" AM" if hour < 12 else " PM") if meridiem else ""
    return f"{hour % 12 or 12}:{minute:02d}{suffix}"


def _one_clock(answer: str) -> str:
    """`answer` with "15:00 (3:00 PM)" said once, on the 24 h clock."""
    return _BOTH_CLOCKS.sub(lambda m: m[1], answer)


def clock_24h(answer: str) -> str:
    """`answer` with every time on a 24 h clock (3:00 PM becomes 15:00)."""

    def to_24(m: re.Match[str]) -> str:
        hour = int(m[1]) % 12 + (12 if m[3].lower() == "p" else 0)
        return f"{hour:02d}:{int(m[2] or 0):02d}"

    return _TIME_12.sub(to_24, _one_clock(answer))


def clock_12h(answer: str) -> str:
    """`answer` with every time on a 12 h clock (13:30 becomes 1:30 PM)."""
    return _TIME_24.sub(lambda m: _clock_12(int(m[1]), int(m[2])), _one_clock(answer))


def ranges_12h(answer: str) -> str:
    """`answer` with its time ranges as "1:30 to 2:30 PM" (the meridiem said once when both share it),
    every other time on a 12 h clock."""

    def joined(m: re.Match[str]) -> str:
        if m[1] is None:  # a time alone
            return _clock_12(int(m[5]), int(m[6]))
        (h1, m1), (h2, m2) = (int(m[1]), int(m[2])), (int(m[3]), int(m[4]))
        same_half = (h1 < 12) == (h2 < 12)
        return f"{_clock_12(h1, m1, not same_half)} to {_clock_12(h2, m2)}"

    return _RANGE_OR_TIME.sub(joined, clock_24h(answer))


def ranges_24h(answer: str) -> str:
    """`answer` with its time ranges as "13:30-14:30", every time on a 24 h clock."""
    return _RANGE_24.sub(lambda m: f"{int(m[1]):02d}:{m[2]}-{int(m[3]):02d}:{m[4]}", clock_24h(answer))


def numbers_in_words(answer: str) -> str:
    """`answer` with its small standalone whole numbers (up to twenty) in words: 3 becomes three."""
    return _SMALL_NUMBER.sub(lambda m: _WORDS[int(m[1])] if int(m[1]) < len(_WORDS) else m[0], answer)


def plain_currency(answer: str) -> str:
    """`answer` with amounts written with a currency code, no separators and no zero cents:
    $5,750.00 becomes 5750 USD."""

    def plain(m: re.Match[str]) -> str:
        number = m[2].replace(",", "")
        return f"{number.removesuffix('.00')} {_CODES[m[1]]}"

    return _SYMBOL_AMOUNT.sub(plain, answer)


def list_items(answer: str) -> list[str]:
    """The items of an answer that is a list (lines, or `;`/`,`-separated values with no sentence in them);
    [] when it is not one."""
    for separator in _LIST_SEPARATORS:
        items = [item.strip().lstrip("-*• ").strip() for item in answer.strip().split(separator)]
        items = [item for item in items if item]
        if len(items) >= 2 and all(len(item.split()) <= 8 and not item.endswith(".") for item in items):
            return items
    return []


def answer_variants(answer: str | None) -> list[tuple[str, str]]:
    """(name, text) of final answers that say what `answer` says (None: an action task's confirmation),
    each different from it and from the others."""
    base = (answer or "").strip()
    if not base:
        candidates = [
            ("reworded", "All set: I have carried out your request."),
            (
                "extra_context",
                "I looked the records up with the tools first, then made the change you asked for. "
                "Let me know if you need anything else.",
            ),
            ("excluded", f"Done. {EXCLUDED}"),
        ]
    else:
        candidates = [
            ("reworded", f"The answer is {base}."),
            ("extra_context", f"I checked this with the tools.\n\n{base}\n\nLet me know if you need anything else."),
            ("formatted", formatted(base) if formatted(base) != base else f"**{base}**"),
            ("excluded", f"{base}; {EXCLUDED}"),
            ("clock_12h", clock_12h(base)),
            ("clock_24h", clock_24h(base)),
            ("range_12h", ranges_12h(base)),
            ("range_24h", ranges_24h(base)),
            ("numbers_in_words", numbers_in_words(base)),
            ("plain_currency", plain_currency(base)),
            ("lower_case", base.lower()),
        ]
        items = list_items(base)
        if items:
            candidates += [
                ("list_reordered", ", ".join(items[-1:0:-1]) + f" and {items[0]}"),
                ("list_bulleted", "Here they are:\n" + "\n".join(f"* {item}" for item in reversed(items))),
            ]
    seen = {base}
    variants = []
    for name, text in candidates:
        if text not in seen:
            seen.add(text)
            variants.append((name, text))
    return variants
