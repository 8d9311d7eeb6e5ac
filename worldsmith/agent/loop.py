"""The episode loop: a policy acts in an isolated episode until it answers, breaks the format,
the environment fails, or the turns run out; the task's verifier then judges the end state."""

from __future__ import annotations

import json
import time
from typing import NotRequired, Protocol

from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic validates typing_extensions' TypedDict on Python 3.11

from worldsmith.agent.footprint import reference_run
from worldsmith.agent.messages import Message, ToolCall
from worldsmith.agent.policies import Policy, meta_result, tool_message
from worldsmith.agent.policy_checks import PolicyUnavailable
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import ToolResult, VerifierResult
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.episode import Episode, Runtime
from worldsmith.toolschema import ToolSchemaJson

SYSTEM_PROMPT = """You are an agent operating the {name} application through its tools.
Complete the user's request by calling tools; every value you need is in the request or can be
looked up. When you are done, reply with a final message (no tool call) that answers the user."""


class EpisodeConfig(BaseModel):
    max_turns: int = Field(20, ge=1)
    window: int | None = Field(
        None, ge=1, description="Keep the last w turns (task and tools always kept); None: full history."
    )
    rewards: RewardMap = Field(default_factory=RewardMap)
    side_effects: bool = Field(
        True,
        description="Downgrade `complete` to `partial` when the end state reaches outside the "
        "reference solution's footprint (see footprint.py); tasks without a reference solution are not checked.",
    )
    seed: int = 0


class TurnRecord(BaseModel):
    """One model call: its token counts and time; token ids when the policy is local."""

    turn: int
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    policy_version: int | None = None


class Step(BaseModel):
    """One tool call of the episode: what was called, what came back, what changed."""

    turn: int
    call: ToolCall
    status: str
    value: JsonValue = None
    error: str | None = None
    diff: JsonObject = Field(default_factory=dict, description="Per table: the rows inserted, updated and deleted.")
    seconds: float = 0.0


class JudgeVote(TypedDict):
    """One judge sample: its ruling (None: the answer was not one) and the reason given."""

    ruling: Verdict | None
    reason: str


class JudgeRecord(TypedDict):
    """What an LLM judge's review of an episode leaves on its trajectory: the judge's model, its votes,
    why it ruled nothing (`error`) and the verifier's verdict it reviewed; a training run's judge
    (training/judged_reward.py) adds whether it read that verdict and the digest its answer is cached by."""

    model: str
    with_verifier: NotRequired[bool]
    votes: list[JudgeVote]
    error: NotRequired[str]
    verifier_verdict: NotRequired[Verdict]
    digest: NotRequired[str]


class Trajectory(BaseModel):
    """One episode as it happened and was judged; stored as one JSON line (agent/trajectories.py)."""

    env_id: str
    env_key: str
    task_id: str
    policy: str
    world: str = Field("real", description="Where the episode ran: `real`, or `simulated:<world model>`.")
    tools: list[ToolSchemaJson] = Field(default_factory=list, description="The tool schemas the agent was given.")
    messages: list[Message]
    steps: list[Step]
    turns: int
    answer: str = ""
    verdict: Verdict
    reward: float | None
    evidence: JsonObject = Field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    turn_records: list[TurnRecord] = Field(default_factory=list)
    judge: JudgeRecord | None = Field(
        None, description="The LLM judge's votes and ruling, when one reviewed the episode."
    )


def visible(messages: list[Message], window: int | None) -> list[Message]:
    """What the policy sees: the system and task messages, then the last `window` turns (an
    assistant message with its tool results is one turn)."""
    head, rest = messages[:2], messages[2:]
    if window is None:
        return list(messages)
    starts = [i for i, m in enumerate(rest) if m.role == "assistant"]
    return head + (rest[starts[-window] :] if len(starts) > window else rest)


def system_prompt(bundle: Bundle, with_tools: bool = True) -> str:
    """The episode's system message; the tool list is left out for policies that show the tools
    to their model themselves (a `shows_tools` attribute: native tool calling, chat templates)."""
    text = SYSTEM_PROMPT.format(name=bundle.manifest.scenario.name)
    if not with_tools:
        return text
    return text + "\nTools:\n" + "\n".join(json.dumps(t.model_dump()) for t in bundle.tools)


class EpisodeSource(Protocol):
    """Where episodes come from: the real worlds (`Runtime`) or a world model's imagination
    (`worldmodel.simulated.SimulatedRuntime`); `name` is recorded on each trajectory."""

    name: str

    def open_episode(self, bundle: Bundle, task: str | TaskSpec | None = None) -> Episode: ...


class Judge(Protocol):
    """Reviews a judged trajectory (see judge.py); returns the final verdict and its record."""

    def review(self, task: TaskSpec, trajectory: Trajectory) -> tuple[Verdict, JudgeRecord]: ...


def judged_verdict(
    runtime: Runtime, bundle: Bundle, task: TaskSpec, episode: Episode, judged: VerifierResult, guard: bool
) -> tuple[Verdict, JsonObject]:
    """The verifier's verdict and evidence, downgraded by the side-effect guard when `guard` is on and the
    task has a reference solution (its footprint); a `complete` verdict the guard did not check says why in
    its evidence (`side_effect_guard`)."""
    verdict = Verdict(judged.status)
    if verdict != Verdict.complete:
        return verdict, judged.evidence
    if not guard:
        return verdict, {**judged.evidence, "side_effect_guard": "off: disabled by the run's side_effects setting"}
    if not task.solution:  # no footprint to compare with (imported tasks ship none): the verifier's verdict stands
        return verdict, {**judged.evidence, "side_effect_guard": "off: the task has no reference solution"}
    overreach = reference_run(runtime, bundle, task).footprint.overreach(episode.diff(bundle.world))
    if not overreach:
        return verdict, judged.evidence
    return Verdict.partial, {**judged.evidence, "side_effects": [*overreach]}


def play_call(episode: Episode, tools: list[ToolSchemaJson], turn: int, call: ToolCall) -> tuple[ToolResult, Step]:
    """Tool call `call` of turn `turn` made in `episode` (a meta call, e.g. a tool listing, answered
    from `tools`): its result, and its step with the database change it made and its seconds."""
    before = episode.snapshot()
    started = time.perf_counter()
    result = meta_result(call, tools) or episode.call_tool(call.name, call.arguments)
    diff = episode.diff(before).model_dump()["tables"] if result.changed else {}
    step = Step(
        turn=turn,
        call=call,
        status=result.status,
        value=result.value,
        error=result.error,
        diff=diff,
        seconds=time.perf_counter() - started,
    )
    return result, step


def play_turn(
    episode: Episode,
    tools: list[ToolSchemaJson],
    turn: int,
    message: Message,
    messages: list[Message],
    steps: list[Step],
) -> tuple[list[ToolResult], list[Message]]:
    """The tool calls of the assistant's `message` (turn `turn`) played in `episode`, in order, each call's step
    appended to `steps` and its tool message to `messages`; stops after a call the world failed (env_error).
    Returns the calls' results and tool messages."""
    results: list[ToolResult] = []
    shown: list[Message] = []
    for call in message.tool_calls:
        result, step = play_call(episode, tools, turn, call)
        steps.append(step)
        shown.append(tool_message(call, result.status, result.value, result.error))
        messages.append(shown[-1])
        results.append(result)
        if result.status == "env_error":
            break
    return results, shown


def verified(
    runtime: Runtime, bundle: Bundle, task: TaskSpec, episode: Episode, answer: str, guard: bool
) -> tuple[Verdict, JsonObject, str | None]:
    """The end of an episode that no turn ended badly: the verifier on `answer`, then the side-effect guard
    (`judged_verdict`): the verdict, its evidence, and the verifier's error."""
    judged = episode.verify(answer)
    verdict, evidence = judged_verdict(runtime, bundle, task, episode, judged, guard)
    return verdict, evidence, judged.error


def run_episode(
    runtime: Runtime,
    bundle: Bundle,
    task: TaskSpec,
    policy: Policy,
    config: EpisodeConfig | None = None,
    judge: Judge | None = None,
    world: EpisodeSource | None = None,
) -> Trajectory:
    """Run `policy` on `task` in a fresh episode of `bundle` and judge it: the verifier's verdict,
    the side-effect guard, then the LLM judge when one is given. The episode comes from `world`
    when given (a simulated one), else from `runtime`, which always replays the reference solution
    for the side-effect guard."""
    config = config or EpisodeConfig()
    started = time.perf_counter()
    messages = [
        Message(role="system", content=system_prompt(bundle, with_tools=not getattr(policy, "shows_tools", False))),
        Message(role="user", content=task.instruction),
    ]
    steps: list[Step] = []
    records: list[TurnRecord] = []
    verdict: Verdict | None = None
    error: str | None = None
    answer = ""
    turns = 0
    policy.start(bundle, task, config.seed)
    world = world or runtime
    with world.open_episode(bundle, task) as episode:
        tools = episode.tools()
        for turn in range(1, config.max_turns + 1):
            turns = turn
            try:
                produced = policy.act(visible(messages, config.window), tools)
            except PolicyUnavailable:  # the infrastructure's failure, never scored as the agent's
                raise
            except Exception as exc:  # noqa: BLE001 - a model that cannot answer (timeout, refused connection) ends the episode
                verdict, error = Verdict.agent_error, f"the policy failed: {type(exc).__name__}: {exc}"
                break
            records.append(
                TurnRecord(
                    turn=turn,
                    tokens_in=produced.tokens_in,
                    tokens_out=produced.tokens_out,
                    seconds=produced.seconds,
                    prompt_ids=produced.prompt_ids,
                    completion_ids=produced.completion_ids,
                    completion_logprobs=produced.completion_logprobs,
                    policy_version=produced.policy_version,
                )
            )
            if produced.format_error is not None or produced.message is None:
                verdict, error = Verdict.format_error, produced.format_error or "no message"
                break
            message = produced.message
            messages.append(message)
            if not message.tool_calls:
                answer = message.content
                break
            results, _ = play_turn(episode, tools, turn, message, messages, steps)
            if results and results[-1].status == "env_error":
                verdict, error = Verdict.env_error, results[-1].error
                break
        evidence: JsonObject = {}
        if verdict is None:
            verdict, evidence, error = verified(runtime, bundle, task, episode, answer, config.side_effects)
    trajectory = Trajectory(
        env_id=bundle.env_id,
        env_key=bundle.key,
        task_id=task.id,
        policy=policy.name,
        world=world.name,
        tools=tools,
        messages=messages,
        steps=steps,
        turns=turns,
        answer=answer,
        verdict=verdict,
        reward=config.rewards.reward(verdict),
        evidence=evidence,
        error=error,
        seconds=time.perf_counter() - started,
        tokens_in=sum(r.tokens_in for r in records),
        tokens_out=sum(r.tokens_out for r in records),
        turn_records=records,
    )
    if judge is not None and verdict not in (Verdict.format_error, Verdict.env_error):
        ruling, record = judge.review(task, trajectory)
        trajectory.verdict, trajectory.judge = ruling, {**record, "verifier_verdict": verdict}
        trajectory.reward = config.rewards.reward(ruling)
    return trajectory
