"""The `worldsmith` command line (typer): one module per command group, assembled here.

`app` is the console script (`worldsmith = "worldsmith.cli:app"` in pyproject.toml). Modules import
what they use at their top (the bundle contract, the runtime, the pydantic configs the options are
derived from), except the heavy parts, which a command imports when it runs, so that the CLI starts
quickly: the flows (Prefect) and with them the training stack (torch, transformers, trl), the
catalog's database (SQLAlchemy, Alembic), the MCP gateway (mcp), the dashboard and its server
(plotly, uvicorn) and the world models (openai). tests/cli/test_cli_startup.py holds the CLI to that.
The callback below thereby also sets Prefect's environment before Prefect is first imported.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from worldsmith.cli import (
    catalog,
    config,
    curation,
    data,
    env,
    evaluation,
    generation,
    interop,
    models,
    runs,
    sets,
    stack,
    status,
    tasks,
    training,
    wm,
)
from worldsmith.cli.console import AnsweringGroup, quiet_expected_failures
from worldsmith.cli.run_log import VERBOSE
from worldsmith.ops.stack import Stack
from worldsmith.settings import get_settings

app = typer.Typer(
    cls=AnsweringGroup,
    help="Manufacture executable tool-use worlds for LLM agents and train agents in them.",
    no_args_is_help=True,
)


def _print_version(wanted: bool) -> None:
    """`--version`: the installed distribution's version, then exit."""
    if wanted:
        from importlib.metadata import version

        typer.echo(f"worldsmith {version('worldsmith')}")
        raise typer.Exit()


@app.callback()
def _defaults(
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version of worldsmith and exit."
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", help="Show the flow runs' log lines on the terminal (always in the log file named)."),
    ] = False,
) -> None:
    """Keep Prefect's local state under WORLDSMITH_HOME and its analytics off unless configured; use the
    local stack's Prefect server when `worldsmith up` started one and no PREFECT_API_URL is set. Without
    `--verbose`, Prefect's log lines of a command's flow runs go to a log file only (cli/run_log.py)."""
    VERBOSE["on"] = verbose
    quiet_expected_failures()  # a flow run's expected failure: its one line, not Prefect's traceback
    home = get_settings().ensure_home()  # a new home at the default place is announced on stderr
    if "PREFECT_HOME" not in os.environ:
        (home / "prefect").mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str((home / "prefect").resolve())
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if "PREFECT_API_URL" not in os.environ:  # flows report to the server of `worldsmith up` when it runs
        local_stack = Stack.current()
        if local_stack.server().pid() is not None:
            os.environ["PREFECT_API_URL"] = local_stack.api_url


# the order of `worldsmith --help`: top-level commands, then the command groups
for commands in (generation.app, curation.app, evaluation.app, training.app, stack.app, status.app):
    app.add_typer(commands)
for name, group in (
    ("env", env.app),
    ("catalog", catalog.app),
    ("sets", sets.app),
    ("tasks", tasks.app),
    ("runs", runs.app),
    ("config", config.app),
    ("models", models.app),
    ("data", data.app),
    ("import", interop.import_app),
    ("export", interop.export_app),
    ("wm", wm.app),
):
    app.add_typer(group, name=name)
