"""Per-run resources: what the tasks of one flow run share in a process (a generator, a sandbox
runtime, a loaded policy or world model, the outcomes finished so far), kept in one registry per kind
of resource, keyed by run. Tasks receive only serialisable arguments (the run's parameters and key)
and look their resources up here, so a task runs the same in the flow's process and on a Dask worker."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class RunResources(Generic[T]):
    """A registry of one kind of per-run resource in this process, keyed by run.

    - `get(run, build)`: the run's resources, built by `build()` on first use: once per run and
      process however many tasks ask at once (the others wait for the one building). A `build` that
      raises registers nothing; the next `get` builds again.
    - `find(run)`: the run's resources if this process has them, else None; builds nothing.
    - `release(run)`: removes the run's resources and closes them with `close`; returns them, or None
      when this process has none. The flow releases a run's resources when the run ends (after its
      tasks, also when it fails); a later `get` builds new ones.
    - `holding(run, resources)`: `resources` registered (not built) for the run while inside the
      `with` block, released on leaving it.
    - `release_all()`: releases every run's (a process stopping at once).
    - Resources still registered when the process exits are closed then.

    Per process: nothing registered here travels to another process; each process running a run's
    tasks builds its own from the run's parameters. A registry pickles as an empty one (a flow's run
    context travels to Dask workers with the module globals its function names), so what it holds
    never needs to be serialisable."""

    def __init__(self, close: Callable[[T], object] | None = None) -> None:
        self._close = close
        self._held: dict[Hashable, T] = {}
        self._lock = threading.Lock()
        atexit.register(self.release_all)

    def __reduce__(self) -> tuple[type[RunResources[T]], tuple[Callable[[T], object] | None]]:
        return type(self), (self._close,)  # an empty registry: resources stay in their process

    def get(self, run: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            if run not in self._held:
                self._held[run] = build()
            return self._held[run]

    def find(self, run: Hashable) -> T | None:
        with self._lock:
            return self._held.get(run)

    def release(self, run: Hashable) -> T | None:
        with self._lock:
            found = self._held.pop(run, None)
        if found is not None and self._close is not None:
            self._close(found)
        return found

    @contextmanager
    def holding(self, run: Hashable, resources: T) -> Iterator[T]:
        with self._lock:
            self._held[run] = resources
        try:
            yield resources
        finally:
            self.release(run)

    def release_all(self) -> None:
        """Release every run's resources (a process stopping at once)."""
        for run in list(self._held):
            self.release(run)
