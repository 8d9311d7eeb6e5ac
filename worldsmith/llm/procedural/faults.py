"""Planted faults of procedural worlds: the bugs the paper's audit found in real worlds, one class at a
time, for the execution probes to find (bench/probes.py measures the share found; tests/quality/test_deep_probes.py).

Each class rewrites one artifact of a composed world (procedural_bundle) the way a generator gets it
wrong, and names what the probes must name (`PlantedFault.targets`: a tool or task id):

- `crash_on_some_inputs`: a get tool crashes for every third id (and runs for the others);
- `read_tool_writes`: a list tool writes a log row;
- `writes_outside_tables`: an update tool also writes the world's settings;
- `blocked_task_missing_entity`: a task's instruction names a record the seed lacks;
- `blocked_task_refused_step`: a task's reference solution has a call the tool refuses;
- `wall_clock_read`: every write logs the real time (the determinism probe's to find);
- `over_strict_answer_check`: a counting task's verifier accepts only the bare number as the answer,
  character for character (the answer-variant probes' to find: a reworded answer is a false negative);
- tools that run but do the wrong thing (faults_tools.py): a read ignoring its filter, a write to the wrong
  column, a cancel leaving dependants, an inclusive end treated exclusive, SQL from arguments, a filter
  dropping matches, a number stored in another unit than documented, a date stored in another format, a
  tool ending rows without what a sibling tool does to their children (the behaviour probes' to find);
- the verifier classes of faults_verifiers.py (verifier mutation testing's to find), free-text value checks
  too strict and too lenient among them.

A class needs an artifact of its shape (a number argument written, a task writing free text ...): `plant`
raises ValueError on a world without one (bench/probes.py does not count that world for the class).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.invariants import INVARIANTS_FILE
from worldsmith.bundle.loader import build_bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.procedural.faults_seed import SEED_PLANTERS
from worldsmith.llm.procedural.faults_tools import TOOL_PLANTERS
from worldsmith.llm.procedural.faults_verifiers import VERIFIER_PLANTERS
from worldsmith.models.bundle import TaskSpec

SOURCES = ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl", "verifiers.py")


@dataclass(frozen=True)
class PlantedFault:
    """A world with one planted fault of class `fault`; found when a failed probe names one of `targets`."""

    fault: str
    bundle: Bundle
    targets: frozenset[str]


def _after_docstring(tools_py: str, pattern: str, code: str) -> tuple[str, str]:
    """`tools_py` with `code` run first in the first tool whose `def` line matches `pattern` (its name
    the first group), and that tool's name."""
    match = re.search(rf"(def ({pattern})\(conn[^\n]*:\n    \"\"\"(?:[^\"]|\"(?!\"\"))*\"\"\"\n)", tools_py)
    if match is None:
        raise ValueError(f"no tool matching {pattern!r} to plant a fault in")
    name = match.group(2)
    planted = match.group(1) + code.replace("{name}", name)
    return tools_py[: match.start()] + planted + tools_py[match.end() :], name


def _crash_on_some_inputs(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    match = re.search(r"def (get_\w+)\(conn, (\w+): int\)", sources["tools.py"])
    if match is None:
        raise ValueError("no get tool with an id parameter to plant a crash in")
    code = f"    if {match.group(2)} % 3 == 0:\n        return conn.execute('SELECT no_such_column FROM world_settings').fetchall()\n"
    sources["tools.py"], name = _after_docstring(sources["tools.py"], re.escape(match.group(1)), code)
    return frozenset({name})


def _read_tool_writes(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    code = "    _log(conn, 'list', 'world_settings', 0)\n"
    sources["tools.py"], name = _after_docstring(sources["tools.py"], r"list_\w+", code)
    return frozenset({name})


def _writes_outside_tables(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    code = "    conn.execute(\"INSERT OR REPLACE INTO world_settings (key, value) VALUES ('last_update', '{name}')\")\n"
    sources["tools.py"], name = _after_docstring(sources["tools.py"], r"update_\w+", code)
    return frozenset({name})


def _blocked_task_missing_entity(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    for task in tasks:
        quoted = re.search(r"'([^'\n]{3,})'", task.instruction)
        if quoted:
            task.instruction = task.instruction.replace(quoted.group(0), f"'{quoted.group(1)} Quintero-Vale'")
            return frozenset({task.id})
    raise ValueError("no task names a record by a quoted name")


def _blocked_task_refused_step(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    for task in tasks:
        for step in task.solution:
            ids = [k for k, v in step.arguments.items() if k.endswith("_id") and isinstance(v, int)]
            if ids:
                step.arguments[ids[0]] = 987_654
                return frozenset({task.id})
    raise ValueError("no reference step passes an id")


def _wall_clock_read(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    tools_py = sources["tools.py"]
    logged = "(action, table, row_id, _today(conn))"
    if logged not in tools_py:
        raise ValueError("no audit log write to make read the wall clock")
    tools_py = tools_py.replace(logged, "(action, table, row_id, datetime.now().isoformat())", 1)
    sources["tools.py"] = tools_py.replace(
        "from typing import Literal\n", "from datetime import datetime\nfrom typing import Literal\n", 1
    )
    return frozenset(task.id for task in tasks if task.solution)


def _over_strict_answer_check(sources: dict[str, str], tasks: list[TaskSpec]) -> frozenset[str]:
    verifiers = sources["verifiers.py"]
    match = re.search(
        r"def verify_(\w+)\(initial, final, answer\):\n    said = _states_count\(answer, .*, (-?\d+)\)\n", verifiers
    )
    if match is None:
        raise ValueError("no counting task whose answer check to make over-strict")
    strict = f"    said = (answer or '').strip() == '{match.group(2)}'\n"
    line_start = match.start() + match.group(0).index("    said")
    sources["verifiers.py"] = verifiers[:line_start] + strict + verifiers[match.end() :]
    return frozenset({match.group(1)})


PLANTERS: dict[str, Callable[[dict[str, str], list[TaskSpec]], frozenset[str]]] = {
    "crash_on_some_inputs": _crash_on_some_inputs,
    "read_tool_writes": _read_tool_writes,
    "writes_outside_tables": _writes_outside_tables,
    "blocked_task_missing_entity": _blocked_task_missing_entity,
    "blocked_task_refused_step": _blocked_task_refused_step,
    "wall_clock_read": _wall_clock_read,
    "over_strict_answer_check": _over_strict_answer_check,
    **SEED_PLANTERS,
    **TOOL_PLANTERS,
    **VERIFIER_PLANTERS,  # verifiers that judge the wrong end state (faults_verifiers.py)
}
#: Every planted fault class, in the order the benchmark reports them.
FAULTS = tuple(PLANTERS)


def plant(bundle: Bundle, fault: str) -> PlantedFault:
    """`bundle` (a procedural world) rebuilt with one fault of class `fault` (one of `FAULTS`)."""
    sources = {name: bundle.files[name].decode() for name in (*SOURCES, INVARIANTS_FILE) if name in bundle.files}
    tasks = [TaskSpec.model_validate_json(line) for line in sources["tasks.jsonl"].splitlines() if line.strip()]
    targets = PLANTERS[fault](sources, tasks)
    sources["tasks.jsonl"] = "".join(json.dumps(task.model_dump()) + "\n" for task in tasks)
    manifest: JsonObject = {"env_id": f"{bundle.env_id}_{fault}", "scenario": bundle.manifest.scenario.model_dump()}
    if bundle.manifest.clock:
        manifest["clock"] = bundle.manifest.clock
    return PlantedFault(fault, build_bundle(sources, manifest), targets)
