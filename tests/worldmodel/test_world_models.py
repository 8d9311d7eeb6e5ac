"""World-model data and evaluation against the real worlds: env-disjoint transition splits, exact
scores of an oracle and of deliberately wrong models, k-step compound error, self-consistency,
an OpenAI-compatible model on a local server, and the `wm` commands."""

from __future__ import annotations

import json

import pytest
from support.llm_server import ScriptedLLM, json_reply, text_reply
from typer.testing import CliRunner

from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import RandomPolicy, ReferencePolicy
from worldsmith.agent.trajectories import write_jsonl
from worldsmith.cli import app
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.world_model_scores import PrecisionRecall
from worldsmith.worldmodel.evaluation import apply_diff, evaluate_world_model, k_step, one_step
from worldsmith.worldmodel.scoring import facts
from worldsmith.worldmodel.transitions import (
    Observation,
    build_transitions,
    read_transitions,
    split_of,
    write_transitions,
)
from worldsmith.worldmodel.world_models import OpenAIWorldModel, OracleWorldModel, Prediction, StaticWorldModel, target

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def worlds(golden):
    return [golden, procedural_bundle("retail", 3), procedural_bundle("clinic", 3), procedural_bundle("banking", 3)]


@pytest.fixture(scope="module")
def trajectories(worlds, runtime):
    """Reference episodes of every task and random episodes (tool errors included) of the first tasks."""
    out = []
    for bundle in worlds:
        for task in bundle.tasks:
            out.append(run_episode(runtime, bundle, task, ReferencePolicy()))
        for task in bundle.tasks[:3]:
            out.append(run_episode(runtime, bundle, task, RandomPolicy(), EpisodeConfig(max_turns=4)))
    return out


@pytest.fixture(scope="module")
def transitions(worlds, trajectories, runtime):
    return build_transitions(runtime, {b.key: b for b in worlds}, trajectories, seed=1, validation=0.25, test=0.25)


def test_transitions_replay_every_call_with_env_disjoint_splits(worlds, trajectories, transitions):
    assert len(transitions) == sum(len(t.steps) for t in trajectories)
    splits = {}
    for t in transitions:
        assert splits.setdefault(t.env_id, t.split) == t.split  # one split per environment
        assert t.split == split_of(t.env_id, 1, 0.25, 0.25)
    # replay agrees with what the episodes saw
    steps = [s for t in trajectories for s in t.steps]
    assert [(t.action["name"], t.observation.status) for t in transitions] == [(s.call.name, s.status) for s in steps]
    assert all(t.diff == s.diff for t, s in zip(transitions, steps))
    assert {t.observation.status for t in transitions} >= {"ok", "tool_error"}
    lookup = next(t for t in transitions if t.env_id == "retail_store" and t.action["name"] == "cancel_order")
    assert [row["id"] for row in lookup.rows["orders"]] == [
        lookup.action["arguments"]["order_id"]
    ]  # order_id -> orders.id
    found = next(t for t in transitions if t.env_id == "retail_store" and t.action["name"] == "find_customer")
    assert [row["email"] for row in found.rows["customers"]] == [found.action["arguments"]["email"]]
    later = next(t for t in transitions if t.index == 2)
    assert (
        len(later.history) == 2
        and later.history[0]["action"]
        == next(x for x in transitions if x.episode == later.episode and x.index == 0).action
    )


def test_the_oracle_world_model_scores_perfectly(transitions):
    report = evaluate_world_model(OracleWorldModel(), transitions, k=4, samples=2)
    one = report.one_step
    assert (one.observation_exact, one.outcome_agreement, one.invalid_rate) == (1.0, 1.0, 0.0)
    assert one.rows == one.fields == PrecisionRecall(precision=1.0, recall=1.0, f1=1.0)
    assert set(one.per_env) == {t.env_id for t in transitions}
    assert one.self_consistency.mean_agreement == 1.0 and one.self_consistency.accuracy_when_consistent == 1.0
    assert [s.compound_error for s in report.k_step.steps] == [0.0, 0.0, 0.0, 0.0]


def test_a_static_model_scores_exactly_what_it_gets_right(transitions):
    one = one_step(StaticWorldModel(), transitions)
    ok_null = sum(
        t.observation.status == "ok" and t.observation.value is None and t.observation.error is None
        for t in transitions
    )
    ok = sum(t.observation.status == "ok" for t in transitions)
    changed = sum(len(facts(t.diff)[0]) for t in transitions)
    assert changed > 0
    assert one.observation_exact == ok_null / len(transitions)
    assert one.outcome_agreement == ok / len(transitions) < 1.0
    assert one.rows == PrecisionRecall(
        precision=1.0, recall=0.0, f1=0.0
    )  # predicts no change: nothing wrong said, every change missed
    assert one.self_consistency is None and "self_consistency" not in one.model_dump()  # one sample per call
    first_calls = [t for t in transitions if t.index == 0]
    steps = k_step(StaticWorldModel(), transitions, 2).steps
    assert steps[0].episodes == len(first_calls)
    assert steps[0].compound_error == pytest.approx(
        1 - sum(t.observation.status == "ok" and t.observation.value is None for t in first_calls) / len(first_calls)
    )


class WrongFields(OracleWorldModel):
    """The oracle with every updated row's new values replaced: right rows, wrong fields."""

    name = "wrong-fields"

    def predict(self, transition, history, samples=1):
        diff = json.loads(json.dumps(transition.diff))
        for changes in diff.values():
            for change in changes["updated"]:
                change["after"] = {k: (None if change["before"].get(k) != v else v) for k, v in change["after"].items()}
        return [Prediction(observation=transition.observation, diff=diff) for _ in range(samples)]


class Flaky(OracleWorldModel):
    """Odd samples say nothing changed and nothing came back: inconsistent exactly where that is wrong."""

    name = "flaky"

    def predict(self, transition, history, samples=1):
        return [
            Prediction(observation=transition.observation, diff=transition.diff)
            if i % 2 == 0
            else Prediction(observation=Observation(status="ok"), diff={})
            for i in range(samples)
        ]


def test_field_level_scores_see_what_row_level_scores_cannot(transitions):
    one = one_step(WrongFields(), transitions)
    assert one.rows.f1 == 1.0 and one.observation_exact == 1.0
    updated = [t for t in transitions if any(c["updated"] for c in t.diff.values())]
    assert updated and one.fields.f1 < 1.0 and one.fields.recall < 1.0


def test_self_consistency_flags_the_transitions_a_model_is_unsure_of(transitions):
    one = one_step(Flaky(), transitions, samples=2)
    consistency = one.self_consistency
    static_right = [t for t in transitions if t.observation == Observation(status="ok") and not t.diff]
    assert consistency.consistent == len(static_right) and consistency.inconsistent == len(transitions) - len(
        static_right
    )
    assert consistency.mean_agreement == pytest.approx(
        (len(static_right) + 0.5 * (len(transitions) - len(static_right))) / len(transitions)
    )


@pytest.mark.unit
def test_apply_diff_carries_rows_forward():
    rows = {"orders": [{"id": 1, "status": "open"}, {"id": 2, "status": "open"}]}
    diff = {
        "orders": {
            "inserted": [{"id": 3, "status": "new"}],
            "updated": [
                {"key": {"id": 1}, "before": {"id": 1, "status": "open"}, "after": {"id": 1, "status": "paid"}}
            ],
            "deleted": [{"id": 2, "status": "open"}],
        }
    }
    assert apply_diff(rows, diff) == {"orders": [{"id": 1, "status": "paid"}, {"id": 3, "status": "new"}]}
    assert rows["orders"][0]["status"] == "open"  # the input is not changed


def test_an_openai_compatible_model_is_scored_the_same_way(transitions):
    chosen = transitions[:6]
    server = ScriptedLLM(
        [json_reply(json.loads(target(t))) for t in chosen[:4]]
        + [text_reply("I think it worked."), text_reply("{not json")]
    )
    with server.serve() as running:
        model = OpenAIWorldModel("wm-test", base_url=f"{running.url}/v1")
        one = one_step(model, chosen)
    assert one.observation_exact == 4 / 6 and one.invalid_rate == 2 / 6
    assert len(server.requests) == 6
    prompt = server.requests[0]["messages"][1]["content"]
    assert chosen[0].task in prompt and f"Tool call: {chosen[0].action['name']}(" in prompt


def test_wm_commands(home, worlds, trajectories, tmp_path):
    from worldsmith.settings import get_settings
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import open_store
    from worldsmith.storage.publish import publish

    runner = CliRunner()
    store, catalog = open_store(get_settings().resolved_store_url()), open_catalog()
    for bundle in worlds:  # the worlds `wm data` replays the trajectories in (their checks are not this test's)
        publish(bundle, store, catalog)
    path = write_jsonl(trajectories, tmp_path / "trajectories.jsonl")
    made = runner.invoke(
        app,
        [
            "wm",
            "data",
            str(path),
            str(tmp_path / "wm"),
            "--seed",
            "1",
            "--validation-fraction",
            "0.25",
            "--test-fraction",
            "0.25",
        ],
    )
    assert made.exit_code == 0, made.output
    loaded = read_transitions(tmp_path / "wm" / "transitions.jsonl")
    assert len(loaded) == sum(len(t.steps) for t in trajectories)
    oracle = runner.invoke(app, ["wm", "eval", str(tmp_path / "wm" / "transitions.jsonl"), "--split", "all", "--json"])
    assert oracle.exit_code == 0 and json.loads(oracle.output)["one_step"]["observation_exact"] == 1.0
    shown = runner.invoke(
        app, ["wm", "eval", str(tmp_path / "wm" / "transitions.jsonl"), "--model", "static", "--split", "all"]
    )
    assert shown.exit_code == 0 and "compound error by step" in shown.output
    assert (
        runner.invoke(app, ["wm", "eval", str(tmp_path / "wm" / "transitions.jsonl"), "--model", "psychic"]).exit_code
        == 2
    )
    write_transitions([], tmp_path / "empty.jsonl")
    assert runner.invoke(app, ["wm", "eval", str(tmp_path / "empty.jsonl")]).exit_code == 2


def test_world_model_sft_lowers_the_loss_and_the_result_is_evaluated(home, transitions, tmp_path):
    from sqlmodel import select

    from worldsmith.models.catalog import Checkpoint, TrainingRun, TrainingStep
    from worldsmith.storage.catalog import open_catalog

    path = write_transitions(transitions, tmp_path / "transitions.jsonl")
    runner = CliRunner()
    trained = runner.invoke(app, ["wm", "train", str(path), "--steps", "20", "--batch-size", "4", "--json"])
    assert trained.exit_code == 0, trained.output
    record = json.loads(trained.output[trained.output.index("{\n") :])  # after any progress bars on stderr
    losses = [entry["loss"] for entry in record["log"]]
    assert len(losses) >= 3 and losses[-1] < losses[0] * 0.8, losses  # the loss falls
    with open_catalog().session() as session:
        (run,) = session.exec(select(TrainingRun)).all()
        steps = session.exec(select(TrainingStep).where(TrainingStep.training_run_id == run.id)).all()
        (checkpoint,) = session.exec(select(Checkpoint).where(Checkpoint.training_run_id == run.id)).all()
    assert (
        run.status == "completed"
        and run.config["kind"] == "world_model"
        and run.config["transitions"] == sum(t.split == "train" for t in transitions)
    )
    assert len(steps) == len(losses) and checkpoint.digest == record["checkpoint"]
    # the trained model answers through the same evaluation as any other (a tiny model mostly answers invalid JSON)
    test_split = [t for t in transitions if t.split != "train"][:4]
    held_out = write_transitions(test_split, tmp_path / "held_out.jsonl")
    scored = runner.invoke(
        app,
        [
            "wm",
            "eval",
            str(held_out),
            "--model",
            f"hf:{record['model']}",
            "--split",
            "all",
            "--k",
            "2",
            "--max-new-tokens",
            "48",
            "--json",
        ],
    )
    assert scored.exit_code == 0, scored.output
    one = json.loads(scored.output[scored.output.index("{\n") :])["one_step"]
    assert one["transitions"] == len(test_split) and 0.0 <= one["observation_exact"] <= 1.0
    assert (
        runner.invoke(app, ["wm", "train", str(path), "--profile", "gpu"]).exit_code == 2
    )  # no CUDA here: refused, named
