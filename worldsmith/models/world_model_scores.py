"""What a world model's evaluation against the real worlds reports (worldmodel/evaluation.py): one-step
scores overall and per environment, self-consistency, and the k-step compound error. Printed by
`worldsmith wm eval --json` in the shape these models serialize to with `model_dump`."""

from __future__ import annotations

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from worldsmith.jsonvalue import JsonObject


class PrecisionRecall(BaseModel):
    """Precision, recall and F1 of predicted facts (diff rows or fields) against the true ones."""

    precision: float
    recall: float
    f1: float


class TransitionScores(BaseModel):
    """One-step scores of a group of transitions: observation exact match, outcome agreement, invalid
    answers, and the predicted diffs' precision/recall/F1 at row and field level."""

    transitions: int
    observation_exact: float
    outcome_agreement: float
    invalid_rate: float
    rows: PrecisionRecall
    fields: PrecisionRecall


class SelfConsistency(BaseModel):
    """How often `samples` predictions of a call agree with their most common answer, and the accuracy
    of consistent against inconsistent transitions (None: there were none)."""

    samples: int
    mean_agreement: float
    consistent: int
    inconsistent: int
    accuracy_when_consistent: float | None
    accuracy_when_inconsistent: float | None


class OneStepScores(TransitionScores):
    """One-step scores overall (the fields of TransitionScores), per environment, and with several
    samples per call their self-consistency (left out of the serialized shape when None)."""

    per_env: dict[str, TransitionScores] = Field(default_factory=dict, description="Per environment id, sorted.")
    self_consistency: SelfConsistency | None = None

    @model_serializer(mode="wrap")
    def _printed_shape(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        fields: JsonObject = handler(self)
        if fields.get("self_consistency", ...) is None:
            del fields["self_consistency"]
        return fields


class KStepScore(BaseModel):
    """Step `step` of k-step predictions (the model's own earlier predictions fed back), over the
    `episodes` with that many calls; compound_error is 1 - observation_exact."""

    step: int
    episodes: int
    observation_exact: float
    compound_error: float
    fields_f1: float


class KStepScores(BaseModel):
    """k-step scores, one per step that some episode reached."""

    k: int
    steps: list[KStepScore]


class WorldModelReport(BaseModel):
    """The full evaluation of world model `model`: one step and k steps."""

    model: str
    one_step: OneStepScores
    k_step: KStepScores
