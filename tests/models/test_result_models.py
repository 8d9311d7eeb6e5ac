"""The typed results that cross package boundaries (evaluation reports, world outcomes, training
results, trajectories) against the shapes stored in the catalog, in JSON lines and in result files:
each round-trips, a record stored in the older dict form still loads, and the readers of stored
records take them. No sandbox, no Prefect."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from worldsmith.agent.judge import majority, parse_vote
from worldsmith.agent.loop import Trajectory
from worldsmith.agent.trajectories import read_jsonl, scores, write_jsonl
from worldsmith.models.evaluation import (
    EvaluationReport,
    EvaluationScores,
    EvaluationSummary,
    SimulationCounts,
    TrajectoryFiles,
    stored_overall,
)
from worldsmith.models.generation import WorldOutcome
from worldsmith.models.training import (
    CotrainRound,
    SuccessRate,
    SuccessRates,
    TrainerOutcome,
    TrainResult,
    WorldModelTrainResult,
)
from worldsmith.models.verdict import Verdict
from worldsmith.models.world_model_scores import OneStepScores, PrecisionRecall, SelfConsistency
from worldsmith.training.success import success_line

pytestmark = pytest.mark.unit

#: An evaluation's overall scores as the catalog stores them (k = 3).
STORED_SCORES = {
    "episodes": 6,
    "tasks": 2,
    "pass@1": 0.5,
    "pass@3": 1.0,
    "mean_reward": 0.55,
    "mean_turns": 2.5,
    "env_error_rate": 0.0,
    "agent_error_rate": 0.25,
    "format_error_rate": 0.0,
}
#: The same, as stored before agent errors were counted.
OLD_SCORES = {k: v for k, v in STORED_SCORES.items() if k != "agent_error_rate"}
FILES = {"jsonl": "/h/evaluations/7/trajectories.jsonl", "parquet": "/h/evaluations/7/t.parquet", "digest": "ab12"}


def trajectory(env_id: str, task_id: str, verdict: str, reward: float | None, turns: int = 2) -> Trajectory:
    return Trajectory(
        env_id=env_id,
        env_key="key",
        task_id=task_id,
        policy="scripted",
        messages=[],
        steps=[],
        turns=turns,
        verdict=verdict,
        reward=reward,
    )


def test_scores_round_trip_through_their_stored_shape():
    scores_ = EvaluationScores.model_validate(STORED_SCORES)
    assert (scores_.k, scores_.pass_at_1, scores_.pass_at_k, scores_.agent_error_rate) == (3, 0.5, 1.0, 0.25)
    assert scores_.pass_at(1) == 0.5 and scores_.pass_at(3) == 1.0 and scores_.pass_at(2) is None
    dumped = scores_.model_dump()
    assert dumped == STORED_SCORES and list(dumped) == list(STORED_SCORES)  # same keys, same order
    assert json.loads(scores_.model_dump_json()) == STORED_SCORES
    old = EvaluationScores.model_validate(OLD_SCORES)
    assert old.agent_error_rate is None and old.model_dump() == OLD_SCORES
    one_sample = {k: v for k, v in STORED_SCORES.items() if k != "pass@3"}
    single = EvaluationScores.model_validate(one_sample)
    assert single.k == 1 and single.pass_at_k == single.pass_at_1 and single.model_dump() == one_sample
    with pytest.raises(ValidationError):
        EvaluationScores.model_validate({k: v for k, v in STORED_SCORES.items() if not k.startswith("pass@")})


def _scored_batch() -> list[Trajectory]:
    """Two samples of each of two tasks: t1 complete once, t2 partial once and once an env_error."""
    return [
        trajectory("shop", "t1", "complete", 1.0),
        trajectory("shop", "t1", "agent_error", 0.0),
        trajectory("shop", "t2", "partial", 0.1),
        trajectory("shop", "t2", "env_error", None),
    ]


def test_scores_count_each_typed_verdict_of_the_trajectories():
    batch = _scored_batch()
    assert all(isinstance(t.verdict, Verdict) for t in batch)
    result = scores(batch, k=2)
    assert (result.episodes, result.tasks, result.k) == (4, 2, 2)
    assert result.pass_at_1 == 0.25 and result.pass_at_k == 0.5  # t1: 1 of 2 complete; t2's env_error left out
    assert result.env_error_rate == result.agent_error_rate == 0.25 and result.mean_reward == pytest.approx(1.1 / 3)


def test_scores_of_trajectories_are_stored_under_their_old_keys():
    assert list(scores(_scored_batch(), k=2).model_dump()) == [
        "episodes",
        "tasks",
        "pass@1",
        "pass@2",
        "mean_reward",
        "mean_turns",
        "env_error_rate",
        "agent_error_rate",
        "format_error_rate",
    ]


def test_an_evaluation_report_is_stored_without_its_run_id():
    overall = EvaluationScores.model_validate(STORED_SCORES)
    report = EvaluationReport(
        run_id=7, overall=overall, per_env={"shop": overall}, trajectories=TrajectoryFiles(**FILES)
    )
    stored = report.stored()
    assert stored == {
        "overall": STORED_SCORES,
        "per_env": {"shop": STORED_SCORES},
        "world": "real",
        "trajectories": FILES,
    }
    assert list(report.model_dump()) == ["run_id", "overall", "per_env", "world", "trajectories"]  # --json
    counts = SimulationCounts(
        calls=4, mean_uncertainty=0.25, uncertain_rate=0.0, invalid_rate=0.0, inconsistent_rate=0.5
    )
    simulated = report.model_copy(update={"world": "simulated:code", "simulation": counts})
    assert simulated.stored()["simulation"] == counts.model_dump() and list(simulated.stored())[3] == "simulation"


def test_an_evaluation_report_reads_back_from_a_record_older_than_agent_errors():
    """An evaluation run's metrics as the catalog holds them, written before agent errors were counted."""
    record = {
        "parameters": {"set_name": "s", "policy": "reference"},
        "process": {"pid": 1, "host": "h"},
        "overall": OLD_SCORES,
        "per_env": {"shop": OLD_SCORES},
        "world": "real",
        "trajectories": FILES,
    }
    read = EvaluationReport.model_validate({**record, "run_id": 7})
    assert read.overall.agent_error_rate is None and read.stored() == {
        k: v for k, v in record.items() if k not in ("parameters", "process")
    }
    assert stored_overall(record) == read.overall
    assert stored_overall({"parameters": {}}) is None and stored_overall({"error": "boom"}) is None


def test_an_evaluation_summary_is_stored_flat():
    summary = EvaluationSummary.model_validate({"run_id": 3, **OLD_SCORES})
    assert summary.run_id == 3 and summary.scores.pass_at_1 == 0.5
    assert summary.model_dump() == {"run_id": 3, **OLD_SCORES} and list(summary.model_dump())[0] == "run_id"


def test_trajectories_keep_their_json_lines(tmp_path):
    old = {  # a line written before trajectories recorded their world, tools, turns and judge
        "env_id": "shop",
        "env_key": "key",
        "task_id": "t1",
        "policy": "reference",
        "messages": [{"role": "user", "content": "Cancel order 7."}],
        "steps": [],
        "turns": 1,
        "answer": "Done.",
        "verdict": "partial",
        "reward": 0.1,
    }
    (tmp_path / "old.jsonl").write_text(json.dumps(old) + "\n")
    (read,) = read_jsonl(tmp_path / "old.jsonl")
    assert read.verdict is Verdict.partial and read.verdict == "partial" and read.world == "real"
    again = json.loads(write_jsonl([read], tmp_path / "again.jsonl").read_text())
    assert again["verdict"] == "partial" and {k: again[k] for k in old if k != "messages"} == {
        k: v for k, v in old.items() if k != "messages"
    }
    with pytest.raises(ValidationError):
        trajectory("shop", "t1", "solved", 1.0)  # not a verdict


def test_judge_rulings_are_verdicts():
    assert parse_vote('{"verdict": "partial", "reason": "half"}') == (Verdict.partial, "half")
    assert parse_vote('{"verdict": "great"}')[0] is None
    assert majority([Verdict.complete, Verdict.agent_error], Verdict.incomplete) is Verdict.agent_error
    assert majority([Verdict.complete, Verdict.partial], None) is Verdict.partial  # the stricter ruling


def test_a_world_outcome_keeps_its_artifact_row():
    row = {
        "env_id": "shop_1",
        "scenario": "A shop",
        "status": "duplicate",
        "ref": "twin@1",
        "failed_stage": None,
        "reason": "identical to twin@1",
        "built_by": "host:12",
    }
    outcome = WorldOutcome.model_validate(row)
    assert outcome.good and outcome.model_dump(mode="json") == row and list(outcome.model_dump()) == list(row)
    failed = WorldOutcome(env_id="x", scenario="X", built_by="host:1")
    assert (failed.status, failed.good) == ("failed", False)
    with pytest.raises(ValidationError):
        failed.status = "lost"  # assignments are validated


def test_the_training_steps_result_file_round_trips(tmp_path):
    written = {  # OUTPUT/result.json as the launched main process writes it
        "final": "/out/final",
        "steps": 2,
        "checkpoints": [[1, "d1"], [2, "d2"]],
        "log": [{"step": 1, "loss": 0.5, "reward": 0.1}, {"step": 2, "loss": 0.25, "reward": 0.3}],
        "processes": 2,
        "main": True,
        "simulation": None,
        "success": {
            "before": {"rate": 0.0, "rollouts": 8},
            "after": {"rate": 0.5, "rollouts": 8},
            "held_out_before": None,
            "held_out_after": None,
            "held_out_tasks": 0,
        },
    }
    outcome = TrainerOutcome.model_validate_json(json.dumps(written))
    assert outcome.checkpoints == [(1, "d1"), (2, "d2")] and outcome.last_step() == {
        "step": 2,
        "loss": 0.25,
        "reward": 0.3,
    }
    assert isinstance(outcome.log[0]["step"], int)  # step numbers stay integers
    assert json.loads(json.dumps(outcome.model_dump(mode="json"))) == written
    assert success_line(outcome.success) == "0.000 -> 0.500 (8 rollouts each)"
    held_out = outcome.success.model_copy(
        update={
            "held_out_before": SuccessRate(rate=0.25, rollouts=4),
            "held_out_after": SuccessRate(rate=0.5, rollouts=4),
        }
    )
    assert success_line(held_out) == (
        "0.000 -> 0.500 (8 rollouts each); held-out tasks of the same kind 0.250 -> 0.500 (4 rollouts each)"
    )


def _train_result() -> TrainResult:
    return TrainResult(
        run_id=9,
        model="/m/tiny",
        final="/out/final",
        checkpoint="c0ffee",
        steps=2,
        before=EvaluationSummary.model_validate({"run_id": 4, **STORED_SCORES}),
        success=SuccessRates(before=SuccessRate(rate=0.0, rollouts=8), after=SuccessRate(rate=0.5, rollouts=8)),
        log=[{"step": 1, "reward": 0.1}],
    )


def test_a_train_result_is_stored_without_its_log():
    result = _train_result()
    stored = result.stored()
    assert list(stored) == [
        "run_id",
        "model",
        "final",
        "checkpoint",
        "steps",
        "before",
        "after",
        "simulation",
        "success",
        "resumed_from",
    ]
    assert stored["before"] == {"run_id": 4, **STORED_SCORES} and stored["after"] is None
    assert TrainResult.model_validate(stored) == result.model_copy(update={"log": []})
    world_model = WorldModelTrainResult(run_id=2, model="/wm", checkpoint="d", steps=3, log=[{"loss": 1.0, "step": 3}])
    assert world_model.stored() == {"run_id": 2, "model": "/wm", "checkpoint": "d", "steps": 3}


def test_a_train_result_stored_before_success_rates_or_resuming_loads():
    stored = _train_result().stored()
    old = {k: v for k, v in stored.items() if k not in ("success", "resumed_from", "simulation")}
    old["before"] = {"run_id": 4, **OLD_SCORES}
    read = TrainResult.model_validate({**old, "process": {"pid": 1}})
    assert read.success is None and read.resumed_from is None and read.before.scores.agent_error_rate is None


def test_a_cotrain_round_is_stored_by_its_recorded_names():
    row = CotrainRound(
        round=1,
        real_evaluation=3,
        real_success_rate=0.25,
        real_episodes=4,
        transitions_new=5,
        transitions=5,
        policy_run=6,
        eval_split="train",
        eval_evaluation=7,
        eval_pass_at_1=0.5,
        seconds=12.0,
    )
    stored = row.stored()
    assert stored["eval_pass@1"] == 0.5 and "wm_accuracy_fresh" not in stored and stored["imagined_calls"] == 0
    assert row.model_dump()["wm_accuracy_fresh"] is None  # the flow's result keeps the Nones
    assert CotrainRound.model_validate(stored) == row


def test_world_model_scores_leave_out_self_consistency_with_one_sample():
    perfect = PrecisionRecall(precision=1.0, recall=1.0, f1=1.0)
    group = {"transitions": 2, "observation_exact": 1.0, "outcome_agreement": 1.0, "invalid_rate": 0.0}
    one = OneStepScores(**group, rows=perfect, fields=perfect, per_env={})
    assert "self_consistency" not in one.model_dump() and one.model_dump()["rows"] == perfect.model_dump()
    consistency = SelfConsistency(
        samples=2,
        mean_agreement=1.0,
        consistent=2,
        inconsistent=0,
        accuracy_when_consistent=1.0,
        accuracy_when_inconsistent=None,
    )
    sampled = one.model_copy(update={"self_consistency": consistency})
    assert sampled.model_dump()["self_consistency"]["accuracy_when_inconsistent"] is None
    assert OneStepScores.model_validate(sampled.model_dump()) == sampled


def test_every_reader_of_stored_run_records_sees_the_same_metrics(home):
    from worldsmith.dashboard.data import evaluations
    from worldsmith.models.catalog import EvaluationRun, TrainingRun
    from worldsmith.models.runs import RunKind
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.run_listing import evaluation_runs, training_runs
    from worldsmith.storage.run_records import add_run, finish_run

    overall = EvaluationScores.model_validate(STORED_SCORES)
    report = EvaluationReport(run_id=0, overall=overall, per_env={}, trajectories=TrajectoryFiles(**FILES))
    new = add_run(EvaluationRun(policy="random", samples=3))
    finish_run(EvaluationRun, new, "completed", report.stored())
    old = add_run(EvaluationRun(policy="reference", samples=1))
    finish_run(EvaluationRun, old, "completed", {"overall": {**OLD_SCORES, "pass@1": 1.0}})
    failed = add_run(EvaluationRun(policy="reference", samples=1))
    finish_run(EvaluationRun, failed, "failed", {"error": "boom"})
    trained = add_run(TrainingRun(config={"model": "tiny"}))
    before = EvaluationSummary(run_id=old, scores=EvaluationScores.model_validate(OLD_SCORES))
    result = TrainResult(run_id=trained, model="tiny", final="/f", checkpoint="c", steps=2, before=before)
    finish_run(TrainingRun, trained, "completed", result.stored())
    with open_catalog().session() as session:
        listed = {int(r["id"]): r["metrics"] for r in evaluation_runs(session)}
        shown = {e["id"]: e for e in evaluations(session)}
        (training,) = training_runs(session, {RunKind.TRAIN})
    assert listed[new] == {
        "pass@1": 0.5,
        "pass@3": 1.0,
        "episodes": 6,
        "env_error_rate": 0.0,
        "agent_error_rate": 0.25,
        "format_error_rate": 0.0,
    }
    assert listed[old]["pass@1"] == 1.0 and listed[old]["agent_error_rate"] is None
    assert set(listed[failed].values()) == {None}
    assert (shown[new]["pass@k"], shown[old]["pass@k"], shown[failed]["pass@1"]) == (1.0, 1.0, None)
    assert training["metrics"]["pass@1_before"] == 0.5 and training["metrics"]["pass@1_after"] is None
