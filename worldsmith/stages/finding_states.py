"""End states that review findings describe, built by construction: a finding's tool calls (`build`) run
through the runtime in a fresh episode of its task, from the untouched world, and the task's verifier run
on the state they leave. What a too-lenient finding is confirmed by (the verifier accepts a wrong state
built as described) and a too-strict one (it rejects a correct one); the evidence a repair carries."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import SolutionStep, TaskSpec
from worldsmith.models.results import DbDiff
from worldsmith.models.specs import ReviewCall
from worldsmith.runtime.episode import Runtime

_SHOWN = 600


def _excerpt(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


@dataclass(frozen=True)
class BuiltState:
    """The outcome of building an end state: the calls made (as text), why the state could not be built
    (`failed`: a call refused or crashed; None when every call ran), the database's changes from the
    untouched world, and the verifier's verdict and evidence on it with the answer given."""

    calls: str
    failed: str | None
    changes: DbDiff
    verdict: str | None = None
    evidence: str = ""

    def describe(self) -> str:
        """The state and its verdict, for a person and for the repairing model."""
        if self.failed is not None:
            return f"the state could not be built: {self.failed}"
        changes = _excerpt(json.dumps(self.changes.model_dump()["tables"], default=str, sort_keys=True))
        return (
            f"judged {self.verdict} by the verifier ({self.evidence}); built by {self.calls}; "
            f"the database's changes from the untouched world: {changes}"
        )


def build_state(
    runtime: Runtime, bundle: Bundle, task: TaskSpec, calls: Sequence[ReviewCall | SolutionStep], answer: str
) -> BuiltState:
    """Run `calls` in a fresh episode of `task` on `bundle`, then (if each ran) its verifier with `answer`."""
    shown = "; ".join(f"{c.tool}({json.dumps(c.arguments, default=str, sort_keys=True)})" for c in calls) or "no call"
    with runtime.open_episode(bundle, task) as episode:
        for number, call in enumerate(calls, start=1):
            outcome = episode.call_tool(call.tool, call.arguments)
            if not outcome.ok:
                failed = f"call {number} ({call.tool}) gave {outcome.status}: {_excerpt(outcome.error or '')}"
                return BuiltState(shown, failed, episode.diff(bundle.world))
        changes = episode.diff(bundle.world)
        judged = episode.verify(answer)
    evidence = _excerpt(json.dumps(judged.evidence, default=str, sort_keys=True)) if judged.evidence else ""
    return BuiltState(
        shown, None, changes, str(getattr(judged.status, "value", judged.status)), evidence or judged.error or ""
    )
