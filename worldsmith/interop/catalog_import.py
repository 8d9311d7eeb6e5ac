"""`worldsmith import awm`: scenarios of a release directory into the catalog, each with its quality record.

read -> import (bundle of the ASGI kind) -> quality checks (seed expectations, execution probes, the
import report) -> published: good when every check passed, else failed with its reasons, so that
curated sets leave it out. A scenario that yields no bundle at all (its schema or app is broken)
cannot be published; it is reported with its defects.
"""

from __future__ import annotations

from pathlib import Path
from typing import NotRequired, TypedDict

from worldsmith.interop.awm import VerifierMode, import_scenario, read_release
from worldsmith.interop.report import defects, import_check
from worldsmith.quality.checks import probe_check
from worldsmith.quality.expectations import validate_seed_data
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import ObjectStore
from worldsmith.storage.publish import publish


class ImportRow(TypedDict):
    """How one scenario's import went (`worldsmith import awm --json` prints the rows)."""

    scenario: str  # the release's scenario key
    env_id: str
    ref: str | None  # the version published; None: not imported
    status: str  # the version's status, or "not imported"
    tools: int
    tasks: int
    inserts: int  # the seed inserts of the release
    defects: list[dict[str, str]]  # {kind, target, detail} (interop/report.py)
    read_ahead: int  # GET routes its template read ahead (0: the app keeps something of a request, or reads off)
    reason: NotRequired[str | None]  # a published version's failure reason


def import_release(
    directory: Path,
    runtime: Runtime,
    store: ObjectStore,
    catalog: Catalog,
    *,
    scenarios: list[str] | None = None,
    mode: VerifierMode = "code",
) -> list[ImportRow]:
    """Import and publish every (or each named) scenario; one report row per scenario."""
    rows: list[ImportRow] = []
    for scenario in read_release(directory, scenarios):
        imported = import_scenario(scenario, runtime, mode)
        probes = check_environment(runtime, imported.bundle, reuse=True) if imported.bundle is not None else []
        found = defects(imported, probes, scenario.app)
        row: ImportRow = {
            "scenario": scenario.key,
            "env_id": imported.env_id,
            "ref": None,
            "status": "not imported",
            "tools": 0,
            "tasks": len(scenario.tasks),
            "inserts": imported.inserts,
            "defects": found,
            "read_ahead": len(imported.stand_in_reads),
        }
        if imported.bundle is not None:
            checks = [
                validate_seed_data(imported.bundle),
                probe_check(runtime, imported.bundle, reuse=True),
                import_check(found),
            ]
            published = publish(imported.bundle, store, catalog, checks)
            row["ref"] = published.version.ref
            row["status"] = published.version.status
            row["tools"] = len(imported.bundle.tools)
            row["reason"] = published.version.failure_reason
        rows.append(row)
    return rows
