"""JSON text checked without decoding it: what the gateway needs to pass a tool's value on as it came.

A tool's value reaches the gateway as JSON text (at most `MAX_RESULT_BYTES`), which the sandbox's
reply can forge. Decoding a few MiB of it makes Python objects many times its size (a row of five
fields: a dict, five keys, five values), so the gateway checks the text instead and splices it into
its answer: `check` says whether `data` is exactly one JSON value, in ASCII (as the sandbox writes
it), nested at most `MAX_NESTING` containers deep (as `bundle.jsonvalues.check_nesting` counts), and
what kind of value it is. Python's `json` reads the same text (NaN and Infinity included, as it
writes them); text it would refuse is refused here.

How: regular expressions (C speed) match whole values up to `_LEVELS` containers deep, and runs of
them inside a container, so a list of rows or an object of lists is one match; only containers
deeper than that are walked here, one at a time. The expressions use possessive quantifiers and
atomic groups: nothing backtracks, so a match is linear in the text.
"""

from __future__ import annotations

import re
from typing import Literal

from worldsmith.bundle.jsonvalues import MAX_NESTING, TooDeep
from worldsmith.errors import WorldsmithError

Kind = Literal["object", "array", "string", "scalar"]


class NotJson(WorldsmithError, ValueError):
    """Text that is not exactly one JSON value in ASCII (the message says where it stops being one)."""


_WS = rb"[ \t\n\r]*+"
_STRING = rb'"(?:[^"\\\x00-\x1f\x80-\xff]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+"'
_SCALAR = (
    rb"(?>"
    + _STRING
    + rb"|-?+(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][+-]?+[0-9]++)?+(?![0-9])|true|false|null|NaN|-?Infinity)"
)
#: Containers nested up to this deep are matched whole by one expression (deeper ones are walked).
_LEVELS = 3


def _value(levels: int) -> bytes:
    """An expression matching one value nested at most `levels` containers deep."""
    if levels == 0:
        return _SCALAR
    inner = _value(levels - 1)
    member = _STRING + _WS + rb":" + _WS + inner
    array = rb"\[" + _WS + rb"(?:\]|" + inner + _WS + rb"(?:," + _WS + inner + _WS + rb")*+\])"
    obj = rb"\{" + _WS + rb"(?:\}|" + member + _WS + rb"(?:," + _WS + member + _WS + rb")*+\})"
    return rb"(?>" + _SCALAR + rb"|" + array + rb"|" + obj + rb")"


def _run(member: bytes) -> re.Pattern[bytes]:
    """Members of a container, one or more, separated by commas (the whitespace after each taken too)."""
    return re.compile(member + _WS + rb"(?:," + _WS + member + _WS + rb")*+")


#: By how deep the values they take may nest (0 to `_LEVELS`): one value; a run of array elements; a
#: run of object members (key, colon, value).
_VALUE = [re.compile(_value(n) + _WS) for n in range(_LEVELS + 1)]
_ELEMENTS = [_run(_value(n)) for n in range(_LEVELS + 1)]
_MEMBERS = [_run(_STRING + _WS + rb":" + _WS + _value(n)) for n in range(_LEVELS + 1)]
_KEY = re.compile(_STRING + _WS + rb":" + _WS)
_SPACE = re.compile(_WS)


def _after_space(data: bytes, pos: int = 0) -> int:
    """Where the JSON whitespace at `pos` of `data` ends (`pos` itself when there is none)."""
    match = _SPACE.match(data, pos)
    return match.end() if match is not None else pos  # `_WS` matches anywhere: always a match


_KINDS: dict[int, Kind] = {ord("{"): "object", ord("["): "array", ord('"'): "string"}


def check(data: bytes, max_nesting: int = MAX_NESTING) -> Kind:
    """The kind of the one JSON value `data` holds (whitespace around it allowed); NotJson when it is
    not one, or not ASCII; TooDeep ("result nested deeper than N levels") past `max_nesting` containers."""
    if not data.isascii():
        raise NotJson("the value is not ASCII text")
    start = _after_space(data)
    if start == len(data):
        raise NotJson("the value is empty")
    _Walk(data, max_nesting).value(start)
    return _KINDS.get(data[start], "scalar")


class _Walk:
    """A walk through `data`: whole values and runs of members matched at once where they nest at
    most `_LEVELS` deep (less near `max_nesting`), containers deeper than that entered one by one."""

    def __init__(self, data: bytes, max_nesting: int):
        self.data = data
        self.max_nesting = max_nesting
        self.open: list[int] = []  # the closing byte of each container entered

    def value(self, pos: int) -> None:
        """Check that the rest of `data` from `pos` is exactly one value (and whitespace)."""
        data = self.data
        pos = self._one(pos)
        while self.open:
            closing = self.open[-1]
            if pos < len(data) and data[pos] == closing:
                self.open.pop()
                pos = _after_space(data, pos + 1)
            elif pos < len(data) and data[pos] == ord(","):
                pos = _after_space(data, pos + 1)
                pos = self._members(pos, closing)
            else:
                raise self._broken(pos)
        if pos != len(data):
            raise self._broken(pos)

    def _levels(self) -> int:
        """How deep a value matched whole may nest here."""
        room = self.max_nesting - len(self.open)
        return min(room, _LEVELS)

    def _one(self, pos: int) -> int:
        """Past one value at `pos` (and its whitespace): matched whole, or its container entered."""
        found = _VALUE[self._levels()].match(self.data, pos)
        if found is not None:
            return found.end()
        return self._enter(pos)

    def _members(self, pos: int, closing: int) -> int:
        """Past one or more members of the container closed by `closing`, from `pos` (after `[`, `{` or `,`)."""
        if closing == ord("]"):
            found = _ELEMENTS[self._levels()].match(self.data, pos)
            return found.end() if found is not None else self._enter(pos)
        found = _MEMBERS[self._levels()].match(self.data, pos)
        if found is not None:
            return found.end()
        key = _KEY.match(self.data, pos)
        if key is None:
            raise self._broken(pos)
        return self._enter(key.end())

    def _enter(self, pos: int) -> int:
        """Past the opening of the container at `pos` and its first members (a value too deep to match whole)."""
        data = self.data
        if pos >= len(data) or data[pos] not in b"[{":
            raise self._broken(pos)
        if len(self.open) >= self.max_nesting:
            raise TooDeep(f"result nested deeper than {self.max_nesting} levels")
        closing = ord("]") if data[pos] == ord("[") else ord("}")
        self.open.append(closing)
        pos = _after_space(data, pos + 1)
        if pos < len(data) and data[pos] == closing:  # empty (it did not match whole: it is too deep to)
            self.open.pop()
            return _after_space(data, pos + 1)
        return self._members(pos, closing)

    def _broken(self, pos: int) -> NotJson:
        return NotJson(f"the value is not JSON: it breaks at byte {pos}")
