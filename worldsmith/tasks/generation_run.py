"""A generation run as its tasks see it: the run's parameters, and the generator, sandbox runtime
and attempt log that each process running its tasks builds from them on first use (`GENERATION_RUNS`,
a per-run registry: worldsmith/tasks/run_resources.py), so tasks need nothing but their
(serialisable) arguments."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from worldsmith.llm.backend import Generator
from worldsmith.llm.recording import RecordingGenerator, ReplayGenerator, replay_directory
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.scenario import Embed
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.tasks.parameters import GenerateParameters
from worldsmith.tasks.run_resources import RunResources


@dataclass
class GenerationResources:
    """What tasks of one generation run need in this process."""

    generator: Generator
    runtime: Runtime
    log: AttemptLog
    max_attempts: int


#: The generation runs' resources in this process, by (parameters' key, run id); released: runtime closed.
GENERATION_RUNS: RunResources[GenerationResources] = RunResources(close=lambda found: found.runtime.close())


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

        generator = ProceduralGenerator(
            seed=params.resolved_seed(),
            fault_rate=params.fault_rate,
            persistent_fault_rate=params.persistent_fault_rate,
        )
    return RecordingGenerator(generator, Path(params.record)) if params.record else generator


#: The most sandbox workers a run sizes its pool to (about 25 MB each, idle).
MAX_RUN_WORKERS = 64


def sandbox_workers(params: GenerateParameters) -> int:
    """Sandbox workers for a run: one per environment in flight (workers are bound to one environment,
    so fewer would make the worlds of one run retire and restart each other's workers at every probe),
    and never fewer than configured."""
    return max(get_settings().worker_count(), min(params.concurrency, MAX_RUN_WORKERS))


def resources(params: GenerateParameters, run_id: str) -> GenerationResources:
    """This process's resources for the run, built on first use by whichever task needs them."""

    def build() -> GenerationResources:
        generator, log = make_generator(params), AttemptLog(run_id, open_catalog(), configured_store())
        return GenerationResources(generator, Runtime(workers=sandbox_workers(params)), log, params.max_attempts)

    return GENERATION_RUNS.get((params.key(), run_id), build)


def release(params: GenerateParameters, run_id: str) -> None:
    """Close this process's resources of the run (its sandbox runtime), if it built any."""
    GENERATION_RUNS.release((params.key(), run_id))


def embedder(generator: Generator) -> Embed | None:
    """Embeddings for scenario dedup when an embeddings model is configured (openai backend), else None (TF-IDF)."""
    model = getattr(generator, "embeddings_model", get_settings().llm_embeddings_model)  # a replay: the recorded one
    if model and hasattr(generator, "embed"):
        return lambda texts: generator.embed(texts, model)
    return None
