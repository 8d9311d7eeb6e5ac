"""The episode loop with the model-free policies: verdicts, rewards, history window, faults."""

from __future__ import annotations

import pytest
from support.bundles import with_tools

from worldsmith.agent.loop import EpisodeConfig, run_episode, visible
from worldsmith.agent.messages import Message, PolicyTurn, ToolCall
from worldsmith.agent.policies import RandomPolicy, ReferencePolicy
from worldsmith.agent.rewards import RewardMap

pytestmark = pytest.mark.sandbox


def test_reference_policy_scores_one_on_every_golden_task(runtime, golden):
    for task in golden.tasks:
        trajectory = run_episode(runtime, golden, task, ReferencePolicy())
        assert trajectory.verdict == "complete" and trajectory.reward == 1.0, (task.id, trajectory.evidence)
        assert len(trajectory.steps) == len(task.solution)
        assert trajectory.messages[-1].role == "assistant" and not trajectory.messages[-1].tool_calls


def test_random_policy_scores_clearly_less(runtime, golden):
    rewards = [
        run_episode(runtime, golden, task, RandomPolicy(calls=3), EpisodeConfig(seed=s)).reward
        for task in golden.tasks
        for s in range(2)
    ]
    assert sum(r or 0 for r in rewards) / len(rewards) < 0.3


def test_steps_record_the_database_diff(runtime, golden):
    trajectory = run_episode(runtime, golden, golden.task("t04_return_headphones"), ReferencePolicy())
    (step,) = trajectory.steps
    assert step.status == "ok" and list(step.diff) == ["returns"] and len(step.diff["returns"]["inserted"]) == 1


class Scripted:
    name = "scripted"

    def __init__(self, turns):
        self.turns = list(turns)

    def start(self, bundle, task, seed):
        self.seen = []

    def act(self, view, tools):
        self.seen.append(view)
        return self.turns.pop(0) if self.turns else PolicyTurn(message=Message(role="assistant", content="done"))


def call(name, **arguments):
    return PolicyTurn(message=Message(role="assistant", tool_calls=[ToolCall(id=name, name=name, arguments=arguments)]))


def test_a_malformed_call_ends_the_episode_with_the_format_error_reward(runtime, golden):
    policy = Scripted([call("get_customer", customer_id=1), PolicyTurn(format_error="unparseable tool call: {oops")])
    trajectory = run_episode(runtime, golden, golden.task("t01_points_balance"), policy)
    assert trajectory.verdict == "format_error" and trajectory.reward == 0.0 and trajectory.turns == 2
    assert "unparseable" in trajectory.error


def test_tool_errors_go_back_to_the_agent(runtime, golden):
    policy = Scripted([call("ship_order", order_id=1001), call("get_customer", customer_id="x")])
    trajectory = run_episode(runtime, golden, golden.task("t05_ship_paid_orders"), policy)
    assert [s.status for s in trajectory.steps] == ["tool_error", "tool_error"]
    assert trajectory.messages[3].content.startswith("error: order 1001 is delivered")
    assert trajectory.verdict == "incomplete" and trajectory.reward == 0.0


def test_crashing_tool_is_an_env_error_excluded_from_rewards(runtime, golden):
    bundle = with_tools(golden, "def broken(conn):\n    return 1 / 0\n", ["broken"])
    trajectory = run_episode(runtime, bundle, bundle.task("t01_points_balance"), Scripted([call("broken")]))
    assert trajectory.verdict == "env_error" and trajectory.reward is None and "ZeroDivisionError" in trajectory.error


def test_history_window_keeps_exactly_the_last_w_turns(runtime, golden):
    policy = Scripted([call("get_customer", customer_id=i) for i in range(1, 6)])
    run_episode(runtime, golden, golden.task("t01_points_balance"), policy, EpisodeConfig(window=2))
    last = policy.seen[-1]  # the view at turn 6: system, task, turns 4 and 5
    assert [m.role for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert [m.tool_calls[0].arguments["customer_id"] for m in last if m.role == "assistant"] == [4, 5]
    messages = [Message(role="system"), Message(role="user")] + [
        Message(role="assistant", content=str(i)) for i in range(3)
    ]
    assert visible(messages, None) == messages and [m.content for m in visible(messages, 1)][2:] == ["2"]


def test_max_turns_ends_an_episode_as_incomplete(runtime, golden):
    policy = Scripted([call("get_customer", customer_id=1)] * 5)
    trajectory = run_episode(runtime, golden, golden.task("t01_points_balance"), policy, EpisodeConfig(max_turns=3))
    assert trajectory.turns == 3 and trajectory.verdict == "incomplete"


@pytest.mark.unit
def test_the_reward_map_scores_verdicts_leaving_env_errors_unscored():
    assert RewardMap(partial=0.5).reward("partial") == 0.5 and RewardMap().reward("env_error") is None
