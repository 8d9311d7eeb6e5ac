"""The world's invariants as execution probes (`invariants.json`, bundle/invariants.py): the seed keeps every
one, and so does the end state of every reference solution. Their queries run in the episode's sandbox
worker (`SandboxEpisode.query`), read-only and bounded, as all generated code runs.

- `seed keeps invariants`, per invariant: its query returns no row of the seed (else `seed breaks
  invariant`, the seed's fault, naming the offending rows), and runs at all within its budget (else
  `invariant query failed`, the fault of the invariants themselves, stated with the schema);
- `end state keeps invariants`, per task with a reference solution: its steps run in a fresh episode and
  every invariant the seed keeps is checked on the database after each writing step (those `probe_tasks`'
  first replay kept, where given); the first step after
  which one is broken is a `tool breaks invariant` (the tool code's fault: a tool must not leave a state
  the world's rules forbid, whoever calls it), naming the step, the invariant and the rows. A step that
  fails ends the run there (the reference probes report it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.invariants import InvariantViolation, check_queries
from worldsmith.models.bundle import Invariant, SolutionStep, TaskSpec
from worldsmith.quality.concurrently import each_on_pool
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import SolutionReplay
from worldsmith.runtime.episode import Runtime, SandboxEpisode


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


def _end_state_probe(
    runtime: Runtime, bundle: Bundle, task: TaskSpec, kept: list[Invariant], replay: SolutionReplay | None
) -> ProbeResult:
    """Check `kept` after each writing step of `task`'s reference solution (module docstring): on the
    databases `replay` (its first replay in `probe_tasks`) kept after them, else on a run of its steps here."""
    with runtime.open_episode(bundle, task) as episode:
        for number, step, broken in _after_writes(episode, task, kept, replay):
            if broken:
                where = f"step {number} ({step.tool})"
                detail = f"after {where}: " + "; ".join(v.describe() for v in broken)
                return ProbeResult.failing(ProbeFailure.TOOL_BREAKS_INVARIANT, task.id, detail, cause=where)
    return ProbeResult.passing(Probe.END_STATE_INVARIANTS, task.id, f"every state keeps {len(kept)} invariants")


def _after_writes(
    episode: SandboxEpisode, task: TaskSpec, kept: list[Invariant], replay: SolutionReplay | None
) -> Iterator[tuple[int, SolutionStep, list[InvariantViolation]]]:
    """Each writing step of `task`'s reference solution (up to one that fails) with the invariants of `kept`
    the database after it breaks."""
    if replay is not None:
        for number, (step, (_, after)) in enumerate(zip(task.solution, replay.steps), start=1):
            if after is not None:  # a writing step that succeeded
                episode.restore(after)
                yield number, step, check_queries(episode.query, kept)
        return
    for number, step in enumerate(task.solution, start=1):
        outcome = episode.call_tool(step.tool, step.arguments)
        if not outcome.ok:
            return
        if outcome.changed:
            yield number, step, check_queries(episode.query, kept)


def invariant_probes(
    runtime: Runtime, bundle: Bundle, replays: Mapping[str, SolutionReplay] | None = None
) -> list[ProbeResult]:
    """The seed's results, then each reference solution's (only the invariants the seed keeps are checked
    on end states: a broken one is the seed's to fix first). `replays`: reference solutions already run, by
    task id (`task_probes`), whose databases after each writing step are checked instead of running them
    again. [] for a world that states no invariant."""
    if not bundle.invariants:
        return []
    results = seed_invariant_probes(runtime, bundle)
    kept_ids = {r.target for r in results if r.passed}
    kept = [i for i in bundle.invariants if i.id in kept_ids]
    if kept:
        replays = replays or {}
        tasks = [task for task in bundle.tasks if task.solution]
        results += each_on_pool(
            runtime, tasks, lambda task: _end_state_probe(runtime, bundle, task, kept, replays.get(task.id))
        )
    return results
