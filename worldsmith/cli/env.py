"""`worldsmith env ...`: inspect, check, call and serve environment bundles."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import rebuild_bundle_dir
from worldsmith.cli.bundles import BundleArg, load_bundle_arg
from worldsmith.cli.console import bundle_failure, console, failure, refusals, say
from worldsmith.flows.interruption import stop_on_signals
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime
from worldsmith.serving.worlds import WorldSource, catalog_sources, directory_source
from worldsmith.settings import get_settings

app = typer.Typer(help="Inspect, check, call and serve environment bundles.", no_args_is_help=True)


class Protocol(StrEnum):
    """What `env serve` speaks besides MCP."""

    mcp = "mcp"
    openenv = "openenv"


@app.command("build")
def env_build(path: BundleArg) -> None:
    """Re-derive tools.json, world.db and manifest hashes of a hand-written bundle from its sources."""
    try:
        bundle = rebuild_bundle_dir(path)
    except BundleError as exc:
        raise bundle_failure(f"cannot build {path}", exc) from None
    say(f"built {bundle.env_id}: {bundle.manifest.stats}")


@app.command("tools")
def env_tools(
    path: BundleArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print tools.json.")] = False,
) -> None:
    """List a bundle's tools and their arguments."""
    bundle = load_bundle_arg(path)
    if as_json:
        print(json.dumps([t.model_dump() for t in bundle.tools], indent=2))
        return
    table = Table(title=f"{bundle.env_id}: {len(bundle.tools)} tools")
    table.add_column("tool")
    table.add_column("arguments")
    table.add_column("description")
    for tool in bundle.tools:
        props = tool.argument_schemas()
        required = set(tool.required_arguments())
        args = ", ".join(f"{n}{'' if n in required else '?'}: {p.get('type', 'any')}" for n, p in props.items())
        table.add_row(tool.name, args, tool.description)
    console.print(table)


@app.command("call")
def env_call(
    path: BundleArg,
    tool: Annotated[str, typer.Argument(help="Tool name.")],
    args: Annotated[str, typer.Option("--args", help="Arguments as a JSON object.")] = "{}",
) -> None:
    """Call one tool on a fresh episode and print the result as JSON (exit 1 unless it succeeded)."""
    bundle = load_bundle_arg(path)
    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        raise failure(f"--args is not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise failure("--args must be a JSON object")
    if tool not in bundle.validators:  # before any sandbox starts
        raise failure(f"{bundle.env_id}: {bundle.argument_error(tool, arguments)} (`worldsmith env tools {path}`)")
    with Runtime() as runtime, runtime.open_episode(bundle) as episode:
        result = episode.call_tool(tool, arguments)
    print(result.model_dump_json(indent=2))
    raise typer.Exit(0 if result.ok else 1)


@app.command("check")
def env_check(path: BundleArg) -> None:
    """Load a bundle, call every tool, replay every reference solution (must be complete) and
    verify the untouched state (must not be complete). Exit 0 only if everything passes."""
    bundle = load_bundle_arg(path)
    with Runtime() as runtime:
        results = check_environment(runtime, bundle)
        layers = runtime.layers()
    table = Table(title=f"{bundle.env_id}: environment check")
    for column in ("probe", "target", "result", "detail"):
        table.add_column(column)
    for r in results:
        table.add_row(r.probe, r.target, "[green]pass[/]" if r.passed else "[red]FAIL[/]", r.detail[:120])
    console.print(table)
    say("sandbox layers: " + ", ".join(f"{k} {v}" for k, v in layers.items()), highlight=False)
    failed = [r for r in results if not r.passed]
    say(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    raise typer.Exit(1 if failed else 0)


def _served_sources(sources: list[str], set_name: str | None) -> list[WorldSource]:
    """What `env serve` names, as world sources of serving/worlds.py: bundle directories (named by their
    manifest, validated when first served), then catalog refs (ENV or ENV@VERSION) and the members of set
    `set_name`, resolved in one catalog query and fetched into the local bundle cache when first served."""
    worlds: list[WorldSource] = []
    refs: list[str] = []
    for source in sources:
        path = Path(source)
        if path.exists() or os.sep in source or source.startswith("."):
            # no readable manifest: loaded now, so that the loader says what is wrong
            worlds.append(directory_source(path) or WorldSource.of(load_bundle_arg(path)))
        else:
            refs.append(source)
    if refs or set_name is not None:
        with refusals():
            worlds += catalog_sources(refs, set_name)
    return worlds


@app.command("serve")
def env_serve(
    sources: Annotated[
        list[str] | None, typer.Argument(help="Bundle directories or catalog refs (ENV or ENV@VERSION) to host.")
    ] = None,
    set_name: Annotated[
        str | None, typer.Option("--set", help="Also host every member of this environment set.")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Interface to bind (default WORLDSMITH_GATEWAY_HOST).")] = None,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Port (default WORLDSMITH_GATEWAY_PORT; 0: any free port, printed)."),
    ] = None,
    verdicts: Annotated[
        bool,
        typer.Option(
            "--verdicts",
            help="Offer a `submit` tool in task-bound sessions: the final answer is judged (verifier and "
            "side-effect guard) and the verdict, reward and evidence returned; the episode then ends.",
        ),
    ] = False,
    session_idle: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Seconds a session may go without requests before its episode is closed "
            "(default WORLDSMITH_GATEWAY_SESSION_IDLE_S).",
        ),
    ] = None,
    max_loaded: Annotated[
        int,
        typer.Option(
            min=1,
            help="Worlds kept loaded at once: a world loads at its first session; past this many, the least "
            "recently used world with no open session is unloaded.",
        ),
    ] = 64,
    processes: Annotated[
        int,
        typer.Option(
            help="Gateway processes sharing the port, each with its own sandbox workers, sessions and "
            "--max-loaded worlds; a session stays with the process that opened it (docs/operations.md).",
        ),
    ] = 1,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="A Host name clients may use besides localhost, 127.0.0.1, [::1] and --host (NAME: any port; "
            "NAME:PORT); repeat for more; added to WORLDSMITH_GATEWAY_ALLOWED_HOSTS. Other Host or Origin: 403.",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding a bearer token every caller must send (Authorization: Bearer TOKEN; else 401) "
            "(default WORLDSMITH_GATEWAY_TOKEN_FILE: none).",
        ),
    ] = None,
    protocol: Annotated[
        Protocol,
        typer.Option(
            help="mcp: MCP at /envs/<env_id>/mcp; openenv: also OpenEnv's environment server at base URL "
            "/envs/<env_id> (WebSocket /ws: reset, step, state; docs/integrations.md)."
        ),
    ] = Protocol.mcp,
    member: Annotated[str | None, typer.Option(hidden=True, help="Set by --processes: INDEX/N@PID:RUN_DIR.")] = None,
) -> None:
    """Serve bundles over MCP (streamable HTTP) at http://HOST:PORT/envs/<env_id>/mcp?task=<id> (and with
    --protocol openenv as OpenEnv environments at http://HOST:PORT/envs/<env_id>); each world is loaded at
    its first session."""
    if not sources and set_name is None:
        raise failure("name what to serve: bundle directories, catalog refs (ENV or ENV@VERSION) or --set NAME")
    if processes < 1:
        raise failure(f"--processes {processes}: serve with at least one gateway process")
    if protocol is Protocol.openenv and processes > 1:
        raise failure("--protocol openenv serves WebSocket sessions from one process: leave out --processes")
    settings = get_settings()
    worlds = _served_sources(sources or [], set_name)
    if not worlds:
        raise failure(f"set {set_name!r} has no members: add environments to it or serve others")
    from worldsmith.serving.access import Access, read_token_file
    from worldsmith.serving.gateway import Gateway, serve
    from worldsmith.serving.supervisor import listener

    host = host or settings.gateway_host
    port = port if port is not None else settings.gateway_port
    session_idle = session_idle or settings.gateway_session_idle_s
    token_file = token_file or settings.gateway_token_file
    access = Access(  # AccessRefused (a host that is no name, a token file that cannot be used): one line
        allowed_hosts=(*settings.gateway_allowed_hosts, *(allow_host or [])),
        token=read_token_file(token_file) if token_file is not None else None,
        bound=host,
    )

    def serving() -> None:
        shown = worlds if len(worlds) <= 10 else worlds[:5]
        for world in shown:
            say(f"serving {world.env_id} at http://{host}:{port}/envs/{world.env_id}/mcp", highlight=False)
            if protocol is Protocol.openenv:
                say(f"OpenEnv base_url for {world.env_id}: http://{host}:{port}/envs/{world.env_id}", highlight=False)
        if len(shown) < len(worlds):
            say(f"... and {len(worlds) - len(shown)} more: http://{host}:{port}/envs lists them all", highlight=False)
        if token_file is not None:
            say(f"callers send Authorization: Bearer <the token in {token_file}>", highlight=False)

    if processes > 1 and member is None:
        if port == 0:  # the members share one port: chosen here, so that all of them bind the same
            with listener(host, 0) as probe:
                port = probe.getsockname()[1]
        options = [*(arg for name in allow_host or [] for arg in ("--allow-host", name))]
        options += ["--token-file", str(token_file)] if token_file is not None else []
        _supervise(
            worlds, sources or [], set_name, host, port, verdicts, session_idle, max_loaded, processes, options, serving
        )
        return
    from worldsmith.serving.affinity import Member
    from worldsmith.serving.supervisor import serve_member

    # one process: the port bound before anything starts (busy, not an address here: PortUnavailable's one line
    # naming the option), so that "serving ... at" is printed once it listens, with the port chosen for --port 0
    # Ctrl-C, SIGTERM and SIGHUP are requests from here on, never an exception in the middle of starting or
    # closing: the runtime closes its workers and removes its scratch directory, whenever the signal came
    with stop_on_signals(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as stop:
        sock = listener(host, port) if member is None else None
        if sock is not None:
            port = sock.getsockname()[1]
        with Runtime() as runtime:
            gateway = Gateway(
                runtime,
                worlds,
                session_idle_s=session_idle,
                max_sessions=settings.gateway_max_sessions,
                verdicts=verdicts,
                max_loaded=max_loaded,
                member=Member.parse(member) if member is not None else None,
                access=access,
                openenv=protocol is Protocol.openenv,
            )
            if sock is not None:
                if not stop.requested:
                    serving()
                    serve(gateway, sock, stopped=lambda: stop.requested)
                sock.close()
            else:
                assert gateway.member is not None  # member given: this process is one of --processes N
                serve_member(gateway.app(), gateway.member, host, port, access=access)
        signum = stop.signum if stop.requested else None
    if signum is not None:
        raise SystemExit(128 + signum)


def _supervise(
    worlds: list[WorldSource],
    sources: list[str],
    set_name: str | None,
    host: str,
    port: int,
    verdicts: bool,
    session_idle: float,
    max_loaded: int,
    processes: int,
    access_options: list[str],
    serving: Callable[[], None],
) -> None:
    """`env serve --processes N`: what one process would refuse refused here, then N gateway processes
    of the same options (serving/supervisor.py; `access_options`: --allow-host, --token-file) until
    interrupted."""
    from worldsmith.serving.gateway import Gateway
    from worldsmith.serving.supervisor import check_port_free, supervise

    Gateway.check(worlds, verdicts=verdicts, max_loaded=max_loaded)  # GatewayRefused: the root handler's line
    check_port_free(host, port)
    command = [sys.executable, "-m", "worldsmith.cli", "env", "serve", *sources]
    command += ["--set", set_name] if set_name is not None else []
    command += ["--host", host, "--port", str(port), "--session-idle", repr(session_idle)]
    command += ["--max-loaded", str(max_loaded), "--processes", str(processes)]
    command += ["--verdicts"] if verdicts else []
    command += access_options
    raise typer.Exit(supervise(command, processes, on_ready=serving))
