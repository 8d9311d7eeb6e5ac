"""The probes' calls, each on the pristine database of one episode (`PristineCalls`: restored after a call
that wrote). The deep probes' (quality/deep_probes.py): a `Prober` keeps each call's outcome by the tool behaviour
it depends on (`tool_behaviour_key`: calls made for an earlier round, or ahead while the model writes,
are not made again), and replays the reference solutions for what they show (`replay_references`)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.results import ToolResult
from worldsmith.quality.memo import content_digest
from worldsmith.quality.probes import excerpt
from worldsmith.runtime.episode import SandboxEpisode
from worldsmith.runtime.errors import RuntimeFault


@dataclass
class CallOutcome:
    """One probe call's outcome: its result's status, error (with the sandbox limit it names and the
    module of a refused import), whether it changed the database and which tables."""

    arguments: JsonObject
    status: str
    error: str | None
    changed: bool
    written: set[str]  # the tables it changed, where looked at (else empty)
    looked: bool = True  # whether `written` is known (the tables were looked at, or nothing changed)
    limit: str | None = None
    refused_module: str | None = None


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
_CALLS: OrderedDict[str, dict[tuple[str, str], CallOutcome]] = OrderedDict()
_CALLS_WORLDS = 64
_CALLS_LOCK = threading.Lock()


def known_calls(bundle: Bundle) -> dict[tuple[str, str], CallOutcome]:
    """The outcomes kept for `bundle`'s tool behaviour (filled by the calls made with it)."""
    key = tool_behaviour_key(bundle)
    with _CALLS_LOCK:
        known = _CALLS.setdefault(key, {})
        _CALLS.move_to_end(key)
        while len(_CALLS) > _CALLS_WORLDS:
            _CALLS.popitem(last=False)
        return known


class Stopped(Exception):
    """The probes' `stop` event was set: no further call is made."""


class PristineCalls:
    """Calls on one episode, each on the pristine database: after a call that wrote, the database is
    restored before the next call (lazily: a restore can cost a fresh process, and an app's start). What the
    deep probes (`Prober`) and the behaviour probes (quality/behaviour_calls.Caller) call through."""

    def __init__(self, episode: SandboxEpisode, world: bytes):
        self.episode, self.world, self.dirty = episode, world, False
        self.made = 0  # calls made in the sandbox (not answered from what was kept)

    def fresh(self) -> None:
        if self.dirty:
            self.episode.restore(None)
            self.dirty = False

    def call_fresh(self, tool: str, arguments: JsonObject) -> ToolResult:
        """`tool` called on the pristine database; a runtime fault (the episode could not be restored, or
        its worker was lost) propagates, the database then taken as changed."""
        self.made += 1
        try:
            self.fresh()
            result = self.episode.call_tool(tool, arguments)
        except RuntimeFault:
            self.dirty = True
            raise
        self.dirty = result.changed
        return result


class Prober(PristineCalls):
    """`PristineCalls` answering with outcomes (no values). With `known` (outcomes kept by call), a call kept
    there is not made again; a call made is kept."""

    def __init__(
        self,
        episode: SandboxEpisode,
        world: bytes,
        known: dict[tuple[str, str], CallOutcome] | None = None,
        stop: threading.Event | None = None,
    ):
        super().__init__(episode, world)
        self.known, self.stop = known, stop

    def call(self, tool: str, arguments: JsonObject, *, look: bool = True) -> CallOutcome:
        """Call `tool` on the pristine database; with `look`, the tables a writing call changed. A
        runtime fault around the call (its episode could not be restored or diffed) is its env_error."""
        key = (tool, json.dumps(arguments, sort_keys=True, default=str))
        kept = self.known.get(key) if self.known is not None else None
        if kept is not None and (kept.looked or not look):
            return replace(kept, arguments=arguments, written=set(kept.written) if look else set())
        if self.stop is not None and self.stop.is_set():
            raise Stopped
        try:
            result = self.call_fresh(tool, arguments)
            written = set(self.episode.diff(self.world).tables) if result.changed and look else set()
        except RuntimeFault as fault:
            self.dirty = True
            return CallOutcome(arguments, "env_error", f"runtime fault: {fault}", False, set())
        looked = look or not result.changed
        outcome = CallOutcome(
            arguments, result.status, result.error, result.changed, written, looked, result.limit, result.refused_module
        )
        if self.known is not None and outcome.status != "env_error":
            self.known[key] = replace(outcome, arguments=dict(arguments), written=set(written))
        return outcome


@dataclass(frozen=True)
class RefusedStep:
    """A step of a reference solution that ended in a ToolError: which (`step N (tool)`), and in words."""

    step: str
    detail: str


@dataclass
class References:
    """What replaying every reference solution showed: per tool the arguments it was called with and
    the tables its calls wrote; per task the step that ended in a ToolError."""

    arguments: dict[str, list[JsonObject]] = field(default_factory=dict)
    footprints: dict[str, set[str]] = field(default_factory=dict)
    refused: dict[str, RefusedStep] = field(default_factory=dict)


def reference_arguments(bundle: Bundle) -> dict[str, list[JsonObject]]:
    """The arguments each tool is called with in the tasks' reference solutions, by tool name."""
    arguments: dict[str, list[JsonObject]] = {}
    for task in bundle.tasks:
        for step in task.solution:
            arguments.setdefault(step.tool, []).append(dict(step.arguments))
    return arguments


def replay_references(prober: Prober, bundle: Bundle) -> References:
    """Replay every task's reference solution on `prober`'s episode, each from the pristine database."""
    found = References()
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
                found.refused[task.id] = RefusedStep(
                    f"step {number} ({step.tool})",
                    f"step {number} ({step.tool} {excerpt(step.arguments)}) ends in a ToolError: "
                    + excerpt(result.error or ""),
                )
            if not result.ok:
                break
            if result.changed:
                now = episode.snapshot()
                found.footprints.setdefault(step.tool, set()).update(episode.diff(before, now).tables)
                before = now
    return found
