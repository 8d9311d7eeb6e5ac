"""What an evaluation reports: the scores of a batch of trajectories, overall and per environment,
where its trajectories were written and, in simulated worlds, the world model's call counts.

Stored (an evaluation run's metrics in the catalog, `worldsmith eval --json`, Prefect artifacts, a
training run's `before` and `after`) in the shape these models serialize to with `model_dump`;
`model_validate` reads a stored record back, records written before agent errors were counted included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from worldsmith.jsonvalue import JsonObject, JsonValue

#: The prefix of a stored pass rate's key: `pass@1`, `pass@<k>`.
PASS_AT = "pass@"


class EvaluationScores(BaseModel):
    """Scores of a batch of trajectories (agent/trajectories.scores). env_error episodes count against
    the environment: they are left out of the pass rates and the mean reward.

    Stored as {"episodes", "tasks", "pass@1", "pass@<k>", "mean_reward", "mean_turns", "env_error_rate",
    "agent_error_rate", "format_error_rate"}: one pass key when k is 1, no agent_error_rate in records
    stored before agent errors were counted."""

    episodes: int = Field(description="Episodes scored.")
    tasks: int = Field(description="Distinct (env, task) pairs among them.")
    k: int = Field(1, ge=1, description="Samples per task: the k of pass@k.")
    pass_at_1: float = Field(description="Unbiased pass@1, the mean over tasks.")
    pass_at_k: float = Field(description="Unbiased pass@k, the mean over tasks (pass@1 when k is 1).")
    mean_reward: float
    mean_turns: float
    env_error_rate: float
    agent_error_rate: float | None = Field(
        None, description="None only in records stored before agent errors were counted."
    )
    format_error_rate: float

    def pass_at(self, k: int) -> float | None:
        """pass@`k` when these scores hold it (k is 1 or their own k), else None."""
        return self.pass_at_1 if k == 1 else self.pass_at_k if k == self.k else None

    @model_validator(mode="before")
    @classmethod
    def _from_stored(cls, data: Any) -> Any:
        """The stored `pass@<n>` keys as `pass_at_1`, `k` and `pass_at_k` (the largest n is k)."""
        if not isinstance(data, dict) or "pass_at_1" in data:
            return data
        rest = {key: value for key, value in data.items() if not str(key).startswith(PASS_AT)}
        ks = [
            int(key[len(PASS_AT) :]) for key in data if str(key).startswith(PASS_AT) and key[len(PASS_AT) :].isdigit()
        ]
        k = max(ks, default=1)
        return {**rest, "k": k, "pass_at_1": data.get(f"{PASS_AT}1"), "pass_at_k": data.get(f"{PASS_AT}{k}")}

    @model_serializer
    def _stored_shape(self) -> dict[str, float | int]:
        shape: dict[str, float | int] = {
            "episodes": self.episodes,
            "tasks": self.tasks,
            f"{PASS_AT}1": self.pass_at_1,
            f"{PASS_AT}{self.k}": self.pass_at_k,
            "mean_reward": self.mean_reward,
            "mean_turns": self.mean_turns,
            "env_error_rate": self.env_error_rate,
        }
        if self.agent_error_rate is not None:
            shape["agent_error_rate"] = self.agent_error_rate
        shape["format_error_rate"] = self.format_error_rate
        return shape


class EvaluationSummary(BaseModel):
    """An evaluation run's id and overall scores: what a training run records of its validation split
    before and after training. Stored flat: {"run_id", **scores}."""

    run_id: int
    scores: EvaluationScores

    @model_validator(mode="before")
    @classmethod
    def _from_stored(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "scores" in data:
            return data
        return {"run_id": data.get("run_id"), "scores": {k: v for k, v in data.items() if k != "run_id"}}

    @model_serializer(mode="wrap")
    def _stored_shape(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        fields = handler(self)
        return {"run_id": fields["run_id"], **fields["scores"]}


class SimulationCounts(BaseModel):
    """The world model's calls of a run in simulated worlds (worldmodel/simulated.SimulationStats):
    how many, their mean uncertainty, and the shares stopped as uncertain, invalid and inconsistent."""

    calls: int
    mean_uncertainty: float
    uncertain_rate: float
    invalid_rate: float
    inconsistent_rate: float


class TrajectoryFiles(BaseModel):
    """Where an evaluation run's trajectories were written: JSON lines and Parquet under
    WORLDSMITH_HOME, and the JSON lines' digest in the object store."""

    jsonl: str
    parquet: str
    digest: str


class EvaluationReport(BaseModel):
    """What the `evaluate` flow returns. Its run record's metrics hold the same less `run_id`
    (`stored()`); `simulation` is left out of the stored shape in the real worlds."""

    run_id: int
    overall: EvaluationScores
    per_env: dict[str, EvaluationScores] = Field(description="Scores per environment id, sorted by it.")
    world: str = Field("real", description="Where the episodes ran: `real`, or `simulated:<world model>`.")
    simulation: SimulationCounts | None = Field(None, description="The world model's calls; None in the real worlds.")
    trajectories: TrajectoryFiles

    def stored(self) -> JsonObject:
        """The metrics an evaluation run's record holds (JSON-ready)."""
        return self.model_dump(mode="json", exclude={"run_id"})

    @model_serializer(mode="wrap")
    def _stored_shape(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        fields: JsonObject = handler(self)
        if fields.get("simulation", ...) is None:
            del fields["simulation"]
        return fields


def stored_overall(metrics: Mapping[str, JsonValue]) -> EvaluationScores | None:
    """The overall scores of an evaluation run's stored metrics; None while it runs or when it failed."""
    overall = metrics.get("overall")
    return None if overall is None else EvaluationScores.model_validate(overall)
