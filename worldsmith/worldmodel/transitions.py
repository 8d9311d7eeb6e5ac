"""World-model data: every tool call of real episodes as (state, action) -> (observation, diff).

Transitions are made by replaying trajectories (of any policy) in fresh episodes of their
environments, so each one carries the exact database before the call. The state is compact text:
the task, the rows the call's arguments point at (by id-like argument names), and the last few
calls with their outcomes. Splits are by environment (a hash of the env_id), so evaluation on
`test` measures generalisation to worlds the model never saw.

A diff, real or predicted, is JSON: `{table: {"inserted": [row...], "updated": [{"key", "before",
"after"}...], "deleted": [row...]}}`. A predicted one is a model's answer, so every reader narrows
each part (`diff_part`) and skips or names what is malformed.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic validates TypedDict fields from here on Python 3.11

from worldsmith.agent.loop import Trajectory
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.jsonlines import read_models, write_models
from worldsmith.models.results import ToolResult
from worldsmith.runtime.episode import Episode, Runtime

Split = Literal["train", "validation", "test"]
ROWS_PER_TABLE = 3


class Observation(BaseModel):
    """What a tool call answered: its status (ok, tool_error, env_error) and value or error."""

    status: str
    value: Any = None
    error: str | None = None

    def record(self) -> ObservationRecord:
        """This observation as a history entry holds it: `model_dump()`, its value a copy."""
        dumped = self.model_dump()
        return {"status": dumped["status"], "value": dumped["value"], "error": dumped["error"]}


class ObservationRecord(TypedDict):
    """An observation in a history: an `Observation`'s fields (status "invalid" for a k-step
    prediction that was not a transition)."""

    status: str
    value: JsonValue
    error: str | None


class Action(TypedDict):
    """A tool call as a world model sees it."""

    name: str
    arguments: JsonObject


class HistoryEntry(TypedDict):
    """An earlier call of an episode: the call and what it answered (really, or as predicted)."""

    action: Action
    observation: ObservationRecord


class Transition(BaseModel):
    """One tool call of a real episode, with everything a world model sees and must predict."""

    env_id: str
    env_key: str
    episode: str = Field(description="trajectory id: transitions of one episode share it, in `index` order")
    index: int
    task: str
    rows: dict[str, list[JsonObject]] = Field(
        default_factory=dict, description="rows the arguments point at, before the call"
    )
    history: list[HistoryEntry] = Field(
        default_factory=list, description="earlier calls of the episode: action and observation"
    )
    action: Action
    observation: Observation | None = Field(
        description="what the call answered; None in a query, whose outcome is to be predicted"
    )
    diff: JsonObject = Field(default_factory=dict, description="per table: inserted, updated, deleted rows")
    split: Split = "train"
    world: bytes | None = Field(
        None,
        exclude=True,
        repr=False,
        description="the whole database before the call, when at hand (never serialized)",
    )


def diff_part(changes: Mapping[str, JsonValue], part: str) -> list[JsonValue]:
    """The entries of `part` ("inserted", "updated" or "deleted") of one table's changes in a diff:
    [] when it is absent, empty or not a list (a malformed prediction)."""
    entries = changes.get(part)
    return entries if isinstance(entries, list) else []


def state_text(
    task: str, rows: Mapping[str, Sequence[JsonObject]], history: Sequence[HistoryEntry], window: int = 3
) -> str:
    """The compact textual state: the task, the relevant rows, the last `window` calls."""
    lines = [f"Task: {task}", "Relevant rows:"]
    lines += [
        f"  {table}: {json.dumps(row, sort_keys=True, default=str)}"
        for table, found in sorted(rows.items())
        for row in found
    ] or ["  (none)"]
    lines.append("Recent calls:")
    recent = history[-window:]
    lines += [
        f"- {h['action']['name']}({json.dumps(h['action']['arguments'], sort_keys=True)}) -> {h['observation']['status']}: "
        f"{json.dumps(h['observation'].get('value') if h['observation']['status'] == 'ok' else h['observation'].get('error'), default=str)[:300]}"
        for h in recent
    ] or ["(none)"]
    return "\n".join(lines)


def split_of(env_id: str, seed: int = 0, validation: float = 0.15, test: float = 0.15) -> Split:
    """The split of an environment: deterministic for (env_id, seed), the same for all its transitions."""
    draw = int(hashlib.sha256(f"{seed}:{env_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if draw < test else "validation" if draw < test + validation else "train"


def relevant_rows(conn: sqlite3.Connection, arguments: Mapping[str, JsonValue]) -> dict[str, list[JsonObject]]:
    """Rows whose columns hold the id-like argument values (`order_id=7` -> orders.id = 7 and *.order_id = 7)."""
    found: dict[str, list[JsonObject]] = {}
    tables = [
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    ]
    for table in tables:
        columns = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
        singular = table.removesuffix("s")
        for name, value in arguments.items():
            if isinstance(value, (dict, list)) or value is None:
                continue
            column = (
                "id"
                if name == f"{singular}_id" and "id" in columns
                else name
                if name in columns and (name.endswith("_id") or name in ("id", "sku", "code", "email"))
                else None
            )
            if column is None:
                continue
            cursor = conn.execute(f'SELECT * FROM "{table}" WHERE "{column}" = ? LIMIT {ROWS_PER_TABLE}', (value,))
            names = [d[0] for d in cursor.description]
            bucket = found.setdefault(table, [])
            bucket.extend(row for row in (dict(zip(names, values)) for values in cursor) if row not in bucket)
    return {t: rows[:ROWS_PER_TABLE] for t, rows in found.items() if rows}


def _lookup_rows(world: bytes, arguments: Mapping[str, JsonValue]) -> dict[str, list[JsonObject]]:
    """`relevant_rows` of a serialized database."""
    conn = sqlite3.connect(":memory:")
    conn.deserialize(world)
    try:
        return relevant_rows(conn, arguments)
    finally:
        conn.close()


def observe(episode: Episode, name: str, arguments: JsonObject, before: bytes) -> tuple[Observation, JsonObject]:
    """Call a tool in `episode` (whose database was `before`): what it answered and what it changed."""
    result = episode.call_tool(name, arguments)
    diff = episode.diff(before).model_dump()["tables"] if result.ok and result.changed else {}
    return observation_of(result), diff


def observation_of(result: ToolResult) -> Observation:
    """What a world model is shown of a call's result: its value when ok, else its error."""
    return Observation(
        status=result.status, value=result.value if result.ok else None, error=None if result.ok else result.error
    )


def replay(runtime: Runtime, bundle: Bundle, trajectory: Trajectory, episode_id: str) -> list[Transition]:
    """The transitions of one trajectory, replayed call by call in a fresh episode of `bundle`."""
    task = bundle.task(trajectory.task_id)
    transitions: list[Transition] = []
    history: list[HistoryEntry] = []
    with runtime.open_episode(bundle, task) as episode:
        for index, step in enumerate(trajectory.steps):
            action: Action = {"name": step.call.name, "arguments": step.call.arguments}
            before = episode.snapshot()
            observation, diff = observe(episode, step.call.name, step.call.arguments, before)
            transitions.append(
                Transition(
                    env_id=bundle.env_id,
                    env_key=bundle.key,
                    episode=episode_id,
                    index=index,
                    task=task.instruction,
                    rows=_lookup_rows(before, step.call.arguments if isinstance(step.call.arguments, dict) else {}),
                    history=list(history),
                    action=action,
                    observation=observation,
                    diff=diff,
                    world=before,
                )
            )
            history.append({"action": action, "observation": observation.record()})
    return transitions


def build_transitions(
    runtime: Runtime,
    bundles: dict[str, Bundle],
    trajectories: list[Trajectory],
    *,
    seed: int = 0,
    validation: float = 0.15,
    test: float = 0.15,
) -> list[Transition]:
    """Transitions of every trajectory whose environment is in `bundles` (by env_key), with env-disjoint splits."""
    out: list[Transition] = []
    for number, trajectory in enumerate(trajectories):
        bundle = bundles.get(trajectory.env_key)
        if bundle is None or not trajectory.steps:
            continue
        split = split_of(bundle.env_id, seed, validation, test)
        for transition in replay(runtime, bundle, trajectory, f"{trajectory.env_id}/{trajectory.task_id}/{number}"):
            transition.split = split
            out.append(transition)
    return out


def write_transitions(transitions: list[Transition], path: Path) -> Path:
    return write_models(transitions, path)


def read_transitions(path: Path) -> list[Transition]:
    """Transitions from JSON lines; a malformed line raises ValueError naming it."""
    return read_models(Transition, path, "a transition")
