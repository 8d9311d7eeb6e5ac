"""`worldsmith runs ls`: the generation, curation, evaluation and training runs the catalog records,
newest first, with their status (running, completed, failed, cancelled, crashed), key metrics and
Prefect flow run."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from worldsmith.cli.console import console

if TYPE_CHECKING:
    from worldsmith.storage.run_listing import ListedRun

app = typer.Typer(
    help="List the runs the catalog records (generation, curation, evaluation, training).", no_args_is_help=True
)


class Kind(StrEnum):
    """The choices of `--kind`: the values of worldsmith/storage/run_listing.RunKind, which loads the catalog's
    libraries, so the CLI does not import it when it starts (tests/cli/test_cli_listings.py holds the two equal)."""

    GENERATE = "generate"
    CURATE = "curate"
    EVALUATE = "evaluate"
    TRAIN = "train"
    COTRAIN = "cotrain"
    WORLD_MODEL = "world-model"


def _metric(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _summary(row: ListedRun) -> str:
    """The key metrics of a row in one cell (unrecorded ones left out)."""
    return ", ".join(f"{k.removesuffix('_rate')} {_metric(v)}" for k, v in row["metrics"].items() if v is not None)


@app.command("ls")
def runs_ls(
    kind: Annotated[Kind | None, typer.Option(help="List only runs of this kind.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="List at most this many runs (the newest).")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List recorded runs, newest first: kind, id, status, set, what ran, key metrics, start and Prefect flow run."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.run_listing import RunKind, recorded_runs

    with open_catalog().session() as session:
        rows = recorded_runs(session, RunKind(kind.value) if kind else None, limit)
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
