"""The record of every stage attempt: kept in memory for the run's summary and written to the
catalog's stage-attempt table as it happens."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TypedDict

from worldsmith.llm.backend import Usage
from worldsmith.models.catalog import StageAttempt
from worldsmith.stages.order import STEPS, Stage
from worldsmith.storage.catalog import Catalog


@dataclass
class AttemptLog:
    """Attempts of one generation run (`run_id`); `catalog` None keeps them in memory only."""

    run_id: str
    catalog: Catalog | None = None
    attempts: list[StageAttempt] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(
        self,
        *,
        env_id: str | None,
        stage: str,
        attempt: int,
        outcome: str,
        usage: Usage | None = None,
        error_class: str | None = None,
        error_text: str | None = None,
    ) -> StageAttempt:
        usage = usage or Usage()
        row = StageAttempt(
            run_id=self.run_id,
            env_id=env_id,
            stage=stage,
            attempt=attempt,
            outcome=outcome,
            error_class=error_class,
            error_text=(error_text or None) and error_text[:8000],
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost_usd=usage.cost_usd,
            seconds=usage.seconds,
        )
        if self.catalog is not None:
            with self.catalog.session() as session:
                session.add(row)
        with self._lock:
            self.attempts.append(row)
        return row


def pipeline_position(stage: str) -> tuple[int, int, str]:
    """Sort key of a recorded stage name in pipeline order (stages/order.py): `database:schema` before
    `database:seed` before `tools`; names of no stage (e.g. `publish`) last, alphabetically."""
    name, _, step = stage.partition(":")
    stages = list(Stage)
    if name not in stages:
        return (len(stages), 0, stage)
    steps = STEPS.get(Stage(name), ())
    return (stages.index(Stage(name)), steps.index(step) + 1 if step in steps else len(steps) + 1, stage)


class StageSummary(TypedDict):
    """One stage of a generation run: invocations (runs of its repair loop), first-attempt success, repair and
    failure rates, mean attempts per invocation, tokens in and out and cost (USD)."""

    stage: str
    invocations: int
    first_attempt_success: float
    repair_rate: float
    failure_rate: float
    mean_attempts: float
    tokens_in: int
    tokens_out: int
    cost_usd: float


def stage_summary(attempts: list[StageAttempt]) -> list[StageSummary]:
    """Per stage, in pipeline order: invocations, first-attempt success, repair and failure rates, mean
    attempts, tokens and cost. An invocation is one run of a stage's repair loop (attempts 1, 2, ...)."""
    runs: dict[str, list[list[StageAttempt]]] = {}
    for row in sorted(attempts, key=lambda a: (a.env_id or "", a.stage, a.id or 0)):
        per_stage = runs.setdefault(row.stage, [])
        if row.attempt == 1 or not per_stage or per_stage[-1][-1].env_id != row.env_id:
            per_stage.append([])
        per_stage[-1].append(row)
    summary: list[StageSummary] = []
    for stage, invocations in sorted(runs.items(), key=lambda item: pipeline_position(item[0])):
        n = len(invocations)
        first = sum(1 for inv in invocations if inv[0].outcome == "success")
        repaired = sum(1 for inv in invocations if inv[0].outcome != "success" and inv[-1].outcome == "success")
        rows = [a for inv in invocations for a in inv]
        summary.append(
            {
                "stage": stage,
                "invocations": n,
                "first_attempt_success": round(first / n, 3),
                "repair_rate": round(repaired / n, 3),
                "failure_rate": round((n - first - repaired) / n, 3),
                "mean_attempts": round(len(rows) / n, 2),
                "tokens_in": sum(a.tokens_in for a in rows),
                "tokens_out": sum(a.tokens_out for a in rows),
                "cost_usd": round(sum(a.cost_usd for a in rows), 6),
            }
        )
    return summary
