"""`worldsmith sets ...`: create, list, show and export environment sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from worldsmith.cli.console import console, refusals, say
from worldsmith.storage.objectstore import configured_store

app = typer.Typer(help="Create and export environment sets (immutable, split by environment).", no_args_is_help=True)


@app.command("create")
def sets_create(
    name: Annotated[str, typer.Argument(help="Name of the new set (sets are immutable).")],
    category: Annotated[list[str] | None, typer.Option(help="Keep envs with this category (repeatable).")] = None,
    env: Annotated[list[str] | None, typer.Option(help="Keep only this env (repeatable).")] = None,
    count: Annotated[int | None, typer.Option(help="Sample this many envs.")] = None,
    seed: Annotated[int, typer.Option(help="Sampling and split seed.")] = 0,
    validation_fraction: Annotated[float, typer.Option(help="Share of envs in the validation split.")] = 0.1,
    min_tasks: Annotated[int, typer.Option(help="Minimum tasks per env.")] = 0,
    min_tools: Annotated[int, typer.Option(help="Minimum tools per env.")] = 0,
    require_passed: Annotated[
        list[str] | None, typer.Option(help="Quality check that must have passed (repeatable).")
    ] = None,
    status: Annotated[str, typer.Option(help="Version status to select.")] = "good",
) -> None:
    """Create an environment set from a query over the catalog."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import SetQuery, create_set, split_counts

    catalog = open_catalog()
    query = SetQuery(
        categories=category or [],
        env_ids=env or [],
        count=count,
        seed=seed,
        validation_fraction=validation_fraction,
        min_tasks=min_tasks,
        min_tools=min_tools,
        require_passed=require_passed or [],
        status=status,
    )
    with refusals():
        made = create_set(catalog, name, query)
    assert made.id is not None  # a stored set has its id
    with catalog.session() as session:
        splits = split_counts(session, made.id).get(made.id, {})
    say(
        f"created set {name}: {sum(splits.values())} environment versions "
        f"({splits.get('train', 0)} train, {splits.get('validation', 0)} validation)"
    )


@app.command("ls")
def sets_ls(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List environment sets: members, and how many in each split."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import set_summaries

    with open_catalog().session() as session:
        rows: list[dict[str, Any]] = [
            {
                "name": summary.name,
                "members": summary.members,
                "train": summary.train,
                "validation": summary.members - summary.train,
                "created_at": summary.created_at.isoformat(timespec="seconds"),
            }
            for summary in set_summaries(session)
        ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{len(rows)} environment sets")
    for column in ("name", "members", "train", "validation", "created"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], str(r["members"]), str(r["train"]), str(r["validation"]), r["created_at"])
    console.print(table)


@app.command("show")
def sets_show(name: Annotated[str, typer.Argument(help="Set name.")]) -> None:
    """Print a set's manifest (query, members with hashes and splits) as JSON."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import get_set, set_manifest

    with refusals(), open_catalog().session() as session:
        manifest = set_manifest(session, get_set(session, name))
    print(json.dumps(manifest, indent=2))


@app.command("export")
def sets_export(
    name: Annotated[str, typer.Argument(help="Set name.")],
    target: Annotated[Path, typer.Argument(help="Directory to write.")],
) -> None:
    """Export a set: set.json, its bundles, and (env, task) rows as tasks.jsonl and tasks.parquet."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import export_set

    with refusals():
        manifest = export_set(name, target, configured_store(), open_catalog())
    say(f"exported set {name} ({len(manifest['members'])} environment versions) into {target}")
