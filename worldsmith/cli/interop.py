"""`worldsmith import awm` and `worldsmith export awm`: environments in and out of the
AgentWorldModel-1K release format (two command groups, one format: `worldsmith/interop/`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from worldsmith.cli.console import console, failure, refusals, say
from worldsmith.runtime.episode import Runtime
from worldsmith.storage.objectstore import configured_store

import_app = typer.Typer(help="Bring environments from other formats into the catalog.", no_args_is_help=True)
export_app = typer.Typer(help="Write environment sets in other formats.", no_args_is_help=True)


@import_app.command("awm")
def import_awm(
    directory: Annotated[
        Path,
        typer.Argument(help="Directory with the release's JSON-lines files (gen_scenario.jsonl, gen_envs.jsonl, ...)."),
    ],
    scenarios: Annotated[
        str | None, typer.Option(help="Comma-separated scenario keys to import (default: all).")
    ] = None,
    verifier_mode: Annotated[
        str,
        typer.Option(
            help="code: gen_verifier.pure_code.jsonl (complete/others); sql: gen_verifier.jsonl (evidence for a judge)."
        ),
    ] = "code",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Import AgentWorldModel-1K environments: one version per scenario, published good or failed
    with the defects found (failing seed inserts, crashing routes, raising verifiers, tasks the
    untouched database already satisfies, attempts to reach secrets or the network)."""
    from worldsmith.interop.awm import AwmFormatError
    from worldsmith.interop.catalog_import import import_release
    from worldsmith.storage.catalog import open_catalog

    if verifier_mode not in ("code", "sql"):
        raise failure("--verifier-mode must be code or sql")
    chosen = [s.strip() for s in scenarios.split(",") if s.strip()] if scenarios else None
    store, catalog = configured_store(), open_catalog()
    with refusals(AwmFormatError), Runtime() as runtime:
        rows = import_release(
            directory,
            runtime,
            store,
            catalog,
            mode=verifier_mode,  # type: ignore[arg-type]
            scenarios=chosen,
        )
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        table = Table(title=f"import of {directory} ({verifier_mode} verifiers)")
        for column in ("scenario", "version", "status", "tools", "tasks", "read ahead", "defects"):
            table.add_column(column)
        for row in rows:
            kinds: dict[str, int] = {}
            for defect in row["defects"]:
                kinds[defect["kind"]] = kinds.get(defect["kind"], 0) + 1
            table.add_row(
                row["scenario"],
                row["ref"] or "-",
                row["status"],
                str(row["tools"]),
                str(row["tasks"]),
                str(row["read_ahead"]),
                ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none",
            )
        console.print(table)
    raise typer.Exit(0 if all(row["ref"] for row in rows) else 1)


@export_app.command("awm")
def export_awm(
    set_name: Annotated[str, typer.Argument(help="Environment set to export.")],
    directory: Annotated[
        Path, typer.Argument(help="Directory to write the release's JSON-lines files (and solutions.json) into.")
    ],
) -> None:
    """Write a set's environments in the AgentWorldModel-1K format: each tool module wrapped as a
    FastAPI app with one route per tool, each verifier in both modes; `import awm` takes it back."""
    from worldsmith.interop.awm_export import export_set
    from worldsmith.storage.catalog import open_catalog

    with refusals():
        refs = export_set(set_name, directory, configured_store(), open_catalog())
    say(f"exported {len(refs)} environments of set {set_name} to {directory}: {', '.join(refs)}", highlight=False)
