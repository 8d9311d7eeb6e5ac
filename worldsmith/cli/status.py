"""`worldsmith status`: what runs. The local stack `worldsmith up` started (its processes and
addresses) and, when a Prefect API is reachable, its work pools with their workers, the deployments
whose runs would wait for a worker that is not there (and how to start one), and the latest flow
runs. Never starts anything, and answers within seconds when nothing runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, TypedDict

import typer
from rich.table import Table

from worldsmith.cli.console import console, say
from worldsmith.jsonvalue import JsonObject
from worldsmith.ops.stack import Stack

if TYPE_CHECKING:
    from worldsmith.ops.orchestration import Orchestration

app = typer.Typer()


class ServiceStatus(TypedDict):
    """A service of `worldsmith up`: its pid (None: not running) and log file."""

    name: str
    pid: int | None
    log: str


class LocalStack(TypedDict):
    """The local stack's home, services, and the addresses of those that run."""

    home: str
    services: list[ServiceStatus]
    prefect_ui: str | None
    dashboard: str | None


@dataclass(frozen=True)
class PrefectStatus:
    """The Prefect API's address (None: none configured) and, when it answers, what it orchestrates."""

    api_url: str | None
    orchestration: Orchestration | None = None  # None: it does not answer

    def record(self) -> JsonObject:
        """As `status --json` prints it."""
        if self.orchestration is None:
            return {"api_url": self.api_url, "reachable": False}
        return {"reachable": True, **self.orchestration.as_dict()}


def _local_stack() -> LocalStack:
    """The services of `worldsmith up` (pid or None) and the addresses of those that run."""
    stack = Stack.current()
    running = stack.running()
    services: list[ServiceStatus] = [
        {"name": s.name, "pid": running.get(s.name), "log": str(s.log_file)} for s in stack.services()
    ]
    return {
        "home": str(stack.home),
        "services": services,
        "prefect_ui": stack.ui_url if "prefect-server" in running else None,
        "dashboard": stack.dashboard_url if "dashboard" in running else None,
    }


def _prefect(flow_runs: int) -> PrefectStatus:
    """The Prefect API's address, whether it answers, and (when it does) its pools, deployments and flow runs."""
    from worldsmith.ops.orchestration import api_reachable, configured_api_url, read_orchestration

    api_url = configured_api_url()
    if api_url is None or not api_reachable(api_url):
        return PrefectStatus(api_url)
    return PrefectStatus(api_url, read_orchestration(api_url, flow_runs))


def _print_stack(stack: LocalStack) -> None:
    running = [s for s in stack["services"] if s["pid"] is not None]
    if not running:
        say(f"local stack (WORLDSMITH_HOME {stack['home']}): not running; `worldsmith up` starts it", highlight=False)
        return
    say(f"local stack (WORLDSMITH_HOME {stack['home']}):", highlight=False)
    for s in stack["services"]:
        say(f"  {s['name']}: " + (f"running (pid {s['pid']})" if s["pid"] is not None else "not running"))
    for label, address in (("Prefect UI", stack["prefect_ui"]), ("dashboard", stack["dashboard"])):
        if address:
            say(f"  {label}: {address}", highlight=False)


def _print_prefect(prefect: PrefectStatus) -> None:
    if prefect.api_url is None:
        say("Prefect: no API configured (PREFECT_API_URL unset and no local stack); `worldsmith up` starts one")
        return
    orchestration = prefect.orchestration
    if orchestration is None:
        say(f"Prefect API {prefect.api_url}: not reachable", highlight=False)
        return
    say(f"Prefect API {prefect.api_url}:", highlight=False)
    for pool in orchestration.pools:
        live = [w.name for w in pool.workers if w.live]
        gone = [w.name for w in pool.workers if not w.live]
        workers = f"{len(live)} live worker(s)" + (f": {', '.join(live)}" if live else "")
        workers += f"; offline: {', '.join(gone)}" if gone else ""
        paused = ", paused" if pool.paused else ""
        say(f"  pool {pool.name} ({pool.type}, {pool.status}{paused}): {workers}", highlight=False)
    problems = [d.problem for d in orchestration.deployments if d.problem]
    ready = len(orchestration.deployments) - len(problems)
    say(f"  deployments: {len(orchestration.deployments)} ({ready} with a live worker)")
    for problem in problems:
        say(f"  {problem}", highlight=False)
    runs = orchestration.flow_runs
    if not runs:
        say("  no flow runs yet")
        return
    table = Table(title=f"latest {len(runs)} flow runs")
    for column in ("run", "deployment (or flow)", "state", "expected start", "id"):
        table.add_column(column, overflow="fold")
    for r in runs:
        table.add_row(r.name, r.deployment or r.flow, r.state, r.expected_start or "", r.id)
    console.print(table)
    for r in runs:
        if r.problem:
            say(f"  {r.name} ({r.state}) {r.problem}", highlight=False)


@app.command("status")
def status(
    flow_runs: Annotated[int, typer.Option(min=0, max=200, help="Latest flow runs to show.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show what runs: the local stack, and Prefect's work pools, workers, deployments and latest flow runs.

    The local stack is what `worldsmith up` started (processes, addresses); when the Prefect API answers,
    each work pool with its workers, the deployments whose pool has no live worker (with how to start
    one) and the latest flow runs. Starts nothing; answers within seconds when nothing runs."""
    stack, prefect = _local_stack(), _prefect(flow_runs)
    if as_json:
        print(json.dumps({"stack": stack, "prefect": prefect.record()}, indent=2))
        return
    _print_stack(stack)
    _print_prefect(prefect)
