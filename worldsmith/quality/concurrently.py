"""Probe work run at once on a runtime's sandbox pool: each piece opens episodes of its own (an episode is
isolated and thread-safe, and the pool spreads a world's episodes over its workers), so probe families, or
one family's tasks, need not wait for each other. Results come back in the order the work was given, so
a report reads the same however the pieces interleaved; the first piece that raises raises here, after
the others are done (none is left running against a runtime its caller is about to close)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from worldsmith.runtime.episode import Runtime

T = TypeVar("T")
R = TypeVar("R")


def together(pieces: Sequence[Callable[[], R]]) -> list[R]:
    """Every piece of work run at once, each in a thread of its own: their results, in order."""
    if len(pieces) <= 1:
        return [piece() for piece in pieces]
    with ThreadPoolExecutor(len(pieces), thread_name_prefix="probes") as threads:
        futures = [threads.submit(piece) for piece in pieces]
    return [future.result() for future in futures]


def each_on_pool(runtime: Runtime, items: Iterable[T], work: Callable[[T], R]) -> list[R]:
    """`work(item)` for every item, as many at once as `runtime`'s pool has workers: the results, in order."""
    todo = list(items)
    workers = min(runtime.pool.size, len(todo))
    if workers <= 1:
        return [work(item) for item in todo]
    with ThreadPoolExecutor(workers, thread_name_prefix="probes") as threads:
        futures = [threads.submit(work, item) for item in todo]
    return [future.result() for future in futures]
