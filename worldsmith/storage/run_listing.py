"""The runs the catalog records, as one newest-first listing (`worldsmith runs ls`, the dashboard's runs
page): generation runs (their `RunRecord` and the stage attempts of their `run_id`, with their first and
last attempt, worlds and outcomes), curation runs, evaluation runs and training runs (GRPO, co-training,
world model), each with its status (a `RunStatus`: a run of this host still reading `running` whose
process is gone reads `crashed`), key metrics and the Prefect flow run it ran in where one was recorded."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TypedDict

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.catalog import (
    NO_KEY,
    EnvironmentSet,
    EnvironmentVersion,
    EvaluationRun,
    RunRecord,
    StageRollup,
    TrainingRun,
    TrainingStep,
)
from worldsmith.models.evaluation import EvaluationSummary, stored_overall
from worldsmith.models.runs import RunKind, RunStatus
from worldsmith.storage.run_owner import process_alive

#: `TrainingRun.config["kind"]` of each training kind (GRPO runs have none).
_TRAINING_KINDS = {None: RunKind.TRAIN, "cotrain": RunKind.COTRAIN, "world_model": RunKind.WORLD_MODEL}


class ListedRun(TypedDict):
    """One run of the listing (`worldsmith runs ls --json` prints them as they are)."""

    kind: str  # a RunKind's value
    id: str  # a number for evaluation and training runs, the run id for the others
    status: str | None  # a RunStatus's value; None: a generation run of a catalog older than run records
    set: str | None  # the environment set's name
    what: str  # what ran: policy, model or worlds
    metrics: JsonObject  # the key metrics of its kind, by name (None: not recorded)
    error: str | None
    failed_stage: str | None  # the stage a generation run died in (the scenario stage)
    flow_run_id: str | None
    started_at: str | None  # ISO 8601, UTC
    finished_at: str | None  # a generation run's last attempt


def run_status(run: EvaluationRun | TrainingRun | RunRecord) -> RunStatus:
    """The run's status, `crashed` for a run that reads `running` although the process that ran it on
    this host has died (its pid no longer names the process started at the recorded time: killed
    outside a worker, so no hook marked it). A run of another host reads as it recorded itself."""
    if run.status == RunStatus.RUNNING and process_alive(run.metrics.get("process")) is False:
        return RunStatus.CRASHED
    return RunStatus(run.status)


def _iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC (a database that keeps no time zone gives naive UTC times), so rows sort as text."""
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).isoformat(timespec="seconds")


def flow_run_id(run_id: str) -> str | None:
    """A generation run's id is its Prefect flow run's id (a UUID) when it ran in one."""
    try:
        return str(uuid.UUID(run_id))
    except ValueError:
        return None


def _error(run: EvaluationRun | TrainingRun | RunRecord) -> str | None:
    """The error a failed run recorded in its metrics (None: none)."""
    error = run.metrics.get("error")
    return None if error is None else str(error)


def generation_runs(session: Session, limit: int | None = None) -> list[ListedRun]:
    """Generation runs, newest first: their status (from their `RunRecord`), first and last attempt,
    worlds attempted and how they ended (published good, published failed, neither: a duplicate of
    another world, or not finished), attempts, failed attempts, tokens and cost. Aggregated in SQL over
    the stage-attempt rollups (never every attempt). A run
    that recorded no attempt (refused, or failed before its first) is listed from its record alone."""
    first = func.min(StageRollup.first_at)
    query = (
        select(  # type: ignore[call-overload]  # sqlmodel types select() for up to 4 columns
            StageRollup.run_id,
            first,
            func.max(StageRollup.last_at),
            func.count(func.distinct(func.nullif(StageRollup.env_id, NO_KEY))),
            func.sum(StageRollup.attempts),
            func.sum(StageRollup.failures),
            func.coalesce(func.sum(StageRollup.tokens_in), 0),
            func.coalesce(func.sum(StageRollup.tokens_out), 0),
            func.coalesce(func.sum(StageRollup.cost_usd), 0.0),
        )
        .group_by(StageRollup.run_id)
        .order_by(first.desc())
    )
    if limit is not None:
        query = query.limit(limit)
    runs = session.exec(query).all()
    run_ids = [row[0] for row in runs]
    outcomes: dict[str, dict[str, int]] = {run_id: {"good": 0, "failed": 0} for run_id in run_ids}
    if run_ids:
        worlds = (
            select(StageRollup.run_id, StageRollup.env_id)
            .where(col(StageRollup.run_id).in_(run_ids), StageRollup.env_id != NO_KEY)
            .distinct()
        )
        published = (
            select(EnvironmentVersion.env_id, func.max(case((col(EnvironmentVersion.status) == "good", 1), else_=0)))
            .group_by(EnvironmentVersion.env_id)
            .subquery()
        )
        world_rows = worlds.subquery()
        for run_id, good in session.exec(
            select(world_rows.c.run_id, published.c[1]).join(published, published.c.env_id == world_rows.c.env_id)
        ).all():
            outcomes[run_id]["good" if good else "failed"] += 1
    records = _records(session, {RunKind.GENERATE}, limit)
    with_attempts = {
        record.run_id: record
        for record in session.exec(select(RunRecord).where(col(RunRecord.run_id).in_(run_ids))).all()
    }
    rows: list[ListedRun] = []
    for run_id, first, last, worlds_n, attempts, failed_attempts, tokens_in, tokens_out, cost in runs:
        good, failed = outcomes[run_id]["good"], outcomes[run_id]["failed"]
        record = with_attempts.get(run_id)
        row = (
            _recorded_row(record, RunKind.GENERATE)
            if record
            else _unrecorded_generation(run_id, _iso(first), _iso(last))
        )
        row["what"] = f"{worlds_n} worlds"
        row["metrics"] = {
            "worlds": worlds_n,
            "good": good,
            "failed": failed,
            "unpublished": worlds_n - good - failed,
            "attempts": attempts,
            "failed_attempts": int(failed_attempts or 0),
            "tokens_in": int(tokens_in),
            "tokens_out": int(tokens_out),
            "cost_usd": round(float(cost), 6),
        }
        rows.append(row)
    rows += [_recorded_row(record, RunKind.GENERATE) for record in records if record.run_id not in outcomes]
    rows.sort(key=lambda row: row["started_at"] or "", reverse=True)
    return rows[:limit] if limit is not None else rows


def _unrecorded_generation(run_id: str, first: str | None, last: str | None) -> ListedRun:
    """A generation run of a catalog older than run records: its attempts alone, no status."""
    return {
        "kind": RunKind.GENERATE.value,
        "id": run_id,
        "status": None,
        "set": None,
        "what": "",
        "metrics": {},
        "error": None,
        "failed_stage": None,
        "flow_run_id": flow_run_id(run_id),
        "started_at": first,
        "finished_at": last,
    }


def _records(session: Session, kinds: set[RunKind], limit: int | None) -> list[RunRecord]:
    """The run records of `kinds`, newest first."""
    query = (
        select(RunRecord)
        .where(col(RunRecord.kind).in_([k.value for k in kinds]))
        .order_by(col(RunRecord.started_at).desc())
    )
    return list(session.exec(query.limit(limit) if limit is not None else query).all())


def _recorded_row(record: RunRecord, kind: RunKind) -> ListedRun:
    """A run as its `RunRecord` holds it (its metrics are those of its kind's flow: a curation's members)."""
    failed_stage = record.metrics.get("failed_stage")
    return {
        "kind": kind.value,
        "id": record.run_id,
        "status": run_status(record).value,
        "set": None,
        "what": record.what,
        "metrics": {k: v for k, v in record.metrics.items() if k not in ("process", "error", "failed_stage")},
        "error": _error(record),
        "failed_stage": failed_stage if isinstance(failed_stage, str) else None,
        "flow_run_id": record.flow_run_id,
        "started_at": _iso(record.started_at),
        "finished_at": _iso(record.finished_at),
    }


def recorded_runs_of(session: Session, kind: RunKind, limit: int | None = None) -> list[ListedRun]:
    """Runs of `kind` that only a `RunRecord` holds: curation runs, and evaluation or training runs refused
    before they opened their own row."""
    if kind == RunKind.GENERATE:  # a generation run's record is listed with its outcomes (generation_runs)
        return []
    return [_recorded_row(record, kind) for record in _records(session, {kind}, limit)]


def set_names(session: Session) -> dict[int | None, str]:
    """Each stored set's name by id, keyed as a run's `set_id` reads (None, a run of no set, names none)."""
    return {s.id: s.name for s in session.exec(select(EnvironmentSet)).all()}


def evaluation_runs(session: Session, limit: int | None = None) -> list[ListedRun]:
    """Evaluation runs, newest first: policy, set, samples, pass@1, pass@k (k = samples), episodes and
    the env_error, agent_error and format_error rates."""
    names = set_names(session)
    query = select(EvaluationRun).order_by(col(EvaluationRun.started_at).desc(), col(EvaluationRun.id).desc())
    rows: list[ListedRun] = []
    for run in session.exec(query.limit(limit) if limit is not None else query).all():
        overall = stored_overall(run.metrics)  # None while running, or failed
        metrics: JsonObject = {"pass@1": overall.pass_at_1 if overall else None}
        if run.samples > 1:
            metrics[f"pass@{run.samples}"] = overall.pass_at(run.samples) if overall else None
        metrics |= {
            "episodes": overall.episodes if overall else None,
            "env_error_rate": overall.env_error_rate if overall else None,
            "agent_error_rate": overall.agent_error_rate if overall else None,
            "format_error_rate": overall.format_error_rate if overall else None,
        }
        rows.append(
            {
                "kind": RunKind.EVALUATE.value,
                "id": str(run.id),
                "status": run_status(run).value,
                "set": names.get(run.set_id),
                "what": f"{run.policy} ({run.metrics.get('world', 'real')} worlds, {run.samples} sample(s))",
                "metrics": metrics,
                "error": _error(run),
                "failed_stage": None,
                "flow_run_id": run.flow_run_id,
                "started_at": _iso(run.started_at),
                "finished_at": _iso(run.finished_at),
            }
        )
    return rows


def _training_metrics(kind: RunKind, run: TrainingRun, last_step: Mapping[str, JsonValue]) -> JsonObject:
    """What says how a training run went: GRPO: steps, the last step's reward and success rate,
    validation pass@1 before and after; co-training: rounds, the last round's real success rate and
    evaluation; world model: steps and the last loss."""
    m = run.metrics
    if kind == RunKind.COTRAIN:
        return {
            "rounds": m.get("rounds"),
            "real_success_rate": last_step.get("real_success_rate"),
            "eval_pass@1": last_step.get("eval_pass@1"),
        }
    if kind == RunKind.WORLD_MODEL:
        return {"steps": m.get("steps"), "transitions": run.config.get("transitions"), "loss": last_step.get("loss")}
    before, after = (EvaluationSummary.model_validate(m[key]) if m.get(key) else None for key in ("before", "after"))
    return {
        "steps": m.get("steps"),
        "reward": last_step.get("reward"),
        "success_rate": last_step.get("success_rate"),
        "pass@1_before": before.scores.pass_at_1 if before else None,
        "pass@1_after": after.scores.pass_at_1 if after else None,
    }


def trained_model(run: TrainingRun, cotrain: bool) -> JsonValue:
    """The model a training run trained from, as its config records it: a co-training run's policy's."""
    if not cotrain:
        return run.config.get("model")
    policy = run.config.get("policy", {})
    return policy.get("model") if isinstance(policy, dict) else None


def training_runs(session: Session, kinds: set[RunKind], limit: int | None = None) -> list[ListedRun]:
    """Training runs of `kinds` (train, cotrain, world-model), newest first, with their key metrics."""
    names = set_names(session)
    rows: list[ListedRun] = []
    query = select(TrainingRun).order_by(col(TrainingRun.started_at).desc(), col(TrainingRun.id).desc())
    for run in session.exec(query).all():
        config_kind = run.config.get("kind")
        kind = _TRAINING_KINDS.get(config_kind if isinstance(config_kind, str) else None, RunKind.TRAIN)
        if kind not in kinds:
            continue
        last = session.exec(
            select(TrainingStep).where(TrainingStep.training_run_id == run.id).order_by(col(TrainingStep.step).desc())
        ).first()
        model = trained_model(run, cotrain=kind == RunKind.COTRAIN)
        rows.append(
            {
                "kind": kind.value,
                "id": str(run.id),
                "status": run_status(run).value,
                "set": names.get(run.set_id),
                "what": str(model),
                "metrics": _training_metrics(kind, run, last.metrics if last else {}),
                "error": _error(run),
                "failed_stage": None,
                "flow_run_id": run.flow_run_id,
                "started_at": _iso(run.started_at),
                "finished_at": _iso(run.finished_at),
            }
        )
        if limit is not None and len(rows) == limit:
            break
    return rows


def recorded_runs(session: Session, kind: RunKind | None = None, limit: int | None = None) -> list[ListedRun]:
    """Every recorded run (or those of `kind`), newest first (by start), at most `limit` of them. Each row:
    kind, id (a number for evaluation and training runs, the run id for the others), status, set, what ran
    (policy, model, worlds), key metrics, error, failed_stage, flow_run_id, started_at and finished_at."""
    kinds = set(RunKind) if kind is None else {kind}
    rows: list[ListedRun] = []
    if RunKind.GENERATE in kinds:
        rows += generation_runs(session, limit)
    if RunKind.EVALUATE in kinds:
        rows += evaluation_runs(session, limit)
    training = kinds - {RunKind.GENERATE, RunKind.CURATE, RunKind.EVALUATE}
    if training:
        rows += training_runs(session, training, limit)
    for recorded in kinds:
        rows += recorded_runs_of(session, recorded, limit)
    rows.sort(key=lambda row: row["started_at"] or "", reverse=True)
    return rows[:limit] if limit is not None else rows


def listed_run(session: Session, kind: RunKind, run_id: str) -> ListedRun | None:
    """The run `run_id` of `kind` as the listing shows it (the dashboard's run page), None when there is none."""
    return next((row for row in recorded_runs(session, kind) if row["id"] == run_id), None)
