"""`worldsmith wm eval`: a world model scored against the real worlds' transitions.

- one step: each call predicted from the real state and history; observation exact match,
  outcome agreement, invalid answers, diff precision/recall/F1 at row and field level, overall
  and per environment;
- k steps: each episode's first k calls predicted in turn with the model's own earlier
  predictions fed back (its observations as the history; the rows of the first call carried
  forward by its predicted diffs as the state), compared step by step with the real replay; the
  compound error at step j is 1 - observation exact match there;
- self-consistency: with `samples` > 1, how often the samples agree with their most common answer,
  and the accuracy of consistent against inconsistent transitions (an uncertainty signal).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.world_model_scores import (
    KStepScore,
    KStepScores,
    OneStepScores,
    SelfConsistency,
    TransitionScores,
    WorldModelReport,
)
from worldsmith.worldmodel.scoring import Counts, facts, observation_match, outcome_agreement
from worldsmith.worldmodel.transitions import HistoryEntry, ObservationRecord, Transition, diff_part
from worldsmith.worldmodel.world_models import Prediction, WorldModel, consensus


@dataclass
class Tally:
    """Running one-step scores of a group of transitions."""

    n: int = 0
    exact: int = 0
    agree: int = 0
    invalid: int = 0
    rows: Counts = field(default_factory=Counts)
    fields: Counts = field(default_factory=Counts)

    def add(self, prediction: Prediction, truth: Transition) -> bool:
        """Count `prediction` against the recorded `truth`; whether its observation matched."""
        if truth.observation is None:
            raise ValueError(f"transition {truth.episode}#{truth.index} is a query: no recorded observation to score")
        self.n += 1
        hit = observation_match(prediction.observation, truth.observation)
        self.exact += hit
        self.agree += outcome_agreement(prediction.observation, truth.observation)
        self.invalid += prediction.observation is None
        (pred_rows, pred_fields), (true_rows, true_fields) = facts(prediction.diff), facts(truth.diff)
        self.rows.add(pred_rows, true_rows)
        self.fields.add(pred_fields, true_fields)
        return hit

    def scores(self) -> TransitionScores:
        n = self.n or 1
        return TransitionScores(
            transitions=self.n,
            observation_exact=self.exact / n,
            outcome_agreement=self.agree / n,
            invalid_rate=self.invalid / n,
            rows=self.rows.scores(),
            fields=self.fields.scores(),
        )


def one_step(model: WorldModel, transitions: list[Transition], samples: int = 1) -> OneStepScores:
    """Scores of single-call predictions from the real state, overall and per environment."""
    overall = Tally()
    per_env: defaultdict[str, Tally] = defaultdict(Tally)
    consistency: list[float] = []
    consistent_hits: list[bool] = []
    inconsistent_hits: list[bool] = []
    for transition in transitions:
        predictions = model.predict(transition, transition.history, samples)
        hit = overall.add(predictions[0], transition)
        per_env[transition.env_id].add(predictions[0], transition)
        if samples > 1:
            share = consensus(predictions)[1]
            consistency.append(share)
            (consistent_hits if share == 1.0 else inconsistent_hits).append(hit)
    self_consistency = (
        SelfConsistency(
            samples=samples,
            mean_agreement=sum(consistency) / len(consistency) if consistency else 1.0,
            consistent=len(consistent_hits),
            inconsistent=len(inconsistent_hits),
            accuracy_when_consistent=sum(consistent_hits) / len(consistent_hits) if consistent_hits else None,
            accuracy_when_inconsistent=sum(inconsistent_hits) / len(inconsistent_hits) if inconsistent_hits else None,
        )
        if samples > 1
        else None
    )
    return OneStepScores(
        **overall.scores().model_dump(),
        per_env={env: tally.scores() for env, tally in sorted(per_env.items())},
        self_consistency=self_consistency,
    )


def apply_diff(rows: dict[str, list[JsonObject]], diff: Mapping[str, JsonValue]) -> dict[str, list[JsonObject]]:
    """`rows` (table -> rows) after `diff`: inserted rows added, updated rows replaced, deleted rows
    removed (malformed parts skipped)."""
    out = copy.deepcopy(rows)
    for table, changes in (diff or {}).items():
        if not isinstance(changes, dict):
            continue
        current = out.setdefault(table, [])
        for change in diff_part(changes, "updated"):
            if not isinstance(change, dict):
                continue
            key, after = change.get("key") or {}, change.get("after")
            if isinstance(key, dict) and isinstance(after, dict):
                current[:] = [after if all(r.get(k) == v for k, v in key.items()) else r for r in current]
        for row in diff_part(changes, "deleted"):
            current[:] = [r for r in current if r != row]
        current.extend(r for r in diff_part(changes, "inserted") if isinstance(r, dict))
        if not current:
            del out[table]
    return out


def k_step(model: WorldModel, transitions: list[Transition], k: int) -> KStepScores:
    """Per step 1..k: observation exact match, field F1 and compound error of predictions made
    with the model's own earlier predictions fed back, over every episode with that many calls."""
    episodes: dict[str, list[Transition]] = defaultdict(list)
    for transition in transitions:
        episodes[transition.episode].append(transition)
    per_step = [Tally() for _ in range(k)]
    for calls in episodes.values():
        calls.sort(key=lambda t: t.index)
        rows = calls[0].rows
        history: list[HistoryEntry] = []
        for step, truth in enumerate(calls[:k]):
            seen = truth.model_copy(update={"rows": rows})
            (prediction,) = model.predict(seen, history, 1)
            per_step[step].add(prediction, truth)
            observation: ObservationRecord = (
                prediction.observation.record()
                if prediction.observation
                else {"status": "invalid", "value": None, "error": None}
            )
            history.append({"action": truth.action, "observation": observation})
            rows = apply_diff(rows, prediction.diff)
    steps = []
    for number, tally in enumerate(per_step, start=1):
        if tally.n:
            scores = tally.scores()
            steps.append(
                KStepScore(
                    step=number,
                    episodes=tally.n,
                    observation_exact=scores.observation_exact,
                    compound_error=1.0 - scores.observation_exact,
                    fields_f1=scores.fields.f1,
                )
            )
    return KStepScores(k=k, steps=steps)


def evaluate_world_model(
    model: WorldModel, transitions: list[Transition], *, k: int = 3, samples: int = 1
) -> WorldModelReport:
    """The full report: one step (with self-consistency when samples > 1) and k steps."""
    return WorldModelReport(
        model=model.name, one_step=one_step(model, transitions, samples), k_step=k_step(model, transitions, k)
    )
