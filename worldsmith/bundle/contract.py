"""The world contract: a `Bundle`, one environment version, with its manifest, its files and its kinds.

What a bundle holds (manifest.json, the source files of its tools kind and the files derived from
them), the content keys it is known by, and the check every tool call's arguments pass first. How
its tools and verifiers are written, run and judged is its kinds' business (worldsmith/bundle/kinds.py);
reading, validating, building and writing bundle directories is worldsmith/bundle/loader.py's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import jsonschema
from pydantic import TypeAdapter

from worldsmith.bundle.kinds import TOOLS_KINDS, VERIFIERS_KINDS, ToolsKind, VerifiersKind
from worldsmith.jsonvalue import JsonValue
from worldsmith.models.bundle import Invariant, Manifest, TaskSpec, ToolSchema

#: The manifest's file name; every other file of a bundle is an artifact hashed in it.
MANIFEST = "manifest.json"


def tools_kind_of(manifest: Manifest | None) -> ToolsKind:
    """The tools kind a manifest names (native when there is no manifest)."""
    return TOOLS_KINDS[manifest.tools_kind if manifest is not None else None]


def verifiers_kind_of(manifest: Manifest | None) -> VerifiersKind:
    """The verifiers kind a manifest names (native when there is no manifest)."""
    return VERIFIERS_KINDS[manifest.verifiers_kind if manifest is not None else None]


def clock_of(manifest: Manifest) -> str | None:
    """A manifest's clock (`Bundle.clock`): `clock`, else the `origin.clock` of older imports."""
    if manifest.clock:
        return manifest.clock
    legacy = (manifest.origin or {}).get("clock")
    return legacy if isinstance(legacy, str) and legacy else None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_digest(data: bytes) -> str:
    """The manifest's notation for an artifact's hash: `sha256:<hex>`."""
    return "sha256:" + sha256_hex(data)


@dataclass(frozen=True)
class Bundle:
    """One validated environment version: its manifest, its files and what was derived from them."""

    manifest: Manifest
    files: dict[str, bytes]
    tasks: tuple[TaskSpec, ...]
    tools: tuple[ToolSchema, ...]
    root: Path | None = field(default=None, compare=False)

    @property
    def env_id(self) -> str:
        return self.manifest.env_id

    @property
    def tools_kind(self) -> ToolsKind:
        return tools_kind_of(self.manifest)

    @property
    def verifiers_kind(self) -> VerifiersKind:
        return verifiers_kind_of(self.manifest)

    @property
    def world(self) -> bytes:
        """The serialized seeded database (`world.db`)."""
        return self.files["world.db"]

    def text(self, name: str) -> str:
        return self.files[name].decode("utf-8")

    @cached_property
    def key(self) -> str:
        """Content key of this version: sha256 over its env_id and artifact hashes (stable across copies)."""
        identity = {"env_id": self.env_id, "artifacts": self.manifest.artifacts}
        return sha256_hex(json.dumps(identity, sort_keys=True).encode())

    @property
    def clock(self) -> str | None:
        """The world's "now" (ISO, UTC) its tools' and verifiers' clock reads answer, or None (the real
        time): the manifest's `clock`; bundles imported before it existed kept it in `origin.clock`."""
        return clock_of(self.manifest)

    @cached_property
    def runtime_key(self) -> str:
        """What sandbox workers load this version under: its content key and, where its clock is
        fixed, the instant its clock reads answer (part of its behaviour, not of its artifacts)."""
        return f"{self.key}@{self.clock}" if self.clock else self.key

    @cached_property
    def invariants(self) -> tuple[Invariant, ...]:
        """The world's invariants (`invariants.json`; none in a bundle without it), checked by the loader."""
        data = self.files.get("invariants.json")
        return tuple(TypeAdapter(list[Invariant]).validate_json(data)) if data else ()

    def task(self, task_id: str) -> TaskSpec:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(f"{self.env_id} has no task {task_id!r} (tasks: {', '.join(t.id for t in self.tasks)})")

    @cached_property
    def validators(self) -> dict[str, jsonschema.protocols.Validator]:
        """A prepared JSON Schema validator of each tool's arguments."""
        return {t.name: jsonschema.Draft202012Validator(t.parameters) for t in self.tools}

    def argument_error(self, name: str, arguments: Mapping[str, JsonValue]) -> str | None:
        """Why calling tool `name` with `arguments` is refused before it runs (an unknown tool, arguments
        that break its schema), or None: the agent-facing message of a `tool_error`."""
        validator = self.validators.get(name)
        if validator is None:
            return f"unknown tool {name!r}; available tools: {', '.join(t.name for t in self.tools)}"
        problem = jsonschema_error(validator, arguments)
        return f"invalid arguments for {name}: {problem}" if problem else None

    def tool(self, name: str) -> ToolSchema:
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(name)


def jsonschema_error(
    schema: Mapping[str, JsonValue] | jsonschema.protocols.Validator, arguments: JsonValue | Mapping[str, JsonValue]
) -> str | None:
    """The first reason `arguments` do not match `schema` (or a prepared validator), or None."""
    validator: jsonschema.protocols.Validator = (
        schema if hasattr(schema, "iter_errors") else jsonschema.Draft202012Validator(schema)
    )
    if validator.is_valid(arguments):
        return None
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"argument {where}: {error.message}" if where else error.message
