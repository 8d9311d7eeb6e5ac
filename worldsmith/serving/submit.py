"""The opt-in `submit` tool of a gateway made with `verdicts=True`: a task-bound session's final answer,
judged as an evaluation judges it (the task's verifier, then the side-effect guard: agent/loop.py),
answered with the verdict, its reward and the verifier's evidence; the episode then closes and the
session's later calls are refused. A world with a tool of its own named `submit` is served without it.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from worldsmith.agent.loop import verified
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle, jsonschema_error
from worldsmith.bundle.jsonvalues import TooDeep, check_nesting
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.answers import answer, one_line
from worldsmith.runtime.episode import Episode, Runtime
from worldsmith.serving.mcp_results import error_result, text_result
from worldsmith.serving.served_world import ServedWorld
from worldsmith.serving.sessions import CLOSE_KEY, EPISODE_KEY, SUBMITTED_KEY

SUBMIT_TOOL = types.Tool(
    name="submit",
    description=(
        "Submit your final answer and end the episode: the task's verifier judges the database as you "
        "left it and your answer; returns the verdict (complete, partial, incomplete), its reward and "
        "the verifier's evidence. No tool can be called after it."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "answer": {
                "type": ["string", "number"],
                "description": "Your final reply to the user (what the task asks you to report); empty if none. "
                "A number is taken as its JSON text.",
                "default": "",
            }
        },
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "task": {"type": "string"},
            "status": {"enum": [v.value for v in Verdict]},
            "reward": {"type": ["number", "null"]},
            "evidence": {"type": "object"},
            "error": {"type": ["string", "null"]},
        },
        "required": ["task", "status", "reward", "evidence", "error"],
    },
    annotations=types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
    ),
)


def submit_clash(bundle: Bundle) -> bool:
    """Whether `bundle` has a tool of its own named `submit` (it cannot be served with verdicts)."""
    return any(t.name == SUBMIT_TOOL.name for t in bundle.tools)


def is_submit(episode: Episode, name: str, *, verdicts: bool) -> bool:
    """Whether a call of `name` in `episode` is the opt-in `submit` (the verdict), not a world's tool."""
    return name == SUBMIT_TOOL.name and verdicts and episode.task is not None


def judge(runtime: Runtime, rewards: RewardMap, bundle: Bundle, episode: Episode, final_answer: str) -> JsonObject:
    """The verdict of `episode` with `final_answer`, as an evaluation reaches it (agent/loop.py)."""
    task = episode.task
    assert task is not None  # submit is offered in task-bound sessions only (is_submit)
    try:
        verdict, evidence, error = verified(runtime, bundle, task, episode, final_answer, guard=True)
    except Exception as exc:  # a hostile world failing its verifier or its reference run: the env's failure
        line = answer(exc)
        if line is None:
            raise
        verdict, evidence, error = Verdict.env_error, {}, one_line(line)
    return {
        "task": task.id,
        "status": verdict,
        "reward": rewards.reward(verdict),
        "evidence": evidence,
        "error": error,
    }


async def submit(
    state: dict[str, Any], world: ServedWorld, arguments: JsonObject, *, runtime: Runtime, rewards: RewardMap
) -> types.CallToolResult:
    """`submit` in a task-bound session (its SDK state `state`) of `world`: judge its episode with the
    final answer (in the world's calls lane), then close it. WorldBusy, with nothing judged or closed,
    when the world's lanes are full (serving/lanes.py)."""
    problem = jsonschema_error(SUBMIT_TOOL.input_schema, arguments)
    if problem is not None:
        return error_result(f"error: invalid arguments for submit: {problem}")
    episode: Episode = state[EPISODE_KEY]
    assert episode.task is not None  # submit is offered in task-bound sessions only (is_submit)
    world.lanes.admit()
    state[SUBMITTED_KEY] = True  # before any await: a second submit is refused, not judged again
    final = arguments.get("answer", "")
    final = final if isinstance(final, str) else json.dumps(final)
    try:
        outcome = await world.lanes.call(judge, runtime, rewards, world.bundle, episode, final)
        check_nesting(outcome)
    except TooDeep as exc:
        outcome = {"task": episode.task.id, "status": "env_error", "reward": None, "evidence": {}}
        outcome["error"] = one_line(answer(exc) or str(exc))
    finally:
        await state[CLOSE_KEY]()
    return text_result(outcome, outcome)
