"""SkyRL-gym: a world's task as a `skyrl_gym` text environment (`pip install worldsmith[skyrl]`).

SkyRL makes one environment per trajectory, `skyrl_gym.make("worldsmith", env_config=..., extras=row)`,
where `row` is the dataset row's fields: here a row of `sets export --format hf` (its `world` and
`task_id` name the task). `init(prompt)` opens the episode and gives the conversation the model starts
from (the system prompt with the tools and the `<tool_call>` format, and the task's instruction, in
place of the row's prompt); `step(text)` plays the model's turn (a tool call, or the final answer) and
gives the tool results as a user message; the last step's reward is the verified reward
(`WorldEnv`'s configuration; an env_error episode, which has none, gives 0 with `verdict` env_error in
the metadata).

SkyRL builds environments from configuration, never from objects: every instance in a process plays on
one shared `WorldEnv` (`shared_env`; `use_env` sets it, else one is made on first use from the settings,
opening worlds by reference). Importing this module registers the id `worldsmith`.
"""

from __future__ import annotations

import threading
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from worldsmith.agent.openai_policy import TEXT_FORMAT
from worldsmith.integrations.environment import EnvEpisode, TaskRef, WorldEnv

ENV_ID = "worldsmith"

_shared: WorldEnv | None = None
_shared_lock = threading.Lock()


def use_env(env: WorldEnv | None) -> None:
    """Make `env` the environment every `WorldSkyEnv` of this process plays on (None: forget it)."""
    global _shared
    with _shared_lock:
        _shared = env


def shared_env() -> WorldEnv:
    """The environment `use_env` set, else one made now (worlds opened by reference as rows name them)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WorldEnv()
        return _shared


class WorldSkyEnv(BaseTextEnv):  # type: ignore[misc]  # skyrl_gym ships no type information
    """One episode of the row's task (`extras["world"]`, `extras["task_id"]`); see the module docstring."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = extras or {}
        missing = [key for key in ("world", "task_id") if key not in extras]
        if missing:
            raise ValueError(f"a worldsmith row names its task: {', '.join(missing)} missing (sets export --format hf)")
        self.task = TaskRef(str(extras["world"]), str(extras["task_id"]))
        self.env = shared_env()
        self.max_turns = self.env.config.episode.max_turns
        self.episode: EnvEpisode | None = None
        self.verdict: str | None = None

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        if self.episode is not None:
            self.episode.close()
        self.episode = episode = self.env.reset(self.task)
        system, user = episode.messages[0].content, episode.messages[1].content
        conversation = [{"role": "system", "content": system + TEXT_FORMAT}, {"role": "user", "content": user}]
        return conversation, {"world": episode.world, "task_id": episode.task.id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.episode is None:
            raise RuntimeError("init() opens the episode before any step")
        self.turns += 1
        played = self.episode.step(action)
        if not played.done:
            observation = {"role": "user", "content": played.observation}
            return BaseTextEnvStepOutput(observations=[observation], reward=0.0, done=False, metadata={})
        judged = self.episode.verify()
        self.verdict = str(judged.verdict)
        observations = [{"role": "user", "content": played.observation}] if played.observation else []
        metadata = {"verdict": self.verdict, "error": judged.error}
        reward = judged.reward if judged.reward is not None else 0.0
        return BaseTextEnvStepOutput(observations=observations, reward=float(reward), done=True, metadata=metadata)

    def get_metrics(self) -> dict[str, Any]:
        return {"complete": float(self.verdict == "complete"), "turns": self.turns}

    def close(self) -> None:
        if self.episode is not None:
            self.episode.close()


def register() -> None:
    """Register the id `worldsmith` with skyrl_gym (done on import; again is harmless)."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:WorldSkyEnv")


register()
