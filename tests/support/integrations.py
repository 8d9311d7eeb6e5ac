"""What the thin clients' tests share (tests/integrations): a world served by a real `worldsmith env
serve --protocol openenv --verdicts` on a free loopback port, the episodes they play on it, and the same
episodes played directly on the runtime, whose tool results and verdicts the clients' must equal."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.client_venvs import client_python
from support.patience import PROCESS_S
from worldsmith.agent.rewards import RewardMap
from worldsmith.bundle.contract import Bundle
from worldsmith.runtime.episode import Runtime
from worldsmith.serving.submit import judge

PREFIX = "serving "


@dataclass(frozen=True)
class Play:
    """One episode: task `task`, these tool calls (name, arguments) in order, then `answer` submitted."""

    task: str
    calls: list[tuple[str, dict[str, Any]]]
    answer: str

    def as_json(self) -> dict[str, Any]:
        return {"task": self.task, "calls": [[n, a] for n, a in self.calls], "answer": self.answer}

    def actions(self) -> list[str]:
        """What a model replies to play it through OpenEnv's tools: each call as a `call_tool` action, then
        `submit` with the answer (support/scripted_model.py serves them)."""
        calls = [{"type": "call_tool", "tool_name": n, "arguments": a} for n, a in self.calls]
        calls.append({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": self.answer}})
        return [json.dumps(c) for c in calls]


def plays(bundle: Bundle) -> list[Play]:
    """Each task's reference solution with its expected answer (complete), and the first task's solution with a
    wrong answer and a call the tool refuses (not complete)."""
    right = [Play(t.id, [(s.tool, s.arguments) for s in t.solution], t.answer or "") for t in bundle.tasks[:3]]
    first = bundle.tasks[0]
    refused = (first.solution[0].tool, {"no_such_argument": 1})
    wrong = Play(first.id, [refused, *[(s.tool, s.arguments) for s in first.solution]], "not the answer")
    return [*right, wrong]


def played_directly(bundle: Bundle, play: Play) -> dict[str, Any]:
    """`play` on the runtime itself: each call's value (None when it failed) and the verdict's status and reward."""
    with Runtime() as runtime, runtime.open_episode(bundle, play.task) as episode:
        values = []
        for name, arguments in play.calls:
            result = episode.call_tool(name, arguments)
            values.append(result.value if result.ok else None)
        verdict = judge(runtime, RewardMap(), bundle, episode, play.answer)
    return {"values": values, "status": verdict["status"], "reward": verdict["reward"]}


@contextmanager
def served(bundle_dir: Path) -> Iterator[str]:
    """`worldsmith env serve <bundle_dir> --protocol openenv --verdicts` on a free port: the gateway's URL."""
    command = [sys.executable, "-m", "worldsmith.cli", "env", "serve", str(bundle_dir), "--port", "0"]
    command += ["--protocol", "openenv", "--verdicts"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the first line says where it listens, once it does
        assert line.startswith(PREFIX), line
        yield line.split(" at ", 1)[1].split("/envs/", 1)[0]
    finally:
        process.terminate()
        process.wait(PROCESS_S)


def through_client(client: str, script: str | Path, bundle: Bundle, *args: str) -> Any:
    """`script` run by client `client`'s Python (support/client_venvs.py) against `bundle` served (`served`; a
    bundle loaded from its folder), given the world's base URL, then `args`: what it printed last, as JSON."""
    assert bundle.root is not None, "the bundle is served from its folder"
    python = client_python(client)
    with served(bundle.root) as url:
        return run_client(python, script, f"{url}/envs/{bundle.env_id}", *args)


def run_client(python: Path, script: str | Path, *args: str) -> Any:
    """Run `script` (its text, or its file) with the client environment's `python`; what it printed last, as JSON."""
    program = [str(script)] if isinstance(script, Path) else ["-c", script]
    done = subprocess.run([str(python), *program, *args], capture_output=True, text=True, timeout=PROCESS_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
