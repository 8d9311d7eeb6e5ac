"""TRL (worldsmith/integrations/trl_env.py): a plain `GRPOTrainer` given `environment_factory` and
`world_reward` trains the tiny offline model in a world; the factory's environments keep TRL's contract
(tools as typed, documented methods; `reset(**row)`; TRL's calls `method(**arguments)`) on the rows of a
generated set exported as a Hugging Face dataset, and the reward is the world's verified one."""

from __future__ import annotations

import json

import pytest
from datasets import load_from_disk
from support.catalog import published_set
from transformers.utils import get_json_schema

from worldsmith.integrations.dataset import env_dataset, export_set_dataset
from worldsmith.integrations.environment import WorldEnv
from worldsmith.integrations.trl_env import environment_factory, python_type, world_reward
from worldsmith.llm.procedural.backend import procedural_bundle

pytestmark = pytest.mark.sandbox


def test_a_generated_sets_rows_keep_trls_environment_contract(home, tmp_path, runtime):
    """Each row's world picked by its `environment` column, reset with the row as TRL does, the reference
    solution called as TRL calls tools: the world's reward; a wrong answer: the verifier's verdict."""
    generated = procedural_bundle("retail", 3)
    published_set("trl", [generated], 0.0)
    export_set_dataset("trl", tmp_path / "hf")
    rows = load_from_disk(str(tmp_path / "hf"))
    env = WorldEnv.from_set("trl", runtime=runtime)
    factories = environment_factory(env)
    assert set(factories) == set(rows["environment"])
    for row in rows.select(range(3)):
        instance = factories[row["environment"]]()
        instance.reset(**{k: v for k, v in row.items() if k != "environment"})  # TRL's multi-environment reset
        task = generated.task(row["task_id"])
        for step in task.solution:
            assert getattr(instance, step.tool)(**step.arguments).startswith(("{", "["))
        completion = [{"role": "assistant", "content": task.answer or "Done."}]
        assert world_reward(completions=[completion], environments=[instance]) == [1.0]
    idle = factories[rows[0]["environment"]]()
    idle.reset(**rows[0])
    assert world_reward(completions=[[{"role": "tool", "content": "{}"}]], environments=[idle]) == [0.0]


def test_tool_methods_read_back_as_the_worlds_schemas(golden, runtime):
    """What TRL shows the model (transformers' schema of each method) names each tool's arguments with
    their JSON types, the required ones required."""
    env = WorldEnv(golden, runtime=runtime)
    instance = environment_factory(env)["retail_store"]()
    for tool in golden.tools:
        read = get_json_schema(getattr(instance, tool.name))["function"]
        parameters = tool.parameters
        assert read["name"] == tool.name and read["description"]
        assert set(read["parameters"]["properties"]) == set(parameters.get("properties", {}))
        assert set(read["parameters"].get("required", [])) == set(parameters.get("required", []))
        for argument, schema in parameters.get("properties", {}).items():
            kind = schema.get("type")
            if isinstance(kind, str) and "enum" not in schema:
                assert read["parameters"]["properties"][argument]["type"] == kind, (tool.name, argument)


@pytest.mark.unit
def test_json_schema_types_map_to_python_annotations():
    from typing import Any, Literal

    assert python_type({"type": "integer"}) is int
    assert python_type({"type": ["string", "null"]}) == str | None
    assert python_type({"anyOf": [{"type": "number"}, {"type": "null"}]}) == float | None
    assert python_type({"type": "array", "items": {"type": "string"}}) == list[str]
    assert python_type({"enum": ["a", "b"], "type": "string"}) == Literal["a", "b"]
    assert python_type({"type": ["string", "integer"]}) is Any and python_type(True) is Any


def one_step_args(tmp_path):
    """GRPOConfig for one CPU step of the tiny model: two rollouts of one row, nothing saved."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        max_steps=1,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        chat_template_kwargs={"enable_thinking": False},
        activation_checkpointing=False,
    )


@pytest.mark.e2e
def test_a_plain_grpo_trainer_trains_in_a_world(tiny_model, golden, runtime, tmp_path, monkeypatch):
    """One GRPO step of the tiny model on the example world's first task: TRL renders the world's tools,
    resets an environment per rollout, and the step's reward is the world's (the random model solves nothing)."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOTrainer

    env = WorldEnv(golden, runtime=runtime)
    args = one_step_args(tmp_path)
    trainer = GRPOTrainer(
        model=str(tiny_model),
        reward_funcs=[world_reward],
        train_dataset=env_dataset(env).select(range(1)),
        args=args,
        environment_factory=environment_factory(env),
    )
    assert {t.__name__ for t in trainer._env_tools["retail_store"]} == {t.name for t in golden.tools}
    trainer.train()
    (log,) = [entry for entry in trainer.state.log_history if "loss" in entry]
    judged = [e.episode.verify() for e in trainer.environments]  # the trajectories world_reward judged
    assert len(judged) == 2 and all(t.task_id == golden.tasks[0].id for t in judged)
    assert log["rewards/world_reward/mean"] == pytest.approx(sum(t.reward for t in judged) / 2)
    assert runtime.open_episodes == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("tool", "argument"), [("reset", "x"), ("episode", "x"), ("lookup", "class"), ("lookup", "a-b")]
)
def test_a_tool_python_cannot_spell_as_a_method_is_refused_naming_it(tool, argument):
    from worldsmith.integrations.trl_env import tool_method

    schema = {"name": tool, "description": "d", "parameters": {"type": "object", "properties": {argument: {}}}}
    with pytest.raises(ValueError, match="cannot be a TRL tool method"):
        tool_method("w", schema)
    fine = tool_method("w", {**schema, "name": "lookup", "parameters": {"properties": {"world": {"type": "string"}}}})
    assert get_json_schema(fine)["function"]["parameters"]["properties"]["world"]["type"] == "string"


@pytest.mark.e2e
def test_a_plain_grpo_trainer_trains_with_the_worlds_rollout_func(tiny_model, golden, runtime, tmp_path, monkeypatch):
    """One GRPO step of the tiny model with `rollout_func`: each rollout is an episode of the row's task played
    by the trainer's own model, its completion the model's tokens (env_mask 1) and the world's (0), and the
    step's reward the verified trajectories'."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOTrainer

    from worldsmith.integrations.trl_rollout import rollout_func, rollout_reward

    env = WorldEnv(golden, runtime=runtime)
    play = rollout_func(env)
    played: list = []

    def recorded(prompts, trainer):
        output = play(prompts, trainer)
        played.append(output)
        return output

    args = one_step_args(tmp_path)
    trainer = GRPOTrainer(
        model=str(tiny_model),
        reward_funcs=[rollout_reward],
        train_dataset=env_dataset(env).select(range(1)),
        args=args,
        rollout_func=recorded,
    )
    trainer.train()
    (output,) = played
    assert len(output["completion_ids"]) == 2 and all(len(c) <= 8 for c in output["completion_ids"])
    assert [len(m) for m in output["env_mask"]] == [len(c) for c in output["completion_ids"]]
    judged = output["world_trajectory"]
    assert all(t.task_id == golden.tasks[0].id and t.turns >= 1 for t in judged)
    (log,) = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert log["rewards/rollout_reward/mean"] == pytest.approx(sum(t.reward for t in judged) / 2)
    assert runtime.open_episodes == 0


class ScriptedLM:
    """A causal LM whose `generate` samples the next of `turns` (token ids): a model that solves the task."""

    def __init__(self, turns: list[list[int]]):
        self.turns, self.training, self.device = list(turns), True, "cpu"

    def eval(self) -> None:
        self.training = False

    def train(self, mode: bool = True) -> None:
        self.training = mode

    def generate(self, ids, **_):
        import torch

        return torch.cat([ids, torch.tensor([self.turns.pop(0)])], dim=1)


@pytest.mark.e2e
def test_the_rollout_func_plays_a_whole_episode_with_the_models_turns(tiny_model, golden, runtime):
    """The reference solution's turns as the model's tokens: each tool turn's results are appended in the chat
    template's tool turn (env_mask 0), the model's tokens keep env_mask 1, and the trajectory is complete."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from worldsmith.integrations.trl_rollout import rollout_func, rollout_reward

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    task = golden.tasks[0]
    texts = [
        f'<tool_call>{{"name": "{s.tool}", "arguments": {json.dumps(s.arguments)}}}</tool_call>' for s in task.solution
    ]
    turns = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in [*texts, task.answer]]
    model = ScriptedLM(turns)
    trainer = SimpleNamespace(
        processing_class=tokenizer,
        model=model,
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
        args=SimpleNamespace(max_completion_length=4096, temperature=1.0, top_p=1.0),
        chat_template_kwargs={"enable_thinking": False},
    )
    env = WorldEnv(golden, runtime=runtime)
    prompt = env_dataset(env)[0]["prompt"]
    output = rollout_func(env)([prompt], trainer)
    (trajectory,) = output["world_trajectory"]
    assert (trajectory.task_id, trajectory.verdict.value, trajectory.turns) == (task.id, "complete", len(texts) + 1)
    assert rollout_reward(output["world_trajectory"]) == [1.0] and model.training and not model.turns
    (completion,), (mask,) = output["completion_ids"], output["env_mask"]
    assert [t for t, m in zip(completion, mask, strict=True) if m == 1] == [t for turn in turns for t in turn]
    shown = tokenizer.decode([t for t, m in zip(completion, mask, strict=True) if m == 0])
    for message in trajectory.messages:
        if message.role == "tool":
            assert message.content in shown
