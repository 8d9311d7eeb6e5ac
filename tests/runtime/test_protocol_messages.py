"""The worker protocol's typed messages (runtime/sandbox/messages.py) against the code that sends and
serves them: every request type names an op the worker serves with a handler taking that type, every
op's reply part is a `Reply`, the reply contract's run-time check (`protocol._REPLY_FIELDS`) agrees
with `Reply`'s annotations, and a reply is accepted or refused as before. No sandbox worker."""

from __future__ import annotations

import inspect
import json
import os
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

from worldsmith.bundle.kinds import TOOLS_KINDS, ToolsCode
from worldsmith.runtime import worker_launch
from worldsmith.runtime.limits import SandboxLimits
from worldsmith.runtime.sandbox import messages, protocol
from worldsmith.runtime.sandbox.messages import (
    EpisodeRequest,
    LoadEnvRequest,
    OpReply,
    Reply,
    Request,
    RequestFields,
    Status,
    WorkerConfig,
    as_request,
    env_of,
    episode_of,
)
from worldsmith.runtime.sandbox.operations import Operations
from worldsmith.runtime.sandbox.protocol import (
    EPISODE_OPS,
    RUNTIME_FIELDS,
    FrameReader,
    ProtocolViolation,
    accepted_reply,
    encode,
    reply_problem,
)
from worldsmith.runtime.sandbox.worker import RUN_OPS

pytestmark = pytest.mark.unit

REQUESTS = get_args(Request)
#: Fields of a `Reply` the run-time check leaves alone: fields of ops the worker answers itself (never a
#: request's process: ping, reap, open), and the runtime's own.
UNCHECKED_REPLY_FIELDS = {"episodes", "envs", "processes", "spares", "ending", "area", *RUNTIME_FIELDS}


def runtime_types(annotation: Any) -> set[type]:
    """The classes `isinstance` accepts for a value of `annotation` (None for Any: every value)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*(runtime_types(arg) for arg in get_args(annotation)))
    if origin is Literal:
        return {type(arg) for arg in get_args(annotation)}
    return {origin or annotation}


def op_of(request_type: type) -> str:
    (op,) = get_args(get_type_hints(request_type)["op"])
    return op


def _handled_ops() -> set[str]:
    return {name.removeprefix("op_") for name, _ in inspect.getmembers(Operations) if name.startswith("op_")}


def test_every_request_type_is_served_by_the_handler_of_its_op() -> None:
    ops = {op_of(request_type): request_type for request_type in REQUESTS}
    assert len(ops) == len(REQUESTS)  # one op per request type
    assert set(ops) <= _handled_ops()
    for op, request_type in ops.items():
        parameter = get_type_hints(getattr(Operations, "op_" + op))["request"]
        assert parameter is request_type, op


def test_every_handler_serves_a_request_type() -> None:
    assert _handled_ops() <= {op_of(request_type) for request_type in REQUESTS}


def test_every_op_run_in_a_process_or_on_a_channel_is_a_protocol_op() -> None:
    ops = {op_of(request_type) for request_type in REQUESTS}
    assert ops >= RUN_OPS
    assert EPISODE_OPS <= {op_of(request_type) for request_type in get_args(EpisodeRequest)} <= ops


def test_every_request_carries_the_runtime_fields_with_those_its_handler_needs() -> None:
    runtime_fields = get_type_hints(RequestFields)
    for request_type in REQUESTS:
        hints = get_type_hints(request_type)
        assert {key: hints[key] for key in runtime_fields} == runtime_fields, request_type
        assert request_type.__required_keys__ >= {"op"}
    for request_type in get_args(EpisodeRequest):
        assert "episode" in request_type.__required_keys__, request_type


def test_the_load_request_carries_every_kind_s_code_fields() -> None:
    load = get_type_hints(LoadEnvRequest)
    assert get_type_hints(ToolsCode).items() <= load.items()
    for kind in TOOLS_KINDS.values():
        files = {name: b"code" for name in kind.source_files}
        assert set(kind.code_fields(files)) <= ToolsCode.__optional_keys__


def test_every_op_s_reply_part_is_a_reply() -> None:
    reply = get_type_hints(Reply)
    for part in get_args(OpReply):
        hints = get_type_hints(part)
        assert {key: reply[key] for key in hints} == hints, part
        assert "status" not in hints  # the worker adds it


def test_the_run_time_reply_check_agrees_with_the_reply_type() -> None:
    reply = get_type_hints(Reply)
    checked = protocol._REPLY_FIELDS
    assert set(checked) <= set(reply)
    for key, expected in checked.items():
        assert runtime_types(reply[key]) == set(expected if isinstance(expected, tuple) else (expected,)), key
    assert set(reply) - set(checked) == UNCHECKED_REPLY_FIELDS
    assert protocol._STATUSES == set(get_args(Status)) == {"ok", "tool_error", "env_error"}


def test_a_reply_is_accepted_less_the_runtime_s_fields() -> None:
    frame: dict[str, object] = {
        "status": "ok",
        "stdout": "",
        "changed": True,
        "seconds": 0.1,
        "retire": False,
        "id": 7,
        "channel": True,
    }
    reply = accepted_reply(frame, 7)
    assert reply == {"status": "ok", "stdout": "", "changed": True, "retire": False}


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        ({"status": 1, "id": 7}, "status is a int"),
        ({"status": "fine", "id": 7}, "no valid status"),
        ({"id": 7}, "no valid status"),
        ({"status": "ok", "error": 3, "id": 7}, "error is a int"),
        ({"status": "ok", "changed": "yes", "id": 7}, "changed is a str"),
        ({"status": "ok", "tools": {}, "id": 7}, "tools is a dict"),
        ({"status": "ok", "verdict": "agent_won", "id": 7}, "unknown verdict 'agent_won'"),
        ({"status": "ok", "id": 8}, "an answer to request 8, not 7"),
        ({"status": "ok"}, "an answer to request None, not 7"),
    ],
)
def test_a_reply_outside_the_contract_is_a_protocol_violation_saying_why(
    frame: dict[str, object], problem: str
) -> None:
    assert reply_problem(frame, 7) == problem
    with pytest.raises(ProtocolViolation, match=f"^{problem}$"):
        accepted_reply(dict(frame), 7)


def test_a_request_crosses_a_pipe_as_the_json_it_was() -> None:
    request: messages.CallRequest = {
        "op": "call",
        "episode": "e1",
        "tool": "get_customer",
        "arguments": {"customer_id": 1},
        "seed": 5,
        "id": 3,
    }
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, encode(request, [b"blob"]))
        frame, blobs = FrameReader(read_fd).read()
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert as_request(frame) == request
    assert blobs == [b"blob"]


def test_what_episode_or_environment_a_request_names() -> None:
    call: Request = {"op": "call", "episode": "e1", "tool": "t", "arguments": {}}
    load: Request = {"op": "load_env", "env": "k", "tools_kind": None, "verifiers": "", "tool_names": []}
    opened: Request = {"op": "open", "episode": "e2", "env": "k"}
    assert (episode_of(call), env_of(call)) == ("e1", None)
    assert (episode_of(load), env_of(load)) == (None, "k")
    assert (episode_of(opened), env_of(opened)) == ("e2", "k")
    assert (episode_of({"op": "ping"}), env_of({"op": "ping"})) == (None, None)


def test_a_worker_is_started_with_exactly_the_configuration_the_worker_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    started: list[list[str]] = []

    def popen(args: list[str], **_: object) -> None:  # no process: the unit tier starts none
        started.append(args)

    monkeypatch.setattr(worker_launch.subprocess, "Popen", popen)
    worker_launch.launch_worker(SandboxLimits(), tmp_path, frameworks=False, channel_fd=5)
    config = json.loads(started[0][-2])
    assert set(config) == WorkerConfig.__required_keys__
    hints = get_type_hints(WorkerConfig)
    for key, value in config.items():
        assert isinstance(value, tuple(runtime_types(hints[key]))), key
