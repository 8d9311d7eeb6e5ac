"""`worldsmith import awm`: scenarios of a release directory into the catalog, each with its quality record.

read -> import (bundle of the ASGI kind) -> quality checks (seed expectations, execution probes, the
import report) -> published: good when every check passed, else failed with its reasons, so that
curated sets leave it out. A scenario that yields no bundle at all (its schema or app is broken)
cannot be published; it is reported with its defects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worldsmith.interop.awm import VerifierMode, import_scenario, read_release
from worldsmith.interop.report import defects, import_check
from worldsmith.quality.checks import probe_check
from worldsmith.quality.expectations import validate_seed_data
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import ObjectStore
from worldsmith.storage.publish import publish


def import_release(
    directory: Path,
    runtime: Runtime,
    store: ObjectStore,
    catalog: Catalog,
    *,
    scenarios: list[str] | None = None,
    mode: VerifierMode = "code",
) -> list[dict[str, Any]]:
    """Import and publish every (or each named) scenario; one report row per scenario."""
    rows = []
    for scenario in read_release(directory, scenarios):
        imported = import_scenario(scenario, runtime, mode)
        probes = check_environment(runtime, imported.bundle, reuse=True) if imported.bundle is not None else []
        found = defects(imported, probes, scenario.app)
        row: dict[str, Any] = {
            "scenario": scenario.key,
            "env_id": imported.env_id,
            "ref": None,
            "status": "not imported",
            "tools": 0,
            "tasks": len(scenario.tasks),
            "inserts": imported.inserts,
            "defects": found,
        }
        if imported.bundle is not None:
            checks = [
                validate_seed_data(imported.bundle),
                probe_check(runtime, imported.bundle, reuse=True),
                import_check(found),
            ]
            published = publish(imported.bundle, store, catalog, checks)
            row.update(
                ref=published.version.ref,
                status=published.version.status,
                tools=len(imported.bundle.tools),
                reason=published.version.failure_reason,
            )
        rows.append(row)
    return rows
