"""Episodes: private databases, tool results, snapshots and diffs, verification with partial credit."""

from __future__ import annotations

import threading

import pytest
from support.bundles import with_tools

from worldsmith.runtime.errors import RuntimeFault

pytestmark = pytest.mark.sandbox


def solve(episode, task, steps=None):
    for step in task.solution[:steps]:
        result = episode.call_tool(step.tool, step.arguments)
        assert result.ok, (step, result)


def test_every_golden_verifier_tells_its_solved_state_from_the_untouched_one(runtime, golden):
    for task in golden.tasks:
        with runtime.open_episode(golden, task.id) as episode:
            assert episode.verify("").status.value in ("incomplete", "partial")
            solve(episode, task)
            verdict = episode.verify(task.answer or "")
            assert verdict.status.value == "complete", (task.id, verdict)


@pytest.mark.parametrize(
    ("task_id", "steps"),
    [("t03_cancel_and_readdress", 1), ("t06_redeem_then_pay", 1), ("t09_email_and_review", 1), ("t10_points_order", 2)],
)
def test_half_done_tasks_get_partial(runtime, golden, task_id, steps):
    task = golden.task(task_id)
    with runtime.open_episode(golden, task) as episode:
        solve(episode, task, steps)
        verdict = episode.verify("")
        assert verdict.status.value == "partial"
        assert verdict.evidence  # what the LLM judge will read


def test_read_task_needs_the_answer(runtime, golden):
    task = golden.task("t07_cheapest_audio")
    with runtime.open_episode(golden, task) as episode:
        solve(episode, task)
        assert episode.verify("I am not sure").status.value == "incomplete"
        assert episode.verify("It is SP-410.").status.value == "complete"


def test_a_business_rule_refusal_is_a_tool_error_leaving_the_state_unchanged(runtime, golden):
    with runtime.open_episode(golden) as episode:
        before = episode.snapshot()
        result = episode.call_tool("cancel_order", {"order_id": 1001, "reason": "changed my mind"})
        assert result.status == "tool_error"
        assert "delivered and can no longer be cancelled" in result.error
        assert episode.diff(before).empty


def test_arguments_are_validated_against_the_schema(runtime, golden):
    with runtime.open_episode(golden) as episode:
        missing = episode.call_tool("cancel_order", {"order_id": 1004})
        assert missing.status == "tool_error" and "'reason' is a required property" in missing.error
        wrong = episode.call_tool("get_customer", {"customer_id": "six"})
        assert wrong.status == "tool_error" and "'six' is not of type 'integer'" in wrong.error
        extra = episode.call_tool("get_customer", {"customer_id": 6, "admin": True})
        assert extra.status == "tool_error" and "Additional properties are not allowed" in extra.error
        unknown = episode.call_tool("drop_all_tables", {})
        assert unknown.status == "tool_error" and "unknown tool" in unknown.error


def _email_of_customer_6(episode) -> str:
    return episode.call_tool("get_customer", {"customer_id": 6}).value["email"]


def test_an_episode_never_sees_another_episodes_writes(runtime, golden):
    with runtime.open_episode(golden) as a, runtime.open_episode(golden) as b:
        assert a.call_tool("update_customer_email", {"customer_id": 6, "email": "a@example.com"}).ok
        assert _email_of_customer_6(b) == "emma.wright@example.com"
        assert _email_of_customer_6(a) == "a@example.com"


def test_reset_gives_the_episode_a_fresh_copy_of_the_world(runtime, golden):
    with runtime.open_episode(golden) as episode:
        assert episode.call_tool("update_customer_email", {"customer_id": 6, "email": "a@example.com"}).ok
        episode.reset()
        assert _email_of_customer_6(episode) == "emma.wright@example.com"


def _ordered(episode):
    """Snapshots of `episode` before and after it orders two CB-020s (the order's id is checked)."""
    start = episode.snapshot()
    order = episode.call_tool(
        "create_order",
        {"customer_id": 5, "items": [{"sku": "CB-020", "quantity": 2}], "shipping_address": "1 Test Way"},
    )
    assert order.ok and order.changed and order.value["id"] == 1013
    return start, episode.snapshot()


def test_a_diff_counts_the_rows_a_call_changed(runtime, golden):
    with runtime.open_episode(golden) as episode:
        start, _ = _ordered(episode)
        diff = episode.diff(start)
        assert diff.counts()["orders"] == {"inserted": 1, "updated": 0, "deleted": 0}
        assert diff.counts()["products"] == {"inserted": 0, "updated": 1, "deleted": 0}
        stock = diff.tables["products"].updated[0]
        assert stock["key"] == {"id": 8} and stock["before"]["stock"] - stock["after"]["stock"] == 2


def test_restore_returns_an_episode_to_a_snapshot(runtime, golden):
    with runtime.open_episode(golden) as episode:
        start, paid = _ordered(episode)
        episode.restore(start)
        assert episode.diff(start).empty
        assert episode.diff(start, paid).counts()["order_items"]["inserted"] == 1
        reads = episode.call_tool("get_product", {"sku": "CB-020"})
        assert reads.ok and not reads.changed


def test_failed_call_rolls_back_its_partial_writes(runtime, golden):
    bundle = with_tools(
        golden,
        """
def half_write(conn):
    conn.execute("UPDATE customers SET loyalty_points = 0")
    conn.commit()  # the runtime owns the transaction: this does not commit
    raise ToolError("refused after writing")

def crash_after_write(conn):
    conn.execute("DELETE FROM reviews")
    return 1 / 0
""",
        ["half_write", "crash_after_write"],
    )
    with runtime.open_episode(bundle) as episode:
        before = episode.snapshot()
        refused = episode.call_tool("half_write")
        assert refused.status == "tool_error" and refused.error == "refused after writing"
        crashed = episode.call_tool("crash_after_write")
        assert crashed.status == "env_error" and crashed.limit is None
        assert "ZeroDivisionError: division by zero (at tools.py:" in crashed.error
        assert episode.diff(before).empty


def test_tool_stdout_is_captured_not_leaked(runtime, golden):
    bundle = with_tools(
        golden, 'def chatty(conn):\n    print("hello from the tool")\n    return {"ok": True}\n', ["chatty"]
    )
    with runtime.open_episode(bundle) as episode:
        result = episode.call_tool("chatty")
        assert result.ok and result.stdout == "hello from the tool\n"


def test_verifier_faults_are_env_errors(runtime, golden):
    files = dict(golden.files)
    broken = golden.files["verifiers.py"].replace(
        b"def verify_t04_return_headphones(initial, final, answer):\n",
        b"def verify_t04_return_headphones(initial, final, answer):\n    final.execute('DELETE FROM returns')\n",
    )
    files["verifiers.py"] = broken
    from worldsmith.bundle.contract import Bundle, artifact_digest

    bundle = Bundle(
        manifest=golden.manifest.model_copy(
            update={"artifacts": {**golden.manifest.artifacts, "verifiers.py": artifact_digest(broken)}}
        ),
        files=files,
        tasks=golden.tasks,
        tools=golden.tools,
    )
    with runtime.open_episode(bundle, "t04_return_headphones") as episode:
        verdict = episode.verify("")
        assert verdict.status == "env_error"
        assert "attempt to write a readonly database" in verdict.error or "not authorized" in verdict.error


def test_an_episode_without_a_task_cannot_verify(runtime, golden):
    with runtime.open_episode(golden) as episode, pytest.raises(RuntimeFault):
        episode.verify("")


def test_a_closed_episode_refuses_further_use(runtime, golden):
    episode = runtime.open_episode(golden)
    episode.close()
    episode.close()  # idempotent
    with pytest.raises(RuntimeFault):
        episode.snapshot()


def test_concurrent_calls_from_threads(runtime, golden):
    episodes = [runtime.open_episode(golden) for _ in range(16)]
    errors: list[str] = []

    def work(index: int) -> None:
        episode = episodes[index]
        email = f"user{index}@example.com"
        if not episode.call_tool("update_customer_email", {"customer_id": 1, "email": email}).ok:
            errors.append("write failed")
        if episode.call_tool("get_customer", {"customer_id": 1}).value["email"] != email:
            errors.append(f"episode {index} saw another episode's write")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for episode in episodes:
        episode.close()
    assert errors == []
