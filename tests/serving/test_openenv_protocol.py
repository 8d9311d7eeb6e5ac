"""OpenEnv's protocol on the gateway (serving/openenv.py): the WebSocket's handshake is checked as any
request (Host, Origin, token), and a session answers what it cannot do with OpenEnv's error, one line,
the session going on. (OpenEnv's own client plays it end to end in tests/integrations/test_openenv.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.patience import wait_until
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from worldsmith.localserver import BackgroundServer
from worldsmith.serving.access import Access
from worldsmith.serving.gateway import Gateway

pytestmark = pytest.mark.sandbox

TOKEN = "openenv-token.1"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def _send(ws: ClientConnection, kind: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    ws.send(json.dumps({"type": kind, **({"data": data} if data is not None else {})}))
    return json.loads(ws.recv())


@pytest.fixture(scope="module")
def server(runtime, golden):
    gateway = Gateway(runtime, [golden], verdicts=True, openenv=True, access=Access(token=TOKEN))
    with BackgroundServer(gateway.app()) as served:
        yield served


def _status(url: str, headers: dict[str, str]) -> int:
    try:
        with connect(url, additional_headers=headers):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


def test_a_handshake_is_refused_without_the_token_or_from_another_site_s_page(server):
    url = f"ws://127.0.0.1:{server.port}/envs/retail_store/ws"
    assert _status(url, BEARER) == 101
    assert _status(url, {}) == 403
    assert _status(url, {"Authorization": "Bearer another"}) == 403
    assert _status(url, {**BEARER, "Origin": "http://evil.example.com"}) == 403
    assert _status(url, {**BEARER, "Origin": f"http://127.0.0.1:{server.port}"}) == 101


def test_what_a_session_cannot_do_is_an_error_and_the_session_goes_on(server):
    with connect(f"ws://127.0.0.1:{server.port}/envs/retail_store/ws", additional_headers=BEARER) as ws:
        before = _send(ws, "step", {"type": "call_tool", "tool_name": "find_customer", "arguments": {}})
        unknown = _send(ws, "reset", {"task": "no_such_task"})
        nonsense = _send(ws, "dance")
        reset = _send(ws, "reset", {"task": "t01_points_balance"})
        judged = _send(ws, "step", {"type": "call_tool", "tool_name": "submit", "arguments": {"answer": "1"}})
        after = _send(ws, "step", {"type": "call_tool", "tool_name": "find_customer", "arguments": {}})
        state = _send(ws, "state")
    assert before["type"] == "error" and "send reset" in before["data"]["message"]
    assert unknown["type"] == "error" and "no task 'no_such_task'" in unknown["data"]["message"]
    assert nonsense["data"]["code"] == "UNKNOWN_TYPE"
    assert reset["data"]["observation"]["task"] == "t01_points_balance" and not reset["data"]["done"]
    assert judged["data"]["done"] and judged["data"]["reward"] == 0.0
    assert judged["data"]["observation"]["result"]["status"] == "incomplete"
    assert after["type"] == "error" and "submitted" in after["data"]["message"]
    assert state["data"] == {
        "episode_id": "retail_store#1",
        "step_count": 1,
        "env_id": "retail_store",
        "task": "t01_points_balance",
        "done": True,
    }


def test_a_session_without_messages_for_the_idle_limit_ends_and_closes_its_episode(runtime, golden):
    gateway = Gateway(runtime, [golden], openenv=True, session_idle_s=0.2)  # the limit under test
    with BackgroundServer(gateway.app()) as served:
        with connect(f"ws://127.0.0.1:{served.port}/envs/retail_store/ws") as ws:
            assert _send(ws, "reset", {"task": "t01_points_balance"})["type"] == "observation"
            ended = json.loads(ws.recv())  # nothing sent: the server speaks first, once idle
        assert ended["type"] == "error" and "no message for 0.2 s" in ended["data"]["message"]
        wait_until(lambda: gateway.loaded["retail_store"].active == 0, "the idle session's episode to close")
