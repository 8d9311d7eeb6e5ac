"""How long a test waits for what it started before calling it hung: every wait's number in one place
(docs/testing.md, "Time limits").

A test bounds its work, not its time: it waits for an event, a readiness condition, a process's exit
or a count of calls, and asserts counts, never durations. Where an API still asks for a number (a
subprocess's or an HTTP client's timeout, a worker request's deadline, a thread's join, a poll's
give-up point) the test names one of these. They are hang guards, far above what the wait costs on a
loaded machine, never a measure of its speed: each is derived from the tier hang guards
(`tiers.HANG_GUARD_S`), so raising those for a slower machine raises these with them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from support.tiers import HANG_GUARD_S

T = TypeVar("T")

#: Something of this process or a server already running: a thread, an event, a local server's
#: answer, a sandbox worker's reply. Half the unit tier's guard (60 s); such waits take milliseconds.
MOMENTS_S: float = HANG_GUARD_S["unit"] / 2
#: A child process to finish or to be ready: a CLI command, a flow run or training in its own process,
#: a server starting. The sandbox tier's guard (900 s); such work takes seconds to a minute or two.
PROCESS_S: float = HANG_GUARD_S["sandbox"]
#: How often `wait_until` looks again: a poll's pace, not a guess at how long the wait takes.
POLL_EVERY_S = 0.05


def wait_until(ready: Callable[[], T], what: str, *, within_s: float = MOMENTS_S) -> T:
    """Poll `ready` until it returns something truthy and return that; past `within_s` (a hang guard:
    `MOMENTS_S` or `PROCESS_S`) the test fails naming `what` it waited for."""
    give_up = time.monotonic() + within_s
    while not (answer := ready()):
        if time.monotonic() > give_up:
            pytest.fail(f"still waiting for {what} after {within_s:g} s: hung", pytrace=False)
        time.sleep(POLL_EVERY_S)
    return answer
