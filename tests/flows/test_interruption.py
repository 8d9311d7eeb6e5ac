"""SIGINT and SIGTERM as a stop request (worldsmith/flows/interruption.py), and what a stop does to a
world's failure accounting: nothing raised once a stop was asked for fails the world."""

from __future__ import annotations

import os
import signal

import pytest

from worldsmith.flows.interruption import STOP, Interrupted, stop_on_signals
from worldsmith.flows.world_builds import fails_world_only

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_requests_a_stop_and_a_second_forces_it(signum: signal.Signals):
    before = signal.getsignal(signum)
    with stop_on_signals() as stop:
        assert not stop.requested
        stop.check()  # nothing asked: no stop
        os.kill(os.getpid(), signum)  # handled in this (main) thread before kill returns to the next line
        assert stop.requested and not stop.forced and stop.signum == signum
        with pytest.raises(Interrupted) as stopped:
            stop.check()
        assert stopped.value.exit_code == 128 + signum
        os.kill(os.getpid(), signum)
        assert stop.forced and stop.times == 2
    assert signal.getsignal(signum) is before  # the previous handler is back
    STOP.clear()


def test_once_a_stop_is_asked_nothing_fails_a_world():
    error = IndexError("list index out of range")
    assert fails_world_only(error)
    with stop_on_signals() as stop:
        stop.request(signal.SIGINT)
        assert not fails_world_only(error)  # what a stage stopped mid-way raised
        assert not fails_world_only(Interrupted("stopped"))
    STOP.clear()
