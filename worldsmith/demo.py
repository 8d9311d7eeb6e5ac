"""`worldsmith demo`: the main job on the embedded defaults, end to end on one machine.

Runs the example environment's quality checks (seed-data expectations, sandboxed execution
probes), publishes it into the local catalog, serves it over the MCP gateway, and has the
reference policy solve each task through the official MCP client; every episode is verified in
the sandbox afterwards (verification is not reachable through MCP).
"""

from __future__ import annotations

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from worldsmith.bundle.loader import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.quality.checks import quality_checks
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.gateway import BackgroundServer, Gateway
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import open_store
from worldsmith.storage.publish import publish


async def _solve_over_mcp(url: str, gateway: Gateway, task: TaskSpec) -> tuple[int, str, str]:
    """Replay `task`'s reference solution through an MCP session; returns (tool errors, verdict, detail)."""
    errors = 0
    async with streamable_http_client(f"{url}/envs/{next(iter(gateway.bundles))}/mcp?task={task.id}") as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for step in task.solution:
                result = await session.call_tool(step.tool, step.arguments)
                errors += bool(result.is_error)
            (episode,) = gateway.sessions.values()  # the demo runs one session at a time
            verdict = await anyio.to_thread.run_sync(episode.verify, task.answer or "")
    status = getattr(verdict.status, "value", verdict.status)
    return errors, status, verdict.error or ""


def run_demo(bundle: Bundle, console: Console) -> int:
    """Run the demonstration; returns the process exit code (0 = everything passed)."""
    with Runtime() as runtime:
        console.rule(f"[bold]1. quality checks: {bundle.env_id}")
        with Progress(console=console, transient=True) as progress:
            progress.add_task("seed-data expectations, then probing tools, reference solutions and untouched states", total=None)
            checks = quality_checks(bundle, runtime)
        for check in checks:
            status = "[green]passed[/]" if check.passed else "[red]FAILED[/]"
            console.print(f"{check.kind}: {status} {check.summary}", highlight=False)
            for detail in check.details[:5]:
                console.print(f"  {detail}", markup=False, highlight=False)
        failed = [c for c in checks if not c.passed]
        console.print("sandbox layers: " + ", ".join(f"{k} {v}" for k, v in runtime.layers().items()), highlight=False)

        console.rule("[bold]2. publish into the catalog")
        settings = get_settings()
        store = open_store(settings.resolved_store_url(), endpoint_url=settings.s3_endpoint_url)
        published = publish(bundle, store, open_catalog(), checks)
        verb = "published" if published.created else "already in the catalog as"
        console.print(f"{verb} {published.version.ref} ({published.version.status}) in {store.url}", highlight=False)

        console.rule("[bold]3. reference policy over MCP")
        gateway = Gateway(runtime, [bundle])
        table = Table()
        for column in ("task", "steps", "tool errors", "verdict"):
            table.add_column(column)
        solved = 0
        with BackgroundServer(gateway.app()) as server:
            console.print(f"MCP gateway: {server.url}/envs/{bundle.env_id}/mcp")
            with Progress(console=console, transient=True) as progress:
                bar = progress.add_task("solving tasks", total=len(bundle.tasks))
                for task in bundle.tasks:
                    errors, status, detail = anyio.run(_solve_over_mcp, server.url, gateway, task)
                    solved += status == "complete"
                    table.add_row(task.id, str(len(task.solution)), str(errors), status + (f" ({detail})" if detail else ""))
                    progress.advance(bar)
        console.print(table)
        console.print(f"[bold]{solved}/{len(bundle.tasks)} tasks complete[/]; {len(failed)} failed quality checks")
        return 0 if solved == len(bundle.tasks) and not failed else 1
