"""Boundary input probes (`Probe.BOUNDARY_INPUTS`): every tool is called, each call on the pristine database,
with the valid inputs ordinary seed values never reach (quality/boundary_inputs.py): boundary dates, quotes,
non-ASCII text, arguments that match nothing; and with its ordinary valid inputs on a copy of the seed whose
rows hold NULL in their nullable columns. A crash (env_error: the tool's own code failed, not a ToolError
refusal) is a `ProbeFailure.BOUNDARY_INPUT_CRASHED` naming the tool, the arguments and the rule they tried:
the tool code's to repair (stages/routing.py)."""

from __future__ import annotations

from dataclasses import dataclass

from worldsmith.bundle.contract import Bundle
from worldsmith.quality.boundary_inputs import BoundaryCall, boundary_calls, entity_tables, nulled_world
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import excerpt
from worldsmith.quality.tool_calls import CallOutcome, Prober, reference_arguments
from worldsmith.quality.tool_inputs import distinct, tool_inputs
from worldsmith.quality.tool_tables import named_tables
from worldsmith.quality.world_values import world_values
from worldsmith.runtime.episode import Runtime, SandboxEpisode


@dataclass(frozen=True)
class InputBudget:
    """At most `boundary_calls` boundary calls and `null_calls` calls on the NULL rows per tool; a tool's calls
    stop at its first crash (one names the defect)."""

    boundary_calls: int = 24
    null_calls: int = 8
    values_per_parameter: int = 8


class _NulledProber(Prober):
    """A `Prober` whose pristine database is the nulled copy of the seed (restored before the first call and
    after every call that wrote)."""

    def __init__(self, episode: SandboxEpisode, world: bytes):
        super().__init__(episode, world)
        self.dirty = True

    def fresh(self) -> None:
        if self.dirty:
            self.episode.restore(self.world)
            self.dirty = False


def _first_crash(prober: Prober, tool: str, calls: list[BoundaryCall]) -> tuple[BoundaryCall, CallOutcome] | None:
    for call in calls:
        outcome = prober.call(tool, call.arguments, look=False)
        if outcome.status == "env_error":
            return call, outcome
    return None


def _crashed(tool: str, call: BoundaryCall, outcome: CallOutcome, tried: int) -> ProbeResult:
    detail = (
        f"crashed on a valid boundary input ({call.rule}) of {tried}; arguments {excerpt(call.arguments)}: "
        f"{outcome.status}: {excerpt(outcome.error or '')}"
    )
    return ProbeResult.quoting(ProbeFailure.BOUNDARY_INPUT_CRASHED, tool, detail, outcome, call.rule)


def boundary_probes(
    runtime: Runtime, bundle: Bundle, *, skip: frozenset[str] = frozenset(), budget: InputBudget | None = None
) -> list[ProbeResult]:
    """`Probe.BOUNDARY_INPUTS` of every tool but those in `skip` (already found crashing); see the module
    docstring."""
    budget = budget or InputBudget()
    values = world_values(bundle.world, budget.values_per_parameter)
    tools = [t for t in bundle.tools if t.name not in skip]
    named = {t.name: named_tables(t, values.tables) for t in tools}
    references = reference_arguments(bundle)
    nulled = nulled_world(bundle.world, values, entity_tables(tools, values, named))
    results: list[ProbeResult] = []
    with runtime.open_episode(bundle) as episode, runtime.open_episode(bundle) as null_episode:
        prober = Prober(episode, bundle.world)
        null_prober = _NulledProber(null_episode, nulled[0]) if nulled else None
        for tool in tools:
            refs = references.get(tool.name, [])
            calls = boundary_calls(tool, values, named[tool.name], refs)[: budget.boundary_calls]
            tried = len(calls)
            crash = _first_crash(prober, tool.name, calls)
            if crash is None and null_prober is not None and nulled is not None:
                ordinary = distinct(tool_inputs(tool, values, named[tool.name], refs).valid, budget.null_calls)
                rule = f"rows with NULL in {', '.join(nulled[1][:6])}{' ...' if len(nulled[1]) > 6 else ''}"
                null_calls = [BoundaryCall(arguments, rule) for arguments in ordinary]
                tried += len(null_calls)
                crash = _first_crash(null_prober, tool.name, null_calls)
            results.append(
                _crashed(tool.name, *crash, tried)
                if crash
                else ProbeResult.passing(Probe.BOUNDARY_INPUTS, tool.name, f"{tried} boundary calls ran")
            )
    return results
