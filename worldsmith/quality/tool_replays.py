"""Determinism replays of every tool (`Probe.TOOL_DETERMINISTIC`), not only those in reference solutions.

Each tool's calls (its reference solutions' arguments, then valid seed inputs: quality/tool_inputs.py) run as
one sequence from the pristine database, once on the given runtime and again in each of `replays` separate
sandbox worker processes (a fresh `Runtime` of one worker each; the replays run at once): every real-time source the code can read
shifted by `REPLAY_CLOCK_SKEW_S` past the world clock, other random seeds (an episode's seeds derive from its
id), and another hash seed (workers start with `python -I`, so each process draws its own: set iteration
order over strings differs between processes, never between episodes of one worker). A call whose result, or
a sequence whose end database, differs is a `ProbeFailure.TOOL_REPLAY_DIFFERS` naming the tool and the
arguments: the tool reads the wall clock beyond the world clock, unseeded randomness, or set iteration order.
A call that broke a sandbox limit in either replay (a time limit under load) is not compared."""

from __future__ import annotations

from dataclasses import dataclass

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.results import ToolResult
from worldsmith.quality.concurrently import together
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import REPLAY_CLOCK_SKEW_S, excerpt
from worldsmith.quality.tool_calls import reference_arguments
from worldsmith.quality.tool_inputs import distinct, tool_inputs
from worldsmith.quality.tool_tables import named_tables
from worldsmith.quality.world_values import world_values
from worldsmith.runtime.episode import Runtime

_DIFFERS = "differs between replays in separate processes (real clock shifted, other random and hash seeds)"


@dataclass(frozen=True)
class ReplayBudget:
    """`calls_per_tool` calls of each tool, replayed in `replays` separate processes."""

    calls_per_tool: int = 3
    replays: int = 2


@dataclass
class _ToolRun:
    """One replay of one tool's calls: each call's result, and the database after them (None: none wrote)."""

    results: list[ToolResult]
    end: bytes | None


def tool_sequences(
    bundle: Bundle, calls_per_tool: int, skip: frozenset[str] = frozenset()
) -> dict[str, list[JsonObject]]:
    """The calls each tool (but those in `skip`) is replayed with."""
    values = world_values(bundle.world, 8)
    references = reference_arguments(bundle)
    return {
        tool.name: distinct(
            tool_inputs(tool, values, named_tables(tool, values.tables), references.get(tool.name, [])).valid,
            calls_per_tool,
        )
        for tool in bundle.tools
        if tool.name not in skip
    }


def _replay(
    runtime: Runtime, bundle: Bundle, sequences: dict[str, list[JsonObject]], skew: float
) -> dict[str, _ToolRun]:
    """Every tool's calls on one episode, each tool's from the pristine database."""
    runs: dict[str, _ToolRun] = {}
    with runtime.open_episode(bundle, clock_skew_s=skew) as episode:
        dirty = False
        for tool, calls in sequences.items():
            if dirty:
                episode.reset()
            results = [episode.call_tool(tool, arguments) for arguments in calls]
            dirty = any(r.changed for r in results)
            runs[tool] = _ToolRun(results, episode.snapshot() if dirty else None)
    return runs


def _shown(result: ToolResult) -> str:
    return excerpt(result.value) if result.ok else f"{result.status}: {excerpt(result.error or '')}"


def _compared(
    runtime: Runtime, bundle: Bundle, tool: str, calls: list[JsonObject], first: _ToolRun, other: _ToolRun
) -> ProbeResult | None:
    """The first difference between two replays of `tool`'s calls, as a failure (None: they agree)."""
    for arguments, a, b in zip(calls, first.results, other.results):
        if a.limit or b.limit:
            return None  # a limit (a time limit under load) is not the tool's behaviour
        if (a.status, a.value, a.error, a.changed) != (b.status, b.value, b.error, b.changed):
            detail = f"its result for {excerpt(arguments)} {_DIFFERS}: {_shown(a)} vs {_shown(b)}"
            return ProbeResult.failing(ProbeFailure.TOOL_REPLAY_DIFFERS, tool, detail, cause=excerpt(arguments))
    if first.end is not None and other.end is not None and first.end != other.end:
        with runtime.open_episode(bundle) as episode:
            changes = episode.diff(first.end, other.end)
        if not changes.empty:
            table = next(iter(changes.tables))
            detail = f"the database after its calls {excerpt(calls)} {_DIFFERS}: table {table}"
            return ProbeResult.failing(ProbeFailure.TOOL_REPLAY_DIFFERS, tool, detail, cause=excerpt(calls))
    return None


def replay_tools(
    runtime: Runtime, bundle: Bundle, *, skip: frozenset[str] = frozenset(), budget: ReplayBudget | None = None
) -> list[ProbeResult]:
    """`Probe.TOOL_DETERMINISTIC` of every tool but those in `skip`; see the module docstring."""
    budget = budget or ReplayBudget()
    sequences = tool_sequences(bundle, budget.calls_per_tool, skip)

    def separately() -> dict[str, _ToolRun]:
        with Runtime(runtime.limits, workers=1) as separate:  # a process of its own: its own hash seed
            return _replay(separate, bundle, sequences, REPLAY_CLOCK_SKEW_S)

    # the replays at once: the processes start while the first replays run
    first, *others = together([lambda: _replay(runtime, bundle, sequences, 0.0)] + [separately] * budget.replays)
    failures: dict[str, ProbeResult] = {}
    for other in others:
        for tool, calls in sequences.items():
            if tool not in failures and (found := _compared(runtime, bundle, tool, calls, first[tool], other[tool])):
                failures[tool] = found
    return [
        failures.get(tool)
        or ProbeResult.passing(
            Probe.TOOL_DETERMINISTIC, tool, f"{len(calls)} calls alike in {budget.replays + 1} processes"
        )
        for tool, calls in sequences.items()
    ]
