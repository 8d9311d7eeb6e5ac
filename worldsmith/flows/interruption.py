"""Stopping a run on Ctrl-C (SIGINT) or SIGTERM: a request, not an exception thrown at a random point.

`STOP` is this process's stop request. `stop_on_signals()` (the main thread of a command that runs a
flow in a thread of its own: `run_stoppable`, used by `run_generate`, `run_evaluate` and `run_train`) turns SIGINT
and SIGTERM into `STOP.request(signal)`;
the flow and its tasks look at it between stages (`STOP.check()`), so a world's stage in flight ends,
a world that stopped is not recorded as failed, worlds already finished stay published, and the flow
run ends Cancelled. A second signal asks for force (`STOP.forced`): the caller closes the run's
sandbox runtimes, so a stage waiting on a sandbox ends at once; a third ends the process there and
then (exit 128 + signal; the flow run is left as it was). `Interrupted` is what the command
raises then: its one line says what was kept and the command to run again to resume. The flow's
thread blocks SIGINT (`ignore_terminal_interrupts`), so the processes it starts (the temporary Prefect
server above all) outlive a Ctrl-C sent to the whole process group long enough to record the stop.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from worldsmith.failures import UserFixable

Result = TypeVar("Result")

#: The signals that stop a run.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(UserFixable):
    """A run stopped by a signal: the message says what was kept and how to resume; exit 128 + signal.
    `kept`: what the run finished and kept (a generation run's world refs), when the run says."""

    def __init__(self, message: str, signum: int = signal.SIGINT, kept: list[str] | None = None):
        super().__init__(message, exit_code=128 + signum)
        self.signum = signum
        self.kept = kept or []

    def __reduce__(self) -> tuple[type, tuple[str, int, list[str]]]:
        return type(self), (str(self), self.signum, self.kept)


class StopRequest:
    """Whether this process was asked to stop (and by which signal), and whether asked twice (force)."""

    def __init__(self) -> None:
        self._requested = threading.Event()
        self._forced = threading.Event()
        self.signum: int = signal.SIGINT
        self.times = 0

    def request(self, signum: int) -> None:
        """Ask the run to stop; asked again, force it (`times` counts the asks)."""
        self.times += 1
        if self._requested.is_set():
            self._forced.set()
            return
        self.signum = signum
        self._requested.set()

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    @property
    def forced(self) -> bool:
        return self._forced.is_set()

    def check(self) -> None:
        """Raise `Interrupted` when a stop was requested (between two pieces of work)."""
        if self.requested:
            raise Interrupted(stopped_by(self.signum), self.signum)

    def __reduce__(self) -> tuple[Callable[[], StopRequest], tuple[()]]:
        return _this_process_stop, ()  # on a Dask worker: that process's own request (a signal is per process)

    def clear(self) -> None:
        self.times = 0
        self._requested.clear()
        self._forced.clear()


#: This process's stop request (a signal stops the whole process, so there is one).
STOP = StopRequest()


def stop_requested() -> bool:
    """Whether this process was asked to stop (for the layers below the flows, which cannot import them)."""
    return STOP.requested


def stopped_by(signum: int) -> str:
    """The bare account of a stop by `signum` (a step that kept something says more)."""
    return f"stopped by {signal.Signals(signum).name}"


def _this_process_stop() -> StopRequest:
    return STOP


@contextmanager
def stop_on_signals(*signals: signal.Signals) -> Iterator[StopRequest]:
    """Inside (in the main thread), SIGINT and SIGTERM (or `signals`) request a stop (`STOP`) instead of
    raising; the previous handlers come back on leaving. Elsewhere than the main thread (a stoppable run
    inside another: the demo's steps), signals stay as they are and so does the request (the outer run's)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        STOP.clear()
    previous: dict[signal.Signals, Any] = {}
    for sig in (signals or STOPPING_SIGNALS) if in_main_thread else ():
        previous[sig] = signal.signal(sig, lambda signum, frame: STOP.request(signum))
    try:
        yield STOP
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def stops_interrupting() -> Iterator[None]:
    """Inside, what a stage raises once the run was asked to stop (a task or subflow that ended
    Cancelled, work cut short) is the stop: `Interrupted`."""
    try:
        yield
    except Interrupted:
        raise
    except Exception as exc:
        if not STOP.requested:
            raise
        raise Interrupted(stopped_by(STOP.signum), STOP.signum) from exc


def ignore_terminal_interrupts() -> None:
    """Block SIGINT in the calling thread (a thread that runs a flow), and so in the processes it and
    its threads start: the temporary Prefect server, Dask's local workers. Ctrl-C at a terminal goes
    to the whole process group; those processes are stopped by the run as it ends (the Prefect server
    last, after the flow run is set Cancelled), not by the keystroke."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def run_stoppable(
    work: Callable[[], Result],
    stopped: Callable[[int], Interrupted],
    on_force: Callable[[], None] = lambda: None,
    poll: Callable[[], None] = lambda: None,
) -> Result:
    """`work()` (a flow) in a thread of its own while this (main) thread turns SIGINT and SIGTERM into a stop
    request (`STOP`), which the flow's tasks look at between pieces of work. Returns what `work` returns, or
    raises what it raised; once a stop was requested raises `stopped(signum)` instead, after `work` ended.
    A second signal calls `on_force` (close what the work waits on), a third exits at once (128 + signal).
    `poll` is called every fifth of a second and once more at the end (a progress report)."""
    results: list[Result] = []
    errors: list[BaseException] = []

    def run() -> None:
        ignore_terminal_interrupts()
        try:
            results.append(work())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    with stop_on_signals() as stop:
        worker = threading.Thread(target=run, name="stoppable-flow")
        worker.start()
        forced = False
        while worker.is_alive():
            worker.join(timeout=0.2)
            if stop.forced and not forced:  # asked twice: stop what the work in flight waits on
                forced = True
                on_force()
            if stop.times >= 3:  # asked three times: stop waiting for anything
                os._exit(128 + stop.signum)
            poll()
        poll()
        if stop.requested:
            raise stopped(stop.signum)
    if errors:
        raise errors[0]
    return results[0]


def run_stoppable_flow(
    start: Callable[[], object], finished_line: Callable[[Result], str], nothing_kept: str
) -> Result:
    """`start()` (a flow called: its result, or its Cancelled state raising the flow's own `Interrupted`,
    whose line says what it kept and how to go on) under `run_stoppable`. Once stopped, raises
    `Interrupted` whose line is "interrupted by SIGNAL: " and the flow's account; `finished_line(result)`
    when the flow finished as the stop came; `nothing_kept` when it stopped before saying anything."""
    ended: list[Interrupted] = []
    finished: list[Result] = []

    def work() -> Result:
        try:
            finished.append(cast(Result, start()))
        except Interrupted as exc:  # the flow's own account of what it kept
            ended.append(exc)
            raise
        return finished[0]

    def stopped(signum: int) -> Interrupted:
        said = str(ended[0]) if ended else finished_line(finished[0]) if finished else nothing_kept
        kept = ended[0].kept if ended else []
        return Interrupted(f"interrupted by {signal.Signals(signum).name}: {said}", signum, kept)

    return run_stoppable(work, stopped)
