"""Which step owns a failed execution probe: the step that makes the artifact the probe finds at fault
(`ProbeResult.owner`, quality/probe_results.py). The tool code's step when a tool fails (it does not load,
it crashes, a step of a reference solution crashes it, a replay of a solution under another clock and
random seed gives another result or database), the seed step when a task names a record the seed lacks,
the verifiers stage otherwise (a verifier's verdict that differs between replays included). The
verifiers stage leaves the tool code's failures to validation, which sends them back to the code step."""

from __future__ import annotations

from worldsmith.quality.probe_results import Artifact, ProbeResult
from worldsmith.stages.order import Stage

#: The stage and step (order.STEPS; None: the stage's first) that make each artifact a probe can fault.
MAKER: dict[Artifact, tuple[Stage, str | None]] = {
    Artifact.TOOL_CODE: (Stage.TOOLS, "code"),
    Artifact.SEED: (Stage.DATABASE, "seed"),
    Artifact.VERIFIERS: (Stage.VERIFIERS, None),  # the verifiers and the reference solutions
    Artifact.INVARIANTS: (Stage.DATABASE, "schema"),  # stated with the schema
}


def owning_step(result: ProbeResult) -> tuple[Stage, str | None]:
    """The stage and step that must fix the failed probe `result`."""
    if result.owner is None:
        raise ValueError(f"{result.probe} {result.target} passed: no step owns it")
    return MAKER[result.owner]
