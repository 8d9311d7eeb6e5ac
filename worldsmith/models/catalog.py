"""SQLModel tables of the catalog (docs/architecture.md, "Catalog"). Schema changes go through Alembic
migrations in `worldsmith/storage/migrations/`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, Index, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


class Environment(SQLModel, table=True):
    """One world across its versions."""

    __tablename__ = "environments"

    env_id: str = Field(primary_key=True, max_length=64)
    scenario_name: str
    description: str = ""
    categories: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class EnvironmentVersion(SQLModel, table=True):
    """One immutable published version of an environment."""

    __tablename__ = "environment_versions"
    __table_args__ = (UniqueConstraint("env_id", "version"),)

    id: int | None = Field(default=None, primary_key=True)
    env_id: str = Field(foreign_key="environments.env_id", index=True, max_length=64)
    version: int
    content_key: str = Field(unique=True, max_length=64, description="sha256 over the env_id and artifact hashes")
    content_digest: str | None = Field(
        default=None,
        unique=True,
        index=True,
        max_length=64,
        description="sha256 over the artifact hashes alone (no env_id, no manifest): set on good versions published "
        "with deduplication (generated worlds), so one content is published once whatever its env_id",
    )
    manifest_digest: str = Field(max_length=71)
    status: str = Field(default="good", max_length=16, description="good | failed")
    failure_reason: str | None = None
    failed_stage: str | None = Field(
        default=None,
        max_length=32,
        description="the generation stage a failed world stopped at before it was a bundle: its artifacts are "
        "what the stages before it wrote (no loadable bundle)",
    )
    generator_backend: str = Field(default="", max_length=64)
    generator_model: str | None = None
    prompt_version: str | None = None
    seed: int | None = None
    stats: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    quality: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)

    @property
    def ref(self) -> str:
        return f"{self.env_id}@{self.version}"


class Artifact(SQLModel, table=True):
    """One file of an environment version, stored by digest in the object store."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("version_id", "name"),)

    id: int | None = Field(default=None, primary_key=True)
    version_id: int = Field(foreign_key="environment_versions.id", index=True)
    name: str = Field(max_length=128)
    digest: str = Field(max_length=71, index=True)
    size: int


class StageAttempt(SQLModel, table=True):
    """One attempt of one generation stage (an LLM call plus its execution check)."""

    __tablename__ = "stage_attempts"
    __table_args__ = (Index("ix_stage_attempts_stage_created_at", "stage", "created_at"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(index=True, max_length=64)
    env_id: str | None = Field(default=None, index=True, max_length=64)
    version_id: int | None = Field(default=None, foreign_key="environment_versions.id")
    stage: str = Field(max_length=32)
    attempt: int
    outcome: str = Field(max_length=16, description="success | failure | transient")
    error_class: str | None = Field(default=None, max_length=128)
    error_text: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    created_at: datetime = Field(default_factory=utcnow, index=True)


class QualityReport(SQLModel, table=True):
    """The result of one quality check of an environment version (expectations, probes, import)."""

    __tablename__ = "quality_reports"

    id: int | None = Field(default=None, primary_key=True)
    version_id: int = Field(foreign_key="environment_versions.id", index=True)
    kind: str = Field(max_length=32, description="expectations | probes | import")
    passed: bool
    summary: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    details: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class EnvironmentSet(SQLModel, table=True):
    """A named, immutable selection of environment versions."""

    __tablename__ = "environment_sets"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, max_length=128)
    query: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class EnvironmentSetMember(SQLModel, table=True):
    """One environment version in a set, with its split."""

    __tablename__ = "environment_set_members"

    set_id: int = Field(foreign_key="environment_sets.id", primary_key=True)
    version_id: int = Field(foreign_key="environment_versions.id", primary_key=True)
    split: str = Field(max_length=16, description="train | validation")


class EvaluationRun(SQLModel, table=True):
    """One evaluation of a policy over an environment set."""

    __tablename__ = "evaluation_runs"

    id: int | None = Field(default=None, primary_key=True)
    set_id: int | None = Field(default=None, foreign_key="environment_sets.id")
    policy: str = Field(max_length=256)
    samples: int = 1
    status: str = Field(default="running", max_length=16)
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    flow_run_id: str | None = Field(default=None, max_length=64)
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class TrainingRun(SQLModel, table=True):
    """One training run over an environment set."""

    __tablename__ = "training_runs"

    id: int | None = Field(default=None, primary_key=True)
    set_id: int | None = Field(default=None, foreign_key="environment_sets.id")
    config: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    status: str = Field(default="running", max_length=16)
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    flow_run_id: str | None = Field(default=None, max_length=64)
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class TrainingStep(SQLModel, table=True):
    """Metrics of one logged optimizer step of a training run (reward, success, KL, loss, ...)."""

    __tablename__ = "training_steps"
    __table_args__ = (Index("ix_training_steps_run_step", "training_run_id", "step", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    training_run_id: int = Field(foreign_key="training_runs.id")
    step: int
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class Checkpoint(SQLModel, table=True):
    """A model checkpoint of a training run, stored in the object store."""

    __tablename__ = "checkpoints"

    id: int | None = Field(default=None, primary_key=True)
    training_run_id: int = Field(foreign_key="training_runs.id", index=True)
    step: int
    digest: str = Field(max_length=71)
    metrics: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)
