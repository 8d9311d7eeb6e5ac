"""The local policy server: a transformers model behind an OpenAI-compatible `/v1/chat/completions`
(tools included), with a weight-update endpoint, for rollouts on CPU and in the tests (on GPU
workers vLLM serves the same API: training/engine.py talks to both).

- Prompts are rendered by the model's own chat template (`hf_policy.render_prompt`: what the
  trainer's rows and any OpenAI server use) and completions parsed by the project's tool-call
  reader (`hf_policy.read_turn`), returned as OpenAI `tool_calls`.
- Each completion also carries what vLLM returns with `return_token_ids` and `logprobs`
  (`prompt_token_ids`, the choice's `token_ids`, `logprobs.content[i].logprob`: the log-probability
  of each sampled token after temperature, as the trainer computes it) and `policy_version`, the
  version of the weights that produced it (also the `X-Policy-Version` header).
- `POST /v1/load_weights {"path", "version"}` loads a state dict the trainer wrote (`torch.save`,
  read with `weights_only`) and sets the version; it runs between two batches, never inside one.
- Continuous batching at batch granularity: requests wait in one queue; while a batch generates,
  arriving requests queue and form the next batch (up to `max_batch`, same temperature), so many
  episodes share forward passes without waiting for each other's turns. `GET /stats` reports the
  model's busy time, batches and requests (bench/rollouts.py reads the idle share from it).

Loopback only: `PolicyServer` binds 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from worldsmith.agent.chat import chat_tool_calls
from worldsmith.agent.hf_policy import completion_text, read_turn, render_prompt, stop_token_ids, whole_distribution
from worldsmith.agent.messages import Message, ToolCall
from worldsmith.localserver import BackgroundServer
from worldsmith.toolschema import ToolSchemaJson

VERSION_HEADER = "X-Policy-Version"


@dataclass
class _Generation:
    prompt_ids: list[int]
    temperature: float
    max_tokens: int
    done: Future[tuple[list[int], list[float], int]] = field(default_factory=Future)


@dataclass
class _Update:
    path: Path
    version: int | None
    done: Future[int] = field(default_factory=Future)


_Job = TypeVar("_Job", _Generation, _Update)


@dataclass
class EngineStats:
    """What the model did since the server started: seconds busy generating, batches, requests."""

    started: float = field(default_factory=time.monotonic)
    busy_s: float = 0.0
    batches: int = 0
    requests: int = 0
    largest_batch: int = 0


class ContinuousBatcher:
    """One worker thread owns the model: it takes every queued generation (same temperature, up to
    `max_batch`) as one batch, and weight updates one at a time between batches."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 64):
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch
        self.stop_ids = stop_token_ids(tokenizer)
        self.version = 0
        self.stats = EngineStats()
        self._queue: list[_Generation | _Update] = []
        self._changed = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._serve, daemon=True, name="policy-batcher")
        self._worker.start()

    def generate(self, prompt_ids: list[int], temperature: float, max_tokens: int) -> _Generation:
        return self._enqueue(_Generation(prompt_ids, temperature, max_tokens))

    def load(self, path: Path, version: int | None) -> _Update:
        return self._enqueue(_Update(path, version))

    def queued_updates(self) -> int:
        """Weight updates waiting for the batch before them to end."""
        with self._changed:
            return sum(isinstance(job, _Update) for job in self._queue)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._worker.join(timeout=30)

    def _enqueue(self, job: _Job) -> _Job:
        with self._changed:
            if self._closed:
                raise RuntimeError("the policy server is closed")
            self._queue.append(job)
            self._changed.notify_all()
        return job

    def _next(self) -> list[_Generation] | _Update | None:
        with self._changed:
            self._changed.wait_for(lambda: bool(self._queue) or self._closed)
            if self._closed:
                return None
            first = self._queue[0]
            if isinstance(first, _Update):
                self._queue.pop(0)
                return first
            batch: list[_Generation] = []
            for job in list(self._queue):
                if isinstance(job, _Update):  # an update waits for the batch before it, and the batch for it
                    break
                if job.temperature == first.temperature and len(batch) < self.max_batch:
                    batch.append(job)
            self._queue = [j for j in self._queue if not any(j is b for b in batch)]
            return batch

    def _serve(self) -> None:
        while (work := self._next()) is not None:
            if isinstance(work, _Update):
                try:
                    work.done.set_result(self._load(work))
                except Exception as exc:  # noqa: BLE001 - the caller sees why the weights did not load
                    work.done.set_exception(exc)
                continue
            started = time.monotonic()
            try:
                for job, result in zip(work, self._generate(work), strict=True):
                    job.done.set_result((*result, self.version))
            except Exception as exc:  # noqa: BLE001 - every request of the batch sees the model's failure
                for job in work:
                    job.done.set_exception(exc)
            self.stats.busy_s += time.monotonic() - started
            self.stats.batches += 1
            self.stats.requests += len(work)
            self.stats.largest_batch = max(self.stats.largest_batch, len(work))

    def _load(self, update: _Update) -> int:
        import torch

        state = torch.load(update.path, map_location=self.model.device, weights_only=True)
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or len(missing) == len(self.model.state_dict()):
            raise ValueError(f"{update.path} does not hold this model's weights (unexpected: {unexpected[:3]})")
        self.version = update.version if update.version is not None else self.version + 1
        return self.version

    def _generate(self, batch: list[_Generation]) -> list[tuple[list[int], list[float]]]:
        """Left-padded prompts through one `generate`; each completion cut after its first stop token
        or its own `max_tokens`, with its tokens' log-probabilities (after temperature)."""
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]
        width = max(len(job.prompt_ids) for job in batch)
        ids = torch.tensor([[pad] * (width - len(j.prompt_ids)) + j.prompt_ids for j in batch])
        mask = torch.tensor([[0] * (width - len(j.prompt_ids)) + [1] * len(j.prompt_ids) for j in batch])
        temperature = batch[0].temperature
        sampling: dict[str, Any] = {"do_sample": False}
        if temperature > 0:  # the whole distribution, as the trainer's log-probabilities assume (no top-k/top-p)
            sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        with torch.no_grad(), whole_distribution(self.model):
            out = self.model.generate(
                ids.to(self.model.device),
                attention_mask=mask.to(self.model.device),
                max_new_tokens=max(j.max_tokens for j in batch),
                eos_token_id=self.stop_ids,
                pad_token_id=pad,
                output_scores=True,
                return_dict_in_generate=True,
                **sampling,
            )
            logps = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        results = []
        for row, job in enumerate(batch):
            tokens: list[int] = out.sequences[row, width:].tolist()[: job.max_tokens]
            end = next((i + 1 for i, t in enumerate(tokens) if t in self.stop_ids), len(tokens))
            results.append((tokens[:end], logps[row, :end].float().tolist()))
        return results


def wire_messages(messages: list[dict[str, Any]]) -> list[Message]:
    """OpenAI chat messages (tool-call arguments as JSON text) as episode messages."""
    out = []
    for m in messages:
        calls = [
            ToolCall(
                id=c.get("id", f"call_{i}"),
                name=c["function"]["name"],
                arguments=json.loads(c["function"].get("arguments") or "{}"),
            )
            for i, c in enumerate(m.get("tool_calls") or [])
        ]
        out.append(
            Message(
                role=m["role"], content=m.get("content") or "", tool_calls=calls, tool_call_id=m.get("tool_call_id")
            )
        )
    return out


def wire_tools(tools: list[dict[str, Any]] | None) -> list[ToolSchemaJson]:
    """OpenAI `tools` (functions) as the tool schemas chat templates render."""
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "parameters": t["function"].get("parameters", {"type": "object", "properties": {}}),
        }
        for t in tools or []
    ]


def policy_app(batcher: ContinuousBatcher, model_name: str = "policy") -> Any:
    """The FastAPI app serving `batcher`'s model as `model_name` (see the module docstring)."""
    app = FastAPI(title="worldsmith policy server")
    tokenizer = batcher.tokenizer

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "policy_version": batcher.version}]}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        s = batcher.stats
        return {
            "elapsed_s": time.monotonic() - s.started,
            "busy_s": s.busy_s,
            "batches": s.batches,
            "requests": s.requests,
            "largest_batch": s.largest_batch,
            "policy_version": batcher.version,
        }

    @app.post("/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        body = await request.json()
        try:
            version = await asyncio.wrap_future(batcher.load(Path(body["path"]), body.get("version")).done)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise HTTPException(400, f"weights not loaded: {exc}") from exc
        return {"policy_version": version}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("stream"):
            raise HTTPException(400, "streaming is not supported")
        prompt_ids = render_prompt(tokenizer, wire_messages(body["messages"]), wire_tools(body.get("tools")))
        job = batcher.generate(
            prompt_ids,
            float(body.get("temperature", 1.0)),
            int(body.get("max_tokens") or body.get("max_completion_tokens") or 256),
        )
        completion_ids, logprobs, version = await asyncio.wrap_future(job.done)
        return JSONResponse(
            chat_response(tokenizer, model_name, prompt_ids, completion_ids, logprobs, version),
            headers={VERSION_HEADER: str(version)},
        )

    return app


def chat_response(
    tokenizer: Any,
    model_name: str,
    prompt_ids: list[int],
    completion_ids: list[int],
    logprobs: list[float],
    version: int,
) -> dict[str, Any]:
    """One chat completion in OpenAI's shape, with vLLM's token fields and the policy version."""
    text = completion_text(tokenizer, completion_ids)
    turn = read_turn(text, 1)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if turn.message is not None and turn.message.tool_calls:
        message = {
            "role": "assistant",
            "content": turn.message.content or None,
            "tool_calls": chat_tool_calls(
                [c.model_copy(update={"id": f"call_{uuid.uuid4().hex[:12]}"}) for c in turn.message.tool_calls],
                arguments_as_text=True,
                with_ids=True,
            ),
        }
    finished = bool(completion_ids) and completion_ids[-1] in stop_token_ids(tokenizer)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "policy_version": version,
        "prompt_token_ids": prompt_ids,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": ("tool_calls" if "tool_calls" in message else "stop") if finished else "length",
                "token_ids": completion_ids,
                "logprobs": {
                    "content": [
                        {"token": tokenizer.decode([t]), "logprob": lp}
                        for t, lp in zip(completion_ids, logprobs, strict=True)
                    ]
                },
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(completion_ids),
            "total_tokens": len(prompt_ids) + len(completion_ids),
        },
    }


class PolicyServer:
    """A running local policy server over `model` (`url` once entered); closing stops the batcher."""

    def __init__(self, model: Any, tokenizer: Any, *, max_batch: int = 64, model_name: str = "policy"):
        self.batcher = ContinuousBatcher(model, tokenizer, max_batch)
        self.model_name = model_name
        self._server = BackgroundServer(policy_app(self.batcher, model_name))

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> PolicyServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)
        self.batcher.close()
