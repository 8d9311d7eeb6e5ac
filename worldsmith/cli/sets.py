"""`worldsmith sets ...`: create, list, show and export environment sets. The options of `sets create` are
the fields of SetQuery (worldsmith/models/sets.py, see `worldsmith/cli/config_options.py`)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TypedDict

import typer
from rich.table import Table

from worldsmith.cli.config_options import ConfigValues, config_command, options_for
from worldsmith.cli.console import console, refusals, say
from worldsmith.models.sets import SetQuery
from worldsmith.storage.objectstore import configured_store

app = typer.Typer(help="Create and export environment sets (immutable, split by environment).", no_args_is_help=True)


SET_QUERY_FLAGS = {"categories": "--category", "env_ids": "--env"}
"""The options of SetQuery's list fields, named for one value each (they repeat)."""

CREATE_OPTIONS = options_for(SetQuery, flags=SET_QUERY_FLAGS)


@app.command("create")
@config_command(CREATE_OPTIONS)
def sets_create(
    fields: ConfigValues, name: Annotated[str, typer.Argument(help="Name of the new set (sets are immutable).")]
) -> None:
    """Create an environment set from a query over the catalog."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import create_set, split_counts

    query = SetQuery.model_validate(fields)  # a bad value is answered in one line by the root handler
    catalog = open_catalog()
    with refusals():
        made = create_set(catalog, name, query)
    assert made.id is not None  # a stored set has its id
    with catalog.session() as session:
        splits = split_counts(session, made.id).get(made.id, {})
    say(
        f"created set {name}: {sum(splits.values())} environment versions "
        f"({splits.get('train', 0)} train, {splits.get('validation', 0)} validation)"
    )


class SetListing(TypedDict):
    """A set as `sets ls --json` lists it: its members, and how many in each split."""

    name: str
    members: int
    train: int
    validation: int
    created_at: str


@app.command("ls")
def sets_ls(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List environment sets: members, and how many in each split."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import set_summaries

    with open_catalog().session() as session:
        rows: list[SetListing] = [
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


class ExportFormat(StrEnum):
    """What `sets export` writes."""

    files = "files"
    hf = "hf"


@app.command("export")
def sets_export(
    name: Annotated[str, typer.Argument(help="Set name.")],
    target: Annotated[Path, typer.Argument(help="Directory to write.")],
    export_format: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="files: set.json, its bundles, and (env, task) rows as tasks.jsonl and tasks.parquet; hf: a Hugging "
            "Face dataset of tasks (prompt, tools, world reference; datasets.load_from_disk) for the RL adapters "
            "(docs/integrations.md).",
        ),
    ] = ExportFormat.files,
) -> None:
    """Export a set: its files (set.json, bundles, task rows), or its tasks as a Hugging Face dataset."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import export_set

    if export_format is ExportFormat.hf:
        from worldsmith.integrations.dataset import export_set_dataset

        with refusals():
            rows = export_set_dataset(name, target)
        say(f"exported set {name} as a Hugging Face dataset of {rows} tasks into {target}")
        return
    with refusals():
        manifest = export_set(name, target, configured_store(), open_catalog())
    say(f"exported set {name} ({len(manifest['members'])} environment versions) into {target}")
