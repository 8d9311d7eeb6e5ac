"""A bundle's tools as the MCP gateway describes them: behaviour hints, input and output schemas.

Input schemas are `tools.json` as it is (enums, ranges, defaults and all). Output schemas come from
the return annotations of `tools.py` (the native tools kind): `-> dict` is an object schema and the
value is the structured content; any other annotation is `{"result": <its schema>}` and the value is
wrapped in it; a tool without one (or an ASGI route) gets the generic object schema, its value
wrapped unless it is an object.

The hints (`ToolAnnotations`) are derived from what the tools were seen to do, then their names:

- evidence: every reference solution replayed in a fresh episode, and every tool no solution calls
  probed once with arguments from the seed data (as `env check` does). A call "writes" when the
  database differs after it; each write is repeated at once with the same arguments (then undone).
- `readOnlyHint`: true only when no call of the tool was seen to write and its name starts with a
  reading verb (`READING_VERBS`); a tool seen to write is never read-only, whatever its name.
- `destructiveHint` (tools not read-only): false only when the tool was seen to write and every write
  only inserted rows, and its name does not start with a destroying verb (`DESTROYING_VERBS`); true
  otherwise (the MCP default: what was never seen is not promised).
- `idempotentHint` (tools not read-only): true only when the tool was seen to write and no repeat of
  a write changed the database again; false otherwise.
- `openWorldHint`: false: a tool reaches its episode's database and nothing else (the sandbox has no
  network).

Read-only tools are also marked non-destructive and idempotent, which they trivially are.
"""

from __future__ import annotations

import ast
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import mcp_types as types

from worldsmith.bundle.codepolicy import parse_source
from worldsmith.bundle.contract import Bundle, jsonschema_error
from worldsmith.bundle.toolspec import annotation_schema
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.quality.probes import SeedValues, sample_arguments
from worldsmith.runtime.answers import answer
from worldsmith.runtime.episode import Runtime, SandboxEpisode

# fmt: off
#: A name starting with one of these (up to the first `_` or capital) reads, unless a call was seen to write.
READING_VERBS = frozenset({
    "get", "find", "list", "search", "lookup", "look", "view", "show", "fetch", "query", "describe", "browse",
    "count", "calculate", "compute", "estimate", "preview", "quote", "retrieve", "summarize", "compare", "is", "has",
    "can",
})
#: A name starting with one of these may destroy data, whatever its calls were seen to do.
DESTROYING_VERBS = frozenset({
    "delete", "remove", "cancel", "drop", "purge", "clear", "revoke", "void", "reject", "deactivate", "disable",
    "archive", "close", "terminate", "reset", "unsubscribe", "withdraw", "discard", "erase", "destroy", "wipe",
    "unlink", "unassign",
})
# fmt: on
#: The output schema of a tool whose return type is unknown: its structured content is always an object.
GENERIC_OUTPUT: JsonObject = {"type": "object"}
_VERB = re.compile(r"[a-z]+")


@dataclass
class ToolEvidence:
    """What calls of one tool were seen to do."""

    succeeded: int = 0  # calls that returned a value
    writes: int = 0  # of those, calls after which the database differed
    overwrites: int = 0  # writes that updated or deleted existing rows
    repeated_with_effect: int = 0  # writes whose repeat with the same arguments changed the database again


def verb(name: str) -> str:
    """The leading word of a tool's name: `get` of `get_order` and of `getOrder`."""
    found = _VERB.match(name)
    return found.group(0) if found else ""


def tool_annotations(name: str, evidence: ToolEvidence | None) -> types.ToolAnnotations:
    """The hints of tool `name` from what its calls were seen to do (None: never seen to succeed)."""
    seen = evidence or ToolEvidence()
    if not seen.writes and verb(name) in READING_VERBS:
        return types.ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        )
    only_inserts = seen.writes > 0 and not seen.overwrites and verb(name) not in DESTROYING_VERBS
    return types.ToolAnnotations(
        read_only_hint=False,
        destructive_hint=not only_inserts,
        idempotent_hint=seen.writes > 0 and not seen.repeated_with_effect,
        open_world_hint=False,
    )


class _Replay:
    """Calls in one episode, each recorded in its tool's evidence. The database as it was after the last
    write is kept (`state`), so a call that wrote is diffed against it: a reading call costs one request."""

    def __init__(self, episode: SandboxEpisode, world: bytes):
        self.episode = episode
        self.state = world
        self.faults = 0  # calls the environment failed (env_error): what they would have shown is unknown

    def call(self, tool: str, arguments: JsonObject, seen: ToolEvidence) -> None:
        """Call `tool` once, recording what it did; a write is repeated with the same arguments, then undone."""
        result = self.episode.call_tool(tool, arguments)
        if not result.ok:
            self.faults += result.status == "env_error"
            return
        seen.succeeded += 1
        if not result.changed:
            return
        diff = self.episode.diff(self.state)
        if diff.empty:
            return
        seen.writes += 1
        if any(t.updated or t.deleted for t in diff.tables.values()):
            seen.overwrites += 1
        self.state = self.episode.snapshot()
        again = self.episode.call_tool(tool, arguments)
        if again.ok and again.changed:
            if not self.episode.diff(self.state).empty:
                seen.repeated_with_effect += 1
            self.episode.restore(self.state)


#: Evidence kept per process by runtime key, the most recently used `OBSERVED_KEPT` worlds (a gateway
#: of thousands of worlds unloads them past `--max-loaded`; their evidence goes too, past this bound).
OBSERVED_KEPT = 256
_OBSERVED: OrderedDict[str, dict[str, ToolEvidence]] = OrderedDict()
_OBSERVED_LOCK = threading.Lock()


def observe(runtime: Runtime, bundle: Bundle) -> dict[str, ToolEvidence]:
    """Evidence of what each tool of `bundle` does: its reference solutions replayed, the other tools
    probed. What a hostile environment makes fail (an episode that does not open, a worker that keeps
    dying) leaves the tools it concerns without evidence; it is not an error here. Kept for the
    process (by the bundle's runtime key, `OBSERVED_KEPT` worlds at most) when nothing failed."""
    with _OBSERVED_LOCK:
        if bundle.runtime_key in _OBSERVED:
            _OBSERVED.move_to_end(bundle.runtime_key)
            return _OBSERVED[bundle.runtime_key]
    evidence = {tool.name: ToolEvidence() for tool in bundle.tools}
    runs: list[list[tuple[str, JsonObject]]] = [
        [(step.tool, step.arguments) for step in task.solution] for task in bundle.tasks
    ]
    solved = {tool for run in runs for tool, _ in run}
    unsolved = [t for t in bundle.tools if t.name not in solved]
    if unsolved:
        seeds = SeedValues(bundle.world)
        runs.append([(t.name, sample_arguments(t.model_dump(), seeds)) for t in unsolved])
    complete = True
    for calls in runs:
        try:
            with runtime.open_episode(bundle) as episode:
                replay = _Replay(episode, bundle.world)
                for tool, arguments in calls:
                    if tool in evidence:
                        replay.call(tool, arguments, evidence[tool])
                complete = complete and not replay.faults
        except Exception as exc:  # what a hostile environment can cause ends this replay only
            if answer(exc) is None:
                raise
            complete = False
    if complete:
        with _OBSERVED_LOCK:
            _OBSERVED[bundle.runtime_key] = evidence
            while len(_OBSERVED) > OBSERVED_KEPT:
                _OBSERVED.popitem(last=False)
    return evidence


def return_schemas(bundle: Bundle) -> dict[str, JsonObject]:
    """JSON Schemas of the return annotations of `bundle`'s native tools, by tool name (the tools
    without one, or with one JSON Schema cannot say, are left out)."""
    if bundle.manifest.tools_kind is not None or "tools.py" not in bundle.files:
        return {}
    try:
        tree = parse_source(bundle.text("tools.py"), "tools.py")
    except SyntaxError:
        return {}
    names = {t.name for t in bundle.tools}
    schemas = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.FunctionDef) and node.name in names and node.returns is not None:
            try:
                schemas[node.name] = annotation_schema(node.returns)
            except (ValueError, SyntaxError):
                continue
    return schemas


@dataclass(frozen=True)
class OutputShape:
    """How a tool's value becomes its structured content, and the schema that content follows."""

    schema: JsonObject
    wrapped: bool | None  # True: always {"result": value}; False: the value itself; None: wrapped unless an object
    validator: jsonschema.protocols.Validator | None = None  # None: any object follows the schema
    #: The JSON types the value may have, where that is all its schema says (None: it says more)
    value_types: frozenset[str] | None = None

    @classmethod
    def of(cls, returns: JsonObject | None) -> OutputShape:
        """The shape of a tool whose return annotation has JSON Schema `returns` (None: unknown)."""
        if returns is None:
            return cls(GENERIC_OUTPUT, None, value_types=JSON_TYPES)
        if returns.get("type") == "object":
            schema, wrapped = returns, False
        else:
            schema, wrapped = {"type": "object", "properties": {"result": returns}, "required": ["result"]}, True
        return cls(schema, wrapped, jsonschema.Draft202012Validator(schema), _types_only(returns))

    def structured(self, value: Any) -> tuple[Any, str | None]:
        """The structured content of `value`, and why it breaks the schema (None: it follows it)."""
        wrap = self.wrapped if self.wrapped is not None else not isinstance(value, dict)
        content = {"result": value} if wrap else value
        if self.validator is None:
            return content, None
        return content, jsonschema_error(self.validator, content)

    def structured_kind(self, kind: str) -> tuple[bool, str | None] | None:
        """For a value passed on as JSON text whose kind is `kind` (object, array or string, as
        serving/jsontext.py tells): whether its structured content wraps it, and why it breaks the
        schema (None: it follows it). None where only the value can tell (a scalar, or a schema that
        says more than the type): decode it and call `structured`."""
        if kind not in ("object", "array", "string") or self.value_types is None:
            return None
        wrap = self.wrapped if self.wrapped is not None else kind != "object"
        if kind in self.value_types:
            return wrap, None
        where = "argument result: " if self.wrapped else ""
        return wrap, f"{where}a JSON {kind} is not of type {', '.join(repr(t) for t in sorted(self.value_types))}"


#: Every type a JSON Schema names.
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def _types_only(schema: Mapping[str, JsonValue]) -> frozenset[str] | None:
    """The JSON types `schema` allows where that is all it says (`{}`: any; a union of such schemas),
    else None."""
    if set(schema) <= {"type", "description", "title"}:
        named = schema.get("type")
        if named is None:
            return JSON_TYPES
        names = [named] if isinstance(named, str) else named if isinstance(named, list) else []
        return frozenset(n for n in names if isinstance(n, str)) or None
    if set(schema) == {"anyOf"} and isinstance(schema["anyOf"], list):
        members = [_types_only(member) if isinstance(member, dict) else None for member in schema["anyOf"]]
        known = [m for m in members if m is not None]
        return frozenset[str]().union(*known) if len(known) == len(members) else None
    return None


def output_shapes(bundle: Bundle) -> dict[str, OutputShape]:
    """The output shape of each of `bundle`'s tools, by name (static: read from its sources)."""
    returns = return_schemas(bundle)
    return {t.name: OutputShape.of(returns.get(t.name)) for t in bundle.tools}


def mcp_tools(bundle: Bundle, outputs: dict[str, OutputShape], evidence: dict[str, ToolEvidence]) -> list[types.Tool]:
    """`bundle`'s tools for `tools/list`: input schemas as written, output schemas, hints from `evidence`."""
    return [
        types.Tool(
            name=t.name,
            description=t.description,
            input_schema=t.parameters,
            output_schema=outputs[t.name].schema,
            annotations=tool_annotations(t.name, evidence.get(t.name)),
        )
        for t in bundle.tools
    ]
