"""Stops a child process at a fixed point of its work, for tests of what a kill leaves behind.

Python imports this module at start-up in every process that has this directory on PYTHONPATH
(see the `site` module). When WORLDSMITH_TEST_KILL_AFTER is `MODULE:FUNCTION:N`, the process
SIGKILLs itself (with its process group, when it leads one) as soon as the Nth call of
MODULE.FUNCTION has returned: killed at the same point on a fast machine and on a busy one, as
a kill from outside at that moment would. With WORLDSMITH_TEST_KILL_SIGNAL naming another signal
(`SIGINT`, `SIGTERM`), it sends that one to itself alone instead, as Ctrl-C or `kill` would at that
moment, and goes on. Without the variables it does nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import signal
import sys
import threading
from types import ModuleType
from typing import Any


def _kill() -> None:
    chosen = os.environ.get("WORLDSMITH_TEST_KILL_SIGNAL")
    if chosen and chosen != "SIGKILL":
        os.kill(os.getpid(), signal.Signals[chosen])
        return
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _count_calls(module: ModuleType, function: str, calls: int) -> None:
    """Replace MODULE.FUNCTION by a wrapper that kills the process after its `calls`-th return."""
    original = getattr(module, function)
    returned = 0
    lock = threading.Lock()

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal returned
        result = original(*args, **kwargs)
        with lock:
            returned += 1
            if returned == calls:
                _kill()
        return result

    setattr(module, function, counted)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when MODULE is imported, wraps FUNCTION once the module has run."""

    def __init__(self, module: str, function: str, calls: int):
        self.module, self.function, self.calls = module, function, calls

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _count_calls(module, self.function, self.calls)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    setting = os.environ.get("WORLDSMITH_TEST_KILL_AFTER")
    if not setting:
        return
    module, function, calls = setting.split(":")
    sys.meta_path.insert(0, _WrapOnImport(module, function, int(calls)))


_install()
