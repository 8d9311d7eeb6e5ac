"""Rollouts for training: many episodes at once, each in its own thread running the ordinary
episode loop, their model calls gathered into one batched `generate` per turn.

A batch runs when every live episode is waiting for the model (or has ended), so which prompts
share a batch, and hence the sampled tokens under a fixed seed, do not depend on thread timing.
Batches run on the calling (trainer's) thread; the episode threads only wait and call tools.

Two history modes (TrainingConfig.history), both rendered by the model's own chat template each
turn (what `HFPolicy` does, and what any OpenAI-compatible server serving the model does), so the
tokens trained on are the tokens the model sees when serving:
- windowed: the task, the tools and the last `window` turns;
- full: the whole conversation (rows.full_rows joins turns into one row where the template lets
  one turn's prompt extend the last).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from worldsmith.agent.hf_policy import HFPolicy
from worldsmith.agent.loop import EpisodeConfig, EpisodeSource, Trajectory, run_episode, visible
from worldsmith.agent.messages import Message, PolicyTurn
from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.runtime.episode import Runtime
from worldsmith.toolschema import ToolSchemaJson


@dataclass(frozen=True)
class Sampled:
    """One generated completion: its token ids and, when the generation backend reports them
    (vLLM), each token's log-probability under the sampler (for the importance-sampling correction)."""

    ids: list[int]
    logprobs: list[float] | None = None


GenerateBatch = Callable[[list[list[int]]], list[Sampled]]


@dataclass
class _Request:
    index: int
    prompt_ids: list[int]
    done: threading.Event = field(default_factory=threading.Event)
    completion: Sampled | None = None
    error: BaseException | None = None


class Batcher:
    """Collects one prompt from each live episode, then generates for all of them in one call.

    `generate_batch(prompts) -> completions` does the model work, always on the thread that calls
    `serve` (the trainer's: it owns the model's CUDA device, which is per thread, its process group
    and any vLLM engine). Episode threads call `generate` (blocks until their completion is ready)
    and `retire` when they end."""

    def __init__(self, generate_batch: GenerateBatch, live: int):
        self._generate_batch, self._live = generate_batch, live
        self._pending: list[_Request] = []
        self._changed = threading.Condition()
        self._stopped: BaseException | None = None

    def generate(self, index: int, prompt_ids: list[int]) -> Sampled:
        request = _Request(index, prompt_ids)
        with self._changed:
            if self._stopped is not None:
                raise self._stopped_error() from self._stopped
            self._pending.append(request)
            self._changed.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.completion or Sampled([])

    def retire(self) -> None:
        with self._changed:
            self._live -= 1
            self._changed.notify_all()

    def serve(self) -> None:
        """Runs each batch on this thread as soon as every live episode waits, until none is live.
        Should it stop early (an interrupt), the episodes waiting and any that ask later fail."""
        batch: list[_Request] | None = None
        try:
            while (batch := self._next_batch()) is not None:
                self._run(batch)
        except BaseException as exc:
            self._stop(exc, batch or [])
            raise

    def _stop(self, cause: BaseException, batch: list[_Request]) -> None:
        """Fails every request not answered yet (the batch in hand, those waiting) and all later ones."""
        with self._changed:
            self._stopped, waiting, self._pending = cause, [*batch, *self._pending], []
        for request in waiting:
            if not request.done.is_set():
                request.error = self._stopped_error()
                request.done.set()

    def _stopped_error(self) -> RuntimeError:
        return RuntimeError(f"rollouts stopped: {type(self._stopped).__name__}")

    def _next_batch(self) -> list[_Request] | None:
        with self._changed:
            self._changed.wait_for(lambda: self._live <= 0 or len(self._pending) >= self._live)
            if self._live <= 0:
                return None
            ready, self._pending = sorted(self._pending, key=lambda r: r.index), []
            return ready

    def _run(self, ready: list[_Request]) -> None:
        try:
            completions = self._generate_batch([r.prompt_ids for r in ready])
            for request, completion in zip(ready, completions, strict=True):
                request.completion = completion
        except Exception as exc:  # noqa: BLE001 - every waiting episode sees the model's failure
            for request in ready:
                request.error = exc
        for request in ready:
            request.done.set()


class TrainingPolicy(HFPolicy):
    """The model being trained, as an episode policy: generation goes through the shared batcher.

    An episode that starts mid-way (a real start, worldmodel/real_starts.py) has `prefix`: the turns
    before it, which the policy sees as its own earlier ones, within its `window` (None: all)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batcher: Batcher,
        index: int,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        prefix: list[Message] | None = None,
        window: int | None = None,
    ):
        super().__init__(
            model=model, tokenizer=tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, timeout_s=None
        )
        self.name = "training"
        self.batcher, self.index = batcher, index
        self.prefix, self.window = prefix or [], window
        self._logprobs: list[float] | None = None

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.turn = sum(m.role == "assistant" for m in self.prefix)  # tool-call ids stay unique

    def generate(self, prompt_ids: list[int]) -> list[int]:
        completion = self.batcher.generate(self.index, prompt_ids)
        self._logprobs = completion.logprobs
        return completion.ids

    def act(self, view: list[Message], tools: list[ToolSchemaJson]) -> PolicyTurn:
        if self.prefix:  # the task, the prefix, then the episode's own turns: the last `window` of them all
            view = visible([*view[:2], *self.prefix, *view[2:]], self.window)
        turn = super().act(view, tools)
        turn.completion_logprobs = self._logprobs
        return turn


def run_rollouts(
    runtime: Runtime,
    jobs: list[tuple[Bundle, TaskSpec]],
    make_policy: Callable[[Batcher, int], TrainingPolicy],
    generate_batch: GenerateBatch,
    config: EpisodeConfig,
    worlds: list[EpisodeSource] | None = None,
) -> list[Trajectory]:
    """One episode per (bundle, task) job, all concurrently with batched generation (the job's
    position is its episode seed), in the job's world (`worlds`, default the real `runtime`); the
    trajectories come back in job order."""
    batcher = Batcher(generate_batch, live=len(jobs))

    def one(index: int) -> Trajectory:
        bundle, task = jobs[index]
        try:
            return run_episode(
                runtime,
                bundle,
                task,
                make_policy(batcher, index),
                config.model_copy(update={"seed": index}),
                world=worlds[index] if worlds else None,
            )
        finally:
            batcher.retire()

    with ThreadPoolExecutor(max_workers=max(1, len(jobs)), thread_name_prefix="rollout") as pool:
        episodes = [pool.submit(one, index) for index in range(len(jobs))]
        batcher.serve()  # the model works on this thread; the episodes' threads only wait and call tools
        return [episode.result() for episode in episodes]


def truncated_turn_rate(trajectories: list[Trajectory], max_new_tokens: int, stop_ids: list[int]) -> float:
    """The share of the policy's turns in `trajectories` cut off at `max_new_tokens` before a stop
    token (their tool call or answer unfinished: a format error, or an answer that was never
    complete); 0 when there are no turns."""
    turns = [r.completion_ids or [] for t in trajectories for r in t.turn_records]
    cut = sum(len(ids) >= max_new_tokens and ids[-1] not in stop_ids for ids in turns)
    return cut / len(turns) if turns else 0.0
