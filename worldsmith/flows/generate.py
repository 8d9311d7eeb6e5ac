"""The `generate` flow: seed scenarios -> new scenarios -> one environment each (stages as
Prefect tasks with retries for transient faults and their own repair loops) -> published.

Fan-out: a thread pool (`concurrency` environments at once), or a Dask cluster when configured
(`WORLDSMITH_TASK_RUNNER=dask`). Each process that runs tasks builds its own generator, sandbox
runtime and attempt log from the run's parameters, so tasks need nothing but their (serialisable)
arguments.

Resumable: stage tasks are cached by their inputs (persisted under WORLDSMITH_HOME), so running
the flow again after a crash or kill reuses every finished stage, and publishing is idempotent, so
no environment is duplicated.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.cache_policies import INPUTS
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field
from sqlmodel import select

from worldsmith.flows.links import dashboard_link
from worldsmith.flows.records import current_flow_run_id
from worldsmith.llm.backend import Generator
from worldsmith.llm.errors import TransientFault
from worldsmith.llm.prompts import prompt_version
from worldsmith.models.bundle import Scenario
from worldsmith.models.jsonlines import read_models
from worldsmith.models.catalog import StageAttempt
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import publish
from worldsmith.tasks.attempts import AttemptLog, stage_summary
from worldsmith.tasks.pipeline import build_environment, run_stage
from worldsmith.tasks.scenario import expand_scenarios
from worldsmith.tasks.validate import Validation, run_validate_stage
from worldsmith.tasks.work import EnvWork

#: The 100 seed scenarios shipped with worldsmith (real products; the AWM paper's seed set).
DEFAULT_SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "seed_scenarios.jsonl"
CACHED = INPUTS - "run_id"  # a rerun (new run id) reuses what an earlier run finished


class GenerateParameters(BaseModel):
    """Parameters of a generation run (the `generate` flow and `worldsmith generate`)."""

    count: int = Field(10, ge=1, le=10000, description="Environments to generate.")
    scenario_file: str | None = Field(None, description="Seed scenarios (JSON lines: name, description, categories).")
    backend: Literal["procedural", "openai"] = "procedural"
    model: str | None = Field(None, description="Model of the openai backend (default WORLDSMITH_LLM_MODEL).")
    concurrency: int = Field(4, ge=1, le=256, description="Environments built at once.")
    max_attempts: int = Field(5, ge=1, le=20, description="Attempts of each stage's repair loop.")
    seed: int | None = Field(0, description="Seed of the generator; unset: the UTC date (YYYYMMDD), so each night makes new environments.")
    fault_rate: float = Field(0.0, ge=0.0, le=1.0, description="Procedural backend: share of first attempts that fail like LLM output.")

    def dated(self) -> "GenerateParameters":
        """These parameters with an unset seed replaced by today's UTC date (what a nightly run uses)."""
        if self.seed is not None:
            return self
        return self.model_copy(update={"seed": int(datetime.now(timezone.utc).strftime("%Y%m%d"))})

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
            _RESOURCES[key] = RunResources(make_generator(params), runtime, AttemptLog(run_id, open_catalog()), params.max_attempts)
        return _RESOURCES[key]


def release(params: GenerateParameters, run_id: str) -> None:
    with _LOCK:
        found = _RESOURCES.pop((params.key(), run_id), None)
    if found is not None:
        found.runtime.close()


def load_scenarios(path: str | Path | None) -> list[Scenario]:
    file = Path(path) if path else DEFAULT_SCENARIOS
    if not file.is_file():
        raise FileNotFoundError(f"scenario file {file} not found")
    return read_models(Scenario, file, "a scenario")


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


@task(name="scenario", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=transient_only, cache_policy=CACHED, persist_result=True)
def scenario_stage(params: GenerateParameters, run_id: str, seeds: list[Scenario]) -> list[Scenario]:
    r = resources(params, run_id)
    return expand_scenarios(seeds, params.count, r.generator, r.log, max_attempts=r.max_attempts, embed=embedder(r.generator))


def _stage_task(stage: str):
    @task(name=stage, retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=transient_only, cache_policy=CACHED, persist_result=True)
    def stage_task(params: GenerateParameters, run_id: str, work: EnvWork, feedback: str | None) -> EnvWork:
        r = resources(params, run_id)
        return run_stage(stage, work, r.generator, r.runtime, r.log, r.max_attempts, feedback)

    return stage_task


STAGE_TASKS = {stage: _stage_task(stage) for stage in ("tasks", "database", "tools", "verifiers")}


@task(name="validate", cache_policy=CACHED, persist_result=True)
def validate_stage(params: GenerateParameters, run_id: str, work: EnvWork, round_number: int) -> Validation:
    r = resources(params, run_id)
    return run_validate_stage(work, r.generator, r.runtime, r.log, round_number)


def build_environment_run(params: GenerateParameters, run_id: str, scenario: Scenario) -> dict[str, Any]:
    """One environment through every stage, then published (good, or failed with its reason)."""
    r = resources(params, run_id)
    storage = _results_storage()
    result = build_environment(
        scenario, params.seed, r.generator, r.runtime, r.log, r.max_attempts,
        stage_runner=lambda stage, work, feedback: STAGE_TASKS[stage].with_options(result_storage=storage)(params, run_id, work, feedback),
        validator=lambda work, round_number: validate_stage.with_options(result_storage=storage)(params, run_id, work, round_number),
    )
    summary: dict[str, Any] = {"env_id": result.env_id, "scenario": scenario.name, "status": "failed", "ref": None,
                               "reason": result.reason, "built_by": f"{socket.gethostname()}:{os.getpid()}"}
    if result.bundle is None:  # a stage ran out of attempts: nothing to publish; the failure is on record
        r.log.record(env_id=result.env_id, stage="environment", attempt=1, outcome="failure",
                     error_class=f"{result.failed_stage}_exhausted", error_text=result.reason)
    else:
        published = publish(result.bundle, configured_store(), open_catalog(), result.checks)
        summary.update(status=published.version.status, ref=published.version.ref, reason=published.version.failure_reason or result.reason)
    return summary


build_environment_task = task(build_environment_run, name="build-environment", retries=2, retry_condition_fn=transient_only)


#: Environments finished so far, per run started by `run_generate` in this process. Plain data
#: only: the flow's module globals may travel to Dask workers, callbacks must not.
_FINISHED: dict[str, list[dict[str, Any]]] = {}


@flow(name="generate", log_prints=True)
def generate(params: GenerateParameters = GenerateParameters()) -> list[dict[str, Any]]:
    """Generate `params.count` environments and publish them."""
    params = params.dated()
    finished = _FINISHED.get(params.key())
    logger = get_run_logger()
    run_id = current_flow_run_id() or params.key()
    storage = _results_storage()
    seeds = load_scenarios(params.scenario_file)
    # Import the heavy libraries the stages use before any stage runs: threads that import one
    # cycle of modules at once can deadlock (importlib raises _DeadlockError in one of them).
    _warm_imports()
    try:
        scenarios = scenario_stage.with_options(result_storage=storage)(params, run_id, seeds)
        progress = create_progress_artifact(0.0, key="generation-progress", description=f"{len(scenarios)} environments")
        futures = [build_environment_task.submit(params, run_id, scenario) for scenario in scenarios]
        for done, future in enumerate(as_completed(futures), start=1):
            update_progress_artifact(progress, 100.0 * done / len(futures))
            if finished is not None:
                finished.append(future.result())
        results = [future.result() for future in futures]
    finally:
        release(params, run_id)
    with open_catalog().session() as session:
        attempts = session.exec(select(StageAttempt).where(StageAttempt.run_id == run_id)).all()
    create_table_artifact(stage_summary(list(attempts)), key="generation-stages",
                          description="Per stage: first-attempt success, repair and failure rates, attempts, tokens, cost")
    create_table_artifact(results, key="generation-environments", description="Environments of this run")
    good = sum(1 for r in results if r["status"] == "good")
    create_markdown_artifact(f"# Generation run\n\n{good} of {len(results)} environments published as good "
                             f"(backend {params.backend}, prompt version {prompt_version()}).\n\n{dashboard_link('generate')}", key="generation-summary")
    logger.info("%d of %d environments published as good", good, len(results))
    return results


def task_runner(concurrency: int) -> Any:
    """Threads in this process (default), or a Dask cluster when `WORLDSMITH_TASK_RUNNER=dask`:
    the one at `WORLDSMITH_DASK_ADDRESS`, else a local cluster of `WORLDSMITH_DASK_WORKERS` processes."""
    settings = get_settings()
    if settings.task_runner != "dask":
        return ThreadPoolTaskRunner(max_workers=concurrency)
    from prefect_dask import DaskTaskRunner

    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    threads = max(1, math.ceil(concurrency / settings.dask_workers))
    return DaskTaskRunner(cluster_kwargs={"n_workers": settings.dask_workers, "threads_per_worker": threads,
                                          "processes": True, "dashboard_address": None})


def run_generate(params: GenerateParameters, on_progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the flow in this process (against the configured Prefect API or an ephemeral one)."""
    params = params.dated()
    if on_progress is None:
        return generate.with_options(task_runner=task_runner(params.concurrency))(params)
    finished: list[dict[str, Any]] = []
    _FINISHED[params.key()] = finished
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["results"] = generate.with_options(task_runner=task_runner(params.concurrency))(params)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="generate-flow")
    worker.start()
    reported = 0
    try:
        while worker.is_alive() or reported < len(finished):
            worker.join(timeout=0.2)
            while reported < len(finished):
                on_progress(finished[reported])
                reported += 1
    finally:
        _FINISHED.pop(params.key(), None)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["results"]
