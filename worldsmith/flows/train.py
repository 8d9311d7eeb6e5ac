"""The `train` flow: multi-turn GRPO over an environment set.

set members -> bundles fetched from the object store -> the model (a local path, or `tiny`: built
offline and warmed up on the reference solutions) -> the validation split evaluated with the
`evaluate` flow -> GRPO on the train split's (env, task) rows -> the final model stored in the
object store as a checkpoint -> the validation split evaluated again. The training run, each
step's metrics and the checkpoints are catalog rows; a markdown artifact summarises the run.

With `save_every`, each trainer checkpoint reaches the object store as soon as it is written, and
a run that stopped before finishing (a killed worker, a preempted machine) continues from its
latest one with `resume=<run id>` (`worldsmith resume RUN_ID`): same run row, same configuration,
the steps after that checkpoint run again (their rows from the stopped attempt are replaced).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic.json_schema import SkipJsonSchema
from sqlmodel import select

from worldsmith.bundle.loader import load_bundle
from worldsmith.flows.evaluate import evaluate
from worldsmith.flows.links import dashboard_link
from worldsmith.flows.records import current_flow_run_id, mark_crashed
from worldsmith.flows.run_names import named_after
from worldsmith.models.catalog import TrainingRun, TrainingStep
from worldsmith.models.evaluation import EvaluationSummary
from worldsmith.models.training import StepMetrics, TrainerOutcome, TrainResult
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings
from worldsmith.storage.bundle_cache import cached_bundle
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.publish import CatalogError
from worldsmith.storage.run_owner import process_alive, this_process
from worldsmith.storage.run_records import add_run, finish_run, update_run
from worldsmith.storage.sets import get_set, members_of
from worldsmith.tasks.parameters import EvaluateParameters
from worldsmith.training.checkpoints import fetch_checkpoint, latest_trainer_checkpoint, save_checkpoint
from worldsmith.training.config import TINY, TrainingConfig
from worldsmith.training.success import success_line

if TYPE_CHECKING:
    from worldsmith.training.launch import NodeLauncher


@task(name="plan-training", retries=2, retry_delay_seconds=2, task_run_name="plan-{config.set_name}-{config.split}")
def plan(config: TrainingConfig) -> dict[str, list[str]]:
    """Bundle directories of the set's members, by split (fetched into the local cache once)."""
    with open_catalog().session() as session:
        members = [(v.ref, v.content_key, split) for v, split in members_of(session, get_set(session, config.set_name))]
    paths: dict[str, list[str]] = {"train": [], "validation": []}
    for ref, content_key, split in members:
        paths[split].append(str(cached_bundle(ref, content_key)))
    chosen = paths["train"] + paths["validation"] if config.split == "all" else paths[config.split]
    if not chosen:
        raise CatalogError(f"set {config.set_name!r} has no members in split {config.split!r}: nothing to train on")
    return {"train": chosen, "validation": paths["validation"]}


@task(
    name="prepare-model", cache_policy=NO_CACHE, log_prints=False, task_run_name="prepare-{config.model}"
)  # libraries print bytecode while hashing datasets
def prepare_model(config: TrainingConfig, bundle_paths: list[str], progress: bool = False) -> str:
    """The model directory to train: `config.model` itself, or for `tiny` a tiny Qwen3 model built
    offline from the curriculum's bundles and warmed up on their reference solutions (and, with
    `curriculum.lazy_habit`, a lazy habit: two reference rows for each lazy one); cached by content
    in WORLDSMITH_HOME/models."""
    if config.model != TINY:
        return _local_model(config.model)
    from worldsmith.training.curriculum import curriculum_bundles
    from worldsmith.training.tiny import build_tiny_model
    from worldsmith.training.warmup import lazy_rows, reference_rows, warm_up

    loaded = {p: load_bundle(Path(p)) for p in sorted(bundle_paths)}
    bundles = list(curriculum_bundles(loaded, config.curriculum).values())
    window = config.window if config.history == "windowed" else None
    key = hashlib.sha256(
        json.dumps(
            [[b.key for b in loaded.values()], config.seed, window, config.warmup_steps, config.curriculum.model_dump()]
        ).encode()
    ).hexdigest()[:16]
    target = get_settings().home / "models" / f"tiny-{key}"
    if (target / "config.json").is_file():
        return str(target)
    runtime = Runtime()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            base = build_tiny_model(Path(scratch) / "base", bundles, seed=config.seed)
            rows = reference_rows(runtime, bundles, window)
            if config.curriculum.lazy_habit:
                rows = rows * 2 + lazy_rows(runtime, bundles, window)
            warm_up(base, rows, Path(scratch) / "warm", steps=config.warmup_steps, seed=config.seed, progress=progress)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(Path(scratch) / "warm"), target)  # scratch and home may be on different file systems
    finally:
        runtime.close()
    return str(target)


def _local_model(model: str) -> str:
    """`model` if it is a model directory or an id in the local Hugging Face cache; else ValueError."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"model {model!r} is neither a model directory nor in the local Hugging Face cache "
            f"(nothing is downloaded): {exc}"
        ) from None
    return model


def evaluate_split(config: TrainingConfig, model: str, split: str) -> EvaluationSummary:
    """Greedy evaluation of `model` on the set's `split` with the evaluate flow: its run and overall scores."""
    params = EvaluateParameters(
        set_name=config.set_name,
        policy=f"hf:{model}",
        split=split,
        max_turns=config.max_turns,
        window=config.window if config.history == "windowed" else None,
        temperature=0.0,
        max_new_tokens=config.max_completion_length,
        seed=config.seed,
        side_effects=config.side_effects,
    )
    result = evaluate(params)
    return EvaluationSummary(run_id=result.run_id, scores=result.overall)


def _grpo_run(run_id: int) -> TrainingRun:
    """GRPO training run `run_id`'s row; ValueError when there is no such run or it is another kind."""
    with open_catalog().session() as session:
        run = session.get(TrainingRun, run_id)
    if run is None:
        raise ValueError(f"no training run {run_id}")
    if "kind" in run.config:
        raise ValueError(f"training run {run_id} is a {run.config['kind']} run; only GRPO training runs resume")
    return run


def stored_config(run_id: int) -> TrainingConfig:
    """The configuration of GRPO training run `run_id`; ValueError when there is no such run."""
    return TrainingConfig.model_validate(_grpo_run(run_id).config)


@task(name="reopen-training-run", cache_policy=NO_CACHE, task_run_name="reopen-run-{run_id}")
def reopen_run(run_id: int, config: TrainingConfig, output: Path) -> dict[str, Any]:
    """Make training run `run_id` (stopped before finishing, with `config` as its configuration)
    running again from its latest trainer checkpoint: the checkpoint is unpacked under `output`
    and the step rows after it are dropped. Returns {"step", "directory", "metrics"}; ValueError
    naming the problem when the run cannot resume."""
    run = _grpo_run(run_id)
    status, metrics, stored = run.status, dict(run.metrics), TrainingConfig.model_validate(run.config).model_dump()
    if status == "completed":
        raise ValueError(f"training run {run_id} completed; there is nothing to resume")
    owner = metrics.get("process") or {}
    if status == "running" and process_alive(owner):
        raise ValueError(
            f"training run {run_id} is still running (process {owner['pid']} on this host); stop it before resuming"
        )
    changed = sorted(k for k, v in config.model_dump().items() if stored.get(k) != v)
    if changed:
        raise ValueError(
            f"training run {run_id} resumes with its own configuration; these fields differ: {', '.join(changed)}"
        )
    checkpoint = latest_trainer_checkpoint(run_id)
    if checkpoint is None:
        raise ValueError(
            f"training run {run_id} has no trainer checkpoint to resume from: it ran with save_every 0 "
            "or stopped before its first checkpoint; start a new run"
        )
    directory = fetch_checkpoint(checkpoint.digest, output / f"resume-from-{checkpoint.step}")
    with open_catalog().session() as session:
        for row in session.exec(
            select(TrainingStep).where(TrainingStep.training_run_id == run_id, TrainingStep.step > checkpoint.step)
        ):
            session.delete(row)
        session.commit()
    resumed = [*metrics.get("resumed_from_steps", []), checkpoint.step]
    update_run(
        TrainingRun,
        run_id,
        {"resumed_from_steps": resumed, "process": this_process()},
        status="running",
        flow_run_id=current_flow_run_id(),
    )
    return {"step": checkpoint.step, "directory": str(directory), "metrics": metrics}


@task(name="train-policy", cache_policy=NO_CACHE, task_run_name="grpo-run-{run_id}")
def train_policy(
    config: TrainingConfig,
    model: str,
    bundle_paths: list[str],
    run_id: int,
    output: str,
    progress: bool,
    resume_from: str | None = None,
    launcher: NodeLauncher | None = None,
) -> TrainerOutcome:
    """Run GRPO (from the trainer checkpoint `resume_from` when set), here or in
    `config.processes` launched processes, on `config.nodes` machines (this one node 0, the others
    started by `launcher`: default, runs of the `train-node` deployment); returns the final model
    directory, the trainer checkpoints stored on the way and the per-step log. A multi-node run needs
    the model, bundles and output on a file system every node shares (worldsmith/training/nodes.py)."""
    from worldsmith.training.launch import TrainRequest, launch, run_training

    request = TrainRequest(
        config=config, model=model, bundles=bundle_paths, run_id=run_id, output=output, resume_from=resume_from
    )
    if config.processes == 1 and config.nodes == 1:
        return run_training(request, progress)
    if config.nodes > 1 and launcher is None:
        from worldsmith.flows.train_node import default_node_launcher

        launcher = default_node_launcher()
    return launch(request, config.processes, launcher)


@task(name="store-checkpoint", retries=2, retry_delay_seconds=2, task_run_name="checkpoint-run-{run_id}-step-{step}")
def store_checkpoint(run_id: int, directory: str, step: int, metrics: dict[str, Any]) -> str:
    """`directory` as a tar.gz in the object store and a checkpoint row of run `run_id`; returns the digest."""
    return save_checkpoint(run_id, Path(directory), step, metrics)


def _summary(run_id: int, config: TrainingConfig, result: TrainResult) -> str:
    def line(name: str, report: EvaluationSummary | None) -> str:
        if report is None:
            return f"- {name}: not evaluated (no validation split in the set, or validation off)"
        return f"- {name}: pass@1 {report.scores.pass_at_1:.3f}, mean reward {report.scores.mean_reward:.3f} (evaluation {report.run_id})"

    last = result.log[-1] if result.log else {}
    worlds = (
        "real worlds"
        if config.simulate is None
        else f"world model `{config.simulate.world_model}` ({config.real_share:.0%} of groups real)"
    )
    return "\n".join(
        [
            f"# Training run {run_id}",
            "",
            (
                f"GRPO of `{config.model}` on set `{config.set_name}` ({config.split}) in the {worlds}, "
                f"{result.steps} steps, group {config.group_size}, history {config.history}."
            ),
            "",
            line("before", result.before),
            line("after", result.after),
            *(
                [f"- success rate on its own tasks (sampled as in training): {success_line(result.success)}"]
                if result.success
                else []
            ),
            "",
            f"Last step: reward {last.get('reward', float('nan')):.3f}, success rate {last.get('success_rate', float('nan')):.3f}.",
            f"Final model: object {result.checkpoint}.",
            "",
            dashboard_link("train"),
        ]
    )


_STEP_COLUMNS = ("step", "loss", "reward", "reward_std", "success_rate", "env_error_rate", "turns", "tokens", "kl")
_JUDGE_COLUMNS = ("judge_requests", "judge_cache_hits", "judge_cost_usd", "judge_latency_s", "judge_error_rate")
_WORLD_COLUMNS = ("reward_real", "reward_imagined", "reward_gap", "real_start_rate")


def _step_table(log: list[StepMetrics], config: TrainingConfig) -> list[dict[str, Any]]:
    """One row per logged step with the metrics people watch (rounded for display): with a judged reward
    also the judge's requests, cost and latency; in simulated training the real and imagined rewards apart."""
    columns = _STEP_COLUMNS
    if config.reward != "verifier":
        columns += _JUDGE_COLUMNS
    if config.simulate is not None:
        columns += _WORLD_COLUMNS
    return [{c: round(e[c], 4) if isinstance(e.get(c), float) else e.get(c) for c in columns} for e in log]


@flow(
    name="train",
    log_prints=True,
    on_crashed=[mark_crashed],
    flow_run_name=named_after("train", "config", TrainingConfig, lambda c: c.set_name),
)
def train(
    config: TrainingConfig,
    progress: SkipJsonSchema[bool] = False,
    with_validation: bool = True,
    resume: SkipJsonSchema[int | None] = None,
) -> TrainResult:
    """GRPO of `config.model` on set `config.set_name`; returns the run's record (ids, evaluations, checkpoint).
    `progress` and `resume` are for callers (the CLI, `resume_training`), hidden from the deployment's form.

    Args:
        config: The training run: model, environment set, GRPO and rollout settings.
        progress: Draw a progress bar on the terminal (for runs started from the command line).
        with_validation: Evaluate the validation split before and after training (in the real worlds, also for simulated training).
        resume: Continue this training run, stopped before finishing, from its latest trainer checkpoint (`config` must be the run's own).
    """
    logger = get_run_logger()
    from worldsmith.training.memory import check_machine

    check_machine(config)  # before any work: a gpu run on a machine without one, or one that cannot fit
    if config.nodes > 1:  # the other nodes' deployment, before any work
        from worldsmith.flows.train_node import default_node_launcher

        default_node_launcher()
    if config.reward != "verifier":  # the judge's endpoint and key, before any work
        from worldsmith.training.judged_reward import judge_endpoint

        judge_endpoint(config.judge)
    if resume is None:
        with open_catalog().session() as session:
            set_id = get_set(session, config.set_name).id
        run_id = add_run(TrainingRun(set_id=set_id, config=config.model_dump(), flow_run_id=current_flow_run_id()))
    else:
        run_id = resume
    output = Path(config.output) if config.output else get_settings().home / "training" / str(run_id)
    reopened = (
        reopen_run(run_id, config, output) if resume is not None else None
    )  # its refusals leave the run as it was
    try:
        paths = plan(config)
        model = prepare_model(config, paths["train"], progress)
        if reopened and "before" in reopened["metrics"]:
            stored_before = reopened["metrics"]["before"]
            before = None if stored_before is None else EvaluationSummary.model_validate(stored_before)
        else:
            before = evaluate_split(config, model, "validation") if with_validation and paths["validation"] else None
            update_run(TrainingRun, run_id, {"before": None if before is None else before.model_dump(mode="json")})
        trained = train_policy(
            config, model, paths["train"], run_id, str(output), progress, reopened["directory"] if reopened else None
        )
        last = trained.last_step()
        digest = store_checkpoint(run_id, trained.final, trained.steps, {**last, "final": True})
        after = evaluate_split(config, trained.final, "validation") if with_validation and paths["validation"] else None
    except BaseException as exc:
        finish_run(TrainingRun, run_id, "failed", {"error": f"{type(exc).__name__}: {exc}"})
        raise
    result = TrainResult(
        run_id=run_id,
        model=model,
        final=trained.final,
        checkpoint=digest,
        steps=trained.steps,
        before=before,
        after=after,
        simulation=trained.simulation,
        success=trained.success,
        log=trained.log,
        resumed_from=reopened["step"] if reopened else None,
    )
    finish_run(TrainingRun, run_id, "completed", result.stored())
    create_table_artifact(
        _step_table(trained.log, config),
        key="training-steps",
        description=f"Training run {run_id}: metrics per step",
    )
    create_markdown_artifact(_summary(run_id, config, result), key="training-summary")
    logger.info("training run %s finished: %s steps, checkpoint %s", run_id, trained.steps, digest)
    return result


@flow(name="resume-training", log_prints=True, on_crashed=[mark_crashed], flow_run_name="resume-training-{run_id}")
def resume_training(run_id: int, progress: SkipJsonSchema[bool] = False) -> TrainResult:
    """Continue GRPO training run `run_id`, stopped before finishing (a killed worker, a preempted
    machine), from its latest trainer checkpoint, with the run's own configuration.

    Args:
        run_id: The training run (its id in the catalog, as the dashboard's training table shows it).
        progress: Draw a progress bar on the terminal (for runs started from the command line).
    """
    return train(stored_config(run_id), progress=progress, resume=run_id)
