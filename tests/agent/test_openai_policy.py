"""The OpenAI-compatible policy against a local chat server speaking tool calls, natively and as text."""

from __future__ import annotations

import json
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from worldsmith.agent.loop import run_episode
from worldsmith.agent.openai_policy import OpenAIPolicy, parse_text_calls
from worldsmith.localserver import BackgroundServer

pytestmark = pytest.mark.sandbox


class ToolCallingModel:
    """Plays a task's reference solution through the chat API, in the requested format."""

    def __init__(self, task, mode: str, corrupt: bool = False, meta: bool = False):
        self.steps = [(s.tool, s.arguments) for s in task.solution]
        if meta:  # look the tools up first, then go through call_tool
            self.steps = [("list_tools", {})] + [
                ("call_tool", {"tool_name": name, "arguments": arguments}) for name, arguments in self.steps
            ]
        self.answer, self.mode, self.corrupt = task.answer or "Done.", mode, corrupt
        self.requests: list[dict] = []

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        index = len(self.requests) - 1
        message: dict = {"role": "assistant", "content": None}
        if index < len(self.steps):
            tool, arguments = self.steps[index][0], json.dumps(self.steps[index][1])
            if self.corrupt:
                arguments = arguments[:-1]
            if self.mode == "native":
                message["tool_calls"] = [
                    {"id": f"c{index}", "type": "function", "function": {"name": tool, "arguments": arguments}}
                ]
            else:
                message["content"] = (
                    f'Let me check.\n<tool_call>{{"name": "{tool}", "arguments": {arguments}}}</tool_call>'
                )
        else:
            message["content"] = self.answer
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )


@pytest.mark.parametrize("mode", ["native", "text"])
def test_policy_solves_a_task_through_the_chat_api(runtime, golden, mode):
    task = golden.task("t02_place_and_pay")
    model = ToolCallingModel(task, mode)
    with BackgroundServer(
        Starlette(routes=[Route("/v1/chat/completions", model.completions, methods=["POST"])])
    ) as server:
        policy = OpenAIPolicy("tiny", base_url=f"{server.url}/v1", mode=mode)
        trajectory = run_episode(runtime, golden, task, policy)
    assert trajectory.verdict == "complete" and trajectory.reward == 1.0
    assert trajectory.tokens_in == 10 * (len(task.solution) + 1)
    first, last = model.requests[0], model.requests[-1]
    if mode == "native":
        assert {t["function"]["name"] for t in first["tools"]} >= {"create_order", "pay_order"}
        assert (
            last["messages"][3]["role"] == "tool"
            and last["messages"][2]["tool_calls"][0]["function"]["name"] == task.solution[0].tool
        )
    else:
        assert "tools" not in first and "<tool_call>" in first["messages"][0]["content"]
        assert last["messages"][3]["role"] == "user" and last["messages"][3]["content"].startswith("<tool_response>")


@pytest.mark.parametrize("mode", ["native", "text"])
def test_malformed_tool_call_is_a_format_error(runtime, golden, mode):
    task = golden.task("t04_return_headphones")
    model = ToolCallingModel(task, mode, corrupt=True)
    with BackgroundServer(
        Starlette(routes=[Route("/v1/chat/completions", model.completions, methods=["POST"])])
    ) as server:
        trajectory = run_episode(runtime, golden, task, OpenAIPolicy("tiny", base_url=f"{server.url}/v1", mode=mode))
    assert trajectory.verdict == "format_error" and trajectory.reward == 0.0 and trajectory.turns == 1


@pytest.mark.parametrize("mode", ["native", "text"])
def test_meta_tools_list_then_call(runtime, golden, mode):
    task = golden.task("t03_cancel_and_readdress")
    model = ToolCallingModel(task, mode, meta=True)
    with BackgroundServer(
        Starlette(routes=[Route("/v1/chat/completions", model.completions, methods=["POST"])])
    ) as server:
        trajectory = run_episode(
            runtime, golden, task, OpenAIPolicy("tiny", base_url=f"{server.url}/v1", mode=mode, meta=True)
        )
    assert trajectory.verdict == "complete" and trajectory.policy.endswith("[meta]")
    assert [s.call.name for s in trajectory.steps] == ["list_tools", "cancel_order", "update_shipping_address"]
    listed = trajectory.steps[0].value
    assert {t["name"] for t in listed} == {t.name for t in golden.tools}
    last = model.requests[-1]
    if mode == "native":
        assert [t["function"]["name"] for t in model.requests[0]["tools"]] == ["list_tools", "call_tool"]
        replayed = last["messages"][4]["tool_calls"][0]["function"]  # history goes back to the model as call_tool
        assert replayed["name"] == "call_tool" and json.loads(replayed["arguments"])["tool_name"] == "cancel_order"
    else:
        assert '"name": "call_tool"' in last["messages"][4]["content"] and "call_tool" in last["messages"][0]["content"]


@pytest.mark.unit
def test_parse_text_calls():
    calls, problem = parse_text_calls(
        'a <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> b <tool_call>{"name": "g"}</tool_call>', 3
    )
    assert problem is None and [(c.name, c.arguments, c.id) for c in calls] == [
        ("f", {"x": 1}, "call_3_1"),
        ("g", {}, "call_3_2"),
    ]
    assert parse_text_calls("<tool_call>{oops}</tool_call>", 1)[1].startswith("tool call 1 is not valid JSON")
    assert parse_text_calls('<tool_call>{"name": 1}', 1)[1] == "unterminated <tool_call> block"
    assert parse_text_calls("no calls here", 1) == ([], None)
