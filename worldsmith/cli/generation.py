"""`worldsmith generate`: environments made by the `generate` flow. Its options are the fields of
GenerateParameters (worldsmith/tasks/parameters.py, see `worldsmith/cli/config_options.py`). The flow
imports Prefect, so it is imported when the command runs."""

from __future__ import annotations

import shlex
import signal
import sys
from typing import TYPE_CHECKING

import typer
from rich.progress import Progress
from rich.table import Table

from worldsmith.cli.config_options import ConfigValues, config_command, options_for
from worldsmith.cli.console import console, failure
from worldsmith.cli.run_log import flow_logs
from worldsmith.runtime.answers import one_line
from worldsmith.tasks.parameters import GenerateParameters

if TYPE_CHECKING:
    from worldsmith.flows.interruption import Interrupted

app = typer.Typer()


GENERATE_OPTIONS = options_for(GenerateParameters, flags={"scenario_file": "--scenarios"})


@app.command("generate")
@config_command(GENERATE_OPTIONS)
def generate_command(fields: ConfigValues) -> None:
    """Generate environments with the `generate` flow (configured Prefect API, or an ephemeral local one)."""
    # refused in one line (a replay:DIR without a recording...) before Prefect starts, by the root handler
    params = GenerateParameters.model_validate(fields)
    if params.resolved_backend() == "openai":  # an endpoint that cannot answer: one line, before any work
        from worldsmith.llm.endpoint_check import check_endpoint, configured_endpoint
        from worldsmith.models.runs import RunKind
        from worldsmith.storage.run_records import recorded_if_refused

        model_setting = "--model" if params.model else "WORLDSMITH_LLM_MODEL"
        with recorded_if_refused(RunKind.GENERATE, f"{params.count} worlds (openai)"):  # a dashboard page
            check_endpoint(configured_endpoint("the model endpoint", params.model, model_setting))
    from worldsmith.flows.generate import TooFewGoodWorlds, run_generate
    from worldsmith.flows.interruption import Interrupted

    ended: Exception | None = None  # the run ended Failed: its one line, after the progress bar and table
    stopped: Interrupted | None = None  # the run was stopped by a signal: its one line, after the progress bar
    # stdout stays the real one: Prefect serialises the run context for Dask workers
    with flow_logs("generate"), Progress(console=console, redirect_stdout=False, redirect_stderr=False) as progress:
        bar = progress.add_task(f"generating environments ({params.resolved_backend()})", total=params.count)
        try:
            results = run_generate(params, on_progress=lambda summary: progress.advance(bar))
        except Interrupted as exc:  # Ctrl-C or SIGTERM: the finished worlds are kept
            stopped = exc
        except TooFewGoodWorlds as exc:  # after the run's summary
            results, ended = exc.results, exc
        except Exception as exc:
            if not getattr(exc, "fatal", False):
                raise
            results, ended = [], exc  # a fatal fault (wrong endpoint settings) stopped the run
    if stopped is not None:
        raise failure(interrupted_line(stopped, params), stopped.exit_code)
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


def interrupted_line(stopped: Interrupted, params: GenerateParameters) -> str:
    """The one line of a run stopped by a signal: what was kept, and the command that resumes it (this
    one, its seed pinned: an unset seed is the day's, and a rerun tomorrow would make other worlds)."""
    rerun = ["worldsmith", *sys.argv[1:]]
    if params.seed is None:
        rerun += ["--seed", str(params.resolved_seed())]
    kept = f"{len(stopped.kept)} of {params.count} worlds kept"
    return (
        f"interrupted by {signal.Signals(stopped.signum).name}: {kept}, the rest not started or stopped "
        f"unrecorded; to resume (finished stages reused, nothing duplicated), run: {shlex.join(rerun)}"
    )
