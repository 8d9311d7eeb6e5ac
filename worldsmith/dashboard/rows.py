"""The rows and blocks the dashboard shows (dashboard/data.py, dashboard/drilldown.py), as TypedDicts: the JSON
of `/api/summary` and what the templates and charts read, by key."""

from __future__ import annotations

from typing import Literal, TypedDict

from worldsmith.jsonvalue import JsonValue

#: A stage's series over the nights, by rate or usage key (`first_attempt_success` ... `cost_usd`): one value per
#: night, None where the stage did not run that night.
StageSeries = dict[str, list[float | None]]


class Usage(TypedDict):
    """Attempts, tokens in and out, cost (USD) and seconds of some stage attempts."""

    attempts: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    seconds: float


class NightRunRow(Usage):
    """A generation run with attempts on a night (`night_runs`)."""

    run_id: str
    flow_run_id: str | None
    first: str | None
    last: str | None
    worlds: int
    failed_attempts: int


class NightStageRow(Usage):
    """A stage that ran on a night (`night_stages`); its failure classes: error class -> failed attempts."""

    stage: str
    worlds: int
    invocations: int
    first_attempt_success: int
    repaired: int
    failed_attempts: int
    failure_classes: dict[str, int]


class StageWorldRow(Usage):
    """A world that ran a stage on a night (`stage_worlds`), with its latest version's status."""

    env_id: str | None
    succeeded: bool
    failed_attempts: int
    failure_classes: dict[str, int]
    status: str


class WorldRow(Usage):
    """A world with stage attempts (`worlds_page`): its latest version's status, failed stage and reason."""

    env_id: str
    status: str
    failed_stage: str | None
    failure_reason: str | None


class VersionRow(TypedDict):
    """A published version (`failed_worlds`, `world_versions`)."""

    env_id: str
    version: int
    status: str
    failed_stage: str | None
    failure_reason: str | None
    backend: str | None
    model: str | None
    created_at: str | None


class AttemptRow(TypedDict):
    """One stage attempt in full (`world_attempts`, `attempt`)."""

    id: int | None
    run_id: str
    flow_run_id: str | None
    env_id: str | None
    stage: str
    attempt: int
    outcome: str
    error_class: str | None
    error_text: str | None
    tokens_in: int
    tokens_out: int
    cost_usd: float
    seconds: float
    created_at: str | None


class FailureClasses(TypedDict):
    """Failed attempts per night by `stage: error class`, each series aligned with `nights`."""

    nights: list[str]
    series: dict[str, list[int]]


class GenerationByNight(TypedDict):
    """Per stage, its rates and usage over `nights`."""

    nights: list[str]
    stages: dict[str, StageSeries]


class NightUsage(TypedDict):
    """A night's generation runs, worlds attempted, attempts, tokens and cost."""

    runs: int
    worlds: int
    attempts: int
    tokens_in: int
    tokens_out: int
    cost_usd: float


class NightRow(NightUsage):
    """A night of generation (`generation_nights`): its backends, usage and the worlds published good and failed."""

    night: str
    backend: str
    good: int
    failed: int


class PassedFailed(TypedDict):
    passed: int
    failed: int


class QualitySummary(TypedDict):
    """Versions by status, per quality check kind the versions that passed and failed, failure reasons by count."""

    versions: dict[str, int]
    checks: dict[str, PassedFailed]
    failure_reasons: dict[str, int]


class SetRow(TypedDict):
    """An environment set and its members per split."""

    name: str
    members: int
    train: int
    validation: int
    created_at: str


#: The rates of an evaluation row (its keys).
EvaluationRate = Literal["pass@1", "env_error_rate", "format_error_rate", "agent_error_rate"]

EvaluationRow = TypedDict(
    "EvaluationRow",
    {
        "id": int | None,
        "policy": str,
        "world": str,
        "set": str,
        "samples": int,
        "status": str,
        "pass@1": float | None,
        "pass@k": float | None,
        "env_error_rate": float | None,
        "format_error_rate": float | None,
        "agent_error_rate": float | None,
        "episodes": int | None,
        "error": str | None,
        "started_at": str,
    },
)
"""An evaluation run: policy, set, status (error when it failed), pass@1, pass@k, the error rates (None while it
runs or when it failed)."""


class RunHead(TypedDict):
    """A training or co-training run: what it trains, on which set, its status and its steps (rounds)."""

    id: int | None
    kind: str
    model: JsonValue  # as the run's config records it
    set: str
    status: str
    error: str | None
    steps: list[int]


class TrainingSeries(TypedDict):
    """A training run's per-step metrics (None where a step recorded none)."""

    reward: list[JsonValue]
    success_rate: list[JsonValue]
    loss: list[JsonValue]
    reward_real: list[JsonValue]
    reward_imagined: list[JsonValue]
    judge_cost_usd: list[JsonValue]
    judge_latency_s: list[JsonValue]


CotrainSeries = TypedDict(
    "CotrainSeries",
    {
        "real_success_rate": list[JsonValue],
        "eval_pass@1": list[JsonValue],
        "wm_accuracy_fresh": list[JsonValue],
        "imagined_rate": list[JsonValue],
        "stopped_rate": list[JsonValue],
        "wm_loss": list[JsonValue],
    },
)
"""A co-training run's per-round metrics (None where a round recorded none)."""

#: The per-round series of a co-training run the chart draws.
CotrainLine = Literal["real_success_rate", "eval_pass@1", "wm_accuracy_fresh"]


class TrainingRow(RunHead, TrainingSeries):
    started_at: str


class CotrainingRow(RunHead, CotrainSeries):
    started_at: str


class StalledRow(TypedDict):
    """A problem that keeps runs from starting (a pool with no live worker, with its fix), once, with the
    deployments it holds up that have runs due, and how many runs are due."""

    problem: str
    deployments: list[str]
    due: int


class Summary(TypedDict):
    """Everything the front page shows (`/api/summary`)."""

    filters: dict[str, str]
    backends: list[str]
    generation: GenerationByNight
    nights: list[NightRow]
    failure_classes: FailureClasses
    environments: list[WorldRow]
    environments_total: int
    failed_worlds: list[VersionRow]
    failed_worlds_total: int
    quality: QualitySummary
    sets: list[SetRow]
    evaluations: list[EvaluationRow]
    training: list[TrainingRow]
    cotraining: list[CotrainingRow]


class ScenarioRunRow(Usage):
    """A generation run that ran the scenario stage on a night (`dashboard/runs.scenario_runs`): whether the
    stage ended in a success for it (never for a run that died in it), and the run's status."""

    run_id: str
    succeeded: bool
    failed_attempts: int
    run_status: str | None
    error: str | None
