"""The parameter forms of the `generate`, `evaluate` and `curate` flows (the training flows' forms are in
worldsmith/training/config.py): Prefect renders them as the deployments' forms, and the commands that
start the flows take their fields as options (worldsmith/cli/config_options.py). They load nothing heavy
(no Prefect, no catalog, no model), so the command line builds its options from them when it starts."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from worldsmith.agent.policy_specs import SPEC_HELP, check_spec
from worldsmith.llm.prompts import prompt_version
from worldsmith.llm.recording import REPLAY_PREFIX, Recording, replay_directory
from worldsmith.models.bundle import Scenario
from worldsmith.models.jsonlines import read_models
from worldsmith.models.sets import SetQuery, SplitName
from worldsmith.settings import Settings, get_settings
from worldsmith.worldmodel.config import SimulationConfig

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
    persistent_fault_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Procedural backend: share of worlds whose seed data keeps a broken foreign key through every "
        "repair, so they fail at database:seed (a failure to open on the dashboard).",
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
            what = "is a directory" if Path(scenario_file).expanduser().is_dir() else "not found"
            raise ValueError(f"scenario file {scenario_file} {what}; give a JSON lines file of seed scenarios")
        # JsonLinesError: file, line, field
        if scenario_file and not read_models(Scenario, Path(scenario_file).expanduser(), "a scenario"):
            raise ValueError(f"scenario file {scenario_file} holds no scenarios; give one JSON object per line")
        return scenario_file

    @field_validator("record")
    @classmethod
    def _absolute_record(cls, record: str | None) -> str | None:
        """The recording directory made absolute; refused when it, or a folder above it, is a file."""
        if not record:
            return None
        directory = Path(record).expanduser().resolve()
        if blocking := next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None):
            raise ValueError(f"record: {blocking} is a file, not a directory; name a directory to record into")
        return str(directory)

    @model_validator(mode="after")
    def _record_elsewhere(self) -> GenerateParameters:
        """A replay may be recorded, into another directory: answers added to the one it reads would shift them."""
        if self.record and self.backend and replay_directory(self.backend) == Path(self.record):
            raise ValueError(f"record into another directory than the replayed one ({self.record})")
        return self

    def resolved_backend(self) -> str:
        """The backend a run uses: the one given, else the one configured (see `configured_backend`)."""
        return self.backend or configured_backend(get_settings())

    def resolved_seed(self) -> int:
        """The generator's seed a run uses: the one given, else today's UTC date (YYYYMMDD)."""
        return self.seed if self.seed is not None else int(datetime.now(UTC).strftime("%Y%m%d"))

    def dated(self) -> GenerateParameters:
        """These parameters as a run uses them (what a nightly run needs): an unset seed replaced by
        today's UTC date, an unset backend by the configured one."""
        update: dict[str, object] = {}
        if self.seed is None:
            update["seed"] = self.resolved_seed()
        if self.backend is None:
            update["backend"] = self.resolved_backend()
        return self.model_copy(update=update) if update else self

    def key(self) -> str:
        """Identity of the generated content: what must match for a rerun to reuse finished stages."""
        not_content = {"concurrency", "count", "min_good_share"}  # how many, how fast, how the run is judged
        fields = self.model_dump(exclude=not_content) | {"prompt_version": prompt_version()}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def configured_backend(settings: Settings) -> str:
    """`openai` when a model endpoint is configured (WORLDSMITH_LLM_BASE_URL, or a key for the OpenAI API:
    WORLDSMITH_LLM_API_KEY or _API_KEY_BLOCK), `procedural` otherwise."""
    return "openai" if settings.llm_configured() else "procedural"


class EvaluateParameters(BaseModel):
    """Parameters of an evaluation run (the `evaluate` flow and `worldsmith eval`)."""

    set_name: str = Field(description="Environment set to evaluate on.")
    policy: str = Field("reference", description=SPEC_HELP)
    samples: int = Field(1, ge=1, le=64, description="Episodes per task (k of pass@k).")
    split: SplitName = Field("all", description="Which of the set's splits to evaluate on: all, train or validation.")
    max_turns: int = Field(20, ge=1, le=200, description="Turns (model replies) per episode at most.")
    window: int | None = Field(None, ge=1, description="History window in turns; unset: full history.")
    temperature: float | None = Field(
        None, ge=0, le=2, description="Sampling temperature of model policies; unset: 0 for one sample, 0.7 for more."
    )
    tool_format: Literal["native", "text"] = Field(
        "native",
        description="How model policies call tools: native (the endpoint's tool calls) or text (a JSON block in the reply).",
    )
    meta_tools: bool = Field(False, description="Route tool calls through list_tools / call_tool.")
    judge_model: str | None = Field(
        None, description="LLM judge model on the configured endpoint; unset: the code verifier alone."
    )
    judge_votes: int = Field(1, ge=1, le=15, description="Votes of the LLM judge per episode (majority wins).")
    side_effects: bool = Field(
        True,
        description="Side-effect guard: a complete episode whose end state reaches outside the task's "
        "reference solution's footprint counts as partial (tasks without a solution are not checked).",
    )
    concurrency: int = Field(4, ge=1, le=256, description="Tasks evaluated at once.")
    seed: int = Field(0, description="Seed of the first sample of each task (sample i uses seed + i).")
    simulate: SimulationConfig | None = Field(
        None,
        description="Answer the tool calls with a world model instead of the environments' "
        "code (simulated mode); unset: the real worlds.",
    )

    max_new_tokens: int = Field(512, ge=1, description="Local (hf:) policies: tokens generated per turn at most.")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        return check_spec(value)


class CurateParameters(BaseModel):
    """Parameters of a curation run (the `curate` flow and its deployment)."""

    name: str | None = Field(None, description="Name of the set; unset: curated-YYYY-MM-DD (UTC), one set per day.")
    query: SetQuery = Field(
        default_factory=lambda: SetQuery(require_passed=["expectations", "probes"]),
        description="Which good versions the set takes and how it is split.",
    )

    def set_name(self) -> str:
        return self.name or f"curated-{datetime.now(UTC):%Y-%m-%d}"
