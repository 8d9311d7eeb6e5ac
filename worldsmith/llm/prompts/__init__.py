"""Prompt templates of the generation stages, kept beside the code as `<stage>.md` files.

A template's first line is `version: <n>`; the prompt version of a run is the combination of all
of them. Placeholders are `$name` (string.Template); the stage's spec is appended as JSON Schema
by the backend, so templates describe intent, not format.
"""

from __future__ import annotations

import hashlib
import re
import string
from functools import cache
from pathlib import Path

from worldsmith.llm.looks import LOOKS_OPENING

HERE = Path(__file__).resolve().parent
STAGES = ("scenario", "tasks", "schema", "seed", "tool_plan", "tool_code", "verifiers", "review")


@cache
def _template(stage: str) -> tuple[str, string.Template]:
    text = (HERE / f"{stage}.md").read_text()
    first, _, body = text.partition("\n")
    if not first.startswith("version:"):
        raise ValueError(f"prompt template {stage}.md must start with 'version: <n>'")
    return first.split(":", 1)[1].strip(), string.Template(body.strip())


def render(stage: str, **values: object) -> tuple[str, str]:
    """(system message, user message) of `stage`; the user message ends with any feedback."""
    _, template = _template(stage)
    text = template.substitute({k: str(v) for k, v in values.items()})
    system, _, user = text.partition("\n---\n")
    return system.strip(), user.strip()


def prompt_version() -> str:
    """A short version over every stage template, recorded in each bundle's manifest."""
    versions = "|".join(f"{stage}:{_template(stage)[0]}" for stage in STAGES)
    return "p" + hashlib.sha256(versions.encode()).hexdigest()[:8]


def stage_of(system: str) -> str | None:
    """The stage whose template has this system message (how a test server tells stages apart), whatever the
    backend appended to it (the JSON Schema of JSON mode, the paragraph on looks: llm/looks.py)."""
    system = re.split(rf"\n\n(?:Answer with one JSON object|{LOOKS_OPENING})", system)[0]
    for stage in STAGES:
        if _template(stage)[1].template.partition("\n---\n")[0].strip() == system.strip():
            return stage
    return None


def scenario_lines(user: str) -> tuple[str, str]:
    """The product name and description every stage's user message starts with."""
    name = next((line[len("Product: ") :] for line in user.splitlines() if line.startswith("Product: ")), "")
    description = next(
        (line[len("Description: ") :] for line in user.splitlines() if line.startswith("Description: ")), ""
    )
    return name, description
