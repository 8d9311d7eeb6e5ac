"""Probe work run at once (quality/concurrently.py): results in the order given, whatever order the pieces
end in; pieces really overlap; a failure raises only once every piece is done."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from worldsmith.quality.concurrently import each_on_pool, together

pytestmark = pytest.mark.unit


def _runtime(workers: int) -> SimpleNamespace:
    return SimpleNamespace(pool=SimpleNamespace(size=workers))


def test_results_come_in_the_order_given_and_the_pieces_overlap():
    met = threading.Barrier(3, timeout=10)  # passes only when three pieces run at the same time

    def piece(n: int):
        return lambda: (met.wait(), n)[1]

    assert together([piece(1), piece(2), piece(3)]) == [1, 2, 3]


def test_each_on_pool_runs_as_many_at_once_as_the_pool_has_workers():
    running, most = 0, 0
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=10)

    def work(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        if n < 2:
            both.wait()  # the first two meet: two at once
        with lock:
            running -= 1
        return n * n

    assert each_on_pool(_runtime(2), range(6), work) == [0, 1, 4, 9, 16, 25]
    assert most == 2
    assert each_on_pool(_runtime(1), [3], work) == [9]


def test_a_failing_piece_raises_after_the_others_are_done():
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.05)
        finished.set()
        return "done"

    def failing() -> str:
        raise ValueError("broken probe")

    with pytest.raises(ValueError, match="broken probe"):
        together([failing, slow])
    assert finished.is_set()
