"""The `evaluate` flow: a policy over an environment set, k samples per task, concurrently.

set members (one split or all) -> bundles fetched from the object store -> one Prefect task per
(env, task) running its k episodes -> scores overall and per env (pass@1, pass@k, mean reward and
turns, env_error and format_error rates) -> trajectories written (JSON lines + Parquet, and the
JSON lines into the object store) -> an evaluation run in the catalog and table and markdown
artifacts in Prefect. Each process running its tasks shares one policy, runtime and judge per run
(worldsmith/tasks/evaluation_run.py).
"""

from __future__ import annotations

import signal
import uuid
from collections import defaultdict
from typing import Any, cast

from prefect import State, flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, wait
from prefect.states import Cancelled
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from pydantic import BaseModel

from worldsmith.agent.loop import EpisodeConfig, Trajectory, run_episode
from worldsmith.agent.trajectories import scores, write_jsonl, write_parquet
from worldsmith.bundle.loader import load_bundle
from worldsmith.flows.artifacts import summarise_evaluation
from worldsmith.flows.interruption import STOP, Interrupted, run_stoppable
from worldsmith.flows.records import failed_on_error, mark_crashed, start_evaluation_run
from worldsmith.flows.run_names import named_after, short_policy
from worldsmith.models.catalog import EvaluationRun
from worldsmith.models.evaluation import EvaluationReport, EvaluationScores, TrajectoryFiles
from worldsmith.models.runs import RunStatus
from worldsmith.settings import get_settings
from worldsmith.storage.bundle_cache import cached_bundle
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import CatalogError
from worldsmith.storage.run_records import finish_run
from worldsmith.storage.sets import get_set, members_of
from worldsmith.tasks import evaluation_run
from worldsmith.tasks.parameters import EvaluateParameters


class Job(BaseModel):
    ref: str
    env_id: str
    path: str
    task_id: str


@task(name="plan-episodes", retries=2, retry_delay_seconds=2, task_run_name="plan-{params.set_name}-{params.split}")
def plan(params: EvaluateParameters) -> list[Job]:
    """One job per (member env, task) of the set's chosen split."""
    with open_catalog().session() as session:
        members = [
            (v.ref, v.env_id, v.content_key)
            for v, split in members_of(session, get_set(session, params.set_name))
            if params.split == "all" or split == params.split
        ]
    if not members:
        raise CatalogError(f"set {params.set_name!r} has no members in split {params.split!r}")
    jobs = []
    for ref, env_id, content_key in members:
        path = cached_bundle(ref, content_key)
        jobs += [Job(ref=ref, env_id=env_id, path=str(path), task_id=t.id) for t in load_bundle(path).tasks]
    return jobs


@task(name="evaluate-task", cache_policy=NO_CACHE, task_run_name="{job.env_id}/{job.task_id}")
def evaluate_task(params: EvaluateParameters, run_key: str, job: Job) -> list[Trajectory]:
    """The k episodes of one task (fresh policy each, seeds seed..seed+k-1). Once the run is asked to stop
    (worldsmith/flows/interruption.py) it raises `Interrupted` before its next episode."""
    STOP.check()
    resources = evaluation_run.resources(params, run_key)
    bundle = resources.bundle(job.path)
    task_spec = bundle.task(job.task_id)
    out = []
    for sample in range(params.samples):
        STOP.check()
        config = EpisodeConfig(
            max_turns=params.max_turns,
            window=params.window,
            seed=params.seed + sample,
            side_effects=params.side_effects,
        )
        trajectory = run_episode(
            resources.runtime, bundle, task_spec, resources.policy(), config, resources.judge, resources.world
        )
        out.append(trajectory)
    return out


def report(trajectories: list[Trajectory], k: int) -> tuple[EvaluationScores, dict[str, EvaluationScores]]:
    """Scores overall and per env (sorted by env id)."""
    by_env: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_env[t.env_id].append(t)
    return scores(trajectories, k), {env: scores(ts, k) for env, ts in sorted(by_env.items())}


def run_episodes(params: EvaluateParameters, run_key: str, jobs: list[Job]) -> list[Trajectory]:
    """Every job's episodes, one task per job, `params.concurrency` at once. When one raises, the tasks
    still running finish before it propagates (and the run's resources are released after them)."""
    futures = [evaluate_task.submit(params, run_key, job) for job in jobs]
    try:
        return [t for future in futures for t in future.result()]
    except BaseException:
        wait(futures)
        raise


def store_trajectories(run_id: int, trajectories: list[Trajectory]) -> TrajectoryFiles:
    """The run's trajectories as JSON lines and Parquet under WORLDSMITH_HOME/evaluations/<run id>, the
    JSON lines also in the object store."""
    folder = get_settings().home / "evaluations" / str(run_id)
    jsonl = write_jsonl(trajectories, folder / "trajectories.jsonl")
    parquet = write_parquet(trajectories, folder / "trajectories.parquet")
    digest = configured_store().put_bytes(jsonl.read_bytes())
    return TrajectoryFiles(jsonl=str(jsonl), parquet=str(parquet), digest=digest)


@flow(
    name="evaluate",
    log_prints=True,
    on_crashed=[mark_crashed],
    flow_run_name=named_after(
        "evaluate", "params", EvaluateParameters, lambda p: f"{p.set_name}-{short_policy(p.policy)}"
    ),
)
def evaluate(params: EvaluateParameters) -> EvaluationReport | State:
    """Evaluate `params.policy` on set `params.set_name`; returns the report with the run id. Asked to stop
    (`STOP`), its episodes in flight end, the run is recorded `cancelled` and the flow run ends Cancelled.

    Args:
        params: The evaluation: environment set and split, policy, samples per task, turns, judge.
    """
    run_id = start_evaluation_run(params)
    run_key = f"evaluation-{run_id}-{uuid.uuid4().hex[:12]}"  # run ids repeat across catalogs: a unique key
    try:
        with failed_on_error(EvaluationRun, run_id):  # cancelled when stopped
            trajectories = run_episodes(params, run_key, plan(params))
    except Interrupted as exc:
        return Cancelled(message=f"{exc}: evaluation run {run_id} cancelled")
    finally:
        simulation = evaluation_run.release(run_key)  # this process's resources of the run
    overall, per_env = report(trajectories, params.samples)
    result = EvaluationReport(
        run_id=run_id,
        overall=overall,
        per_env=per_env,
        world=f"simulated:{params.simulate.world_model}" if params.simulate else "real",
        simulation=simulation,
        trajectories=store_trajectories(run_id, trajectories),
    )
    finish_run(EvaluationRun, run_id, RunStatus.COMPLETED, result.stored())
    summarise_evaluation(params, result)
    return result


def run_evaluate(params: EvaluateParameters, stop_on_signals: bool = False) -> EvaluationReport:
    """Run the flow in this process with `concurrency` tasks at once. With `stop_on_signals` (the CLI), the
    flow runs in a thread and SIGINT or SIGTERM stop it (`run_stoppable`): its episodes in flight end, the
    run is recorded cancelled, the flow run ends Cancelled, and `Interrupted` is raised here."""
    # as Flow types its own runner: TaskRunner is invariant in its futures, a thread pool's are PrefectFutures
    runner = cast("TaskRunner[PrefectFuture[Any]]", ThreadPoolTaskRunner(max_workers=params.concurrency))

    def run() -> EvaluationReport:
        # a run that ends Cancelled raises here: Prefect resolves the state the flow returns to its result
        return cast(EvaluationReport, evaluate.with_options(task_runner=runner)(params))

    if not stop_on_signals:
        return run()

    def stopped(signum: int) -> Interrupted:
        name = signal.Signals(signum).name
        return Interrupted(
            f"interrupted by {name}: the evaluation run was cancelled (recorded as such), no trajectories kept; "
            "run the command again to evaluate",
            signum,
        )

    return run_stoppable(run, stopped)
