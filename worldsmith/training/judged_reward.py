"""The judged reward of GRPO rollouts (TrainingConfig.reward `judge` or `verifier+judge`).

After a step's rollouts, an LLM judge on its own OpenAI-compatible endpoint rules on each scored
rollout (not on format_error or env_error ones, which the loop already settled): `judge` reads the
task, the tool calls with their results and the final answer; `verifier+judge` also reads the code
verifier's verdict and evidence (the reference paper's code-augmented judge, the prompt of
`worldsmith/agent/judge.py`). With `votes` > 1 the majority rules (`agent.judge.majority`; ties go to
the verifier's verdict only when the judge saw it).

- The ruling replaces the rollout's verdict and reward; the record (votes, reasons, the verifier's
  verdict) is kept on the trajectory. A vote of env_error counts as agent_error (`grounded`): a judged
  rollout holds no env_error (the loop ends an episode at the first one, and such an episode is not
  judged), so blaming the application is no way out of the loss. (An evaluation's judge may still
  exclude an episode it finds the application broke.)
- Answers are cached by the digest of what the judge reads (model, votes and the rendered prompt):
  identical rollouts, common within a group, are judged once per run.
- A vote whose answer is not a ruling is asked again up to `retries` times; a rollout with no valid
  vote, or whose endpoint failed (down, timing out, 5xx after the client's retries), is an env_error:
  no reward, out of the loss, counted in the step's `judge_error_rate`. An endpoint that refuses the
  key or the model (401, 403, 404) fails the step: no later call would do better.
- Each step records the judge's requests, cache hits, cost (USD, from `llm_prices` of the judge
  model), mean request latency, wall-clock seconds, error rate and agreement with the verifier.

The key comes from the Prefect Secret block or the environment variable the config names, else (on the
configured endpoint) the configured key; it lives in this process's client only, never in a sandbox's
environment (workers start with a scrubbed one) nor in the stored configuration.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai

from worldsmith.agent.judge import VERIFIER_TO_RULING, _clip, majority, parse_vote, transcript
from worldsmith.agent.loop import JudgeRecord, Trajectory
from worldsmith.agent.rewards import RewardMap
from worldsmith.errors import WorldsmithError
from worldsmith.llm.prompts import render
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.verdict import Verdict
from worldsmith.training.config import JudgeConfig, TrainingConfig

UNJUDGED = (
    Verdict.format_error,
    Verdict.env_error,
    Verdict.agent_error,
)  # settled before any judge: the format, the world, the model
_FATAL_STATUS = (401, 403, 404)


class JudgeUnavailable(WorldsmithError, RuntimeError):
    """The judge's endpoint refuses this configuration (key, model): the run cannot get a judged reward."""


@dataclass(frozen=True)
class Endpoint:
    """Where the judge asks: model, base URL (None: the OpenAI API) and key (None: not needed)."""

    model: str
    base_url: str | None
    api_key: str | None = field(repr=False)
    prices: dict[str, float] = field(default_factory=dict)


def judge_endpoint(config: JudgeConfig) -> Endpoint:
    """The judge's endpoint from `config` and the settings: its own base URL and key when given (the key
    from `api_key_block` or `api_key_variable`), else the configured endpoint (`llm_base_url`) and key.
    ValueError naming the setting when the key's source is missing."""
    from worldsmith.settings import get_settings

    settings = get_settings()
    model = config.model or settings.llm_model
    if config.api_key_block and config.api_key_variable:
        raise ValueError("judge: set one of api_key_block and api_key_variable, not both")
    if config.api_key_variable:
        key = os.environ.get(config.api_key_variable)
        if not key:
            raise ValueError(
                f"judge: the environment variable {config.api_key_variable} (judge.api_key_variable) is not set"
            )
    elif config.api_key_block:
        from worldsmith.secret_block import read_secret_block

        key = read_secret_block(config.api_key_block)
    else:
        key = None if config.base_url else settings.llm_key()
    if config.base_url is None and not settings.llm_configured():
        raise ValueError(
            "reward judge needs a model endpoint: set judge.base_url, or configure llm_base_url / llm_api_key"
        )
    return Endpoint(model, config.base_url or settings.llm_base_url, key, settings.llm_prices.get(model, {}))


def check_judge(config: JudgeConfig) -> None:
    """Before a judged run: the judge's endpoint (`judge_endpoint`) asked once whether it can answer
    (llm/endpoint_check.py); EndpointUnavailable naming the URL and the setting to fix when not."""
    from worldsmith.llm.endpoint_check import Endpoint as Checked
    from worldsmith.llm.endpoint_check import check_endpoint

    endpoint = judge_endpoint(config)
    if config.api_key_variable:
        key_setting = config.api_key_variable
    elif config.api_key_block:
        key_setting = f"the Prefect Secret block {config.api_key_block} (judge.api_key_block)"
    else:
        key_setting = "judge.api_key_variable" if config.base_url else "WORLDSMITH_LLM_API_KEY"
    checked = Checked(
        "the judge endpoint",
        endpoint.base_url,
        endpoint.api_key,
        endpoint.model,
        base_url_setting="judge.base_url" if config.base_url else "WORLDSMITH_LLM_BASE_URL",
        key_setting=key_setting,
        model_setting="judge.model" if config.model else "WORLDSMITH_LLM_MODEL",
    )
    check_endpoint(checked)


def grounded(vote: tuple[Verdict | None, str]) -> tuple[Verdict | None, str]:
    """A judge's vote (ruling, reason) as it counts in training: env_error becomes agent_error, the
    reason saying so (see the module docstring)."""
    ruling, reason = vote
    if ruling != Verdict.env_error:
        return vote
    return Verdict.agent_error, f"{reason} [env_error ruled but the trajectory holds none: counted as agent_error]"


@dataclass
class Ruling:
    """A judge's ruling on one rollout (`verdict` None: the judge failed) and what it cost."""

    verdict: Verdict | None
    record: JudgeRecord
    requests: int = 0
    cost_usd: float = 0.0
    request_seconds: float = 0.0


class RewardJudge:
    """Rules on rollouts through an OpenAI-compatible endpoint; see the module docstring."""

    def __init__(self, config: JudgeConfig, endpoint: Endpoint, *, with_verifier: bool, rewards: RewardMap):
        self.config, self.endpoint, self.with_verifier, self.rewards = config, endpoint, with_verifier, rewards
        self.temperature = 0.0 if config.votes == 1 else 0.7
        self.client = openai.OpenAI(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key or "not-needed",
            timeout=config.timeout_s,
            max_retries=2,
        )
        self.cache: dict[str, Ruling] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_training(cls, config: TrainingConfig) -> RewardJudge:
        """The judge of `config.reward` (`judge` or `verifier+judge`)."""
        return cls(
            config.judge,
            judge_endpoint(config.judge),
            with_verifier=config.reward == "verifier+judge",
            rewards=config.rewards,
        )

    def prompt(self, task: TaskSpec, trajectory: Trajectory) -> tuple[str, str]:
        """(system, user): what the judge reads of `trajectory`."""
        seen = {
            "instruction": task.instruction,
            "steps": transcript(trajectory),
            "answer": trajectory.answer or "(none)",
        }
        if not self.with_verifier:
            return render("judge_alone", **seen)
        return render("judge", **seen, verdict=trajectory.verdict, evidence=_clip(trajectory.evidence, 2000))

    def digest(self, prompt: tuple[str, str]) -> str:
        """The cache key of a judgement: the model, the votes and what the judge reads."""
        text = "\0".join([self.endpoint.model, str(self.config.votes), *prompt])
        return hashlib.sha256(text.encode()).hexdigest()

    def _vote(self, prompt: tuple[str, str], ruling: Ruling) -> tuple[Verdict | None, str]:
        """One vote, re-asked while its answer is not a ruling (up to `retries` times)."""
        system, user = prompt
        why = ""
        for _ in range(self.config.retries + 1):
            started = time.perf_counter()
            try:
                response = self.client.chat.completions.create(
                    model=self.endpoint.model,
                    temperature=self.temperature,
                    max_tokens=300,
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                )
            except openai.APIStatusError as exc:
                if exc.status_code in _FATAL_STATUS:
                    raise JudgeUnavailable(
                        f"the judge's endpoint refused model {self.endpoint.model!r} (HTTP {exc.status_code}): "
                        "check judge.model, judge.base_url and the judge's key"
                    ) from None
                return None, f"the judge's endpoint failed: HTTP {exc.status_code}"
            except openai.APIError as exc:  # down, timing out: the client has retried already
                return None, f"the judge's endpoint failed: {type(exc).__name__}: {exc}"
            finally:
                ruling.requests += 1
                ruling.request_seconds += time.perf_counter() - started
            usage = response.usage
            if usage is not None:
                prices = self.endpoint.prices
                ruling.cost_usd += (
                    usage.prompt_tokens * prices.get("input", 0.0) + usage.completion_tokens * prices.get("output", 0.0)
                ) / 1e6
            verdict, why = parse_vote((response.choices[0].message.content if response.choices else None) or "")
            if verdict is not None:
                return verdict, why
        return None, why

    def _judge(self, prompt: tuple[str, str], trajectory: Trajectory) -> Ruling:
        """The majority of the votes on `trajectory` (each `grounded` first)."""
        verifier = trajectory.verdict
        ruling = Ruling(None, {"model": self.endpoint.model, "with_verifier": self.with_verifier, "votes": []})
        ballots = [grounded(self._vote(prompt, ruling)) for _ in range(self.config.votes)]
        ruling.record["votes"] = [{"ruling": r, "reason": why} for r, why in ballots]
        votes = [r for r, _ in ballots if r is not None]
        if votes:
            ruling.verdict = majority(votes, verifier if self.with_verifier else None)
        else:
            ruling.record["error"] = "no valid vote: " + "; ".join(why for _, why in ballots)
        return ruling

    def judge_rollouts(self, tasks: Sequence[TaskSpec], trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Rule on each scored rollout (in place: verdict, reward, `judge` record); returns the step's
        judge metrics (`judge_latency_s` only when a request was made, `judge_agreement` only when a
        ruling was). Rollouts that read the same are judged once, and once per run (the cache)."""
        started = time.perf_counter()
        judged = [i for i, t in enumerate(trajectories) if t.verdict not in UNJUDGED]
        prompts = {i: self.prompt(tasks[i], trajectories[i]) for i in judged}
        keys = {i: self.digest(prompts[i]) for i in judged}
        with self._lock:
            todo = {keys[i]: i for i in judged if keys[i] not in self.cache}
        hits = sum(keys[i] not in todo or todo[keys[i]] != i for i in judged)
        with ThreadPoolExecutor(max_workers=max(1, min(self.config.concurrency, len(todo)))) as pool:
            fresh = dict(zip(todo, pool.map(lambda i: self._judge(prompts[i], trajectories[i]), todo.values())))
        with self._lock:
            self.cache.update({key: ruling for key, ruling in fresh.items() if ruling.verdict is not None})
            rulings = {i: fresh.get(keys[i]) or self.cache[keys[i]] for i in judged}
        failed = agreed = 0
        for i, ruling in rulings.items():
            trajectory = trajectories[i]
            verifier = trajectory.verdict
            trajectory.judge = {**ruling.record, "verifier_verdict": verifier, "digest": keys[i]}
            if ruling.verdict is None:
                failed += 1
                trajectory.verdict, trajectory.error = Verdict.env_error, f"the judge failed: {ruling.record['error']}"
            else:
                agreed += ruling.verdict == VERIFIER_TO_RULING.get(verifier, verifier)
                trajectory.verdict = ruling.verdict
            trajectory.reward = self.rewards.reward(trajectory.verdict)
        requests = sum(r.requests for r in fresh.values())
        metrics = {
            "judge_requests": float(requests),
            "judge_cache_hits": float(hits),
            "judge_cost_usd": sum(r.cost_usd for r in fresh.values()),
            "judge_seconds": time.perf_counter() - started,
            "judge_error_rate": failed / len(trajectories) if trajectories else 0.0,
        }
        if requests:  # a mean per request; none when the cache answered everything
            metrics["judge_latency_s"] = sum(r.request_seconds for r in fresh.values()) / requests
        if len(rulings) > failed:
            metrics["judge_agreement"] = agreed / (len(rulings) - failed)
        return metrics
