"""Results of deterministic checks kept by the content digest of exactly what they read, so a check
run again on the same content (a repair round, validation after the verifiers stage, a check started
ahead while the model answers) is not computed twice. A computation in flight is shared: a second
caller of the same key waits for it instead of starting its own."""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

V = TypeVar("V")


def content_digest(*parts: Any) -> str:
    """sha256 over `parts`: bytes as they are, anything else as sorted-key JSON (str for the rest)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


class SharedMemo(Generic[V]):
    """The latest `size` results by key, each computed once in this process (a failed computation is
    not kept: the next caller computes it again). Callers get a deep copy: what they change is theirs;
    with `copies=False`, the kept value itself (for values no caller changes, too large to copy cheaply)."""

    def __init__(self, size: int, *, copies: bool = True):
        self.size = size
        self.copies = copies
        self._entries: OrderedDict[str, Future[V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, compute: Callable[[], V]) -> V:
        """The result kept under `key`, else (or once the caller computing it is done) `compute()`'s."""
        with self._lock:
            kept = self._entries.get(key)
            owner = kept is None
            future: Future[V] = Future() if kept is None else kept
            self._keep(key, future)
        if owner:
            try:
                future.set_result(compute())
            except BaseException as exc:
                with self._lock:
                    if self._entries.get(key) is future:
                        del self._entries[key]
                future.set_exception(exc)
                raise
        return copy.deepcopy(future.result()) if self.copies else future.result()

    def put(self, key: str, value: V) -> None:
        """Keep `value` under `key` (computed by the caller)."""
        future: Future[V] = Future()
        future.set_result(value)
        with self._lock:
            self._keep(key, future)

    def clear(self) -> None:
        """Forget every kept result (a benchmark timing the computation itself)."""
        with self._lock:
            self._entries.clear()

    def _keep(self, key: str, future: Future[V]) -> None:
        """`future` under `key`, the most recently used; the least recently used past `size` go (lock held)."""
        self._entries[key] = future
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
