"""Simulated environment mode and co-training: episodes answered by a world model (the code itself,
a static floor, an OpenAI-compatible model on a local server, a local causal LM), the imagined
database, the uncertainty stop, simulated evaluation and training through the flows, and one
co-training round recorded in the catalog and on the dashboard."""

from __future__ import annotations

import json
import math
import os
import sqlite3

import pytest
from sqlmodel import select
from support.bundles import narrowed
from support.catalog import published_set
from support.llm_server import ScriptedLLM, json_reply, text_reply
from typer.testing import CliRunner

from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import RandomPolicy, ReferencePolicy
from worldsmith.cli import app
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.catalog import Checkpoint, EvaluationRun, TrainingRun, TrainingStep
from worldsmith.storage.catalog import open_catalog
from worldsmith.training.trainer import real_group
from worldsmith.worldmodel.config import SimulationConfig
from worldsmith.worldmodel.evaluation import apply_diff
from worldsmith.worldmodel.scoring import facts
from worldsmith.worldmodel.simulated import SimulatedRuntime, apply_to_database
from worldsmith.worldmodel.transitions import Observation, replay
from worldsmith.worldmodel.world_models import OpenAIWorldModel, Prediction, target

pytestmark = pytest.mark.sandbox

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def steps_of(trajectory) -> list[dict]:
    return [s.model_dump(exclude={"seconds"}) for s in trajectory.steps]


@pytest.fixture(scope="module")
def retail():
    return procedural_bundle("retail", 3)


def _applied_prediction() -> tuple[list[tuple], list[str]]:
    """A predicted diff with sound and unsound parts applied to a three-order database: its orders
    after, and the problems named."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, note TEXT);"
        "INSERT INTO orders VALUES (1, 'open', NULL), (2, 'open', 'x'), (3, 'paid', NULL);"
    )
    problems = apply_to_database(
        conn,
        {
            "orders": {
                "inserted": [{"id": 4, "status": "new", "bogus": 1}, {"id": 1, "status": "dup"}, {"id": 5}],
                "updated": [
                    {"key": {"id": 1}, "before": {}, "after": {"status": "paid"}},
                    {"key": {"id": 99}, "after": {"status": "x"}},
                    {"key": {"id": 3}, "after": {"nothing": 1}},
                ],
                "deleted": [{"id": 2, "status": "open", "note": "x"}, {"id": 42}],
            },
            "ghosts": {"inserted": [{"id": 1}]},
            'orders" ; DROP TABLE orders; --': {"deleted": [{"id": 3}]},
        },
    )
    return conn.execute("SELECT id, status FROM orders ORDER BY id").fetchall(), problems


@pytest.mark.unit
def test_a_predicted_diff_applies_each_sound_part():
    orders, _ = _applied_prediction()
    assert orders == [
        (1, "paid"),
        (3, "paid"),
        (4, "new"),
    ]


@pytest.mark.unit
def test_a_predicted_diff_names_each_part_it_could_not_apply():
    _, problems = _applied_prediction()
    assert problems == [
        "orders: update {'id': 99}: no such row",
        "orders: update names no column",
        "orders: delete: no such row",
        "orders: insert: UNIQUE constraint failed: orders.id",
        "orders: insert: NOT NULL constraint failed: orders.status",
        "ghosts: no such table",
        'orders" ; DROP TABLE orders; --: no such table',
    ]


@pytest.mark.unit
def test_predicted_parts_that_are_not_lists_are_named_and_change_nothing():
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL);")
    conn.execute("INSERT INTO orders VALUES (1, 'open')")
    malformed = {"orders": {"inserted": 3, "updated": "paid", "deleted": {"id": 1}}}
    assert apply_to_database(conn, malformed) == [
        "orders: updated is not a list",
        "orders: deleted is not a list",
        "orders: inserted is not a list",
    ]
    assert conn.execute("SELECT id, status FROM orders").fetchall() == [(1, "open")]
    assert facts(malformed) == (set(), set())
    assert apply_diff({"orders": [{"id": 1, "status": "open"}]}, malformed) == {"orders": [{"id": 1, "status": "open"}]}


def test_the_code_world_model_reproduces_real_episodes(golden, retail, runtime):
    code = SimulatedRuntime(runtime, SimulationConfig(world_model="code"))
    for bundle in (golden, retail):
        for number, task in enumerate(bundle.tasks):
            for policy, config in (
                (ReferencePolicy(), EpisodeConfig()),
                (RandomPolicy(), EpisodeConfig(max_turns=4, seed=number)),
            ):
                real = run_episode(runtime, bundle, task, policy, config)
                imagined = run_episode(runtime, bundle, task, policy, config, world=code)
                assert (real.world, imagined.world) == ("real", "simulated:code")
                assert steps_of(imagined) == steps_of(real) and (imagined.verdict, imagined.reward) == (
                    real.verdict,
                    real.reward,
                )
    assert code.stats.calls > 0 and code.stats.as_dict()["invalid_rate"] == 0.0


def test_a_static_world_model_changes_nothing_for_the_real_verifier_to_see(retail, runtime):
    static = SimulatedRuntime(runtime, SimulationConfig(world_model="static"))
    writing = [t for t in retail.tasks if run_episode(runtime, retail, t, ReferencePolicy()).steps[-1].diff]
    assert writing
    for task in writing:
        trajectory = run_episode(runtime, retail, task, ReferencePolicy(), world=static)
        assert [(s.status, s.value, s.diff) for s in trajectory.steps] == [("ok", None, {})] * len(task.solution)
        assert trajectory.verdict == "incomplete"
    with static.open_episode(retail, writing[0]) as episode:
        episode.call_tool(writing[0].solution[-1].tool, writing[0].solution[-1].arguments)
        assert episode.diff(retail.world).tables == {}
        assert episode.call_tool("no_such_tool").status == "tool_error"  # refused before the world model is asked
    assert static.stats.calls == sum(len(t.solution) for t in writing) + 1


class Scripted:
    """A world model answering from a list per call: each entry is the list of samples returned."""

    name = "scripted"

    def __init__(self, answers: list[list[Prediction]] | None = None, error: Exception | None = None):
        self.answers, self.error, self.queries = list(answers or []), error, []

    def predict(self, transition, history, samples=1):
        self.queries.append((transition, list(history), samples))
        if self.error is not None:
            raise self.error
        return self.answers.pop(0)


def test_a_world_model_that_is_uncertain_invalid_or_failing_stops_the_episode(retail, runtime):
    task = next(t for t in retail.tasks if len(t.solution) >= 3)
    good = Prediction(observation=Observation(status="ok", value={"id": 1}), diff={})
    other = Prediction(observation=Observation(status="ok", value={"id": 2}), diff={})
    config = SimulationConfig(world_model="static", samples=4, uncertainty_threshold=0.3)
    cases = [
        (
            Scripted([[good] * 4, [good, good, other, other]]),
            "uncertain",
            2,
        ),  # agreement 1.0, then 0.5: uncertainty 0.5 > 0.3
        (Scripted([[Prediction(raw="I think it worked")] * 4]), "invalid_prediction", 1),
        (
            Scripted([[good, good, good, other]] * 2 + [[Prediction(observation=Observation(status="maybe"))] * 4]),
            "invalid_prediction",
            3,
        ),
        (Scripted(error=ConnectionError("refused")), "world_model", 1),
    ]
    for model, limit, calls in cases:
        simulation = SimulatedRuntime(runtime, config, model=model)
        trajectory = run_episode(runtime, retail, task, ReferencePolicy(), world=simulation)
        assert (trajectory.verdict, trajectory.reward, len(trajectory.steps)) == ("env_error", None, calls), limit
        assert (
            trajectory.steps[-1].status == "env_error"
            and {
                "uncertain": "uncertain",
                "invalid_prediction": "not a transition",
                "world_model": "world model failed",
            }[limit]
            in trajectory.error
        )
        assert all(q[2] == 4 for q in model.queries)
    # the queries: the task, the call, the history of the model's own answers, the imagined database
    first, second = cases[0][0].queries[0][0], cases[0][0].queries[1][0]
    assert first.task == task.instruction and first.action == {
        "name": task.solution[0].tool,
        "arguments": task.solution[0].arguments,
    }
    assert (
        first.observation is None
        and first.world == retail.world
        and second.history[0]["observation"]["value"] == {"id": 1}
    )
    stats = SimulatedRuntime(runtime, config, model=Scripted([[good] * 4, [good, good, other, other]]))
    run_episode(runtime, retail, task, ReferencePolicy(), world=stats)
    assert stats.stats.as_dict() == {
        "calls": 2,
        "mean_uncertainty": 0.25,
        "uncertain_rate": 0.5,
        "invalid_rate": 0.0,
        "inconsistent_rate": 0.0,
    }


def test_an_openai_compatible_world_model_simulates_an_episode_end_to_end(retail, runtime):
    """The LLM-as-simulator baseline: a chat model on a local OpenAI-compatible server answers every
    call; answered with the real transitions, the imagined end state passes the real verifier."""
    task = next(
        t
        for t in retail.tasks
        if len(t.solution) >= 2 and run_episode(runtime, retail, t, ReferencePolicy()).steps[-1].diff
    )
    truth = replay(runtime, retail, run_episode(runtime, retail, task, ReferencePolicy()), "truth")
    server = ScriptedLLM([json_reply(json.loads(target(t))) for t in truth])
    with server.serve() as running:
        model = OpenAIWorldModel("wm-test", base_url=f"{running.url}/v1")
        simulation = SimulatedRuntime(runtime, SimulationConfig(world_model="openai:wm-test"), model=model)
        trajectory = run_episode(runtime, retail, task, ReferencePolicy(), world=simulation)
        server.script(text_reply("The order is now cancelled, I believe."))
        failed = run_episode(runtime, retail, task, ReferencePolicy(), world=simulation)
    assert trajectory.verdict == "complete" and [s.diff for s in trajectory.steps] == [t.diff for t in truth]
    assert len(server.requests) == len(truth) + 1
    assert f"Tool call: {task.solution[1].tool}(" in server.requests[1]["messages"][1]["content"]
    assert failed.verdict == "env_error" and "not a transition" in failed.error


@pytest.mark.e2e
def test_a_local_causal_lm_simulates_deterministically_across_threads(golden, runtime, tiny_model):
    """A (random-weight) causal LM as the world model, sampled 2 ways per call, episodes at once: the
    answers depend on the prompts only, so two runs agree exactly."""
    from concurrent.futures import ThreadPoolExecutor

    simulation = SimulatedRuntime(
        runtime, SimulationConfig(world_model=f"hf:{tiny_model}", samples=2, max_new_tokens=24)
    )
    tasks = [t for t in golden.tasks if t.solution][:3]

    def run_all() -> list:
        with ThreadPoolExecutor(3) as pool:
            return list(pool.map(lambda t: run_episode(runtime, golden, t, ReferencePolicy(), world=simulation), tasks))

    first, second = run_all(), run_all()
    assert [steps_of(t) for t in first] == [steps_of(t) for t in second]
    assert all(
        t.verdict == "env_error" and t.world == f"simulated:hf:{tiny_model}" for t in first
    )  # random weights: no valid JSON
    assert (
        simulation.stats.calls == 6 and simulation.stats.as_dict()["mean_uncertainty"] == 0.5
    )  # two different garbage samples


@pytest.mark.unit
def test_real_groups_take_exactly_their_share_from_the_first_group_on():
    for share in (0.0, 0.2, 0.25, 0.5, 1 / 3, 1.0):
        picks = [real_group(i, share) for i in range(60)]
        assert [sum(picks[:n]) for n in range(1, 61)] == [math.ceil(n * share - 1e-9) for n in range(1, 61)]
        assert picks[0] == (share > 0) and sum(picks) == round(60 * share)


# -- flows ----------------------------------------------------------------------------------------


@pytest.fixture()
def retail_set(home):
    return published_set("sim", [procedural_bundle("retail", 3), procedural_bundle("clinic", 3)], 0.0)


@pytest.mark.flow
def test_simulated_evaluation_runs_through_the_flow_as_through_the_cli(prefect_api, retail_set):
    from worldsmith.flows.evaluate import evaluate
    from worldsmith.tasks.parameters import EvaluateParameters

    real = evaluate(EvaluateParameters(set_name=retail_set))
    code = evaluate(EvaluateParameters(set_name=retail_set, simulate={"world_model": "code"}))
    assert (real.world, code.world) == ("real", "simulated:code")
    assert code.overall == real.overall and code.overall.pass_at_1 == 1.0 and code.simulation.calls > 0
    refused = CliRunner().invoke(app, ["eval", "--set", retail_set, "--simulate", "oracle"])
    assert refused.exit_code == 2 and "unknown world model 'oracle'" in refused.output
    shown = CliRunner().invoke(app, ["eval", "--set", retail_set, "--simulate", "static", "--json"])
    assert shown.exit_code == 0, shown.output
    static = json.loads(shown.output)
    assert static["world"] == "simulated:static" and static["overall"]["pass@1"] < 0.5
    with open_catalog().session() as session:
        runs = session.exec(select(EvaluationRun).order_by(EvaluationRun.id)).all()
    assert [r.metrics["world"] for r in runs] == ["real", "simulated:code", "simulated:static"]
    assert runs[2].metrics["parameters"]["simulate"]["world_model"] == "static"
    from worldsmith.dashboard.data import summary

    with open_catalog().session() as session:
        assert [e["world"] for e in summary(session)["evaluations"]] == ["real", "simulated:code", "simulated:static"]


@pytest.mark.flow
def test_simulated_training_mixes_imagined_groups_among_real_ones(prefect_api, retail_set):
    from worldsmith.flows.train import train
    from worldsmith.training.config import TrainingConfig

    with pytest.raises(ValueError, match="real_share applies to simulated training only"):
        TrainingConfig(model="tiny", set_name=retail_set, real_share=0.5)
    config = TrainingConfig(
        model="tiny",
        set_name=retail_set,
        group_size=2,
        steps=2,
        max_turns=2,
        max_completion_length=16,
        warmup_steps=1,
        learning_rate=1e-4,
        simulate={"world_model": "code"},
        real_share=0.5,
    )
    result = train(config)
    assert [entry["imagined_rate"] for entry in result.log] == [0.0, 1.0]  # a real group, then an imagined one
    assert result.simulation is not None and result.before is None  # the set has no validation split
    with open_catalog().session() as session:
        run = session.get(TrainingRun, result.run_id)
    assert run.config["simulate"]["world_model"] == "code" and run.config["real_share"] == 0.5


@pytest.mark.flow
def test_each_cotraining_round_records_its_metrics(prefect_api, home):
    """Two rounds on a small procedural world with a warmed-up tiny policy: real rollouts, a tiny
    world model trained on them (round 2 continues round 1's and is first scored on round 2's fresh
    transitions), GRPO with imagined and real rollout groups, a real evaluation; each round's
    metrics in the catalog and on the dashboard."""
    published_set("co", [narrowed(procedural_bundle("retail", 0), ("t09_pay", "t10_pay"))], 0.0)
    runner = CliRunner()
    done = runner.invoke(
        app,
        [
            "cotrain",
            "--set",
            "co",
            "--rounds",
            "2",
            "--policy-steps",
            "2",
            "--wm-steps",
            "6",
            "--group-size",
            "2",
            "--real-samples",
            "2",
            "--real-share",
            "0.5",
            "--wm-samples",
            "2",
            "--max-turns",
            "4",
            "--max-completion-length",
            "48",
            "--max-new-tokens",
            "48",
            "--warmup-steps",
            "60",
            "--json",
        ],
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    first, second = result["rounds"]
    assert [r["round"] for r in result["rounds"]] == [1, 2] and first["real_episodes"] == second["real_episodes"] == 4
    assert (
        first["transitions"] >= first["transitions_new"] > 0
        and second["transitions"] == first["transitions"] + second["transitions_new"]
    )
    assert (
        first["imagined_rate"] == second["imagined_rate"] == 0.5
        and first["eval_split"] == "train"
        and first["eval_pass@1"] is not None
    )
    assert first["wm_accuracy_fresh"] is None  # no world model before round 1
    for r in result["rounds"]:  # the policy's real and imagined rewards apart (a widening gap: exploitation)
        rewards = [r["policy_reward_real"], r["policy_reward_imagined"]]
        assert any(isinstance(v, float) for v in rewards) and all(v is None or -1 <= v <= 1 for v in rewards), r
    assert (second["wm_accuracy_fresh"] is None) == (
        second["transitions_new"] == 0
    )  # scored on fresh data when there is some
    with open_catalog().session() as session:
        run = session.get(TrainingRun, result["run_id"])
        steps = session.exec(
            select(TrainingStep).where(TrainingStep.training_run_id == run.id).order_by(TrainingStep.step)
        ).all()
        world_models = [session.get(TrainingRun, r["wm_run"]) for r in result["rounds"] if r["wm_run"] is not None]
        policies = [session.get(TrainingRun, r["policy_run"]) for r in result["rounds"]]
        checkpoints = session.exec(select(Checkpoint).where(Checkpoint.training_run_id == world_models[0].id)).all()
        evaluations = {e.id: e for e in session.exec(select(EvaluationRun)).all()}
    assert run.status == "completed" and run.config["kind"] == "cotrain" and run.metrics["rounds"] == 2
    assert [s.step for s in steps] == [1, 2] and steps[0].metrics["real_success_rate"] == first["real_success_rate"]
    assert (
        all(w.config["kind"] == "world_model" and w.status == "completed" for w in world_models)
        and len(checkpoints) == 1
    )
    assert world_models[0].config["model"] == "tiny" and all(
        w.config["model"].endswith("round-1/world-model") for w in world_models[1:]
    )
    assert (
        policies[0].config["simulate"]["world_model"].endswith("round-1/world-model")
        and policies[0].config["real_share"] == 0.5
    )
    assert policies[1].config["model"] == str(home / "cotrain" / str(run.id) / "round-1" / "policy" / "final")
    assert result["policy"] == str(home / "cotrain" / str(run.id) / "round-2" / "policy" / "final")
    assert (
        evaluations[first["real_evaluation"]].samples == 2
        and evaluations[second["eval_evaluation"]].policy == f"hf:{result['policy']}"
    )
    from worldsmith.dashboard.data import summary

    with open_catalog().session() as session:
        shown = summary(session)
    (cotraining,) = shown["cotraining"]
    assert cotraining["steps"] == [1, 2] and cotraining["real_success_rate"] == [
        first["real_success_rate"],
        second["real_success_rate"],
    ]
    assert cotraining["imagined_rate"] == [0.5, 0.5] and {t["kind"] for t in shown["training"]} == {
        "world_model",
        "grpo",
    }
