"""JSON text checked without decoding it (serving/jsontext.py): the same verdict as Python's `json`
and `check_nesting`, on honest values and on mangled ones, without making objects of the text."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from worldsmith.bundle.jsonvalues import MAX_NESTING, TooDeep, check_nesting
from worldsmith.serving.jsontext import NotJson, check

pytestmark = pytest.mark.unit


def reference(data: bytes, limit: int) -> str:
    """What `check` must say of `data`: its kind, "not" (not one JSON value in ASCII) or "deep"."""
    try:
        value = json.loads(data) if data.isascii() else None
    except (ValueError, RecursionError):
        return "not"
    if not data.isascii():
        return "not"
    try:
        check_nesting(value, limit)
    except TooDeep:
        return "deep"
    return {b"{": "object", b"[": "array", b'"': "string"}.get(data.strip(b" \t\n\r")[:1], "scalar")


def checked(data: bytes, limit: int) -> str:
    try:
        return check(data, limit)
    except TooDeep:
        return "deep"
    except NotJson:
        return "not"


def random_value(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if depth > 6 or roll < 0.4:
        return rng.choice([0, -1.5e3, 12, 'a"b\\c\n', "", True, False, None, "\u1234\U0001f600", float("inf"), 10**20])
    if roll < 0.7:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["k", "a b", "", '"q']) + str(i): random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def mangled(rng: random.Random, data: bytes) -> bytes:
    """`data` with a byte or two deleted, inserted or replaced by bytes that matter to JSON."""
    alphabet = b' \t\n\r[]{},:"\\0123456789-+.eEtrufalsnNIy\x01\x7f\xc3'
    out = bytearray(data)
    for _ in range(rng.randrange(1, 3)):
        at = rng.randrange(len(out) + 1)
        edit = rng.randrange(3)
        if edit == 0 and out:
            del out[min(at, len(out) - 1)]
        elif edit == 1:
            out.insert(at, rng.choice(alphabet))
        elif out:
            out[min(at, len(out) - 1)] = rng.choice(alphabet)
    return bytes(out)


def test_check_agrees_with_json_and_check_nesting_on_honest_and_mangled_values():
    rng = random.Random(7)
    disagreements = []
    for _ in range(4000):
        data = json.dumps(random_value(rng), separators=rng.choice([(",", ":"), (", ", ": ")])).encode()
        if rng.random() < 0.5:
            data = mangled(rng, data)
        for limit in (MAX_NESTING, 3, 2, 1, 0):
            expected, got = reference(data, limit), checked(data, limit)
            # text both broken and too deep may be refused for either
            if got != expected and not (expected == "not" and got == "deep"):
                disagreements.append((data, limit, expected, got))
    assert disagreements == []


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b'{"a": [1, 2.5e-3, -0, "x\\u00e9\\"", true, false, null]}', "object"),
        (b"  [ ]  ", "array"),
        (b'"text"', "string"),
        (b"-12.5E+3", "scalar"),
        (b"NaN", "scalar"),
        (b"[-Infinity]", "array"),
    ],
)
def test_the_kind_of_a_value(data, kind):
    assert check(data) == kind


@pytest.mark.parametrize(
    "data",
    [b"", b"  ", b"[1,]", b"{1: 2}", b'{"a" 1}', b"[1 2]", b"01", b"[1]]", b'"\x01"', '["é"]'.encode(), b"[]x"],
)
def test_what_is_not_one_json_value_in_ascii_is_refused(data):
    with pytest.raises(NotJson):
        check(data)


@pytest.mark.parametrize("opening", [b"[", b'{"k": '])
def test_nesting_is_counted_as_check_nesting_counts_it(opening):
    closing = b"]" if opening == b"[" else b"}"
    at_the_limit = opening * MAX_NESTING + b"1" + closing * MAX_NESTING
    assert check(at_the_limit) in ("array", "object")
    with pytest.raises(TooDeep, match=f"nested deeper than {MAX_NESTING} levels"):
        check(opening * (MAX_NESTING + 1) + b"1" + closing * (MAX_NESTING + 1))
    with pytest.raises(TooDeep):
        check(opening * 100_000)  # a forged value of nothing but openings: refused at the limit, not walked


@pytest.mark.parametrize(
    "value",
    [
        [{"id": i, "name": f"customer {i}", "tags": ["a", "b"], "points": i * 7.5} for i in range(30_000)],
        {"rows": [[i, [i]] for i in range(100_000)], "count": 3},
        'x"y\\' * 500_000,
    ],
    ids=["rows", "nested_lists", "string"],
)
def test_a_value_of_megabytes_is_checked_without_making_objects_of_it(value):
    data = json.dumps(value).encode()
    tracemalloc.start()
    try:
        assert check(data) in ("array", "object", "string")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(data) > 2**20 and peak < len(data) / 20
