"""What a stage attempt sent and got, kept beside its catalog row: the prompt's messages, the model's answer,
the files it wrote and its check's evidence, each an object in the store linked from an `attempt_artifacts`
row (models/catalog.AttemptArtifact). Each is bounded: a text longer than `MAX_ARTIFACT_BYTES` is stored cut
there, with a line saying so (`truncation_note`), and its row keeps the size it had."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sqlmodel import Session, col, select

from worldsmith.models.catalog import AttemptArtifact
from worldsmith.storage.objectstore import ObjectMissing, ObjectStore

#: The most bytes of one attempt artifact kept in the store (the rest is cut, and the cut marked).
MAX_ARTIFACT_BYTES = 256 * 1024
MESSAGES, ANSWER, EVIDENCE, LOOKS = "messages.json", "answer.txt", "evidence.json", "looks.json"


class ArtifactKind(StrEnum):
    """What an attempt artifact is: the prompt sent (its messages), the model's answer, a file the answer
    held, the evidence of the check that judged it, or the looks the model made before answering."""

    PROMPT = "prompt"
    ANSWER = "answer"
    FILE = "file"
    EVIDENCE = "evidence"
    LOOKS = "looks"


def truncation_note(limit: int, size: int) -> str:
    return f"\n... [truncated at {limit} bytes of {size}]\n"


def bounded(text: str, limit: int = MAX_ARTIFACT_BYTES) -> str:
    """`text` whole when its UTF-8 fits in `limit` bytes, else its first `limit` bytes (whole characters)
    followed by `truncation_note`."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + truncation_note(limit, len(data))


@dataclass(frozen=True)
class AttemptFile:
    """One artifact of an attempt to store: its name, kind and text (already bounded, see `bounded`), and the
    bytes the attempt made (`full_size`; more than the text's when it was cut)."""

    name: str
    kind: ArtifactKind
    text: str
    full_size: int

    @classmethod
    def of(cls, name: str, kind: ArtifactKind, text: str) -> AttemptFile:
        """`text` bounded to MAX_ARTIFACT_BYTES."""
        return cls(name, kind, bounded(text), len(text.encode()))


def store_attempt_files(session: Session, store: ObjectStore, attempt_id: int, files: Sequence[AttemptFile]) -> None:
    """Put `files` into `store` and link them to stage attempt `attempt_id` in `session` (objects first, so no
    row points at a missing object)."""
    for file in files:
        data = file.text.encode()
        session.add(
            AttemptArtifact(
                attempt_id=attempt_id,
                name=file.name,
                kind=file.kind.value,
                digest=store.put_bytes(data),
                size=len(data),
                full_size=file.full_size,
            )
        )


@dataclass(frozen=True)
class StoredArtifact:
    """An attempt artifact read back: name, kind, sizes, and its text (a line saying so when its object is
    missing from the store)."""

    name: str
    kind: ArtifactKind
    size: int
    full_size: int
    text: str

    @property
    def truncated(self) -> bool:
        return self.full_size > self.size


def attempt_artifacts(session: Session, store: ObjectStore, attempt_id: int) -> list[StoredArtifact]:
    """The artifacts of stage attempt `attempt_id`, in the order they were stored, each read from `store`."""
    rows = session.exec(
        select(AttemptArtifact).where(AttemptArtifact.attempt_id == attempt_id).order_by(col(AttemptArtifact.id))
    ).all()
    found = []
    for row in rows:
        try:
            text = store.get_bytes(row.digest).decode(errors="replace")
        except ObjectMissing:
            text = f"(object {row.digest} is missing from the object store {store.url})"
        found.append(StoredArtifact(row.name, ArtifactKind(row.kind), row.size, row.full_size, text))
    return found
