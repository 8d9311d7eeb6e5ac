"""`worldsmith runs ls`: the generation, curation, evaluation and training runs the catalog records,
newest first, with their status (running, completed, failed, cancelled, crashed), key metrics and
Prefect flow run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from worldsmith.cli.console import console
from worldsmith.models.runs import RunKind

if TYPE_CHECKING:
    from worldsmith.storage.run_listing import ListedRun

app = typer.Typer(
    help="List the runs the catalog records (generation, curation, evaluation, training).", no_args_is_help=True
)


def _metric(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _summary(row: ListedRun) -> str:
    """The key metrics of a row in one cell (unrecorded ones left out)."""
    return ", ".join(f"{k.removesuffix('_rate')} {_metric(v)}" for k, v in row["metrics"].items() if v is not None)


@app.command("ls")
def runs_ls(
    kind: Annotated[RunKind | None, typer.Option(help="List only runs of this kind.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="List at most this many runs (the newest).")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List recorded runs, newest first: kind, id, status, set, what ran, key metrics, start and Prefect flow run."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.run_listing import recorded_runs

    with open_catalog().session() as session:
        rows = recorded_runs(session, kind, limit)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(rows)} runs" + (f" ({kind.value})" if kind else "") + ", newest first")
    for column in ("kind", "id", "status", "set", "what", "metrics", "started (UTC)", "flow run"):
        table.add_column(column, overflow="fold")
    for r in rows:
        status = r["status"] or "-"  # "-": a generation run of a catalog older than run records
        if r["failed_stage"]:
            status += f" ({r['failed_stage']} stage)"
        if r["error"]:
            status += f": {r['error'][:80]}"
        table.add_row(
            r["kind"],
            r["id"],
            status,
            r["set"] or "",
            r["what"],
            _summary(r),
            (r["started_at"] or "")[:16].replace("T", " "),  # to the minute, in UTC
            r["flow_run_id"] or "",
        )
    console.print(table)
