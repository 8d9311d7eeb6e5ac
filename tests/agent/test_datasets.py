"""SFT and world-model transition datasets from trajectories: they load with `datasets` and train with TRL."""

from __future__ import annotations

import json
import math

import pytest
from datasets import load_dataset

from worldsmith.agent.datasets import sft_rows, transition_rows, turn_rows, write_rows
from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import RandomPolicy, ReferencePolicy

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def trajectories(runtime, golden):
    done = [run_episode(runtime, golden, task, ReferencePolicy()) for task in golden.tasks]
    done += [
        run_episode(runtime, golden, task, RandomPolicy(calls=2), EpisodeConfig(seed=1)) for task in golden.tasks[:3]
    ]
    return done


def test_sft_rows_of_the_complete_episodes_load_as_datasets(trajectories, tmp_path):
    rows = sft_rows(trajectories)
    assert len(rows) == 10 and {r["task_id"] for r in rows} == {
        t.task_id for t in trajectories if t.verdict == "complete"
    }
    paths = write_rows(rows, tmp_path, "sft")
    for kind, path in paths.items():
        data = load_dataset(kind if kind == "parquet" else "json", data_files=str(path), split="train")
        assert len(data) == 10 and set(data.column_names) >= {"messages", "tools"}
        first = data[0]
        assert [m["role"] for m in first["messages"]][:2] == ["system", "user"]
        call = next(m for m in first["messages"] if m["tool_calls"])["tool_calls"][0]["function"]
        assert isinstance(json.loads(call["arguments"]), dict) and json.loads(first["tools"])[0]["type"] == "function"


def test_turn_rows_hold_exactly_the_window(trajectories):
    task_rows = [r for r in turn_rows(trajectories, window=1) if r["task_id"] == "t05_ship_paid_orders"]
    assert len(task_rows) == 5  # four tool calls and the final answer
    last = task_rows[-1]["prompt"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool"]  # task kept, only the last turn
    assert json.loads(last[2]["tool_calls"][0]["function"]["arguments"]) == {"order_id": 1005}
    assert task_rows[-1]["completion"][0]["role"] == "assistant" and not task_rows[-1]["completion"][0]["tool_calls"]


def test_each_step_is_a_transition_row_of_state_action_outcome(trajectories, tmp_path):
    rows = transition_rows(trajectories)
    assert len(rows) == sum(len(t.steps) for t in trajectories)
    paid = next(r for r in rows if r["task_id"] == "t04_return_headphones")
    assert json.loads(paid["action"])["name"] == "request_return" and paid["changed"]
    assert list(json.loads(paid["diff"])) == ["returns"] and json.loads(paid["observation"])["status"] == "ok"
    assert paid["state"].startswith("Task: ")
    data = load_dataset("parquet", data_files=str(write_rows(rows, tmp_path, "transitions")["parquet"]), split="train")
    assert len(data) == len(rows) and data.features["changed"].dtype == "bool"


@pytest.mark.e2e
@pytest.mark.parametrize("shape", ["conversations", "turns"])
def test_sft_data_trains_with_trl(trajectories, tiny_model, tmp_path, shape):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = sft_rows(trajectories) if shape == "conversations" else turn_rows(trajectories, window=2)
    data = load_dataset("json", data_files=str(write_rows(rows, tmp_path, shape)["jsonl"]), split="train")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        max_length=4096,
        dataset_num_proc=None,
        activation_checkpointing=False,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=data.remove_columns(["env_id", "task_id", "reward"]),
        processing_class=tokenizer,
    )
    result = trainer.train()
    assert result.global_step == 2 and math.isfinite(result.training_loss) and result.training_loss > 0
