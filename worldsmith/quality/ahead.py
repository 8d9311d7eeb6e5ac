"""Checks started ahead: while the model writes a stage's answer, the checks of what exists already run
in the background, so fewer of them wait for the answer. What they compute is kept by the content it
was computed from (quality/memo.py), and the checks after the answer take it from there: their
outcome is the same, only sooner.

Ahead of the verifiers stage's answer: the seed-data expectations (validation's) and the deep probes'
tool calls that need no reference solution (deep_probes.prepare_tool_calls)."""

from __future__ import annotations

import threading
from typing import Self

from worldsmith.bundle.contract import Bundle
from worldsmith.quality.deep_probes import prepare_tool_calls
from worldsmith.quality.expectations import validate_world
from worldsmith.runtime.episode import Runtime

#: Checks start only once the answer has kept us waiting this long: a backend that answers at once
#: (procedural, a replay) gets no work ahead to wait for or to compete with.
AHEAD_AFTER_S = 1.0


class ChecksAhead:
    """The checks of `bundle` (a world without tasks yet: tools, seeded database, clock) started in
    background threads, unless stopped within AHEAD_AFTER_S: the seed-data expectations, kept for
    validation whatever happens next; and the deep probes' reference-free tool calls, made until
    `stop()`. Call `stop()` before the checks that use the sandbox run (it returns once no call of ours
    is in flight); a context manager stops on exit. A failure ahead is left for the check after the
    answer to meet and report."""

    def __init__(self, runtime: Runtime, bundle: Bundle):
        self.runtime, self.bundle = runtime, bundle
        self.calls_made = 0
        self._stop = threading.Event()
        self._threads = {
            "expectations": threading.Thread(target=self._expect, name="ahead-expectations", daemon=True),
            "calls": threading.Thread(target=self._call, name="ahead-calls", daemon=True),
        }

    def _expect(self) -> None:
        if self._stop.wait(AHEAD_AFTER_S):
            return
        try:
            validate_world(self.bundle.world, reuse=True)
        except Exception:  # noqa: BLE001 - validation runs it again and reports it
            pass

    def _call(self) -> None:
        if self._stop.wait(AHEAD_AFTER_S):
            return
        try:
            self.calls_made = prepare_tool_calls(self.runtime, self.bundle, self._stop)
        except Exception:  # noqa: BLE001 - the deep probes run every call not kept, and report
            pass

    def start(self) -> Self:
        for thread in self._threads.values():
            thread.start()
        return self

    @property
    def done(self) -> bool:
        """Whether everything started ahead has finished (or stopped)."""
        return not any(thread.is_alive() for thread in self._threads.values())

    def stop(self) -> None:
        """No further call ahead; returns when the one in flight (if any) is done."""
        self._stop.set()
        calls = self._threads["calls"]
        if calls.is_alive():
            calls.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
