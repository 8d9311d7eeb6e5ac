"""Execution probes of an environment: its tools run, its reference solutions are accepted,
its untouched state is rejected, its replay is deterministic. `worldsmith env check` prints them."""

from __future__ import annotations

import random
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from worldsmith.bundle.contract import Bundle
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.errors import RuntimeFault


@dataclass(frozen=True)
class ProbeResult:
    """One probe: what it checked (`probe`, `target`), whether it `passed`, and why (`detail`)."""

    probe: str
    target: str
    passed: bool
    detail: str = ""


class SeedValues:
    """Plausible argument values taken from the seeded database, by column name (the first found,
    or a random one when given `rng`)."""

    def __init__(self, world: bytes, rng: random.Random | None = None):
        self.rng = rng
        conn = sqlite3.connect(":memory:")
        conn.deserialize(world)
        self.columns: dict[str, list[Any]] = {}
        tables = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")
        ]
        for table in tables:
            cursor = conn.execute(f'SELECT * FROM "{table}" LIMIT 5')
            names = [d[0] for d in cursor.description]
            for row in cursor.fetchall():
                for name, value in zip(names, row):
                    if value is not None:
                        self.columns.setdefault(name, []).append(value)
                        if name == "id":
                            self.columns.setdefault(f"{table.rstrip('s')}_id", []).append(value)
        conn.close()

    def value(self, name: str, schema: dict[str, Any]) -> Any:
        if schema.get("examples"):  # documented example values (FastAPI apps carry them) come first
            return schema["examples"][0]
        if "example" in schema:
            return schema["example"]
        if "enum" in schema:
            return schema["enum"][0]
        kinds = schema.get("type", "string")
        kind = next((k for k in kinds if k != "null"), "string") if isinstance(kinds, list) else kinds
        wanted = {"integer": int, "number": (int, float), "string": str, "boolean": bool}.get(kind)
        candidates = [
            c
            for c in self.columns.get(name, [])
            if wanted and isinstance(c, wanted) and not isinstance(c, bool) or kind == "boolean" and isinstance(c, bool)
        ]
        if candidates:
            return self.rng.choice(candidates) if self.rng else candidates[0]
        return {"integer": 1, "number": 1.0, "string": "test", "boolean": True, "array": [], "object": {}}.get(
            kind, "test"
        )


def sample_arguments(tool: dict[str, Any], seeds: SeedValues) -> dict[str, Any]:
    """Arguments for every required parameter of `tool`, drawn from the seed data where possible."""
    params = tool["parameters"]
    return {name: seeds.value(name, params["properties"][name]) for name in params.get("required", [])}


def probe_tools(runtime: Runtime, bundle: Bundle) -> list[ProbeResult]:
    """Every tool runs: called with the arguments of a reference solution, else with seed-data
    arguments. A refusal (tool_error) counts as running; an env_error does not."""
    calls: dict[str, dict[str, Any]] = {}
    for task in bundle.tasks:
        for step in task.solution:
            calls.setdefault(step.tool, step.arguments)
    seeds = SeedValues(bundle.world)
    results = []
    try:
        episode = runtime.open_episode(bundle)
    except RuntimeFault as exc:  # the tool module (or app) does not load: no tool can run
        return [ProbeResult("tools load", bundle.env_id, False, str(exc))]
    with episode:
        for tool in bundle.tools:
            arguments = calls.get(tool.name) or sample_arguments(tool.model_dump(), seeds)
            outcome = episode.call_tool(tool.name, arguments)
            passed = outcome.status != "env_error"
            detail = outcome.status if passed else f"{outcome.error}"
            results.append(ProbeResult("tool runs", tool.name, passed, detail))
    return results


def probe_tasks(runtime: Runtime, bundle: Bundle) -> list[ProbeResult]:
    """Per task: the reference solution runs and is judged complete; the untouched database is
    judged not complete; replaying the solution twice gives the same database."""
    results = []
    for task in bundle.tasks:
        finals: list[bytes] = []
        failure = None
        for _ in range(2 if task.solution else 0):
            with runtime.open_episode(bundle, task) as episode:
                for number, step in enumerate(task.solution, start=1):
                    outcome = episode.call_tool(step.tool, step.arguments)
                    if not outcome.ok:
                        failure = f"step {number} ({step.tool}) gave {outcome.status}: {outcome.error}"
                        break
                if failure is None:
                    verdict = episode.verify(task.answer or "")
                    if verdict.status != "complete":
                        failure = f"verifier said {getattr(verdict.status, 'value', verdict.status)}: {verdict.error or verdict.evidence}"
                finals.append(episode.snapshot())
            if failure:
                break
        if task.solution:  # imported environments may have none
            results.append(ProbeResult("reference accepted", task.id, failure is None, failure or "complete"))
        with runtime.open_episode(bundle, task) as episode:
            untouched = episode.verify("")
            status = getattr(untouched.status, "value", untouched.status)
            ok = status in ("incomplete", "partial")
            results.append(
                ProbeResult(
                    "untouched rejected",
                    task.id,
                    ok,
                    status if ok else f"{status}: {untouched.error or untouched.evidence}",
                )
            )
            if failure is None and task.solution:
                changes = episode.diff(finals[0], finals[1])
                results.append(
                    ProbeResult(
                        "replay deterministic",
                        task.id,
                        changes.empty,
                        "same database" if changes.empty else f"replays differ: {changes.counts()}",
                    )
                )
    return results


_MEMO: OrderedDict[str, list[ProbeResult]] = OrderedDict()
_MEMO_SIZE = 256
_MEMO_LOCK = threading.Lock()


def check_environment(runtime: Runtime, bundle: Bundle, *, reuse: bool = False) -> list[ProbeResult]:
    """All execution probes of `bundle`. With `reuse`, results for the same content (bundle key)
    computed earlier in this process are returned instead of running again: the probes are
    deterministic, and generation runs them in the verifiers stage and again in validate."""
    if reuse:
        with _MEMO_LOCK:
            if bundle.runtime_key in _MEMO:
                _MEMO.move_to_end(bundle.runtime_key)
                return list(_MEMO[bundle.runtime_key])
    results = probe_tools(runtime, bundle)
    if not any(r.probe == "tools load" for r in results):
        results += probe_tasks(runtime, bundle)
    with _MEMO_LOCK:
        _MEMO[bundle.runtime_key] = results
        while len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return list(results)
