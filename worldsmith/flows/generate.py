"""The `generate` flow: seed scenarios -> new scenarios -> one environment each, its stages run as
Prefect tasks (worldsmith/tasks/generation.py: retries for transient faults, caching for resume) each
with its own repair loop -> published.

Fan-out: a thread pool (`concurrency` environments at once), or a Dask cluster when configured
(`WORLDSMITH_TASK_RUNNER=dask`). Each process that runs tasks builds its own generator, sandbox
runtime and attempt log from the run's parameters (worldsmith/tasks/generation_run.py); one world's
stages and publishing are in worldsmith/flows/world_builds.py, the run's artifacts in artifacts.py.

Resumable: stage tasks are cached by their inputs (persisted under WORLDSMITH_HOME), so running
the flow again after a crash or kill reuses every finished stage, and publishing is idempotent, so
no environment is duplicated. A world whose artifacts a good version of another env already holds
is not published again (reported as `duplicate`).

One world's failure never fails the run: a stage out of attempts or an unexpected exception fails
that world only (recorded, published as failed with its partial artifacts and reason). Only a fatal
(run-wide) fault, or the scenario stage failing (before any world exists: `ScenarioStageFailed`), stops
the run, Failed with one line. After the summary artifacts, a run whose share of good worlds is
below `min_good_share` ends Failed (raising `TooFewGoodWorlds` in the caller), so Prefect can alert.
"""

from __future__ import annotations

import importlib
import math
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, cast

from prefect import State, flow, get_run_logger, task
from prefect.states import Cancelled, Failed
from prefect.task_runners import ThreadPoolTaskRunner

from worldsmith.errors import WorldsmithError
from worldsmith.flows.artifacts import as_completed_with_progress, summarise_generation
from worldsmith.flows.interruption import STOP, Interrupted, run_stoppable, stopped_by
from worldsmith.flows.records import current_flow_run_id, failed_on_error, mark_crashed
from worldsmith.flows.run_names import named_after
from worldsmith.flows.world_builds import WorldProgress, build_world, log_scenario_repairs, publish_outcome
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import Scenario
from worldsmith.models.catalog import RunRecord
from worldsmith.models.generation import WorldOutcome
from worldsmith.models.runs import RunKind, RunStatus
from worldsmith.runtime.answers import one_line
from worldsmith.settings import get_settings
from worldsmith.stages.order import Stage
from worldsmith.stages.scenario import load_scenarios
from worldsmith.stages.work import EnvWork
from worldsmith.storage.run_records import finish_run, open_record
from worldsmith.tasks.generation import new_scenarios, resumable, transient_only
from worldsmith.tasks.generation_run import GENERATION_RUNS, release, resources
from worldsmith.tasks.parameters import GenerateParameters
from worldsmith.tasks.run_resources import RunResources

#: The heavy libraries the stages import, the scenario stage's first.
WARM_IMPORTS = ("sklearn.feature_extraction.text", "great_expectations")


def warm_imports(wait: bool) -> threading.Thread:
    """Import the heavy libraries the stages use (`WARM_IMPORTS`) in a thread, before the stage threads
    start: threads that import one cycle of modules at once can deadlock (importlib raises
    _DeadlockError in one of them). Against a model endpoint the imports overlap the scenario call (its
    stage imports inside a function, holding no module lock); a backend that answers at once waits for
    them first (`wait`). Join the thread before the worlds' stages start."""

    def imports() -> None:
        for module in WARM_IMPORTS:
            importlib.import_module(module)

    warming = threading.Thread(target=imports, name="warm-imports", daemon=True)
    warming.start()
    if wait:
        warming.join()
    return warming


class TooFewGoodWorlds(WorldsmithError):
    """A run whose share of good worlds is below its `min_good_share`: the flow ends Failed with this
    one-line message; `results` are the run's world outcomes."""

    def __init__(self, message: str, results: list[WorldOutcome] | None = None):
        super().__init__(message)
        self.results = results or []

    def __reduce__(self) -> tuple[type, tuple[str, list[WorldOutcome]]]:
        return type(self), (str(self), self.results)  # the results survive a trip through a result store


class ScenarioStageFailed(WorldsmithError):
    """The scenario stage failed after its attempts (answers that are no scenarios, an endpoint failing
    through its retries): no world exists yet to fail alone, so the run ends Failed with this one line
    (run-wide, like a fatal fault)."""

    fatal = True


def expand_or_fail(params: GenerateParameters, run_id: str, seeds: list[Scenario]) -> list[Scenario]:
    """The run's new scenarios (the `scenario` stage task); a failure of the stage that is not a fatal
    fault as `ScenarioStageFailed`, its one line naming the stage and why."""
    try:
        return resumable(new_scenarios)(params, run_id, seeds)
    except Exception as exc:
        if getattr(exc, "fatal", False):
            raise
        raise ScenarioStageFailed(one_line(f"the scenario stage failed, no world was built: {exc}")) from exc


@task(name="build-environment", retries=2, retry_condition_fn=transient_only, task_run_name="build-{scenario.name}")
def build_and_publish(params: GenerateParameters, run_id: str, scenario: Scenario) -> WorldOutcome | State:
    """One environment: its stages built (`build_world`), then published: good, failed with its reason
    (with the partial artifacts of a world that stopped at a stage), or not again as a `duplicate` of a
    good version of another env.

    Never raises for this world's own failure: an unexpected exception is recorded as a failed attempt
    of its stage and the world published as failed. Raises a fatal fault, and a transient one while
    Prefect has retries left. Once the run is asked to stop (worldsmith/flows/interruption.py) it ends
    Cancelled before its next stage, recording nothing."""
    try:
        return _build_and_publish(params, run_id, scenario)
    except Interrupted as exc:
        return Cancelled(message=str(exc))


def _build_and_publish(params: GenerateParameters, run_id: str, scenario: Scenario) -> WorldOutcome:
    STOP.check()
    r = resources(params, run_id)
    progress = WorldProgress(EnvWork.start(scenario, params.resolved_seed()), log=r.log, logger=get_run_logger())
    outcome = WorldOutcome(  # failed until published otherwise
        env_id=progress.work.env_id,
        scenario=scenario.name,
        status="failed",
        built_by=f"{socket.gethostname()}:{os.getpid()}",
    )
    result = build_world(params, run_id, progress, r)
    return publish_outcome(outcome, result, progress.work, r)


#: Environments finished so far, by the parameters' key of each run started by `run_generate` in this
#: process (which reports them to its caller as they finish). Plain data only: no callback of the caller.
FINISHED: RunResources[list[WorldOutcome]] = RunResources()


@flow(
    name="generate",
    log_prints=True,
    on_crashed=[mark_crashed],  # its run record reads `crashed` when a worker sees its process die
    flow_run_name=named_after(
        "generate",
        "params",
        GenerateParameters,
        lambda p: f"{p.count}x-{p.resolved_backend().partition(':')[0]}",
    ),
)
def generate(params: GenerateParameters = GenerateParameters()) -> list[WorldOutcome] | State:
    """Generate `params.count` environments and publish them. Ends Failed (raising the fault, or
    `TooFewGoodWorlds`, in the caller, with no traceback logged) on a fatal fault, or after writing
    the summary when the share of good worlds is below `params.min_good_share`. Logs a line per
    stage attempt that failed (world, stage, error class) as its world goes on. Ends Cancelled, its
    finished worlds published and no summary written, when the run is asked to stop (`STOP`). The
    run's `RunRecord` (its id the stage attempts' `run_id`) holds its status: completed, failed (with
    its error, and `failed_stage` for a run that died in the scenario stage) or cancelled.

    Args:
        params: The run: how many environments, the backend and model, seeds, attempts, the share of good worlds required.
    """
    params = params.dated()
    run_id = current_flow_run_id() or params.key()
    what = f"{params.count} worlds ({params.resolved_backend()})"
    open_record(RunKind.GENERATE, run_id, what, current_flow_run_id())
    with failed_on_error(RunRecord, run_id):
        ended = _generate(params, run_id)
    status, metrics = run_end(ended)
    finish_run(RunRecord, run_id, status, metrics)
    return ended


def run_end(ended: list[WorldOutcome] | State) -> tuple[RunStatus, JsonObject]:
    """The status and metrics a generation run's record ends with, from what the flow returns: its
    error (the state's message) and, for a run that died in the scenario stage, `failed_stage`."""
    if not isinstance(ended, State):
        return RunStatus.COMPLETED, {}
    if ended.is_cancelled():
        return RunStatus.CANCELLED, {"error": ended.message or "cancelled"}
    metrics: JsonObject = {"error": ended.message or ended.name}
    if isinstance(ended.data, ScenarioStageFailed):
        metrics["failed_stage"] = Stage.SCENARIO.value
    return RunStatus.FAILED, metrics


def _generate(params: GenerateParameters, run_id: str) -> list[WorldOutcome] | State:
    finished = FINISHED.find(params.key())
    seeds = load_scenarios(params.scenario_file)
    warming = warm_imports(wait=params.backend != "openai")
    try:
        scenarios = expand_or_fail(params, run_id, seeds)
        warming.join()
        log_scenario_repairs(get_run_logger(), run_id)
        futures = [build_and_publish.submit(params, run_id, scenario) for scenario in scenarios if not STOP.requested]
        kept: list[WorldOutcome] = []
        for future in as_completed_with_progress(futures, "generation-progress", f"{len(futures)} environments"):
            if future.state.is_cancelled():
                continue  # stopped before it finished: nothing recorded, a rerun builds it
            outcome = cast(
                WorldOutcome, future.result()
            )  # a world's own failure is in its outcome; a fatal fault raises here
            kept.append(outcome)
            if finished is not None:
                finished.append(outcome)
        if STOP.requested:
            return Cancelled(message=f"{stopped_by(STOP.signum)}: {len(kept)} worlds kept")
        results = [cast(WorldOutcome, future.result()) for future in futures]  # none cancelled: no stop
    except Exception as exc:
        if STOP.requested:  # what a stage stopped mid-way raised: the run was asked to stop
            return Cancelled(message=stopped_by(STOP.signum))
        if not getattr(exc, "fatal", False):
            raise
        return Failed(message=one_line(str(exc)), data=exc)  # run-wide: the fault's one line, no traceback
    finally:
        release(params, run_id)
    summarise_generation(params, run_id, results)
    failed = too_few_good(params, results)
    return results if failed is None else failed


def too_few_good(params: GenerateParameters, results: list[WorldOutcome]) -> State | None:
    """The Failed state of a run whose share of good worlds (good or duplicate) is below
    `params.min_good_share`, carrying `TooFewGoodWorlds`; None when the share is enough."""
    good = sum(1 for r in results if r.good)
    share = good / len(results) if results else 0.0
    if share >= params.min_good_share:
        return None
    message = f"{good} of {len(results)} worlds good ({share:.0%}), below min_good_share {params.min_good_share:.0%}"
    return Failed(message=message, data=TooFewGoodWorlds(message, results))


def task_runner(concurrency: int) -> Any:
    """Threads in this process (default), or a Dask cluster when `WORLDSMITH_TASK_RUNNER=dask`:
    the one at `WORLDSMITH_DASK_ADDRESS`, else a local cluster of `WORLDSMITH_DASK_WORKERS` processes."""
    settings = get_settings()
    if settings.task_runner != "dask":
        return ThreadPoolTaskRunner(max_workers=concurrency)
    from prefect_dask.task_runners import DaskTaskRunner

    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    threads = max(1, math.ceil(concurrency / settings.dask_workers))
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": settings.dask_workers,
            "threads_per_worker": threads,
            "processes": True,
            "dashboard_address": None,
        }
    )


def run_generate(
    params: GenerateParameters, on_progress: Callable[[WorldOutcome], None] | None = None
) -> list[WorldOutcome]:
    """Run the flow in this process (against the configured Prefect API or an ephemeral one). With
    `on_progress` (the CLI), the flow runs in a thread and this (main) thread turns SIGINT and SIGTERM
    into a stop: the flow run ends Cancelled, its finished worlds kept, and `Interrupted` (naming them)
    is raised here; a second signal closes the run's sandboxes at once, a third exits at once."""
    params = params.dated()

    def worlds() -> list[WorldOutcome]:
        # a run that ends Failed raises here: Prefect resolves the state the flow returns to its result
        return cast("list[WorldOutcome]", generate.with_options(task_runner=task_runner(params.concurrency))(params))

    if on_progress is None:
        return worlds()
    with FINISHED.holding(params.key(), []) as finished:
        reported = 0

        def report() -> None:
            nonlocal reported
            while reported < len(finished):
                on_progress(finished[reported])
                reported += 1

        def stopped(signum: int) -> Interrupted:
            kept = [outcome.ref or outcome.env_id for outcome in finished]
            return Interrupted(f"{len(kept)} of {params.count} worlds kept", signum, kept)

        return run_stoppable(worlds, stopped, on_force=GENERATION_RUNS.release_all, poll=report)
