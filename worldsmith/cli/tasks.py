"""`worldsmith tasks ls`: the tasks of a bundle directory or of a published environment version
(ENV or ENV@VERSION, fetched once into the local bundle cache): the task ids an episode, an MCP
session (`?task=ID`) or a task filter names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, TypedDict

import typer
from rich.table import Table

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.cli.bundles import load_bundle_arg
from worldsmith.cli.console import console, failure, refusals

app = typer.Typer(help="List the tasks of an environment.", no_args_is_help=True)


def bundle_of(bundle_or_ref: str) -> tuple[Bundle, str]:
    """The bundle a directory holds, or else the one a catalog reference names, with what to call it
    (the directory, or ENV@VERSION). Exit 2 with one line when it is neither."""
    path = Path(bundle_or_ref)
    if path.is_dir():
        return load_bundle_arg(path), str(path)
    from worldsmith.storage.bundle_cache import cached_bundle
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.publish import CatalogError, resolve

    try:
        with open_catalog().session() as session:
            version = resolve(session, bundle_or_ref)
    except CatalogError as exc:
        raise failure(f"no bundle directory {bundle_or_ref!r}, and {exc}") from None
    with refusals():  # a failed world that stopped before it was a bundle
        return load_bundle(cached_bundle(version.ref, version.content_key)), version.ref


class TaskListing(TypedDict):
    """A task as `tasks ls --json` lists it."""

    id: str
    instruction: str
    verifier: str
    reference_solution: bool
    solution_steps: int


@app.command("ls")
def tasks_ls(
    bundle_or_ref: Annotated[str, typer.Argument(help="A bundle directory, or ENV / ENV@VERSION in the catalog.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List an environment's tasks: id, instruction, verifier, and whether it has a reference solution."""
    bundle, name = bundle_of(bundle_or_ref)
    rows: list[TaskListing] = [
        {
            "id": task.id,
            "instruction": task.instruction,
            "verifier": task.verifier,
            "reference_solution": bool(task.solution),
            "solution_steps": len(task.solution),
        }
        for task in bundle.tasks
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{name}: {len(rows)} tasks")
    for column in ("task", "instruction", "verifier", "reference solution"):
        table.add_column(column, overflow="fold")
    for r in rows:
        solution = f"yes ({r['solution_steps']} calls)" if r["reference_solution"] else "no"
        table.add_row(r["id"], r["instruction"], r["verifier"], solution)
    console.print(table)
