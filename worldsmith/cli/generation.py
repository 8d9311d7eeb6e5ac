"""`worldsmith generate`: environments made by the `generate` flow. The flow imports Prefect, so
it is imported when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from worldsmith.cli.console import console, failure
from worldsmith.runtime.answers import one_line

app = typer.Typer()


@app.command("generate")
def generate_command(
    count: Annotated[int, typer.Option(help="Environments to generate.")] = 10,
    backend: Annotated[
        str | None,
        typer.Option(
            help="procedural (offline), openai (WORLDSMITH_LLM_* settings) or replay:DIR (answers recorded with "
            "--record DIR); default: openai when WORLDSMITH_LLM_BASE_URL or _API_KEY is set, else procedural."
        ),
    ] = None,
    record: Annotated[
        Path | None, typer.Option(help="Keep every request and answer of the run in this directory (for replay:DIR).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model of the openai backend.")] = None,
    seed: Annotated[int, typer.Option(help="Generation seed.")] = 0,
    concurrency: Annotated[int, typer.Option(help="Environments built at once.")] = 4,
    scenarios: Annotated[Path | None, typer.Option(help="Seed scenarios (JSON lines).")] = None,
    max_attempts: Annotated[int, typer.Option(help="Attempts of each stage's repair loop.")] = 5,
    fault_rate: Annotated[
        float, typer.Option(help="Procedural backend: share of first attempts that fail like LLM output.")
    ] = 0.0,
    min_good_share: Annotated[
        float,
        typer.Option(help="Exit 1 with one line (the flow run ends Failed) when under this share of worlds is good."),
    ] = 0.5,
    review: Annotated[
        bool,
        typer.Option(
            help="Have the model review each world; each suspected bug is probed, confirmed ones repaired "
            "(not for the procedural backend)."
        ),
    ] = False,
) -> None:
    """Generate environments with the `generate` flow (configured Prefect API, or an ephemeral local one)."""
    from worldsmith.tasks.generation_run import GenerateParameters

    params = GenerateParameters(  # refused in one line (a replay:DIR without a recording...) before Prefect starts
        count=count,
        backend=backend,
        record=str(record) if record else None,
        model=model,
        seed=seed,
        concurrency=concurrency,
        scenario_file=str(scenarios) if scenarios else None,
        max_attempts=max_attempts,
        fault_rate=fault_rate,
        min_good_share=min_good_share,
        review=review,
    )
    from worldsmith.flows.generate import TooFewGoodWorlds, run_generate

    ended: Exception | None = None  # the run ended Failed: its one line, after the progress bar and table
    # stdout stays the real one: Prefect serialises the run context for Dask workers
    with Progress(console=console, redirect_stdout=False, redirect_stderr=False) as progress:
        bar = progress.add_task(f"generating environments ({params.resolved_backend()})", total=count)
        try:
            results = run_generate(params, on_progress=lambda summary: progress.advance(bar))
        except TooFewGoodWorlds as exc:  # after the run's summary
            results, ended = exc.results, exc
        except Exception as exc:
            if not getattr(exc, "fatal", False):
                raise
            results, ended = [], exc  # a fatal fault (wrong endpoint settings) stopped the run
    if results:
        table = Table(title=f"{len(results)} environments")
        for column in ("env", "status", "stage"):
            table.add_column(column, no_wrap=True)  # a ref in full, whatever the terminal's width
        table.add_column("reason")
        for r in results:
            reason = (r.reason or "")[:100]
            table.add_row(r.ref or r.env_id, r.status, r.failed_stage or "", reason)
        console.print(table)
    if ended is not None:
        raise failure(one_line(str(ended)), 1)
    raise typer.Exit(0 if all(r.good for r in results) else 1)
