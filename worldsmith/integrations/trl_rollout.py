"""TRL's `rollout_func`: a plain `GRPOTrainer` plays whole episodes of a world's tasks with its own model
(`GRPOTrainer(rollout_func=rollout_func(env), reward_funcs=[rollout_reward])`, trl 1.16, experimental),
the alternative to `environment_factory` (trl_env.py) for a trainer that wants the episode loop itself.

TRL calls `rollout(prompts, trainer)` with the prompts of the rows it drew (one completion each: TRL's
sampler has already repeated every prompt `num_generations` times). Each prompt is a row of
`env_dataset(env)` / `sets export --format hf`, recognised by its messages; its episode is opened on the
environment, and the trainer's model generates turns (at the trainer's `temperature` and `top_p`) until
the episode ends or the completion budget (`max_completion_length`) is spent: each turn is rendered with
the tokenizer's chat template and the world's tools, the model's text is the step (`EnvEpisode.step`:
tool calls, or the answer), and the tool results are appended as the template's tool turn. The completion is every generated token and every tool
result's token, `env_mask` telling them apart (1: the model's, trained; 0: the world's, not). The verified
trajectory goes to the reward functions as `world_trajectory`; `rollout_reward` gives its reward.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from worldsmith.agent.chat import hf_messages, hf_tools
from worldsmith.agent.hf_policy import stop_token_ids
from worldsmith.agent.loop import Trajectory
from worldsmith.agent.messages import Message
from worldsmith.failures import UserFixable
from worldsmith.integrations.dataset import task_rows
from worldsmith.integrations.environment import EnvEpisode, TaskRef, WorldEnv
from worldsmith.models.verdict import Verdict


class RolloutOutput(TypedDict):
    """What TRL's `rollout_func` returns: token ids per rollout, no sampling logprobs (TRL uses them only
    for vLLM's importance-sampling correction), the model/world token mask, and the judged trajectories."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: None
    env_mask: list[list[int]]
    world_trajectory: list[Trajectory]


def _prompt_key(prompt: Sequence[Any]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in prompt])


def rollout_func(env: WorldEnv) -> Callable[[list[Any], Any], RolloutOutput]:
    """`GRPOTrainer(rollout_func=...)` for the tasks of `env`'s worlds (rows of `env_dataset(env)`)."""
    tasks = {_prompt_key(row["prompt"]): TaskRef(row["world"], row["task_id"]) for row in task_rows(env.worlds)}

    def rollout(prompts: list[Any], trainer: Any) -> RolloutOutput:
        output = RolloutOutput(prompt_ids=[], completion_ids=[], logprobs=None, env_mask=[], world_trajectory=[])
        for prompt in prompts:
            ref = tasks.get(_prompt_key(prompt))
            if ref is None:
                raise UserFixable("a prompt is not a task of this environment: train on env_dataset(env)'s rows")
            with env.reset(ref) as episode:
                prompt_ids, completion, mask = _play(episode, prompt, trainer)
                trajectory = episode.verify()
            output["prompt_ids"].append(prompt_ids)
            output["completion_ids"].append(completion)
            output["env_mask"].append(mask)
            output["world_trajectory"].append(trajectory)
        return output

    return rollout


def _play(episode: EnvEpisode, prompt: Any, trainer: Any) -> tuple[list[int], list[int], list[int]]:
    """Generate turns with the trainer's model until `episode` ends or the budget is spent: (prompt ids,
    completion ids, env mask)."""
    import torch

    tokenizer = trainer.processing_class
    model = trainer.accelerator.unwrap_model(trainer.model)
    tools = hf_tools(episode.tools)
    template = {"tools": tools, **trainer.chat_template_kwargs}
    prompt_ids = list(
        tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False, **template)
    )
    budget = trainer.args.max_completion_length
    completion: list[int] = []
    mask: list[int] = []
    stops = stop_token_ids(tokenizer)
    was_training = model.training
    model.eval()
    try:
        while len(completion) < budget and not episode.done:
            ids = torch.tensor([prompt_ids + completion], device=model.device)
            with torch.no_grad():
                generated = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=budget - len(completion),
                    do_sample=True,
                    temperature=trainer.args.temperature,
                    top_p=trainer.args.top_p,
                    eos_token_id=stops,
                    pad_token_id=tokenizer.pad_token_id,
                )
            new = generated[0, ids.shape[1] :].tolist()
            completion += new
            mask += [1] * len(new)
            shown = len(episode.messages)
            step = episode.step(tokenizer.decode(new, skip_special_tokens=True))
            if step.done or len(completion) >= budget:
                break
            turn = _tool_turn_ids(tokenizer, episode.messages[shown:], template)
            completion += turn
            mask += [0] * len(turn)
    finally:
        model.train(was_training)
    return prompt_ids, completion[:budget], mask[:budget]


def _tool_turn_ids(tokenizer: Any, played: list[Message], template: dict[str, Any]) -> list[int]:
    """The chat template's tokens of the tool results in `played` (the assistant's message, then its tool
    messages), ending in the next assistant turn's opening: rendered after a stand-in conversation and cut
    after its last end-of-turn, as TRL renders tool results."""
    stand_in = [{"role": "user", "content": "-"}, *hf_messages(played[:1])]
    before = list(tokenizer.apply_chat_template(stand_in, tokenize=True, return_dict=False, **template))
    after = list(
        tokenizer.apply_chat_template(
            stand_in + hf_messages(played[1:]), add_generation_prompt=True, tokenize=True, return_dict=False, **template
        )
    )
    ends = [i for i, token in enumerate(before) if token in stop_token_ids(tokenizer)]
    cut = ends[-1] + 1 if ends else len(before)
    return after[cut:]


def rollout_reward(world_trajectory: Sequence[Trajectory], **_: object) -> list[float | None]:
    """TRL reward function for `rollout_func`: each rollout's verified reward (None for an env_error)."""
    return [None if t.verdict is Verdict.env_error else t.reward for t in world_trajectory]
