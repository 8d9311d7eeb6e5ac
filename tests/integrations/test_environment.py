"""The environment object (worldsmith/integrations/environment.py): the same verdicts as direct runtime
calls and the episode loop for the same tool calls, on the example world and a generated one; the turn
that ends an episode (an answer, a malformed call, the turn limit); many episodes at once from many
threads; the judge as configured; a set's members; and a set as a dataset of tasks."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from support.catalog import published_set
from support.limits import ISOLATIONS, PATIENT_LIMITS, isolated
from support.llm_server import ScriptedLLM, json_reply
from typer.testing import CliRunner

from worldsmith.agent.loop import EpisodeConfig, judged_verdict, run_episode
from worldsmith.agent.policies import ScriptPolicy
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle
from worldsmith.cli import app
from worldsmith.integrations.dataset import env_dataset, task_rows
from worldsmith.integrations.environment import EnvConfig, TaskRef, WorldEnv, world_name
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.errors import RuntimeFault

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def generated() -> Bundle:
    return procedural_bundle("retail", 1)


@pytest.fixture(scope="module")
def env(runtime: Runtime, golden: Bundle, generated: Bundle) -> WorldEnv:
    return WorldEnv([golden, generated], runtime=runtime)


def plays(task: TaskSpec) -> list[tuple[str, list[tuple[str, dict]], str]]:
    """What is played per task: its reference solution and answer, the solution less its last call, nothing."""
    calls = [(s.tool, s.arguments) for s in task.solution]
    answer = task.answer or "Done."
    return [("reference", calls, answer), ("short", calls[:-1], answer), ("idle", [], "Done.")]


@pytest.mark.parametrize("which", ["golden", "generated"])
def test_the_env_gives_the_verdicts_of_direct_runtime_calls(runtime, env, golden, generated, which):
    """Per task and play: the env's verdict and evidence are the runtime's verifier on the same calls
    (with the loop's side-effect guard), and its verdict and reward are run_episode's."""
    bundle = golden if which == "golden" else generated
    seen = set()
    for task in bundle.tasks:
        for name, calls, answer in plays(task):
            with env.reset(TaskRef(world_name(bundle), task.id)) as played:
                for tool, arguments in calls:
                    assert not played.step({"name": tool, "arguments": arguments}).done
                assert played.step(answer).done
                judged = played.verify()
            with runtime.open_episode(bundle, task) as direct:
                for tool, arguments in calls:
                    direct.call_tool(tool, arguments)
                verdict, evidence = judged_verdict(runtime, bundle, task, direct, direct.verify(answer), True)
            looped = run_episode(runtime, bundle, task, ScriptPolicy(name, calls, answer))
            assert (judged.verdict, judged.evidence) == (verdict, evidence), (task.id, name)
            assert (judged.verdict, judged.reward, judged.answer) == (looped.verdict, looped.reward, looped.answer)
            assert [s.status for s in judged.steps] == [s.status for s in looped.steps]
            seen.add(judged.verdict)
    assert Verdict.complete in seen and Verdict.incomplete in seen  # the plays tell solved from unsolved


def test_a_turn_ends_the_episode_by_its_answer_its_format_or_the_turn_limit(runtime, golden):
    short = WorldEnv(golden, runtime=runtime, config=EnvConfig(episode=EpisodeConfig(max_turns=2)))
    task = golden.tasks[0]
    with short.reset(task.id) as played:
        first = played.step('<tool_call>{"name": "find_customer", "arguments": {"email": "x@y.z"}}</tool_call>')
        assert not first.done and first.observation.startswith("error: ")  # the world refused: a tool error
        assert played.step({"name": "get_customer", "arguments": '{"customer_id": 1}'}).truncated
        with pytest.raises(RuntimeFault, match="has ended"):
            played.step("Done.")
        assert played.verify().verdict == Verdict.incomplete and played.verify().turns == 2
    with short.reset(task.id) as played:
        broken = played.step("<tool_call>{not json</tool_call>")
        assert broken.done and broken.verdict == Verdict.format_error
        assert (played.verify().verdict, played.verify().reward) == (Verdict.format_error, RewardMap().format_error)
    windowed = WorldEnv(golden, runtime=runtime, config=EnvConfig(episode=EpisodeConfig(window=1)))
    with windowed.reset(task.id) as played:
        for step in task.solution:
            played.step({"name": step.tool, "arguments": step.arguments})
        assert [m.role for m in played.view()] == ["system", "user", "assistant", "tool"]


def test_a_task_is_named_by_its_world_when_two_worlds_could_have_it(env, golden, generated):
    with pytest.raises(RuntimeFault, match="no world has it"):
        env.reset("no_such_task")
    with pytest.raises(RuntimeFault, match="has no task 'nope'"):
        env.reset(TaskRef(golden.env_id, "nope"))
    assert {t.world for t in env.tasks()} == {golden.env_id, world_name(generated)}


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_many_episodes_at_once_from_many_threads(runtime, generated, isolation):
    """Every task of the generated world, twice, on 8 threads, in each isolation mode of the runtime:
    each episode its own database (all complete), none left open."""
    own = None if isolation == runtime.limits.isolation else Runtime(isolated(PATIENT_LIMITS, isolation), workers=2)
    used = own or runtime
    env = WorldEnv(generated, runtime=used)
    tasks = env.tasks() * 2

    def play(ref: TaskRef) -> Verdict:
        with env.reset(ref) as played:
            for step in played.task.solution:
                played.step({"name": step.tool, "arguments": step.arguments})
            played.step(played.task.answer or "Done.")
            return played.verify().verdict

    try:
        with ThreadPoolExecutor(8) as pool:
            verdicts = list(pool.map(play, tasks))
        assert verdicts == [Verdict.complete] * len(tasks)
        assert used.open_episodes == 0
    finally:
        if own is not None:
            own.close()


def test_the_judge_rules_as_configured(runtime, golden, monkeypatch):
    server = ScriptedLLM([json_reply({"verdict": "partial", "reason": "half done"})])
    task = golden.tasks[0]
    with server.serve() as running:
        config = EnvConfig(reward="verifier+judge", judge={"model": "judge", "base_url": f"{running.url}/v1"})
        judged_env = WorldEnv(golden, runtime=runtime, config=config)
        with judged_env.reset(task.id) as played:
            for step in task.solution:
                played.step({"name": step.tool, "arguments": step.arguments})
            judged = played.verify(task.answer or "Done.")
    assert (judged.verdict, judged.reward) == (Verdict.partial, 0.1)
    assert judged.judge is not None and judged.judge["verifier_verdict"] == Verdict.complete
    assert "Verifier verdict: complete" in server.requests[0]["messages"][1]["content"]


def test_a_set_is_an_env_and_a_dataset_of_tasks(home, tmp_path, generated):
    clinic = procedural_bundle("clinic", 1)
    published_set("rl", [generated, clinic], 0.5)
    with WorldEnv.from_set("rl", "train") as train:
        (world,) = {t.world for t in train.tasks()}
        assert "@" in world
        task = train.world(world).tasks[0]
        with train.reset(TaskRef(world, task.id)) as played:
            for step in task.solution:
                played.step({"name": step.tool, "arguments": step.arguments})
            assert played.verify(task.answer or "Done.").verdict == Verdict.complete
    result = CliRunner().invoke(app, ["sets", "export", "rl", str(tmp_path / "hf"), "--format", "hf"])
    assert result.exit_code == 0, result.output
    from datasets import load_from_disk

    rows = load_from_disk(str(tmp_path / "hf"))
    assert len(rows) == len(generated.tasks) + len(clinic.tasks)
    assert {r["split"] for r in rows} == {"train", "validation"}
    assert {r["world"] for r in rows} == {r["environment"] for r in rows} and all("@" in r["world"] for r in rows)
    again = CliRunner().invoke(app, ["sets", "export", "rl", str(tmp_path / "hf"), "--format", "hf"])
    assert again.exit_code == 2 and again.output.strip().count("\n") == 0 and "not an empty directory" in again.output
    missing = CliRunner().invoke(app, ["sets", "export", "nope", str(tmp_path / "x"), "--format", "hf"])
    assert missing.exit_code == 2 and "no environment set 'nope'" in missing.output.strip()


@pytest.mark.unit
def test_task_rows_give_the_prompt_the_tools_and_the_world(golden):
    rows = task_rows({"retail_store": golden}, {"retail_store": "validation"})
    assert [r["task_id"] for r in rows] == [t.id for t in golden.tasks]
    first = rows[0]
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["prompt"][1]["content"] == golden.tasks[0].instruction
    assert (first["world"], first["environment"], first["split"]) == ("retail_store", "retail_store", "validation")
    assert '"name": "find_customer"' in first["tools"] and "Tools:" not in first["prompt"][0]["content"]


def test_an_env_gives_its_dataset(env, golden, generated):
    rows = env_dataset(env)
    assert len(rows) == len(golden.tasks) + len(generated.tasks)


def docs_examples() -> dict[str, str]:
    """The Python blocks of docs/integrations.md by section, but TRL's (it names a model to download)."""
    import re

    from support.paths import REPO

    text = (REPO / "docs" / "integrations.md").read_text()
    found = {}
    for section in text.split("\n## ")[1:]:
        title, _, body = section.partition("\n")
        match = re.search(r"```python\n(.*?)```", body, re.DOTALL)
        if match and "GRPOTrainer(" not in match[1]:
            found[title] = match[1]
    return found


@pytest.mark.parametrize("section", ["The environment object", "Gymnasium", "SkyRL-gym"])
def test_the_docs_examples_run_as_written(home, monkeypatch, capsys, section):
    """Each prints on its last line what its last comment says."""
    from support.paths import REPO

    from worldsmith.integrations.skyrl_env import use_env

    code = docs_examples()[section]
    monkeypatch.chdir(REPO)
    try:
        exec(compile(code, "docs/integrations.md", "exec"), {"__name__": "docs"})
    finally:
        use_env(None)
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    said = [line for line in code.splitlines() if line.strip().startswith("print(") and "# " in line][-1].split(
        "# ", 1
    )[1]
    assert printed == said.split(" (")[0], printed
