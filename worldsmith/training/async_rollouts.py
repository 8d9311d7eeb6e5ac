"""Asynchronous rollouts: episodes run concurrently, each calling the policy when it needs to, with no
per-turn barrier (unlike rollouts.Batcher, where a batch waits for every live episode). Batching is
the engine's business (training/policy_server.py, vLLM). Each rollout is judged as soon as it ends,
on its own thread, while the others still run.

`RolloutEvents` records the order in which rollouts start, finish and are judged (the tests read
it; bench/rollouts.py reads how many were in flight).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from worldsmith.agent.loop import EpisodeConfig, EpisodeSource, Trajectory, run_episode
from worldsmith.agent.policies import Policy
from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.runtime.episode import Runtime

EventKind = Literal["started", "finished", "judged"]


@dataclass
class RolloutEvents:
    """(kind, rollout index) in the order they happened, and the most rollouts ever in flight."""

    log: list[tuple[EventKind, int]] = field(default_factory=list)
    most_in_flight: int = 0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: EventKind, index: int) -> None:
        with self._lock:
            self.log.append((kind, index))
            self._in_flight += {"started": 1, "finished": -1, "judged": 0}[kind]
            self.most_in_flight = max(self.most_in_flight, self._in_flight)

    def position(self, kind: EventKind, index: int) -> int:
        """Where (kind, index) happened in the log."""
        return self.log.index((kind, index))


def run_async_rollouts(
    runtime: Runtime,
    jobs: list[tuple[Bundle, TaskSpec]],
    make_policy: Callable[[int], Policy],
    config: EpisodeConfig,
    worlds: list[EpisodeSource] | None = None,
    *,
    judge: Callable[[int, Trajectory], None] | None = None,
    in_flight: int = 64,
    events: RolloutEvents | None = None,
) -> list[Trajectory]:
    """One episode per (bundle, task) job (its position is its seed), at most `in_flight` at once,
    in the job's world (`worlds`, default `runtime`); `judge(index, trajectory)` rules on each as soon
    as it ends (in place). The trajectories come back in job order."""
    events = events if events is not None else RolloutEvents()

    def one(index: int) -> Trajectory:
        bundle, task = jobs[index]
        events.add("started", index)
        trajectory = run_episode(
            runtime,
            bundle,
            task,
            make_policy(index),
            config.model_copy(update={"seed": index}),
            world=worlds[index] if worlds else None,
        )
        events.add("finished", index)
        if judge is not None:
            judge(index, trajectory)
            events.add("judged", index)
        return trajectory

    pool = ThreadPoolExecutor(max_workers=max(1, min(in_flight, len(jobs))), thread_name_prefix="rollout")
    try:
        return list(pool.map(one, range(len(jobs))))
    finally:  # an interrupt or a failure: the episodes not started yet never start
        pool.shutdown(wait=True, cancel_futures=True)
