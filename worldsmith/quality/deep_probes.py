"""Deep tool probes: what one call per tool cannot find, and blocked tasks.

Every tool is called with many valid inputs drawn from the seeded database and with invalid ones
(quality/tool_inputs.py). Each call runs on the pristine database (the episode is restored after any
call that wrote), so no call's writes feed the next, and its outcome is the call's alone: generation
makes each call once per tool behaviour (`deep_probes(reuse=True)`; `prepare_tool_calls` makes those
that need no reference solution while the model writes them: quality/ahead.py; quality/tool_calls.py).
Defects, each a failed `ProbeResult` naming the tool, the arguments and the error:

- `Probe.VALID_INPUTS`: a valid input crashes the tool (env_error);
- `Probe.INVALID_INPUTS`: an invalid input crashes it or is written instead of refused;
- `Probe.READ_ONLY`: a tool whose name says it reads (`tool_tables.READ_PREFIXES`) changed the database;
- `Probe.OWN_TABLES`: a writing tool changed a table that is not its own (`tool_tables.own_tables`).

And `Probe.TASK_NOT_BLOCKED` per task (quality/blocked.py), from the same replays of the reference solutions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.blocked import blocked_tasks
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import excerpt
from worldsmith.quality.tool_calls import CallOutcome, Prober, Stopped, known_calls, replay_references
from worldsmith.quality.tool_inputs import combinations, distinct, tool_inputs
from worldsmith.quality.tool_tables import is_read_tool, named_tables, own_tables, shared_tables
from worldsmith.quality.world_values import world_values
from worldsmith.runtime.episode import Runtime


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


def _failed(failure: ProbeFailure, tool: str, bad: list[CallOutcome], calls: int, what: str) -> ProbeResult:
    """`failure` of `tool`: `what` happened on the `bad` of its `calls`, the first quoted."""
    first = bad[0]
    return ProbeResult.quoting(
        failure,
        tool,
        f"{what} on {len(bad)} of {calls} calls; first {excerpt(first.arguments)}: "
        f"{first.status}: {excerpt(first.error or '')}",
        first,
        excerpt(first.arguments),
    )


@dataclass
class _Probed:
    """One tool's calls: valid, invalid (with why), and how many valid ones the budget left out."""

    valid: list[CallOutcome] = field(default_factory=list)
    invalid: list[tuple[CallOutcome, str]] = field(default_factory=list)
    left_out: int = 0

    @property
    def every(self) -> list[CallOutcome]:
        return self.valid + [o for o, _ in self.invalid]

    @property
    def written(self) -> set[str]:
        return set().union(*(o.written for o in self.every))


def _probe_tool(
    prober: Prober,
    name: str,
    valid: list[JsonObject],
    invalid: list[tuple[JsonObject, str]],
    budget: DeepProbeBudget,
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
        _failed(ProbeFailure.VALID_INPUT_CRASHED, name, crashed, len(probed.valid), "env_error")
        if crashed
        else ProbeResult.passing(Probe.VALID_INPUTS, name, f"{len(probed.valid)} valid inputs, no crash{left_out}")
    )
    if probed.invalid:
        wrong = [(o, why) for o, why in probed.invalid if o.status == "env_error" or (o.status == "ok" and o.changed)]
        if wrong:
            outcome, why = wrong[0]
            crash = outcome.status == "env_error"
            what = "crashed" if crash else f"wrote {sorted(outcome.written)}"
            detail = (
                f"{what} on {len(wrong)} of {len(probed.invalid)} invalid inputs; first {excerpt(outcome.arguments)}"
                f" ({why}): {outcome.status}: {excerpt(outcome.error or 'no error')}"
            )
            failure = ProbeFailure.INVALID_INPUT_CRASHED if crash else ProbeFailure.INVALID_INPUT_WRITTEN
            results.append(ProbeResult.quoting(failure, name, detail, outcome, why))
        else:
            results.append(ProbeResult.passing(Probe.INVALID_INPUTS, name, f"{len(probed.invalid)} refused"))
    if is_read_tool(name):
        wrote = [o for o in probed.every if o.changed]
        results.append(
            _failed(ProbeFailure.READ_TOOL_WROTE, name, wrote, len(probed.every), f"wrote {sorted(probed.written)}")
            if wrote
            else ProbeResult.passing(Probe.READ_ONLY, name, "changed nothing")
        )
    elif own is not None and probed.written:
        outside = [o for o in probed.every if o.written - own]
        what = f"wrote {sorted(probed.written - own)}"
        results.append(
            _failed(ProbeFailure.WROTE_OTHER_TABLES, name, outside, len(probed.every), what)
            if outside
            else ProbeResult.passing(Probe.OWN_TABLES, name, f"wrote {sorted(probed.written)}")
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
    `Probe.TASK_NOT_BLOCKED` of every task; see the module docstring. With `reuse`, a call whose outcome this
    process keeps for the same tool behaviour (`tool_behaviour_key`: an earlier round, or
    `prepare_tool_calls` while the model wrote the tasks' solutions) is not made again."""
    known = known_calls(bundle) if reuse else None
    results, _ = _deep_probes(runtime, bundle, skip, budget or DeepProbeBudget.configured(), known)
    return results


def prepare_tool_calls(runtime: Runtime, bundle: Bundle, stop: threading.Event | None = None) -> int:
    """Make the deep probes' calls of `bundle`'s tools that need no reference solution (those of the
    bundle without its tasks), keeping their outcomes for `deep_probes(reuse=True)` of every bundle of the
    same tool behaviour; no call is made once `stop` is set. Returns how many calls were made."""
    tools_only = replace(bundle, tasks=())
    _, made = _deep_probes(runtime, tools_only, frozenset(), DeepProbeBudget.configured(), known_calls(bundle), stop)
    return made


def _deep_probes(
    runtime: Runtime,
    bundle: Bundle,
    skip: frozenset[str],
    budget: DeepProbeBudget,
    known: dict[tuple[str, str], CallOutcome] | None,
    stop: threading.Event | None = None,
) -> tuple[list[ProbeResult], int]:
    """The deep probes' results and the calls made for them ([] once `stop` was set)."""
    values = world_values(bundle.world, budget.values_per_parameter)
    named = {tool.name: named_tables(tool, values.tables) for tool in bundle.tools}
    with runtime.open_episode(bundle) as episode:
        prober = Prober(episode, bundle.world, known, stop)
        try:
            references = replay_references(prober, bundle)
            inputs = {
                tool.name: tool_inputs(tool, values, named[tool.name], references.arguments.get(tool.name, []))
                for tool in bundle.tools
                if tool.name not in skip
            }
            if stop is not None and stop.is_set():
                raise Stopped
            drawn = combinations(inputs, budget.combinations)
            probed = {
                name: _probe_tool(
                    prober,
                    name,
                    distinct(found.valid + drawn.get(name, []), budget.valid_calls),
                    found.invalid[: budget.invalid_calls],
                    budget,
                )
                for name, found in inputs.items()
            }
        except Stopped:
            return [], prober.made
    shared = shared_tables(list(values.tables), {name: p.written for name, p in probed.items()})
    results: list[ProbeResult] = []
    for tool in bundle.tools:
        if tool.name not in probed:
            continue
        mine = named[tool.name] | references.footprints.get(tool.name, set())
        own = own_tables(named[tool.name], references.footprints.get(tool.name, set()), shared, values.tables)
        results += _judged(tool, probed[tool.name], own if mine else None)
    return results + blocked_tasks(bundle, references.refused), prober.made
