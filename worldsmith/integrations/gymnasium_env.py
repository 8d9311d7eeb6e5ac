"""Gymnasium: a world as a `gymnasium.Env` with text spaces (`pip install worldsmith[gymnasium]`).

An action is the assistant's text: tool calls written `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
or the final answer (no call). An observation is text: on `reset`, the system prompt (the tools, and
how to call them) and the task's instruction; on `step`, the tool results, one per line. The reward
is 0 until the episode ends, then the verified reward (`WorldEnv`'s configuration: code verifier,
judge or both; an env_error episode, which has none, gives 0 and says so in `info["verdict"]`).
`terminated`: the agent answered or broke the format, or the world failed; `truncated`: the turn
limit. `info` names the world and task, and the tools' JSON Schemas on reset; the verdict at the end.

`reset(options={"task": TaskRef | task id})` picks the task; without one, a task drawn with the
environment's seeded generator. Importing this module registers `worldsmith/World-v0`:
`gymnasium.make("worldsmith/World-v0", worlds="examples/bundles/retail_store")`. Many `WorldGymEnv`s
can share one `WorldEnv` (its runtime's pool): a vector env of them plays episodes at once.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import gymnasium
from gymnasium import spaces

from worldsmith.agent.openai_policy import TEXT_FORMAT
from worldsmith.integrations.environment import EnvConfig, EnvEpisode, WorldEnv, WorldSource

#: Every character an observation or action may hold: tab, newlines and the printable Basic Multilingual Plane.
CHARSET = "\t\n\r" + "".join(chr(c) for c in range(0x20, 0xD800)) + "".join(chr(c) for c in range(0xE000, 0x10000))
#: The longest observation: a tool result is at most 4 MiB (runtime/sandbox/protocol.py), and the prompt is shorter.
MAX_OBSERVATION = 4 * 1024 * 1024
#: The longest action the space samples and admits (a model's turn).
MAX_ACTION = 16 * 1024
ENV_ID = "worldsmith/World-v0"


@functools.cache
def _text_space(max_length: int) -> spaces.Text:
    """A prototype text space over CHARSET (never sampled: its generator stays unset). Building one indexes
    CHARSET's 63,000 characters (a third of a second): each environment takes a shallow copy instead."""
    return spaces.Text(max_length, min_length=0, charset=CHARSET)


def text_space(max_length: int) -> spaces.Text:
    """A text space of its own (its own random generator) over CHARSET, up to `max_length` characters."""
    return copy.copy(_text_space(max_length))


def opening(episode: EnvEpisode) -> str:
    """What the agent reads first: the system prompt (tools and the text format of a call), then the task."""
    system, user = episode.messages[0].content, episode.messages[1].content
    return f"{system}{TEXT_FORMAT}\n\n{user}"


class WorldGymEnv(gymnasium.Env[str, str]):
    """Episodes of `env`'s worlds (or of `worlds`, on an environment of its own made with `config`)
    as a Gymnasium environment; see the module docstring."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        worlds: WorldSource | list[WorldSource] | None = None,
        *,
        env: WorldEnv | None = None,
        config: EnvConfig | None = None,
    ):
        if (env is None) == (worlds is None):
            raise ValueError(
                "WorldGymEnv takes worlds (bundles, directories, references) or env (a WorldEnv), not both"
            )
        self._own_env = env is None
        self.env = env or WorldEnv(worlds if worlds is not None else (), config=config)
        self.observation_space = text_space(MAX_OBSERVATION)
        self.action_space = text_space(MAX_ACTION)
        self._tasks = self.env.tasks()
        self._episode: EnvEpisode | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._finish()
        task = (options or {}).get("task")
        if task is None:
            task = self._tasks[int(self.np_random.integers(len(self._tasks)))]
        self._episode = episode = self.env.reset(task)
        info = {"world": episode.world, "task_id": episode.task.id, "tools": episode.tools}
        return opening(episode), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        episode = self._episode
        if episode is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        played = episode.step(action)
        info: dict[str, Any] = {"world": episode.world, "task_id": episode.task.id}
        if not played.done:
            return played.observation, 0.0, False, False, info
        judged = episode.verify()
        info.update(verdict=str(judged.verdict), error=judged.error)
        reward = judged.reward if judged.reward is not None else 0.0
        return played.observation, float(reward), not played.truncated, played.truncated, info

    def _finish(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None

    def close(self) -> None:
        self._finish()
        if self._own_env:
            self.env.close()


def register() -> None:
    """Register `worldsmith/World-v0` with Gymnasium (done on import; again is harmless)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:WorldGymEnv", disable_env_checker=False)


register()
