"""Stand-in reads: the template's own first requests to an imported app, kept only where the app's
state is left as it was. Stdlib only.

An imported app's first request in a process does work its later requests skip (SQLAlchemy compiles
and caches its statements and builds its loading paths; FastAPI, pydantic and `abc` fill caches of
their own): under strict isolation every episode's process is a fresh fork of the template, so every
episode's first call paid it (docs/benchmarks.md). Before it forks anything, the template now makes
one request to each GET route of the app (`SandboxHost.stand_in_reads`: stand-in arguments, 1 for each
path parameter; on a private copy of the world; as generated code, under the guard), so that every
process it forks starts with those caches filled, provided the app keeps nothing of a request:

1. a **trial**: a fork of the template makes the requests, comparing what the app keeps between
   requests before and after (`appstate.fingerprint`: its globals, its classes' and functions'
   state, its objects, `app.state`, sessions, caches); it passes only if nothing changed, the guard
   refused nothing and it took at most `TRIAL_S`;
2. if it passed, the template makes the same requests and checks the same way; if that run changed
   the app's state after all (an app that behaves differently the second time), the built app is
   dropped (`Failure`: each process then builds the app itself, as a fresh start has it).

An app that fails the trial is served as before: no request runs in the template, and an episode's
process starts from the app's module state as a fresh start has it. What the requests leave is the
same for every episode of the world (made from the world alone, before any episode existed), so it
tells no episode anything of another (docs/security.md, "Stand-in reads").
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

from worldsmith.runtime.sandbox import appstate, guard, kernel
from worldsmith.runtime.sandbox.failure import Failure
from worldsmith.runtime.sandbox.host import SandboxHost, app_module_name
from worldsmith.runtime.sandbox.protocol import ready
from worldsmith.runtime.sandbox.records import LoadedEnv

T = TypeVar("T")

#: How long the trial's requests may take in all; past it the template makes none.
TRIAL_S = 2.0
#: How long the template's own run may take (a loaded machine): past it the built app is dropped.
TEMPLATE_S = 10.0
#: How much longer a template making stand-in reads may take before its first answer: the trial
#: (killed a second past TRIAL_S), its own run, and the walks of the app's state (`appstate`).
BUDGET_S = TRIAL_S + 1.0 + TEMPLATE_S + 2.0


def read_routes(env: LoadedEnv) -> list[str]:
    """The app's routes a stand-in read is made of: its GET operations, by tool name."""
    return sorted(name for name, route in env.routes.items() if route.method == "GET")


def keep_stand_in_reads(host: SandboxHost, env: LoadedEnv) -> tuple[str, ...]:
    """In the template, the app built and nothing forked yet: make the stand-in reads of `env`'s app
    here if a trial fork shows they leave its state as it was; the routes read (none: the trial failed).
    Failure if the template's own reads changed the app's state (the caller drops the built app)."""
    module = sys.modules.get(app_module_name(env.key))
    names = read_routes(env)
    if env.app is None or module is None or not names or not _trial(host, env, module, names):
        return ()
    if not _unchanged_by_reads(host, env, module, names, TEMPLATE_S):
        from worldsmith.runtime.sandbox import asgi  # loaded in ASGI workers (worker._preload)

        asgi.clear_loop()  # what the requests left on the loop never runs
        raise Failure("env_error", "the app's state changed under its stand-in reads in the template")
    return tuple(names)


def _unchanged_by_reads(
    host: SandboxHost, env: LoadedEnv, module: ModuleType, names: list[str], seconds: float
) -> bool:
    """Make the stand-in reads; whether they were all made within `seconds` and the guard refused
    nothing (`SandboxHost.stand_in_reads`), and left the app keeping the same state as before and
    nothing waiting on the event loop."""
    from worldsmith.runtime.sandbox import asgi  # loaded in ASGI workers (worker._preload)

    def guarded(fn: Callable[[], T]) -> T | None:  # as generated code: what the app's objects run is its code
        try:
            result: T = host.run(fn, episode=None, files=("app.py",))[0]
        except Failure:
            return None
        return result

    refusals = len(guard.GUARD.violations)
    guarded(lambda: asgi.build_stack(env.app))  # its middleware exist before the first fingerprint
    state = functools.partial(appstate.fingerprint, module.__dict__, module.__name__)
    before = guarded(state)
    made = before is not None and guarded(asgi.loop_idle) and host.stand_in_reads(env, names, seconds)
    after = guarded(state)
    idle = guarded(asgi.loop_idle)
    return bool(made) and after == before and bool(idle) and len(guard.GUARD.violations) == refusals


def _trial(host: SandboxHost, env: LoadedEnv, module: ModuleType, names: list[str]) -> bool:
    """Whether the stand-in reads, made in a fork of this process, leave the app as it was (the fork
    is killed after its answer, or at TRIAL_S without one)."""
    answer, verdict = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(answer)
        os.close(verdict)
        return False
    if pid == 0:  # the trial: never returns
        passed = False
        try:
            kernel.die_with_parent()
            os.close(answer)
            passed = _unchanged_by_reads(host, env, module, names, TRIAL_S)
        finally:
            with contextlib.suppress(OSError):
                os.write(verdict, b"1" if passed else b"0")
            os._exit(0)
    os.close(verdict)
    try:
        return ready(answer, TRIAL_S + 1.0) and os.read(answer, 1) == b"1"
    finally:
        os.close(answer)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
