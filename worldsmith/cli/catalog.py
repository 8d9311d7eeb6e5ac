"""`worldsmith catalog ...`: publish, list, compare, fetch and move environment versions."""

from __future__ import annotations

import difflib
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from worldsmith.cli.bundles import BundleArg, load_bundle_arg
from worldsmith.cli.console import console, failure, refusals, say
from worldsmith.quality.checks import quality_checks
from worldsmith.runtime.episode import Runtime
from worldsmith.storage.objectstore import configured_store

app = typer.Typer(help="Publish, list, compare, fetch and move environment versions.", no_args_is_help=True)


class VersionStatus(StrEnum):
    """What a version is (`EnvironmentVersion.status`): good (passed every check), or failed (a check
    failed, or its generation stopped at a stage: then it holds that stage, the reason and the partial
    artifacts)."""

    GOOD = "good"
    FAILED = "failed"


@app.command("publish")
def catalog_publish(
    path: BundleArg,
    probes: Annotated[bool, typer.Option(help="Also run the execution probes in the sandbox.")] = True,
) -> None:
    """Check a bundle (seed-data expectations, execution probes) and publish it; exit 1 if it was
    published as failed."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.publish import publish

    bundle = load_bundle_arg(path)
    store, catalog = configured_store(), open_catalog()
    if probes:
        with Runtime() as runtime:
            checks = quality_checks(bundle, runtime)
    else:
        checks = quality_checks(bundle)
    result = publish(bundle, store, catalog, checks)
    version = result.version
    verb = "published" if result.created else "already published as"
    reason = f" ({version.failure_reason})" if version.failure_reason else ""
    say(f"{verb} {version.ref}: {version.status}{reason}", highlight=False)
    raise typer.Exit(0 if version.status == "good" else 1)


#: Rows `catalog ls` prints as a table unless `--limit` says otherwise (a fleet's catalog holds thousands).
LS_TABLE_ROWS = 100


@app.command("ls")
def catalog_ls(
    status: Annotated[VersionStatus | None, typer.Option(help="List only the versions of this status.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    limit: Annotated[
        int | None,
        typer.Option(min=0, help=f"Rows to list (default: {LS_TABLE_ROWS} as a table, every one with --json; 0: all)."),
    ] = None,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many rows first (the next page).")] = 0,
) -> None:
    """List the environment versions (or those of one status), failed ones with the stage and reason; a table
    shows one page (`--limit`, `--offset`) and says how to get the next."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.versions import count_versions, listed_versions

    rows_wanted = (None if as_json else LS_TABLE_ROWS) if limit is None else (limit or None)
    with open_catalog().session() as session:
        versions = listed_versions(session, status, rows_wanted, offset)
        total = count_versions(session, status) if rows_wanted is not None or offset else len(versions)
    rows = [
        {
            "ref": f"{v.env_id}@{v.version}",
            "status": v.status,
            "failed_stage": v.failed_stage,
            "failure_reason": v.failure_reason,
            "tables": v.stats.get("tables"),
            "tools": v.stats.get("tools"),
            "tasks": v.stats.get("tasks"),
            "checks": {k: q.get("passed") for k, q in v.quality.items()},
            "created_at": v.created_at.isoformat(timespec="seconds"),
        }
        for v in versions
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    shown = f", {offset + 1}-{offset + len(rows)} shown" if len(rows) < total else ""
    table = Table(title=f"{total} environment versions" + (f" ({status})" if status else "") + shown)
    for column in ("ref", "status", "tables", "tools", "tasks", "checks", "created", "reason"):
        table.add_column(column)
    for r in rows:
        checks = ", ".join(f"{k} {'ok' if ok else 'FAILED'}" for k, ok in r["checks"].items())
        reason = (f"stage {r['failed_stage']}: " if r["failed_stage"] else "") + (r["failure_reason"] or "")
        table.add_row(
            r["ref"],
            r["status"],
            str(r["tables"]),
            str(r["tools"]),
            str(r["tasks"]),
            checks,
            r["created_at"],
            reason[:120],
        )
    console.print(table)
    if offset + len(rows) < total:
        say(f"{total - offset - len(rows)} more: --offset {offset + len(rows)} (or --limit 0 for every row)")


@app.command("show")
def catalog_show(ref: Annotated[str, typer.Argument(help="ENV or ENV@VERSION.")]) -> None:
    """Print a version's record: status, provenance, stats, artifacts and quality reports (JSON)."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.publish import resolve, version_record

    with refusals(), open_catalog().session() as session:
        record = version_record(session, resolve(session, ref))
    print(json.dumps(record, indent=2))


@app.command("diff")
def catalog_diff(
    a: Annotated[str, typer.Argument(help="ENV@V1")],
    b: Annotated[str, typer.Argument(help="ENV@V2")],
) -> None:
    """Show what changed between two versions: stats, artifacts, and a unified diff of each text artifact."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.publish import artifacts_of, resolve

    store, catalog = configured_store(), open_catalog()
    with refusals(), catalog.session() as session:
        va, vb = resolve(session, a), resolve(session, b)
        fa, fb = artifacts_of(session, va), artifacts_of(session, vb)
    changes = {
        k: (va.stats.get(k), vb.stats.get(k))
        for k in sorted(set(va.stats) | set(vb.stats))
        if va.stats.get(k) != vb.stats.get(k)
    }
    say(f"{va.ref} -> {vb.ref}; stats changed: {changes or 'none'}", highlight=False)
    for name in sorted(set(fa) | set(fb)):
        if fa.get(name) == fb.get(name):
            continue
        if name == "world.db" or name not in fa or name not in fb:
            where = "differs" if name in fa and name in fb else "only in " + (va.ref if name in fa else vb.ref)
            say(f"{name}: {where}")
            continue
        old = store.get_bytes(fa[name]).decode().splitlines(keepends=True)
        new = store.get_bytes(fb[name]).decode().splitlines(keepends=True)
        sys.stdout.writelines(difflib.unified_diff(old, new, f"{va.ref}/{name}", f"{vb.ref}/{name}"))


@app.command("fetch")
def catalog_fetch(
    ref: Annotated[str, typer.Argument(help="ENV or ENV@VERSION.")],
    target: Annotated[Path, typer.Argument(help="Directory to write (new or empty, unless --force).")],
    force: Annotated[
        bool, typer.Option("--force", help="Write into a directory that holds files, or replace a file at TARGET.")
    ] = False,
) -> None:
    """Write a version's bundle into a directory, byte for byte as published (a failed world that stopped
    before it was a bundle: its partial artifacts)."""
    from worldsmith.bundle.loader import load_bundle
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.failed_worlds import FAILED_ATTEMPT, NOTE
    from worldsmith.storage.publish import fetch_files

    if not force and (target.exists() or target.is_symlink()):
        if not target.is_dir():
            raise failure(f"{target} exists and is not a directory: name another path, or use --force to replace it")
        if any(target.iterdir()):
            raise failure(f"{target} exists and is not empty: name another path, or use --force to write into it")
    if force and (target.is_file() or target.is_symlink()):
        target.unlink()
    with refusals():
        version = fetch_files(ref, target, configured_store(), open_catalog())
    if version.failed_stage is not None:
        say(
            f"fetched the partial artifacts of {version.ref} into {target}: a failed world that stopped at stage "
            f"{version.failed_stage} ({version.failure_reason}), no bundle to load"
            + (
                f"; {NOTE} says what failed, {FAILED_ATTEMPT}/ holds its failing attempt"
                if (target / NOTE).is_file()
                else ""
            ),
            highlight=False,
        )
        return
    bundle = load_bundle(target)
    say(f"fetched {bundle.env_id}@{bundle.manifest.version} into {target}")


@app.command("export")
def catalog_export(target: Annotated[Path, typer.Argument(help="Directory to write.")]) -> None:
    """Export every environment, version, object and set into a directory (for `catalog import`)."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.transfer import export_catalog

    say(f"exported {export_catalog(target, configured_store(), open_catalog())} into {target}")


@app.command("import")
def catalog_import(source: Annotated[Path, typer.Argument(help="A directory written by `catalog export`.")]) -> None:
    """Import an export; what is already here (same content, same set name) is skipped."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.transfer import import_catalog

    with refusals():
        counts = import_catalog(source, configured_store(), open_catalog())
    say(f"imported from {source}: {counts}")
