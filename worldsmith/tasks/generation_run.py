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
from typing import Literal

from pydantic import BaseModel, Field

from worldsmith.llm.backend import Generator
from worldsmith.llm.prompts import prompt_version
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.scenario import Embed
from worldsmith.storage.catalog import open_catalog


class GenerateParameters(BaseModel):
    """Parameters of a generation run (the `generate` flow and `worldsmith generate`)."""

    count: int = Field(10, ge=1, le=10000, description="Environments to generate.")
    scenario_file: str | None = Field(None, description="Seed scenarios (JSON lines: name, description, categories).")
    backend: Literal["procedural", "openai"] = "procedural"
    model: str | None = Field(None, description="Model of the openai backend (default WORLDSMITH_LLM_MODEL).")
    concurrency: int = Field(4, ge=1, le=256, description="Environments built at once.")
    max_attempts: int = Field(5, ge=1, le=20, description="Attempts of each stage's repair loop.")
    seed: int | None = Field(
        0, description="Seed of the generator; unset: the UTC date (YYYYMMDD), so each night makes new environments."
    )
    fault_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="Procedural backend: share of first attempts that fail like LLM output."
    )

    def dated(self) -> GenerateParameters:
        """These parameters with an unset seed replaced by today's UTC date (what a nightly run uses)."""
        if self.seed is not None:
            return self
        return self.model_copy(update={"seed": int(datetime.now(UTC).strftime("%Y%m%d"))})

    def key(self) -> str:
        """Identity of the generated content: what must match for a rerun to reuse finished stages."""
        fields = self.model_dump(exclude={"concurrency", "count"}) | {"prompt_version": prompt_version()}
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


def make_generator(params: GenerateParameters) -> Generator:
    if params.backend == "openai":
        from worldsmith.llm.openai_backend import OpenAIGenerator

        return OpenAIGenerator.from_settings(model=params.model)
    from worldsmith.llm.procedural.backend import ProceduralGenerator

    return ProceduralGenerator(seed=params.seed, fault_rate=params.fault_rate)


def resources(params: GenerateParameters, run_id: str) -> RunResources:
    """This process's resources for the run, built on first use by whichever task needs them."""
    key = (params.key(), run_id)
    with _LOCK:
        if key not in _RESOURCES:
            runtime = Runtime()
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
    model = get_settings().llm_embeddings_model
    if model and hasattr(generator, "embed"):
        return lambda texts: generator.embed(texts, model)
    return None
