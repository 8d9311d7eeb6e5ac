"""What the dashboard shows, read from the catalog as plain data (also served as JSON at /api/summary).

Every function takes a catalog session and returns JSON-ready dicts and lists; the page and the
charts are drawn from exactly these values, so the JSON is the dashboard's numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from worldsmith.dashboard.drilldown import (
    PSEUDO_STAGES,
    failed_worlds,
    failure_classes_by_night,
    pipeline_order,
    real_stages,
    sums_by_night,
    usage_columns,
    worlds_in,
    worlds_page,
)
from worldsmith.dashboard.filters import Filters, backend_choices, night_of
from worldsmith.dashboard.paging import TOP_N, PageRequest
from worldsmith.dashboard.rows import (
    CotrainingRow,
    CotrainSeries,
    EvaluationRow,
    GenerationByNight,
    NightRow,
    NightUsage,
    PassedFailed,
    QualitySummary,
    RunHead,
    SetRow,
    StageSeries,
    Summary,
    TrainingRow,
    TrainingSeries,
)
from worldsmith.jsonvalue import JsonValue
from worldsmith.models.catalog import (
    AttemptSums,
    EnvironmentSet,
    EnvironmentVersion,
    EvaluationRun,
    QualityReport,
    StageRollup,
    TrainingRun,
    TrainingStep,
)
from worldsmith.models.evaluation import stored_overall
from worldsmith.storage.run_listing import run_status, set_names, trained_model
from worldsmith.storage.sets import split_counts

RATES = ("first_attempt_success", "repair_rate", "failure_rate")
USAGE = ("tokens_in", "tokens_out", "cost_usd")
NO_FILTERS = Filters()


def _usage_columns(table: type[AttemptSums]) -> tuple[Any, ...]:
    """SQL: attempts, tokens in, tokens out and cost of the grouped rows of a sums rollup."""
    return usage_columns(table)[:4]


def generation_by_night(session: Session, filters: Filters = NO_FILTERS) -> GenerationByNight:
    """Per night (UTC date of the attempts) and stage: first-attempt success, repair and failure rates,
    invocations (runs of the stage's repair loop: its attempts 1), attempts, tokens in and out and cost,
    as series aligned with `nights` (None where a stage did not run that night). Aggregated in SQL over the
    stage rollups."""
    sums = sums_by_night(filters)
    rows = session.exec(
        select(  # type: ignore[call-overload]  # sqlmodel types select() for up to 4 columns
            sums.night,
            sums.stage,
            func.sum(sums.invocations),
            func.sum(sums.first_ok),
            func.sum(sums.repaired),
            *_usage_columns(sums),
        )
        .where(real_stages(sums), *filters.rollups(sums))
        .group_by(sums.night, sums.stage)
    ).all()
    cells: dict[tuple[str, str], dict[str, float | None]] = {}
    for day, stage, n, first_ok, repaired, attempts, tokens_in, tokens_out, cost in rows:
        rates = (first_ok / n, repaired / n, (n - first_ok - repaired) / n) if n else (None, None, None)
        cells[(str(day), stage)] = {
            **{key: None if r is None else round(r, 3) for key, r in zip(RATES, rates, strict=True)},
            "invocations": int(n),
            "attempts": int(attempts),
            "tokens_in": int(tokens_in),
            "tokens_out": int(tokens_out),
            "cost_usd": round(float(cost), 6),
        }
    nights = sorted({n for n, _ in cells})
    stages = sorted({s for _, s in cells}, key=pipeline_order)
    keys = (*RATES, "invocations", "attempts", *USAGE)
    series: dict[str, StageSeries] = {
        stage: {key: [cells[(n, stage)][key] if (n, stage) in cells else None for n in nights] for key in keys}
        for stage in stages
    }
    return {"nights": nights, "stages": series}


def night_backends(session: Session, filters: Filters = NO_FILTERS) -> dict[str, list[str]]:
    """Per night, the generator backends (and models) that made its worlds, as `backend` or
    `backend:model`. Hook: read from the generator recorded on the versions published that night, until
    generation runs record the backend they resolved."""
    night = night_of(session, EnvironmentVersion.created_at)
    rows = session.exec(
        select(night, EnvironmentVersion.generator_backend, EnvironmentVersion.generator_model)
        .where(*filters.versions(session))
        .group_by(night, col(EnvironmentVersion.generator_backend), col(EnvironmentVersion.generator_model))
        .order_by(night, col(EnvironmentVersion.generator_backend), col(EnvironmentVersion.generator_model))
    ).all()
    backends: dict[str, list[str]] = defaultdict(list)
    for day, backend, model in rows:
        if backend:
            backends[str(day)].append(f"{backend}:{model}" if model else backend)
    return dict(backends)


def generation_nights(session: Session, filters: Filters = NO_FILTERS) -> list[NightRow]:
    """Per night (oldest first): its backend(s), generation runs, worlds attempted, worlds published good
    and failed (failed versions, plus worlds an older catalog recorded as failing the pseudo-stage
    `environment`), stage attempts, tokens in and out and cost. Aggregated in SQL."""
    sums = sums_by_night(filters)
    usage = session.exec(
        select(  # type: ignore[call-overload]  # sqlmodel types select() for up to 4 columns, not *columns
            sums.night, func.count(func.distinct(sums.run_id)), *_usage_columns(sums)
        )
        .where(real_stages(sums), *filters.rollups(sums))
        .group_by(sums.night)
    ).all()
    attempted = dict(
        session.exec(
            select(col(StageRollup.night), worlds_in())
            .where(real_stages(), *filters.rollups(StageRollup))
            .group_by(col(StageRollup.night))
        ).all()
    )
    worlds: dict[str, dict[str, int]] = defaultdict(lambda: {"good": 0, "failed": 0})
    published = night_of(session, EnvironmentVersion.created_at)
    for day, status, count in session.exec(
        select(published, EnvironmentVersion.status, func.count())
        .where(*filters.versions(session))
        .group_by(published, EnvironmentVersion.status)
    ).all():
        worlds[str(day)]["good" if status == "good" else "failed"] += count
    legacy = session.exec(
        select(col(StageRollup.night), worlds_in())
        .where(col(StageRollup.stage).in_(PSEUDO_STAGES), col(StageRollup.failures) > 0, *filters.rollups(StageRollup))
        .group_by(col(StageRollup.night))
    ).all()
    for day, count in legacy:
        worlds[str(day)]["failed"] += count
    backends = night_backends(session, filters)
    rows: dict[str, NightUsage] = {
        str(day): {
            "runs": runs,
            "worlds": attempted.get(day, 0),
            "attempts": int(attempts),
            "tokens_in": int(tokens_in),
            "tokens_out": int(tokens_out),
            "cost_usd": round(float(cost), 6),
        }
        for day, runs, attempts, tokens_in, tokens_out, cost in usage
    }
    empty: NightUsage = {"runs": 0, "worlds": 0, "attempts": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}
    return [
        {
            "night": day,
            "backend": ", ".join(backends.get(day, [])) or "unknown",
            **rows.get(day, empty),
            "good": worlds[day]["good"],
            "failed": worlds[day]["failed"],
        }
        for day in sorted(set(rows) | set(worlds))
    ]


def quality(session: Session, filters: Filters = NO_FILTERS) -> QualitySummary:
    """Published versions by status (failed worlds included), per quality check kind how many versions
    passed and failed, and the failed versions' reasons (their first words). Aggregated in SQL."""
    by_status = dict(
        session.exec(
            select(EnvironmentVersion.status, func.count())
            .where(*filters.versions(session))
            .group_by(EnvironmentVersion.status)
            .order_by(EnvironmentVersion.status)
        ).all()
    )
    checks: dict[str, PassedFailed] = {}
    for kind, passed, count in session.exec(
        select(QualityReport.kind, QualityReport.passed, func.count())
        .join(EnvironmentVersion, col(EnvironmentVersion.id) == QualityReport.version_id)
        .where(*filters.versions(session))
        .group_by(col(QualityReport.kind), col(QualityReport.passed))
    ).all():
        counts = checks.setdefault(kind, {"passed": 0, "failed": 0})
        if passed:
            counts["passed"] += count
        else:
            counts["failed"] += count
    reasons: dict[str, int] = defaultdict(int)
    for reason, count in session.exec(
        select(EnvironmentVersion.failure_reason, func.count())
        .where(EnvironmentVersion.status != "good", *filters.versions(session))
        .group_by(EnvironmentVersion.failure_reason)
    ).all():
        reasons[(reason or "unknown").split(":")[0][:80]] += count
    return {
        "versions": by_status,
        "checks": dict(sorted(checks.items())),
        "failure_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
    }


def sets(session: Session) -> list[SetRow]:
    """Each environment set (newest first) with its member counts per split (counted in SQL)."""
    counts = split_counts(session)
    rows: list[SetRow] = []
    for s in session.exec(select(EnvironmentSet).order_by(col(EnvironmentSet.id).desc())).all():
        members = counts.get(s.id, {}) if s.id is not None else {}
        rows.append(
            {
                "name": s.name,
                "members": sum(members.values()),
                "train": members.get("train", 0),
                "validation": members.get("validation", 0),
                "created_at": s.created_at.isoformat(timespec="seconds"),
            }
        )
    return rows


def evaluations(session: Session) -> list[EvaluationRow]:
    """Each evaluation run (oldest first): policy, set, status (and error when it failed), pass@1, pass@k (k = samples),
    env_error, format_error and agent_error rates."""
    names = set_names(session)
    rows: list[EvaluationRow] = []
    for run in session.exec(select(EvaluationRun).order_by(col(EvaluationRun.id))).all():
        overall = stored_overall(run.metrics)  # None while running, or failed
        rows.append(
            {
                "id": run.id,
                "policy": run.policy,
                "world": _text(run.metrics, "world") or "real",
                "set": names.get(run.set_id, "?"),
                "samples": run.samples,
                "status": run_status(run),
                "pass@1": overall.pass_at_1 if overall else None,
                "pass@k": overall.pass_at(run.samples) if overall else None,
                "env_error_rate": overall.env_error_rate if overall else None,
                "format_error_rate": overall.format_error_rate if overall else None,
                "agent_error_rate": overall.agent_error_rate if overall else None,
                "episodes": overall.episodes if overall else None,
                "error": _text(run.metrics, "error"),
                "started_at": run.started_at.isoformat(timespec="seconds"),
            }
        )
    return rows


def _text(record: Mapping[str, JsonValue], key: str) -> str | None:
    """The text a stored record (a run's metrics or config) holds at `key`; None when it holds none."""
    value = record.get(key)
    return value if isinstance(value, str) else None


def _runs(session: Session, cotrain: bool) -> list[tuple[RunHead, Sequence[TrainingStep], str]]:
    """Training runs (oldest first), co-training runs or the others: each one's head, steps and start."""
    names = set_names(session)
    rows: list[tuple[RunHead, Sequence[TrainingStep], str]] = []
    for run in session.exec(select(TrainingRun).order_by(col(TrainingRun.id))).all():
        kind = _text(run.config, "kind") or "grpo"
        if (kind == "cotrain") != cotrain:
            continue
        steps = session.exec(
            select(TrainingStep).where(TrainingStep.training_run_id == run.id).order_by(col(TrainingStep.step))
        ).all()
        model = trained_model(run, cotrain)
        rows.append(
            (
                {
                    "id": run.id,
                    "kind": kind,
                    "model": model,
                    "set": names.get(run.set_id, "?"),
                    "status": run_status(run),
                    "error": _text(run.metrics, "error"),
                    "steps": [s.step for s in steps],
                },
                steps,
                run.started_at.isoformat(timespec="seconds"),
            )
        )
    return rows


def _series(steps: Sequence[TrainingStep], key: str) -> list[JsonValue]:
    """The metric `key` of each step (None where a step has none)."""
    return [s.metrics.get(key) for s in steps]


def training(session: Session) -> list[TrainingRow]:
    """Each training run (GRPO, world model; oldest first) with its per-step reward, success rate and loss curves;
    in simulated training the real and imagined rollouts' rewards apart; with a judged reward the judge's cost
    and mean request latency per step (None where a step has none)."""

    def series(steps: Sequence[TrainingStep]) -> TrainingSeries:
        return {
            "reward": _series(steps, "reward"),
            "success_rate": _series(steps, "success_rate"),
            "loss": _series(steps, "loss"),
            "reward_real": _series(steps, "reward_real"),
            "reward_imagined": _series(steps, "reward_imagined"),
            "judge_cost_usd": _series(steps, "judge_cost_usd"),
            "judge_latency_s": _series(steps, "judge_latency_s"),
        }

    return [{**head, **series(steps), "started_at": started} for head, steps, started in _runs(session, cotrain=False)]


def cotraining(session: Session) -> list[CotrainingRow]:
    """Each co-training run (oldest first) with its per-round series: real success rate, evaluation pass@1, the world
    model's accuracy on fresh real transitions, the share of imagined rollouts, the share of imagined calls stopped
    as uncertain, the world model's loss. Its `steps` are the round numbers."""

    def series(steps: Sequence[TrainingStep]) -> CotrainSeries:
        return {
            "real_success_rate": _series(steps, "real_success_rate"),
            "eval_pass@1": _series(steps, "eval_pass@1"),
            "wm_accuracy_fresh": _series(steps, "wm_accuracy_fresh"),
            "imagined_rate": _series(steps, "imagined_rate"),
            "stopped_rate": _series(steps, "stopped_rate"),
            "wm_loss": _series(steps, "wm_loss"),
        }

    return [{**head, **series(steps), "started_at": started} for head, steps, started in _runs(session, cotrain=True)]


def summary(session: Session, filters: Filters = NO_FILTERS, top: int = TOP_N) -> Summary:
    """Everything the front page shows, its generation numbers narrowed by `filters`; long lists (`environments`:
    the most expensive worlds, `failed_worlds`: the newest) are their first `top` rows, with their totals
    (`..._total`; the drill-down pages list the rest)."""
    first = PageRequest(limit=top)
    environments, failed = worlds_page(session, filters, first), failed_worlds(session, filters, first)
    return {
        "filters": filters.params(),
        "backends": backend_choices(session),
        "generation": generation_by_night(session, filters),
        "nights": generation_nights(session, filters),
        "failure_classes": failure_classes_by_night(session, filters),
        "environments": environments.rows,
        "environments_total": environments.total,
        "failed_worlds": failed.rows,
        "failed_worlds_total": failed.total,
        "quality": quality(session, filters),
        "sets": sets(session),
        "evaluations": evaluations(session),
        "training": training(session),
        "cotraining": cotraining(session),
    }
