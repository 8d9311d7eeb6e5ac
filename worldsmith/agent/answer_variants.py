"""Correct final answers worded otherwise: what a verifier must still judge complete.

From a task's expected answer, mechanically (no model): the answer reworded, with extra context,
formatted otherwise (thousands separators, currency symbols, dates spelled out, bold), as a list in
another order or bullet style, and followed by a sentence naming what was left out and why. A task
without an expected answer (an action) gets confirmations worded the same ways. Templates hold no
digits, so a variant names no number the expected answer does not.
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
