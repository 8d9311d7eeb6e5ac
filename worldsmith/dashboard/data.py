"""What the dashboard shows, read from the catalog as plain data (also served as JSON at /api/summary).

Every function takes a catalog session and returns JSON-ready dicts and lists; the page and the
charts are drawn from exactly these values, so the JSON is the dashboard's numbers.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlmodel import Session, select

from worldsmith.models.catalog import (
    EnvironmentSet,
    EnvironmentSetMember,
    EnvironmentVersion,
    EvaluationRun,
    QualityReport,
    StageAttempt,
    TrainingRun,
    TrainingStep,
)
from worldsmith.stages.attempts import stage_summary
from worldsmith.storage.run_owner import process_alive

RATES = ("first_attempt_success", "repair_rate", "failure_rate")


def generation_by_night(attempts: list[StageAttempt]) -> dict[str, Any]:
    """Per night (UTC date of the attempts) and stage: first-attempt success, repair and failure
    rates and invocations, as series aligned with `nights` (None where a stage did not run that night)."""
    by_night: dict[str, list[StageAttempt]] = defaultdict(list)
    for attempt in attempts:
        by_night[attempt.created_at.strftime("%Y-%m-%d")].append(attempt)
    nights = sorted(by_night)
    summaries = {night: {row["stage"]: row for row in stage_summary(by_night[night])} for night in nights}
    stages = sorted({stage for summary in summaries.values() for stage in summary})
    series = {
        stage: {
            key: [summaries[n][stage][key] if stage in summaries[n] else None for n in nights]
            for key in (*RATES, "invocations")
        }
        for stage in stages
    }
    return {"nights": nights, "stages": series}


def environment_costs(session: Session, attempts: list[StageAttempt]) -> list[dict[str, Any]]:
    """Per environment: LLM tokens and cost over all its stage attempts, attempts made, and the
    status of its latest version ('unpublished' when no version was published)."""
    totals: dict[str, dict[str, Any]] = {}
    for a in (a for a in attempts if a.env_id is not None):
        row = totals.setdefault(
            a.env_id, {"env_id": a.env_id, "attempts": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}
        )
        row["attempts"] += 1
        row["tokens_in"] += a.tokens_in
        row["tokens_out"] += a.tokens_out
        row["cost_usd"] += a.cost_usd
    status = {
        v.env_id: v.status for v in session.exec(select(EnvironmentVersion).order_by(EnvironmentVersion.version)).all()
    }
    return [
        {**row, "cost_usd": round(row["cost_usd"], 6), "status": status.get(env, "unpublished")}
        for env, row in sorted(totals.items())
    ]


def quality(session: Session) -> dict[str, Any]:
    """Published versions by status, and per quality check kind how many versions passed and failed."""
    versions = session.exec(select(EnvironmentVersion)).all()
    by_status: dict[str, int] = defaultdict(int)
    for v in versions:
        by_status[v.status] += 1
    checks: dict[str, dict[str, int]] = {}
    for report in session.exec(select(QualityReport)).all():
        counts = checks.setdefault(report.kind, {"passed": 0, "failed": 0})
        counts["passed" if report.passed else "failed"] += 1
    reasons: dict[str, int] = defaultdict(int)
    for v in versions:
        if v.status != "good":
            reasons[(v.failure_reason or "unknown").split(":")[0][:80]] += 1
    return {
        "versions": dict(sorted(by_status.items())),
        "checks": dict(sorted(checks.items())),
        "failure_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
    }


def sets(session: Session) -> list[dict[str, Any]]:
    """Each environment set (newest first) with its member counts per split."""
    counts: dict[int, dict[str, int]] = defaultdict(lambda: {"train": 0, "validation": 0})
    for member in session.exec(select(EnvironmentSetMember)).all():
        counts[member.set_id][member.split] += 1
    return [
        {
            "name": s.name,
            "members": sum(counts[s.id].values()),
            **counts[s.id],
            "created_at": s.created_at.isoformat(timespec="seconds"),
        }
        for s in session.exec(select(EnvironmentSet).order_by(EnvironmentSet.id.desc())).all()
    ]


def _set_names(session: Session) -> dict[int, str]:
    return {s.id: s.name for s in session.exec(select(EnvironmentSet)).all()}


def _status(run: EvaluationRun | TrainingRun) -> str:
    """The run's status, or `running (process gone)` for a run that reads `running` although the
    process that ran it on this host has died (killed outside a worker, so no hook failed it)."""
    if run.status == "running" and process_alive(run.metrics.get("process")) is False:
        return "running (process gone)"
    return run.status


def evaluations(session: Session) -> list[dict[str, Any]]:
    """Each evaluation run (oldest first): policy, set, status (and error when it failed), pass@1, pass@k (k = samples),
    env_error and format_error rates."""
    names = _set_names(session)
    rows = []
    for run in session.exec(select(EvaluationRun).order_by(EvaluationRun.id)).all():
        overall = run.metrics.get("overall", {})
        rows.append(
            {
                "id": run.id,
                "policy": run.policy,
                "world": run.metrics.get("world", "real"),
                "set": names.get(run.set_id, "?"),
                "samples": run.samples,
                "status": _status(run),
                "pass@1": overall.get("pass@1"),
                "pass@k": overall.get(f"pass@{run.samples}"),
                "env_error_rate": overall.get("env_error_rate"),
                "format_error_rate": overall.get("format_error_rate"),
                "episodes": overall.get("episodes"),
                "error": run.metrics.get("error"),
                "started_at": run.started_at.isoformat(timespec="seconds"),
            }
        )
    return rows


COTRAIN_SERIES = ("real_success_rate", "eval_pass@1", "wm_accuracy_fresh", "imagined_rate", "stopped_rate", "wm_loss")


def _runs(session: Session, keys: tuple[str, ...], cotrain: bool) -> list[dict[str, Any]]:
    """Training runs (oldest first), co-training runs or the others, each with a series per key over its steps."""
    names = _set_names(session)
    rows = []
    for run in session.exec(select(TrainingRun).order_by(TrainingRun.id)).all():
        kind = run.config.get("kind", "grpo")
        if (kind == "cotrain") != cotrain:
            continue
        steps = session.exec(
            select(TrainingStep).where(TrainingStep.training_run_id == run.id).order_by(TrainingStep.step)
        ).all()
        model = run.config.get("policy", {}).get("model") if cotrain else run.config.get("model")
        rows.append(
            {
                "id": run.id,
                "kind": kind,
                "model": model,
                "set": names.get(run.set_id, "?"),
                "status": _status(run),
                "error": run.metrics.get("error"),
                "steps": [s.step for s in steps],
                **{key: [s.metrics.get(key) for s in steps] for key in keys},
                "started_at": run.started_at.isoformat(timespec="seconds"),
            }
        )
    return rows


def training(session: Session) -> list[dict[str, Any]]:
    """Each training run (GRPO, world model; oldest first) with its per-step reward, success rate and loss curves."""
    return _runs(session, ("reward", "success_rate", "loss"), cotrain=False)


def cotraining(session: Session) -> list[dict[str, Any]]:
    """Each co-training run (oldest first) with its per-round series: real success rate, evaluation pass@1, the world
    model's accuracy on fresh real transitions, the share of imagined rollouts, the share of imagined calls stopped
    as uncertain, the world model's loss. Its `steps` are the round numbers."""
    return _runs(session, COTRAIN_SERIES, cotrain=True)


def summary(session: Session) -> dict[str, Any]:
    """Everything the dashboard shows."""
    attempts = list(session.exec(select(StageAttempt)).all())  # read once: both sections are made from them
    return {
        "generation": generation_by_night(attempts),
        "environments": environment_costs(session, attempts),
        "quality": quality(session),
        "sets": sets(session),
        "evaluations": evaluations(session),
        "training": training(session),
        "cotraining": cotraining(session),
    }
