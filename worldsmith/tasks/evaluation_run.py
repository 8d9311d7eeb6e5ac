"""An evaluation run as its tasks see it: the policy factory, sandbox runtime, world (real, or a world
model's imagination), judge and loaded bundles that each process running its tasks builds from the
run's parameters on first use (`EVALUATION_RUNS`, a per-run registry: worldsmith/tasks/run_resources.py),
so tasks need nothing but their (serialisable) arguments."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from worldsmith.agent.judge import LLMJudge
from worldsmith.agent.loop import EpisodeSource
from worldsmith.agent.policies import Policy
from worldsmith.agent.policy_specs import policy_factory
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.models.evaluation import SimulationCounts
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings
from worldsmith.tasks.parameters import EvaluateParameters
from worldsmith.tasks.run_resources import RunResources
from worldsmith.worldmodel.simulated import SimulatedRuntime


@dataclass
class EvaluationResources:
    """What one process needs for an evaluation run: the policy factory, the runtime, where episodes
    come from, the judge, and each bundle loaded once."""

    policy: Callable[[], Policy]
    runtime: Runtime
    world: EpisodeSource
    judge: LLMJudge | None
    _bundles: dict[str, Bundle] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def bundle(self, path: str) -> Bundle:
        """The bundle at `path`, loaded on first use."""
        with self._lock:
            if path not in self._bundles:
                self._bundles[path] = load_bundle(Path(path))
            return self._bundles[path]

    def simulation(self) -> SimulationCounts | None:
        """The simulated calls' counts (None in the real worlds)."""
        return self.world.stats.counts() if isinstance(self.world, SimulatedRuntime) else None


#: The evaluation runs' resources in this process, by run key; released: runtime closed.
EVALUATION_RUNS: RunResources[EvaluationResources] = RunResources(close=lambda found: found.runtime.close())


def judge(params: EvaluateParameters) -> LLMJudge | None:
    """The run's LLM judge on the configured endpoint, or None (the code verifier alone)."""
    if params.judge_model is None:
        return None
    settings = get_settings()
    return LLMJudge(
        params.judge_model,
        base_url=settings.llm_base_url,
        api_key=settings.llm_key(),
        votes=params.judge_votes,
        timeout_s=settings.llm_timeout_s,
    )


def resources(params: EvaluateParameters, run_key: str) -> EvaluationResources:
    """This process's resources for the run, built on first use (a local policy or world model is loaded once)."""

    def build() -> EvaluationResources:
        temperature = params.temperature if params.temperature is not None else (0.0 if params.samples == 1 else 0.7)
        factory = policy_factory(
            params.policy,
            temperature=temperature,
            tool_format=params.tool_format,
            meta_tools=params.meta_tools,
            max_new_tokens=params.max_new_tokens,
        )
        runtime = Runtime()
        world = SimulatedRuntime(runtime, params.simulate) if params.simulate else runtime
        return EvaluationResources(factory, runtime, world, judge(params))

    return EVALUATION_RUNS.get(run_key, build)


def release(run_key: str) -> SimulationCounts | None:
    """Close this process's runtime of the run; returns the simulated calls' counts (None in the real
    worlds, or when this process built nothing for the run)."""
    found = EVALUATION_RUNS.release(run_key)
    return None if found is None else found.simulation()
