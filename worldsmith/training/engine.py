"""Rollouts through an inference engine: an OpenAI-compatible server serving the policy, the
trainer's weights pushed to it after each optimizer step.

Two engines speak the same chat-completions API, and `EngineClient` talks to both:
- `local`: the project's policy server (training/policy_server.py), transformers on CPU or one GPU;
  weights pushed as a state dict file through `POST /v1/load_weights`, which also sets the version;
- `vllm`: a vLLM OpenAI server on a GPU worker, sharing a folder with the trainer. A LoRA run's
  adapters are pushed as `save_pretrained` folders through vLLM's `POST /v1/load_lora_adapter
  {"lora_name", "lora_path"}` (`vllm serve <base> --enable-lora`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`),
  each under a new name `policy-v<step>` that later requests ask for as their `model`
  (`VLLMAdapters`). A full fine-tuning run's weights are written as one safetensors checkpoint
  `policy-v<step>/model.safetensors` under the base model's names, loaded in place through vLLM's
  development endpoint `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}`
  (every worker's `GPUModelRunner.reload_weights` reads the folder's safetensors, layer by layer,
  between two engine steps; `VLLM_SERVER_DEV_MODE=1`), then `POST /reset_prefix_cache
  ?reset_running_requests=true` so that no later token is computed over keys and values of the
  older weights (`VLLMFullWeights`). Nothing here imports vLLM.

Every request asks for vLLM's `return_token_ids` and `logprobs`, so each turn keeps the exact token
ids the engine saw and produced (the rows the trainer trains on) and each token's log-probability
under the behaviour policy (the importance ratio's denominator), and the policy version that
produced it: `policy_version` in the reply (the local server), else the version in the served
adapter's name (LoRA), else the last version pushed before the request was sent (full weights: a
push landing during the request makes its later tokens newer, never older, than recorded).

Bounded staleness: a rollout whose oldest turn is more than `max_staleness` versions behind the
trainer is dropped (`is_stale`); the others are corrected per token by the importance ratio of the
trainer's log-probabilities over the engine's (training/importance.py).
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from transformers import TrainerCallback

from worldsmith.agent.chat import hf_tools, wire_message
from worldsmith.agent.hf_policy import completion_text, read_turn
from worldsmith.agent.loop import EpisodeConfig, EpisodeSource, Trajectory, visible
from worldsmith.agent.messages import Message, PolicyTurn
from worldsmith.bundle.contract import Bundle
from worldsmith.failures import UserFixable
from worldsmith.models.bundle import TaskSpec
from worldsmith.runtime.episode import Runtime
from worldsmith.toolschema import ToolSchemaJson
from worldsmith.training.async_rollouts import RolloutEvents, run_async_rollouts
from worldsmith.training.config import TrainingConfig

_VERSIONED = re.compile(r"-v(\d+)$")


class EngineUnavailable(UserFixable, RuntimeError):
    """The engine did not answer or refused a request: the run's infrastructure, not the agent; the message
    names the engine's URL."""


class EngineClient:
    """Chat completions from an OpenAI-compatible engine at `url`, with token ids, log-probabilities
    and policy versions. `model` is the name requests ask for (a vLLM push changes it); `version`
    the last version pushed (what a reply that names none is taken to be)."""

    def __init__(self, url: str, model: str = "policy", *, timeout_s: float = 600.0, api_key: str | None = None):
        self.url, self.model, self.version = url.rstrip("/"), model, 0
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            timeout=timeout_s, headers=headers, limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        )

    def post(
        self, path: str, body: dict[str, Any] | None = None, *, params: dict[str, str] | None = None, missing: str = ""
    ) -> dict[str, Any]:
        """The engine's JSON answer to `body` at `path` ({} when it answers none); `missing` is what a
        404 means (the fix to name), else the engine's own words."""
        try:
            response = self.http.post(f"{self.url}{path}", json=body, params=params)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"the rollout engine at {self.url} did not answer: {type(exc).__name__}") from exc
        if response.status_code == 404 and missing:
            raise EngineUnavailable(f"the rollout engine at {self.url} has no {path}: {missing}")
        if response.status_code >= 400:
            raise EngineUnavailable(
                f"the rollout engine refused {path}: HTTP {response.status_code} {response.text[:200]}"
            )
        return dict(response.json()) if response.content.strip().startswith(b"{") else {}

    def complete(
        self, view: list[Message], tools: list[ToolSchemaJson], *, temperature: float, max_tokens: int
    ) -> tuple[list[int], list[int], list[float] | None, int]:
        """(prompt ids, completion ids, their log-probabilities, policy version) of one assistant turn."""
        issued = self.version  # a push landing during the request only makes its tokens newer
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [wire_message(m) for m in view],
            "temperature": temperature,
            # the whole softmax, as the loss assumes: vLLM otherwise takes the model's own defaults
            # (its generation_config.json: Qwen3's top_k 20, top_p 0.95) for what a request leaves out
            "top_k": -1,
            "top_p": 1.0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "max_tokens": max_tokens,
            "logprobs": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        if tools:
            body["tools"] = hf_tools(tools)
        reply = self.post("/v1/chat/completions", body)
        choice = reply["choices"][0]
        if "prompt_token_ids" not in reply or "token_ids" not in choice:
            raise EngineUnavailable(f"the rollout engine at {self.url} returns no token ids: it needs return_token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        logprobs = [float(t["logprob"]) for t in content] if content else None
        return list(reply["prompt_token_ids"]), list(choice["token_ids"]), logprobs, self._version_of(reply, issued)

    @staticmethod
    def _version_of(reply: dict[str, Any], issued: int) -> int:
        if isinstance(reply.get("policy_version"), int):
            return int(reply["policy_version"])
        named = _VERSIONED.search(str(reply.get("model", "")))
        return int(named.group(1)) if named else issued

    def close(self) -> None:
        self.http.close()


class EnginePolicy:
    """The policy being trained, served by the engine: an episode policy whose turns keep the engine's
    token ids, log-probabilities and policy version. `prefix` and `window` as `TrainingPolicy`'s."""

    shows_tools = True

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        prefix: list[Message] | None = None,
        window: int | None = None,
    ):
        self.client, self.tokenizer, self.name = client, tokenizer, "training"
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.prefix, self.window = prefix or [], window

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.turn = sum(m.role == "assistant" for m in self.prefix)  # tool-call ids stay unique

    def act(self, view: list[Message], tools: list[ToolSchemaJson]) -> PolicyTurn:
        self.turn += 1
        if self.prefix:
            view = visible([*view[:2], *self.prefix, *view[2:]], self.window)
        started = time.perf_counter()
        prompt_ids, completion_ids, logprobs, version = self.client.complete(
            view, tools, temperature=self.temperature, max_tokens=self.max_new_tokens
        )
        turn = read_turn(completion_text(self.tokenizer, completion_ids), self.turn)
        turn.tokens_in, turn.tokens_out, turn.seconds = (
            len(prompt_ids),
            len(completion_ids),
            time.perf_counter() - started,
        )
        turn.prompt_ids, turn.completion_ids, turn.completion_logprobs = prompt_ids, completion_ids, logprobs
        turn.policy_version = version
        return turn


def policy_state_dict(model: Any, dtype: Any = None) -> dict[str, Any]:
    """The weights the engine serves, on the CPU: the model's own, or with its LoRA adapters merged
    in (PEFT) under the base model's parameter names. The merge is computed beside the model (base +
    each active adapter's delta), never in place: merging and unmerging would drift the frozen base.
    `dtype`: floating-point weights cast to it in the one copy made (a model without adapters)."""

    def base_name(key: str) -> str:
        return key.removeprefix("base_model.model.").replace(".base_layer", "")

    def copy(v: Any) -> Any:
        cast = dtype if dtype is not None and v.is_floating_point() else v.dtype
        return v.detach().to("cpu", dtype=cast, copy=True)

    state = {base_name(k): copy(v) for k, v in model.state_dict().items() if "lora_" not in k}
    for name, module in model.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            key = base_name(f"{name}.base_layer.weight")
            for adapter in module.active_adapters:
                state[key] += module.get_delta_weight(adapter).detach().cpu().to(state[key].dtype)
    return state


class WeightPusher:
    """How a trainer's weights reach an engine: `snapshot` copies them at once (on the trainer's thread)
    and returns the function that sends them (on any thread), which returns the version loaded."""

    def snapshot(self, model: Any, version: int) -> Callable[[], int]:
        raise NotImplementedError

    def push(self, model: Any, version: int) -> int:
        """Snapshot and send at once; the version loaded."""
        return self.snapshot(model, version)()


class LocalWeights(WeightPusher):
    """Pushes to the project's policy server: each version's weights one state dict file in `folder`
    (the previous version's file removed once the next one is loaded)."""

    def __init__(self, client: EngineClient, folder: Path):
        self.client, self.folder = client, folder

    def snapshot(self, model: Any, version: int) -> Callable[[], int]:
        """Copies the weights now; the function returned writes and loads them (on any thread)."""
        state = policy_state_dict(model)

        def send() -> int:
            import torch

            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"policy-v{version}.pt"
            torch.save(state, path)
            loaded = int(
                self.client.post("/v1/load_weights", {"path": str(path), "version": version})["policy_version"]
            )
            for old in self.folder.glob("policy-v*.pt"):
                if old != path:
                    old.unlink(missing_ok=True)
            return loaded

        return send


class VLLMAdapters(WeightPusher):
    """Pushes LoRA adapters to a vLLM server: each version saved under `folder` and loaded as
    `policy-v<version>`, which later requests name; adapters `keep` versions older are unloaded."""

    def __init__(self, client: EngineClient, folder: Path, keep: int = 2):
        self.client, self.folder, self.keep = client, folder, keep

    def snapshot(self, model: Any, version: int) -> Callable[[], int]:
        """Saves the adapters now; the function returned loads them into vLLM (on any thread)."""
        name = f"policy-v{version}"
        path = self.folder / name
        model.save_pretrained(str(path))  # a PEFT model saves its adapters only

        def send() -> int:
            self.client.post(
                "/v1/load_lora_adapter",
                {"lora_name": name, "lora_path": str(path)},
                missing="start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
            )
            self.client.model = name
            old = version - self.keep
            if old >= 0:
                try:
                    self.client.post("/v1/unload_lora_adapter", {"lora_name": f"policy-v{old}"})
                except EngineUnavailable:  # never loaded (a resumed run): nothing to free
                    pass
            return version

        return send


VLLM_DEV_MODE = "start vLLM with VLLM_SERVER_DEV_MODE=1 (full-weight pushes use its development endpoints)"


class VLLMFullWeights(WeightPusher):
    """Pushes full weights to a vLLM server: each version written as `policy-v<version>/model.safetensors`
    under `folder` (a folder the server reads too) in `dtype`, under the base model's parameter names
    (`policy_state_dict`: LoRA merged), and reloaded in place by every vLLM worker
    (`reload_weights(weights_path=...)` through `/collective_rpc`); the prefix cache is then reset,
    running requests included, so that every later token is computed by the new weights. The
    previous version's folder is removed once the next one is loaded."""

    def __init__(self, client: EngineClient, folder: Path, dtype: Any = None):
        import torch

        self.client, self.folder, self.dtype = client, folder, dtype or torch.bfloat16

    def snapshot(self, model: Any, version: int) -> Callable[[], int]:
        """Copies the weights now; the function returned writes and loads them (on any thread)."""
        state = policy_state_dict(model, self.dtype)

        def send() -> int:
            from safetensors.torch import save_file

            path = self.folder / f"policy-v{version}"
            path.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            self.client.post("/collective_rpc", rpc, missing=VLLM_DEV_MODE)
            self.client.post("/reset_prefix_cache", params={"reset_running_requests": "true"}, missing=VLLM_DEV_MODE)
            for old in self.folder.glob("policy-v*"):
                if old != path and (old / "model.safetensors").is_file():
                    shutil.rmtree(old, ignore_errors=True)
            return version

        return send


def rollout_version(trajectory: Trajectory) -> int | None:
    """The oldest policy version among the rollout's turns (None: no turn reports one)."""
    versions = [r.policy_version for r in trajectory.turn_records if r.policy_version is not None]
    return min(versions) if versions else None


def is_stale(trajectory: Trajectory, current: int, max_staleness: int) -> bool:
    """Whether a turn of the rollout comes from a policy more than `max_staleness` versions behind `current`."""
    version = rollout_version(trajectory)
    return version is not None and current - version > max_staleness


class RolloutEngine:
    """The trainer's engine: a client, how weights reach the engine, and the local server when the
    project runs one (`for_training`)."""

    def __init__(self, client: EngineClient, pusher: WeightPusher, tokenizer: Any, server: Any = None):
        self.client, self.pusher, self.tokenizer, self.server = client, pusher, tokenizer, server
        self._pending: threading.Thread | None = None
        self._failed: Exception | None = None

    @classmethod
    def for_training(cls, config: TrainingConfig, model: Any, tokenizer: Any, folder: Path) -> RolloutEngine:
        """The engine `config.rollout_engine` names, holding `model`'s weights as version 0: `local`
        starts the policy server over a copy of the model unless `engine_url` names a running one;
        `vllm` needs `engine_url`, and loads a LoRA run's adapters (`VLLMAdapters`), else full
        weights (`VLLMFullWeights`)."""
        server = None
        if config.rollout_engine == "vllm":
            assert config.engine_url, "TrainingConfig requires engine_url for vllm"
            client = EngineClient(config.engine_url, model=config.model)
            pusher = VLLMAdapters(client, folder) if config.lora.enabled else VLLMFullWeights(client, folder)
            engine = cls(client, pusher, tokenizer)
        else:
            url = config.engine_url
            if url is None:
                from transformers import AutoModelForCausalLM

                from worldsmith.training.policy_server import PolicyServer

                served = AutoModelForCausalLM.from_pretrained(config.model, dtype=model.dtype).to(model.device)
                served.eval()
                server = PolicyServer(served, tokenizer, max_batch=config.rollouts_in_flight).__enter__()
                url = server.url
            client = EngineClient(url)
            engine = cls(client, LocalWeights(client, folder), tokenizer, server)
        engine.push(model, 0)
        return engine

    @classmethod
    def for_trainer(cls, trainer: Any) -> RolloutEngine:
        """`for_training` for a WorldGRPOTrainer: its model, tokenizer and output folder; the engine
        receives the weights after each optimizer step (`EngineSync`) and closes with the run."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        engine = cls.for_training(trainer.config, model, trainer.processing_class, Path(trainer.args.output_dir))
        trainer.add_callback(EngineSync(engine, overlap=trainer.config.max_staleness > 0))
        return engine

    def push(self, model: Any, version: int, *, wait: bool = True) -> None:
        """`model`'s current weights to the engine as `version` (later turns report it), after the
        previous push has landed. Without `wait` the weights are copied now and sent on a thread
        while the next rollouts start: their first turns may come from the version before (one
        step stale, corrected by the importance ratio)."""
        self.settle()
        send = self.pusher.snapshot(model, version)
        if wait:
            self.client.version = send()
            return

        def landed() -> None:
            try:
                self.client.version = send()
            except Exception as exc:  # noqa: BLE001 - raised by the next settle, on the trainer's thread
                self._failed = exc

        self._pending = threading.Thread(target=landed, daemon=True, name="engine-push")
        self._pending.start()

    def settle(self) -> None:
        """Waits for a push under way; raises its failure."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def rollouts(
        self,
        runtime: Runtime,
        jobs: list[tuple[Bundle, TaskSpec]],
        episode: EpisodeConfig,
        config: TrainingConfig,
        worlds: list[EpisodeSource] | None = None,
        prefixes: list[list[Message] | None] | None = None,
        judge: Callable[[int, Trajectory], None] | None = None,
        events: RolloutEvents | None = None,
    ) -> list[Trajectory]:
        """One episode per job against the engine, `rollouts_in_flight` at once, each judged as it ends."""

        def policy(index: int) -> EnginePolicy:
            return EnginePolicy(
                self.client,
                self.tokenizer,
                max_new_tokens=config.max_completion_length,
                temperature=config.temperature,
                prefix=prefixes[index] if prefixes else None,
                window=episode.window,
            )

        return run_async_rollouts(
            runtime, jobs, policy, episode, worlds, judge=judge, in_flight=config.rollouts_in_flight, events=events
        )

    def close(self) -> None:
        try:
            self.settle()
        finally:
            self.client.close()
        if self.server is not None:
            self.server.__exit__(None, None, None)


def drop_stale(trajectories: list[Trajectory], current: int, max_staleness: int) -> list[bool]:
    """Which rollouts are too stale (`is_stale`); those lose their reward (in place): they leave the
    group's baseline and give no rows, as an env_error does."""
    stale = [is_stale(t, current, max_staleness) for t in trajectories]
    for trajectory in (t for t, s in zip(trajectories, stale, strict=True) if s):
        trajectory.reward = None
    return stale


def judge_each(
    judge: Any, jobs: list[tuple[Bundle, TaskSpec]], metrics: dict[str, list[float]]
) -> Callable[[int, Trajectory], None] | None:
    """A per-rollout judge for `run_async_rollouts` from a training judge (judged_reward.RewardJudge,
    or None: no judge), each rollout's judge metrics appended to `metrics` (averaged per step)."""
    if judge is None:
        return None

    def one(index: int, trajectory: Trajectory) -> None:
        for key, value in judge.judge_rollouts([jobs[index][1]], [trajectory]).items():
            metrics[key].append(value)

    return one


class EngineSync(TrainerCallback):
    """Pushes the trained weights to the engine after each optimizer step, as version = the step:
    sent while the next rollouts start when `overlap` (a staleness bound of 1 or more), else
    before they start."""

    def __init__(self, engine: RolloutEngine, overlap: bool):
        self.engine, self.overlap = engine, overlap

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None:
            self.engine.push(model, state.global_step, wait=not self.overlap)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.engine.settle()  # the final weights served: rollouts after training (success rates) use them
