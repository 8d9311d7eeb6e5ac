"""Child processes killed at a fixed point of their work (tests/kill_after_call/sitecustomize.py)."""

from __future__ import annotations

import os
import signal

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
