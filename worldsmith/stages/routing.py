"""Which step owns a failed execution probe: the tool code when a tool fails (it does not load, it
crashes, a step of a reference solution crashes it, a replay of a solution under another clock and
random seed gives another result or database), the seed step when a task names a record the seed
lacks, the verifiers stage otherwise (a verifier's verdict that differs between replays included). The verifiers stage leaves the tool code's failures to
validation, which sends them back to the code step."""

from __future__ import annotations

from worldsmith.quality.deep_probes import BLOCKED_PROBE, MISSING_IN_SEED, TOOL_CODE_DEEP_PROBES
from worldsmith.quality.probes import DETERMINISM_PROBE
from worldsmith.stages.order import Stage

#: Probes whose failure is always the tool code's: the module does not load, a tool crashes.
TOOL_CODE_PROBES = frozenset({"tools load", "tool runs", *TOOL_CODE_DEEP_PROBES})
#: How "reference accepted" reports a step the tool crashed on (quality/probes.py probe_tasks).
CRASHED_STEP = "gave env_error"
#: How the determinism probe names a verifier whose verdict differed between replays (else a tool or the
#: end state: a tool read the real clock or randomness).
VERIFIER_DIFFERED = "verifier "


def owning_step(probe: str, detail: str) -> tuple[Stage, str | None]:
    """The stage and step (order.STEPS; None: the stage's first) that must fix a failed `probe`."""
    if (
        probe in TOOL_CODE_PROBES
        or (probe == "reference accepted" and CRASHED_STEP in detail)
        or (probe == DETERMINISM_PROBE and not detail.startswith(VERIFIER_DIFFERED))
    ):
        return Stage.TOOLS, "code"
    if probe == BLOCKED_PROBE and MISSING_IN_SEED in detail:  # a task names a record the seed lacks
        return Stage.DATABASE, "seed"
    return Stage.VERIFIERS, None
