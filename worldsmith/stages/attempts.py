"""The record of every stage attempt: kept in memory for the run's summary and written to the
catalog's stage-attempt table as it happens, with its trace (the prompt's messages, the model's answer, the
files it wrote, its check's evidence) in the object store (storage/attempt_artifacts.py)."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import TypedDict

from pydantic import BaseModel

from worldsmith.jsonvalue import JsonObject
from worldsmith.llm.backend import Prompt, Usage
from worldsmith.llm.looks import Look
from worldsmith.models.catalog import StageAttempt
from worldsmith.stages.order import STEPS, Stage
from worldsmith.storage.attempt_artifacts import (
    ANSWER,
    EVIDENCE,
    LOOKS,
    MAX_ARTIFACT_BYTES,
    MESSAGES,
    ArtifactKind,
    AttemptFile,
    bounded,
    store_attempt_files,
)
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import ObjectStore

#: Fields of a spec that hold a file's text, by suffix: `schema_sql` is `schema.sql`, `tools_py` is `tools.py`.
FILE_FIELD = re.compile(r"^(\w+)_(sql|py)$")


class ChatMessage(TypedDict):
    """One message of a prompt as sent (messages.json)."""

    role: str
    content: str


def spec_files(spec: BaseModel) -> dict[str, str]:
    """The files a decoded answer holds, by name: each text field named like `schema_sql` as `schema.sql`, and
    its other fields the answer gave (when it gave any) as `<spec in snake case>.json` (TaskList: `task_list.json`)."""
    files: dict[str, str] = {}
    rest: set[str] = set()
    for name in type(spec).model_fields:
        value, match = getattr(spec, name), FILE_FIELD.match(name)
        if match and isinstance(value, str):
            files[f"{match.group(1)}.{match.group(2)}"] = value
        else:
            rest.add(name)
    given = {name for name in rest if name in spec.model_fields_set}  # optional fields the answer left out: no file
    if given:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", type(spec).__name__).lower()
        files[f"{snake}.json"] = spec.model_dump_json(include=given, indent=2) + "\n"
    return files


@dataclass
class AttemptTrace:
    """What one attempt sent and got, as far as it got: the prompt, the model's raw answer, the spec decoded
    from it, the evidence of the check that rejected it (probe records, failed quality checks) and the looks
    the model made before answering (llm/looks.py)."""

    prompt: Prompt | None = None
    answer: str | None = None
    spec: BaseModel | None = None
    evidence: list[JsonObject] = field(default_factory=list)
    looks: list[Look] = field(default_factory=list)

    def files(self) -> list[AttemptFile]:
        """Its artifacts to store: messages.json, looks.json, answer.txt, the spec's files, evidence.json (those
        it has)."""
        found: list[AttemptFile] = []
        if self.prompt is not None:
            messages: list[ChatMessage] = [
                {"role": "system", "content": self.prompt.system},
                {"role": "user", "content": self.prompt.user},
            ]
            whole = json.dumps(messages, indent=2)
            shown = [{**m, "content": bounded(m["content"], MAX_ARTIFACT_BYTES // 2)} for m in messages]
            found.append(AttemptFile(MESSAGES, ArtifactKind.PROMPT, json.dumps(shown, indent=2), len(whole.encode())))
        if self.looks:
            looks = json.dumps([look.model_dump(mode="json") for look in self.looks], indent=2)
            found.append(AttemptFile.of(LOOKS, ArtifactKind.LOOKS, looks))
        if self.answer is not None:
            found.append(AttemptFile.of(ANSWER, ArtifactKind.ANSWER, self.answer))
        if self.spec is not None:
            found += [AttemptFile.of(n, ArtifactKind.FILE, text) for n, text in spec_files(self.spec).items()]
        if self.evidence:
            found.append(AttemptFile.of(EVIDENCE, ArtifactKind.EVIDENCE, json.dumps(self.evidence, indent=2)))
        return found


@dataclass
class AttemptLog:
    """Attempts of one generation run (`run_id`); `catalog` None keeps them in memory only; with `store`
    too, each attempt's trace is kept there, linked from its row."""

    run_id: str
    catalog: Catalog | None = None
    store: ObjectStore | None = None
    attempts: list[StageAttempt] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(
        self,
        *,
        env_id: str | None,
        stage: str,
        attempt: int,
        outcome: str,
        usage: Usage | None = None,
        error_class: str | None = None,
        error_text: str | None = None,
        trace: AttemptTrace | None = None,
    ) -> StageAttempt:
        usage = usage or Usage()
        row = StageAttempt(
            run_id=self.run_id,
            env_id=env_id,
            stage=stage,
            attempt=attempt,
            outcome=outcome,
            error_class=error_class,
            error_text=(error_text or None) and error_text[:8000],
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            cost_usd=usage.cost_usd,
            seconds=usage.seconds,
        )
        if self.catalog is not None:
            with self.catalog.session() as session:
                session.add(row)
                if self.store is not None and trace is not None:
                    session.flush()
                    assert row.id is not None  # flushed: numbered
                    store_attempt_files(session, self.store, row.id, trace.files())
        with self._lock:
            self.attempts.append(row)
        return row


def pipeline_position(stage: str) -> tuple[int, int, str]:
    """Sort key of a recorded stage name in pipeline order (stages/order.py): `database:schema` before
    `database:seed` before `tools`; names of no stage (e.g. `publish`) last, alphabetically."""
    name, _, step = stage.partition(":")
    stages = list(Stage)
    if name not in stages:
        return (len(stages), 0, stage)
    steps = STEPS.get(Stage(name), ())
    return (stages.index(Stage(name)), steps.index(step) + 1 if step in steps else len(steps) + 1, stage)


class StageSummary(TypedDict):
    """One stage of a generation run: invocations (runs of its repair loop), first-attempt success, repair and
    failure rates, mean attempts per invocation, tokens in and out and cost (USD)."""

    stage: str
    invocations: int
    first_attempt_success: float
    repair_rate: float
    failure_rate: float
    mean_attempts: float
    tokens_in: int
    tokens_out: int
    cost_usd: float


def stage_summary(attempts: list[StageAttempt]) -> list[StageSummary]:
    """Per stage, in pipeline order: invocations, first-attempt success, repair and failure rates, mean
    attempts, tokens and cost. An invocation is one run of a stage's repair loop (attempts 1, 2, ...)."""
    runs: dict[str, list[list[StageAttempt]]] = {}
    for row in sorted(attempts, key=lambda a: (a.env_id or "", a.stage, a.id or 0)):
        per_stage = runs.setdefault(row.stage, [])
        if row.attempt == 1 or not per_stage or per_stage[-1][-1].env_id != row.env_id:
            per_stage.append([])
        per_stage[-1].append(row)
    summary: list[StageSummary] = []
    for stage, invocations in sorted(runs.items(), key=lambda item: pipeline_position(item[0])):
        n = len(invocations)
        first = sum(1 for inv in invocations if inv[0].outcome == "success")
        repaired = sum(1 for inv in invocations if inv[0].outcome != "success" and inv[-1].outcome == "success")
        rows = [a for inv in invocations for a in inv]
        summary.append(
            {
                "stage": stage,
                "invocations": n,
                "first_attempt_success": round(first / n, 3),
                "repair_rate": round(repaired / n, 3),
                "failure_rate": round((n - first - repaired) / n, 3),
                "mean_attempts": round(len(rows) / n, 2),
                "tokens_in": sum(a.tokens_in for a in rows),
                "tokens_out": sum(a.tokens_out for a in rows),
                "cost_usd": round(sum(a.cost_usd for a in rows), 6),
            }
        )
    return summary
