"""What the dashboard's drill-down pages show: a night's runs and stages (failure classes per stage), a
stage's worlds that night, the worlds by status, failed worlds with their reasons, a world's versions and
attempts, one attempt in full. Every list is one page of a SQL query (LIMIT/OFFSET) plus its total; the sums
over attempts are read from the coarsest of their rollups (models/catalog.py: per night, run, world and stage;
per night, run and stage; per world) that can apply the filters, never from every attempt."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from worldsmith.dashboard.filters import Filters
from worldsmith.dashboard.paging import Page, PageRequest, count_rows
from worldsmith.dashboard.rows import (
    AttemptRow,
    FailureClasses,
    NightRunRow,
    NightStageRow,
    StageWorldRow,
    Usage,
    VersionRow,
    WorldRow,
)
from worldsmith.models.catalog import (
    NO_KEY,
    AttemptSums,
    EnvironmentVersion,
    FailureRollup,
    NightFailureRollup,
    NightRollup,
    StageAttempt,
    StageRollup,
    WorldRollup,
)
from worldsmith.stages.order import pipeline_position
from worldsmith.storage.run_listing import flow_run_id

#: Not a stage: older catalogs recorded a world's failure as an attempt of this stage (failed worlds are
#: now published as failed versions); stage tables and usage leave it out.
PSEUDO_STAGES = ("environment",)
#: What an attempt's failure is called when it recorded no error class.
UNCLASSIFIED = "unclassified"
#: A world's status when it has no published version (a duplicate of another world, or not finished).
UNPUBLISHED = "unpublished"
WORLD_STATUSES = ("good", "failed", UNPUBLISHED)


def real_stages(table: Any = StageRollup) -> Any:
    return table.stage.not_in(PSEUDO_STAGES)


def sums_by_night(filters: Filters) -> type[StageRollup] | type[NightRollup]:
    """The coarsest rollup of attempt sums per night and stage that can apply `filters`: per night, run and
    stage unless they narrow by world."""
    return StageRollup if filters.by_world else NightRollup


def failures_by_night(filters: Filters) -> type[FailureRollup] | type[NightFailureRollup]:
    """The coarsest rollup of failed attempts per night, stage and error class that can apply `filters`."""
    return FailureRollup if filters.by_world else NightFailureRollup


def pipeline_order(stage: str) -> tuple[int, int, str]:
    """Sort key: stages in the order the pipeline runs them (worldsmith/stages/order.pipeline_position)."""
    return pipeline_position(stage)


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, seconds (SQLite gives naive UTC times)."""
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).isoformat(timespec="seconds")


def worlds_in(table: Any = StageRollup) -> Any:
    """SQL: how many distinct worlds the grouped rollup rows are of (rows of no world left out)."""
    return func.count(func.distinct(func.nullif(table.env_id, NO_KEY)))


def error_class_of(key: str) -> str:
    return key or UNCLASSIFIED


def usage_columns(table: type[AttemptSums] = StageRollup) -> tuple[Any, ...]:
    """SQL: attempts, tokens in, tokens out, cost (USD) and seconds of the grouped rows of a sums rollup."""
    return (
        func.coalesce(func.sum(table.attempts), 0),
        func.coalesce(func.sum(table.tokens_in), 0),
        func.coalesce(func.sum(table.tokens_out), 0),
        func.coalesce(func.sum(table.cost_usd), 0.0),
        func.coalesce(func.sum(table.seconds), 0.0),
    )


def usage(attempts: int, tokens_in: Any, tokens_out: Any, cost: Any, seconds: Any) -> Usage:
    return {
        "attempts": int(attempts),
        "tokens_in": int(tokens_in),
        "tokens_out": int(tokens_out),
        "cost_usd": round(float(cost), 6),
        "seconds": round(float(seconds), 3),
    }


def night_runs(session: Session, night: date, filters: Filters, request: PageRequest) -> Page[NightRunRow]:
    """The generation runs with attempts on `night`, newest first: first and last attempt that night,
    worlds, attempts, failed attempts, tokens, cost, seconds and the Prefect flow run id (when the run id is one)."""
    query = (
        select(  # type: ignore[call-overload]  # sqlmodel types select() for up to 4 columns
            StageRollup.run_id,
            func.min(StageRollup.first_at),
            func.max(StageRollup.last_at),
            worlds_in(),
            func.sum(StageRollup.failures),
            *usage_columns(),
        )
        .where(StageRollup.night == night, real_stages(), *filters.rollups(StageRollup))
        .group_by(StageRollup.run_id)
        .order_by(func.min(StageRollup.first_at).desc(), StageRollup.run_id)
    )
    rows: list[NightRunRow] = [
        {
            "run_id": run_id,
            "flow_run_id": flow_run_id(run_id),
            "first": iso(first),
            "last": iso(last),
            "worlds": worlds,
            "failed_attempts": int(failures or 0),
            **usage(*used),
        }
        for run_id, first, last, worlds, failures, *used in session.exec(request.apply(query)).all()
    ]
    return Page(rows, count_rows(session, query), request)


def night_stages(session: Session, night: date, filters: Filters) -> list[NightStageRow]:
    """Per stage that ran on `night` (pipeline order): worlds, invocations (attempts 1), first-attempt
    successes, repairs, failed attempts, usage, and its failure classes (error class -> failed attempts,
    most frequent first)."""
    stages: dict[str, NightStageRow] = {
        stage: {
            "stage": stage,
            "worlds": worlds,
            "invocations": int(n or 0),
            "first_attempt_success": int(first_ok or 0),
            "repaired": int(repaired or 0),
            "failed_attempts": int(failures or 0),
            **usage(*used),
            "failure_classes": {},
        }
        for stage, worlds, n, first_ok, repaired, failures, *used in session.exec(
            select(  # type: ignore[call-overload]  # sqlmodel types select() for up to 4 columns
                StageRollup.stage,
                worlds_in(),
                func.sum(StageRollup.invocations),
                func.sum(StageRollup.first_ok),
                func.sum(StageRollup.repaired),
                func.sum(StageRollup.failures),
                *usage_columns(),
            )
            .where(StageRollup.night == night, real_stages(), *filters.rollups(StageRollup))
            .group_by(StageRollup.stage)
        ).all()
    }
    failed = failures_by_night(filters)
    failures = func.sum(failed.failures)
    for stage, error_class, count in session.exec(
        select(failed.stage, failed.error_class, failures)
        .where(failed.night == night, real_stages(failed), *filters.rollups(failed))
        .group_by(failed.stage, failed.error_class)
        .order_by(failures.desc(), failed.error_class)
    ).all():
        if stage in stages:
            stages[stage]["failure_classes"][error_class_of(error_class)] = int(count)
    return [stages[s] for s in sorted(stages, key=pipeline_order)]


def stage_worlds(
    session: Session,
    night: date,
    stage: str,
    filters: Filters,
    request: PageRequest,
    error_class: str | None = None,
) -> Page[StageWorldRow]:
    """The worlds that ran `stage` on `night` (those that never succeeded first, then by env_id): attempts,
    failed attempts, whether it ended in a success, usage, the failure classes of its failed attempts, and
    its latest version's status. `error_class`: only worlds with a failed attempt of that class."""
    failed_here = [FailureRollup.night == night, FailureRollup.stage == stage, *filters.rollups(FailureRollup)]
    where = [StageRollup.night == night, StageRollup.stage == stage, *filters.rollups(StageRollup)]
    if error_class is not None:
        key = NO_KEY if error_class == UNCLASSIFIED else error_class
        classed = select(FailureRollup.env_id).where(*failed_here, FailureRollup.error_class == key)
        where.append(col(StageRollup.env_id).in_(classed))
    succeeded = func.max(case((col(StageRollup.first_ok) + StageRollup.repaired > 0, 1), else_=0))
    query = (
        select(StageRollup.env_id, succeeded, func.sum(StageRollup.failures), *usage_columns())
        .where(*where)
        .group_by(StageRollup.env_id)
        .order_by(succeeded, StageRollup.env_id)
    )
    rows: dict[str, StageWorldRow] = {
        env: {
            "env_id": env or None,
            "succeeded": bool(ok),
            "failed_attempts": int(failures or 0),
            **usage(*used),
            "failure_classes": {},
            "status": UNPUBLISHED,
        }
        for env, ok, failures, *used in session.exec(request.apply(query)).all()
    }
    envs = [env for env in rows if env != NO_KEY]
    if envs:
        for env, error, count in session.exec(
            select(FailureRollup.env_id, FailureRollup.error_class, func.sum(FailureRollup.failures))
            .where(*failed_here, col(FailureRollup.env_id).in_(envs))
            .group_by(FailureRollup.env_id, FailureRollup.error_class)
        ).all():
            rows[env]["failure_classes"][error_class_of(error)] = int(count)
        versions = select(EnvironmentVersion.env_id, EnvironmentVersion.status).where(
            col(EnvironmentVersion.env_id).in_(envs)
        )
        for env, status in session.exec(versions.order_by(col(EnvironmentVersion.version))).all():
            rows[env]["status"] = status  # the latest version's, read last
    return Page(list(rows.values()), count_rows(session, query), request)


def latest_version_column(env_id: Any, column: Any) -> Any:
    """SQL: `column` of the latest published version of the world `env_id` (a correlated lookup on the indexed
    env_id; NULL when it has none)."""
    return (
        select(column)
        .where(EnvironmentVersion.env_id == env_id)
        .order_by(col(EnvironmentVersion.version).desc())
        .limit(1)
        .scalar_subquery()
    )


def worlds_page(session: Session, filters: Filters, request: PageRequest, status: str | None = None) -> Page[WorldRow]:
    """Worlds with stage attempts, most expensive first: usage over all their stage attempts and their latest
    version's status (`unpublished` when none), failed stage and failure reason. `status`: only worlds in it."""
    sums: type[StageRollup] | type[WorldRollup]
    if filters.by_night_or_run:
        sums = StageRollup
        where = [StageRollup.env_id != NO_KEY, real_stages(), *filters.rollups(StageRollup)]
    else:  # a world's totals over every night and run (real stages)
        sums, where = WorldRollup, [WorldRollup.env_id != NO_KEY, *filters.rollups(WorldRollup)]
    used = (
        select(sums.env_id, *(column.label(f"u{i}") for i, column in enumerate(usage_columns(sums))))
        .where(*where)
        .group_by(sums.env_id)
        .subquery()
    )
    latest_status = latest_version_column(used.c.env_id, EnvironmentVersion.status)
    query = select(
        used.c.env_id,
        latest_status,
        latest_version_column(used.c.env_id, EnvironmentVersion.failed_stage),
        latest_version_column(used.c.env_id, EnvironmentVersion.failure_reason),
        *(used.c[f"u{i}"] for i in range(len(usage_columns()))),
    ).order_by(used.c.u3.desc(), used.c.env_id)  # u3: cost
    if status == UNPUBLISHED:
        query = query.where(latest_status.is_(None))
    elif status is not None:
        query = query.where(latest_status == status)
    rows: list[WorldRow] = [
        {
            "env_id": env,
            "status": state or UNPUBLISHED,
            "failed_stage": failed_stage,
            "failure_reason": reason,
            **usage(*totals),
        }
        for env, state, failed_stage, reason, *totals in session.exec(request.apply(query)).all()
    ]
    return Page(rows, count_rows(session, query), request)


def _version_row(version: EnvironmentVersion) -> VersionRow:
    return {
        "env_id": version.env_id,
        "version": version.version,
        "status": version.status,
        "failed_stage": version.failed_stage,
        "failure_reason": version.failure_reason,
        "backend": version.generator_backend,
        "model": version.generator_model,
        "created_at": iso(version.created_at),
    }


def failed_worlds(session: Session, filters: Filters, request: PageRequest) -> Page[VersionRow]:
    """Versions published as failed, newest first, with the stage they stopped at and the reason."""
    query = (
        select(EnvironmentVersion)
        .where(EnvironmentVersion.status != "good", *filters.versions(session))
        .order_by(col(EnvironmentVersion.created_at).desc(), col(EnvironmentVersion.id).desc())
    )
    rows = [_version_row(v) for v in session.exec(request.apply(query)).all()]
    return Page(rows, count_rows(session, query), request)


def world_versions(session: Session, env_id: str) -> list[VersionRow]:
    """Every published version of `env_id` (newest first): status, failed stage, reason, generator."""
    query = select(EnvironmentVersion).where(EnvironmentVersion.env_id == env_id)
    return [_version_row(v) for v in session.exec(query.order_by(col(EnvironmentVersion.version).desc())).all()]


def _attempt_row(attempt: StageAttempt) -> AttemptRow:
    return {
        "id": attempt.id,
        "run_id": attempt.run_id,
        "flow_run_id": flow_run_id(attempt.run_id),
        "env_id": attempt.env_id,
        "stage": attempt.stage,
        "attempt": attempt.attempt,
        "outcome": attempt.outcome,
        "error_class": attempt.error_class,
        "error_text": attempt.error_text,
        "tokens_in": attempt.tokens_in,
        "tokens_out": attempt.tokens_out,
        "cost_usd": round(attempt.cost_usd, 6),
        "seconds": round(attempt.seconds, 3),
        "created_at": iso(attempt.created_at),
    }


def world_attempts(session: Session, env_id: str, request: PageRequest, stage: str | None = None) -> Page[AttemptRow]:
    """The stage attempts of `env_id` (of `stage` when given), in the order they were made, each in full."""
    query = select(StageAttempt).where(StageAttempt.env_id == env_id)
    if stage is not None:
        query = query.where(StageAttempt.stage == stage)
    query = query.order_by(col(StageAttempt.created_at), col(StageAttempt.id))
    rows = [_attempt_row(a) for a in session.exec(request.apply(query)).all()]
    return Page(rows, count_rows(session, query), request)


def attempt(session: Session, attempt_id: int) -> AttemptRow | None:
    """One stage attempt in full, or None."""
    row = session.get(StageAttempt, attempt_id)
    return _attempt_row(row) if row is not None else None


def failure_classes_by_night(session: Session, filters: Filters, top: int = 8) -> FailureClasses:
    """Failed attempts per night by `stage: error class`, as series aligned with `nights` (every night with
    attempts): the `top` most frequent pairs, the rest summed as `other`. Aggregated in SQL over the rollups."""
    failed, sums = failures_by_night(filters), sums_by_night(filters)
    rows = session.exec(
        select(col(failed.night), failed.stage, failed.error_class, func.sum(failed.failures))
        .where(real_stages(failed), *filters.rollups(failed))
        .group_by(col(failed.night), failed.stage, failed.error_class)
    ).all()
    ran = select(col(sums.night)).where(real_stages(sums), *filters.rollups(sums)).distinct()
    nights = sorted(str(day) for day in session.exec(ran).all())  # nights without failures read as zeros
    counts: dict[str, dict[str, int]] = {}
    for day, stage, error_class, count in rows:
        key = f"{stage}: {error_class_of(error_class)}"
        counts.setdefault(key, {})[str(day)] = counts.get(key, {}).get(str(day), 0) + int(count)
    ranked = sorted(counts, key=lambda key: (-sum(counts[key].values()), key))
    series = {key: [counts[key].get(n, 0) for n in nights] for key in sorted(ranked[:top], key=pipeline_order)}
    if len(ranked) > top:
        series["other"] = [sum(counts[key].get(n, 0) for key in ranked[top:]) for n in nights]
    return {"nights": nights, "series": series}
