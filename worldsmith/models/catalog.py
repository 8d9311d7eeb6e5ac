"""SQLModel tables of the catalog (docs/architecture.md, "Catalog"). Schema changes go through Alembic
migrations in `worldsmith/storage/migrations/`."""

from __future__ import annotations

from datetime import UTC, date, datetime

from sqlalchemy import JSON, BigInteger, Column, Index, UniqueConstraint
from sqlmodel import AutoString, Field, SQLModel

from worldsmith.jsonvalue import JsonObject
from worldsmith.models.runs import RunStatus
from worldsmith.models.sets import VersionStatus


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
    __table_args__ = (
        UniqueConstraint("env_id", "version"),
        Index("ix_environment_versions_status_created_at", "status", "created_at"),
        Index("ix_environment_versions_created_at", "created_at"),
        Index("ix_environment_versions_generator_backend", "generator_backend"),
    )

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
    status: VersionStatus = Field(default="good", sa_type=AutoString(length=16), description="good | failed")
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
    stats: dict[str, int] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    quality: dict[str, JsonObject] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
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
    __table_args__ = (
        Index("ix_stage_attempts_stage_created_at", "stage", "created_at"),
        Index("ix_stage_attempts_env_id_created_at", "env_id", "created_at"),
    )

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


class AttemptArtifact(SQLModel, table=True):
    """One thing a stage attempt sent or got, stored by digest in the object store (worldsmith/storage/
    attempt_artifacts.py): the prompt's messages, the model's answer, a file it wrote, the check's evidence."""

    __tablename__ = "attempt_artifacts"
    __table_args__ = (UniqueConstraint("attempt_id", "name"),)

    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="stage_attempts.id", index=True)
    name: str = Field(max_length=128, description="messages.json, answer.txt, evidence.json or a file's name")
    kind: str = Field(max_length=16, description="prompt | answer | file | evidence | looks")
    digest: str = Field(max_length=71)
    size: int = Field(description="bytes stored")
    full_size: int = Field(description="bytes the attempt made: more than `size` when the stored text was cut")


#: A rollup's `env_id` of attempts that name no world (a run's scenario stage), and `error_class` of failed
#: attempts that recorded no class: the rollups' keys are never NULL.
NO_KEY = ""


class AttemptSums(SQLModel):
    """What a rollup row sums over the stage attempts it stands for."""

    attempts: int = 0
    invocations: int = Field(0, description="attempts 1: runs of the stage's repair loop")
    first_ok: int = Field(0, description="attempts 1 that succeeded")
    repaired: int = Field(0, description="later attempts that succeeded")
    failures: int = Field(0, description="attempts that did not succeed (failures and transient errors)")
    tokens_in: int = Field(0, sa_type=BigInteger)
    tokens_out: int = Field(0, sa_type=BigInteger)
    cost_usd: float = 0.0
    seconds: float = 0.0
    first_at: datetime
    last_at: datetime


class StageRollup(AttemptSums, table=True):
    """Stage attempts summed per UTC night, run, world and stage. Like every rollup it is kept by the database
    itself (a trigger on `stage_attempts`, migration 0005) as attempts are recorded, so the dashboard reads
    a row where it would read every attempt; its sums are those of the attempts it stands for."""

    __tablename__ = "stage_rollups"
    __table_args__ = (
        Index("ix_stage_rollups_env_id", "env_id"),
        Index("ix_stage_rollups_run_id", "run_id"),
        Index("ix_stage_rollups_stage_night", "stage", "night"),
    )

    night: date = Field(primary_key=True)
    run_id: str = Field(primary_key=True, max_length=64)
    env_id: str = Field(primary_key=True, max_length=64, description="NO_KEY: attempts of no world")
    stage: str = Field(primary_key=True, max_length=32)


class NightRollup(AttemptSums, table=True):
    """Stage attempts summed per UTC night, run and stage (StageRollup without the world: what the front page's
    per-night series read when no filter narrows by world)."""

    __tablename__ = "night_rollups"

    night: date = Field(primary_key=True)
    run_id: str = Field(primary_key=True, max_length=64)
    stage: str = Field(primary_key=True, max_length=32)


class WorldRollup(AttemptSums, table=True):
    """Stage attempts summed per world over every night, run and stage (the worlds list when no filter narrows
    by night or run), the legacy pseudo-stage `environment` left out."""

    __tablename__ = "world_rollups"

    env_id: str = Field(primary_key=True, max_length=64)


class FailureRollup(SQLModel, table=True):
    """Failed stage attempts counted per UTC night, run, world, stage and error class (NO_KEY: none recorded)."""

    __tablename__ = "failure_rollups"
    __table_args__ = (Index("ix_failure_rollups_env_id", "env_id"),)

    night: date = Field(primary_key=True)
    run_id: str = Field(primary_key=True, max_length=64)
    env_id: str = Field(primary_key=True, max_length=64)
    stage: str = Field(primary_key=True, max_length=32)
    error_class: str = Field(primary_key=True, max_length=128)
    failures: int = 0


class NightFailureRollup(SQLModel, table=True):
    """Failed stage attempts counted per UTC night, run, stage and error class (FailureRollup without the world)."""

    __tablename__ = "night_failure_rollups"

    night: date = Field(primary_key=True)
    run_id: str = Field(primary_key=True, max_length=64)
    stage: str = Field(primary_key=True, max_length=32)
    error_class: str = Field(primary_key=True, max_length=128)
    failures: int = 0


class QualityReport(SQLModel, table=True):
    """The result of one quality check of an environment version (expectations, probes, import)."""

    __tablename__ = "quality_reports"

    id: int | None = Field(default=None, primary_key=True)
    version_id: int = Field(foreign_key="environment_versions.id", index=True)
    kind: str = Field(max_length=32, description="expectations | probes | import")
    passed: bool
    summary: JsonObject = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    details: list[JsonObject] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class EnvironmentSet(SQLModel, table=True):
    """A named, immutable selection of environment versions."""

    __tablename__ = "environment_sets"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, max_length=128)
    query: JsonObject = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
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
    status: RunStatus = Field(default=RunStatus.RUNNING, sa_type=AutoString(length=16))
    metrics: JsonObject = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    flow_run_id: str | None = Field(default=None, max_length=64)
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class TrainingRun(SQLModel, table=True):
    """One training run over an environment set."""

    __tablename__ = "training_runs"

    id: int | None = Field(default=None, primary_key=True)
    set_id: int | None = Field(default=None, foreign_key="environment_sets.id")
    config: JsonObject = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    status: RunStatus = Field(default=RunStatus.RUNNING, sa_type=AutoString(length=16))
    metrics: JsonObject = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    flow_run_id: str | None = Field(default=None, max_length=64)
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class RunRecord(SQLModel, table=True):
    """A run with no run table of its own: a generation run (its `run_id` is its stage attempts'), a
    curation run, or an evaluation or training run refused before it opened its row. Its metrics hold
    `process` (worldsmith/storage/run_owner.py), `error` and, for a run that died in one, `failed_stage`."""

    __tablename__ = "run_records"
    __table_args__ = (Index("ix_run_records_kind_started_at", "kind", "started_at"),)

    run_id: str = Field(primary_key=True, max_length=64)
    kind: str = Field(max_length=16, description="a worldsmith/models/runs.RunKind")
    status: RunStatus = Field(default=RunStatus.RUNNING, sa_type=AutoString(length=16))
    what: str = Field(default="", max_length=256, description="what ran, in a few words")
    metrics: JsonObject = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
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
    metrics: JsonObject = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class Checkpoint(SQLModel, table=True):
    """A model checkpoint of a training run, stored in the object store."""

    __tablename__ = "checkpoints"

    id: int | None = Field(default=None, primary_key=True)
    training_run_id: int = Field(foreign_key="training_runs.id", index=True)
    step: int
    digest: str = Field(max_length=71)
    metrics: JsonObject = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)
