"""The `worldsmith` command line (typer)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.loader import Bundle, load_bundle, rebuild_bundle_dir
from worldsmith.settings import get_settings

app = typer.Typer(help="Manufacture executable tool-use worlds for LLM agents and train agents in them.", no_args_is_help=True)
env_app = typer.Typer(help="Inspect, check, call and serve environment bundles.", no_args_is_help=True)
app.add_typer(env_app, name="env")
console = Console()
errors = Console(stderr=True)

BundleArg = Annotated[Path, typer.Argument(help="Bundle directory.", exists=False)]


def _load(path: Path) -> Bundle:
    try:
        return load_bundle(path)
    except BundleError as exc:
        errors.print(f"[bold red]invalid bundle {path}[/]")
        for issue in exc.issues:
            errors.print(f"  {issue}", markup=False, highlight=False)
        raise typer.Exit(2) from None


def _runtime():
    from worldsmith.runtime.episode import Runtime

    return Runtime()


@env_app.command("build")
def env_build(path: BundleArg) -> None:
    """Re-derive tools.json, world.db and manifest hashes of a hand-written bundle from its sources."""
    try:
        bundle = rebuild_bundle_dir(path)
    except BundleError as exc:
        errors.print(f"[bold red]cannot build {path}[/]")
        for issue in exc.issues:
            errors.print(f"  {issue}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    console.print(f"built {bundle.env_id}: {bundle.manifest.stats}")


@env_app.command("tools")
def env_tools(path: BundleArg, as_json: Annotated[bool, typer.Option("--json", help="Print tools.json.")] = False) -> None:
    """List a bundle's tools and their arguments."""
    bundle = _load(path)
    if as_json:
        print(json.dumps([t.model_dump() for t in bundle.tools], indent=2))
        return
    table = Table(title=f"{bundle.env_id}: {len(bundle.tools)} tools")
    table.add_column("tool")
    table.add_column("arguments")
    table.add_column("description")
    for tool in bundle.tools:
        props = tool.parameters["properties"]
        required = set(tool.parameters.get("required", []))
        args = ", ".join(f"{n}{'' if n in required else '?'}: {p.get('type', 'any')}" for n, p in props.items())
        table.add_row(tool.name, args, tool.description)
    console.print(table)


@env_app.command("call")
def env_call(
    path: BundleArg,
    tool: Annotated[str, typer.Argument(help="Tool name.")],
    args: Annotated[str, typer.Option("--args", help="Arguments as a JSON object.")] = "{}",
) -> None:
    """Call one tool on a fresh episode and print the result as JSON (exit 1 unless it succeeded)."""
    bundle = _load(path)
    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        errors.print(f"--args is not valid JSON: {exc}")
        raise typer.Exit(2) from None
    if not isinstance(arguments, dict):
        errors.print("--args must be a JSON object")
        raise typer.Exit(2)
    with _runtime() as runtime, runtime.open_episode(bundle) as episode:
        result = episode.call_tool(tool, arguments)
    print(result.model_dump_json(indent=2))
    raise typer.Exit(0 if result.ok else 1)


@env_app.command("check")
def env_check(path: BundleArg) -> None:
    """Load a bundle, call every tool, replay every reference solution (must be complete) and
    verify the untouched state (must not be complete). Exit 0 only if everything passes."""
    from worldsmith.quality.probes import check_environment

    bundle = _load(path)
    with _runtime() as runtime:
        results = check_environment(runtime, bundle)
        layers = runtime.layers()
    table = Table(title=f"{bundle.env_id}: environment check")
    for column in ("probe", "target", "result", "detail"):
        table.add_column(column)
    for r in results:
        table.add_row(r.probe, r.target, "[green]pass[/]" if r.passed else "[red]FAIL[/]", r.detail[:120])
    console.print(table)
    console.print("sandbox layers: " + ", ".join(f"{k} {v}" for k, v in layers.items()), highlight=False)
    failed = [r for r in results if not r.passed]
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    raise typer.Exit(1 if failed else 0)


@env_app.command("serve")
def env_serve(
    paths: Annotated[list[Path], typer.Argument(help="Bundle directories to host.")],
    host: Annotated[Optional[str], typer.Option(help="Interface to bind (default WORLDSMITH_GATEWAY_HOST).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port (default WORLDSMITH_GATEWAY_PORT).")] = None,
) -> None:
    """Serve bundles over MCP (streamable HTTP) at http://HOST:PORT/envs/<env_id>/mcp?task=<id>."""
    from worldsmith.runtime.gateway import serve

    settings = get_settings()
    bundles = [_load(p) for p in paths]
    host = host or settings.gateway_host
    port = port or settings.gateway_port
    for bundle in bundles:
        console.print(f"serving {bundle.env_id} at http://{host}:{port}/envs/{bundle.env_id}/mcp")
    with _runtime() as runtime:
        serve(runtime, bundles, host, port, session_idle_s=settings.gateway_session_idle_s, max_sessions=settings.gateway_max_sessions)


@app.command("demo")
def demo(
    bundle_path: Annotated[Path, typer.Option("--bundle", help="Bundle to demonstrate.")] = Path("examples/bundles/retail_store"),
) -> None:
    """The main job on the embedded defaults: check the example environment, serve it over MCP,
    and let the reference policy solve every task through the MCP client, verified in the sandbox."""
    from worldsmith.demo import run_demo

    raise typer.Exit(run_demo(_load(bundle_path), console))


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="worldsmith")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
