"""Simulated environment mode: episodes whose tool calls a world model answers instead of the
environment's code (the "simulator" that code-driven worlds are compared with).

The state is the predicted diff history, kept as an imagined copy of the environment's database
in this process: it starts as the seeded `world.db` (or a real mid-episode state,
worldmodel/real_starts.py) and takes every predicted diff in turn (rows
inserted, updated, deleted; parts naming unknown tables, columns or rows are skipped and counted
as inconsistent). The world model sees what it sees in `wm eval`: the task, the rows the call's
arguments point at (read from the imagined database) and the recent calls with its own answers.

- arguments are checked against the tool schemas first, exactly as in a real episode;
- with `samples` > 1 the most common prediction is the answer and 1 - its share is the call's
  uncertainty; a call above `uncertainty_threshold` stops the episode as env_error (limit
  `uncertain`), as does an answer that is not a transition (limit `invalid_prediction`): like any
  env_error, the rollout is left out of training and does not count against the agent;
- the end state is judged by the task's real verifier, in the sandbox, on the imagined database.

The `code` world model answers by running the real tool in a sandboxed episode restored to the
imagined database, so simulated mode with it reproduces real episodes exactly: the oracle of this
mode, against which learned world models are compared.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Self

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.evaluation import SimulationCounts
from worldsmith.models.results import DbDiff, ToolResult, VerifierResult
from worldsmith.runtime.episode import Runtime, checked_call, tool_schemas
from worldsmith.runtime.sandbox import dbdiff
from worldsmith.toolschema import ToolSchemaJson
from worldsmith.worldmodel.config import SimulationConfig
from worldsmith.worldmodel.transitions import HistoryEntry, Transition, diff_part, observe, relevant_rows
from worldsmith.worldmodel.world_models import Prediction, WorldModel, consensus, world_model

STATUSES = ("ok", "tool_error", "env_error")


class CodeWorldModel:
    """The environment's code as a world model: each query runs the real tool in a sandboxed
    episode restored to the query's database (`Transition.world`)."""

    name = "code"

    def __init__(self, runtime: Runtime, bundles: Mapping[str, Bundle]):
        self.runtime, self.bundles = runtime, bundles

    def predict(self, transition: Transition, history: list[HistoryEntry], samples: int = 1) -> list[Prediction]:
        if transition.world is None or transition.env_key not in self.bundles:
            raise ValueError("the code world model needs the query's database and bundle (simulated episodes only)")
        with self.runtime.open_episode(self.bundles[transition.env_key]) as episode:
            episode.restore(transition.world)
            observation, diff = observe(
                episode, transition.action["name"], transition.action["arguments"], transition.world
            )
        return [Prediction(observation=observation, diff=diff) for _ in range(samples)]


@dataclass
class SimulationStats:
    """Counts over every simulated call of a runtime (thread-safe)."""

    calls: int = 0
    uncertain: int = 0
    invalid: int = 0
    inconsistent: int = 0
    uncertainty_sum: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, uncertainty: float, *, uncertain: bool, invalid: bool, inconsistent: bool) -> None:
        with self._lock:
            self.calls += 1
            self.uncertainty_sum += uncertainty
            self.uncertain += uncertain
            self.invalid += invalid
            self.inconsistent += inconsistent

    def counts(self) -> SimulationCounts:
        """The counts so far, as runs report them."""
        with self._lock:
            n = self.calls or 1
            return SimulationCounts(
                calls=self.calls,
                mean_uncertainty=self.uncertainty_sum / n,
                uncertain_rate=self.uncertain / n,
                invalid_rate=self.invalid / n,
                inconsistent_rate=self.inconsistent / n,
            )

    def as_dict(self) -> dict[str, float]:
        """`counts()` as a plain dict."""
        return self.counts().model_dump()


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def apply_to_database(conn: sqlite3.Connection, diff: Mapping[str, JsonValue]) -> list[str]:
    """Apply a predicted diff `{table: {inserted, updated, deleted}}` to `conn`, part by part; returns
    the parts that could not be applied (unknown table or row, a constraint broken, a part that is
    not a list), each named. Only names that exist in the database reach SQL; values are always
    bound parameters."""
    problems: list[str] = []
    tables = {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    }

    def run(sql: str, values: list[JsonValue], what: str) -> None:
        try:
            if conn.execute(sql, values).rowcount == 0:
                problems.append(f"{what}: no such row")
        except sqlite3.Error as exc:
            problems.append(f"{what}: {exc}")

    for table, changes in (diff or {}).items():
        if table not in tables or not isinstance(changes, dict):
            problems.append(f"{table}: no such table" if table not in tables else f"{table}: changes are not an object")
            continue
        info = conn.execute(f"PRAGMA table_info({_quoted(table)})").fetchall()
        columns = [r[1] for r in info]
        keys = [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5]]

        def where(row: Mapping[str, JsonValue]) -> tuple[str, list[JsonValue]]:
            names = (
                [k for k in keys if k in row]
                if keys and all(k in row for k in keys)
                else [c for c in columns if c in row]
            )
            return " AND ".join(_quoted(c) + " IS ?" for c in names) or "0", [row[c] for c in names]

        problems += [
            f"{table}: {part} is not a list"
            for part in ("updated", "deleted", "inserted")
            if changes.get(part) and not isinstance(changes[part], list)
        ]
        for change in diff_part(changes, "updated"):
            key = change.get("key") if isinstance(change, dict) else None
            after = change.get("after") if isinstance(change, dict) else None
            if not (isinstance(key, dict) and isinstance(after, dict)):
                problems.append(f"{table}: malformed update")
                continue
            assign = [c for c in columns if c in after]
            condition, values = where(key)
            if not assign:
                problems.append(f"{table}: update names no column")
                continue
            run(
                f"UPDATE {_quoted(table)} SET {', '.join(_quoted(c) + ' = ?' for c in assign)} WHERE {condition}",
                [after[c] for c in assign] + values,
                f"{table}: update {key}",
            )
        for row in diff_part(changes, "deleted"):
            if isinstance(row, dict):
                condition, values = where(row)
                run(f"DELETE FROM {_quoted(table)} WHERE {condition}", values, f"{table}: delete")
        for row in diff_part(changes, "inserted"):
            names = [c for c in columns if c in row] if isinstance(row, dict) else []
            if not isinstance(row, dict) or not names:
                problems.append(f"{table}: insert names no column")
                continue
            run(
                f"INSERT INTO {_quoted(table)} ({', '.join(map(_quoted, names))}) VALUES ({', '.join('?' * len(names))})",
                [row[c] for c in names],
                f"{table}: insert",
            )
    return problems


class SimulatedRuntime:
    """Opens simulated episodes; the real `runtime` runs the verifiers (and the `code` world model)."""

    def __init__(self, runtime: Runtime, config: SimulationConfig, model: WorldModel | None = None):
        self.runtime, self.config = runtime, config
        self.bundles: dict[str, Bundle] = {}
        self.model = model or (
            CodeWorldModel(runtime, self.bundles)
            if config.world_model == "code"
            else world_model(config.world_model, max_new_tokens=config.max_new_tokens)
        )
        self.name = f"simulated:{self.model.name}"
        self.stats = SimulationStats()

    def open_episode(
        self,
        bundle: Bundle,
        task: str | TaskSpec | None = None,
        start: tuple[bytes, list[HistoryEntry]] | None = None,
    ) -> SimulatedEpisode:
        """A simulated episode from the seeded world, or from `start`: a database and the calls that led
        there, as the world model's history (a real mid-episode state, worldmodel/real_starts.py)."""
        self.bundles.setdefault(bundle.key, bundle)
        return SimulatedEpisode(self, bundle, bundle.task(task) if isinstance(task, str) else task, start)


class SimulatedEpisode:
    """An `Episode` (worldsmith/runtime/episode.py) on an imagined database."""

    def __init__(
        self,
        simulation: SimulatedRuntime,
        bundle: Bundle,
        task: TaskSpec | None,
        start: tuple[bytes, list[HistoryEntry]] | None = None,
    ):
        self.id = uuid.uuid4().hex
        self.simulation, self.bundle, self.task = simulation, bundle, task
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.conn.deserialize(start[0] if start else bundle.world)
        self.history: list[HistoryEntry] = list(start[1]) if start else []

    def tools(self) -> list[ToolSchemaJson]:
        return tool_schemas(self.bundle)

    def call_tool(self, name: str, arguments: JsonObject | None = None) -> ToolResult:
        """The world model's answer to the call; its predicted diff is applied to the imagined database."""
        arguments, refusal = checked_call(self.bundle, name, arguments)
        if refusal is not None:
            return refusal
        started = time.perf_counter()
        config = self.simulation.config
        query = Transition(
            env_id=self.bundle.env_id,
            env_key=self.bundle.key,
            episode=self.id,
            index=len(self.history),
            task=self.task.instruction if self.task else "",
            rows=relevant_rows(self.conn, arguments),
            history=list(self.history),
            action={"name": name, "arguments": arguments},
            observation=None,
            world=self.snapshot(),
        )
        try:
            answer, share = consensus(self.simulation.model.predict(query, self.history, config.samples))
        except Exception as exc:  # noqa: BLE001 - an unreachable or broken world model fails the environment, not the agent
            return ToolResult(
                status="env_error", error=f"the world model failed: {type(exc).__name__}: {exc}", limit="world_model"
            )
        uncertainty = 1.0 - share
        observation = (
            answer.observation if answer.observation is not None and answer.observation.status in STATUSES else None
        )
        uncertain = uncertainty > config.uncertainty_threshold
        changes = self.conn.total_changes
        problems = (
            apply_to_database(self.conn, answer.diff)
            if observation is not None and not uncertain and observation.status == "ok"
            else []
        )
        self.simulation.stats.record(
            uncertainty, uncertain=uncertain, invalid=observation is None, inconsistent=bool(problems)
        )
        if uncertain:
            return ToolResult(
                status="env_error",
                limit="uncertain",
                error=f"the world model is uncertain about this call ({uncertainty:.2f} > {config.uncertainty_threshold})",
            )
        if observation is None:
            return ToolResult(
                status="env_error",
                limit="invalid_prediction",
                error=f"the world model's answer is not a transition: {(answer.raw or '')[:200]!r}",
            )
        self.history.append({"action": query.action, "observation": observation.record()})
        return ToolResult(
            status=observation.status,  # type: ignore[arg-type]  # a predicted status: ToolResult validates it
            value=observation.value,
            error=observation.error,
            changed=self.conn.total_changes > changes,
            seconds=time.perf_counter() - started,
        )

    def snapshot(self) -> bytes:
        return self.conn.serialize()

    def diff(self, before: bytes, after: bytes | None = None) -> DbDiff:
        old = sqlite3.connect(":memory:")
        old.deserialize(before)
        new = self.conn
        if after is not None:
            new = sqlite3.connect(":memory:")
            new.deserialize(after)
        try:
            return DbDiff.model_validate({"tables": dbdiff.diff(old, new)})
        finally:
            old.close()
            if new is not self.conn:
                new.close()

    def verify(self, answer: str = "") -> VerifierResult:
        """The task's real verifier, in the sandbox, on the untouched and the imagined database."""
        if self.task is None:
            raise ValueError("this episode has no task to verify")
        with self.simulation.runtime.open_episode(self.bundle, self.task) as real:
            real.restore(self.snapshot())
            return real.verify(answer)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
