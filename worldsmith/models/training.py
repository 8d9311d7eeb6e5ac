"""What training returns: the training step's outcome (GRPO here or in launched processes), the
`train` flow's result, a world-model training run's, and the `cotrain` flow's rounds.

Stored in the shape these models serialize to with `model_dump`: a training run's metrics in the
catalog (the flow's result less its per-step log), the launched training's OUTPUT/result.json, the
co-training rounds' step rows, `--json` output; `model_validate` reads them back.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from worldsmith.jsonvalue import JsonObject
from worldsmith.models.evaluation import EvaluationSummary, SimulationCounts

#: One logged optimizer step: its number (`step`) and its numeric metrics (loss, reward, ...).
StepMetrics = dict[str, float | int]


class SuccessRate(BaseModel):
    """The share of `rollouts` rollouts, sampled as in training, that ended complete."""

    rate: float
    rollouts: int


class SuccessRates(BaseModel):
    """A training run's success rate on its own tasks before and after training (TrainingConfig.success_samples),
    and on held-out tasks of the same kind (the same tools, other records) when the set has any."""

    before: SuccessRate
    after: SuccessRate
    held_out_before: SuccessRate | None = None
    held_out_after: SuccessRate | None = None
    held_out_tasks: int = Field(0, description="Held-out tasks measured (curriculum.held_out_bundles).")


class TrainerOutcome(BaseModel):
    """What the training step returns (training/launch.run_training, on every process); a launched
    run's main process writes it to OUTPUT/result.json, which `launch` reads back."""

    final: str = Field(description="The final model's directory.")
    steps: int = Field(description="Optimizer steps taken (the last step's number).")
    checkpoints: list[tuple[int, str]] = Field(
        default_factory=list, description="Trainer checkpoints stored in the object store: (step, digest)."
    )
    log: list[StepMetrics] = Field(default_factory=list, description="Each logged step's metrics (main process).")
    processes: int = Field(1, description="Processes that trained.")
    main: bool = Field(True, description="Whether this is the main process's outcome.")
    simulation: SimulationCounts | None = Field(None, description="The world model's calls in simulated training.")
    success: SuccessRates | None = None

    def last_step(self) -> StepMetrics:
        """The last logged step's metrics (empty when none was logged)."""
        return self.log[-1] if self.log else {}


class TrainResult(BaseModel):
    """What the `train` flow returns. Its run record's metrics hold the same less the per-step log
    (`stored()`), whose steps are the run's step rows."""

    run_id: int
    model: str = Field(description="The model trained from (a directory, or a Hugging Face id).")
    final: str = Field(description="The final model's directory.")
    checkpoint: str = Field(description="The final model's digest in the object store.")
    steps: int
    before: EvaluationSummary | None = Field(
        None, description="The validation split before training (None: not evaluated)."
    )
    after: EvaluationSummary | None = Field(
        None, description="The validation split after training (None: not evaluated)."
    )
    simulation: SimulationCounts | None = None
    success: SuccessRates | None = None
    log: list[StepMetrics] = Field(default_factory=list)
    resumed_from: int | None = Field(
        None, description="The step of the trainer checkpoint a resumed run continued from."
    )

    def stored(self) -> JsonObject:
        """The metrics a training run's record holds (JSON-ready)."""
        return self.model_dump(mode="json", exclude={"log"})


class WorldModelTrainResult(BaseModel):
    """A world-model training run (training/world_model_runs.train_world_model). Its run record's
    metrics hold the same less the per-step log (`stored()`)."""

    run_id: int
    model: str = Field(description="The fine-tuned world model's directory.")
    checkpoint: str = Field(description="Its digest in the object store.")
    steps: int
    log: list[StepMetrics] = Field(default_factory=list, description="The logged losses.")

    def stored(self) -> JsonObject:
        """The metrics a world-model training run's record holds (JSON-ready)."""
        return self.model_dump(mode="json", exclude={"log"})


class CotrainRound(BaseModel):
    """What one co-training round records (flows/cotrain.py; docs/world-models.md): its real
    evaluation, the transitions, the world model's fresh accuracy and training, the imagined GRPO run,
    the evaluation after it. Stored as the round's step row without its None values; `eval_pass@1`
    is its stored name."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    round: int
    real_evaluation: int
    real_success_rate: float
    real_episodes: int
    transitions_new: int
    transitions: int
    wm_accuracy_fresh: float | None = None
    wm_fields_f1_fresh: float | None = None
    wm_run: int | None = None
    wm_loss: float | None = None
    policy_run: int
    policy_reward: float | None = None
    policy_reward_real: float | None = None
    policy_reward_imagined: float | None = None
    imagined_rate: float | None = None
    imagined_calls: int = 0
    stopped_rate: float | None = None
    invalid_rate: float | None = None
    mean_uncertainty: float | None = None
    eval_split: str
    eval_evaluation: int | None = None
    eval_pass_at_1: float | None = Field(None, alias="eval_pass@1")
    seconds: float

    def stored(self) -> JsonObject:
        """The round's step row (JSON-ready; None values left out)."""
        return self.model_dump(mode="json", exclude_none=True)


class CotrainResult(BaseModel):
    """What the `cotrain` flow returns: the run, the final policy and world model, every round."""

    run_id: int
    policy: str = Field(description="The final policy's directory.")
    world_model: str | None = Field(description="The final world model's directory.")
    rounds: list[CotrainRound]
