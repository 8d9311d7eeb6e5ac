"""Results that cross the runtime boundary: tool results, verifier results, database diffs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic reads a TypedDict of typing_extensions before Python 3.12

from worldsmith.jsonvalue import JsonObject
from worldsmith.models.verdict import Verdict


class ToolResult(BaseModel):
    """Outcome of one tool call.

    `ok`: the tool returned `value`. `tool_error`: an agent-facing refusal or bad arguments
    (`error` says why). `env_error`: the environment failed (an exception in tool code, or a
    sandbox limit named by `limit`, with `refused_module` when it refused an import); counted
    against the env, not the agent.
    """

    status: Literal["ok", "tool_error", "env_error"]
    value: Any = None
    error: str | None = None
    limit: str | None = None
    refused_module: str | None = None
    stdout: str = ""
    changed: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class VerifierResult(BaseModel):
    """What a task's verifier said (one of `VERIFIER_VERDICTS`), or env_error when the verifier itself failed
    (`limit` and `refused_module` as a ToolResult's)."""

    status: Literal[Verdict.complete, Verdict.partial, Verdict.incomplete, Verdict.env_error]
    evidence: JsonObject = Field(default_factory=dict)
    error: str | None = None
    limit: str | None = None
    refused_module: str | None = None


class AppRoutes(BaseModel):
    """An ASGI app's tools (one JSON schema per route), or why the app does not load: `error`, with the
    sandbox `limit` it broke and the `refused_module` of a refused import (as a ToolResult's).
    `stand_in_reads`: the routes its template read ahead (strict isolation; none: the app keeps
    something of a request, or the reads are off: docs/security.md, "Stand-in reads")."""

    tools: list[JsonObject] = Field(default_factory=list)
    stand_in_reads: list[str] = Field(default_factory=list)
    error: str | None = None
    limit: str | None = None
    refused_module: str | None = None


class RowUpdate(TypedDict):
    """A row present in both snapshots whose values differ: its primary key (column: value; the rowid
    as `__rowid__` without one) and the row before and after (column: value)."""

    key: JsonObject
    before: JsonObject
    after: JsonObject


class TableDiff(BaseModel):
    """Rows of one table that changed between two snapshots, keyed by primary key (each row column: value)."""

    inserted: list[JsonObject] = Field(default_factory=list)
    updated: list[RowUpdate] = Field(default_factory=list)
    deleted: list[JsonObject] = Field(default_factory=list)


class DbDiff(BaseModel):
    """Per-table changes between two database snapshots (tables without changes are omitted)."""

    tables: dict[str, TableDiff] = Field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.tables

    def counts(self) -> dict[str, dict[str, int]]:
        return {
            name: {"inserted": len(t.inserted), "updated": len(t.updated), "deleted": len(t.deleted)}
            for name, t in self.tables.items()
        }
