"""The import quality report: every defect of an imported environment, by kind, as a catalog check.

Kinds (design of issue 8; each names the thing at fault):
- `seed_insert_fails`: an insert of the release's seed data fails (the insert is dropped, the
  environment is failed);
- `app_fails`: the app does not load in the sandbox;
- `route_crashes`: a route answers 5xx or raises on plausible input (its documented examples,
  else values from the seed data);
- `verifier_raises`: a verifier raises instead of judging;
- `task_already_satisfied`: the untouched database already passes a task's verifier;
- `reference_rejected` / `replay_differs`: a given reference solution is not accepted, or two
  replays end in different databases;
- `secret_attempt` / `network_attempt` / `sandbox_violation`: the code tried to read a secret, to
  reach the network, or anything else the sandbox refuses (refused either way).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from worldsmith.bundle.asgiapp import app_imports
from worldsmith.bundle.codepolicy import APP_MODULES
from worldsmith.interop.awm import Imported
from worldsmith.models.quality import QualityCheck
from worldsmith.quality.probes import ProbeResult

_LIMIT = re.compile(r"sandbox limit (\w+):")
_BY_LIMIT = {"secrets": "secret_attempt", "network": "network_attempt"}
_BY_PROBE = {
    "tool runs": "route_crashes",
    "tool runs on valid inputs": "route_crashes",
    "reference accepted": "reference_rejected",
    "replay deterministic": "replay_differs",
}


_IMPORT = re.compile(r"import of '([\w.]+)' refused")
#: Modules whose import is an attempt to reach the network.
NETWORK_MODULES = frozenset(
    {"socket", "ssl", "urllib", "http", "httpx", "requests", "aiohttp", "urllib3", "ftplib", "smtplib", "websockets"}
)


def _violation(detail: str) -> str | None:
    """The defect kind of a sandbox refusal named in `detail`; None when there is none (or it is a
    resource limit: a timeout is the route's crash, not an attempt)."""
    match = _LIMIT.search(detail or "")
    if match is None:
        return None
    limit = match.group(1)
    if limit == "import":
        module = _IMPORT.search(detail)
        return "network_attempt" if module and module.group(1).split(".")[0] in NETWORK_MODULES else "sandbox_violation"
    return _BY_LIMIT.get(limit, "sandbox_violation" if limit not in ("timeout", "cpu", "memory", "recursion") else None)


def static_defects(app_source: str) -> list[dict[str, str]]:
    """Imports in the app that the sandbox will refuse: network modules are network attempts."""
    found = []
    for line, module in app_imports(app_source):
        top = module.split(".")[0]
        if top not in APP_MODULES:
            kind = "network_attempt" if top in NETWORK_MODULES else "sandbox_violation"
            found.append(
                {"kind": kind, "target": f"app.py:{line}", "detail": f"imports {module!r}, which the sandbox refuses"}
            )
    return found


def defects(imported: Imported, probes: list[ProbeResult], app_source: str = "") -> list[dict[str, str]]:
    """Every defect found importing and probing one scenario: `{kind, target, detail}`."""
    found = [
        {"kind": "seed_insert_fails", "target": "seed", "detail": f"{error}: {statement[:200]}"}
        for statement, error in imported.failed_inserts
    ]
    found += static_defects(app_source)
    for problem in imported.defects:
        if problem.startswith("seed:"):
            continue  # each failed insert is listed above
        found.append(
            {
                "kind": _violation(problem) or "app_fails" if problem.startswith("app:") else "malformed",
                "target": problem.split(":")[0],
                "detail": problem,
            }
        )
    for probe in probes:
        if probe.passed:
            continue
        kind = _violation(probe.detail)
        if kind is None and probe.probe == "untouched rejected":
            kind = "task_already_satisfied" if probe.detail.startswith("complete") else "verifier_raises"
        found.append(
            {
                "kind": kind or _BY_PROBE.get(probe.probe, probe.probe.replace(" ", "_")),
                "target": probe.target,
                "detail": probe.detail,
            }
        )
    return found


def import_check(found: list[dict[str, str]]) -> QualityCheck:
    """The `import` quality check of a version: passed when nothing was found."""
    counts = Counter(d["kind"] for d in found)
    summary: dict[str, Any] = {"defects": len(found), "by_kind": dict(sorted(counts.items()))}
    if found:
        summary["reason"] = "import defects: " + ", ".join(f"{kind} x{n}" for kind, n in sorted(counts.items()))
    return QualityCheck("import", not found, summary, found[:200])
