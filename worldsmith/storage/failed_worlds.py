"""The files a world that stopped before it was a bundle is published with, so `catalog fetch` of it holds
everything its stages produced: the work of the stages that finished (stages/work.EnvWork.partial_files), the files of
each step's last successful attempt beside them (the schema of a world whose seed failed: its stage never
returned), the failing attempt's trace under `failed_attempt/` (the prompt's messages, the model's answer,
the files it wrote, the check's evidence, its error), and `FAILED.md` saying which stage failed and why.

The files depend only on what the attempts made, not on their ids or times, so publishing the same failure
again gives the same version."""

from __future__ import annotations

from sqlmodel import col, select

from worldsmith.models.catalog import StageAttempt
from worldsmith.storage.attempt_artifacts import ArtifactKind, attempt_artifacts
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import ObjectStore

FAILED_ATTEMPT = "failed_attempt"
NOTE = "FAILED.md"
ERROR = "error.txt"


def of_stage(recorded: str, stage: str) -> bool:
    """Whether an attempt recorded as of stage `recorded` is of `stage` (`database` holds `database:seed`;
    a step names itself)."""
    return recorded == stage or recorded.startswith(f"{stage}:")


def failure_note(env_id: str, stage: str, reason: str, failing: StageAttempt | None, traced: list[str]) -> str:
    """FAILED.md: which stage failed, why, and what the fetched directory holds."""
    lines = [f"# {env_id} failed at stage {stage}", "", reason, ""]
    if failing is None:
        lines.append("No attempt of that stage was recorded.")
    else:
        lines += [
            f"The failing attempt: {failing.stage} attempt {failing.attempt}, "
            f"{failing.outcome} ({failing.error_class or 'unclassified'}). `{FAILED_ATTEMPT}/` holds "
            f"what it sent and got: {', '.join(traced)}.",
            "messages.json is the prompt sent, answer.txt the model's answer, evidence.json what the check found.",
        ]
    lines += [
        "",
        "The other files are what the stages wrote before it (work.json: the whole work so far). The dashboard's",
        "failed-worlds page opens the same attempt, with its diff against the attempt before it.",
        "",
    ]
    return "\n".join(lines)


def failed_world_files(
    env_id: str, finished: dict[str, bytes], stage: str, reason: str, catalog: Catalog, store: ObjectStore
) -> dict[str, bytes]:
    """The files of world `env_id`, failed at `stage` for `reason`: `finished` (what its finished stages
    wrote) and its attempts' (see the module docstring)."""
    files = dict(finished)
    with catalog.session() as session:
        attempts = session.exec(
            select(StageAttempt).where(StageAttempt.env_id == env_id).order_by(col(StageAttempt.id))
        ).all()
        succeeded = {a.stage: a for a in attempts if a.outcome == "success"}  # the last success of each step
        for attempt in succeeded.values():
            assert attempt.id is not None  # a stored row
            for artifact in attempt_artifacts(session, store, attempt.id):
                if artifact.kind is ArtifactKind.FILE:
                    files.setdefault(artifact.name, artifact.text.encode())
        failing = next((a for a in reversed(attempts) if a.outcome != "success" and of_stage(a.stage, stage)), None)
        traced: list[str] = []
        if failing is not None:
            assert failing.id is not None
            for artifact in attempt_artifacts(session, store, failing.id):
                files[f"{FAILED_ATTEMPT}/{artifact.name}"] = artifact.text.encode()
                traced.append(artifact.name)
            if failing.error_text:
                files[f"{FAILED_ATTEMPT}/{ERROR}"] = failing.error_text.encode()
                traced.append(ERROR)
    files[NOTE] = failure_note(env_id, stage, reason, failing, traced).encode()
    return files
