"""What the attempt page shows beyond the attempt's row, like a trace viewer: the prompt's messages as sent,
the model's answer, the files its answer held (each with its diff against the attempt before it of the same
stage, world and run: what a repair changed), and the evidence of the check that judged it, all read from
the object store (storage/attempt_artifacts.py). The failed-worlds page links each failed world to its
failing attempt (`failing_attempts`)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from typing import Literal, TypedDict

from sqlalchemy import func
from sqlmodel import Session, col, select

from worldsmith.models.catalog import StageAttempt
from worldsmith.storage.attempt_artifacts import ArtifactKind, StoredArtifact, attempt_artifacts
from worldsmith.storage.failed_worlds import of_stage
from worldsmith.storage.objectstore import ObjectStore


class DiffLine(TypedDict):
    """One line of a unified diff: `added`, `removed`, `hunk` (an @@ line), `header` or `same`."""

    kind: Literal["added", "removed", "hunk", "header", "same"]
    text: str


class TracedText(TypedDict):
    """An artifact as the page shows it: its name, text, the note when it was stored cut, and (files of a
    repair) its diff against the attempt before it (None: no such file there to compare; []: unchanged)."""

    name: str
    text: str
    truncated: str | None
    diff: list[DiffLine] | None


class Message(TypedDict):
    role: str
    content: str


class AttemptTraceView(TypedDict):
    """The trace of one attempt: whether anything was recorded, the prompt's messages, the answer, the files,
    the evidence, the looks made before answering, and the id and number of the attempt before it (the one
    diffed against), if any."""

    recorded: bool
    messages: list[Message]
    answer: TracedText | None
    files: list[TracedText]
    evidence: TracedText | None
    looks: TracedText | None
    previous_id: int | None
    previous_attempt: int | None


def diff_lines(before: str, after: str, before_name: str, after_name: str) -> list[DiffLine]:
    """The unified diff of `before` and `after` (3 lines of context), line by line with its kind."""
    lines: list[DiffLine] = []
    for line in difflib.unified_diff(
        before.splitlines(), after.splitlines(), before_name, after_name, lineterm="", n=3
    ):
        if line.startswith(("+++", "---")):
            lines.append({"kind": "header", "text": line})
        elif line.startswith("@@"):
            lines.append({"kind": "hunk", "text": line})
        elif line.startswith("+"):
            lines.append({"kind": "added", "text": line})
        elif line.startswith("-"):
            lines.append({"kind": "removed", "text": line})
        else:
            lines.append({"kind": "same", "text": line})
    return lines


def previous_attempt(session: Session, attempt: StageAttempt) -> StageAttempt | None:
    """The attempt before `attempt` in its repair loop: same run, world and stage, numbered one less."""
    if attempt.attempt <= 1:
        return None
    return session.exec(
        select(StageAttempt)
        .where(
            StageAttempt.run_id == attempt.run_id,
            StageAttempt.env_id == attempt.env_id,
            StageAttempt.stage == attempt.stage,
            StageAttempt.attempt == attempt.attempt - 1,
            col(StageAttempt.id) < (attempt.id or 0),
        )
        .order_by(col(StageAttempt.id).desc())
        .limit(1)
    ).first()


def _shown(artifact: StoredArtifact, diff: list[DiffLine] | None = None) -> TracedText:
    note = f"truncated at {artifact.size} bytes of {artifact.full_size}" if artifact.truncated else None
    return {"name": artifact.name, "text": artifact.text, "truncated": note, "diff": diff}


def _messages(artifact: StoredArtifact) -> list[Message]:
    """The messages of messages.json (one `raw` message holding its text when it does not parse)."""
    try:
        parsed = json.loads(artifact.text)
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in parsed]
    except (ValueError, TypeError, KeyError):
        return [{"role": "raw", "content": artifact.text}]


def attempt_trace(session: Session, store: ObjectStore, attempt_id: int) -> AttemptTraceView | None:
    """The trace of stage attempt `attempt_id` (None when there is no such attempt)."""
    attempt = session.get(StageAttempt, attempt_id)
    if attempt is None:
        return None
    artifacts = attempt_artifacts(session, store, attempt_id)
    before = previous_attempt(session, attempt)
    earlier: dict[str, StoredArtifact] = {}
    if before is not None and before.id is not None:
        earlier = {a.name: a for a in attempt_artifacts(session, store, before.id) if a.kind is ArtifactKind.FILE}
    view: AttemptTraceView = {
        "recorded": bool(artifacts),
        "messages": [],
        "answer": None,
        "files": [],
        "evidence": None,
        "looks": None,
        "previous_id": before.id if before else None,
        "previous_attempt": before.attempt if before else None,
    }
    for artifact in artifacts:
        if artifact.kind is ArtifactKind.PROMPT:
            view["messages"] = _messages(artifact)
        elif artifact.kind is ArtifactKind.ANSWER:
            view["answer"] = _shown(artifact)
        elif artifact.kind is ArtifactKind.EVIDENCE:
            view["evidence"] = _shown(artifact)
        elif artifact.kind is ArtifactKind.LOOKS:
            view["looks"] = _shown(artifact)
        else:
            old = earlier.get(artifact.name)
            diff = None
            if old is not None and before is not None:
                names = (f"attempt {before.attempt}/{artifact.name}", f"attempt {attempt.attempt}/{artifact.name}")
                diff = diff_lines(old.text, artifact.text, *names)
            view["files"].append(_shown(artifact, diff))
    return view


def failing_attempts(session: Session, worlds: Iterable[tuple[str, str | None]]) -> dict[tuple[str, str | None], int]:
    """For each (env_id, failed stage) of `worlds`: the id of the world's last attempt that did not succeed, of
    that stage when one is named (`database` holds `database:seed`); worlds with none are left out."""
    wanted = set(worlds)
    envs = sorted({env for env, _ in wanted})
    if not envs:
        return {}
    last = session.exec(
        select(StageAttempt.env_id, StageAttempt.stage, func.max(StageAttempt.id))
        .where(col(StageAttempt.env_id).in_(envs), StageAttempt.outcome != "success")
        .group_by(col(StageAttempt.env_id), col(StageAttempt.stage))
    ).all()
    found: dict[tuple[str, str | None], int] = {}
    for env, stage in wanted:
        ids = [
            attempt_id
            for attempt_env, attempt_stage, attempt_id in last
            if attempt_id is not None and attempt_env == env and (stage is None or of_stage(attempt_stage, stage))
        ]
        if ids:
            found[(env, stage)] = max(ids)
    return found
