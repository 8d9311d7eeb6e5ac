"""The dashboard's runs: every run the catalog records with its status (`/runs`, the front page's latest),
one run's page naming how it ended (`/runs/{kind}/{id}`: its error, the stage it died in), and the
scenario stage's runs of a night (the stage runs once per generation run, before any world exists, so its
page lists runs, not worlds). Read through `worldsmith/storage/run_listing.py`, as `runs ls` reads them."""

from __future__ import annotations

from datetime import date

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from worldsmith.dashboard.drilldown import sums_by_night
from worldsmith.dashboard.filters import Filters
from worldsmith.dashboard.paging import Page, PageRequest
from worldsmith.dashboard.rows import ScenarioRunRow
from worldsmith.models.catalog import RunRecord
from worldsmith.models.runs import RunKind, RunStatus
from worldsmith.stages.order import Stage
from worldsmith.storage.run_listing import ListedRun, recorded_runs, run_status

#: The runs the front page lists.
LATEST_RUNS = 10


def runs_page(
    session: Session, request: PageRequest, kind: RunKind | None, status: RunStatus | None
) -> Page[ListedRun]:
    """One page of the recorded runs (of `kind`, with `status`), newest first. The runs are listed as
    `runs ls` lists them and paged here: there are a few a night, not the thousands of attempts."""
    rows = [row for row in recorded_runs(session, kind) if status is None or row["status"] == status]
    return Page(rows[request.offset : request.offset + request.limit], len(rows), request)


def scenario_runs(session: Session, night: date, filters: Filters) -> list[ScenarioRunRow]:
    """The generation runs that ran the scenario stage on `night`: attempts, failed attempts, usage, and
    whether the stage succeeded for the run: an attempt succeeded and the run did not die in the stage
    (its record's `failed_stage`), so a run that ended there never reads `succeeded`."""
    sums = sums_by_night(filters)
    ok = func.max(case((col(sums.first_ok) + sums.repaired > 0, 1), else_=0))
    rows = session.exec(
        select(  # type: ignore[call-overload]  # sqlmodel types select() for up to 4 columns
            sums.run_id,
            ok,
            func.sum(sums.failures),
            func.sum(sums.attempts),
            func.sum(sums.tokens_in),
            func.sum(sums.tokens_out),
            func.sum(sums.cost_usd),
            func.sum(sums.seconds),
        )
        .where(sums.night == night, sums.stage == Stage.SCENARIO.value, *filters.rollups(sums))
        .group_by(sums.run_id)
        .order_by(ok, sums.run_id)
    ).all()
    records = {
        r.run_id: r
        for r in session.exec(select(RunRecord).where(col(RunRecord.run_id).in_([row[0] for row in rows]))).all()
    }
    found: list[ScenarioRunRow] = []
    for run_id, succeeded, failures, attempts, tokens_in, tokens_out, cost, seconds in rows:
        record = records.get(run_id)
        died_here = record is not None and record.metrics.get("failed_stage") == Stage.SCENARIO.value
        error = record.metrics.get("error") if record is not None else None
        found.append(
            {
                "run_id": run_id,
                "succeeded": bool(succeeded) and not died_here,
                "failed_attempts": int(failures or 0),
                "attempts": int(attempts or 0),
                "tokens_in": int(tokens_in or 0),
                "tokens_out": int(tokens_out or 0),
                "cost_usd": round(float(cost or 0.0), 6),
                "seconds": float(seconds or 0.0),
                "run_status": run_status(record).value if record is not None else None,
                "error": error if isinstance(error, str) else None,
            }
        )
    return found
