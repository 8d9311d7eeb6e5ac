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

Asked to stop (Ctrl-C or SIGTERM to the command: `run_train`, worldsmith/flows/interruption.py), the
run stops between its stages, and in training at the next step boundary (launched training processes
are stopped): the run reads `cancelled`, the checkpoints stored so far are kept, the flow run ends
Cancelled, and `Interrupted` says which checkpoint was kept and how to resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from prefect import State, flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.states import Cancelled
from pydantic import BaseModel
from pydantic.json_schema import SkipJsonSchema
from sqlmodel import select

from worldsmith.bundle.loader import load_bundle
from worldsmith.flows.artifacts import summarise_training
from worldsmith.flows.evaluate import evaluate
from worldsmith.flows.interruption import STOP, Interrupted, run_stoppable_flow, stop_requested, stops_interrupting
from worldsmith.flows.records import current_flow_run_id, failed_on_error, mark_crashed, start_training_run
from worldsmith.flows.run_names import named_after
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.catalog import Checkpoint, TrainingRun, TrainingStep
from worldsmith.models.evaluation import EvaluationReport, EvaluationSummary
from worldsmith.models.runs import RunStatus
from worldsmith.models.sets import SplitName
from worldsmith.models.training import TrainerOutcome, TrainResult
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings
from worldsmith.storage.bundle_cache import cached_bundle
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.publish import CatalogError
from worldsmith.storage.run_owner import process_alive, this_process
from worldsmith.storage.run_records import finish_run, update_run
from worldsmith.storage.sets import get_set, members_of
from worldsmith.tasks.parameters import EvaluateParameters
from worldsmith.training.checkpoints import fetch_checkpoint, latest_trainer_checkpoint, save_checkpoint
from worldsmith.training.config import TINY, TrainingConfig

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


WARMUP_RECIPE = 2
"""Version of the tiny model's warm-up data (part of its cache key): 2 since a lazy habit is warmed up
on one reference row for each lazy one (1: two for each)."""


@task(
    name="prepare-model", cache_policy=NO_CACHE, log_prints=False, task_run_name="prepare-{config.model}"
)  # libraries print bytecode while hashing datasets
def prepare_model(config: TrainingConfig, bundle_paths: list[str], progress: bool = False) -> str | State:
    """The model directory to train: `config.model` itself, or for `tiny` a tiny Qwen3 model built
    offline from the curriculum's bundles and warmed up on their reference solutions (and, with
    `curriculum.lazy_habit`, a lazy habit: one reference row for each lazy one); cached by content
    in WORLDSMITH_HOME/models. A warm-up asked to stop (`STOP`) ends at a step boundary, uncached: Cancelled."""
    if config.model != TINY:
        return _local_model(config.model)
    from worldsmith.training.curriculum import curriculum_bundles
    from worldsmith.training.tiny import build_tiny_model
    from worldsmith.training.warmup import turn_tokens, warm_up, warmup_rows

    loaded = {p: load_bundle(Path(p)) for p in sorted(bundle_paths)}
    bundles = list(curriculum_bundles(loaded, config.curriculum).values())
    window = config.window if config.history == "windowed" else None
    key = hashlib.sha256(
        json.dumps(
            [
                [b.key for b in loaded.values()],
                sorted(f"{b.key}/{t.id}" for b in bundles for t in b.tasks),  # the tasks the curriculum chose
                config.seed,
                window,
                config.warmup_steps,
                config.curriculum.model_dump(),
                WARMUP_RECIPE,
            ]
        ).encode()
    ).hexdigest()[:16]
    target = get_settings().home / "models" / f"tiny-{key}"
    if (target / "config.json").is_file():
        _warn_overlong(target, config.max_completion_length)
        return str(target)
    runtime = Runtime()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            base = build_tiny_model(Path(scratch) / "base", bundles, seed=config.seed)
            rows = warmup_rows(runtime, bundles, window, config.curriculum.lazy_habit)
            warm = Path(scratch) / "warm"
            warm_up(
                base,
                rows,
                warm,
                steps=config.warmup_steps,
                seed=config.seed,
                progress=progress,
                stop_requested=stop_requested,
            )
            if STOP.requested:  # cut short: not the model to cache
                return Cancelled(message="the warm-up stopped before its last step")
            (warm / TURN_TOKENS).write_text(json.dumps(turn_tokens(warm, rows), sort_keys=True))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(warm), target)  # scratch and home may be on different file systems
    finally:
        runtime.close()
    _warn_overlong(target, config.max_completion_length)
    return str(target)


TURN_TOKENS = "turn-tokens.json"
"""Beside a tiny model: the longest reference turn of each task it was warmed up on, in its tokens."""


def _warn_overlong(model_dir: Path, limit: int) -> None:
    """Warn of each task whose reference solution has a turn longer than `limit` tokens (`TURN_TOKENS`
    beside the model; none for a model cached before it was written)."""
    from worldsmith.training.warmup import overlong

    path = model_dir / TURN_TOKENS
    longest = json.loads(path.read_text()) if path.is_file() else {}
    try:
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = get_run_logger()
    except MissingContextError:  # called outside a run (bench/learning.py, bench/tiny_prepare.py)
        logger = logging.getLogger(__name__)
    for name, tokens in overlong(longest, limit).items():
        logger.warning(
            f"{name}: a turn of its reference solution takes {tokens} tokens, more than max_completion_length "
            f"{limit}: every rollout of it will be cut short (a format error) and never solve it; raise "
            "max_completion_length"
        )


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


def evaluate_split(config: TrainingConfig, model: str, split: SplitName) -> EvaluationSummary:
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
    result = cast(EvaluationReport, evaluate(params))  # a subflow that ends Cancelled raises here
    return EvaluationSummary(run_id=result.run_id, scores=result.overall)


def _grpo_run(run_id: int) -> TrainingRun:
    """GRPO training run `run_id`'s row; ValueError when there is no such run or it is another kind."""
    with open_catalog().session() as session:
        run = session.get(TrainingRun, run_id)
    if run is None:
        raise ValueError(f"no training run {run_id} (`worldsmith runs ls --kind train` lists them)")
    if "kind" in run.config:
        raise ValueError(f"training run {run_id} is a {run.config['kind']} run; only GRPO training runs resume")
    return run


def stored_config(run_id: int) -> TrainingConfig:
    """The configuration of GRPO training run `run_id`; ValueError when there is no such run."""
    return TrainingConfig.model_validate(_grpo_run(run_id).config)


class ReopenedRun(BaseModel):
    """A stopped training run made running again: the trainer checkpoint's step it resumes after, the
    directory the checkpoint is unpacked into, and the run's metrics as the stopped attempt left them."""

    step: int
    directory: str
    metrics: JsonObject


@task(name="reopen-training-run", cache_policy=NO_CACHE, task_run_name="reopen-run-{run_id}")
def reopen_run(run_id: int, config: TrainingConfig, output: Path) -> ReopenedRun:
    """Make training run `run_id` (stopped before finishing, with `config` as its configuration)
    running again from its latest trainer checkpoint: the checkpoint is unpacked under `output`
    and the step rows after it are dropped. ValueError naming the problem when the run cannot resume."""
    run = _grpo_run(run_id)
    status, metrics, stored = run.status, dict(run.metrics), TrainingConfig.model_validate(run.config).model_dump()
    if status == RunStatus.COMPLETED:
        raise ValueError(f"training run {run_id} completed; there is nothing to resume")
    owner = metrics.get("process")
    if status == RunStatus.RUNNING and isinstance(owner, dict) and process_alive(owner):
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
    earlier = metrics.get("resumed_from_steps")
    resumed = [*(earlier if isinstance(earlier, list) else []), checkpoint.step]
    update_run(
        TrainingRun,
        run_id,
        {"resumed_from_steps": resumed, "process": this_process()},
        status=RunStatus.RUNNING,
        flow_run_id=current_flow_run_id(),
    )
    return ReopenedRun(step=checkpoint.step, directory=str(directory), metrics=metrics)


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
) -> TrainerOutcome | State:
    """Run GRPO (from the trainer checkpoint `resume_from` when set), here or in
    `config.processes` launched processes, on `config.nodes` machines (this one node 0, the others
    started by `launcher`: default, runs of the `train-node` deployment); returns the final model
    directory, the trainer checkpoints stored on the way and the per-step log. A multi-node run needs
    the model, bundles and output on a file system every node shares (worldsmith/training/nodes.py).
    Asked to stop (`STOP`), ends Cancelled: at the next step boundary here, its processes stopped when launched."""
    from worldsmith.training.launch import TrainingStopped, TrainRequest, launch, run_training

    request = TrainRequest(
        config=config, model=model, bundles=bundle_paths, run_id=run_id, output=output, resume_from=resume_from
    )
    try:
        if config.processes == 1 and config.nodes == 1:
            return run_training(request, progress, stop_requested)
        if config.nodes > 1 and launcher is None:
            from worldsmith.flows.train_node import default_node_launcher

            launcher = default_node_launcher()
        return launch(request, config.processes, launcher, stop_requested)
    except TrainingStopped as exc:  # the run was asked to stop: not a failure of the task
        return Cancelled(message=str(exc))


@task(name="store-checkpoint", retries=2, retry_delay_seconds=2, task_run_name="checkpoint-run-{run_id}-step-{step}")
def store_checkpoint(run_id: int, directory: str, step: int, metrics: dict[str, float]) -> str:
    """`directory` as a tar.gz in the object store and a checkpoint row of run `run_id`; returns the digest."""
    return save_checkpoint(run_id, Path(directory), step, metrics)


def check_can_train(config: TrainingConfig) -> None:
    """Before any work, the refusals a run would otherwise meet late, each one line naming its fix: a gpu
    run on a machine without one or one that cannot fit it, a multi-node run without the train-node
    deployment, a judged reward without its endpoint and key."""
    from worldsmith.training.memory import check_machine

    check_machine(config)
    if config.nodes > 1:
        from worldsmith.flows.train_node import default_node_launcher

        default_node_launcher()
    if config.reward != "verifier":
        from worldsmith.training.judged_reward import check_judge

        check_judge(config.judge)


def validation_before(
    config: TrainingConfig, model: str, run_id: int, reopened: ReopenedRun | None, validating: bool
) -> EvaluationSummary | None:
    """The validation split's evaluation before training (None when not `validating`), recorded with the
    run; a resumed run's own, when its stopped attempt recorded one."""
    if reopened is not None and "before" in reopened.metrics:  # the stopped attempt's own
        stored = reopened.metrics["before"]
        return None if stored is None else EvaluationSummary.model_validate(stored)
    before = evaluate_split(config, model, "validation") if validating else None
    update_run(TrainingRun, run_id, {"before": None if before is None else before.model_dump(mode="json")})
    return before


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
) -> TrainResult | State:
    """GRPO of `config.model` on set `config.set_name`; returns the run's record (ids, evaluations, checkpoint).
    `progress` and `resume` are for callers (the CLI, `resume_training`), hidden from the deployment's form.
    Ends Cancelled when asked to stop (`STOP`), raising `Interrupted` to its caller (`stopped_line`).

    Args:
        config: The training run: model, environment set, GRPO and rollout settings.
        progress: Draw a progress bar on the terminal (for runs started from the command line).
        with_validation: Evaluate the validation split before and after training (in the real worlds, also for simulated training).
        resume: Continue this training run, stopped before finishing, from its latest trainer checkpoint (`config` must be the run's own).
    """
    check_can_train(config)
    run_id = start_training_run(config.set_name, config.model_dump()) if resume is None else resume
    output = Path(config.output) if config.output else get_settings().home / "training" / str(run_id)
    reopened = reopen_run(run_id, config, output) if resume is not None else None  # refused: the run as it was
    try:
        with failed_on_error(TrainingRun, run_id), stops_interrupting():  # `cancelled` when stopped
            STOP.check()
            paths = plan(config)
            STOP.check()
            model = cast(str, prepare_model(config, paths["train"], progress))  # Cancelled (stopped) raises
            STOP.check()
            validating = with_validation and bool(paths["validation"])
            before = validation_before(config, model, run_id, reopened, validating)
            STOP.check()
            resume_from = reopened.directory if reopened else None
            trained = cast(  # a task that ended Cancelled (stopped) raises: Prefect resolves its state
                TrainerOutcome,
                train_policy(config, model, paths["train"], run_id, str(output), progress, resume_from),
            )
            digest = store_checkpoint(run_id, trained.final, trained.steps, {**trained.last_step(), "final": True})
            after = evaluate_split(config, trained.final, "validation") if validating else None
    except Interrupted as exc:
        stopped = Interrupted(stopped_line(run_id, config), exc.signum)
        return Cancelled(message=str(stopped), data=stopped)  # the caller's call raises `stopped`
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
        resumed_from=reopened.step if reopened else None,
    )
    finish_run(TrainingRun, run_id, RunStatus.COMPLETED, result.stored())
    summarise_training(config, result)
    return result


def stopped_line(run_id: int, config: TrainingConfig) -> str:
    """What a stopped training run kept and how to go on: its last step done, its final model when stored
    (stopped in the evaluation after training), its latest trainer checkpoint (`worldsmith resume RUN_ID`),
    or that it has none to resume from."""
    with open_catalog().session() as session:
        done = session.exec(select(TrainingStep.step).where(TrainingStep.training_run_id == run_id)).all()
        stored = session.exec(select(Checkpoint).where(Checkpoint.training_run_id == run_id)).all()
    progress = f"after step {max(done)} of {config.steps}" if done else "before its first step"
    if any(row.metrics.get("final") is True for row in stored):
        return (
            f"training run {run_id} cancelled after training, its final model kept (`worldsmith models fetch "
            f"{run_id}`); only its validation after training is missing"
        )
    checkpoint = latest_trainer_checkpoint(run_id)
    if checkpoint is None:
        return (
            f"training run {run_id} cancelled {progress}; no trainer checkpoint kept (save_every {config.save_every}: "
            "none saved yet), nothing to resume from: run the command again to start over"
        )
    return (
        f"training run {run_id} cancelled {progress}; its trainer checkpoint of step {checkpoint.step} kept; "
        f"to resume, run: worldsmith resume {run_id}"
    )


def run_train(start: Callable[[], TrainResult | State], stop_on_signals: bool = False) -> TrainResult:
    """Run a training flow (`start`: `train` or `resume_training` called) in this process. With
    `stop_on_signals` (the CLI), it runs in a thread and SIGINT or SIGTERM stop it (`run_stoppable`): at
    the next step boundary, the run recorded `cancelled`, its flow run Cancelled, and `Interrupted`
    raised here, its line saying which checkpoint was kept and how to resume."""
    if not stop_on_signals:
        return cast(TrainResult, start())  # a run that ends Cancelled raises here: Prefect resolves its state
    return run_stoppable_flow(
        start,
        lambda result: f"training run {result.run_id} completed first; final model: {result.final}",
        "training stopped before its run was recorded; nothing kept",
    )


@flow(name="resume-training", log_prints=True, on_crashed=[mark_crashed], flow_run_name="resume-training-{run_id}")
def resume_training(run_id: int, progress: SkipJsonSchema[bool] = False) -> TrainResult | State:
    """Continue GRPO training run `run_id`, stopped before finishing (a killed worker, a preempted
    machine), from its latest trainer checkpoint, with the run's own configuration.

    Args:
        run_id: The training run (its id in the catalog, as the dashboard's training table shows it).
        progress: Draw a progress bar on the terminal (for runs started from the command line).
    """
    try:
        return cast(TrainResult, train(stored_config(run_id), progress=progress, resume=run_id))
    except Interrupted as exc:  # the train subflow ended Cancelled: so does this one
        return Cancelled(message=str(exc), data=exc)
