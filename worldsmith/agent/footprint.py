"""The side-effect guard: an episode may only change what the task's reference solution changes.

A verifier checks that the asked-for change happened; it rarely checks that nothing else did.
The reference solution, replayed once per (bundle, task) in its own episode, gives the task's
footprint: the (table, row key, column) cells it updates, the rows it deletes, and how many rows
it inserts per table. An episode judged `complete` whose end state reaches outside the footprint
(another row updated or deleted, another column touched, more rows inserted) is downgraded to
`partial`, with the overreach named in the evidence.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import DbDiff
from worldsmith.runtime.episode import Runtime


def _key(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Footprint:
    """What a diff changed, cell by cell (updates), row by row (deletes), and by count (inserts)."""

    cells: frozenset[tuple[str, str, str]] = frozenset()
    deleted: frozenset[tuple[str, str]] = frozenset()
    inserts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, diff: DbDiff) -> Footprint:
        cells, deleted, inserts = set(), set(), {}
        for table, changes in diff.tables.items():
            for update in changes.updated:
                cells |= {
                    (table, _key(update["key"]), column)
                    for column in update["after"]
                    if update["before"].get(column) != update["after"].get(column)
                }
            deleted |= {(table, _key(row)) for row in changes.deleted}
            if changes.inserted:
                inserts[table] = len(changes.inserted)
        return cls(frozenset(cells), frozenset(deleted), inserts)

    def overreach(self, diff: DbDiff) -> list[str]:
        """The changes of `diff` outside this footprint, in words (empty: none)."""
        other = Footprint.of(diff)
        problems = [
            f"{table} row {key} column {column!r} changed" for table, key, column in sorted(other.cells - self.cells)
        ]
        problems += [f"{table} row {row} deleted" for table, row in sorted(other.deleted - self.deleted)]
        problems += [
            f"{count} row(s) inserted into {table} (the task needs {self.inserts.get(table, 0)})"
            for table, count in sorted(other.inserts.items())
            if count > self.inserts.get(table, 0)
        ]
        return problems


@dataclass(frozen=True)
class ReferenceRun:
    """The reference solution replayed: its footprint and which steps changed the database."""

    footprint: Footprint
    changed: tuple[bool, ...]
    statuses: tuple[str, ...]


_CACHE: dict[tuple[str, str], ReferenceRun] = {}
_LOCK = threading.Lock()


def reference_run(runtime: Runtime, bundle: Bundle, task: TaskSpec) -> ReferenceRun:
    """Replay `task.solution` in a fresh episode (once per bundle content and task; cached)."""
    key = (bundle.key, task.id)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    with runtime.open_episode(bundle, task) as episode:
        results = [episode.call_tool(step.tool, step.arguments) for step in task.solution]
        diff = episode.diff(bundle.world)
    run = ReferenceRun(Footprint.of(diff), tuple(r.changed for r in results), tuple(r.status for r in results))
    with _LOCK:
        _CACHE[key] = run
    return run
