"""The `evaluate` flow: a policy over an environment set, k samples per task, concurrently.

set members (one split or all) -> bundles fetched from the object store -> one Prefect task per
(env, task) running its k episodes -> scores overall and per env (pass@1, pass@k, mean reward and
turns, env_error and format_error rates) -> trajectories written (JSON lines + Parquet, and the
JSON lines into the object store) -> an evaluation run in the catalog and table and markdown
artifacts in Prefect.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel

from worldsmith.agent.loop import EpisodeConfig, Trajectory, run_episode
from worldsmith.agent.trajectories import scores, write_jsonl, write_parquet
from worldsmith.bundle.loader import load_bundle
from worldsmith.flows.links import dashboard_link
from worldsmith.flows.records import current_flow_run_id, mark_crashed
from worldsmith.flows.run_names import named_after, short_policy
from worldsmith.models.catalog import EvaluationRun
from worldsmith.models.evaluation import EvaluationReport, EvaluationScores, TrajectoryFiles
from worldsmith.settings import get_settings
from worldsmith.storage.bundle_cache import cached_bundle
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import CatalogError
from worldsmith.storage.run_records import add_run, finish_run
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
    """The k episodes of one task (fresh policy each, seeds seed..seed+k-1)."""
    resources = evaluation_run.resources(params, run_key)
    bundle = resources.bundle(job.path)
    task_spec = bundle.task(job.task_id)
    out = []
    for sample in range(params.samples):
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


def _start(params: EvaluateParameters) -> int:
    with open_catalog().session() as session:
        set_id = get_set(session, params.set_name).id
    return add_run(
        EvaluationRun(
            set_id=set_id,
            policy=params.policy,
            samples=params.samples,
            flow_run_id=current_flow_run_id(),
            metrics={"parameters": params.model_dump()},
        )
    )


def _store_trajectories(run_id: int, trajectories: list[Trajectory]) -> TrajectoryFiles:
    settings = get_settings()
    folder = settings.home / "evaluations" / str(run_id)
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
def evaluate(params: EvaluateParameters) -> EvaluationReport:
    """Evaluate `params.policy` on set `params.set_name`; returns the report with the run id.

    Args:
        params: The evaluation: environment set and split, policy, samples per task, turns, judge.
    """
    logger = get_run_logger()
    run_id = _start(params)
    # this process's resources of the run (run ids repeat across catalogs, so the key is unique)
    run_key = f"evaluation-{run_id}-{uuid.uuid4().hex[:12]}"
    futures: list[Any] = []
    try:
        jobs = plan(params)
        futures = [evaluate_task.submit(params, run_key, job) for job in jobs]
        trajectories = [t for future in futures for t in future.result()]
    except BaseException as exc:
        wait(futures)  # the tasks still running finish before their resources are released
        finish_run(EvaluationRun, run_id, "failed", {"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        simulation = evaluation_run.release(run_key)
    overall, per_env = report(trajectories, params.samples)
    result = EvaluationReport(
        run_id=run_id,
        overall=overall,
        per_env=per_env,
        world=f"simulated:{params.simulate.world_model}" if params.simulate else "real",
        simulation=simulation,
        trajectories=_store_trajectories(run_id, trajectories),
    )
    finish_run(EvaluationRun, run_id, "completed", result.stored())
    rows = [
        {"env": env, **{k: round(v, 4) if isinstance(v, float) else v for k, v in s.model_dump().items()}}
        for env, s in result.per_env.items()
    ]
    create_table_artifact(
        rows, key="evaluation-per-env", description=f"{params.policy} on {params.set_name}: scores per environment"
    )
    create_markdown_artifact(
        f"# Evaluation {run_id}\n\n{params.policy} on set `{params.set_name}` ({params.split}, {result.world} worlds), "
        f"{params.samples} sample(s) per task: "
        f"pass@1 {overall.pass_at_1:.3f}, pass@{params.samples} {overall.pass_at_k:.3f}, mean turns "
        f"{overall.mean_turns:.2f}, env_error rate {overall.env_error_rate:.3f}, format_error rate {overall.format_error_rate:.3f}."
        f"\n\n{dashboard_link('evaluate')}",
        key="evaluation-summary",
    )
    logger.info("evaluation %s: %s", run_id, json.dumps(overall.model_dump()))
    return result


def run_evaluate(params: EvaluateParameters) -> EvaluationReport:
    """Run the flow in this process with `concurrency` tasks at once."""
    return evaluate.with_options(task_runner=ThreadPoolTaskRunner(max_workers=params.concurrency))(params)
