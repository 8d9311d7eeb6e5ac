"""Rollouts for training: many episodes at once, each in its own thread running the ordinary
episode loop, their model calls gathered into one batched `generate` per turn.

A batch runs when every live episode is waiting for the model (or has ended), so which prompts
share a batch, and hence the sampled tokens under a fixed seed, do not depend on thread timing.
Batches run on the calling (trainer's) thread; the episode threads only wait and call tools.

Two history modes (TrainingConfig.history):
- windowed: the policy renders the task, the tools and the last `window` turns with the chat
  template each turn (what `HFPolicy` does), so each turn has its own prompt;
- full: the first prompt is rendered once; every later prompt is the previous prompt and
  completion plus the tool-result tokens spliced in exactly as TRL's tool loop does
  (`GRPOTrainer._get_tool_suffix_ids`, with TRL's prefix-preserving training variant of the chat
  template where the model's own is not, as Qwen3's is not), so one rollout is one token sequence.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from worldsmith.agent.hf_policy import HFPolicy, render_prompt
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


class ToolResultMessage(TypedDict):
    """A tool's result as TRL's tool loop renders it (`GRPOTrainer._get_tool_suffix_ids`): with the tool's name."""

    role: Literal["tool"]
    name: str
    content: str


class TrainingPolicy(HFPolicy):
    """The model being trained, as an episode policy: generation goes through the shared batcher;
    with `suffix` set (full history) prompts are spliced token by token instead of re-rendered.

    An episode that starts mid-way (a real start, worldmodel/real_starts.py) has `prefix`: the turns
    before it, which the policy sees as its own earlier ones, within its `window` (None: all)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batcher: Batcher,
        index: int,
        *,
        suffix: Callable[[list[ToolResultMessage]], list[int]] | None = None,
        chat_template: str | None = None,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        prefix: list[Message] | None = None,
        window: int | None = None,
    ):
        super().__init__(
            model=model, tokenizer=tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, timeout_s=None
        )
        self.name = "training"
        self.batcher, self.index, self.suffix, self.chat_template = batcher, index, suffix, chat_template
        self.prefix, self.window = prefix or [], window
        self._last: list[int] | None = None
        self._logprobs: list[float] | None = None

    def start(self, bundle: Bundle, task: TaskSpec, seed: int) -> None:
        self.turn, self._last = sum(m.role == "assistant" for m in self.prefix), None  # tool-call ids stay unique

    def prompt_ids(self, view: list[Message], tools: list[ToolSchemaJson]) -> list[int]:
        if self.suffix is None or self._last is None:
            return render_prompt(self.tokenizer, view, tools, self.chat_template)
        results: list[Message] = []
        for message in reversed(view):
            if message.role != "tool":
                break
            results.insert(0, message)
        calls: dict[str | None, str] = {c.id: c.name for m in view if m.role == "assistant" for c in m.tool_calls}
        return self._last + self.suffix(
            [{"role": "tool", "name": calls.get(m.tool_call_id, "tool"), "content": m.content} for m in results]
        )

    def generate(self, prompt_ids: list[int]) -> list[int]:
        completion = self.batcher.generate(self.index, prompt_ids)
        self._last, self._logprobs = prompt_ids + completion.ids, completion.logprobs
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
