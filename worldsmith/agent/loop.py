"""The episode loop: a policy acts in an isolated episode until it answers, breaks the format,
the environment fails, or the turns run out; the task's verifier then judges the end state."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, Field

from worldsmith.agent.messages import Message, ToolCall
from worldsmith.agent.policies import Policy, tool_message
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.loader import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.runtime.episode import Runtime

SYSTEM_PROMPT = """You are an agent operating the {name} application through its tools.
Complete the user's request by calling tools; every value you need is in the request or can be
looked up. When you are done, reply with a final message (no tool call) that answers the user.
Tools:
{tools}"""


class EpisodeConfig(BaseModel):
    max_turns: int = Field(20, ge=1)
    window: int | None = Field(None, ge=1, description="Keep the last w turns (task and tools always kept); None: full history.")
    rewards: RewardMap = Field(default_factory=RewardMap)
    seed: int = 0


class Step(BaseModel):
    """One tool call of the episode: what was called, what came back, what changed."""

    turn: int
    call: ToolCall
    status: str
    value: Any = None
    error: str | None = None
    diff: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0


class Trajectory(BaseModel):
    env_id: str
    env_key: str
    task_id: str
    policy: str
    messages: list[Message]
    steps: list[Step]
    turns: int
    answer: str = ""
    verdict: str
    reward: float | None
    evidence: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0


def visible(messages: list[Message], window: int | None) -> list[Message]:
    """What the policy sees: the system and task messages, then the last `window` turns (an
    assistant message with its tool results is one turn)."""
    head, rest = messages[:2], messages[2:]
    if window is None:
        return list(messages)
    starts = [i for i, m in enumerate(rest) if m.role == "assistant"]
    return head + (rest[starts[-window]:] if len(starts) > window else rest)


def system_prompt(bundle: Bundle) -> str:
    tools = "\n".join(json.dumps(t.model_dump()) for t in bundle.tools)
    return SYSTEM_PROMPT.format(name=bundle.manifest.scenario.name, tools=tools)


def run_episode(runtime: Runtime, bundle: Bundle, task: TaskSpec, policy: Policy, config: EpisodeConfig | None = None) -> Trajectory:
    """Run `policy` on `task` in a fresh episode of `bundle` and judge it."""
    config = config or EpisodeConfig()
    started = time.perf_counter()
    messages = [Message(role="system", content=system_prompt(bundle)), Message(role="user", content=task.instruction)]
    steps: list[Step] = []
    verdict, error, answer = None, None, ""
    tokens_in = tokens_out = turns = 0
    policy.start(bundle, task, config.seed)
    with runtime.open_episode(bundle, task) as episode:
        tools = episode.tools()
        for turn in range(1, config.max_turns + 1):
            turns = turn
            produced = policy.act(visible(messages, config.window), tools)
            tokens_in += produced.tokens_in
            tokens_out += produced.tokens_out
            if produced.format_error is not None or produced.message is None:
                verdict, error = "format_error", produced.format_error or "no message"
                break
            message = produced.message
            messages.append(message)
            if not message.tool_calls:
                answer = message.content
                break
            for call in message.tool_calls:
                before = episode.snapshot()
                call_started = time.perf_counter()
                result = episode.call_tool(call.name, call.arguments)
                diff = episode.diff(before).model_dump()["tables"] if result.changed else {}
                steps.append(Step(turn=turn, call=call, status=result.status, value=result.value, error=result.error,
                                  diff=diff, seconds=time.perf_counter() - call_started))
                messages.append(tool_message(call, result.status, result.value, result.error))
                if result.status == "env_error":
                    verdict, error = "env_error", result.error
                    break
            if verdict is not None:
                break
        evidence: dict[str, Any] = {}
        if verdict is None:
            judged = episode.verify(answer)
            verdict = getattr(judged.status, "value", judged.status)
            evidence, error = judged.evidence, judged.error
    return Trajectory(env_id=bundle.env_id, env_key=bundle.key, task_id=task.id, policy=policy.name, messages=messages, steps=steps,
                      turns=turns, answer=answer, verdict=verdict, reward=config.rewards.reward(verdict), evidence=evidence,
                      error=error, seconds=time.perf_counter() - started, tokens_in=tokens_in, tokens_out=tokens_out)
