"""Rollouts through an inference engine: the local policy server (chat completions with tools, token
ids, log-probabilities, policy versions, weight updates, continuous batching), asynchronous
rollouts without a per-turn barrier, bounded staleness with importance ratios, the vLLM client
against a fake server speaking vLLM's endpoints, and one real trainer step through the engine."""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from support.patience import MOMENTS_S, wait_until
from support.scripts import call_text

from worldsmith.agent.hf_policy import whole_distribution
from worldsmith.agent.loop import EpisodeConfig, Trajectory, TurnRecord
from worldsmith.agent.messages import Message, PolicyTurn
from worldsmith.agent.openai_policy import OpenAIPolicy
from worldsmith.bundle.contract import Bundle
from worldsmith.localserver import BackgroundServer
from worldsmith.models.verdict import Verdict
from worldsmith.training.async_rollouts import RolloutEvents, run_async_rollouts
from worldsmith.training.config import TrainingConfig
from worldsmith.training.engine import (
    EngineClient,
    EnginePolicy,
    EngineUnavailable,
    LocalWeights,
    RolloutEngine,
    VLLMAdapters,
    VLLMFullWeights,
    drop_stale,
    policy_state_dict,
    rollout_version,
)
from worldsmith.training.importance import sampler_correction, weigh_advantages
from worldsmith.training.policy_server import VERSION_HEADER, ContinuousBatcher, PolicyServer, policy_app
from worldsmith.training.rows import collate, windowed_rows

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

TASK = "t01_points_balance"


@pytest.fixture(scope="module")
def tiny(tiny_model: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model.eval()
    return model, AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def server(tiny: tuple[Any, Any]) -> PolicyServer:
    model, tokenizer = tiny
    with PolicyServer(copy.deepcopy(model), tokenizer) as running:
        yield running


def token_logps(model: Any, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0, len(prompt_ids) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


def task_view(bundle: Bundle) -> tuple[list[Message], list[Any]]:
    task = bundle.task(TASK)
    tools = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in bundle.tools][:3]
    return [Message(role="system", content="Use the tools."), Message(role="user", content=task.instruction)], tools


class ScriptedBatcher(ContinuousBatcher):
    """The real batcher and server, generation replaced by fixed text (a tool call the random tiny
    model would not write)."""

    text = ""

    def _generate(self, batch: list[Any]) -> list[tuple[list[int], list[float]]]:
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        return [(ids, [-0.5] * len(ids)) for _ in batch]


@pytest.mark.e2e
def test_engine_server_answers_chat_completions_with_tool_calls(tiny, golden):
    model, tokenizer = tiny
    solution = golden.task(TASK).solution[0]
    batcher = ScriptedBatcher(model, tokenizer)
    batcher.text = call_text(solution.tool, solution.arguments)
    view, tools = task_view(golden)
    try:
        with BackgroundServer(policy_app(batcher)) as running:
            policy = OpenAIPolicy("policy", base_url=f"{running.url}/v1", mode="native")  # the OpenAI SDK
            policy.start(golden, golden.task(TASK), 0)
            turn = policy.act(view, tools)
            raw = EngineClient(running.url).http.post(
                f"{running.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
            )
    finally:
        batcher.close()
    assert turn.format_error is None and turn.message is not None
    assert [(c.name, c.arguments) for c in turn.message.tool_calls] == [(solution.tool, solution.arguments)]
    assert raw.headers[VERSION_HEADER] == "0" and raw.json()["policy_version"] == 0
    assert raw.json()["choices"][0]["token_ids"] == tokenizer.encode(batcher.text, add_special_tokens=False)


@pytest.mark.e2e
def test_engine_completions_carry_the_served_models_token_logprobs(server, tiny, golden):
    model, tokenizer = tiny
    view, tools = task_view(golden)
    for temperature in (0.0, 1.0):  # greedy, and sampling from the whole distribution
        prompt_ids, ids, logprobs, version = EngineClient(server.url).complete(
            view, tools, temperature=temperature, max_tokens=8
        )
        assert version == 0 and ids and logprobs is not None
        assert logprobs == pytest.approx(token_logps(model, prompt_ids, ids), abs=1e-4)


@pytest.mark.e2e
def test_engine_weight_update_changes_the_next_completions_version_and_output(tiny, golden, tmp_path):
    model, tokenizer = tiny
    view, tools = task_view(golden)
    with PolicyServer(copy.deepcopy(model), tokenizer) as running:
        client = EngineClient(running.url)
        before = client.complete(view, tools, temperature=0.0, max_tokens=8)
        changed = copy.deepcopy(model)
        with torch.no_grad():
            for parameter in changed.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.5)
        assert LocalWeights(client, tmp_path).push(changed, 7) == 7
        after = client.complete(view, tools, temperature=0.0, max_tokens=8)
        with pytest.raises(RuntimeError, match="refused /v1/load_weights"):
            client.post("/v1/load_weights", {"path": str(tmp_path / "missing.pt")})
    assert before[3] == 0 and after[3] == 7
    assert after[0] == before[0]  # the same prompt
    assert (after[1], after[2]) != (before[1], before[2])
    assert after[2] == pytest.approx(token_logps(changed, after[0], after[1]), abs=1e-4)


def held_batcher(model, tokenizer) -> tuple[ContinuousBatcher, threading.Event, threading.Event]:
    """A batcher whose batches wait for `release` (the first event) once `running` (the second) is set."""
    release, running = threading.Event(), threading.Event()

    class HeldBatcher(ContinuousBatcher):
        def _generate(self, batch):
            running.set()
            assert release.wait(MOMENTS_S)
            return super()._generate(batch)

    return HeldBatcher(model, tokenizer), release, running


@pytest.mark.e2e
def test_engine_requests_arriving_during_a_batch_form_the_next_one(tiny):
    model, tokenizer = tiny
    batcher, release, first_running = held_batcher(model, tokenizer)
    try:
        first = batcher.generate([1, 2, 3], 1.0, 4)
        assert first_running.wait(MOMENTS_S)
        later = [batcher.generate([1, 2, 3, 4][: 2 + i], 1.0, 4) for i in range(3)]
        release.set()
        results = [job.done.result(MOMENTS_S) for job in [first, *later]]
    finally:
        batcher.close()
    assert (batcher.stats.batches, batcher.stats.largest_batch, batcher.stats.requests) == (2, 3, 4)
    assert all(len(ids) == len(logps) >= 1 for ids, logps, _ in results)


@pytest.mark.e2e
def test_engine_weights_sent_during_a_batch_serve_the_requests_after_it(tiny, golden, tmp_path):
    """A push that does not wait (a staleness bound of 1): the batch running keeps the old version,
    requests queued after the update get the new one; `settle` waits for it to land."""
    model, tokenizer = tiny
    batcher, release, first_running = held_batcher(copy.deepcopy(model), tokenizer)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        next(changed.parameters()).add_(1.0)
    try:
        with BackgroundServer(policy_app(batcher)) as running:
            client = EngineClient(running.url)
            engine = RolloutEngine(client, LocalWeights(client, tmp_path), tokenizer)
            first = batcher.generate([1, 2, 3], 1.0, 4)
            assert first_running.wait(MOMENTS_S)
            engine.push(changed, 1, wait=False)  # returns at once: the weights copied, sent on a thread
            wait_until(batcher.queued_updates, "the update to queue behind the running batch")
            later = batcher.generate([1, 2, 3], 1.0, 4)
            release.set()
            engine.settle()
    finally:
        batcher.close()
    assert first.done.result(MOMENTS_S)[2] == 0 and later.done.result(MOMENTS_S)[2] == 1
    assert client.version == 1 and [p.name for p in tmp_path.iterdir()] == ["policy-v1.pt"]


class ScriptedPolicy:
    """Answers at once, or after `wait` is set (a slow episode)."""

    shows_tools = True
    name = "scripted"

    def __init__(self, wait: threading.Event | None = None):
        self.wait = wait

    def start(self, bundle, task, seed):
        pass

    def act(self, view, tools):
        if self.wait is not None:
            assert self.wait.wait(MOMENTS_S), "the slow episode was never released"
        return PolicyTurn(message=Message(role="assistant", content="done"), policy_version=3)


@pytest.mark.sandbox
def test_engine_async_rollouts_judge_a_fast_episode_while_a_slow_one_runs(runtime, golden):
    judged = threading.Event()
    policies = [ScriptedPolicy(), ScriptedPolicy(wait=judged)]
    events = RolloutEvents()

    def judge(index: int, trajectory: Trajectory) -> None:
        trajectory.verdict = Verdict.partial
        if index == 0:
            judged.set()  # releases the slow episode: with a barrier it would wait forever

    jobs = [(golden, golden.task(TASK))] * 2
    trajectories = run_async_rollouts(
        runtime, jobs, policies.__getitem__, EpisodeConfig(max_turns=2), judge=judge, events=events
    )
    assert events.position("judged", 0) < events.position("finished", 1)
    assert events.most_in_flight == 2
    assert [t.verdict for t in trajectories] == [Verdict.partial] * 2
    assert [rollout_version(t) for t in trajectories] == [3, 3]


def trajectory_at(versions: list[int], record: TurnRecord | None = None) -> Trajectory:
    records = [record or TurnRecord(turn=i + 1) for i in range(len(versions))]
    records = [r.model_copy(update={"policy_version": v}) for r, v in zip(records, versions, strict=True)]
    return Trajectory(
        env_id="e", env_key="k", task_id="t", policy="p", messages=[], steps=[], turns=len(versions),
        verdict=Verdict.complete, reward=1.0, turn_records=records,
    )  # fmt: skip


@pytest.mark.e2e
def test_engine_stale_rollouts_are_dropped_and_one_step_stale_ones_get_importance_ratios(
    server, tiny, golden, tmp_path
):
    model, tokenizer = tiny
    view, tools = task_view(golden)
    client = EngineClient(server.url)
    prompt_ids, ids, behaviour, version = client.complete(view, tools, temperature=1.0, max_tokens=8)
    record = TurnRecord(turn=1, prompt_ids=prompt_ids, completion_ids=ids, completion_logprobs=behaviour)
    current = copy.deepcopy(model)  # the trainer one optimizer step later
    with torch.no_grad():
        for parameter in current.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    rollouts = [trajectory_at([version + 1, version + 1]), trajectory_at([version]), trajectory_at([version - 1, 2])]
    rollouts[1].turn_records[0] = record.model_copy(update={"policy_version": version})

    assert drop_stale(rollouts, current=version + 1, max_staleness=1) == [False, False, True]
    assert [t.reward for t in rollouts] == [1.0, 1.0, None]
    assert windowed_rows(rollouts[2], 1.0, 2) == []

    batch = collate(windowed_rows(rollouts[1], 1.0, 1), tokenizer.pad_token_id)
    trained = torch.tensor([token_logps(current, prompt_ids, ids)])
    mask = batch["completion_mask"].float()
    ratio, logged = sampler_correction(trained, batch["sampling_per_token_logps"], mask, "token_truncate", None, 3.0)
    expected = torch.exp(trained - torch.tensor([behaviour])).clamp(max=3.0)
    assert ratio == pytest.approx(expected, abs=1e-4)
    assert not torch.allclose(ratio, torch.ones_like(ratio))  # a step behind: the ratio corrects
    assert logged["sampling/sampling_logp_difference/mean"] > 0


@pytest.mark.e2e
def test_engine_vllm_adapters_load_through_vllms_endpoints(tiny, golden, tmp_path):
    """The vLLM client against a local server speaking vLLM's LoRA and chat endpoints."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny
    calls: list[tuple[str, dict[str, Any]]] = []
    app = FastAPI()

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request) -> str:
        body = await request.json()
        assert (Path(body["lora_path"]) / "adapter_config.json").is_file()
        calls.append(("load", body))
        return f"Success: LoRA adapter '{body['lora_name']}' added successfully."

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request) -> str:
        calls.append(("unload", await request.json()))
        return "Success"

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        calls.append(("chat", body))
        ids = tokenizer.encode("All done.<|im_end|>", add_special_tokens=False)
        return {
            "model": body["model"],
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "All done."},
                    "token_ids": ids,
                    "logprobs": {"content": [{"token": "x", "logprob": -0.25} for _ in ids]},
                }
            ],
        }

    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with BackgroundServer(app) as fake:
        client = EngineClient(fake.url, model="base")
        adapters = VLLMAdapters(client, tmp_path, keep=2)
        for version in range(3):
            adapters.push(peft, version)
        client.version = 2
        policy = EnginePolicy(client, tokenizer, max_new_tokens=16)
        policy.start(golden, golden.task(TASK), 0)
        view, tools = task_view(golden)
        turn = policy.act(view, tools)
    assert [(kind, body.get("lora_name")) for kind, body in calls[:4]] == [
        ("load", "policy-v0"),
        ("load", "policy-v1"),
        ("load", "policy-v2"),
        ("unload", "policy-v0"),
    ]
    request = calls[-1][1]
    assert request["model"] == "policy-v2" and request["return_token_ids"] and request["logprobs"]
    sampling = {k: request[k] for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")}
    assert sampling == {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
    assert turn.message is not None and turn.message.content == "All done."
    assert (turn.policy_version, turn.prompt_ids, turn.completion_logprobs) == (
        2,
        [1, 2, 3],
        [-0.25] * len(turn.completion_ids or []),
    )


def fake_vllm(tokenizer: Any, served: Any, calls: list[tuple[str, Any]], during_chat: Any = None) -> FastAPI:
    """A server speaking vLLM's development endpoints as `vllm serve` with VLLM_SERVER_DEV_MODE=1 does
    (vllm/entrypoints/serve/dev/rpc/api_router.py, serve/cache/api_router.py): `/collective_rpc`
    runs `reload_weights(weights_path=...)` as every worker's GPUModelRunner does (each
    `*.safetensors` file in the folder, checkpoint names, loaded into `served` in place) and answers
    one result per worker; `/reset_prefix_cache` answers 200 with no body. Chat completions carry
    vLLM's token fields and no policy version; `during_chat` runs while a request is served."""
    from safetensors.torch import load_file

    app = FastAPI()

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> JSONResponse:
        body = await request.json()
        assert body["method"] == "reload_weights" and set(body["kwargs"]) == {"weights_path"}
        folder = Path(body["kwargs"]["weights_path"])
        weights = {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}
        own = served.state_dict()
        assert set(weights) <= set(own), "a name vLLM's load_weights would not know"
        with torch.no_grad():
            for name, tensor in weights.items():
                own[name].copy_(tensor)
        calls.append(("reload", body["kwargs"]["weights_path"]))
        return JSONResponse({"results": [None]})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        calls.append(("reset", dict(request.query_params)))
        return Response(status_code=200)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        calls.append(("chat", body))
        if during_chat is not None:
            during_chat()
        ids = tokenizer.encode("All done.<|im_end|>", add_special_tokens=False)
        return {
            "model": body["model"],
            "prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "All done."}, "token_ids": ids,
                         "logprobs": {"content": [{"token": "x", "logprob": -0.25} for _ in ids]}}],
        }  # fmt: skip

    return app


@pytest.mark.e2e
def test_engine_vllm_full_weights_reload_in_place_through_vllms_dev_endpoints(tiny, golden, tmp_path):
    """Full fine-tuning against vLLM: each version written as safetensors under the base model's
    names and reloaded in place, the prefix cache reset with the running requests, the older
    folder removed; requests keep the served model's name, and a turn records the version pushed
    before it was sent even when the next push lands while it is served."""
    model, tokenizer = tiny
    served = copy.deepcopy(model).to(torch.bfloat16)
    calls: list[tuple[str, Any]] = []
    client = EngineClient("http://unset", model="base")
    app = fake_vllm(tokenizer, served, calls, during_chat=lambda: setattr(client, "version", 3))
    trained = copy.deepcopy(model)
    with BackgroundServer(app) as fake:
        client.url = fake.url
        pusher = VLLMFullWeights(client, tmp_path)
        for version in range(3):
            with torch.no_grad():
                next(trained.parameters()).add_(0.5)
            assert pusher.push(trained, version) == version
        client.version = 2
        policy = EnginePolicy(client, tokenizer, max_new_tokens=16)
        policy.start(golden, golden.task(TASK), 0)
        turn = policy.act(*task_view(golden))
    assert [kind for kind, _ in calls[:6]] == ["reload", "reset"] * 3
    assert calls[4][1] == str(tmp_path / "policy-v2") and calls[5][1] == {"reset_running_requests": "true"}
    assert [p.name for p in tmp_path.iterdir()] == ["policy-v2"]
    expected = trained.to(torch.bfloat16).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in served.state_dict().items())  # every weight, tied ones too
    assert calls[-1][1]["model"] == "base" and turn.policy_version == 2 and client.version == 3


@pytest.mark.e2e
def test_engine_vllm_without_dev_mode_or_lora_updating_is_refused_in_one_line(tiny, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with BackgroundServer(FastAPI()) as plain:  # `vllm serve` without the settings: neither endpoint exists
        client = EngineClient(plain.url)
        with pytest.raises(EngineUnavailable, match=r"has no /collective_rpc: start vLLM with VLLM_SERVER_DEV_MODE=1"):
            VLLMFullWeights(client, tmp_path).push(model, 0)
        with pytest.raises(EngineUnavailable, match=r"--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True$"):
            VLLMAdapters(client, tmp_path).push(peft, 0)


@pytest.mark.unit
def test_engine_vllm_needs_a_url_and_one_process():
    with pytest.raises(ValueError, match="engine_url"):
        TrainingConfig(model="m", set_name="s", rollout_engine="vllm")
    with pytest.raises(ValueError, match="one training process"):
        TrainingConfig(
            model="m", set_name="s", rollout_engine="vllm", engine_url="http://127.0.0.1:1", lora={"enabled": True},
            processes=2,
        )  # fmt: skip
    full = TrainingConfig(model="m", set_name="s", rollout_engine="vllm", engine_url="http://127.0.0.1:1")
    assert not full.lora.enabled  # full weights: reloaded in place (VLLMFullWeights)


@pytest.mark.e2e
def test_engine_serves_lora_weights_merged_under_the_base_models_names(tiny):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, parameter in peft.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.1)  # a trained adapter (PEFT starts B at 0)
    merged = policy_state_dict(peft)
    base = model.state_dict()
    assert set(merged) == set(base)
    changed = {k for k in base if not torch.equal(merged[k], base[k])}
    assert changed and all("q_proj" in k for k in changed)
    q = "model.layers.0.self_attn.q_proj"
    assert torch.equal(peft.state_dict()[f"base_model.model.{q}.base_layer.weight"], base[f"{q}.weight"])  # unmerged


@pytest.mark.e2e
def test_engine_trainer_steps_with_the_local_engine(tiny_model, golden, runtime, tmp_path):
    """Two real steps with rollout_engine local: the engine serves the trainer's weights from the start
    (the model differs from its directory's, yet the first step is on-policy), each step's weights
    are pushed as the next version, and with the default bound of 1 the second step's rollouts
    (started while the push lands) are at most one version behind and none is dropped."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, task_dataset

    bundle = dataclasses.replace(golden, tasks=(golden.task(TASK),))
    config = TrainingConfig(
        model=str(tiny_model), set_name="test", group_size=2, steps=2, learning_rate=1e-3, max_turns=2,
        max_completion_length=16, rows_per_step=1, rollout_engine="local", rollouts_in_flight=4,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)  # not the weights in tiny_model
    trainer = WorldGRPOTrainer(
        model=model,
        args=grpo_args(config, tmp_path / "out"),
        train_dataset=task_dataset({"b": bundle}),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        config=config,
        runtime=runtime,
        bundles={"b": bundle},
    )
    engine = trainer.engine
    assert engine is not None and engine.client.version == 0 and engine.server is not None
    assert not trainer.use_vllm and not hasattr(trainer, "vllm_generation")  # none of TRL's vLLM paths
    trainer._generate_single_turn = None  # TRL's generation: never called with an engine
    try:
        trainer.train()
        after = trainer.rollouts([{"bundle": "b", "task_id": TASK}])  # after training: the trained weights
    finally:
        engine.close()
    first, second = trainer.state.log_history[:2]
    assert first["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)  # on-policy
    assert first["stale_dropped"] == second["stale_dropped"] == 0.0
    assert {r.policy_version for t in trainer.last_rollouts for r in t.turn_records} <= {0, 1}
    assert engine.client.version == engine.server.batcher.version == 2  # pushed after each optimizer step
    assert {r.policy_version for r in after[0].turn_records} == {2}
    served = engine.server.batcher.model.state_dict()
    assert all(torch.equal(v, served[k]) for k, v in trainer.model.state_dict().items())  # the trained weights


@pytest.mark.unit
def test_engine_importance_ratio_rides_on_the_advantages_truncated_at_the_cap():
    """The sampler's correction in the trainer's own code: each loss token's advantage times
    exp(train - sampler) truncated at the cap (or masked out of bounds, its share logged); tokens
    outside the loss or without a sampler log-probability get ratio 1."""
    train = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]])
    sampler = torch.tensor([[-1.5, -0.5, float("nan")], [-2.0, -3.1, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    expected = torch.exp(torch.nan_to_num((train - sampler) * mask)).clamp(max=3.0)
    batch = {"advantages": torch.tensor([0.5, -1.0]), "sampling_per_token_logps": sampler}
    logged = weigh_advantages(batch, train, mask, "token_truncate", None, 3.0)
    assert torch.allclose(batch["advantages"], torch.tensor([[0.5], [-1.0]]) * expected)
    assert batch["advantages"][1, 0].item() == pytest.approx(-3.0)  # exp(1.8) = 6.05, truncated at 3
    assert torch.allclose(batch["importance_sampling_ratio"], expected)
    masked = {"advantages": torch.tensor([0.5, -1.0]), "sampling_per_token_logps": sampler}
    logged = weigh_advantages(masked, train, mask, "token_mask", None, 3.0)
    assert masked["advantages"][1, 0].item() == 0.0 and logged["sampling/masked_share"] == pytest.approx(1 / 5)
    unknown = {"advantages": torch.tensor([0.5, -1.0])}  # a sampler that reports none: ratio 1
    weigh_advantages(unknown, train, mask, "token_mask", None, 3.0)
    assert torch.equal(unknown["advantages"], torch.tensor([[0.5] * 3, [-1.0] * 3]))


@pytest.mark.unit
def test_engine_and_trainer_sample_the_whole_distribution_whatever_the_models_generation_config(tmp_path):
    """Sampling parity: TRL's transformers generation sets top_k 0 and top_p 1 but leaves min_p,
    typical_p... unset, which `generate` fills from the model's own generation config; under
    `whole_distribution` (the trainer's generation and the local server's) only the temperature
    shapes the distribution the loss's log-probabilities describe, and the model's config is back
    afterwards."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    from trl import GRPOConfig

    from worldsmith.training.trainer import grpo_settings

    config = Qwen3Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    own = GenerationConfig(do_sample=True, temperature=0.6, top_k=20, top_p=0.95, min_p=0.05, typical_p=0.9)
    model.generation_config = own
    args = GRPOConfig(**grpo_settings(TrainingConfig(model="m", set_name="s", temperature=0.7), tmp_path))
    trls = GenerationConfig(  # what GRPOTrainer builds for transformers generation
        do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
    )  # fmt: skip

    def warpers() -> list[str]:
        effective, _ = model._prepare_generation_config(trls)
        processors = model._get_logits_processor(
            generation_config=effective, input_ids_seq_length=3, encoder_input_ids=torch.zeros(1, 3, dtype=torch.long),
            prefix_allowed_tokens_fn=None, logits_processor=None, device="cpu",
        )  # fmt: skip
        return [type(p).__name__ for p in processors]

    assert {"MinPLogitsWarper", "TypicalLogitsWarper"} <= set(warpers())  # the model's own settings leak in
    with whole_distribution(model):
        assert warpers() == ["TemperatureLogitsWarper"]
    assert model.generation_config is own
