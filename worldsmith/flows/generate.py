"""The `generate` flow: seed scenarios -> new scenarios -> one environment each (stages as
Prefect tasks with retries for transient faults and their own repair loops) -> published.

Resumable: stage tasks are cached by their inputs (persisted under WORLDSMITH_HOME), so running
the flow again after a crash or kill reuses every finished stage, and publishing is idempotent, so
no environment is duplicated.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.cache_policies import INPUTS
from prefect.context import get_run_context
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from worldsmith.llm.backend import Generator
from worldsmith.llm.errors import TransientFault
from worldsmith.llm.prompts import prompt_version
from worldsmith.models.bundle import Scenario
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import open_store
from worldsmith.storage.publish import publish
from worldsmith.tasks.attempts import AttemptLog, stage_summary
from worldsmith.tasks.pipeline import build_environment, run_stage
from worldsmith.tasks.scenario import expand_scenarios
from worldsmith.tasks.validate import Validation, run_validate_stage
from worldsmith.tasks.work import EnvWork

#: The 100 seed scenarios shipped with worldsmith (real products; the AWM paper's seed set).
DEFAULT_SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "seed_scenarios.jsonl"


class GenerateParameters(BaseModel):
    """Parameters of a generation run (the `generate` flow and `worldsmith generate`)."""

    count: int = Field(10, ge=1, le=10000, description="Environments to generate.")
    scenario_file: str | None = Field(None, description="Seed scenarios (JSON lines: name, description, categories).")
    backend: Literal["procedural", "openai"] = "procedural"
    model: str | None = Field(None, description="Model of the openai backend (default WORLDSMITH_LLM_MODEL).")
    concurrency: int = Field(4, ge=1, le=256, description="Environments built at once.")
    max_attempts: int = Field(5, ge=1, le=20, description="Attempts of each stage's repair loop.")
    seed: int = 0
    fault_rate: float = Field(0.0, ge=0.0, le=1.0, description="Procedural backend: share of first attempts that fail like LLM output.")

    def key(self) -> str:
        """Identity of the generated content: what must match for a rerun to reuse finished stages."""
        fields = self.model_dump(exclude={"concurrency", "count"}) | {"prompt_version": prompt_version()}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class RunResources:
    generator: Generator
    runtime: Runtime
    log: AttemptLog
    max_attempts: int
    on_progress: Callable[[dict[str, Any]], None] | None = None


_RESOURCES: dict[str, RunResources] = {}
_PROGRESS_HOOKS: dict[str, Callable[[dict[str, Any]], None]] = {}
_LOCK = threading.Lock()


def _resources(key: str) -> RunResources:
    return _RESOURCES[key]


def make_generator(params: GenerateParameters) -> Generator:
    if params.backend == "openai":
        from worldsmith.llm.openai_backend import OpenAIGenerator

        return OpenAIGenerator.from_settings(model=params.model)
    from worldsmith.llm.procedural.backend import ProceduralGenerator

    return ProceduralGenerator(seed=params.seed, fault_rate=params.fault_rate)


def load_scenarios(path: str | Path | None) -> list[Scenario]:
    file = Path(path) if path else DEFAULT_SCENARIOS
    if not file.is_file():
        raise FileNotFoundError(f"scenario file {file} not found")
    scenarios = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if line.strip():
            try:
                scenarios.append(Scenario.model_validate_json(line))
            except ValueError as exc:
                raise ValueError(f"{file}:{number}: not a scenario ({exc})") from None
    return scenarios


def _warm_imports() -> None:
    import great_expectations  # noqa: F401
    import sklearn.feature_extraction.text  # noqa: F401


def transient_only(task_: Any, task_run: Any, state: Any) -> bool:
    """Prefect retries a stage only for transient faults; semantic ones are the repair loop's job."""
    try:
        state.result()
    except TransientFault:
        return True
    except Exception:  # noqa: BLE001
        return False
    return False


def _results_storage() -> Path:
    """Where finished stages are persisted (so a rerun can reuse them)."""
    path = (get_settings().home / "prefect-results").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def embedder(generator: Generator):
    """Embeddings for scenario dedup when an embeddings model is configured (openai backend), else None (TF-IDF)."""
    model = get_settings().llm_embeddings_model
    if model and hasattr(generator, "embed"):
        return lambda texts: generator.embed(texts, model)
    return None


@task(name="scenario", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=transient_only, cache_policy=INPUTS, persist_result=True)
def scenario_stage(key: str, seeds: list[Scenario], count: int) -> list[Scenario]:
    resources = _resources(key)
    return expand_scenarios(seeds, count, resources.generator, resources.log, max_attempts=resources.max_attempts,
                            embed=embedder(resources.generator))


def _stage_task(stage: str):
    @task(name=stage, retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=transient_only, cache_policy=INPUTS, persist_result=True)
    def stage_task(key: str, work: EnvWork, feedback: str | None) -> EnvWork:
        r = _resources(key)
        return run_stage(stage, work, r.generator, r.runtime, r.log, r.max_attempts, feedback)

    return stage_task


STAGE_TASKS = {stage: _stage_task(stage) for stage in ("tasks", "database", "tools", "verifiers")}


@task(name="validate", cache_policy=INPUTS, persist_result=True)
def validate_stage(key: str, work: EnvWork, round_number: int) -> Validation:
    r = _resources(key)
    return run_validate_stage(work, r.generator, r.runtime, r.log, round_number)


@task(name="build-environment", retries=2, retry_condition_fn=transient_only)
def build_environment_task(key: str, scenario: Scenario, seed: int) -> dict[str, Any]:
    """One environment through every stage, then published (good, or failed with its reason)."""
    r = _resources(key)
    storage = _results_storage()
    result = build_environment(
        scenario, seed, r.generator, r.runtime, r.log, r.max_attempts,
        stage_runner=lambda stage, work, feedback: STAGE_TASKS[stage].with_options(result_storage=storage)(key, work, feedback),
        validator=lambda work, round_number: validate_stage.with_options(result_storage=storage)(key, work, round_number),
    )
    summary: dict[str, Any] = {"env_id": result.env_id, "scenario": scenario.name, "status": "failed", "ref": None, "reason": result.reason}
    if result.bundle is not None:
        settings = get_settings()
        store = open_store(settings.resolved_store_url(), endpoint_url=settings.s3_endpoint_url)
        published = publish(result.bundle, store, open_catalog(), result.checks)
        summary.update(status=published.version.status, ref=published.version.ref, reason=published.version.failure_reason or result.reason)
    if r.on_progress:
        r.on_progress(summary)
    return summary


@flow(name="generate", log_prints=True)
def generate(params: GenerateParameters = GenerateParameters()) -> list[dict[str, Any]]:
    """Generate `params.count` environments and publish them."""
    logger = get_run_logger()
    context = get_run_context()
    run_id = str(context.flow_run.id) if context and getattr(context, "flow_run", None) else params.key()
    key = params.key()
    storage = _results_storage()
    seeds = load_scenarios(params.scenario_file)
    # Import the quality gate's libraries while the first LLM calls are in flight.
    threading.Thread(target=_warm_imports, daemon=True, name="warm-imports").start()
    with Runtime() as runtime:
        resources = RunResources(make_generator(params), runtime, AttemptLog(run_id, open_catalog()), params.max_attempts,
                                 _PROGRESS_HOOKS.get(key))
        with _LOCK:
            _RESOURCES[key] = resources
        try:
            scenarios = scenario_stage.with_options(result_storage=storage)(key, seeds, params.count)
            progress = create_progress_artifact(0.0, key="generation-progress", description=f"{len(scenarios)} environments")
            futures = [build_environment_task.submit(key, scenario, params.seed) for scenario in scenarios]
            results = []
            for done, future in enumerate(futures, start=1):
                results.append(future.result())
                update_progress_artifact(progress, 100.0 * done / len(futures))
        finally:
            with _LOCK:
                _RESOURCES.pop(key, None)
    summary = stage_summary(resources.log.attempts)
    create_table_artifact(summary, key="generation-stages", description="Per stage: first-attempt success, repair and failure rates, attempts, tokens, cost")
    create_table_artifact(results, key="generation-environments", description="Environments of this run")
    good = sum(1 for r in results if r["status"] == "good")
    create_markdown_artifact(f"# Generation run\n\n{good} of {len(results)} environments published as good "
                             f"(backend {params.backend}, prompt version {prompt_version()}).", key="generation-summary")
    logger.info("%d of %d environments published as good", good, len(results))
    return results


def run_generate(params: GenerateParameters, on_progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the flow in this process (against the configured Prefect API or an ephemeral one)."""
    key = params.key()
    if on_progress is not None:
        _PROGRESS_HOOKS[key] = on_progress
    try:
        return generate.with_options(task_runner=ThreadPoolTaskRunner(max_workers=params.concurrency))(params)
    finally:
        _PROGRESS_HOOKS.pop(key, None)
