"""`worldsmith generate`: environments made by the `generate` flow. The flow imports Prefect, so
it is imported when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from worldsmith.cli.console import console

app = typer.Typer()


@app.command("generate")
def generate_command(
    count: Annotated[int, typer.Option(help="Environments to generate.")] = 10,
    backend: Annotated[
        str, typer.Option(help="procedural (offline) or openai (WORLDSMITH_LLM_* settings).")
    ] = "procedural",
    model: Annotated[str | None, typer.Option(help="Model of the openai backend.")] = None,
    seed: Annotated[int, typer.Option(help="Generation seed.")] = 0,
    concurrency: Annotated[int, typer.Option(help="Environments built at once.")] = 4,
    scenarios: Annotated[Path | None, typer.Option(help="Seed scenarios (JSON lines).")] = None,
    max_attempts: Annotated[int, typer.Option(help="Attempts of each stage's repair loop.")] = 5,
    fault_rate: Annotated[
        float, typer.Option(help="Procedural backend: share of first attempts that fail like LLM output.")
    ] = 0.0,
) -> None:
    """Generate environments with the `generate` flow (configured Prefect API, or an ephemeral local one)."""
    from worldsmith.flows.generate import run_generate
    from worldsmith.tasks.generation_run import GenerateParameters

    params = GenerateParameters(
        count=count,
        backend=backend,
        model=model,
        seed=seed,
        concurrency=concurrency,
        scenario_file=str(scenarios) if scenarios else None,
        max_attempts=max_attempts,
        fault_rate=fault_rate,
    )
    # stdout stays the real one: Prefect serialises the run context for Dask workers
    with Progress(console=console, redirect_stdout=False, redirect_stderr=False) as progress:
        bar = progress.add_task("generating environments", total=count)
        results = run_generate(params, on_progress=lambda summary: progress.advance(bar))
    table = Table(title=f"{len(results)} environments")
    for column in ("env", "status", "reason"):
        table.add_column(column)
    for r in results:
        table.add_row(r["ref"] or r["env_id"], r["status"], (r["reason"] or "")[:100])
    console.print(table)
    raise typer.Exit(0 if all(r["status"] == "good" for r in results) else 1)
