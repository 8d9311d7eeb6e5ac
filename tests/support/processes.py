"""Child processes killed: at a fixed point of their work (tests/kill_after_call/sitecustomize.py), or a
sandbox worker with everything forked below it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import psutil

from support.paths import REPO, TESTS
from support.patience import PROCESS_S


def killed_after(call: str, times: int = 1) -> dict[str, str]:
    """Environment variables for a child process that SIGKILLs itself (with its process group, when
    it leads one) right after the `times`-th call of `call` ("module:function") has returned: a
    kill at the same point of the work however fast or busy the machine (tests/kill_after_call)."""
    path = [str(TESTS / "kill_after_call"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path), "WORLDSMITH_TEST_KILL_AFTER": f"{call}:{times}"}


def signalled_after(call: str, signum: signal.Signals, times: int = 1) -> dict[str, str]:
    """`killed_after`, the process sending itself `signum` (to it alone) instead of SIGKILL: a Ctrl-C
    (SIGINT) or a `kill` (SIGTERM) at the same point of the work however fast or busy the machine."""
    return {**killed_after(call, times), "WORLDSMITH_TEST_KILL_SIGNAL": signum.name}


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`worldsmith ARGS` in a process of its own, from the repository, with `env`; its text output kept."""
    return subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )


def kill_worker(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a sandbox worker (as the OOM killer would) and wait until its template and episode
    processes are gone too: they die one parent-death signal after another, so a call could still
    reach one through its direct channel between the worker's end and theirs."""
    descendants = psutil.Process(process.pid).children(recursive=True)
    process.kill()
    process.wait()
    psutil.wait_procs(descendants)


def stop_line(done: subprocess.CompletedProcess[str], signum: signal.Signals) -> str:
    """The line a command stopped by `signum` said so in, checked: exit 128 + signum, no traceback, and that
    line the last of its stderr (nothing printed after the stop)."""
    output = done.stdout + done.stderr
    assert done.returncode == 128 + signum, output
    assert "Traceback" not in output, output
    [line] = [line for line in done.stderr.splitlines() if line.startswith(f"interrupted by {signum.name}: ")]
    assert done.stderr.splitlines()[-1] == line, output
    return line


def listed_runs(kind: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """`worldsmith runs ls --kind KIND --json` run as a child in `env`, less the stopped run's kill switches."""
    listing = run_cli(
        ["runs", "ls", "--kind", kind, "--json"],
        {k: v for k, v in env.items() if not k.startswith("WORLDSMITH_TEST_KILL")},
    )
    listing.check_returncode()
    runs: list[dict[str, Any]] = json.loads(listing.stdout)
    return runs
