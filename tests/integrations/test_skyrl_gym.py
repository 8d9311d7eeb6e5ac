"""SkyRL-gym (worldsmith/integrations/skyrl_env.py), driven the way SkyRL's generator drives an
environment: `skyrl_gym.make(env_class, env_config=..., extras=row)` per dataset row, `init(prompt)`,
then `step(model text)` until done; rows from a generated set exported as a Hugging Face dataset."""

from __future__ import annotations

import json

import pytest
import skyrl_gym
from datasets import load_from_disk
from support.catalog import published_set

from worldsmith.agent.rewards import RewardMap
from worldsmith.integrations.dataset import export_set_dataset
from worldsmith.integrations.environment import WorldEnv
from worldsmith.integrations.skyrl_env import ENV_ID, use_env
from worldsmith.llm.procedural.backend import procedural_bundle

pytestmark = pytest.mark.sandbox


def rollout(row: dict, turns: list[str]) -> tuple[float, dict]:
    """SkyRL's loop over scripted model turns: the last step's reward and metadata."""
    env = skyrl_gym.make(ENV_ID, env_config={}, extras=row)
    conversation, _ = env.init(row["prompt"])
    assert conversation[-1]["content"] == row["prompt"][-1]["content"] and "<tool_call>" in conversation[0]["content"]
    for text in turns:
        output = env.step(text)
        conversation += [{"role": "assistant", "content": text}, *output["observations"]]
        if output["done"]:
            env.close()
            return output["reward"], output["metadata"]
    raise AssertionError("the episode did not end")


def test_a_generated_sets_rows_play_in_skyrl(home, tmp_path, runtime):
    generated = procedural_bundle("retail", 2)
    published_set("sky", [generated], 0.0)
    export_set_dataset("sky", tmp_path / "hf")
    rows = load_from_disk(str(tmp_path / "hf"))
    use_env(WorldEnv(runtime=runtime))  # the rows' worlds opened by catalog reference
    try:
        for row in rows.select(range(3)):
            task = generated.task(row["task_id"])
            calls = [
                f"<tool_call>{json.dumps({'name': s.tool, 'arguments': s.arguments})}</tool_call>"
                for s in task.solution
            ]
            reward, metadata = rollout(row, [*calls, task.answer or "Done."])
            assert (reward, metadata["verdict"]) == (1.0, "complete")
        reward, metadata = rollout(rows[0], ["<tool_call>{oops</tool_call>"])
        assert (reward, metadata["verdict"]) == (RewardMap().format_error, "format_error")  # the default reward map's
    finally:
        use_env(None)
    assert runtime.open_episodes == 0


@pytest.mark.unit
def test_a_row_without_its_task_is_refused_in_one_line():
    with pytest.raises(ValueError, match="task_id missing"):
        skyrl_gym.make(ENV_ID, env_config={}, extras={"world": "w"})
