"""Deep tool probes and blocked-task detection: what one call per tool cannot find.

Every tool is called with many valid inputs drawn from the seeded database (keys of the tables its
id parameters name, values of CHECK-constrained enums, range boundaries, the reference solutions'
values, optional arguments present and absent; Hypothesis combines them, derandomized, so two runs
make the same calls) and with invalid ones (unknown ids, values outside an enum, out of range).
Each call runs on the pristine database (the episode is restored after any call that wrote), so no
call's writes feed the next, and its outcome is the call's alone: generation makes each call once per
tool behaviour (`deep_probes(reuse=True)`; `prepare_tool_calls` makes those that need no reference
solution while the model writes them: quality/ahead.py). Defects, each a failed `ProbeResult` naming
the tool, the arguments and the error:

- `VALID_INPUTS_PROBE`: a valid input crashes the tool (env_error);
- `INVALID_INPUTS_PROBE`: an invalid input crashes it or is written instead of refused;
- `READ_ONLY_PROBE`: a tool whose name says it reads (`READ_PREFIXES`) changed the database;
- `OWN_TABLES_PROBE`: a writing tool changed a table that is not its own (`own_tables`).

`BLOCKED_PROBE`: a task whose reference solution has a call that ends in a ToolError, or whose
instruction names a record (a quoted name, an email, a `#id`, a code) that the seed lacks, cannot
be completed as stated.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.sqlscript import deserialize
from worldsmith.models.bundle import TaskSpec, ToolSchema
from worldsmith.models.specs import ActingUser, TaskDraftSpec, TaskList
from worldsmith.quality.memo import content_digest
from worldsmith.quality.probes import ProbeResult, SeedValues, excerpt
from worldsmith.quality.schema import Range, TableSchema, read_schema
from worldsmith.quality.seedview import instruction_literals, literal_keys, missing_entities
from worldsmith.runtime.episode import Runtime, SandboxEpisode
from worldsmith.runtime.errors import RuntimeFault

VALID_INPUTS_PROBE = "tool runs on valid inputs"
INVALID_INPUTS_PROBE = "tool refuses invalid inputs"
READ_ONLY_PROBE = "read tool writes nothing"
OWN_TABLES_PROBE = "tool writes only its tables"
BLOCKED_PROBE = "task not blocked"
#: How `BLOCKED_PROBE` says a task names a record the seed lacks (the seed step's to fix).
MISSING_IN_SEED = "which no row of the seed holds"
#: The probes whose failure is the tool code's (stages/routing.py sends them to the tools' code step).
TOOL_CODE_DEEP_PROBES = frozenset({VALID_INPUTS_PROBE, INVALID_INPUTS_PROBE, READ_ONLY_PROBE, OWN_TABLES_PROBE})
#: A tool whose name starts with one of these says it only reads.
READ_PREFIXES = ("get", "list", "find", "search", "count")
#: Tables every writer may touch: logs and ledgers (by name), besides those most writers touch.
_SHARED_NAME = re.compile(r"(^|_)(logs?|audits?|history|histories|ledgers?|activity|activities)($|_)|_events?$")


@dataclass(frozen=True)
class DeepProbeBudget:
    """How many calls a tool gets: each parameter's values (`values_per_parameter`, keys spread over
    the table), one call per value, `combinations` Hypothesis draws of them all; at most `valid_calls`
    valid and `invalid_calls` invalid calls in all."""

    values_per_parameter: int = 8
    combinations: int = 16
    valid_calls: int = 32
    invalid_calls: int = 12
    #: A tool's valid calls stop after this many wrote (each write costs a restore: under strict
    #: isolation a fresh process, for an app its start); the tables of the first `looked_at_writes` are read.
    writing_calls: int = 3
    looked_at_writes: int = 3
    #: A tool's calls stop after this many crashed (one names the defect; each may cost a time limit).
    crashes: int = 2

    @classmethod
    def configured(cls) -> DeepProbeBudget:
        """The budget `WORLDSMITH_DEEP_PROBE_BUDGET` names: full, or quick (every value of every parameter
        is still called once; fewer drawn combinations and invalid calls)."""
        from worldsmith.settings import get_settings

        if get_settings().deep_probe_budget == "quick":
            return cls(combinations=4, valid_calls=12, invalid_calls=6)
        return cls()


# -- values from the seeded database -------------------------------------------------------------


def singular(word: str) -> str:
    """English singular of a table-name word (categories -> category, branches -> branch)."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if re.search(r"(ss|sh|ch|x|z)es$", word):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _words(text: str) -> list[str]:
    return [singular(w) for w in re.findall(r"[a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", text).lower())]


def _spread(values: list[Any], bound: int) -> list[Any]:
    """At most `bound` of `values`, first and last included, evenly spaced."""
    if len(values) <= bound:
        return list(values)
    if bound <= 1:
        return values[:bound]
    return [values[round(i * (len(values) - 1) / (bound - 1))] for i in range(bound)]


class WorldValues:
    """The seeded database as probe inputs: each table's declared constraints (quality/schema.py),
    its primary keys and each column's distinct values, in row order."""

    def __init__(self, world: bytes, bound: int, row_limit: int = 2_000):
        self.bound = bound
        conn = deserialize(world, read_only=True)
        try:
            self.tables: dict[str, TableSchema] = {t.name: t for t in read_schema(conn)}
            self.columns: dict[tuple[str, str], list[Any]] = {}
            for table in self.tables.values():
                cursor = conn.execute(f'SELECT * FROM "{table.name}" LIMIT {row_limit}')
                names = [d[0] for d in cursor.description]
                rows = cursor.fetchall()
                for position, name in enumerate(names):
                    seen = dict.fromkeys(r[position] for r in rows if r[position] is not None)
                    self.columns[(table.name, name)] = list(seen)
        finally:
            conn.close()
        self.seeds = SeedValues(world)

    def keys(self, table: str) -> tuple[list[Any], Any]:
        """Spread primary-key values of `table` (its single key column, else rowid-less: none), and
        a key it does not hold (None when it has no single key)."""
        schema = self.tables.get(table)
        if schema is None or len(schema.primary_key) != 1:
            return [], None
        held = self.columns.get((table, schema.primary_key[0]), [])
        numbers = [v for v in held if isinstance(v, int) and not isinstance(v, bool)]
        if numbers:
            unknown: Any = max(numbers) + 1000
        elif held:
            unknown = f"no-such-{singular(table)}"
        else:
            return [], None
        return _spread(held, self.bound), unknown

    def referenced_table(self, parameter: str) -> str | None:
        """The table an id parameter names: `<singular>_id` of a table, else the parent of a foreign
        key column of that name (`pickup_branch_id` -> branches)."""
        if not parameter.endswith("_id"):
            return None
        base = parameter[: -len("_id")]
        for name in self.tables:
            if singular(name) == base or name == base:
                return name
        for table in self.tables.values():
            for column, parent, _ in table.foreign_keys:
                if column == parameter and parent in self.tables:
                    return parent
        return None

    def holding(self, column: str, preferred: set[str]) -> list[TableSchema]:
        """Tables with a column `column`, those in `preferred` first."""
        found = [t for t in self.tables.values() if column in t.columns]
        return sorted(found, key=lambda t: t.name not in preferred)

    def enum(self, column: str, preferred: set[str]) -> tuple[list[Any], bool]:
        """The values a CHECK allows column `column` (a `preferred` table's first), and whether they
        are a `preferred` table's."""
        for table in self.holding(column, preferred):
            if column in table.enums:
                return list(table.enums[column]), table.name in preferred
        return [], False

    def range(self, column: str, preferred: set[str]) -> tuple[Range | None, bool]:
        """The range a CHECK bounds column `column` to, and whether it is a `preferred` table's."""
        for table in self.holding(column, preferred):
            if column in table.ranges:
                return table.ranges[column], table.name in preferred
        return None, False

    def column_values(self, column: str, preferred: set[str]) -> list[Any]:
        values: list[Any] = []
        for table in self.holding(column, preferred):
            values += self.columns.get((table.name, column), [])
        return _spread(list(dict.fromkeys(values)), self.bound)

    def text_values(self, tables: set[str]) -> list[Any]:
        """Identifying text of `tables` (their first text column that is not a key): what a search finds."""
        values: list[Any] = []
        for name in sorted(tables):
            table = self.tables[name]
            for column in table.columns:
                held = self.columns.get((name, column), [])
                if column not in table.primary_key and held and all(isinstance(v, str) for v in held):
                    values += _spread(held, 3)
                    break
        return values


# -- parameters and their values ------------------------------------------------------------------


def _kinds(schema: dict[str, Any]) -> tuple[set[str], bool]:
    """The JSON types a parameter schema accepts (anyOf/oneOf included), and whether null is one."""
    kinds: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        kinds.add(declared)
    elif isinstance(declared, list):
        kinds.update(declared)
    for option in schema.get("anyOf", []) + schema.get("oneOf", []):
        kinds |= _kinds(option)[0]
    nullable = "null" in kinds
    return (kinds - {"null"}) or ({"string"} if not schema.get("enum") else set()), nullable


def _fits(value: Any, kinds: set[str]) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return "boolean" in kinds
    if isinstance(value, int):
        return bool(kinds & {"integer", "number"})
    if isinstance(value, float):
        return "number" in kinds or ("integer" in kinds and value.is_integer())
    if isinstance(value, str):
        return "string" in kinds
    if isinstance(value, list):
        return "array" in kinds
    if isinstance(value, dict):
        return "object" in kinds
    return False


def _typed(value: Any, kinds: set[str]) -> Any:
    if isinstance(value, float) and value.is_integer() and "integer" in kinds and "number" not in kinds:
        return int(value)
    return value


def _boundaries(bounds: Range, kinds: set[str]) -> tuple[list[Any], list[Any]]:
    """Valid and invalid values at a range's ends."""
    step = 1 if "integer" in kinds or "number" not in kinds else 0.5
    valid, invalid = [], []
    if bounds.low is not None:
        low = bounds.low + step if bounds.strict_low else bounds.low
        valid.append(low)
        invalid.append(low - step)
    if bounds.high is not None:
        high = bounds.high - step if bounds.strict_high else bounds.high
        valid.append(high)
        invalid.append(high + step)
    return [_typed(v, kinds) for v in valid], [_typed(v, kinds) for v in invalid]


@dataclass
class ParameterValues:
    """The values one parameter is probed with."""

    valid: list[Any] = field(default_factory=list)
    invalid: list[tuple[Any, str]] = field(default_factory=list)  # (value, why it is invalid)


def parameter_values(
    name: str,
    schema: dict[str, Any],
    values: WorldValues,
    tables: set[str],
    reference: list[Any],
) -> ParameterValues:
    """Valid and invalid values of parameter `name` (JSON Schema `schema`) of a tool owning `tables`,
    `reference` being the values the reference solutions pass it."""
    kinds, nullable = _kinds(schema)
    found = ParameterValues()
    candidates: list[Any] = list(schema.get("examples") or [])
    if "example" in schema:
        candidates.append(schema["example"])
    candidates += [v for v in reference if v is not None]
    enum, owned = list(schema.get("enum") or []), True
    if not enum:  # a CHECK of a column of that name: invalid values only where it is the tool's table's
        enum, owned = values.enum(name, tables)
    candidates += enum
    if enum and owned and all(isinstance(v, str) for v in enum):
        found.invalid.append((f"not_a_{name}", f"not one of {enum}"))
    parent = values.referenced_table(name)
    if parent is not None:
        keys, unknown = values.keys(parent)
        candidates += keys
        if unknown is not None and _fits(unknown, kinds):
            found.invalid.append((unknown, f"no {singular(parent)} has it"))
    elif name in {c for t in values.tables.values() for c in t.columns}:
        candidates += values.column_values(name, tables)
    elif kinds == {"string"} and not enum:
        candidates += values.text_values(tables)
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    bounds, owned = (Range(minimum, maximum), True) if minimum is not None or maximum is not None else (None, False)
    if bounds is None:
        bounds, owned = values.range(name, tables)
    if bounds is not None and kinds & {"integer", "number"}:
        valid, invalid = _boundaries(bounds, kinds)
        candidates += valid
        if owned:
            found.invalid += [(v, "out of its range") for v in invalid]
    if "default" in schema and schema["default"] is not None:
        candidates.append(schema["default"])
    fitting = [_typed(v, kinds) for v in candidates if _fits(_typed(v, kinds), kinds)]
    if not fitting and "string" in kinds:
        fitting = [str(v) for v in candidates if v is not None and not isinstance(v, (list, dict))]
    if not fitting:
        fitting = [_composite(schema, kinds, values, tables)] if kinds & {"array", "object"} else []
    if not fitting:
        fitting = [values.seeds.value(name, schema)]
    unique = list({json.dumps(v, sort_keys=True, default=str): v for v in fitting}.values())
    found.valid = unique[: values.bound * 2]
    if nullable:
        found.valid.append(None)
    found.invalid = [(v, why) for v, why in found.invalid if v not in found.valid]
    return found


def _composite(schema: dict[str, Any], kinds: set[str], values: WorldValues, tables: set[str]) -> Any:
    """An array of one item, or an object of its required properties, drawn like parameters."""
    if "array" in kinds:
        items = schema.get("items") or {}
        item_kinds, _ = _kinds(items)
        if item_kinds & {"array", "object"}:
            return [_composite(items, item_kinds, values, tables)]
        return [parameter_values("item", items, values, tables, []).valid[0]]
    properties = schema.get("properties") or {}
    return {
        key: parameter_values(key, sub, values, tables, []).valid[0]
        for key, sub in properties.items()
        if key in schema.get("required", [])
    }


# -- the tools' own tables ------------------------------------------------------------------------


def named_tables(tool: ToolSchema, tables: dict[str, TableSchema]) -> set[str]:
    """Tables the tool's name or description names (a table's words, singular, in a row)."""
    words = _words(f"{tool.name} {tool.description}")
    text = f" {' '.join(words)} "
    return {name for name in tables if f" {' '.join(_words(name))} " in text}


def own_tables(named: set[str], footprint: set[str], shared: set[str], tables: dict[str, TableSchema]) -> set[str]:
    """A writing tool's own tables, conservatively: those it names (else, naming none, those its
    reference-solution calls wrote: a footprint that would otherwise hide the very write in question);
    the tables linked to them by a foreign key either way, and the other parents of their children (an
    order's items, and the products those items hold: stock); and the `shared` ones (logs, or what
    most writers write)."""
    core = named or footprint
    children = {t.name for t in tables.values() for _, parent, _ in t.foreign_keys if parent in core}
    parents = {parent for t in tables.values() if t.name in core | children for _, parent, _ in t.foreign_keys}
    return core | children | parents | shared


def is_read_tool(name: str) -> bool:
    """Whether the tool's name says it only reads (get_, list_, find_, search_, count_; or camelCase)."""
    first = _words(name)[:1]
    return bool(first) and (first[0] in READ_PREFIXES or singular(first[0]) in READ_PREFIXES)


# -- inputs ---------------------------------------------------------------------------------------

_HYPOTHESIS = threading.Lock()  # one Hypothesis run at a time in this process


@dataclass
class ToolInputs:
    """The argument sets one tool is probed with, and the values Hypothesis combines into more."""

    valid: list[dict[str, Any]]
    invalid: list[tuple[dict[str, Any], str]]  # (arguments, what is invalid)
    required: dict[str, list[Any]] = field(default_factory=dict)
    optional: dict[str, list[Any]] = field(default_factory=dict)


def combinations(inputs: dict[str, ToolInputs], count: int) -> dict[str, list[dict[str, Any]]]:
    """`count` Hypothesis draws (derandomized: the same every run) of one argument dict per tool: each
    required parameter one of its values, each optional one absent or one of its values. One run for
    every tool: a Hypothesis run costs more to start than to draw."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import strategies as st

    strategies = {
        name: st.fixed_dictionaries(
            {k: st.sampled_from(v) for k, v in found.required.items()},
            optional={k: st.sampled_from(v) for k, v in found.optional.items()},
        )
        for name, found in inputs.items()
        if found.required or found.optional
    }
    drawn: dict[str, list[dict[str, Any]]] = {name: [] for name in strategies}
    if not strategies:
        return drawn

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(st.fixed_dictionaries(strategies))
    def collect(arguments: dict[str, dict[str, Any]]) -> None:
        for name, one in arguments.items():
            drawn[name].append(one)

    with _HYPOTHESIS:
        collect()
    return drawn


def tool_inputs(
    tool: ToolSchema, values: WorldValues, tables: set[str], references: list[dict[str, Any]]
) -> ToolInputs:
    """The valid and invalid argument sets `tool` is probed with: the reference solutions' arguments,
    each value of each parameter once (the others at their first value, optional ones absent), all
    optional ones present; and each invalid value of a parameter with the others valid."""
    properties: dict[str, Any] = tool.parameters.get("properties") or {}
    required = [p for p in tool.parameters.get("required", []) if p in properties]
    per = {
        p: parameter_values(p, s, values, tables, [r[p] for r in references if p in r])
        for p, s in properties.items()
        if isinstance(s, dict)
    }
    base = {p: per[p].valid[0] for p in required if per.get(p) and per[p].valid}
    valid: list[dict[str, Any]] = [*references, dict(base)]
    for p, found in per.items():
        valid += [{**base, p: v} for v in found.valid]
    valid.append({**base, **{p: f.valid[0] for p, f in per.items() if f.valid and f.valid[0] is not None}})
    invalid = [({**base, p: v}, f"{p} {why}") for p, found in per.items() for v, why in found.invalid]
    return ToolInputs(
        valid,
        invalid,
        {p: per[p].valid for p in required if per.get(p) and per[p].valid},
        {p: f.valid for p, f in per.items() if p not in required and f.valid},
    )


def _distinct(arguments: list[dict[str, Any]], bound: int) -> list[dict[str, Any]]:
    return list({json.dumps(a, sort_keys=True, default=str): a for a in arguments}.values())[:bound]


# -- running them ---------------------------------------------------------------------------------


@dataclass
class _Outcome:
    arguments: dict[str, Any]
    status: str
    error: str | None
    changed: bool
    written: set[str]  # the tables it changed, where looked at (else empty)
    looked: bool = True  # whether `written` is known (the tables were looked at, or nothing changed)


def tool_behaviour_key(bundle: Bundle) -> str:
    """The digest of what a tool call's outcome on the pristine database depends on: the tools' code as
    the worker loads it, the world, its clock, the tools kind and the tool schemas (arguments are checked
    against them first). Not the tasks or the verifiers: the probes' calls are the same before they exist."""
    kind = bundle.tools_kind
    return content_digest(
        kind.name, kind.code_fields(bundle.files), bundle.world, bundle.clock, [t.model_dump() for t in bundle.tools]
    )


#: Outcomes of the deep probes' calls per `tool_behaviour_key`, by (tool, arguments as JSON), kept for
#: `deep_probes(reuse=True)`: every call is made on the pristine database, so the same code, world,
#: clock and schemas give the same arguments the same outcome. A crash (env_error) is never kept: a
#: time limit hit under load, a worker lost, are made again.
_CALLS: OrderedDict[str, dict[tuple[str, str], _Outcome]] = OrderedDict()
_CALLS_WORLDS = 64
_CALLS_LOCK = threading.Lock()


def _known_calls(bundle: Bundle) -> dict[tuple[str, str], _Outcome]:
    key = tool_behaviour_key(bundle)
    with _CALLS_LOCK:
        known = _CALLS.setdefault(key, {})
        _CALLS.move_to_end(key)
        while len(_CALLS) > _CALLS_WORLDS:
            _CALLS.popitem(last=False)
        return known


class _Stopped(Exception):
    """The probes' `stop` event was set: no further call is made."""


class _Prober:
    """Calls on one episode, each on the pristine database: after a call that wrote, the database is
    restored before the next call (lazily: a restore can cost a fresh process, and an app's start).
    With `known` (outcomes kept by call), a call kept there is not made again; a call made is kept."""

    def __init__(
        self,
        episode: SandboxEpisode,
        world: bytes,
        known: dict[tuple[str, str], _Outcome] | None = None,
        stop: threading.Event | None = None,
    ):
        self.episode, self.world, self.dirty = episode, world, False
        self.known, self.stop = known, stop
        self.made = 0  # calls made in the sandbox (not answered from `known`)

    def fresh(self) -> None:
        if self.dirty:
            self.episode.restore(None)
            self.dirty = False

    def call(self, tool: str, arguments: dict[str, Any], *, look: bool = True) -> _Outcome:
        """Call `tool` on the pristine database; with `look`, the tables a writing call changed. A
        runtime fault around the call (its episode could not be restored or diffed) is its env_error."""
        key = (tool, json.dumps(arguments, sort_keys=True, default=str))
        kept = self.known.get(key) if self.known is not None else None
        if kept is not None and (kept.looked or not look):
            return replace(kept, arguments=arguments, written=set(kept.written) if look else set())
        if self.stop is not None and self.stop.is_set():
            raise _Stopped
        self.made += 1
        try:
            self.fresh()
            result = self.episode.call_tool(tool, arguments)
            self.dirty = result.changed
            written = set(self.episode.diff(self.world).tables) if result.changed and look else set()
        except RuntimeFault as fault:
            self.dirty = True
            return _Outcome(arguments, "env_error", f"runtime fault: {fault}", False, set())
        outcome = _Outcome(arguments, result.status, result.error, result.changed, written, look or not result.changed)
        if self.known is not None and outcome.status != "env_error":
            self.known[key] = replace(outcome, arguments=dict(arguments), written=set(written))
        return outcome


@dataclass
class _References:
    """What replaying every reference solution showed: per tool the arguments it was called with and
    the tables its calls wrote; per task the step that ended in a ToolError."""

    arguments: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    footprints: dict[str, set[str]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def _replay_references(prober: _Prober, bundle: Bundle) -> _References:
    found = _References()
    episode = prober.episode
    for task in bundle.tasks:
        if not task.solution:
            continue
        prober.fresh()
        before = bundle.world
        for number, step in enumerate(task.solution, start=1):
            found.arguments.setdefault(step.tool, []).append(dict(step.arguments))
            result = episode.call_tool(step.tool, step.arguments)
            prober.dirty |= result.changed
            if result.status == "tool_error":
                found.refused[task.id] = (
                    f"step {number} ({step.tool} {excerpt(step.arguments)}) ends in a ToolError: "
                    + excerpt(result.error or "")
                )
            if not result.ok:
                break
            if result.changed:
                now = episode.snapshot()
                found.footprints.setdefault(step.tool, set()).update(episode.diff(before, now).tables)
                before = now
    return found


def blocked_tasks(bundle: Bundle, refused: dict[str, str]) -> list[ProbeResult]:
    """`BLOCKED_PROBE` per task: its reference solution has no refused call (`refused`, by task id),
    and every record its instruction names is in the seed (quality/seedview.py): its quoted names,
    emails, `#ids` and codes but the values its reference solution writes; without a reference
    solution (imported tasks) only its `#ids` and codes, as a new name or comment cannot be told
    from an existing one."""
    tasks = []
    for task in bundle.tasks:
        literals = _literals(task.instruction)
        if task.solution:
            written = _written_values(task)
            named = [v for v in literals if not literal_keys(v) & written]
        else:
            named = [v for v in literals if "@" not in v and instruction_literals(v) == [v]]
        tasks.append(TaskDraftSpec.model_construct(id=task.id, instruction=task.instruction, entities=named))
    missing = missing_entities(bundle.world, TaskList.model_construct(acting_user=ActingUser(role="user"), tasks=tasks))
    results = []
    for task in bundle.tasks:
        reasons = []
        if task.id in refused:
            reasons.append(refused[task.id])
        if missing.get(task.id):
            reasons.append(f"its instruction names {missing[task.id]}, {MISSING_IN_SEED}")
        results.append(ProbeResult(BLOCKED_PROBE, task.id, not reasons, "; ".join(reasons) or "not blocked"))
    return results


_APOSTROPHE = re.compile(r"(?<=\w)'(?=\w)")
_KEPT = "\ue000"  # an apostrophe inside a word while quotes are looked for


def _literals(instruction: str) -> list[str]:
    """instruction_literals, an apostrophe inside a word ("won't", "O'Brien") not taken for a quote."""
    kept = _APOSTROPHE.sub(_KEPT, instruction)
    return [literal.replace(_KEPT, "'") for literal in instruction_literals(kept)]


def _written_values(task: TaskSpec) -> set[str]:
    """The comparable forms of the values `task`'s reference solution passes to tools that do not
    only read (new names, new emails: the instruction names them, the seed need not hold them)."""
    keys: set[str] = set()
    for step in task.solution:
        if is_read_tool(step.tool):
            continue
        for value in _leaves(step.arguments):
            keys |= literal_keys(str(value))
    return keys


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _failed(probe: str, tool: str, bad: list[_Outcome], calls: int, what: str) -> ProbeResult:
    first = bad[0]
    return ProbeResult(
        probe,
        tool,
        False,
        f"{what} on {len(bad)} of {calls} calls; first {excerpt(first.arguments)}: "
        f"{first.status}: {excerpt(first.error or '')}",
    )


@dataclass
class _Probed:
    """One tool's calls: valid, invalid (with why), and how many valid ones the budget left out."""

    valid: list[_Outcome] = field(default_factory=list)
    invalid: list[tuple[_Outcome, str]] = field(default_factory=list)
    left_out: int = 0

    @property
    def every(self) -> list[_Outcome]:
        return self.valid + [o for o, _ in self.invalid]

    @property
    def written(self) -> set[str]:
        return set().union(*(o.written for o in self.every))


def _probe_tool(
    prober: _Prober, name: str, valid: list[dict], invalid: list[tuple[dict, str]], budget: DeepProbeBudget
) -> _Probed:
    """Run one tool's calls within `budget`: its valid calls stop after `writing_calls` wrote, all its
    calls after `crashes` crashed (a tool that times out would otherwise cost its limit per call)."""
    probed = _Probed()
    writes = crashes = 0
    for arguments in valid:
        if writes >= budget.writing_calls or crashes >= budget.crashes:
            probed.left_out += 1
            continue
        outcome = prober.call(name, arguments, look=writes < budget.looked_at_writes)
        writes += outcome.changed
        crashes += outcome.status == "env_error"
        probed.valid.append(outcome)
    for arguments, why in invalid:
        if crashes >= budget.crashes:
            break
        outcome = prober.call(name, arguments)
        crashes += outcome.status == "env_error"
        probed.invalid.append((outcome, why))
    return probed


def _judged(tool: ToolSchema, probed: _Probed, own: set[str] | None) -> list[ProbeResult]:
    """The deep probes' verdicts on one tool; `own`: its own tables (None: not judged, it reads or
    names none)."""
    name, results = tool.name, []
    crashed = [o for o in probed.valid if o.status == "env_error"]
    left_out = f" ({probed.left_out} more left out: budget)" if probed.left_out else ""
    results.append(
        _failed(VALID_INPUTS_PROBE, name, crashed, len(probed.valid), "env_error")
        if crashed
        else ProbeResult(VALID_INPUTS_PROBE, name, True, f"{len(probed.valid)} valid inputs, no crash{left_out}")
    )
    if probed.invalid:
        wrong = [(o, why) for o, why in probed.invalid if o.status == "env_error" or (o.status == "ok" and o.changed)]
        if wrong:
            outcome, why = wrong[0]
            what = "crashed" if outcome.status == "env_error" else f"wrote {sorted(outcome.written)}"
            detail = (
                f"{what} on {len(wrong)} of {len(probed.invalid)} invalid inputs; first {excerpt(outcome.arguments)}"
                f" ({why}): {outcome.status}: {excerpt(outcome.error or 'no error')}"
            )
            results.append(ProbeResult(INVALID_INPUTS_PROBE, name, False, detail))
        else:
            results.append(ProbeResult(INVALID_INPUTS_PROBE, name, True, f"{len(probed.invalid)} refused"))
    if is_read_tool(name):
        wrote = [o for o in probed.every if o.changed]
        results.append(
            _failed(READ_ONLY_PROBE, name, wrote, len(probed.every), f"wrote {sorted(probed.written)}")
            if wrote
            else ProbeResult(READ_ONLY_PROBE, name, True, "changed nothing")
        )
    elif own is not None and probed.written:
        outside = [o for o in probed.every if o.written - own]
        results.append(
            _failed(OWN_TABLES_PROBE, name, outside, len(probed.every), f"wrote {sorted(probed.written - own)}")
            if outside
            else ProbeResult(OWN_TABLES_PROBE, name, True, f"wrote {sorted(probed.written)}")
        )
    return results


def deep_probes(
    runtime: Runtime,
    bundle: Bundle,
    *,
    skip: frozenset[str] = frozenset(),
    budget: DeepProbeBudget | None = None,
    reuse: bool = False,
) -> list[ProbeResult]:
    """The deep tool probes of every tool (but those in `skip`: already found crashing) and
    `BLOCKED_PROBE` of every task; see the module docstring. With `reuse`, a call whose outcome this
    process keeps for the same tool behaviour (`tool_behaviour_key`: an earlier round, or
    `prepare_tool_calls` while the model wrote the tasks' solutions) is not made again."""
    known = _known_calls(bundle) if reuse else None
    results, _ = _deep_probes(runtime, bundle, skip, budget or DeepProbeBudget.configured(), known)
    return results


def prepare_tool_calls(runtime: Runtime, bundle: Bundle, stop: threading.Event | None = None) -> int:
    """Make the deep probes' calls of `bundle`'s tools that need no reference solution (those of the
    bundle without its tasks), keeping their outcomes for `deep_probes(reuse=True)` of every bundle of the
    same tool behaviour; no call is made once `stop` is set. Returns how many calls were made."""
    tools_only = replace(bundle, tasks=())
    _, made = _deep_probes(runtime, tools_only, frozenset(), DeepProbeBudget.configured(), _known_calls(bundle), stop)
    return made


def _deep_probes(
    runtime: Runtime,
    bundle: Bundle,
    skip: frozenset[str],
    budget: DeepProbeBudget,
    known: dict[tuple[str, str], _Outcome] | None,
    stop: threading.Event | None = None,
) -> tuple[list[ProbeResult], int]:
    """The deep probes' results and the calls made for them ([] once `stop` was set)."""
    values = WorldValues(bundle.world, budget.values_per_parameter)
    named = {tool.name: named_tables(tool, values.tables) for tool in bundle.tools}
    with runtime.open_episode(bundle) as episode:
        prober = _Prober(episode, bundle.world, known, stop)
        try:
            references = _replay_references(prober, bundle)
            inputs = {
                tool.name: tool_inputs(tool, values, named[tool.name], references.arguments.get(tool.name, []))
                for tool in bundle.tools
                if tool.name not in skip
            }
            if stop is not None and stop.is_set():
                raise _Stopped
            drawn = combinations(inputs, budget.combinations)
            probed = {
                name: _probe_tool(
                    prober,
                    name,
                    _distinct(found.valid + drawn.get(name, []), budget.valid_calls),
                    found.invalid[: budget.invalid_calls],
                    budget,
                )
                for name, found in inputs.items()
            }
        except _Stopped:
            return [], prober.made
    writing = [name for name, p in probed.items() if p.written and not is_read_tool(name)]
    counts = Counter(table for name in writing for table in probed[name].written)
    shared = {t for t in values.tables if _SHARED_NAME.search(t)}
    shared |= {t for t, n in counts.items() if len(writing) >= 3 and n * 2 > len(writing)}
    results: list[ProbeResult] = []
    for tool in bundle.tools:
        if tool.name not in probed:
            continue
        mine = named[tool.name] | references.footprints.get(tool.name, set())
        own = own_tables(named[tool.name], references.footprints.get(tool.name, set()), shared, values.tables)
        results += _judged(tool, probed[tool.name], own if mine else None)
    return results + blocked_tasks(bundle, references.refused), prober.made
