"""The world's invariants as execution probes (`invariants.json`, bundle/invariants.py): the seed keeps every
one, and so does the end state of every reference solution. Their queries run in the episode's sandbox
worker (`SandboxEpisode.query`), read-only and bounded, as all generated code runs.

- `seed keeps invariants`, per invariant: its query returns no row of the seed (else `seed breaks
  invariant`, the seed's fault, naming the offending rows), and runs at all within its budget (else
  `invariant query failed`, the fault of the invariants themselves, stated with the schema);
- `end state keeps invariants`, per task with a reference solution: its steps run in a fresh episode and
  every invariant the seed keeps is checked on the database after each writing step; the first step after
  which one is broken is a `tool breaks invariant` (the tool code's fault: a tool must not leave a state
  the world's rules forbid, whoever calls it), naming the step, the invariant and the rows. A step that
  fails ends the run there (the reference probes report it).
"""

from __future__ import annotations

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.invariants import InvariantViolation, check_queries
from worldsmith.models.bundle import Invariant, TaskSpec
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.runtime.episode import Runtime


def seed_invariant_probes(runtime: Runtime, bundle: Bundle) -> list[ProbeResult]:
    """One result per invariant of `bundle`: whether its seed keeps it (checked in a fresh episode's worker)."""
    with runtime.open_episode(bundle) as episode:
        checked = check_queries(episode.query, bundle.invariants)
    broken = {v.invariant.id: v for v in checked}
    results = []
    for invariant in bundle.invariants:
        violation = broken.get(invariant.id)
        if violation is None:
            results.append(ProbeResult.passing(Probe.SEED_INVARIANTS, invariant.id, "the seed keeps it"))
            continue
        failure = ProbeFailure.INVARIANT_QUERY_FAILED if violation.error else ProbeFailure.SEED_BREAKS_INVARIANT
        results.append(ProbeResult.failing(failure, invariant.id, violation.describe(), cause="seed.sql"))
    return results


def _end_state_probe(runtime: Runtime, bundle: Bundle, task: TaskSpec, kept: list[Invariant]) -> ProbeResult:
    """Run `task`'s reference solution, checking `kept` after each writing step (module docstring)."""
    with runtime.open_episode(bundle, task) as episode:
        for number, step in enumerate(task.solution, start=1):
            outcome = episode.call_tool(step.tool, step.arguments)
            if not outcome.ok:
                break
            if not outcome.changed:
                continue
            broken: list[InvariantViolation] = check_queries(episode.query, kept)
            if broken:
                where = f"step {number} ({step.tool})"
                detail = f"after {where}: " + "; ".join(v.describe() for v in broken)
                return ProbeResult.failing(ProbeFailure.TOOL_BREAKS_INVARIANT, task.id, detail, cause=where)
    return ProbeResult.passing(Probe.END_STATE_INVARIANTS, task.id, f"every state keeps {len(kept)} invariants")


def invariant_probes(runtime: Runtime, bundle: Bundle) -> list[ProbeResult]:
    """The seed's results, then each reference solution's (only the invariants the seed keeps are checked
    on end states: a broken one is the seed's to fix first). [] for a world that states no invariant."""
    if not bundle.invariants:
        return []
    results = seed_invariant_probes(runtime, bundle)
    kept_ids = {r.target for r in results if r.passed}
    kept = [i for i in bundle.invariants if i.id in kept_ids]
    if kept:
        results += [_end_state_probe(runtime, bundle, task, kept) for task in bundle.tasks if task.solution]
    return results
