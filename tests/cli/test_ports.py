"""Ports of `env serve`, `dashboard`, `up` and `demo`: a range checked while parsing, 0 for any free port
(the one chosen printed), a busy port answered in one line naming the option, and the ports of the running
stack recorded where `up` keeps its state, so that `status` and `down` find it whatever the settings say."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.paths import GOLDEN
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.ops.stack import Stack
from worldsmith.settings import get_settings

pytestmark = pytest.mark.unit


@pytest.fixture()
def busy_port() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def one_line_failure(args: list[str], code: int = 2) -> str:
    result = CliRunner().invoke(app, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == code and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [["env", "serve", str(GOLDEN)], ["dashboard"], ["up"], ["up", "--dashboard-port", "1"], ["demo"]],
    ids=["env-serve", "dashboard", "up", "up-dashboard", "demo"],
)
@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_port_out_of_range_is_refused_while_parsing(home, command, port):
    flag = "--port" if command[0] in ("env", "dashboard") else "--prefect-port"
    line = one_line_failure([*command, flag, port])
    named = "prefect_port" if command[0] == "demo" else f"'{flag}'"  # demo: its DemoOptions field
    assert named in line and ("65535" in line or "equal to 0" in line), line


def test_env_serve_on_a_busy_port_is_one_line_naming_the_option_and_serves_nothing(home, busy_port):
    line = one_line_failure(["env", "serve", str(GOLDEN), "--port", str(busy_port)])
    assert f"cannot bind 127.0.0.1:{busy_port}" in line and "choose another --port" in line
    assert "serving" not in line


def test_dashboard_on_a_busy_port_is_one_line_naming_the_option(home, busy_port):
    line = one_line_failure(["dashboard", "--port", str(busy_port)])
    assert f"cannot bind 127.0.0.1:{busy_port}" in line and "choose another --port" in line


def test_up_refuses_a_prefect_port_another_program_holds_before_starting_anything(home, busy_port):
    """The Prefect port held by another HTTP service (or anything listening): one line, nothing started."""
    line = one_line_failure(["up", "--prefect-port", str(busy_port)])
    assert f"cannot bind 127.0.0.1:{busy_port}" in line and "--prefect-port (WORLDSMITH_PREFECT_PORT)" in line
    assert Stack.current().running() == {} and not Stack.current().record_file.exists()


def test_up_refuses_a_busy_dashboard_port(home, busy_port, monkeypatch):
    monkeypatch.setattr(Stack, "server", lambda self: _Idle())  # no Prefect server: only the ports are checked
    line = one_line_failure(["up", "--prefect-port", "0", "--dashboard-port", str(busy_port)])
    assert "--dashboard-port (WORLDSMITH_DASHBOARD_PORT)" in line


class _Idle:
    """A service that is not running."""

    def pid(self) -> None:
        return None


def test_port_zero_chooses_a_free_port(home):
    chosen = Stack.from_settings().with_ports(prefect_port=0, dashboard_port=0)
    assert 0 not in (chosen.prefect_port, chosen.dashboard_port)
    assert Stack.from_settings().with_ports() == Stack.from_settings()


@pytest.fixture()
def fake_server(home: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line is the local Prefect server's (`-m prefect server start`), recorded in
    its pid file: the stack counts as running. Marked e2e by its users: it starts a process."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "-m", "prefect", "server", "start"],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    run = home / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "prefect-server.pid").write_text(f"{process.pid}\n")
    yield process
    process.kill()
    process.wait()


@pytest.mark.e2e
def test_status_and_down_use_the_running_stacks_recorded_ports(home, fake_server, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "unset")  # the CLI sets it to the running stack's: restored afterwards
    monkeypatch.delenv("PREFECT_API_URL")
    stack = Stack.from_settings()
    stack.record_file.write_text(json.dumps({"prefect_port": 4321, "dashboard_host": "127.0.0.1", "dashboard_port": 9}))
    monkeypatch.setenv("WORLDSMITH_PREFECT_PORT", "4999")  # a setting changed since `up`
    get_settings.cache_clear()
    assert Stack.current().prefect_port == 4321
    status = json.loads(CliRunner().invoke(app, ["status", "--json", "--flow-runs", "0"]).output)
    assert status["stack"]["prefect_ui"] == "http://127.0.0.1:4321"
    refused = one_line_failure(["up", "--prefect-port", "4400"], code=1)
    assert "runs with the Prefect server on port 4321" in refused and "worldsmith down" in refused
    down = CliRunner().invoke(app, ["down"])
    assert down.exit_code == 0 and "prefect-server" in down.output, down.output
    assert fake_server.wait(30) is not None and not stack.record_file.exists()
    assert Stack.current().prefect_port == 4999  # nothing runs: the settings' port again


@pytest.mark.e2e
def test_a_stale_record_is_ignored(home):
    stack = Stack.from_settings()
    stack.record_file.parent.mkdir(parents=True, exist_ok=True)
    stack.record_file.write_text(json.dumps({"prefect_port": 4321, "dashboard_host": "127.0.0.1", "dashboard_port": 9}))
    assert Stack.current() == stack  # no service runs: the settings, not the record


def _first_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline()


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("command", "prefix"),
    [(["env", "serve", str(GOLDEN)], "serving retail_store at http://127.0.0.1:"), (["dashboard"], "dashboard at ")],
    ids=["env-serve", "dashboard"],
)
def test_port_zero_serves_on_the_free_port_it_prints(home, command, prefix):
    process = subprocess.Popen(
        [sys.executable, "-m", "worldsmith.cli", *command, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = _first_line(process)
        assert line.startswith(prefix), line
        port = int(line.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        assert port not in (0, 8765, 8780)
        path = "/envs" if command[0] == "env" else "/healthz"
        assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=60).status_code == 200  # it listened first
    finally:
        process.terminate()
        process.wait(60)
