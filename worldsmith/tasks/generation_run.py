"""A generation run as its tasks see it: the run's parameters, and the generator, sandbox runtime
and attempt log that each process running its tasks builds from them on first use, so tasks need
nothing but their (serialisable) arguments."""

from __future__ import annotations

import atexit
import hashlib
import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator

from worldsmith.llm.backend import Generator
from worldsmith.llm.prompts import prompt_version
from worldsmith.llm.recording import REPLAY_PREFIX, Recording, RecordingGenerator, ReplayGenerator, replay_directory
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import Settings, get_settings
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.scenario import Embed
from worldsmith.storage.catalog import open_catalog

BACKENDS = ("procedural", "openai")


class GenerateParameters(BaseModel):
    """Parameters of a generation run (the `generate` flow and `worldsmith generate`)."""

    count: int = Field(10, ge=1, le=10000, description="Environments to generate.")
    scenario_file: str | None = Field(None, description="Seed scenarios (JSON lines: name, description, categories).")
    backend: str | None = Field(
        None,
        description=(
            "procedural (offline), openai (WORLDSMITH_LLM_* settings) or replay:DIR (the answers recorded in DIR); "
            "unset: openai when a model endpoint is configured (WORLDSMITH_LLM_BASE_URL or _API_KEY), else procedural."
        ),
    )
    record: str | None = Field(
        None, description="Directory keeping every request and answer of the run, to rerun it with replay:DIR."
    )
    model: str | None = Field(None, description="Model of the openai backend (default WORLDSMITH_LLM_MODEL).")
    concurrency: int = Field(4, ge=1, le=256, description="Environments built at once.")
    max_attempts: int = Field(5, ge=1, le=20, description="Attempts of each stage's repair loop.")
    seed: int | None = Field(
        0, description="Seed of the generator; unset: the UTC date (YYYYMMDD), so each night makes new environments."
    )
    fault_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="Procedural backend: share of first attempts that fail like LLM output."
    )
    review: bool = Field(
        False,
        description="After validation, the model reviews each world for suspected bugs; each finding is probed and a "
        "confirmed one sent back for repair (costs one more model call per world; never for the procedural backend).",
    )
    min_good_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="The run ends Failed (after its summary) when fewer than this share of its worlds are good "
        "(published good, or identical to a good version already published), so Prefect can alert; 0 never fails.",
    )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str | None) -> str | None:
        """A known backend; replay:DIR only when DIR holds a recording (its path made absolute)."""
        if backend is None or backend in BACKENDS:
            return backend
        directory = replay_directory(backend)
        if directory is None:
            raise ValueError(f"unknown backend {backend!r}: use {', '.join(BACKENDS)} or {REPLAY_PREFIX}DIR")
        return REPLAY_PREFIX + str(Recording.existing(directory.expanduser().resolve()).directory)

    @field_validator("scenario_file")
    @classmethod
    def _existing_scenarios(cls, scenario_file: str | None) -> str | None:
        """A file of seed scenarios that exists where the run starts (checked before any stage runs)."""
        if scenario_file and not Path(scenario_file).expanduser().is_file():
            raise ValueError(f"scenario file {scenario_file} not found; give a JSON lines file of seed scenarios")
        return scenario_file

    @field_validator("record")
    @classmethod
    def _absolute_record(cls, record: str | None) -> str | None:
        return str(Path(record).expanduser().resolve()) if record else None

    @model_validator(mode="after")
    def _record_elsewhere(self) -> GenerateParameters:
        """A replay may be recorded, into another directory: answers added to the one it reads would shift them."""
        if self.record and self.backend and replay_directory(self.backend) == Path(self.record):
            raise ValueError(f"record into another directory than the replayed one ({self.record})")
        return self

    def resolved_backend(self) -> str:
        """The backend a run uses: the one given, else the one configured (see `configured_backend`)."""
        return self.backend or configured_backend(get_settings())

    def dated(self) -> GenerateParameters:
        """These parameters as a run uses them (what a nightly run needs): an unset seed replaced by
        today's UTC date, an unset backend by the configured one."""
        update: dict[str, object] = {}
        if self.seed is None:
            update["seed"] = int(datetime.now(UTC).strftime("%Y%m%d"))
        if self.backend is None:
            update["backend"] = self.resolved_backend()
        return self.model_copy(update=update) if update else self

    def key(self) -> str:
        """Identity of the generated content: what must match for a rerun to reuse finished stages."""
        not_content = {"concurrency", "count", "min_good_share"}  # how many, how fast, how the run is judged
        fields = self.model_dump(exclude=not_content) | {"prompt_version": prompt_version()}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class RunResources:
    """What tasks of one run need in this process."""

    generator: Generator
    runtime: Runtime
    log: AttemptLog
    max_attempts: int


_RESOURCES: dict[tuple[str, str], RunResources] = {}
_LOCK = threading.Lock()


def configured_backend(settings: Settings) -> str:
    """`openai` when a model endpoint is configured (WORLDSMITH_LLM_BASE_URL, or a key for the OpenAI API:
    WORLDSMITH_LLM_API_KEY or _API_KEY_BLOCK), `procedural` otherwise."""
    return "openai" if settings.llm_configured() else "procedural"


def make_generator(params: GenerateParameters) -> Generator:
    """The run's generator: its backend's, wrapped by a recorder when `params.record` names a directory."""
    backend = params.resolved_backend()
    directory = replay_directory(backend)
    generator: Generator
    if directory is not None:
        generator = ReplayGenerator(directory)
    elif backend == "openai":
        from worldsmith.llm.openai_backend import OpenAIGenerator

        generator = OpenAIGenerator.from_settings(model=params.model)
    else:
        from worldsmith.llm.procedural.backend import ProceduralGenerator

        generator = ProceduralGenerator(seed=params.seed, fault_rate=params.fault_rate)
    return RecordingGenerator(generator, Path(params.record)) if params.record else generator


#: The most sandbox workers a run sizes its pool to (about 25 MB each, idle).
MAX_RUN_WORKERS = 64


def sandbox_workers(params: GenerateParameters) -> int:
    """Sandbox workers for a run: one per environment in flight (workers are bound to one environment,
    so fewer would make the worlds of one run retire and restart each other's workers at every probe),
    and never fewer than configured."""
    return max(get_settings().worker_count(), min(params.concurrency, MAX_RUN_WORKERS))


def resources(params: GenerateParameters, run_id: str) -> RunResources:
    """This process's resources for the run, built on first use by whichever task needs them."""
    key = (params.key(), run_id)
    with _LOCK:
        if key not in _RESOURCES:
            runtime = Runtime(workers=sandbox_workers(params))
            atexit.register(runtime.close)
            _RESOURCES[key] = RunResources(
                make_generator(params), runtime, AttemptLog(run_id, open_catalog()), params.max_attempts
            )
        return _RESOURCES[key]


def release(params: GenerateParameters, run_id: str) -> None:
    with _LOCK:
        found = _RESOURCES.pop((params.key(), run_id), None)
    if found is not None:
        found.runtime.close()


def embedder(generator: Generator) -> Embed | None:
    """Embeddings for scenario dedup when an embeddings model is configured (openai backend), else None (TF-IDF)."""
    model = getattr(generator, "embeddings_model", get_settings().llm_embeddings_model)  # a replay: the recorded one
    if model and hasattr(generator, "embed"):
        return lambda texts: generator.embed(texts, model)
    return None
