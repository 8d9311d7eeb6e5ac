"""The two worlds a strong model wrote (examples/realmodel/{rover,zocdoc}: their sources as written), built
as bundles, optionally with a file edited: realistic clean worlds, and copies with planted defects."""

from __future__ import annotations

import json

from support.paths import REPO
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import build_bundle
from worldsmith.llm.procedural.faults import SOURCES

REALMODEL = REPO / "examples" / "realmodel"


def real_sources(name: str) -> dict[str, str]:
    """World `name`'s five source files, as written."""
    return {file: (REALMODEL / name / file).read_text() for file in SOURCES}


def real_world(name: str, files: dict[str, str | bytes] | None = None, edit: tuple[str, str] | None = None) -> Bundle:
    """World `name` built from `files` (default: its sources as written), with `edit` (old, new) made once
    in its tools.py (the old text must be there)."""
    built: dict[str, str | bytes] = dict(files or real_sources(name))
    if edit is not None:
        tools_py = str(built["tools.py"])
        assert edit[0] in tools_py, edit[0]
        built["tools.py"] = tools_py.replace(*edit, 1)
    written = json.loads((REALMODEL / name / "manifest.json").read_text())
    return build_bundle(built, {key: written[key] for key in ("env_id", "scenario", "clock") if key in written})
