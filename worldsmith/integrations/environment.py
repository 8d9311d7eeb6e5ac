"""The environment object: worlds (bundle directories, catalog references, a set) behind one
reset/step/verify interface, what the adapters for other RL stacks wrap (gymnasium_env.py,
skyrl_env.py, trl_env.py; docs/integrations.md).

- `WorldEnv.reset(task)` opens an episode of the task's world on the runtime's sandbox pool (with the
  runtime's isolation mode) and returns it as an `EnvEpisode`: the instruction, the tools' JSON
  Schemas and the conversation so far (system prompt and instruction).
- `EnvEpisode.step(action)` plays one agent turn: a tool call (a `ToolCall`, or `{"name", "arguments"}`),
  or the assistant's text (tool calls written `<tool_call>{json}</tool_call>`; no call: the final answer;
  a malformed call: a format error). It returns what the agent observes and whether the episode ended.
- `EnvEpisode.verify()` judges the end state as `run_episode` does (agent/loop.py): the task's code
  verifier with the side-effect guard, then, when the configuration asks (`reward` judge or
  verifier+judge), the LLM judge of training/judged_reward.py; its `Trajectory` carries the verdict
  and the reward of the reward map.

Thread-safe: many episodes run at once from many threads (each episode is its own sandbox episode;
one episode's calls run one at a time).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field

from worldsmith.agent.hf_policy import read_turn
from worldsmith.agent.loop import EpisodeConfig, Step, Trajectory, play_turn, system_prompt, verified, visible
from worldsmith.agent.messages import Message, ToolCall
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import ToolResult
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.episode import Runtime, SandboxEpisode
from worldsmith.runtime.errors import RuntimeFault
from worldsmith.toolschema import ToolSchemaJson
from worldsmith.training.config import JudgeConfig, RewardSource
from worldsmith.training.judged_reward import RewardJudge, judge_endpoint

#: Where a world comes from: a loaded bundle, its directory, or a catalog reference (`ENV@VERSION`, `ENV`).
WorldSource = Bundle | Path | str
#: What `EnvEpisode.step` takes: a tool call, `{"name": ..., "arguments": {...}}`, or the assistant's text.
Action = ToolCall | Mapping[str, object] | str
#: The name `Trajectory.policy` records for an agent driven from outside worldsmith.
EXTERNAL_POLICY = "external"


class EnvConfig(BaseModel):
    """How episodes are played and judged: the episode loop's settings (turns, history window, reward
    map, side-effect guard) and where the reward comes from (TrainingConfig's `reward` and `judge`)."""

    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    reward: RewardSource = Field(
        "verifier", description="verifier: the code verifier rules; judge / verifier+judge: an LLM judge rules."
    )
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="The LLM judge of reward judge/verifier+judge.")


@dataclass(frozen=True)
class TaskRef:
    """One task of one world of the environment: the world's name (`WorldEnv.worlds`) and the task id."""

    world: str
    task_id: str


@dataclass(frozen=True)
class StepResult:
    """What one step gave: the agent's observation (the tool results' messages, one per line), each
    call's result, whether the episode ended, and why when it did (`verdict` format_error or env_error
    for an ended turn; None when it ended by an answer or the turn limit: `verify()` rules)."""

    observation: str
    results: tuple[ToolResult, ...]
    done: bool
    truncated: bool = False
    verdict: Verdict | None = None


def world_name(bundle: Bundle) -> str:
    """How an environment names a world: `ENV@VERSION` for a published version, else its env_id."""
    version = bundle.manifest.version
    return f"{bundle.env_id}@{version}" if version is not None else bundle.env_id


class EnvEpisode:
    """One episode of a task, played from outside: `step` until `done`, then `verify`. A context
    manager; closing it (or verifying) frees its sandbox episode."""

    def __init__(self, env: WorldEnv, world: str, bundle: Bundle, task: TaskSpec):
        self.env, self.world, self.bundle, self.task = env, world, bundle, task
        self._episode: SandboxEpisode = env.runtime.open_episode(bundle, task)
        self.id = self._episode.id
        self.tools: list[ToolSchemaJson] = self._episode.tools()
        self.messages: list[Message] = [
            Message(role="system", content=system_prompt(bundle)),
            Message(role="user", content=task.instruction),
        ]
        self.steps: list[Step] = []
        self.turns = 0
        self.answer = ""
        self.done = False
        self._ended: tuple[Verdict, str | None] | None = None  # a turn that ended it badly: verdict, error
        self._outcome: Trajectory | None = None
        self._started = time.perf_counter()
        self._lock = threading.Lock()

    @property
    def instruction(self) -> str:
        return self.task.instruction

    @property
    def ref(self) -> TaskRef:
        return TaskRef(self.world, self.task.id)

    def view(self) -> list[Message]:
        """The conversation as the policy sees it: system and task, then the configured history window."""
        return visible(self.messages, self.env.config.episode.window)

    def step(self, action: Action) -> StepResult:
        """Play one turn (see the module docstring). RuntimeFault when the episode has ended."""
        with self._lock:
            if self.done:
                raise RuntimeFault(f"episode {self.id} has ended: verify it, or reset a new one")
            self.turns += 1
            message, problem = self._message(action)
            if message is None:
                return self._end(Verdict.format_error, problem)
            self.messages.append(message)
            if not message.tool_calls:
                self.answer = message.content
                self.done = True
                return StepResult(observation="", results=(), done=True)
            results, shown = play_turn(self._episode, self.tools, self.turns, message, self.messages, self.steps)
            observation = "\n".join(m.content for m in shown)
            if results and results[-1].status == "env_error":
                return self._end(Verdict.env_error, results[-1].error, observation, tuple(results))
            truncated = self.turns >= self.env.config.episode.max_turns
            self.done = truncated
            return StepResult(observation, tuple(results), done=truncated, truncated=truncated)

    def _message(self, action: Action) -> tuple[Message | None, str | None]:
        """The assistant message of `action`, or (None, the format error)."""
        if isinstance(action, str):
            turn = read_turn(action, self.turns)
            return turn.message, turn.format_error
        if not isinstance(action, ToolCall):
            name, arguments = action.get("name"), action.get("arguments", {})
            if isinstance(arguments, str):  # OpenAI's function calls carry their arguments as JSON text
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    return None, "the tool call's arguments are not JSON"
            if not isinstance(name, str) or not isinstance(arguments, dict):
                return None, 'a tool call must be {"name": str, "arguments": object}'
            action = ToolCall(id=f"call_{self.turns}", name=name, arguments=arguments)
        return Message(role="assistant", tool_calls=[action]), None

    def _end(
        self, verdict: Verdict, error: str | None, observation: str = "", results: tuple[ToolResult, ...] = ()
    ) -> StepResult:
        self._ended, self.done = (verdict, error), True
        return StepResult(observation or f"error: {error}", results, done=True, verdict=verdict)

    def verify(self, answer: str | None = None) -> Trajectory:
        """Judge the episode (it ends here, if it had not): its trajectory, with the verdict and the
        reward. `answer` is the agent's final message (default: the answer its last step gave). Asked
        again, the same trajectory."""
        with self._lock:
            if self._outcome is not None:
                return self._outcome
            self.done = True
            if answer is not None:
                self.answer = answer
            try:
                self._outcome = self._judge()
            finally:
                self._episode.close()
            return self._outcome

    def _judge(self) -> Trajectory:
        env, config = self.env, self.env.config.episode
        evidence: JsonObject = {}
        if self._ended is not None:
            verdict, error = self._ended
        else:
            verdict, evidence, error = verified(
                env.runtime, self.bundle, self.task, self._episode, self.answer, config.side_effects
            )
        trajectory = Trajectory(
            env_id=self.bundle.env_id,
            env_key=self.bundle.key,
            task_id=self.task.id,
            policy=EXTERNAL_POLICY,
            tools=self.tools,
            messages=self.messages,
            steps=self.steps,
            turns=self.turns,
            answer=self.answer,
            verdict=verdict,
            reward=config.rewards.reward(verdict),
            evidence=evidence,
            error=error,
            seconds=time.perf_counter() - self._started,
        )
        if env.judge is not None:  # rules in place on what the verifier left (not on format or env errors)
            env.judge.judge_rollouts([self.task], [trajectory])
        return trajectory

    def close(self) -> None:
        """Free the episode's sandbox database (idempotent); an unverified episode stays unjudged."""
        with self._lock:
            self.done = True
            self._episode.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorldEnv:
    """Worlds behind reset/step/verify (see the module docstring). `worlds`: bundles, bundle
    directories or catalog references; `runtime`: the sandbox runtime to run episodes on (default:
    one of its own, from the settings, closed with the environment); `config`: how episodes are
    played and judged. A name `reset` does not know is opened as a directory or catalog reference."""

    def __init__(
        self,
        worlds: WorldSource | Iterable[WorldSource] = (),
        *,
        runtime: Runtime | None = None,
        config: EnvConfig | None = None,
    ):
        self.config = config or EnvConfig()
        self.judge: RewardJudge | None = None
        if self.config.reward != "verifier":  # a judge without an endpoint is refused here, in one line
            self.judge = RewardJudge(
                self.config.judge,
                judge_endpoint(self.config.judge),
                with_verifier=self.config.reward == "verifier+judge",
                rewards=self.config.episode.rewards,
            )
        self._own_runtime = runtime is None
        self.runtime = runtime or Runtime()
        self._worlds: dict[str, Bundle] = {}
        self._lock = threading.Lock()
        sources = [worlds] if isinstance(worlds, Bundle | Path | str) else list(worlds)
        for source in sources:
            self.add(source)

    @classmethod
    def from_set(
        cls, name: str, split: str = "all", *, runtime: Runtime | None = None, config: EnvConfig | None = None
    ) -> WorldEnv:
        """The members of environment set `name` in `split` (train, validation, or all), by catalog reference."""
        return cls(set_references(name, split), runtime=runtime, config=config)

    def add(self, source: WorldSource) -> str:
        """Add a world (opened now unless already a bundle); returns its name."""
        from worldsmith.storage.bundle_cache import open_bundle

        bundle = source if isinstance(source, Bundle) else open_bundle(source)
        name = world_name(bundle)
        with self._lock:
            self._worlds.setdefault(name, bundle)
            if isinstance(source, str) and source != name:
                self._worlds.setdefault(source, bundle)  # `ENV` (the latest version) answers too
        return name

    @property
    def worlds(self) -> dict[str, Bundle]:
        """The worlds by name (a copy)."""
        with self._lock:
            return dict(self._worlds)

    def world(self, name: str) -> Bundle:
        """World `name`, opened (directory or catalog reference) and kept on first use."""
        with self._lock:
            found = self._worlds.get(name)
        if found is not None:
            return found
        self.add(name)
        with self._lock:
            return self._worlds[name]

    def tasks(self) -> list[TaskRef]:
        """Every task of every world, world by world (each world once, under its own name)."""
        unique = {world_name(b): b for b in self.worlds.values()}
        return [TaskRef(name, task.id) for name, bundle in unique.items() for task in bundle.tasks]

    def reset(self, task: TaskRef | str, world: str | None = None) -> EnvEpisode:
        """A fresh episode of `task`: a `TaskRef`, or a task id (of `world`, or of the one world that has it)."""
        if isinstance(task, TaskRef):
            world, task_id = task.world, task.task_id
        else:
            task_id = task
        if world is None:
            holding = sorted({world_name(b) for b in self.worlds.values() if any(t.id == task_id for t in b.tasks)})
            if len(holding) != 1:
                where = f"worlds {', '.join(holding)} all have it" if holding else "no world has it"
                raise RuntimeFault(f"task {task_id!r}: {where}; name the world (reset(TaskRef(world, task)))")
            world = holding[0]
        bundle = self.world(world)
        try:
            spec = bundle.task(task_id)
        except KeyError as exc:
            raise RuntimeFault(str(exc.args[0])) from None
        return EnvEpisode(self, world, bundle, spec)

    def close(self) -> None:
        """Close the runtime when the environment made it (its open episodes with it)."""
        if self._own_runtime:
            self.runtime.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def set_members(name: str) -> list[tuple[str, str]]:
    """(catalog reference `ENV@VERSION`, split) of each member of set `name`, in the configured catalog;
    CatalogError when there is no such set."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.sets import member_refs

    return member_refs(open_catalog(), name)


def set_references(name: str, split: str = "all") -> list[str]:
    """The references of set `name`'s members in `split` ("all": every member); CatalogError when the set
    does not exist or has none there."""
    from worldsmith.storage.publish import CatalogError

    refs = [ref for ref, member_split in set_members(name) if split in ("all", member_split)]
    if not refs:
        raise CatalogError(f"set {name!r} has no members in split {split!r}")
    return refs
