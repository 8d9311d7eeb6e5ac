"""The `cotrain` flow: a policy and a world model trained together, Dyna style.

Each round:

1. real rollouts: the current policy, sampled, on the train split's tasks in the real worlds
   (an `evaluate` run), which also gives the policy's real success rate;
2. world-model update: their tool calls replayed into transitions; the world model is scored on
   these fresh transitions before it sees them (its accuracy on new real data), then fine-tuned
   on every real transition so far (a world-model training run, continuing the last one); the
   reference solutions' transitions are part of the data from round 1 (`reference_transitions`);
3. policy update: GRPO (a `train` run) whose rollouts run in the world model's imagination, with
   `real_share` of the rollout groups (at least 20% by default) in the real worlds; an imagined
   rollout stops at the first call whose uncertainty passes `uncertainty_threshold` and is then
   left out of the loss, like any env_error;
4. evaluation in the real worlds: the updated policy, greedy, on the validation split (the train
   split when the set has none).

The co-training run is a training run (config kind `cotrain`) whose steps are the rounds, each
with its metrics; the dashboard charts them. Its form, CotrainConfig, is in
worldsmith/training/config.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from prefect import State, flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled
from pydantic.json_schema import SkipJsonSchema

from worldsmith.agent.loop import Trajectory, run_episode
from worldsmith.agent.policies import ReferencePolicy
from worldsmith.agent.trajectories import read_jsonl
from worldsmith.bundle.loader import load_bundle
from worldsmith.flows.artifacts import summarise_cotraining
from worldsmith.flows.evaluate import evaluate
from worldsmith.flows.interruption import STOP, Interrupted, run_stoppable_flow, stop_requested, stops_interrupting
from worldsmith.flows.records import current_flow_run_id, failed_on_error, mark_crashed, start_training_run
from worldsmith.flows.run_names import named_after
from worldsmith.flows.train import evaluate_split, plan, prepare_model, train
from worldsmith.models.catalog import TrainingRun
from worldsmith.models.evaluation import EvaluationReport, EvaluationSummary
from worldsmith.models.runs import RunStatus
from worldsmith.models.sets import SplitName
from worldsmith.models.training import CotrainResult, CotrainRound, StepMetrics, TrainResult, WorldModelTrainResult
from worldsmith.models.world_model_scores import OneStepScores
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings
from worldsmith.storage.run_records import finish_run, record_step
from worldsmith.tasks.parameters import EvaluateParameters
from worldsmith.training.config import CotrainConfig, WorldModelConfig
from worldsmith.training.world_model_runs import train_world_model
from worldsmith.worldmodel.config import SimulationConfig
from worldsmith.worldmodel.evaluation import one_step
from worldsmith.worldmodel.transitions import Transition, build_transitions
from worldsmith.worldmodel.world_models import HFWorldModel


@task(name="real-transitions", cache_policy=NO_CACHE)
def real_transitions(bundle_paths: list[str], trajectories: list[Trajectory] | None, seed: int) -> list[Transition]:
    """Every tool call of `trajectories` (None: the reference solutions of every task) replayed in
    fresh episodes, all in the train split: the world model learns the worlds the policy trains in."""
    bundles = {bundle.key: bundle for bundle in (load_bundle(Path(p)) for p in bundle_paths)}
    with Runtime() as runtime:
        if trajectories is None:
            trajectories = [
                run_episode(runtime, bundle, task, ReferencePolicy())
                for bundle in bundles.values()
                for task in bundle.tasks
            ]
        return build_transitions(runtime, bundles, trajectories, seed=seed, validation=0.0, test=0.0)


@task(name="score-world-model", cache_policy=NO_CACHE, log_prints=False)
def score_world_model(model_dir: str, transitions: list[Transition], max_new_tokens: int) -> OneStepScores:
    """One-step scores of the world model on transitions it has not been trained on."""
    return one_step(HFWorldModel(model_dir, max_new_tokens=max_new_tokens), transitions)


@task(
    name="update-world-model", cache_policy=NO_CACHE, log_prints=False
)  # libraries print bytecode while hashing datasets
def update_world_model(config: WorldModelConfig, transitions: list[Transition]) -> WorldModelTrainResult | State:
    """Fine-tune `config.model` (a world model directory, or `tiny` to start one) on `transitions`: a recorded
    run. Asked to stop (`STOP`), it ends at a step boundary, its run `cancelled`: Cancelled."""
    from worldsmith.training.launch import TrainingStopped

    try:
        return train_world_model(transitions, config, flow_run_id=current_flow_run_id(), stop_requested=stop_requested)
    except TrainingStopped as exc:  # the run was asked to stop: not a failure of the task
        return Cancelled(message=str(exc))


def _mean(log: list[StepMetrics], key: str) -> float | None:
    values = [entry[key] for entry in log if isinstance(entry.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def _real_rollouts(config: CotrainConfig, policy: str, seed: int) -> EvaluationReport:
    """Step 1: the policy, sampled as in training, on the train split in the real worlds (an `evaluate` run)."""
    spec = config.policy
    return cast(  # a subflow that ends Cancelled raises here
        EvaluationReport,
        evaluate(
            EvaluateParameters(
                set_name=spec.set_name,
                policy=f"hf:{policy}",
                split=spec.split,
                samples=config.real_samples,
                temperature=spec.temperature,
                seed=seed,
                max_turns=spec.max_turns,
                max_new_tokens=spec.max_completion_length,
                window=spec.window if spec.history == "windowed" else None,
                side_effects=spec.side_effects,
            )
        ),
    )


def _imagined_update(
    config: CotrainConfig, policy: str, world_dir: str, seed: int, output: Path, progress: bool
) -> TrainResult:
    """Step 3: GRPO from `policy` in the world model's imagination, `real_share` of the groups in the real worlds (a `train` run)."""
    simulate = SimulationConfig(
        world_model=f"hf:{world_dir}",
        samples=config.samples,
        uncertainty_threshold=config.uncertainty_threshold,
        max_new_tokens=config.max_new_tokens,
    )
    trained = train(
        config.policy.model_copy(
            update={
                "model": policy,
                "simulate": simulate,
                "real_share": config.real_share,
                "seed": seed,
                "output": str(output),
            }
        ),
        progress=progress,
        with_validation=False,
    )
    return cast(TrainResult, trained)  # a run that ends Cancelled (stopped) raises: Prefect resolves its state


def _round_metrics(
    number: int,
    real: EvaluationReport,
    fresh: list[Transition],
    transitions: list[Transition],
    scored: OneStepScores | None,
    wm: WorldModelTrainResult | None,
    trained: TrainResult,
    evaluation: EvaluationSummary | None,
    eval_split: str,
    seconds: float,
) -> CotrainRound:
    """What one round records (see the module docstring and docs/world-models.md)."""
    simulation = trained.simulation
    return CotrainRound(
        round=number,
        real_evaluation=real.run_id,
        real_success_rate=real.overall.pass_at_1,
        real_episodes=real.overall.episodes,
        transitions_new=len(fresh),
        transitions=len(transitions),
        wm_accuracy_fresh=scored.observation_exact if scored else None,
        wm_fields_f1_fresh=scored.fields.f1 if scored else None,
        wm_run=wm.run_id if wm else None,
        wm_loss=wm.log[-1].get("loss") if wm and wm.log else None,
        policy_run=trained.run_id,
        policy_reward=_mean(trained.log, "reward"),
        policy_reward_real=_mean(trained.log, "reward_real"),  # a widening gap to the imagined:
        policy_reward_imagined=_mean(trained.log, "reward_imagined"),  # the policy exploits the model
        imagined_rate=_mean(trained.log, "imagined_rate"),
        imagined_calls=simulation.calls if simulation else 0,
        stopped_rate=simulation.uncertain_rate if simulation else None,
        invalid_rate=simulation.invalid_rate if simulation else None,
        mean_uncertainty=simulation.mean_uncertainty if simulation else None,
        eval_split=eval_split,
        eval_evaluation=evaluation.run_id if evaluation else None,
        eval_pass_at_1=evaluation.scores.pass_at_1 if evaluation else None,
        seconds=seconds,
    )


@dataclass
class Learned:
    """What co-training has learned so far: the policy's model directory, the world model's (None before
    its first update), and every real transition the world model has been trained on."""

    policy: str
    world_dir: str | None = None
    transitions: list[Transition] = field(default_factory=list)


def run_round(
    config: CotrainConfig,
    number: int,
    learned: Learned,
    train_paths: list[str],
    eval_split: SplitName,
    here: Path,
    progress: bool,
) -> CotrainRound:
    """Round `number` (see the module docstring), its models under `here`: `learned` moves on to the
    round's world model and policy; returns what the round records."""
    started, seed = time.perf_counter(), config.policy.seed + 1000 * number
    real = _real_rollouts(config, learned.policy, seed)
    fresh = real_transitions(train_paths, read_jsonl(Path(real.trajectories.jsonl)), seed)
    scored = score_world_model(learned.world_dir, fresh, config.max_new_tokens) if learned.world_dir and fresh else None
    learned.transitions += fresh
    wm = _world_model_update(config, number, learned, fresh, here / "world-model")
    learned.world_dir = wm.model if wm else learned.world_dir
    if learned.world_dir is None:
        raise ValueError(
            f"round {number}: no tool call in the real worlds yet, so there is nothing to learn a world model from; "
            "keep reference_transitions on, warm the policy up (model=tiny, warmup_steps) or start from a model that calls tools"
        )
    trained = _imagined_update(config, learned.policy, learned.world_dir, seed, here / "policy", progress)
    learned.policy = trained.final
    evaluation = evaluate_split(config.policy, learned.policy, eval_split)
    seconds = time.perf_counter() - started
    return _round_metrics(
        number, real, fresh, learned.transitions, scored, wm, trained, evaluation, eval_split, seconds=seconds
    )


def _world_model_update(
    config: CotrainConfig, number: int, learned: Learned, fresh: list[Transition], output: Path
) -> WorldModelTrainResult | None:
    """Step 2's update: the world model fine-tuned on every real transition so far (continuing the last
    one), when the round brought new ones or there is none yet; None when there is nothing to learn."""
    if not (fresh or (learned.world_dir is None and learned.transitions)):
        return None
    update = {
        "model": learned.world_dir or config.world_model.model,
        "seed": config.world_model.seed + number,
        "output": str(output),
    }
    # a run that ends Cancelled (stopped) raises: Prefect resolves its state
    return cast(
        WorldModelTrainResult, update_world_model(config.world_model.model_copy(update=update), learned.transitions)
    )


@flow(
    name="cotrain",
    log_prints=True,
    on_crashed=[mark_crashed],
    flow_run_name=named_after("cotrain", "config", CotrainConfig, lambda c: c.policy.set_name),
)
def cotrain(config: CotrainConfig, progress: SkipJsonSchema[bool] = False) -> CotrainResult | State:
    """Co-train `config.policy.model` and a world model on set `config.policy.set_name` for `config.rounds` rounds.

    Args:
        config: The policy's and the world model's settings and the co-training knobs.
        progress: Draw progress bars on the terminal (for runs started from the command line).

    Asked to stop (`STOP`: Ctrl-C or SIGTERM to `run_cotrain`), it stops between rounds, and within one at
    its stages' own boundaries (the training runs' steps): the run reads `cancelled`, the rounds done and
    their models are kept, the flow run ends Cancelled, raising `Interrupted` to its caller (`stopped_line`).
    """
    run_id = start_training_run(config.policy.set_name, {"kind": "cotrain", **config.model_dump()})
    folder = get_settings().home / "cotrain" / str(run_id)
    rounds: list[CotrainRound] = []
    learned: Learned | None = None
    try:
        with failed_on_error(TrainingRun, run_id, lambda: {"rounds": len(rounds)}), stops_interrupting():
            STOP.check()
            paths = plan(config.policy)
            STOP.check()
            learned = Learned(policy=cast(str, prepare_model(config.policy, paths["train"], progress)))
            eval_split: SplitName = "validation" if paths["validation"] else config.policy.split
            if config.reference_transitions:
                learned.transitions = real_transitions(paths["train"], None, config.policy.seed)
            for number in range(1, config.rounds + 1):
                STOP.check()
                metrics = run_round(
                    config, number, learned, paths["train"], eval_split, folder / f"round-{number}", progress
                )
                record_step(run_id, number, metrics.stored())
                rounds.append(metrics)
                get_run_logger().info(
                    "co-training round %s: real success %.3f, world model %s, eval pass@1 %s",
                    number,
                    metrics.real_success_rate,
                    learned.world_dir,
                    metrics.eval_pass_at_1,
                )
    except Interrupted as exc:
        stopped = Interrupted(stopped_line(run_id, config, rounds, learned), exc.signum)
        return Cancelled(message=str(stopped), data=stopped)  # the caller's call raises `stopped`
    result = CotrainResult(run_id=run_id, policy=learned.policy, world_model=learned.world_dir, rounds=rounds)
    finish_run(
        TrainingRun,
        run_id,
        RunStatus.COMPLETED,
        {"policy": result.policy, "world_model": result.world_model, "rounds": len(rounds)},
    )
    summarise_cotraining(config, result, eval_split)
    return result


def stopped_line(run_id: int, config: CotrainConfig, rounds: list[CotrainRound], learned: Learned | None) -> str:
    """What a stopped co-training run kept (its rounds done, the policy and world model they left) and how
    to go on: the same command from those models."""
    if not rounds or learned is None:
        return (
            f"co-training run {run_id} cancelled before its first round was done; nothing kept: "
            "run the command again to start over"
        )
    world_model = f" --world-model {learned.world_dir}" if learned.world_dir else ""
    return (
        f"co-training run {run_id} cancelled after round {len(rounds)} of {config.rounds}; its rounds' rows and "
        f"models kept (policy {learned.policy}, world model {learned.world_dir}); to go on from them, run the "
        f"command again with --model {learned.policy}{world_model}"
    )


def run_cotrain(config: CotrainConfig, progress: bool = False) -> CotrainResult:
    """Run the flow in this process, in a thread, SIGINT or SIGTERM stopping it (`run_stoppable_flow`):
    the run recorded `cancelled`, its flow run Cancelled, and `Interrupted` raised here, its line saying
    what was kept and how to go on."""
    return run_stoppable_flow(
        lambda: cotrain(config, progress=progress),
        _completed_first,
        "co-training stopped before its run was recorded; nothing kept",
    )


def _completed_first(result: CotrainResult) -> str:
    return f"co-training run {result.run_id} completed first; policy {result.policy}, world model {result.world_model}"
