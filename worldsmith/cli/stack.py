"""`worldsmith up`, `down`, `dashboard` and `demo`: the local stack (Prefect server, work pools,
deployments, workers, dashboard) and the main job run on it (its options the fields of DemoOptions)."""

from __future__ import annotations

from typing import Annotated

import typer

from worldsmith.cli.config_options import ConfigValues, config_command, options_for
from worldsmith.cli.console import console, failure, say
from worldsmith.demo import DemoOptions, run_demo
from worldsmith.ops.services import ServiceError
from worldsmith.ops.stack import Stack, WorkPool, parse_pool_types, requested_workers
from worldsmith.settings import get_settings

app = typer.Typer()


@app.command("up")
def up(
    worker: Annotated[
        list[WorkPool] | None,
        typer.Option(help="Also start a worker on this work pool, besides the local one (repeatable)."),
    ] = None,
    dashboard: Annotated[bool, typer.Option(help="Also serve the dashboard.")] = True,
    pool_type: Annotated[
        list[str] | None,
        typer.Option(
            help="Create this pool as a docker or kubernetes pool, with its job template from deployments/ "
            "(POOL=TYPE, e.g. gpu=kubernetes; repeatable; default process)."
        ),
    ] = None,
    prefect_port: Annotated[
        int | None,
        typer.Option(
            min=0, max=65535, help="Port of the Prefect server (default WORLDSMITH_PREFECT_PORT; 0: any free port)."
        ),
    ] = None,
    dashboard_port: Annotated[
        int | None,
        typer.Option(
            min=0, max=65535, help="Port of the dashboard (default WORLDSMITH_DASHBOARD_PORT; 0: any free port)."
        ),
    ] = None,
) -> None:
    """Start the local Prefect server, create the work pools, deploy deployments/prefect.yaml, start a
    worker on the local pool (and on each --worker pool) and the dashboard. Idempotent: what runs keeps
    running, nothing is duplicated. The ports are recorded under WORLDSMITH_HOME for `status` and `down`."""
    try:
        types = parse_pool_types(pool_type or ())
    except ServiceError as exc:
        raise failure(str(exc), code=2) from None
    stack = Stack.current(requested_workers(worker or ()), types).with_ports(prefect_port, dashboard_port)
    try:
        with console.status("bringing the local stack up (Prefect server, pools, deployments, worker, dashboard)"):
            state = stack.up(dashboard=dashboard)
    except ServiceError as exc:
        raise failure(str(exc), code=1) from None
    for part, what in state.items():
        say(f"{part}: {what}", highlight=False)
    say(f"Prefect UI: {stack.ui_url}", highlight=False)
    if dashboard:
        say(f"dashboard:  {stack.dashboard_url}", highlight=False)
    say(
        f"flows and workers use PREFECT_API_URL={stack.api_url}; stop everything with `worldsmith down`",
        highlight=False,
    )
    say("for the prefect CLI (`prefect deployment run ...`) in another shell:", highlight=False)
    say(f"  export PREFECT_API_URL={stack.api_url}", highlight=False)


@app.command("down")
def down() -> None:
    """Stop what `worldsmith up` started (workers, dashboard, Prefect server)."""
    stopped = Stack.current().down()
    say("stopped: " + ", ".join(stopped) if stopped else "nothing was running")


@app.command("dashboard")
def dashboard_command(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default WORLDSMITH_DASHBOARD_HOST).")] = None,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Port (default WORLDSMITH_DASHBOARD_PORT; 0: any free port, printed)."),
    ] = None,
) -> None:
    """Serve the dashboard: generation outcomes per night, cost, quality, sets, evaluations, training."""
    import uvicorn

    from worldsmith.dashboard.app import dashboard_app
    from worldsmith.serving.supervisor import listener

    settings = get_settings()
    host = host or settings.dashboard_host
    sock = listener(host, port if port is not None else settings.dashboard_port)  # busy: one line naming --port
    served = dashboard_app(prefect_ui_url=Stack.current().ui_url)
    say(f"dashboard at http://{host}:{sock.getsockname()[1]}", highlight=False)
    try:
        uvicorn.Server(uvicorn.Config(served, log_level="warning")).run(sockets=[sock])
    finally:
        sock.close()


DEMO_OPTIONS = options_for(DemoOptions)


@app.command("demo")
@config_command(DEMO_OPTIONS)
def demo(fields: ConfigValues) -> None:
    """The main job on the embedded defaults: start the local stack, generate environments (faults on),
    curate them into a set, solve one over MCP, evaluate the reference and random policies, train the
    tiny model with GRPO on the CPU, and print a summary with the dashboard and Prefect UI addresses."""
    # a bad value is answered in one line by the root handler (cli/console.AnsweringGroup)
    options = DemoOptions.model_validate(fields)
    try:
        code = run_demo(options, console)
    except ServiceError as exc:
        raise failure(str(exc), code=1) from None
    raise typer.Exit(code)
