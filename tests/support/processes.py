"""Child processes killed: at a fixed point of their work (tests/kill_after_call/sitecustomize.py), or a
sandbox worker with everything forked below it."""

from __future__ import annotations

import os
import signal
import subprocess

import psutil

from support.paths import TESTS


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


def kill_worker(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a sandbox worker (as the OOM killer would) and wait until its template and episode
    processes are gone too: they die one parent-death signal after another, so a call could still
    reach one through its direct channel between the worker's end and theirs."""
    descendants = psutil.Process(process.pid).children(recursive=True)
    process.kill()
    process.wait()
    psutil.wait_procs(descendants)
