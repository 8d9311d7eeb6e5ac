"""Imagined rollouts that start from a real mid-episode state (TrainingConfig.real_starts).

A start is a real episode of the task cut after its first `turns` tool-calling turns: the assistant
messages of those turns are replayed, call by call, in a fresh episode of the real world, and the
start holds what that gave: the messages (the replayed tool results, not the recorded ones), the
steps, the database and the calls as the world model's history. An imagined episode opened from it
(`StartedSimulation`) continues on that database with that history, and the policy sees the
replayed turns as its own earlier ones. Real episodes come from the run's real rollouts of the task
and, for a task none of them has reached yet, its reference solution.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from worldsmith.agent.loop import EpisodeConfig, Step, Trajectory, play_turn, run_episode
from worldsmith.agent.messages import Message
from worldsmith.agent.policies import ReferencePolicy
from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.runtime.episode import Runtime
from worldsmith.worldmodel.simulated import SimulatedEpisode, SimulatedRuntime
from worldsmith.worldmodel.transitions import HistoryEntry, observation_of

KEPT_PER_TASK = 8


@dataclass(frozen=True)
class RealStart:
    """A real episode's state after `turns` tool-calling turns (see the module docstring)."""

    turns: int
    messages: list[Message]
    steps: list[Step]
    database: bytes = field(repr=False)
    history: list[HistoryEntry]
    source: str


def tool_turns(trajectory: Trajectory) -> list[Message]:
    """The assistant messages of `trajectory` that call tools, in order."""
    return [m for m in trajectory.messages if m.role == "assistant" and m.tool_calls]


def real_start(
    runtime: Runtime, bundle: Bundle, task: TaskSpec, trajectory: Trajectory, turns: int, source: str
) -> RealStart | None:
    """The state of `trajectory` after its first `turns` tool-calling turns, replayed in the real world
    (None when a replayed call fails the environment)."""
    messages: list[Message] = []
    steps: list[Step] = []
    history: list[HistoryEntry] = []
    with runtime.open_episode(bundle, task) as episode:
        tools = episode.tools()
        for turn, message in enumerate(tool_turns(trajectory)[:turns], start=1):
            messages.append(message)
            results, _ = play_turn(episode, tools, turn, message, messages, steps)
            if results and results[-1].status == "env_error":
                return None
            history += [
                {
                    "action": {"name": call.name, "arguments": call.arguments},
                    "observation": observation_of(result).record(),
                }
                for call, result in zip(message.tool_calls, results, strict=True)
            ]
        database = episode.snapshot()
    return RealStart(turns, messages, steps, database, history, source)


class StartedSimulation:
    """An episode source (`agent.loop.EpisodeSource`): imagined episodes opened from one real start."""

    def __init__(self, simulation: SimulatedRuntime, start: RealStart):
        self.simulation, self.start = simulation, start
        self.name = simulation.name

    def open_episode(self, bundle: Bundle, task: str | TaskSpec | None = None) -> SimulatedEpisode:
        return self.simulation.open_episode(bundle, task, start=(self.start.database, self.start.history))


class RealStarts:
    """Where imagined rollouts start: the real episodes of each task seen so far (the run's real
    rollouts that called a tool, the latest `KEPT_PER_TASK` per task; the reference solution until
    one exists), from which `draw` cuts a start at a random tool-calling turn."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.seen: dict[tuple[str, str], deque[Trajectory]] = {}
        self._references: dict[tuple[str, str], Trajectory | None] = {}

    def add(self, trajectories: list[Trajectory]) -> None:
        """Keep the real rollouts among `trajectories` that called a tool and did not fail the world."""
        for t in trajectories:
            if t.world == "real" and t.verdict != "env_error" and tool_turns(t):
                self.seen.setdefault((t.env_key, t.task_id), deque(maxlen=KEPT_PER_TASK)).append(t)

    def _reference(self, bundle: Bundle, task: TaskSpec) -> Trajectory | None:
        key = (bundle.key, task.id)
        if key not in self._references:
            episode = EpisodeConfig(max_turns=100, side_effects=False)
            solved = run_episode(self.runtime, bundle, task, ReferencePolicy(), episode) if task.solution else None
            self._references[key] = solved if solved is not None and tool_turns(solved) else None
        return self._references[key]

    def draw(self, bundle: Bundle, task: TaskSpec, rng: random.Random) -> RealStart | None:
        """A start for `task` (None when no real episode of it called a tool, or its replay failed)."""
        pool = list(self.seen.get((bundle.key, task.id), ()))
        source = "rollout"
        if not pool:
            reference = self._reference(bundle, task)
            pool, source = ([reference] if reference is not None else []), "reference"
        if not pool:
            return None
        chosen = rng.choice(pool)
        return real_start(self.runtime, bundle, task, chosen, rng.randint(1, len(tool_turns(chosen))), source)
